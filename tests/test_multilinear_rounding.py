"""Multilinear extension (exact vs brute force vs sampling) and oblivious rounding."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from flower_app.datasets.synthetic import synthetic_facility_location
from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid
from flower_app.submodular.multilinear import (
    multilinear_gradient,
    multilinear_value,
    sampled_gradient,
)
from flower_app.submodular.objectives import FacilityLocation, MaxCoverage
from flower_app.submodular.rounding import check_in_polytope, greedy_rounding, pipage_rounding


@st.composite
def instances(draw, max_users: int = 5, max_elements: int = 6):
    n = draw(st.integers(1, max_users))
    m = draw(st.integers(1, max_elements))
    vals = st.sampled_from([0.0, 0.0, 1.0, 2.0, 2.0, 3.5, 5.0])  # ties on purpose
    dense = np.array(draw(st.lists(vals, min_size=n * m, max_size=n * m))).reshape(n, m)
    x = np.array(draw(st.lists(st.sampled_from([0.0, 0.2, 0.5, 0.7, 1.0]), min_size=m, max_size=m)))
    return dense, x


def brute(dense: np.ndarray, x: np.ndarray) -> tuple[float, np.ndarray]:
    """G(x) and ∇G(x) by enumerating all sets R."""
    n, m = dense.shape

    def f(subset) -> float:
        return float(dense[:, list(subset)].max(axis=1).sum()) if subset else 0.0

    value, grad = 0.0, np.zeros(m)
    for bits in itertools.product([0, 1], repeat=m):
        prob = np.prod([x[j] if b else 1 - x[j] for j, b in enumerate(bits)])
        subset = {j for j, b in enumerate(bits) if b}
        value += prob * f(subset)
        for j in range(m):
            grad[j] += prob * (f(subset | {j}) - f(subset - {j}))
    return value, grad


@given(instances())
def test_exact_value_and_gradient_match_brute_force(inst) -> None:
    dense, x = inst
    obj = FacilityLocation(sp.csr_matrix(dense))
    value, grad = brute(dense, x)
    assert multilinear_value(obj, x) == pytest.approx(value, abs=1e-9)
    np.testing.assert_allclose(multilinear_gradient(obj, x), grad, atol=1e-9)


def test_coverage_gradient_closed_form() -> None:
    member = sp.csr_matrix(np.array([[1, 1, 0], [0, 1, 1], [1, 0, 0]], dtype=float))
    x = np.array([0.3, 0.6, 0.9])
    expected = np.array([(1 - 0.6) + 1, (1 - 0.3) + (1 - 0.9), 1 - 0.6])
    np.testing.assert_allclose(multilinear_gradient(MaxCoverage(member), x), expected)


def test_gradient_gives_exact_marginal_of_the_surrogate() -> None:
    obj = FacilityLocation(synthetic_facility_location(50, 20, seed=1).values)
    x = np.random.default_rng(0).uniform(0, 0.5, 20)
    eta, j = 0.1, 7
    step = x.copy()
    step[j] += eta
    diff = multilinear_value(obj, step) - multilinear_value(obj, x)
    assert diff == pytest.approx(eta * multilinear_gradient(obj, x)[j])


class _FixedUniforms:
    """Stands in for a Generator's ``random(m)`` to pin the sampled set R."""

    def __init__(self, u: np.ndarray) -> None:
        self.u = u

    def random(self, m: int) -> np.ndarray:
        return self.u


@given(instances(max_users=4, max_elements=5))
def test_sampled_gradient_is_unbiased_exactly(inst) -> None:
    """Σ_R P(R) · estimate(R) equals the exact gradient (enumerating every R)."""
    dense, x = inst
    x = np.clip(x, 0.1, 0.9)  # every R has positive probability
    obj = FacilityLocation(sp.csr_matrix(dense))
    m = dense.shape[1]
    mean = np.zeros(m)
    for bits in itertools.product([0, 1], repeat=m):
        bits = np.array(bits, dtype=bool)
        prob = np.prod(np.where(bits, x, 1 - x))
        u = np.where(bits, 0.0, 0.99)  # u < x exactly on R
        mean += prob * sampled_gradient(obj, x, _FixedUniforms(u), 1)
    np.testing.assert_allclose(mean, brute(dense, x)[1], atol=1e-9)


