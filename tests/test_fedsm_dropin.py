"""FedSMStrategy as a drop-in strategy: plain mode over a user's own ClientApp (LocalGrid).

The strongest check: n nodes that each hold one user give the same S as the cohort-mode /
direct engine for the same seed, in every mode. Then one test per ``start()`` convention.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord
from flwr.clientapp import ClientApp

from direct.fedsm import run_rounds as run_modes
from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun
from flower_app.algorithms.fedsm.user import GainsUtility
from flower_app.clients.adapter import numpy_client_app
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.fedcg import Coverage, ScoreTable
from flower_app.clients.fedsm import fedsm_evaluate, fedsm_reply
from flower_app.clients.submodular import SubmodularClient
from flower_app.datasets.synthetic import synthetic_facility_location
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from flower_app.strategies.errors import (
    AllRepliesRejectedError,
    InitialArraysError,
    MissingHandlerError,
)
from flower_app.strategies.fedsm import FedSMStrategy
from flower_app.submodular.greedy import greedy
from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid
from flower_app.submodular.objectives import FacilityLocation, MaxRowObjective
from tests.support.local_grid import LocalGrid

N, M = 24, 30


def _objective(seed: int = 1) -> FacilityLocation:
    return FacilityLocation(synthetic_facility_location(N, M, seed=seed).values)


def _row(obj: MaxRowObjective, user: int) -> MaxRowObjective:
    return MaxRowObjective(obj.values[user : user + 1])


def _dense(obj: MaxRowObjective, user: int) -> np.ndarray:
    return obj.values[user].toarray().ravel()


def user_app(obj: MaxRowObjective, kind: str = "scores", seen: list | None = None) -> ClientApp:
    """A user's ClientApp: node i (partition-id i) holds user i of ``obj``."""
    app = ClientApp()

    def utility(context):
        """The user's data as the user has it: {item: score}, or a gains callable."""
        user = int(context.node_config["partition-id"])
        scores = _dense(obj, user)
        if kind == "scores":
            return {int(j): float(scores[j]) for j in np.flatnonzero(scores)}

        def best(selected: np.ndarray) -> float:
            return scores[selected].max() if selected.size else 0.0

        if kind == "gains":  # SetFunction's form: gains of every element
            return lambda selected: np.maximum(scores - best(selected), 0.0)
        return GainsUtility(  # only the sampled candidates
            lambda selected, cand: np.maximum(scores[cand] - best(selected), 0.0), M
        )

    @app.train()
    def train(msg, context):
        if seen is not None:
            seen.append(dict(msg.content.config_records["config"]))
        return fedsm_reply(msg, context, utility(context), n_elements=M)

    @app.evaluate()
    def evaluate(msg, context):
        return fedsm_evaluate(msg, context, utility(context), n_elements=M)

    return app


def _direct(obj: MaxRowObjective, k: int, params: FedSMParams, seed: int) -> list[int]:
    run = FedSMRun(
        obj.n_users, UniformMatroid(obj.n_elements, k), k, params, obj.max_singleton, seed
    )
    return run_modes(obj, run)


