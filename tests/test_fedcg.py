"""FedCG / FedCG+ math (direct engine): LMO, gradients, split invariance, rounding, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from direct.fedcg import run_fedcg_direct
from flower_app.algorithms.fedcg.continuous import (
    FedCGServer,
    LocalSteps,
    UserEntries,
    entry_gradient,
    round_point,
    sampled_entry_gradient,
    user_direction_sum,
)
from flower_app.clients.cohorts import cohort_range
from flower_app.datasets.synthetic import synthetic_dblp, synthetic_facility_location
from flower_app.submodular.greedy import lazy_greedy
from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid
from flower_app.submodular.multilinear import multilinear_gradient
from flower_app.submodular.objectives import FacilityLocation, MaxCoverage, MaxRowObjective
from flower_app.submodular.polytope import (
    OracleMatroid,
    batched_linear_maximizer,
    linear_maximizer,
)

E = 1 - 1 / np.e


def _fl(n=200, m=40, seed=0) -> FacilityLocation:
    return FacilityLocation(synthetic_facility_location(n, m, seed=seed).values)


# ------------------------------------------------------------------ linear maximisation
@st.composite
def matroids_and_weights(draw):
    m = draw(st.integers(1, 7))
    kind = draw(st.sampled_from(["uniform", "partition", "oracle"]))
    if kind == "uniform":
        matroid = UniformMatroid(m, draw(st.integers(1, m)))
    else:
        groups = np.array(draw(st.lists(st.integers(0, 2), min_size=m, max_size=m)))
        caps = draw(st.lists(st.integers(0, 2), min_size=3, max_size=3))
        matroid = PartitionMatroid(groups, caps)
        if kind == "oracle":  # the same matroid, seen only through its oracle
            part = matroid
            matroid = OracleMatroid(m, lambda s: part.is_independent(sorted(s)), "partition")
    vals = st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 3.0])  # ties on purpose
    g = np.array(draw(st.lists(vals, min_size=m, max_size=m)))
    return matroid, g


def _independent_sets(matroid):
    m = matroid.n_elements
    for size in range(m + 1):
        for subset in itertools.combinations(range(m), size):
            if matroid.is_independent(subset):
                yield subset


@settings(max_examples=80, deadline=None)
@given(matroids_and_weights(), st.integers(0, 2**31), st.booleans())
def test_lmo_returns_a_vertex_maximising_the_linear_function(inst, seed, complete) -> None:
    matroid, g = inst
    keys = np.random.default_rng(seed).random(g.size)
    chosen = linear_maximizer(matroid, g, tie_keys=keys, complete=complete)
    best = max(g[list(s)].sum() for s in _independent_sets(matroid))
    assert matroid.is_independent(chosen)
    assert g[chosen].sum() == pytest.approx(best)
    if complete:
        assert chosen.size == matroid.rank  # a base
    else:
        assert np.all(g[chosen] > 0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(["uniform", "partition"]))
def test_batched_lmo_equals_one_lmo_per_user(seed, kind) -> None:
    rng = np.random.default_rng(seed)
    m, n = 12, 9
    matroid = (
        UniformMatroid(m, 4) if kind == "uniform" else PartitionMatroid(np.arange(m) % 3, [2, 1, 3])
    )
    dense = np.where(rng.random((n, m)) < 0.4, rng.integers(1, 4, (n, m)), 0).astype(float)
    row, col = np.nonzero(dense)
    key = rng.random(row.size)
    chosen, deficit, _ = batched_linear_maximizer(matroid, row, col, dense[row, col], key, n)
    for i in range(n):
        keys = np.full(m, 2.0)
        keys[col[row == i]] = key[row == i]
        expected = linear_maximizer(matroid, dense[i], tie_keys=keys, complete=False)
        np.testing.assert_array_equal(np.sort(col[chosen & (row == i)]), expected)
        assert deficit[i].sum() == matroid.rank - expected.size


# ------------------------------------------------------------------ gradients
def test_entry_gradient_matches_the_exact_multilinear_gradient() -> None:
    obj = _fl(60, 25, seed=1)
    x = np.random.default_rng(0).uniform(0, 0.9, 25)
    users = np.arange(obj.n_users)
    ent = UserEntries.build(obj, users)
    grad = np.bincount(ent.col, weights=entry_gradient(ent, x[ent.col]), minlength=25)
    np.testing.assert_allclose(grad, multilinear_gradient(obj, x), atol=1e-10)


def test_sampled_entry_gradient_is_unbiased_and_converges() -> None:
    obj = _fl(50, 15, seed=2)
    x = np.random.default_rng(1).uniform(0.1, 0.8, 15)
    ent = UserEntries.build(obj, np.arange(obj.n_users))
    exact = entry_gradient(ent, x[ent.col])
    u = np.random.default_rng(3).random((3000, ent.val.size))
    est = sampled_entry_gradient(ent, x[ent.col], u)
    np.testing.assert_allclose(est, exact, atol=0.12)
    assert abs(est.sum() - exact.sum()) < 0.01 * exact.sum()


# ------------------------------------------------------------------ FedCG / FedCG+
@pytest.mark.parametrize(
    "local",
    [LocalSteps(), LocalSteps(steps=3, gradient="sampled", samples=4), LocalSteps(steps=2)],
)
@pytest.mark.parametrize("matroid_kind", ["uniform", "partition"])
def test_node_sums_do_not_depend_on_the_split(local, matroid_kind) -> None:
    obj = _fl(120, 30, seed=3)
    matroid = (
        UniformMatroid(30, 6)
        if matroid_kind == "uniform"
        else PartitionMatroid(np.arange(30) % 4, 2)
    )
    x = np.random.default_rng(4).dirichlet(np.ones(30)) * 3
    users = np.sort(np.random.default_rng(5).choice(obj.n_users, 50, replace=False))
    weights = np.random.default_rng(6).integers(1, 4, users.size).astype(float)
    ref, ref_sent = user_direction_sum(obj, users, weights, x, matroid, local, 9, 3)
    for parts in (2, 7, 120):
        total, sent = np.zeros(30), 0
        for p in range(parts):
            first, count = cohort_range(obj.n_users, p, parts)
            mask = (users >= first) & (users < first + count)
            cohort = MaxRowObjective(obj.values[first : first + count])
            vec, s = user_direction_sum(
                cohort, users[mask] - first, weights[mask], x, matroid, local, 9, 3,
                user_ids=users[mask],
            )  # fmt: skip
            total += vec
            sent += s
        np.testing.assert_array_equal(total, ref)
        assert sent == ref_sent
    # every user sent τ bases: Σ c_i τ r in total
    assert ref.sum() == pytest.approx(weights.sum() * local.steps * matroid.rank)


def test_fedcg_full_participation_beats_one_minus_one_over_e() -> None:
    obj = _fl(400, 80, seed=0)
    for k in (3, 8):
        matroid = UniformMatroid(80, k)
        greedy_value = lazy_greedy(obj, matroid, k).value
        server = FedCGServer(obj.n_users, matroid, 40, 0.0, LocalSteps(), 1.0, rounding="greedy")
        chosen = run_fedcg_direct(obj, server)
        assert server.eta == pytest.approx(1 / 40)
        assert matroid.is_independent(chosen) and len(chosen) == k
        assert server.x.sum() == pytest.approx(k)  # x is a convex combination of bases
        assert obj.mean_value(chosen) >= E * greedy_value


def test_fedcg_plus_with_fewer_rounds_is_close_to_fedcg() -> None:
    obj = _fl(400, 80, seed=1)
    matroid = UniformMatroid(80, 5)
    fedcg = FedCGServer(obj.n_users, matroid, 40, 0.0, LocalSteps(), 1.0, seed=1, rounding="greedy")
    plus = FedCGServer(
        obj.n_users, matroid, 8, 0.0, LocalSteps(steps=5, gradient="sampled", samples=5), 1.0,
        seed=1, rounding="greedy",
    )  # fmt: skip
    a = obj.mean_value(run_fedcg_direct(obj, fedcg))
    b = obj.mean_value(run_fedcg_direct(obj, plus))
    assert b >= 0.95 * a and len(plus.history) == 8


def test_partial_participation_samples_with_replacement_and_is_seeded() -> None:
    obj = _fl(100, 30, seed=2)
    matroid = PartitionMatroid(np.arange(30) % 3, 2)
    runs = []
    for _ in range(2):
        server = FedCGServer(obj.n_users, matroid, 10, 0.05, LocalSteps(), 0.3, seed=4)
        runs.append((run_fedcg_direct(obj, server), server.x.copy()))
        assert all(r.weight == 30 for r in server.history)  # K = 30 draws, multiplicities
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert matroid.is_independent(runs[0][0])
    assert runs[0][1].sum() == pytest.approx(10 * 0.05 * matroid.rank)


def test_coverage_with_general_matroid_oracle_matches_the_partition_path() -> None:
    vs = synthetic_dblp(n_researchers=300, n_venues=24, seed=1)
    obj = MaxCoverage(vs.matrix)
    part = PartitionMatroid(np.arange(24) % 4, 2)
    oracle = OracleMatroid(24, lambda s: part.is_independent(sorted(s)))
    x = np.full(24, 0.05)
    users = np.arange(obj.n_users)
    a, _ = user_direction_sum(obj, users, np.ones(300), x, part, LocalSteps(fill_base=False), 1, 1)
    b, _ = user_direction_sum(
        obj, users, np.ones(300), x, oracle, LocalSteps(fill_base=False), 1, 1
    )
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eta": -0.1}, "η=-0.1 must be positive"),
        ({"eta": float("nan")}, "must be positive"),
        ({"rounds": 0}, "T=0: the number of rounds must be a positive int"),
        ({"eta": 0.2}, "η·T .* > 1"),
        ({"p": np.full(10, 0.2)}, "p_i sum to 2, not 1"),
        ({"p": np.full(3, 1 / 3)}, "p must hold 10"),
        ({"rounding": "swap"}, "rounding='swap'"),
        ({"clients_per_round": 11}, "1..10"),
    ],
)
def test_bad_parameters_are_refused_before_round_one(kwargs, match) -> None:
    args = {
        "n_users": 10,
        "matroid": UniformMatroid(8, 2),
        "rounds": 10,
        "eta": 0.0,
        "local": LocalSteps(),
        "clients_per_round": 1.0,
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        FedCGServer(**args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"steps": 0}, "τ=0"), ({"gradient": "adam"}, "gradient='adam'"), ({"samples": 0}, "m=0")],
)
def test_bad_local_steps_are_refused(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        LocalSteps(**kwargs)


def test_rounding_refuses_points_outside_the_polytope() -> None:
    matroid = UniformMatroid(5, 2)
    rng = np.random.default_rng(0)
    for rounding in ("pipage", "greedy"):
        with pytest.raises(ValueError, match="outside the matroid polytope"):
            round_point(np.array([0.9, 0.9, 0.9, 0.0, 0.0]), matroid, rounding, rng)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 3), st.sampled_from(["pipage", "greedy"]))
def test_every_rounded_set_is_independent(seed, cap, rounding) -> None:
    rng = np.random.default_rng(seed)
    matroid = PartitionMatroid(rng.permutation(np.arange(15) % 4), cap)
    x = rng.random(15)
    for g in range(4):
        idx = matroid.groups == g
        x[idx] *= min(1.0, matroid.capacities[g] / max(x[idx].sum(), 1e-12))
    chosen = round_point(x, matroid, rounding, rng)
    assert matroid.is_independent(chosen) and len(chosen) == matroid.rank


def test_round_point_pipage_keeps_the_marginals() -> None:
    matroid = UniformMatroid(6, 2)
    x = np.array([0.5, 0.5, 0.4, 0.3, 0.2, 0.1])
    rng = np.random.default_rng(0)
    counts = np.zeros(6)
    for _ in range(3000):
        counts[round_point(x, matroid, "pipage", rng)] += 1
    np.testing.assert_allclose(counts / 3000, x, atol=0.04)  # x sums to the rank: no fill


def test_sparse_direction_sums_are_small_for_coverage() -> None:
    member = sp.csr_matrix(np.array([[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=float))
    obj = MaxCoverage(member)
    total, sent = user_direction_sum(
        obj, np.arange(3), np.ones(3), np.zeros(4), UniformMatroid(4, 2),
        LocalSteps(fill_base=False), 0, 1,
    )  # fmt: skip
    np.testing.assert_array_equal(total, [1, 1, 0, 1])
    assert sent == 3
