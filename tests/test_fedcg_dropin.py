"""FedCG / FedCG+ / federated discrete greedy as drop-in strategies in a user's ServerApp.

Plain mode (one node = one client, a user-style ClientApp with the helpers of
``flower_app.clients.fedcg``) over the in-process grid: the same x and S as the direct
engine for the same seed, and Flower's start() conventions. Cohort mode: the results
recorded before the redesign.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from direct import run_direct
from direct.fedcg import run_discrete_greedy_direct, run_fedcg_direct
from flower_app.algorithms.fedcg.continuous import FedCGServer, LocalSteps
from flower_app.algorithms.fedcg.discrete_greedy import DiscreteGreedyServer
from flower_app.clients.fedcg import (
    Coverage,
    ScoreTable,
    SetFunction,
    add_fedcg_handlers,
    fedcg_evaluate,
    fedcg_reply,
)
from flower_app.config import AppConfig, ConfigError
from flower_app.datasets.synthetic import synthetic_facility_location
from flower_app.runners.fedcg import server_run
from flower_app.strategies.discrete_greedy import FedDiscreteGreedyStrategy
from flower_app.strategies.errors import (
    AllRepliesRejectedError,
    InitialArraysError,
    MissingHandlerError,
)
from flower_app.strategies.fedcg import FedCGStrategy
from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid
from flower_app.submodular.objectives import FacilityLocation
from tests.support.local_grid import LocalGrid

N, M = 12, 20


def _objective() -> FacilityLocation:
    return FacilityLocation(synthetic_facility_location(N, M, seed=3).values)


def _user_app(objective: FacilityLocation, general: bool = False, seen: list | None = None):
    """A user's ClientApp: its own scores, the helpers answer; ``seen`` records configs."""
    rows = objective.values.toarray()
    app = ClientApp()

    def utility(context):
        table = ScoreTable(rows[int(context.node_config["partition-id"])])
        return SetFunction(M, table.gains) if general else table

    if seen is None:
        return add_fedcg_handlers(app, utility)

    for action in ("direction", "histogram", "importance", "discrete"):

        @app.train(action)
        def handler(msg: Message, context) -> Message:
            seen.append(dict(msg.content.config_records["config"]))
            return fedcg_reply(msg, context, utility(context))

    @app.evaluate()
    def evaluate(msg: Message, context) -> Message:
        return fedcg_evaluate(msg, context, utility(context))

    return app


def _grid(app, n: int = N) -> LocalGrid:
    return LocalGrid(n, {}, app=app, node_config=lambda i: {"partition-id": i})


# ---------------------------------------------------------------------------- = direct
@pytest.mark.parametrize(
    ("local", "rounding", "partition"),
    [
        (LocalSteps(), "greedy", False),
        (LocalSteps(steps=3, gradient="sampled", samples=3), "pipage", False),
        (LocalSteps(steps=2), "pipage", True),
    ],
)
def test_plain_fedcg_gives_the_direct_engines_x_and_set(local, rounding, partition) -> None:
    obj = _objective()
    groups = np.arange(M) % 4
    matroid = PartitionMatroid(groups, 1) if partition else UniformMatroid(M, 3)
    server = FedCGServer(N, matroid, 4, 0.0, local, 1.0, seed=7, rounding=rounding)
    direct = run_fedcg_direct(obj, server)
    strategy = FedCGStrategy(
        k=1 if partition else 3,
        groups=groups if partition else None,
        local=local,
        rounding=rounding,
        seed=7,
    )
    result = strategy.start(_grid(_user_app(obj)), num_rounds=4)
    np.testing.assert_array_equal(result.arrays["x"].numpy(), server.x)  # bit-identical
    assert result.arrays["selected"].numpy().tolist() == direct
    assert [row["bad-replies"] for row in strategy.history] == [0] * 4
    # the Result carries the objective of the final set, as FedAvg's carries its evaluation
    rows = obj.values.toarray()
    assert list(result.evaluate_metrics_clientapp) == [4]
    final = result.evaluate_metrics_clientapp[4]
    assert final["objective"] == pytest.approx(rows[:, direct].max(axis=1).mean())
    assert final["nodes"] == N and strategy.history[-1]["objective"] == final["objective"]


