"""FedSM Algorithm 2 and amplification (Algorithm 3): estimators, feasibility, splits, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from direct import run_direct
from direct.fedsm import run_rounds as run_modes
from flower_app.algorithms.fedsm.alg2 import (
    PlainPairGains,
    pair_report_sum,
    random_feasible_sequence,
)
from flower_app.algorithms.fedsm.amplify import SurrogatePairGains, surrogate_entries
from flower_app.algorithms.fedsm.core import user_report_sum
from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun, RoundPlan, cohort_report
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.submodular import SubmodularClient
from flower_app.config import AppConfig, ConfigError
from flower_app.datasets.synthetic import synthetic_dblp, synthetic_facility_location
from flower_app.strategies.cohort.fedsm import plan_arrays
from flower_app.strategies.fedsm import decode_report
from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid
from flower_app.submodular.multilinear import multilinear_value
from flower_app.submodular.objectives import FacilityLocation, MaxCoverage, MaxRowObjective
from flower_app.submodular.rounding import check_in_polytope, greedy_rounding, pipage_rounding


def _fl(n=120, m=40, seed=0) -> FacilityLocation:
    return FacilityLocation(synthetic_facility_location(n, m, seed=seed).values)


def _truth_pairs(obj, selected, pool, seq) -> np.ndarray:
    """F(e | S ∪ {a_1..a_j}) for every pair, by brute force."""
    out = np.zeros((pool.size, seq.size))
    for j in range(seq.size):
        base = [*selected, *seq[:j].tolist()]
        gains = obj.gains(obj.user_values(base)) / obj.n_users
        out[:, j] = gains[pool]
    return out


# ---------------------------------------------------------------- unbiased estimators
@settings(max_examples=3, deadline=None)
@given(st.integers(0, 1000))
def test_alg1_estimator_is_unbiased_property(seed) -> None:
    obj = _fl(30, 10, seed=seed % 5)
    rng = np.random.default_rng(seed)
    selected = sorted(rng.choice(10, 2, replace=False).tolist())
    n, m, K, d, draws = obj.n_users, obj.n_elements, 5, 3, 2000
    truth = obj.gains(obj.user_values(selected)) / n
    est = np.empty((draws, m))
    for t in range(draws):
        users = np.sort(rng.choice(n, K, replace=False))
        est[t] = (m - 2) / (d * K) * user_report_sum(obj, users, selected, d, seed, t + 1)
    mean, se = est.mean(axis=0), est.std(axis=0) / np.sqrt(draws)
    assert np.all(np.abs(mean - truth) <= 4.5 * se + 1e-12)


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 1000))
def test_alg2_estimator_is_unbiased_property(seed) -> None:
    """E[|X|·r'/(dK) Σ_{i∈A} Σ_{(e,j)∈D_i} f_i(e | S ∪ a_1..a_j)] = F(e | S ∪ a_1..a_j)."""
    obj = _fl(30, 12, seed=seed % 5)
    rng = np.random.default_rng(seed)
    selected = [int(rng.integers(12))]
    pool = np.setdiff1d(np.arange(12), selected)[:7]
    seq = random_feasible_sequence(UniformMatroid(12, 5), selected, pool, 3, rng)
    n, K, d, draws = obj.n_users, 6, 5, 2000
    truth = _truth_pairs(obj, selected, pool, seq)
    est = np.empty((draws, pool.size * seq.size))
    for t in range(draws):
        users = np.sort(rng.choice(n, K, replace=False))
        gains = PlainPairGains(obj, users, selected, seq)
        total, _ = pair_report_sum(gains, users, users, pool, seq.size, d, seed, t + 1)
        est[t] = pool.size * seq.size / (d * K) * total
    mean, se = est.mean(axis=0), est.std(axis=0) / np.sqrt(draws)
    assert np.all(np.abs(mean - truth.ravel()) <= 4.5 * se + 1e-12), (mean, truth.ravel())


@pytest.mark.parametrize("j_from", [0, 1])
def test_plain_pair_gains_match_brute_force(j_from) -> None:
    obj = _fl(50, 30, seed=2)
    rng = np.random.default_rng(0)
    selected, pool = [1, 4], np.arange(5, 30)
    seq = random_feasible_sequence(UniformMatroid(30, 12), selected, pool, 10, rng)
    users = np.arange(obj.n_users)
    gains = PlainPairGains(obj, users, selected, seq, j_from)
    xs, js = np.meshgrid(np.arange(pool.size), np.arange(seq.size), indexing="ij")
    for u in (0, 7, 33):
        got = gains.evaluate(np.array([u]), np.zeros(xs.size, int), pool[xs.ravel()], js.ravel())
        want = np.zeros(xs.size)
        for p, (x, j) in enumerate(zip(xs.ravel(), js.ravel(), strict=True)):
            base = [*selected, *seq[: j + j_from].tolist()]
            want[p] = obj.value([*base, int(pool[x])], [u]) - obj.value(base, [u])
        np.testing.assert_allclose(got, want)


# ---------------------------------------------------------------- surrogate closed forms
def test_surrogate_alg1_values_are_exact_and_sampling_agrees() -> None:
    """g_i(e | T) = G_i(y + ηe_e) − G_i(y), y = x + η1_T; sampling is unbiased for it."""
    obj = _fl(20, 15, seed=1)
    rng = np.random.default_rng(3)
    eta = 0.25
    x = np.round(rng.integers(0, 3, 15) * eta, 2)
    T = [2, 9]
    y = x.copy()
    y[T] += eta
    users = np.arange(obj.n_users)
    upos, elem, gain = surrogate_entries(obj, users, users, y, eta, "exact", 1, 0, 1)
    for p in range(0, upos.size, 7):
        u, e = int(upos[p]), int(elem[p])
        bumped = y.copy()
        bumped[e] += eta
        want = multilinear_value(obj, bumped, [u]) - multilinear_value(obj, y, [u])
        assert gain[p] == pytest.approx(want, abs=1e-9)
    runs = [surrogate_entries(obj, users, users, y, eta, "sampled", 50, s, 1) for s in range(40)]
    exact = np.bincount(elem, weights=gain, minlength=15)
    sampled = np.mean([np.bincount(r[1], weights=r[2], minlength=15) for r in runs], axis=0)
    np.testing.assert_allclose(sampled, exact, rtol=0.05, atol=0.02)


@pytest.mark.parametrize(("surrogate", "j_from"), [("exact", 0), ("exact", 1), ("sampled", 1)])
def test_surrogate_pair_values_match_multilinear_differences(surrogate, j_from) -> None:
    obj = _fl(25, 18, seed=4)
    rng = np.random.default_rng(1)
    eta = 0.2
    y = rng.integers(0, 4, 18) * eta * 0.5
    pool = np.arange(18)
    seq = rng.choice(18, 6, replace=False)
    users = np.arange(obj.n_users)
    samples = 400 if surrogate == "sampled" else 1
    gains = SurrogatePairGains(obj, users, users, y, eta, seq, surrogate, samples, 5, 3, j_from)
    xs, js = np.meshgrid(pool, np.arange(seq.size), indexing="ij")
    for u in (0, 3, 11, 24):
        got = gains.evaluate(np.array([u]), np.zeros(xs.size, int), xs.ravel(), js.ravel())
        want = np.zeros(xs.size)
        for p, (e, j) in enumerate(zip(xs.ravel(), js.ravel(), strict=True)):
            z = y.copy()
            z[seq[: j + j_from]] += eta
            if e in seq[: j + j_from]:
                continue
            ze = z.copy()
            ze[e] += eta
            want[p] = multilinear_value(obj, ze, [u]) - multilinear_value(obj, z, [u])
        tol = 1e-9 if surrogate == "exact" else 0.15 * eta * obj.max_singleton
        np.testing.assert_allclose(got, want, atol=tol)


# ---------------------------------------------------------------- feasibility
@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.sampled_from(["alg2", "amplified"]))
def test_returned_sets_are_independent(seed, cap, mode) -> None:
    obj = _fl(60, 30, seed=seed % 3)
    matroid = PartitionMatroid(np.arange(30) % 5, cap)
    k = matroid.rank if mode == "amplified" else min(2 + seed % 6, matroid.rank)
    params = FedSMParams(mode, 0.5, 20, epsilon=0.3, eta=0.5, inner=("alg1", "alg2")[seed % 2])
    run = FedSMRun(obj.n_users, matroid, k, params, obj.max_singleton, seed=seed)
    points = []
    selected = run_modes(obj, run, lambda row: points.append(run.point))
    assert matroid.is_independent(selected) and len(selected) <= k
    for x in points:
        if x is not None:  # amplification's x stays in the polytope of M ∩ {|S| ≤ k}
            check_in_polytope(x, matroid)
            assert x.sum() <= k + 1e-9


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 3))
def test_rounding_keeps_feasibility(seed, cap) -> None:
    rng = np.random.default_rng(seed)
    matroid = PartitionMatroid(np.arange(20) % 4, cap)
    sets = [rng.permutation(np.flatnonzero(np.arange(20) % 4 == g))[:cap] for g in range(4)]
    steps = 4
    x = np.zeros(20)
    for _ in range(steps):
        chosen = [int(rng.choice(s)) for s in sets]
        x[chosen] += 1.0 / steps
    x = check_in_polytope(x, matroid)
    assert matroid.is_independent(pipage_rounding(x, matroid, rng))
    assert matroid.is_independent(greedy_rounding(x, matroid))


