"""Objectives, matroids and centralized greedy: property tests against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from flower_app.submodular.greedy import greedy, lazy_greedy, random_selection
from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid
from flower_app.submodular.objectives import FacilityLocation, MaxCoverage


@st.composite
def sparse_matrices(draw, binary: bool = False, max_users: int = 8, max_elements: int = 7):
    n = draw(st.integers(1, max_users))
    m = draw(st.integers(1, max_elements))
    values = st.just(1.0) if binary else st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0, 5.0])
    cells = draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, m - 1), values), max_size=n * m)
    )
    dense = np.zeros((n, m))
    for i, j, v in cells:
        dense[i, j] = v
    return dense


def brute_value(dense: np.ndarray, selected) -> float:
    """(1/n) Σ_i max_{j ∈ S} r_ij, straight from the definition."""
    sel = list(selected)
    if not sel:
        return 0.0
    return float(dense[:, sel].max(axis=1).mean())


@given(sparse_matrices(), st.data())
def test_facility_location_value_and_gains_match_definition(dense, data) -> None:
    obj = FacilityLocation(sp.csr_matrix(dense))
    m = dense.shape[1]
    selected = data.draw(st.lists(st.integers(0, m - 1), unique=True, max_size=m))
    assert obj.mean_value(selected) == pytest.approx(brute_value(dense, selected))
    current = obj.user_values(selected)
    gains = obj.gains(current) / dense.shape[0]
    for e in range(m):
        expected = brute_value(dense, [*selected, e]) - brute_value(dense, selected)
        assert gains[e] == pytest.approx(expected, abs=1e-12)


@given(sparse_matrices(), st.data())
def test_monotone_and_submodular(dense, data) -> None:
    obj = FacilityLocation(sp.csr_matrix(dense))
    m = dense.shape[1]
    b = data.draw(st.lists(st.integers(0, m - 1), unique=True, max_size=m))
    a = data.draw(st.lists(st.sampled_from(b), unique=True)) if b else []
    e = data.draw(st.integers(0, m - 1))
    fa, fb = obj.mean_value(a), obj.mean_value(b)
    assert fa <= fb + 1e-12  # monotone: A ⊆ B ⇒ F(A) ≤ F(B)
    if e not in b:  # diminishing returns: F(e | A) ≥ F(e | B)
        assert obj.mean_value([*a, e]) - fa >= obj.mean_value([*b, e]) - fb - 1e-12


@given(sparse_matrices(binary=True), st.data())
def test_max_coverage_counts_covered_users(dense, data) -> None:
    obj = MaxCoverage(sp.csr_matrix(dense))
    m = dense.shape[1]
    selected = data.draw(st.lists(st.integers(0, m - 1), unique=True, max_size=m))
    covered = sum(1 for row in dense if any(row[j] for j in selected))
    assert obj.value(selected) == covered


def test_max_coverage_rejects_non_binary() -> None:
    with pytest.raises(ValueError, match="only 0 and 1"):
        MaxCoverage(sp.csr_matrix(np.array([[2.0, 0.0]])))


def test_negative_values_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        FacilityLocation(sp.csr_matrix(np.array([[-1.0, 1.0]])))


@given(sparse_matrices(max_users=10, max_elements=8), st.integers(1, 8))
def test_lazy_greedy_equals_greedy_and_greedy_is_greedy(dense, k) -> None:
    m = dense.shape[1]
    k = min(k, m)
    obj = FacilityLocation(sp.csr_matrix(dense))
    matroid = UniformMatroid(m, k)
    plain, lazy = greedy(obj, matroid), lazy_greedy(obj, matroid)
    assert plain.selected == lazy.selected
    assert plain.values == pytest.approx(lazy.values)
    chosen: list[int] = []
    for e in plain.selected:  # each step: the lowest-index best marginal gain
        base = brute_value(dense, chosen)
        best = max(brute_value(dense, [*chosen, j]) - base for j in range(m) if j not in chosen)
        first = min(
            j
            for j in range(m)
            if j not in chosen and brute_value(dense, [*chosen, j]) - base == pytest.approx(best)
        )
        assert e == first
        chosen.append(e)


@given(sparse_matrices(max_users=6, max_elements=7), st.integers(1, 3))
def test_greedy_half_approximation_under_partition_matroid(dense, cap) -> None:
    m = dense.shape[1]
    groups = np.arange(m) % 3
    matroid = PartitionMatroid(groups, cap)
    obj = FacilityLocation(sp.csr_matrix(dense))
    result = lazy_greedy(obj, matroid)
    assert matroid.is_independent(result.selected) and len(result.selected) == matroid.rank
    best = max(
        brute_value(dense, s)
        for r in range(matroid.rank + 1)
        for s in itertools.combinations(range(m), r)
        if matroid.is_independent(s)
    )
    assert result.value >= 0.5 * best - 1e-12


@given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(0, 3), st.data())
def test_partition_matroid_feasible_mask_keeps_independence(groups, cap, data) -> None:
    matroid = PartitionMatroid(groups, cap)
    assert matroid.rank == sum(min(cap, groups.count(g)) for g in set(groups))
    selected: list[int] = []
    while True:
        mask = matroid.feasible_mask(selected)
        for e in range(matroid.n_elements):
            assert mask[e] == (e not in selected and matroid.is_independent([*selected, e]))
        if not mask.any():
            break
        selected.append(data.draw(st.sampled_from(list(np.flatnonzero(mask)))))
    assert len(selected) == matroid.rank


def test_uniform_matroid_checks() -> None:
    matroid = UniformMatroid(5, 2)
    assert matroid.is_independent([0, 4]) and not matroid.is_independent([0, 1, 2])
    assert not matroid.is_independent([1, 1])
    assert not matroid.feasible_mask([0, 1]).any()
    with pytest.raises(ValueError, match="k=6 is out of range"):
        UniformMatroid(5, 6)
    with pytest.raises(IndexError):
        matroid.is_independent([7])


@settings(max_examples=25)
@given(sparse_matrices(), st.integers(0, 100))
def test_random_selection_is_feasible(dense, seed) -> None:
    m = dense.shape[1]
    matroid = PartitionMatroid(np.arange(m) % 2, 1)
    result = random_selection(FacilityLocation(sp.csr_matrix(dense)), matroid, seed=seed)
    assert matroid.is_independent(result.selected) and len(result.selected) == matroid.rank