def test_sampled_gradient_converges() -> None:
    obj = FacilityLocation(synthetic_facility_location(60, 15, seed=2).values)
    x = np.random.default_rng(1).uniform(0.2, 0.8, 15)
    exact = multilinear_gradient(obj, x)
    estimate = sampled_gradient(obj, x, np.random.default_rng(2), 2000)
    np.testing.assert_allclose(estimate, exact, rtol=0.1, atol=0.05)


def test_points_outside_the_polytope_are_refused() -> None:
    matroid = UniformMatroid(4, 2)
    with pytest.raises(ValueError, match="sums to 2.5 > capacity 2"):
        check_in_polytope(np.array([1.0, 1.0, 0.5, 0.0]), matroid)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        check_in_polytope(np.array([1.2, 0.0, 0.0, 0.0]), matroid)
    with pytest.raises(ValueError, match="shape"):
        check_in_polytope(np.zeros(3), matroid)


@st.composite
def polytope_points(draw):
    m = draw(st.integers(1, 9))
    groups = np.array(draw(st.lists(st.integers(0, 2), min_size=m, max_size=m)))
    caps = draw(st.lists(st.integers(0, 3), min_size=3, max_size=3))
    matroid = PartitionMatroid(groups, caps)
    raw = np.array(draw(st.lists(st.floats(0, 1), min_size=m, max_size=m)))
    x = raw.copy()
    for g in range(3):  # scale each block into its capacity
        idx = groups == g
        total = x[idx].sum()
        if total > caps[g]:
            x[idx] *= caps[g] / total
    return matroid, x


@settings(max_examples=60, deadline=None)
@given(polytope_points(), st.integers(0, 2**32 - 1))
def test_every_rounded_set_is_independent(point, seed) -> None:
    matroid, x = point
    rng = np.random.default_rng(seed)
    for _ in range(5):
        assert matroid.is_independent(pipage_rounding(x, matroid, rng))
    greedy = greedy_rounding(x, matroid)
    assert matroid.is_independent(greedy) and len(greedy) == matroid.rank


def test_pipage_keeps_marginals_and_the_multilinear_expectation() -> None:
    obj = FacilityLocation(synthetic_facility_location(80, 12, seed=3).values)
    matroid = PartitionMatroid(np.arange(12) % 3, 2)
    x = np.random.default_rng(4).uniform(0, 1, 12)
    for g in range(3):
        idx = np.arange(12) % 3 == g
        x[idx] *= min(1.0, 1.7 / x[idx].sum())
    rng = np.random.default_rng(5)
    draws = 4000
    counts, values = np.zeros(12), np.empty(draws)
    for t in range(draws):
        chosen = pipage_rounding(x, matroid, rng)
        counts[chosen] += 1
        values[t] = obj.value(chosen)
    se_marg = np.sqrt(x * (1 - x) / draws)
    assert np.all(np.abs(counts / draws - x) <= 4.5 * se_marg + 1e-9)
    # E[F(R)] >= G(x) for a submodular F (negative correlation); and close to it
    g = multilinear_value(obj, x)
    se = values.std() / np.sqrt(draws)
    assert values.mean() >= g - 4.5 * se
    assert values.mean() <= g * 1.1


def test_rounding_an_integral_point_returns_it() -> None:
    matroid = UniformMatroid(6, 3)
    x = np.array([0, 1, 0, 1, 1, 0], dtype=float)
    assert pipage_rounding(x, matroid, np.random.default_rng(0)) == [1, 3, 4]
    assert greedy_rounding(x, matroid) == [1, 3, 4]
