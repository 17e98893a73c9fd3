"""MaxFL over Flower: bad replies are left out, ρ_k persists in context.state, and the
Flower paths (in-process grid, `flwr run` on Ray) give the direct engine's model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.supercore.task_identity import TaskIdentity
from local_grid import LocalGrid

from flower_app.algorithms.appeal import AppealServer
from flower_app.algorithms.participation import ParticipationSampler
from flower_app.config import AppConfig, ConfigError
from flower_app.experiment import run_direct
from flower_app.runners import maxfl as runner
from flower_app.strategies.discovery import CohortMap
from flower_app.strategies.maxfl import AppealStrategy

SMALL = {
    "algorithm": "maxfl",
    "dataset": "synthetic-emnist",
    "num-users": 6,
    "clients-per-round": 3,
    "maxfl-rounds": 3,
    "maxfl-eval-every": 1,
    "maxfl-mandatory-rounds": 1,
    "maxfl-solo-steps": 20,
    "maxfl-local-steps": 5,
    "seed": 4,
}


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 1
    TaskIdentity.task_id = 1


def _cfg(tmp_path, name: str, **extra) -> AppConfig:
    return AppConfig.from_run_config(
        {**SMALL, **extra, "output-dir": str(tmp_path), "run-name": name}
    )


def _model(folder) -> list[np.ndarray]:
    with np.load(folder / "model.npz") as z:
        return [z[k] for k in sorted(z.files, key=lambda s: int(s.split("_")[1]))]


# ------------------------------------------------------------------ engines agree
@pytest.mark.parametrize("algorithm", ["maxfl", "scaffold"])
def test_in_process_flower_grid_equals_direct_engine(tmp_path, algorithm) -> None:
    direct = run_direct(_cfg(tmp_path, "direct", algorithm=algorithm))
    cfg = _cfg(tmp_path, "grid", algorithm=algorithm)
    flower = runner.server_run(LocalGrid(5, {**SMALL, "algorithm": algorithm}), cfg)
    assert flower["model-digest"] == direct["model-digest"]
    assert flower["final"] == pytest.approx(direct["final"], rel=1e-9, abs=1e-12)
    rows = [
        json.loads(x) for x in (tmp_path / "grid" / "metrics.jsonl").read_text().split("\n")[:-1]
    ]
    assert [r["server-round"] for r in rows] == [0, 1, 2, 3]
    assert all(r["bad-replies"] == 0 for r in rows[1:])
    assert rows[2]["pool-size"] <= 6  # flexible participation after round 1


def test_direct_engine_is_reproducible_and_seed_sensitive(tmp_path) -> None:
    a = run_direct(_cfg(tmp_path, "a"))
    b = run_direct(_cfg(tmp_path, "b"))
    c = run_direct(_cfg(tmp_path, "c", seed=5))
    assert a["model-digest"] == b["model-digest"] != c["model-digest"]


@pytest.mark.flwr
def test_flwr_run_equals_direct_engine(flower_cli, tmp_path) -> None:
    run = flower_cli.run(SMALL, num_supernodes=4)
    assert run.status == "finished:completed", run.output + run.details
    direct = run_direct(_cfg(tmp_path, "direct"))
    assert run.summary["model-digest"] == direct["model-digest"]
    assert run.summary["final"] == pytest.approx(direct["final"], rel=1e-9, abs=1e-12)
    for a, b in zip(_model(run.folder), _model(tmp_path / "direct"), strict=True):
        np.testing.assert_array_equal(a, b)
    assert "seen GM-Appeal" in run.output


# ------------------------------------------------------------------ bad input
def _strategy(algorithm: str = "maxfl") -> AppealStrategy:
    weights = [np.zeros((2, 3), np.float32), np.zeros(2, np.float32)]
    server = AppealServer(algorithm, weights, n_seen=4)
    strategy = AppealStrategy(server, ParticipationSampler(4, 2), n_clients=4, num_rounds=1)
    strategy.cohorts = CohortMap(
        np.array([11, 12, 13, 14], dtype=object),
        np.arange(4, dtype=np.int64),
        np.ones(4, dtype=np.int64),
    )
    return strategy


def _reply(msg: Message, arrays, users, q, loss=None) -> Message:
    metrics = MetricRecord(
        {
            "num-examples": len(users),
            "users": users,
            "q": q,
            "loss": loss if loss is not None else [1.0] * len(users),
            "h-sum": 0.0,
        }
    )
    return Message(RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics}), reply_to=msg)


def test_bad_train_replies_are_counted_and_left_out() -> None:
    strategy = _strategy()
    users = ConfigRecord({"users": [0, 1, 2, 3]})
    msgs = {
        int(m.metadata.dst_node_id): m
        for m in strategy.configure_train(1, ArrayRecord(strategy.server.weights), users, None)
    }
    good = [np.full((2, 3), 0.5), np.full(2, 0.5)]
    replies = [
        _reply(msgs[11], good, [0], [0.25]),  # valid
        _reply(msgs[12], [np.full((2, 3), np.nan), np.zeros(2)], [1], [0.2]),  # NaN Δw
        _reply(msgs[13], good, [2], [float("nan")]),  # NaN q
        _reply(msgs[14], [np.zeros((3, 2)), np.zeros(2)], [3], [0.1]),  # wrong shape
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert metrics["bad-replies"] == 3 and metrics["users"] == 1
    # only node 11: w = 0 − 1/(0.25 + 0.001) · 0.5
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[1], -0.5 / 0.251, rtol=1e-6)


@pytest.mark.parametrize(
    "bad",
    [
        {"q": [0.3]},  # q_k > 1/4 is impossible
        {"q": [-0.01]},
        {"users": [2]},  # answers for another client than it was sent
        {"loss": [float("inf")]},
        {"arrays": [np.zeros((2, 3))]},  # an array missing
        {"arrays": [np.zeros((2, 3), np.int64), np.zeros(2)]},  # not floats
    ],
)
def test_each_kind_of_bad_reply_is_rejected(bad) -> None:
    strategy = _strategy()
    msgs = strategy.configure_train(
        1, ArrayRecord(strategy.server.weights), ConfigRecord({"users": [0]}), None
    )
    kwargs = {"arrays": [np.zeros((2, 3)), np.zeros(2)], "users": [0], "q": [0.1], **bad}
    reply = _reply(msgs[0], kwargs["arrays"], kwargs["users"], kwargs["q"], kwargs.get("loss"))
    outcome = strategy.collect_train(1, [reply])
    assert outcome.bad_replies == 1 and outcome.sums is None
    arrays, _ = strategy.aggregate_train(1, [reply])
    assert arrays is None  # no valid reply: no step, the model stays


def test_error_reply_and_missing_node_are_counted() -> None:
    strategy = _strategy()
    msgs = list(
        strategy.configure_train(
            1, ArrayRecord(strategy.server.weights), ConfigRecord({"users": [0, 1]}), None
        )
    )
    err = Message(Error(code=2, reason="boom"), reply_to=msgs[0])
    outcome = strategy.collect_train(1, [err])  # node of client 1 never answered
    assert outcome.bad_replies == 2 and outcome.users == 0


def test_invalid_family_config_names_the_key() -> None:
    for override, match in [
        ({"maxfl-eps": 0.0}, "'maxfl-eps' = 0.0: must be > 0"),
        ({"maxfl-requirement": "test"}, "'maxfl-requirement'"),
        ({"clients-per-round": 50, "num-users": 10}, "exceeds the 10 seen clients"),
        ({"maxfl-partition": "shards"}, "'maxfl-partition'"),
    ]:
        with pytest.raises(ConfigError, match=match):
            runner.settings(AppConfig.from_run_config({**SMALL, **override}))


# ------------------------------------------------------------------ persistent ρ_k
def test_rho_is_computed_once_and_kept_in_context_state(monkeypatch) -> None:
    import flower_app.clients.learning as learning

    calls = []
    real = learning.solo_requirement

    def counting(*args, **kwargs):
        calls.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(learning, "solo_requirement", counting)
    grid = LocalGrid(2, SMALL)
    ctx = grid.contexts[1000]
    client = runner.make_client(AppConfig.from_run_config(SMALL), ctx)
    weights = runner._init(runner.settings(AppConfig.from_run_config(SMALL)))
    client.evaluate(weights, {"kind": "appeal", "users": [0, 1]})
    assert "maxfl-solo" in ctx.state and sorted(calls) == [0, 1]
    # a new client object on the same node (as for every message) reads ρ from the state
    again = runner.make_client(AppConfig.from_run_config(SMALL), ctx)
    again.fit(weights, {"server-round": 1, "users": [0, 1], "algorithm": "maxfl"})
    assert sorted(calls) == [0, 1]
    rho = again.solo(0)
    assert np.isfinite(rho.rho_train) and rho.rho_train < rho.rho_heldout + 5


def test_missing_rho_with_solo_training_disabled_fails_loudly() -> None:
    cfg = AppConfig.from_run_config({**SMALL, "maxfl-solo-steps": 0})
    grid = LocalGrid(1, {**SMALL, "maxfl-solo-steps": 0})
    client = runner.make_client(cfg, grid.contexts[1000])
    weights = runner._init(runner.settings(cfg))
    with pytest.raises(ValueError, match="ρ_k is missing"):
        client.fit(weights, {"server-round": 1, "users": [0], "algorithm": "maxfl"})
