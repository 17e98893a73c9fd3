"""O(n log n) pipage and swap rounding: feasibility, unbiased marginals, the reference.

The statistical tests use fixed seeds, so they are deterministic; their tolerance is 4
standard errors of a marginal frequency, sqrt(x_j (1 − x_j) / draws), per coordinate: under
the normal approximation a coordinate exceeds it with probability 6e-5, about 1e-3 for the
≤ 16 coordinates of a test, so a failure means a bias rather than bad luck.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from direct import run_direct
from flower_app.algorithms.fedcg.continuous import round_point
from flower_app.config import AppConfig
from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid
from flower_app.submodular.rounding import (
    blocks_of,
    check_in_polytope,
    complete_by_order,
    complete_by_scan,
    greedy_rounding,
    pipage_rounding,
    swap_rounding,
)

DRAWS = 4000


@st.composite
def points(draw, max_elements: int = 30):
    """A uniform or partition matroid and x in its polytope (often a base, some 0/1)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n = draw(st.integers(1, max_elements))
    if draw(st.booleans()):
        matroid: Matroid = UniformMatroid(n, draw(st.integers(1, n)))
    else:
        n_groups = draw(st.integers(1, 5))
        matroid = PartitionMatroid(rng.integers(0, n_groups, n), rng.integers(0, 4, n_groups))
    x = rng.random(n)
    x[rng.random(n) < draw(st.sampled_from([0.0, 0.2, 0.5]))] = 0.0
    x[rng.random(n) < draw(st.sampled_from([0.0, 0.1]))] = 1.0
    on_base = draw(st.booleans())
    for elements, cap in blocks_of(matroid):
        # at most cap ones; the other entries scaled to sum to the room left (a base) when
        # that keeps them below 1, else below it
        ones = elements[x[elements] == 1.0]
        x[ones[cap:]] = 0.0
        free = elements[x[elements] < 1.0]
        room = cap - min(ones.size, cap)
        total = x[free].sum()
        if total > 0:
            target = room if on_base else room * rng.random()
            x[free] *= min(target / total, 0.999 / x[free].max())
    return matroid, check_in_polytope(x, matroid), on_base


def _is_base_point(x: np.ndarray, matroid: Matroid) -> bool:
    return all(abs(x[el].sum() - min(cap, el.size)) < 1e-9 for el, cap in blocks_of(matroid))


@settings(max_examples=150, deadline=None)
@given(points(), st.integers(0, 2**32 - 1))
def test_fast_pipage_is_the_reference_draw_for_draw(point, seed) -> None:
    matroid, x, _ = point
    fast_rng, ref_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(3):
        assert pipage_rounding(x, matroid, fast_rng) == pipage_rounding(
            x, matroid, ref_rng, method="reference"
        )
    assert fast_rng.random() == ref_rng.random()  # same number of draws


@settings(max_examples=150, deadline=None)
@given(points(), st.integers(0, 2**32 - 1))
def test_rounded_sets_are_independent_and_bases_on_bases(point, seed) -> None:
    matroid, x, _ = point
    rng = np.random.default_rng(seed)
    base = _is_base_point(x, matroid)
    for rounding in (pipage_rounding, swap_rounding):
        for _ in range(3):
            chosen = rounding(x, matroid, rng)
            assert chosen == sorted(set(chosen)) and matroid.is_independent(chosen)
            assert all(x[e] > 0 for e in chosen)  # never an element with x_j = 0
            assert all(e in chosen for e in np.flatnonzero(x == 1.0))
            if base:
                assert len(chosen) == matroid.rank


@settings(max_examples=100, deadline=None)
@given(points(), st.integers(0, 2**32 - 1))
def test_greedy_and_base_completion_match_the_first_implementation(point, seed) -> None:
    matroid, x, _ = point
    assert greedy_rounding(x, matroid) == complete_by_scan([], x, matroid)
    start = pipage_rounding(x, matroid, np.random.default_rng(seed))
    assert complete_by_order(start, x, matroid) == complete_by_scan(start, x, matroid)
    for rounding in ("pipage", "swap"):
        chosen = round_point(x, matroid, rounding, np.random.default_rng(seed))
        assert matroid.is_independent(chosen) and len(chosen) == matroid.rank


@settings(max_examples=60, deadline=None)
@given(points(), st.integers(0, 2**32 - 1))
def test_integral_points_come_back_unchanged(point, seed) -> None:
    matroid, x, _ = point
    integral = np.zeros_like(x)
    for elements, cap in blocks_of(matroid):
        integral[elements[:cap]] = 1.0
    want = sorted(int(e) for e in np.flatnonzero(integral))
    rng = np.random.default_rng(seed)
    state = rng.bit_generator.state
    assert pipage_rounding(integral, matroid, rng) == want
    assert pipage_rounding(integral, matroid, rng, method="reference") == want
    assert swap_rounding(integral, matroid, rng) == want
    assert rng.bit_generator.state == state  # nothing to round, nothing drawn
    assert greedy_rounding(integral, matroid) == want