def test_random_feasible_sequence_is_drawn_from_x_and_respects_the_matroid() -> None:
    matroid = PartitionMatroid(np.arange(30) % 3, 2)
    rng = np.random.default_rng(0)
    pool = np.arange(0, 30, 2)
    seq = random_feasible_sequence(matroid, [0], pool, 10, rng)
    assert set(seq.tolist()) <= set(pool.tolist())
    assert matroid.is_independent([0, *seq.tolist()])
    assert seq.size == 5  # rank(M(S, X)) = 2 + 2 + 2 − 1 (block 0 holds element 0)


# ---------------------------------------------------------------- split invariance
def _clients(obj: MaxRowObjective, parts: int) -> list[SubmodularClient]:
    out = []
    for p in range(parts):
        first, count = cohort_range(obj.n_users, p, parts)
        rows = MaxRowObjective(obj.values[first : first + count])
        out.append(SubmodularClient(rows, first, obj.n_users, p, parts))
    return out


def _fit_all(clients, plan: RoundPlan, seed: int) -> np.ndarray:
    total = np.zeros(plan.report_size)
    for client in clients:
        first, count = client.first_user, client.num_users
        mine = plan.users[(plan.users >= first) & (plan.users < first + count)]
        config = {"server-round": plan.server_round, "d": plan.d, "seed": seed, "mode": plan.mode}
        if plan.surrogate != "none":
            config.update(surrogate=plan.surrogate, eta=plan.eta, samples=plan.samples)
        arrays, n_ex, _ = client.fit(plan_arrays(plan, mine), config)
        assert n_ex == mine.size
        total += decode_report(arrays, plan.report_size)
    return total


