"""MaxFL over Flower: bad replies are left out, ρ_k persists in context.state, the Flower
paths (in-process grid, `flwr run` on Ray) give the direct engine's model (MaxFL, SCAFFOLD,
MW-Fed), and Byzantine clients (Table 4) get small q_k under MaxFL, large λ_k under MW-Fed."""

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
from maxfl_configs import SMALL

from direct import run_direct
from direct.maxfl import DirectTransport, run_protocol
from flower_app.algorithms.maxfl.appeal import AppealServer, TrainOutcome
from flower_app.algorithms.maxfl.participation import ParticipationSampler
from flower_app.clients.learning import DictState, byzantine_clients
from flower_app.config import AppConfig, ConfigError
from flower_app.runners import maxfl as runner
from flower_app.strategies.cohort.maxfl import MaxFLCohorts
from flower_app.strategies.discovery import CohortMap
from tests.support.local_grid import LocalGrid


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
@pytest.mark.parametrize("algorithm", ["maxfl", "scaffold", "perfedavg", "pfedme"])
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


def _rows(folder) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def test_mwfed_in_process_flower_grid_equals_direct_engine(tmp_path) -> None:
    """MW-Fed's weights, shares and local steps travel per node and agree across engines."""
    extra = {
        "algorithm": "mwfed",
        "maxfl-participation": "all",
        "maxfl-byzantine": 0.34,  # 2 of 6 seen clients: their λ_k grows every time
        "maxfl-solo-steps": 1,  # easy requirements, so honest clients are met at times
        "maxfl-rounds": 4,
    }
    direct = run_direct(_cfg(tmp_path, "direct", **extra))
    flower = runner.server_run(LocalGrid(5, {**SMALL, **extra}), _cfg(tmp_path, "grid", **extra))
    assert flower["model-digest"] == direct["model-digest"]
    assert flower["final"] == pytest.approx(direct["final"], rel=1e-9, abs=1e-12)
    keys = ("sampled", "users", "server-step", "mw-unmet", "mw-share-max", "mw-weight-max")
    got, want = _rows(tmp_path / "grid"), _rows(tmp_path / "direct")
    assert [[r.get(k) for k in keys] for r in got] == [[r.get(k) for k in keys] for r in want]
    assert all(r["bad-replies"] == 0 for r in got[1:])
    # the weights moved, and some round sent unequal shares (so more steps to someone)
    assert got[-1]["mw-weight-max"] > 1.0
    assert any(r["mw-share-max"] > 1.0 for r in got[1:])


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
def _strategy(algorithm: str = "maxfl") -> MaxFLCohorts:
    weights = [np.zeros((2, 3), np.float32), np.zeros(2, np.float32)]
    server = AppealServer(algorithm, weights, n_seen=4)
    strategy = MaxFLCohorts(server, ParticipationSampler(4, 2), n_clients=4)
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


def test_mwfed_reply_without_valid_met_flags_is_rejected() -> None:
    strategy = _strategy("mwfed")
    strategy.server.user_config(np.array([0, 1]))
    msgs = list(
        strategy.configure_train(
            1,
            ArrayRecord(strategy.server.weights),
            ConfigRecord({"users": [0, 1], "mw-share": [0.5, 1.5]}),
            None,
        )
    )
    # each node gets its own client's share
    shares = {int(m.metadata.dst_node_id): m.content["config"]["mw-share"] for m in msgs}
    assert shares == {11: [0.5], 12: [1.5]}
    arrays = [np.zeros((2, 3)), np.zeros(2)]
    good = _reply(msgs[0], arrays, [0], [0.0])
    good.content.metric_records["metrics"]["met"] = [1]
    missing = _reply(msgs[1], arrays, [1], [0.0])  # no 'met'
    outcome = strategy.collect_train(1, [good, missing])
    assert outcome.bad_replies == 1 and outcome.ids == [0] and outcome.met == [True]
    bad = _reply(msgs[1], arrays, [1], [0.0])
    bad.content.metric_records["metrics"]["met"] = [2]
    outcome = strategy.collect_train(1, [good, bad])
    assert outcome.bad_replies == 1 and outcome.ids == [0]


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
        ({"algorithm": "mwfed", "maxfl-mw-eta": 0.0}, "'maxfl-mw-eta' = 0.0: must be > 0"),
        ({"algorithm": "mwfed", "maxfl-mw-eta": -0.5}, "'maxfl-mw-eta' = -0.5: must be > 0"),
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


# ------------------------------------------------------------------ Byzantine clients (Table 4)
BYZANTINE = {
    "dataset": "synthetic-emnist",
    "num-users": 10,
    "clients-per-round": 5,
    "maxfl-rounds": 6,
    "maxfl-eval-every": 6,
    "maxfl-solo-steps": 1,
    "maxfl-local-steps": 10,
    "maxfl-participation": "all",
    "maxfl-byzantine": 0.2,
    "maxfl-tune-steps": 0,
    "seed": 0,
}