def _frequencies(rounding, x: np.ndarray, matroid: Matroid, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(x.size)
    for _ in range(DRAWS):
        chosen = rounding(x, matroid, rng)
        counts[chosen] += 1
    return counts / DRAWS


def _uniform_base() -> tuple[Matroid, np.ndarray]:
    x = np.random.default_rng(11).random(14)
    x *= 5 / x.sum()
    return UniformMatroid(14, 5), x


def _partition_inside() -> tuple[Matroid, np.ndarray]:
    groups = np.arange(16) % 3
    matroid = PartitionMatroid(groups, [2, 3, 1])
    x = np.random.default_rng(12).random(16)
    for g, target in enumerate([2.0, 1.7, 0.6]):  # block 0 on its base, 1 and 2 inside
        x[groups == g] *= target / x[groups == g].sum()
    return matroid, x


@pytest.mark.parametrize("rounding", [pipage_rounding, swap_rounding])
@pytest.mark.parametrize("case", [_uniform_base, _partition_inside])
def test_marginals_are_unbiased(rounding, case) -> None:
    matroid, x = case()
    assert x.max() < 1.0
    freq = _frequencies(rounding, x, matroid, seed=2024)
    se = np.sqrt(x * (1 - x) / DRAWS)
    assert np.all(np.abs(freq - x) <= 4 * se), (freq - x) / se


def test_swap_rounding_is_negatively_correlated_on_pairs() -> None:
    # P[i, j ∈ C] ≤ x_i x_j (CVZ 2010, Lemma/Thm. on negative correlation), 4 s.e. slack
    matroid, x = _uniform_base()
    rng = np.random.default_rng(7)
    both = np.zeros((x.size, x.size))
    for _ in range(DRAWS):
        ind = np.zeros(x.size)
        ind[swap_rounding(x, matroid, rng)] = 1.0
        both += np.outer(ind, ind)
    joint = both / DRAWS
    bound = np.outer(x, x)
    se = np.sqrt(bound * (1 - bound) / DRAWS)
    off = ~np.eye(x.size, dtype=bool)
    assert np.all(joint[off] <= bound[off] + 4 * se[off])


def test_float_sums_and_many_blocks() -> None:
    # thirds sum to 3 only up to float error; 10,000 blocks of 3 elements
    assert (
        len(swap_rounding(np.full(9, 1 / 3), UniformMatroid(9, 3), np.random.default_rng(0))) == 3
    )
    groups = np.repeat(np.arange(10_000), 3)
    matroid = PartitionMatroid(groups, 1)
    x = np.tile([0.5, 0.3, 0.2], 10_000)
    for rounding in (pipage_rounding, swap_rounding):
        chosen = rounding(x, matroid, np.random.default_rng(1))
        assert len(chosen) == 10_000 and matroid.is_independent(chosen)


def test_large_point_is_rounded_to_a_base() -> None:
    n, k = 50_000, 1_000
    x = np.random.default_rng(3).random(n)
    x *= k / x.sum()
    matroid = UniformMatroid(n, k)
    for rounding in (pipage_rounding, swap_rounding):
        chosen = rounding(x, matroid, np.random.default_rng(4))
        assert len(chosen) == k and len(set(chosen)) == k


def test_unknown_pipage_method_is_refused() -> None:
    with pytest.raises(ValueError, match="method='slow'"):
        pipage_rounding(np.zeros(3), UniformMatroid(3, 1), np.random.default_rng(0), "slow")


@pytest.mark.parametrize(
    ("override", "pipage_reported"),
    [
        ({}, False),
        ({"fedcg-report-pipage": True}, True),
        ({"fedcg-rounding": "pipage"}, True),
    ],
)
def test_fedcg_runs_pipage_only_when_asked(tmp_path, override, pipage_reported) -> None:
    cfg = AppConfig.from_run_config(
        {
            "algorithm": "fedcg",
            "num-users": 30,
            "num-elements": 20,
            "k": 3,
            "seed": 1,
            "fedcg-rounds": 3,
            "output-dir": str(tmp_path),
            "run-name": "run",
            **override,
        }
    )
    summary = run_direct(cfg)
    assert (summary["objective-pipage"] is not None) == pipage_reported
    assert summary["objective-greedy-rounding"] is not None