def test_fedcg_without_an_evaluate_handler_stops_before_round_1() -> None:
    obj = _objective()
    rows = obj.values.toarray()
    app = add_fedcg_handlers(
        ClientApp(), lambda c: ScoreTable(rows[int(c.node_config["partition-id"])]),
        evaluate=False,
    )  # fmt: skip
    grid = _grid(app)
    sent: list[str] = []
    grid.tamper = lambda msg, reply: sent.append(msg.metadata.message_type) or reply
    with pytest.raises(MissingHandlerError, match=r"before round 1: .*@app.evaluate\(\)"):
        FedCGStrategy(k=3).start(grid, num_rounds=3)
    assert set(sent) == {"evaluate"}  # no round was trained
    result = FedCGStrategy(k=3, federated_evaluation=False).start(_grid(app), num_rounds=2)
    assert result.evaluate_metrics_clientapp == {}


@pytest.mark.parametrize("general", [False, True])
def test_plain_discrete_greedy_gives_the_direct_engines_set(general) -> None:
    obj = _objective()
    server = DiscreteGreedyServer(N, UniformMatroid(M, 4), 4, 2.0, seed=4)
    direct = run_discrete_greedy_direct(obj, server)
    strategy = FedDiscreteGreedyStrategy(k=4, kappa=2.0, seed=4)
    result = strategy.start(_grid(_user_app(obj, general=general)), num_rounds=4)
    assert result.arrays["selected"].numpy().tolist() == direct
    assert [r["participants"] for r in strategy.history] == [r.participants for r in server.rounds]
    assert min(r.participants for r in server.rounds) < N  # the coins matter here


def test_plain_fedcg_with_a_general_set_function_is_seeded_and_feasible() -> None:
    obj = _objective()
    results = []
    for _ in range(2):
        strategy = FedCGStrategy(k=3, local=LocalSteps(steps=2, samples=2), seed=1)
        result = strategy.start(_grid(_user_app(obj, general=True), n=6), num_rounds=3)
        results.append(result.arrays)
    x = results[0]["x"].numpy()
    np.testing.assert_array_equal(x, results[1]["x"].numpy())
    assert x.sum() == pytest.approx(3.0) and x.max() <= 1.0
    assert len(results[0]["selected"].numpy()) == 3


def test_coverage_helper_is_a_zero_one_score_table() -> None:
    cov = Coverage([2, 5], n_elements=8)
    np.testing.assert_array_equal(cov.gains(np.array([5])), np.zeros(8))
    assert cov.value([1, 2]) == 1.0 and cov.value([1]) == 0.0
    with pytest.raises(ValueError, match="n_elements is required"):
        ScoreTable({1: 2.0})


