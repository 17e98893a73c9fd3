"""FedSM Algorithm 1: exactness with full information, unbiasedness, split invariance, errors."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.supercore.task_identity import TaskIdentity
from hypothesis import given, settings
from hypothesis import strategies as st

from direct.fedsm import run_rounds
from flower_app.algorithms.common.counts import resolve_count
from flower_app.algorithms.fedsm.core import FedSMServer, user_report_sum
from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun
from flower_app.clients.adapter import handle_train
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.submodular import SubmodularClient, encode_report
from flower_app.datasets.synthetic import synthetic_dblp, synthetic_facility_location
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from flower_app.strategies.discovery import CohortMap
from flower_app.strategies.fedsm import decode_report
from flower_app.submodular.greedy import greedy, lazy_greedy
from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid
from flower_app.submodular.objectives import FacilityLocation, MaxCoverage, MaxRowObjective


def _fl(n=300, m=80, seed=0) -> FacilityLocation:
    rm = synthetic_facility_location(n, m, seed=seed)
    return FacilityLocation(rm.values)


def _alg1_direct(obj, matroid, k, clients, elements, seed) -> list[int]:
    """Algorithm 1 (fedsm-mode alg1) on the direct engine."""
    params = FedSMParams("alg1", clients, elements)
    return run_rounds(obj, FedSMRun(obj.n_users, matroid, k, params, obj.max_singleton, seed=seed))


@pytest.mark.parametrize("seed", [0, 1])
def test_full_information_equals_centralized_greedy(seed) -> None:
    obj = _fl(seed=seed)
    matroid = UniformMatroid(obj.n_elements, 25)
    assert _alg1_direct(obj, matroid, 25, 1.0, 1.0, seed) == greedy(obj, matroid).selected


def test_full_information_equals_greedy_under_partition_matroid_and_coverage() -> None:
    vs = synthetic_dblp(n_researchers=3000, n_venues=120, seed=3)
    obj = MaxCoverage(vs.matrix)
    matroid = PartitionMatroid.from_labels(vs.element_groups, 6)
    selected = _alg1_direct(obj, matroid, matroid.rank, obj.n_users, obj.n_elements, 5)
    assert selected == lazy_greedy(obj, matroid).selected
    assert matroid.is_independent(selected)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(2, 9))
def test_returned_set_is_independent(seed, cap, k) -> None:
    obj = _fl(60, 30, seed=seed % 7)
    matroid = PartitionMatroid(np.arange(30) % 5, cap)
    k = min(k, matroid.rank)
    selected = _alg1_direct(obj, matroid, k, 0.2, 3, seed)
    assert len(selected) == k and matroid.is_independent(selected)


def test_estimator_is_unbiased() -> None:
    """E[|E∖S|/(dK) Σ_{i∈A} Σ_{e∈D_i} f_i(e|S)] = F(e|S) (Eq. 3), checked over many rounds."""
    obj = _fl(40, 12, seed=4)
    selected = [3, 7]
    n, m, K, d = obj.n_users, obj.n_elements, 6, 4
    truth = obj.gains(obj.user_values(selected)) / n
    draws = 4000
    estimates = np.empty((draws, m))
    rng = np.random.default_rng(0)
    for t in range(draws):
        users = np.sort(rng.choice(n, K, replace=False))
        estimates[t] = (
            (m - len(selected)) / (d * K) * user_report_sum(obj, users, selected, d, 11, t + 1)
        )
    mean, se = estimates.mean(axis=0), estimates.std(axis=0) / np.sqrt(draws)
    assert np.all(np.abs(mean - truth) <= 4.5 * se + 1e-12), (mean, truth, se)
    assert np.all(estimates[:, selected] == 0)


@pytest.mark.parametrize("partitions", [1, 2, 3, 16, 300])
def test_node_sums_do_not_depend_on_the_split(partitions) -> None:
    obj = _fl()
    users = np.sort(np.random.default_rng(1).choice(obj.n_users, 70, replace=False))
    selected, d, seed, rnd = [5, 9], 17, 3, 4
    reference = user_report_sum(obj, users, selected, d, seed, rnd)
    total = np.zeros(obj.n_elements)
    for p in range(partitions):
        first, count = cohort_range(obj.n_users, p, partitions)
        client = SubmodularClient(
            MaxRowObjective(obj.values[first : first + count]), first, obj.n_users, p, partitions
        )
        mine = users[(users >= first) & (users < first + count)]
        arrays, n_ex, metrics = client.fit(
            [np.array(selected), mine], {"d": d, "seed": seed, "server-round": rnd}
        )
        assert n_ex == mine.size and metrics["user-values"] == mine.size * d
        total += decode_report(arrays, obj.n_elements)
    np.testing.assert_array_equal(total, reference)


def test_cohort_ranges_partition_the_users() -> None:
    for n, parts in [(10, 3), (5, 8), (6040, 16), (7, 7)]:
        ranges = [cohort_range(n, p, parts) for p in range(parts)]
        covered = [u for first, count in ranges for u in range(first, first + count)]
        assert covered == list(range(n))
    with pytest.raises(ValueError, match="out of range"):
        cohort_range(10, 3, 3)


def test_report_encoding_round_trip_and_choice() -> None:
    sparse = np.zeros(1000)
    sparse[[3, 500]] = [1.5, 2.0]
    assert len(encode_report(sparse)) == 2
    dense = np.arange(1000, dtype=float)
    assert len(encode_report(dense)) == 1
    for vec in (sparse, dense):
        np.testing.assert_array_equal(decode_report(encode_report(vec), 1000), vec)


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ([np.zeros(5)], "shape"),
        ([np.array([0, 9]), np.array([1.0, 2.0])], "outside"),
        ([np.array([1, 1]), np.array([1.0, 2.0])], "repeats"),
        ([np.array([1]), np.array([np.nan])], "finite"),
        ([np.array([1]), np.array([-1.0])], "non-negative"),
        ([np.zeros(3), np.zeros(3), np.zeros(3)], "1 \\(dense\\) or 2"),
    ],
)
def test_malformed_reports_are_rejected(arrays, match) -> None:
    with pytest.raises(ValueError, match=match):
        decode_report(arrays, 8)


def test_counts_as_fractions_or_numbers() -> None:
    assert resolve_count(0.1, 6040, "K") == 604
    assert resolve_count(0.001, 100, "K") == 1
    assert resolve_count(1.0, 37, "K") == 37
    assert resolve_count(50, 6040, "K") == 50
    for bad in (0.0, 1.5, 0, 7000, True, "0.1"):
        with pytest.raises(ValueError):
            resolve_count(bad, 6040, "K")


def test_server_rejects_bad_parameters() -> None:
    matroid = UniformMatroid(20, 5)
    with pytest.raises(ValueError, match="exceeds the matroid's rank"):
        FedSMServer(10, matroid, 6, 0.5, 0.5)
    with pytest.raises(ValueError, match="1..10"):
        FedSMServer(10, matroid, 5, 11, 0.5)
    with pytest.raises(ValueError, match="seed"):
        FedSMServer(10, matroid, 5, 0.5, 0.5, seed=-1)


def _context(pid: int, parts: int) -> Context:
    return Context(
        run_id=1,
        node_id=pid + 100,
        node_config={"partition-id": pid, "num-partitions": parts},
        state=RecordDict(),
        run_config={},
    )


def test_strategy_leaves_out_bad_replies_and_counts_them() -> None:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    obj = _fl(90, 40, seed=2)
    parts = 3
    clients = {}
    for p in range(parts):
        first, count = cohort_range(obj.n_users, p, parts)
        clients[100 + p] = SubmodularClient(
            MaxRowObjective(obj.values[first : first + count]), first, obj.n_users, p, parts
        )
    strategy = FedSMCohorts(obj.n_users, UniformMatroid(40, 3), 3, FedSMParams("alg1", 1.0, 1.0))
    strategy.cohorts = CohortMap(
        np.array([100, 101, 102], dtype=object), np.array([0, 30, 60]), np.array([30, 30, 30])
    )
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid=None))
    assert len(msgs) == 3
    replies = [
        handle_train(
            msg, _context(msg.metadata.dst_node_id - 100, parts), lambda ctx: clients[ctx.node_id]
        )
        for msg in msgs
    ]
    # node 101 sends a NaN, node 102 fails: only node 100's 30 users count
    replies[1] = Message(
        RecordDict(
            {
                "arrays": ArrayRecord({"0": Array(np.full(40, np.nan))}),
                "metrics": MetricRecord({"num-examples": 30}),
            }
        ),
        reply_to=msgs[1],
    )
    replies[2] = Message(Error(code=2, reason="boom"), reply_to=msgs[2])
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["bad-replies"] == 2 and metrics["users"] == 30
    own = obj.gains(np.zeros(30), np.arange(30))
    assert metrics["element"] == int(np.argmax(own))
    assert metrics["estimate"] == pytest.approx(own.max() / 30)


def test_federated_evaluation_sums_the_nodes_objectives() -> None:
    """Without an evaluate_fn the strategy asks every node for Σ f_i(S) over its users."""
    from flower_app.clients.adapter import handle_evaluate

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    obj = _fl(50, 30, seed=6)
    parts = 4
    clients = {}
    for p in range(parts):
        first, count = cohort_range(obj.n_users, p, parts)
        rows = MaxRowObjective(obj.values[first : first + count])
        clients[100 + p] = SubmodularClient(rows, first, obj.n_users, p, parts)
    strategy = FedSMCohorts(obj.n_users, UniformMatroid(30, 3), 3, FedSMParams())
    ranges = [cohort_range(obj.n_users, p, parts) for p in range(parts)]
    strategy.cohorts = CohortMap(
        np.array(list(clients), dtype=object),
        np.array([f for f, _ in ranges]),
        np.array([c for _, c in ranges]),
    )
    selected = np.array([4, 11, 20])
    msgs = list(strategy.configure_evaluate(3, ArrayRecord([selected]), ConfigRecord(), None))
    replies = [
        handle_evaluate(
            m, _context(m.metadata.dst_node_id - 100, parts), lambda c: clients[c.node_id]
        )
        for m in msgs
    ]
    result = strategy.aggregate_evaluate(3, replies)
    assert result["objective"] == pytest.approx(obj.mean_value(selected))
    replies[0] = Message(Error(code=2, reason="down"), reply_to=msgs[0])
    assert strategy.aggregate_evaluate(3, replies) is None
