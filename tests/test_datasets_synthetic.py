"""Synthetic stand-ins: determinism, shapes, calibration, heavy tails, validity."""

from __future__ import annotations

import numpy as np
import pytest

from flower_app.datasets.matrices import RatingsMatrix, VenueSets
from flower_app.datasets.synthetic import (
    ML1M_DENSITY,
    ML1M_RATING_DISTRIBUTION,
    synthetic_dblp,
    synthetic_facility_location,
)


def _same_csr(a, b) -> bool:
    return (
        a.shape == b.shape
        and np.array_equal(a.indptr, b.indptr)
        and np.array_equal(a.indices, b.indices)
        and np.array_equal(a.data, b.data)
    )


# --------------------------------------------------------------------------- facility location


@pytest.fixture(scope="module")
def ratings() -> RatingsMatrix:
    return synthetic_facility_location()


def test_facility_location_shape_and_fields(ratings):
    assert isinstance(ratings, RatingsMatrix)
    assert ratings.name == "synthetic-facility-location"
    assert (ratings.n_users, ratings.n_elements) == (2000, 500)
    assert ratings.user_ids.tolist() == list(range(2000))
    assert ratings.element_ids.tolist() == list(range(500))
    assert ratings.values.dtype == np.float64 and ratings.values.has_canonical_format
    assert set(np.unique(ratings.values.data).tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}


def test_facility_location_is_deterministic(ratings):
    again = synthetic_facility_location(seed=0)
    assert _same_csr(again.values, ratings.values)
    assert np.array_equal(again.element_groups, ratings.element_groups)
    other = synthetic_facility_location(seed=1)
    assert not _same_csr(other.values, ratings.values)


def test_facility_location_density_and_ratings(ratings):
    density = ratings.values.nnz / (ratings.n_users * ratings.n_elements)
    assert abs(density - ML1M_DENSITY) < 0.1 * ML1M_DENSITY
    shares = np.bincount(ratings.values.data.astype(int), minlength=6)[1:] / ratings.values.nnz
    assert np.abs(shares - ML1M_RATING_DISTRIBUTION).max() < 0.02


def test_facility_location_heavy_tails_and_coverage(ratings):
    per_user = np.diff(ratings.values.indptr)
    per_item = np.bincount(ratings.values.indices, minlength=ratings.n_elements)
    assert per_user.min() >= 1
    assert per_user.max() > 5 * per_user.mean()
    assert per_item.max() > 5 * per_item.mean()
    assert np.median(per_user) < per_user.mean()


def test_facility_location_genres(ratings):
    groups = set(ratings.element_groups.tolist())
    assert groups <= {f"genre-{g}" for g in range(18)}
    assert len(groups) == 18


def test_facility_location_sparse_users_still_rate(ratings):
    sparse = synthetic_facility_location(300, 200, density=0.001, seed=3)
    assert np.diff(sparse.values.indptr).min() >= 1


def test_facility_location_rejects_bad_arguments():
    with pytest.raises(ValueError, match="density"):
        synthetic_facility_location(10, 10, density=0)
    with pytest.raises(ValueError, match="n_users"):
        synthetic_facility_location(0, 10)


# --------------------------------------------------------------------------- dblp


@pytest.fixture(scope="module")
def venue_sets() -> VenueSets:
    return synthetic_dblp(n_researchers=20_000, n_venues=300, seed=0)


def test_dblp_shape_and_fields(venue_sets):
    assert isinstance(venue_sets, VenueSets)
    assert venue_sets.name == "synthetic-dblp"
    assert (venue_sets.n_users, venue_sets.n_elements) == (20_000, 300)
    assert venue_sets.researchers.dtype == np.int64
    assert venue_sets.researchers.tolist() == list(range(20_000))
    assert venue_sets.venues[:2].tolist() == ["synthetic/venue-0", "synthetic/venue-1"]
    assert set(venue_sets.element_groups.tolist()) == {"conf", "journals"}


def test_dblp_entries_are_valid(venue_sets):
    matrix = venue_sets.matrix
    assert matrix.has_canonical_format  # sorted, no duplicate (researcher, venue) pairs
    assert np.all(matrix.data == 1.0)
    per_row = np.diff(matrix.indptr)
    assert per_row.min() >= 1
    assert per_row.max() <= venue_sets.n_elements
    keys = np.repeat(np.arange(matrix.shape[0]), per_row) * matrix.shape[1] + matrix.indices
    assert len(np.unique(keys)) == matrix.nnz


def test_dblp_degrees(venue_sets):
    per_row = np.diff(venue_sets.matrix.indptr)
    per_venue = np.bincount(venue_sets.matrix.indices, minlength=venue_sets.n_elements)
    assert per_row.mean() == pytest.approx(2.5, rel=0.05)
    assert per_row.max() > 10 * per_row.mean()
    assert np.median(per_row) <= 2
    assert per_venue.max() > 5 * per_venue.mean()


def test_dblp_is_deterministic(venue_sets):
    again = synthetic_dblp(n_researchers=20_000, n_venues=300, seed=0)
    assert _same_csr(again.matrix, venue_sets.matrix)
    other = synthetic_dblp(n_researchers=20_000, n_venues=300, seed=1)
    assert not _same_csr(other.matrix, venue_sets.matrix)


def test_dblp_few_venues_fill_exactly():
    tiny = synthetic_dblp(n_researchers=3000, n_venues=4, mean_venues_per_researcher=2.4)
    per_row = np.diff(tiny.matrix.indptr)
    assert per_row.min() >= 1 and per_row.max() == 4
    assert tiny.matrix.has_canonical_format
    assert per_row.mean() == pytest.approx(2.4, rel=0.05)


def test_dblp_rejects_unreachable_mean():
    with pytest.raises(ValueError, match="mean_venues_per_researcher"):
        synthetic_dblp(n_researchers=10, n_venues=3, mean_venues_per_researcher=5)
    with pytest.raises(ValueError, match="mean_venues_per_researcher"):
        synthetic_dblp(n_researchers=10, n_venues=3, mean_venues_per_researcher=0.5)


@pytest.mark.slow
def test_dblp_full_size():
    full = synthetic_dblp()
    assert (full.n_users, full.n_elements) == (704_738, 2_675)
    per_row = np.diff(full.matrix.indptr)
    assert per_row.min() >= 1
    assert per_row.mean() == pytest.approx(2.5, rel=0.02)
    assert full.matrix.has_canonical_format