@pytest.mark.parametrize("parts", [1, 3, 17, 120])
@pytest.mark.parametrize(
    "params",
    [
        FedSMParams("alg2", 0.4, 25, epsilon=0.3),
        FedSMParams("amplified", 0.4, 0.3, eta=0.5, inner="alg1", surrogate="sampled"),
        FedSMParams("amplified", 0.4, 25, eta=0.5, inner="alg2", surrogate="exact"),
    ],
    ids=["alg2", "amp-alg1-sampled", "amp-alg2-exact"],
)
def test_reports_do_not_depend_on_the_split(parts, params) -> None:
    obj = _fl()
    run = FedSMRun(obj.n_users, UniformMatroid(obj.n_elements, 6), 6, params, 5.0, seed=2)
    clients = _clients(obj, parts)
    for _ in range(4):  # a few rounds, so that S, X and x are not trivial
        plan = run.plan()
        whole, _ = cohort_report(obj, plan.users, plan.users, plan, 2)
        np.testing.assert_array_equal(_fit_all(clients, plan, 2), whole)
        run.update(whole, plan.users.size)


# ---------------------------------------------------------------- behaviour and errors
def test_alg2_with_full_information_and_tiny_epsilon_is_close_to_greedy() -> None:
    from flower_app.submodular.greedy import greedy

    obj = _fl(200, 60, seed=3)
    matroid = UniformMatroid(60, 10)
    params = FedSMParams("alg2", 1.0, 1.0, epsilon=0.1, tau=0.0, j_from=0)
    selected = run_modes(obj, FedSMRun(200, matroid, 10, params, obj.max_singleton, seed=0))
    assert len(selected) == 10
    assert obj.mean_value(selected) >= 0.95 * greedy(obj, matroid).value