class _RecordingTransport(DirectTransport):
    """The direct engine's transport, keeping every round's TrainOutcome."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.outcomes: list[TrainOutcome] = []

    def train(self, *args, **kwargs) -> TrainOutcome:
        outcome = super().train(*args, **kwargs)
        self.outcomes.append(outcome)
        return outcome


def _byzantine_run(algorithm: str):
    s = runner.settings(AppConfig.from_run_config({**BYZANTINE, "algorithm": algorithm}))
    server, sampler = runner._server(s)
    client = runner._client(s, 0, s.n_clients, DictState(), 0, 1)
    transport = _RecordingTransport(client, algorithm)
    rows = run_protocol(server, sampler, transport, s.rounds, eval_every=s.eval_every)
    byz = set(byzantine_clients(s.n_seen, s.byzantine, s.seed).tolist())
    assert len(byz) == 2  # 20 % of 10 seen clients
    assert all(np.all(np.isfinite(w)) for w in server.weights)
    assert rows[-1]["server-round"] == s.rounds and np.isfinite(rows[-1]["seen-acc"])
    return server, transport.outcomes, byz


def test_maxfl_gives_byzantine_clients_small_weights() -> None:
    """An inflated loss means a large gap, hence q_k = σ'(gap) ≈ 0 (paper, Appendix D.2)."""
    _, outcomes, byz = _byzantine_run("maxfl")
    q_byz = [q for o in outcomes for u, q in zip(o.ids, o.q, strict=True) if u in byz]
    q_honest = [q for o in outcomes for u, q in zip(o.ids, o.q, strict=True) if u not in byz]
    assert q_byz and q_honest  # both kinds were sampled
    assert np.mean(q_byz) < 0.1 * np.mean(q_honest)
    assert max(q_byz) < 1e-3  # σ'(≥ 10) ≈ 4.5e-5


def test_mwfed_gives_byzantine_clients_large_weights() -> None:
    """The same lie raises a client's MW-Fed weight: it is never 'met' (the paper's point)."""
    server, outcomes, byz = _byzantine_run("mwfed")
    met_byz = [m for o in outcomes for u, m in zip(o.ids, o.met, strict=True) if u in byz]
    met_honest = [m for o in outcomes for u, m in zip(o.ids, o.met, strict=True) if u not in byz]
    assert met_byz and not any(met_byz)  # every Byzantine report is "unmet"
    assert any(met_honest)
    lam = server.mw_weights
    honest = [k for k in range(len(lam)) if k not in byz]
    assert np.mean(lam[sorted(byz)]) > np.mean(lam[honest])


# ------------------------------------------------------------------ opt-in pool reuse
class _CountingTransport(DirectTransport):
    """The direct engine's transport, counting the opt-in requests per round."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.appeal_rounds: list[int] = []

    def appeal(self, server_round, users, weights):
        self.appeal_rounds.append(server_round)
        return super().appeal(server_round, users, weights)


def _counted_run(cfg: dict):
    """Run ``cfg`` on the direct engine's protocol, counting the opt-in requests."""
    s = runner.settings(AppConfig.from_run_config(cfg))
    server, sampler = runner._server(s)
    client = runner._client(s, 0, s.n_clients, DictState(), 0, 1)
    transport = _CountingTransport(client, s.algorithm)
    rows = run_protocol(server, sampler, transport, s.rounds, eval_every=s.eval_every)
    return s, server, transport, rows


def test_unchanged_model_reuses_the_opt_in_pool() -> None:
    """After a round without training the pool is not asked for again (F_k(w) is fixed).

    Solo models of 100 steps against one mandatory round of one local step: no client
    finds the global model appealing, the pool empties at round 2 and stays empty; the
    clients are asked once, not once per round.
    """
    cfg = {
        **BYZANTINE,
        "maxfl-byzantine": 0.0,
        "maxfl-participation": "flexible",
        "maxfl-mandatory-rounds": 1,
        "maxfl-local-steps": 1,
        "maxfl-solo-steps": 100,
        "maxfl-requirement": "heldout",
        "algorithm": "maxfl",
    }
    s, server, transport, rows = _counted_run(cfg)
    assert [r["pool-size"] for r in rows[2:]] == [0] * (s.rounds - 1)
    assert transport.appeal_rounds == [2]
    # the reused answer is the one the clients give for the final (unchanged) model
    assert transport.appeal(0, np.arange(s.n_seen), server.weights).size == 0


def test_changed_model_asks_for_the_pool_again() -> None:
    """Every round that trained is followed by a fresh opt-in request."""
    cfg = {
        **BYZANTINE,
        "maxfl-byzantine": 0.0,
        "maxfl-participation": "flexible",
        "maxfl-mandatory-rounds": 1,
        "algorithm": "fedavg",
    }
    s, _, transport, rows = _counted_run(cfg)
    expected: list[int] = []
    for t in range(2, s.rounds + 1):
        if not expected or any(rows[u]["server-step"] > 0 for u in range(expected[-1], t)):
            expected.append(t)
    assert len(expected) > 1  # the model moved, so the clients were asked again
    assert transport.appeal_rounds == expected