MODES = {
    "alg1": FedSMParams("alg1", 0.25, 0.2),
    "alg2": FedSMParams("alg2", 0.5, 40, epsilon=0.3),
    "amplified": FedSMParams("amplified", 0.5, 0.3, eta=0.5),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_plain_mode_one_user_per_node_gives_the_direct_engines_set(mode) -> None:
    obj = _objective()
    k = 5
    params = MODES[mode]
    strategy = FedSMStrategy(k=k, seed=3, min_available_nodes=N, params=params)
    result = strategy.start(LocalGrid(N, {}, app=user_app(obj)))
    plain = result.arrays["selected"].numpy().tolist()
    assert plain == _direct(obj, k, params, seed=3)
    assert strategy.n_users == N and strategy.n_elements == M


def test_plain_mode_equals_cohort_mode_over_the_same_grid() -> None:
    obj = _objective(seed=4)
    params = FedSMParams("alg1", 0.3, 0.25)

    def factory(context):
        p, parts = context.node_config["partition-id"], context.node_config["num-partitions"]
        first, count = cohort_range(obj.n_users, p, parts)
        rows = MaxRowObjective(obj.values[first : first + count])
        return SubmodularClient(rows, first, obj.n_users, p, parts)

    cohort = FedSMCohorts(N, UniformMatroid(M, 6), 6, params, seed=9)
    sel_cohort = cohort.start(LocalGrid(4, {}, app=numpy_client_app(factory)), num_rounds=6)
    plain = FedSMStrategy(k=6, seed=9, min_available_nodes=N, params=params)
    sel_plain = plain.start(LocalGrid(N, {}, app=user_app(obj)), num_rounds=6)
    assert sel_plain.arrays["selected"].numpy().tolist() == (
        sel_cohort.arrays["selected"].numpy().tolist()
    )


@pytest.mark.parametrize("kind", ["gains", "candidates"])
@pytest.mark.parametrize("mode", ["alg1", "alg2"])
def test_a_gains_callable_gives_the_same_set_as_score_data(mode, kind) -> None:
    obj = _objective(seed=5)
    params = MODES[mode]
    a = FedSMStrategy(k=4, seed=2, min_available_nodes=N, params=params)
    b = FedSMStrategy(k=4, seed=2, min_available_nodes=N, params=params, federated_evaluation=True)
    sel_a = a.start(LocalGrid(N, {}, app=user_app(obj, "scores"))).arrays["selected"]
    result = b.start(LocalGrid(N, {}, app=user_app(obj, kind)))
    assert sel_a.numpy().tolist() == result.arrays["selected"].numpy().tolist()
    # f_i(S) from the gains along S (no value_fn given)
    assert b.history[-1]["objective"] == pytest.approx(obj.mean_value(sel_a.numpy()))
    assert np.isclose(b.lam, obj.max_singleton)


def test_full_information_plain_mode_is_centralized_greedy() -> None:
    """K = n users, d = all of E \\ S: Algorithm 1 is greedy (ties to the lowest index)."""
    obj = _objective(seed=6)
    strategy = FedSMStrategy(
        k=5,
        clients_per_round=1.0,
        elements_per_client=1.0,
        seed=0,
        min_available_nodes=N,
        federated_evaluation=True,
    )
    result = strategy.start(LocalGrid(N, {}, app=user_app(obj)))
    selected = result.arrays["selected"].numpy().tolist()
    assert selected == greedy(obj, UniformMatroid(M, 5)).selected
    last = max(result.evaluate_metrics_clientapp)
    assert result.evaluate_metrics_clientapp[last]["objective"] == pytest.approx(
        obj.mean_value(selected)
    )


# ------------------------------------------------------------------ start() conventions
def test_initial_arrays_round_trip_and_a_starting_set_is_kept() -> None:
    obj = _objective()
    strategy = FedSMStrategy(k=4, seed=1, min_available_nodes=N)
    start = ArrayRecord({"selected": Array(np.array([7, 2], dtype=np.int64))})
    result = strategy.start(LocalGrid(N, {}, app=user_app(obj)), initial_arrays=start)
    assert list(result.arrays.keys()) == ["selected"]
    selected = result.arrays["selected"].numpy()
    assert selected.dtype == np.int64 and selected[:2].tolist() == [7, 2] and selected.size == 4
    assert len(strategy.history) == 2  # k − |S₀| rounds
    # an empty record or None: S₀ = ∅, same key back
    result = FedSMStrategy(k=2, min_available_nodes=N).start(
        LocalGrid(N, {}, app=user_app(obj)), initial_arrays=ArrayRecord()
    )
    assert list(result.arrays.keys()) == ["selected"]
    with pytest.raises(InitialArraysError, match="selected"):
        FedSMStrategy(k=2).start(
            LocalGrid(N, {}, app=user_app(obj)),
            initial_arrays=ArrayRecord({"weights": Array(np.zeros(3))}),
        )


def test_train_config_reaches_the_client_unchanged() -> None:
    obj = _objective()
    seen: list[dict] = []
    strategy = FedSMStrategy(k=2, min_available_nodes=N)
    config = ConfigRecord({"lr": 0.05, "note": "mine"})
    strategy.start(LocalGrid(N, {}, app=user_app(obj, seen=seen)), train_config=config)
    rounds = [c for c in seen if c["stage"] == "round"]
    assert rounds and all(c["lr"] == 0.05 and c["note"] == "mine" for c in rounds)
    assert {c["server-round"] for c in rounds} == {1, 2}


def test_num_rounds_is_k_for_algorithm_1_and_the_difference_is_logged(caplog) -> None:
    obj = _objective()
    strategy = FedSMStrategy(k=3, min_available_nodes=N)
    logger = logging.getLogger("flwr")
    logger.addHandler(caplog.handler)
    try:
        result = strategy.start(LocalGrid(N, {}, app=user_app(obj)), num_rounds=7)
    finally:
        logger.removeHandler(caplog.handler)
    assert [row["server-round"] for row in strategy.history] == [1, 2, 3]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert "num_rounds=7 is not used" in caplog.text


def test_evaluate_fn_gets_the_selected_set_at_rounds_0_to_k() -> None:
    obj = _objective()
    calls: list[tuple[int, list[int]]] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        sel = arrays["selected"].numpy().tolist() if "selected" in arrays else []
        calls.append((server_round, sel))
        return MetricRecord({"objective": obj.mean_value(sel)})

    strategy = FedSMStrategy(k=3, min_available_nodes=N)
    result = strategy.start(LocalGrid(N, {}, app=user_app(obj)), evaluate_fn=evaluate_fn)
    assert [t for t, _ in calls] == [0, 1, 2, 3]
    assert [len(s) for _, s in calls] == [0, 1, 2, 3]
    assert calls[-1][1] == result.arrays["selected"].numpy().tolist()
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3]