class _OddMatroid(Matroid):
    n_elements = 10

    @property
    def rank(self) -> int:
        return 3

    def is_independent(self, selected) -> bool:
        return len(list(selected)) <= 3

    def feasible_mask(self, selected) -> np.ndarray:
        return np.ones(10, dtype=bool)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (FedSMParams("alg2", 0.5, 10, epsilon=0.0), "epsilon=0.0 must lie in \\(0, 1\\)"),
        (FedSMParams("alg2", 0.5, 10, epsilon=1.2), "must lie in \\(0, 1\\)"),
        (FedSMParams("amplified", 0.5, 0.5, eta=1.5), "eta=1.5 must lie in \\(0, 1\\)"),
        (FedSMParams("amplified", 0.5, 0.5, eta=0.3), "1/eta must be an integer"),
        (FedSMParams("alg2", 0.5, 10_000), "pairs per client d=10000 is impossible"),
        (FedSMParams("amplified", 0.5, 0.5, surrogate="guess"), "surrogate='guess'"),
        (FedSMParams("fast"), "fedsm mode 'fast'"),
    ],
)
def test_bad_parameters_fail_before_the_first_round(params, match) -> None:
    with pytest.raises(ValueError, match=match):
        FedSMRun(50, UniformMatroid(40, 5), 5, params, 5.0)


def test_amplification_needs_k_equal_to_the_rank() -> None:
    with pytest.raises(ValueError, match="k=3 must equal its rank 5"):
        FedSMRun(50, PartitionMatroid(np.arange(10) % 5, 1), 3, FedSMParams("amplified"), 5.0)


def test_unsupported_matroid_is_refused() -> None:
    with pytest.raises(ValueError, match="supports uniform and partition matroids"):
        FedSMRun(50, _OddMatroid(), 3, FedSMParams("alg2", 0.5, 5), 5.0)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"fedsm-mode": "alg2", "fedsm-epsilon": 1.0}, "'fedsm-epsilon' = 1.0: must be < 1"),
        ({"fedsm-mode": "amplified", "fedsm-eta": 0.3}, "'fedsm-eta' = 0.3: 1/x must be an "
         "integer"),
        ({"fedsm-mode": "turbo"}, "'fedsm-mode' = 'turbo' is not known; choose one of: alg1, alg2"),
        ({"fedsm-mode": "alg2", "elements-per-client": 10**6},
         "'elements-per-client' = 1000000 exceeds the \\|E\\|·k = 5000 \\(element, prefix"),
    ],
)
def test_bad_run_config_is_named(tmp_path, override, match) -> None:
    with pytest.raises(ConfigError, match=match):
        cfg = AppConfig.from_run_config({**override, "output-dir": str(tmp_path)})
        run_direct(cfg)