# ---------------------------------------------------------------------------- start()
def test_fedcg_start_conventions_in_plain_mode() -> None:
    obj = _objective()
    seen: list[dict] = []
    calls: list[tuple[int, list[str]]] = []

    def evaluate_fn(server_round, arrays):
        calls.append((server_round, sorted(arrays)))
        return MetricRecord({"x-mass": float(arrays["x"].numpy().sum())}) if len(arrays) else None

    strategy = FedCGStrategy(k=3, eta=0.2, fraction_train=0.5, seed=2)
    x0 = np.zeros(M)
    x0[:3] = 0.1  # in (1 − η·T)·P = 0.4·P
    result = strategy.start(
        _grid(_user_app(obj, seen=seen)),
        initial_arrays=ArrayRecord({"x": Array(x0)}),
        num_rounds=3,
        train_config=ConfigRecord({"lr": 0.05, "note": "mine"}),
        evaluate_fn=evaluate_fn,
    )
    assert set(result.arrays) == {"x", "selected"}  # "x" round-trips
    assert result.arrays["x"].numpy().sum() == pytest.approx(0.3 + 0.2 * 3 * 3)
    assert all(c["lr"] == 0.05 and c["note"] == "mine" for c in seen)
    assert len(seen) == 3 * N // 2  # fraction_train = 0.5 of the nodes per round
    assert [row["server-round"] for row in strategy.history if row["server-round"]] == [1, 2, 3]
    assert calls == [(t, ["selected", "x"]) if t else (0, ["x"]) for t in range(4)]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3]
    with pytest.raises(InitialArraysError, match="expected none"):
        FedCGStrategy(k=3).start(
            _grid(_user_app(obj)), initial_arrays=ArrayRecord({"w": Array(x0)})
        )
    with pytest.raises(InitialArraysError, match="must lie in"):  # η·T = 1: only x0 = 0
        FedCGStrategy(k=3).start(
            _grid(_user_app(obj)), initial_arrays=ArrayRecord({"x": Array(x0)}), num_rounds=2
        )


def test_discrete_start_conventions_in_plain_mode() -> None:
    obj = _objective()
    seen: list[dict] = []
    calls: list[int] = []
    strategy = FedDiscreteGreedyStrategy(k=4, kappa=1e9, seed=0)
    result = strategy.start(
        _grid(_user_app(obj, seen=seen)),
        initial_arrays=ArrayRecord({"selected": Array(np.array([7], dtype=np.int64))}),
        num_rounds=10,  # the protocol runs k − |S₀| = 3 rounds (logged)
        train_config=ConfigRecord({"lr": 0.05}),
        evaluate_fn=lambda t, arrays: calls.append(t) or None,
    )
    selected = result.arrays["selected"].numpy().tolist()
    assert set(result.arrays) == {"selected"} and selected[0] == 7 and len(selected) == 4
    assert calls == [0, 1, 2, 3] and len(strategy.history) == 3
    rounds = [c for c in seen if "kappa" in c and "seed" in c]
    assert len(rounds) == 3 * N and all(c["lr"] == 0.05 for c in rounds)


@pytest.mark.parametrize("which", ["fedcg", "discrete"])
def test_all_replies_rejected_fails_the_run(which) -> None:
    grid = _grid(_user_app(_objective()))

    def garbage(msg, reply):
        if msg.metadata.message_type in ("train.direction", "train.discrete"):
            bad = ArrayRecord({"values": Array(np.full(M, -1.0))})
            metrics = MetricRecord({"n-elements": M, "participants": 1, "num-examples": 1})
            return Message(RecordDict({"arrays": bad, "metrics": metrics}), reply_to=msg)
        return reply

    grid.tamper = garbage
    strategy = FedCGStrategy(k=3) if which == "fedcg" else FedDiscreteGreedyStrategy(k=3)
    with pytest.raises(AllRepliesRejectedError, match="round 1: all 12 replies were rejected"):
        strategy.start(grid, num_rounds=3)


def test_a_client_with_another_ground_set_is_left_out() -> None:
    obj = _objective()
    rows = obj.values.toarray()
    app = ClientApp()

    def utility(ctx):  # node 3 holds a ground set of M - 1 elements
        pid = ctx.node_config["partition-id"]
        return ScoreTable(rows[pid][: M - 1 if pid == 3 else M])

    add_fedcg_handlers(app, utility)
    strategy = FedCGStrategy(k=3, seed=0)
    result = strategy.start(_grid(app), num_rounds=2)
    assert [row["bad-replies"] for row in strategy.history] == [1, 1]
    assert result.arrays["x"].numpy().shape == (M,)