def test_all_replies_rejected_fails_the_run() -> None:
    obj = _objective()
    grid = LocalGrid(N, {}, app=user_app(obj))

    def tamper(msg, reply):
        if msg.content.config_records["config"]["stage"] != "round":
            return reply
        return Message(Error(code=1, reason="broken client"), reply_to=msg)

    grid.tamper = tamper
    with pytest.raises(AllRepliesRejectedError, match="broken client"):
        FedSMStrategy(k=3, min_available_nodes=N).start(grid)


def test_a_missing_train_handler_is_named_fast() -> None:
    app = ClientApp()

    @app.evaluate()
    def evaluate(msg, context):  # pragma: no cover - never called
        return msg

    t0 = time.perf_counter()
    with pytest.raises(MissingHandlerError, match=r"@app\.train\(\)"):
        FedSMStrategy(k=2, min_available_nodes=3).start(LocalGrid(3, {}, app=app))
    assert time.perf_counter() - t0 < 5


def test_a_node_with_another_ground_set_is_left_out() -> None:
    obj = _objective()
    good = user_app(obj)
    other = ClientApp()

    @other.train()
    def train(msg, context):
        return fedsm_reply(msg, context, Coverage([1, 2], M + 5))

    def app(msg, context):
        return (other if context.node_config["partition-id"] == 0 else good)(msg, context)

    strategy = FedSMStrategy(k=2, min_available_nodes=N)
    strategy.start(LocalGrid(N, {}, app=app))
    assert strategy.n_users == N - 1 and strategy.n_elements == M


def test_capacities_with_groups_from_the_nodes_build_a_partition_matroid() -> None:
    obj = _objective()
    groups = np.arange(M) % 3
    app = ClientApp()

    @app.train()
    def train(msg, context):
        row = _dense(obj, int(context.node_config["partition-id"]))
        return fedsm_reply(msg, context, ScoreTable(row), groups=groups.tolist())

    strategy = FedSMStrategy(
        k=4,
        clients_per_round=1.0,
        elements_per_client=1.0,
        capacities={0: 2, 1: 1, 2: 1},
        min_available_nodes=N,
    )
    result = strategy.start(LocalGrid(N, {}, app=app))
    selected = result.arrays["selected"].numpy().tolist()
    matroid = PartitionMatroid(groups, [2, 1, 1])
    assert isinstance(strategy.matroid, PartitionMatroid)
    assert selected == greedy(obj, matroid).selected


def test_the_public_strategy_takes_no_cohort_arguments() -> None:
    """Cohorts are the runners' FedSMCohorts; the public strategy has no mode to set."""
    for cohort_only in ({"n_users": 10}, {"cohorts": True}, {"matroid": UniformMatroid(M, 2)}):
        with pytest.raises(TypeError, match="unexpected keyword"):
            FedSMStrategy(k=2, **cohort_only)


def test_users_are_numbered_by_partition_id_whatever_the_node_ids() -> None:
    """Simulation gives random node ids: users follow partition-id, so runs reproduce."""
    obj = _objective()
    params = MODES["alg1"]
    grid = LocalGrid(N, {}, app=user_app(obj), node_config=lambda i: {"partition-id": N - 1 - i})
    strategy = FedSMStrategy(k=5, seed=3, min_available_nodes=N, params=params)
    result = strategy.start(grid)
    assert result.arrays["selected"].numpy().tolist() == _direct(obj, 5, params, seed=3)
    assert strategy.nodes == sorted(grid.node_ids, reverse=True)
