"""Federated discrete greedy (Alg. 3) and the importance-factor protocols (Algs. 4 and 5)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from direct.fedcg import run_discrete_greedy_direct
from flower_app.algorithms.fedcg.discrete_greedy import (
    DiscreteGreedyServer,
    discrete_report_sum,
    histogram_sum,
    importance_factors,
    participation_probabilities,
)
from flower_app.clients.cohorts import cohort_range
from flower_app.datasets.synthetic import synthetic_dblp, synthetic_facility_location
from flower_app.submodular.greedy import greedy
from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid
from flower_app.submodular.objectives import FacilityLocation, MaxCoverage, MaxRowObjective


@st.composite
def split_instances(draw):
    n = draw(st.integers(1, 30))
    m = draw(st.integers(1, 8))
    coverage = draw(st.booleans())
    vals = st.sampled_from([0.0, 1.0] if coverage else [0.0, 0.0, 1.0, 2.5, 4.0, 5.0])
    dense = np.array(draw(st.lists(vals, min_size=n * m, max_size=n * m))).reshape(n, m)
    parts = draw(st.integers(1, n))
    return dense, coverage, parts


@settings(max_examples=80, deadline=None)
@given(split_instances())
def test_protocol_gives_the_central_importance_factors(inst) -> None:
    """Two rounds over nodes (sum of O_i, broadcast, local w_i) = w_i computed centrally."""
    dense, coverage, parts = inst
    matrix = sp.csr_matrix(dense)
    obj = MaxCoverage(matrix) if coverage else FacilityLocation(matrix)
    n = dense.shape[0]
    cohorts = [cohort_range(n, p, parts) for p in range(parts)]
    nodes = [MaxRowObjective(obj.values[f : f + c]) for f, c in cohorts]
    histogram = sum(histogram_sum(node) for node in nodes)  # round 1 (SecAgg sum)
    w = np.concatenate([importance_factors(node, histogram) for node in nodes])  # round 2
    col = dense.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        central = np.where(dense > 0, dense / col, 0.0).max(axis=1)
    np.testing.assert_allclose(w, central, rtol=1e-12)
    if coverage:  # Alg. 5: w_i = max over i's groups of 1/|G_a|
        sizes = dense.sum(axis=0)
        for i in range(n):
            groups = np.flatnonzero(dense[i])
            expected = (1 / sizes[groups]).max() if groups.size else 0.0
            assert w[i] == pytest.approx(expected)
    assert w.sum() <= dense.shape[1] + 1e-9  # Σ_i w_i ≤ n (proof of Thm D.2)


def test_large_kappa_is_centralized_greedy() -> None:
    obj = FacilityLocation(synthetic_facility_location(300, 60, seed=1).values)
    for matroid in (UniformMatroid(60, 8), PartitionMatroid(np.arange(60) % 5, 2)):
        server = DiscreteGreedyServer(obj.n_users, matroid, min(8, matroid.rank), 1e9, seed=3)
        chosen = run_discrete_greedy_direct(obj, server)
        assert chosen == greedy(obj, matroid, server.k).selected
        assert all(r.participants == obj.n_users for r in server.rounds)
        assert server.expected == pytest.approx(obj.n_users)


def test_small_kappa_samples_few_users_and_stays_close() -> None:
    obj = FacilityLocation(synthetic_facility_location(2000, 200, seed=2).values)
    matroid = UniformMatroid(200, 10)
    server = DiscreteGreedyServer(obj.n_users, matroid, 10, 10.0, seed=0)
    chosen = run_discrete_greedy_direct(obj, server)
    participants = np.mean([r.participants for r in server.rounds])
    assert server.expected < 0.5 * obj.n_users
    assert abs(participants - server.expected) < 5 * np.sqrt(server.expected)
    assert obj.mean_value(chosen) >= 0.9 * greedy(obj, matroid).value


def test_reports_are_unbiased_estimates_of_the_gains() -> None:
    obj = FacilityLocation(synthetic_facility_location(80, 10, seed=4).values)
    matroid = UniformMatroid(10, 3)
    w = importance_factors(obj, histogram_sum(obj))
    kappa_i = participation_probabilities(w, 3.0)
    assert (kappa_i < 1).any()
    ids = np.arange(obj.n_users)
    draws = np.array(
        [discrete_report_sum(obj, [2], matroid, kappa_i, 0, t, ids)[0] for t in range(3000)]
    )
    truth = obj.gains(obj.user_values([2]))
    mean = draws.mean(axis=0) / 2**20
    se = draws.std(axis=0) / 2**20 / np.sqrt(len(draws))
    assert np.all(np.abs(mean - truth) <= 4.5 * se + 1e-6)


@pytest.mark.parametrize("parts", [2, 5, 300])
def test_report_sums_do_not_depend_on_the_split(parts) -> None:
    vs = synthetic_dblp(n_researchers=300, n_venues=40, seed=2)
    obj = MaxCoverage(vs.matrix)
    matroid = UniformMatroid(40, 5)
    kappa_i = participation_probabilities(importance_factors(obj, histogram_sum(obj)), 7.0)
    ids = np.arange(obj.n_users)
    ref, ref_n = discrete_report_sum(obj, [1, 4], matroid, kappa_i, 5, 2, ids)
    total, count = np.zeros(40, dtype=np.int64), 0
    for p in range(parts):
        f, c = cohort_range(obj.n_users, p, parts)
        node = MaxRowObjective(obj.values[f : f + c])
        vec, n = discrete_report_sum(
            node, [1, 4], matroid, kappa_i[f : f + c], 5, 2, ids[f : f + c]
        )
        total += vec
        count += n
    np.testing.assert_array_equal(total, ref)
    assert count == ref_n


def test_bad_inputs_are_refused() -> None:
    matroid = UniformMatroid(5, 2)
    with pytest.raises(ValueError, match="κ=0"):
        DiscreteGreedyServer(10, matroid, 2, 0.0)
    with pytest.raises(ValueError, match="exceeds the matroid's rank"):
        DiscreteGreedyServer(10, matroid, 3, 1.0)
    obj = FacilityLocation(sp.csr_matrix(np.array([[1.0, 0, 2, 0, 0]])))
    with pytest.raises(ValueError, match="not Σ_i O_i"):
        importance_factors(obj, np.array([1.0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="length 5"):
        importance_factors(obj, np.ones(4))
    server = DiscreteGreedyServer(1, matroid, 2, 1.0)
    with pytest.raises(ValueError, match="integer vector"):
        server.select(np.ones(5), 1)