def test_a_missing_handler_is_named_at_once() -> None:
    app = ClientApp()

    @app.train()
    def train(msg, context):  # a FedAvg-style client
        return Message(RecordDict(), reply_to=msg)

    t0 = time.monotonic()
    with pytest.raises(MissingHandlerError, match=r"before round 1: .*@app.evaluate\(\)"):
        FedCGStrategy(k=3).start(_grid(app, n=3), num_rounds=2)
    with pytest.raises(MissingHandlerError, match=r'round 1: .*@app.train\("direction"\)'):
        FedCGStrategy(k=3, federated_evaluation=False).start(_grid(app, n=3), num_rounds=2)
    with pytest.raises(MissingHandlerError, match=r'@app.train\("histogram"\)'):
        FedDiscreteGreedyStrategy(k=3).start(_grid(app, n=3))
    assert time.monotonic() - t0 < 30


def test_the_public_strategies_take_no_cohort_arguments() -> None:
    """Cohorts are the runners' FedCGCohorts / DiscreteGreedyCohorts (a server state)."""
    server = FedCGServer(N, UniformMatroid(M, 2), 2, 0.0, LocalSteps(), 0.5)
    for cls in (FedCGStrategy, FedDiscreteGreedyStrategy):
        for cohort_only in ({"cohorts": True}, {"server": server}):
            with pytest.raises(TypeError, match="unexpected keyword"):
                cls(**cohort_only)
    with pytest.raises(ValueError, match="rounding="):
        FedCGStrategy(rounding="swap")


# ---------------------------------------------------------------------------- cohort mode
SMALL = {"num-users": 40, "num-elements": 50, "k": 4, "seed": 5, "fedcg-rounds": 6}

#: results of these runs over the in-process grid, recorded before the redesign
RECORDED = [
    (
        {"algorithm": "fedcg", "clients-per-round": 0.5},
        3,
        {"selected": [8, 14, 15, 17], "multilinear": 1.5193473096274859},
    ),
    (
        {
            "algorithm": "fedcg-plus",
            "clients-per-round": 1.0,
            "fedcg-local-steps": 3,
            "fedcg-gradient": "sampled",
            "fedcg-gradient-samples": 3,
            "fedcg-rounding": "pipage",
        },
        7,
        {"selected": [8, 18, 33, 35], "multilinear": 1.410928807633321},
    ),
    (
        {"algorithm": "fed-discrete-greedy", "dgreedy-kappa": 4.0},
        5,
        {"selected": [8, 14, 24, 6], "participants-by-round": [32, 30, 31, 34]},
    ),
]


@pytest.mark.parametrize(("config", "nodes", "recorded"), RECORDED)
def test_cohort_mode_keeps_the_recorded_results(tmp_path, config, nodes, recorded) -> None:
    run_config = {**SMALL, **config, "output-dir": str(tmp_path)}
    summary = server_run(LocalGrid(nodes, run_config), AppConfig.from_run_config(run_config))
    for key, value in recorded.items():
        assert summary[key] == value, key
    direct = run_direct(AppConfig.from_run_config({**run_config, "run-name": "direct"}))
    assert summary["selected"] == direct["selected"]
    text = (Path(summary["run-folder"]) / "metrics.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines()]
    assert len(rows) == (4 if config["algorithm"] == "fed-discrete-greedy" else 6)
    assert all(row["bad-replies"] == 0 for row in rows)


def test_discrete_greedy_refuses_a_clients_per_round_it_would_ignore(tmp_path) -> None:
    """Users are sampled by κ (dgreedy-kappa): an explicit K is refused, not silently ignored
    (a rule of flower_app/settings/rules.py: refused when the config is made, before any run
    folder is opened and before Flower starts)."""
    run = {"algorithm": "fed-discrete-greedy", "clients-per-round": 0.5, "k": 3,
           "output-dir": str(tmp_path)}  # fmt: skip
    with pytest.raises(ConfigError, match="'dgreedy-kappa'.*'clients-per-round' = 0.5"):
        run_direct(AppConfig.from_run_config(run))
    assert not list(tmp_path.iterdir())  # refused before a run folder was opened