def _run_folder_rows(summary: dict) -> list[dict]:
    lines = (
        (__import__("pathlib").Path(summary["run-folder"]) / "metrics.jsonl")
        .read_text()
        .splitlines()
    )
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    "override",
    [
        {"fedsm-mode": "alg2", "elements-per-client": 30, "fedsm-tau": 0.001},
        {"fedsm-mode": "amplified", "fedsm-eta": 0.5, "fedsm-rounding": "greedy"},
        {"fedsm-mode": "amplified", "fedsm-eta": 0.5, "fedsm-inner": "alg2", "fedsm-tau": 0.01},
    ],
)
def test_direct_runs_record_rounds_elements_and_communication(tmp_path, override) -> None:
    cfg = AppConfig.from_run_config(
        {"num-users": 150, "num-elements": 50, "k": 6, "seed": 1, **override}
        | {"output-dir": str(tmp_path), "clients-per-round": 0.5}
    )
    summary = run_direct(cfg)
    rows = _run_folder_rows(summary)
    assert summary["communication-rounds"] == len(rows) and summary["set-size"] == 6
    for key in ("values-up", "bytes-up", "values-down", "bytes-down", "user-values"):
        assert summary[key] == sum(r[key] for r in rows) and summary[key] > 0
    assert all("values-down-per-client" in r and "elements-added" in r for r in rows)
    if override["fedsm-mode"] == "alg2":
        assert sum(r["elements-added"] for r in rows) == 6
        assert len(summary["objective-by-k"]) == 6
    else:
        assert summary["fractional-objective"] > 0 and len(summary["step-sets"]) == 2


def test_partition_matroid_and_coverage_in_alg2() -> None:
    vs = synthetic_dblp(n_researchers=3000, n_venues=80, seed=1)
    obj = MaxCoverage(vs.matrix)
    matroid = PartitionMatroid.from_labels(vs.element_groups, 4)
    params = FedSMParams("alg2", 0.3, 100, epsilon=0.4, tau=0.002)
    run = FedSMRun(3000, matroid, 8, params, 1.0, seed=0)
    selected = run_modes(obj, run)
    assert len(selected) == 8 and matroid.is_independent(selected)


def test_strategy_alg2_round_over_messages_counts_communication_and_bad_replies() -> None:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from flower_app.clients.adapter import handle_train
    from flower_app.strategies.cohort.fedsm import FedSMCohorts
    from flower_app.strategies.discovery import CohortMap

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    obj = _fl(90, 40, seed=2)
    clients = {100 + c.partition_id: c for c in _clients(obj, 3)}
    params = FedSMParams("alg2", 1.0, 50, epsilon=0.3, tau=0.01)
    strategy = FedSMCohorts(obj.n_users, UniformMatroid(40, 6), 6, params, lam=5.0)
    strategy.cohorts = CohortMap(
        np.array([100, 101, 102], dtype=object), np.array([0, 30, 60]), np.array([30, 30, 30])
    )
    twin = FedSMRun(obj.n_users, UniformMatroid(40, 6), 6, params, 5.0)
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid=None))
    plan = twin.plan()
    assert msgs[0].content.config_records["config"]["mode"] == "alg2"

    def context(node: int) -> Context:
        cfg = {"partition-id": node - 100, "num-partitions": 3}
        return Context(run_id=1, node_id=node, node_config=cfg, state=RecordDict(), run_config={})

    replies = [
        handle_train(m, context(m.metadata.dst_node_id), lambda c: clients[c.node_id]) for m in msgs
    ]
    _, metrics = strategy.aggregate_train(1, replies)
    whole, _ = cohort_report(obj, plan.users, plan.users, plan, 0)
    row = twin.update(whole, plan.users.size)
    assert metrics["elements-added"] == row["elements-added"]
    assert metrics["set-size"] == row["set-size"] and strategy.run.selected == twin.selected
    assert metrics["bytes-up"] > 0 and metrics["values-down"] > 0 and metrics["bad-replies"] == 0
    assert metrics["user-values"] == obj.n_users * plan.d
    # a failing node is left out and counted
    msgs = list(strategy.configure_train(2, ArrayRecord(), ConfigRecord(), grid=None))
    replies = [
        handle_train(m, context(m.metadata.dst_node_id), lambda c: clients[c.node_id]) for m in msgs
    ]
    replies[0] = Message(Error(code=2, reason="down"), reply_to=msgs[0])
    _, metrics = strategy.aggregate_train(2, replies)
    assert metrics["bad-replies"] == 1 and metrics["users"] == 60
