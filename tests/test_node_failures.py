"""Node failures as the strategy loop sees them, on an in-process grid with the real ClientApp.

A node that leaves the grid's node list (Flower marks a dead SuperNode offline) has its users
skipped and recorded; a node that rejoins under a new id with the same partition takes its
place (re-discovery); Flower's "node unavailable" error, which the SuperLink sends in the dead
node's name, is attributed to that node and counted once; ``min_reply_fraction`` stops a run
that lost too many users. The deployment version (SuperNodes killed and restarted on
loopback) is ``test_deploy_failures.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Error, Message
from flwr.common.constant import ErrorCode

from flower_app import checkpoint
from flower_app.algorithms.fedcg.continuous import FedCGServer, LocalSteps
from flower_app.algorithms.fedcg.discrete_greedy import DiscreteGreedyServer
from flower_app.algorithms.fedsm.modes import FedSMParams
from flower_app.client_app import app as default_client_app
from flower_app.config import AppConfig
from flower_app.results import CHECKPOINT
from flower_app.runners.fedsubavg import load_task
from flower_app.strategies.cohort.discrete_greedy import DiscreteGreedyCohorts
from flower_app.strategies.cohort.fedcg import FedCGCohorts
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from flower_app.strategies.cohort.fedsubavg import FedSubAvgCohorts
from flower_app.strategies.errors import TooFewRepliesError
from flower_app.submodular.matroids import UniformMatroid
from tests.support.local_grid import LocalGrid
from tests.test_hostile_replies import FSA_SMALL, N_COHORT, SCENARIOS, M, _maxfl_cohort


def _strategy(k: int = 4, **kwargs) -> FedSMCohorts:
    params = FedSMParams("alg1", 0.75, 0.5)
    return FedSMCohorts(N_COHORT, UniformMatroid(M, k), k, params, seed=3, **kwargs)


def _run(grid, strategy: FedSMCohorts) -> list[dict]:
    strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=strategy.k, timeout=5)
    return [r for r in strategy.history if r["server-round"] >= 1]


def test_offline_node_is_skipped_and_a_rejoining_node_takes_its_place() -> None:
    grid = SCENARIOS["fedsm-cohort"].grid()
    victim, newcomer = grid.node_ids[1], 7777

    def on_round(row: dict) -> None:
        if row["server-round"] == 1:  # the victim goes offline
            grid.node_ids.remove(victim)
        if row["server-round"] == 2:  # ... and comes back under a new node id
            grid.contexts[newcomer] = grid.contexts[victim]
            grid.node_ids.append(newcomer)

    strategy = _strategy(on_round=on_round)
    rows = _run(grid, strategy)
    r1, r2, r3, r4 = rows
    assert "failed-nodes" not in r1
    assert [f["node-id"] for f in r2["failed-nodes"]] == [victim]
    assert "offline" in r2["failed-nodes"][0]["reason"]
    assert r2["users-missing"] == r2["failed-nodes"][0]["users"] > 0
    assert r2["bad-replies"] == 0  # nothing was sent to it: skipped, not a bad reply
    assert r2["users"] + r2["users-missing"] == r1["users"]
    assert "failed-nodes" not in r3 and "failed-nodes" not in r4
    assert newcomer in [int(n) for n in strategy.cohorts.node_ids]
    assert victim not in [int(n) for n in strategy.cohorts.node_ids]
    assert r3["users"] == r4["users"] == r1["users"]
    summary = strategy.failure_summary()
    assert summary["degraded"] and summary["rounds-degraded"] == [2]
    assert summary["nodes-failed"] == [victim]
    assert summary["users-missing"] == r2["users-missing"]


def test_node_return_wait_holds_the_round_until_the_node_is_back() -> None:
    """``node-return-wait``: the round after a node left waits for it (the same node id, as
    a SuperNode restarted with its key), so nothing is lost; a node that stays away is
    skipped once the wait is over, as without it."""
    grid = SCENARIOS["fedsm-cohort"].grid()
    victim = grid.node_ids[1]
    looks = []
    real_ids = grid.get_node_ids

    def get_node_ids():  # the victim is listed again on the third look after it left
        ids = real_ids()
        if victim not in ids:
            looks.append(1)
            if len(looks) == 3:
                grid.node_ids.append(victim)
                ids = real_ids()
        return ids

    grid.get_node_ids = get_node_ids

    def on_round(row: dict) -> None:
        if row["server-round"] == 1:
            grid.node_ids.remove(victim)

    strategy = _strategy(k=3, on_round=on_round, node_return_wait=60.0)
    rows = _run(grid, strategy)
    assert len(looks) == 3  # it was waited for, and came back
    assert all("failed-nodes" not in r for r in rows), rows
    assert not strategy.failure_summary()["degraded"]
    assert len({r["users"] for r in rows}) == 1

    grid = SCENARIOS["fedsm-cohort"].grid()
    victim = grid.node_ids[1]

    def leaves(row: dict) -> None:
        if row["server-round"] == 1:
            grid.node_ids.remove(victim)

    # it never comes back: skipped after the wait
    strategy = _strategy(k=3, on_round=leaves, node_return_wait=0.2)
    rows = _run(grid, strategy)
    assert [f["node-id"] for f in rows[1]["failed-nodes"]] == [victim]
    assert "offline" in rows[1]["failed-nodes"][0]["reason"]


def test_node_unavailable_error_from_the_superlink_counts_once_for_the_node() -> None:
    grid = SCENARIOS["fedsm-cohort"].grid()
    victim = grid.node_ids[0]

    def tamper(msg: Message, reply: Message) -> Message:
        if msg.metadata.dst_node_id != victim or msg.metadata.message_type != "train":
            return reply
        error = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Node Unavailable"),
                        reply_to=msg)  # fmt: skip
        error.metadata.__dict__["_src_node_id"] = 1  # Flower: sent by the SuperLink
        return error

    grid.tamper = tamper
    rows = _run(grid, _strategy(k=2))
    for row in rows:
        assert row["bad-replies"] == 1  # was 2: "unexpected sender" + "missing"
        assert [f["node-id"] for f in row["failed-nodes"]] == [victim]
        assert row["failed-nodes"][0]["reason"].startswith("node unavailable")


def test_a_round_below_min_reply_fraction_stops_the_run_with_the_reason() -> None:
    grid = SCENARIOS["fedsm-cohort"].grid()
    victim = grid.node_ids[2]

    def tamper(msg: Message, reply: Message) -> Message | None:
        lost = msg.metadata.dst_node_id == victim and msg.metadata.message_type == "train"
        return None if lost else reply

    grid.tamper = tamper
    with pytest.raises(TooFewRepliesError, match=r"below min_reply_fraction=0\.9.*no reply"):
        _run(grid, _strategy(k=2, min_reply_fraction=0.9))
    # the same losses are accepted (and recorded) under the default fraction 0
    rows = _run(SCENARIOS["fedsm-cohort"].grid(), _strategy(k=2))
    assert all("failed-nodes" not in r for r in rows)


def test_fedsm_resumed_from_a_checkpoint_ends_as_the_uninterrupted_run() -> None:
    """Resume after round 2 (checkpoint stored as the run folder stores it): same S, same
    rows, and rounds 1-2 are not sent again."""
    saved: list[bytes] = []
    whole = _strategy(k=5, checkpoint_fn=lambda payload: saved.append(checkpoint.dumps(payload)))
    rows = _run(SCENARIOS["fedsm-cohort"].grid(), whole)
    assert len(saved) == 5

    grid = SCENARIOS["fedsm-cohort"].grid()
    sent_rounds: list[str] = []
    app = grid.app
    grid.app = lambda msg, ctx: (sent_rounds.append(msg.metadata.group_id), app(msg, ctx))[1]
    resumed = _strategy(k=5)
    resumed.resume_from(checkpoint.loads(saved[1]))
    again = _run(grid, resumed)
    assert resumed.run.selected == whole.run.selected
    drop = ("round-time", "wall-time")
    assert [{k: v for k, v in r.items() if k not in drop} for r in again] == [
        {k: v for k, v in r.items() if k not in drop} for r in rows
    ]
    assert {g for g in sent_rounds if g.isdigit()} == {"3", "4", "5"}


def test_maxfl_resumed_from_a_checkpoint_ends_with_the_uninterrupted_model() -> None:
    """MaxFL (cohort mode): resume after round 2 of 4 gives the same weights, bit for bit."""
    sc = SCENARIOS["maxfl-cohort"]
    saved: list[bytes] = []
    whole = _maxfl_cohort(checkpoint_fn=lambda payload: saved.append(checkpoint.dumps(payload)))
    whole.start(grid=sc.grid(), **{**sc.start(), "num_rounds": 4})
    # restarted nodes: fresh contexts (no client state survives), the same ClientApp
    fresh = LocalGrid(sc.num_nodes, sc.run_config, app=sc.app() or default_client_app,
                      node_config=sc.node_config)  # fmt: skip
    resumed = sc.make_strategy()
    resumed.resume_from(checkpoint.loads(saved[1]))
    resumed.start(grid=fresh, **{**sc.start(), "num_rounds": 4})
    assert len(resumed.history) == len(whole.history)
    for a, b in zip(resumed.server.weights, whole.server.weights, strict=True):
        assert np.array_equal(a, b)


def test_fedcg_resumed_from_a_checkpoint_ends_with_the_uninterrupted_x() -> None:
    """FedCG (cohort mode): resume after round 2 of 5 on fresh nodes gives the same x and set."""
    sc = SCENARIOS["fedcg-cohort"]

    def make(rounds: int = 5, **options) -> FedCGCohorts:
        matroid = UniformMatroid(M, 2)
        server = FedCGServer(N_COHORT, matroid, rounds, 0.0, LocalSteps(), 0.5, seed=0)
        return FedCGCohorts(server, **options)

    saved: list[bytes] = []
    whole = make(checkpoint_fn=lambda payload: saved.append(checkpoint.dumps(payload)))
    whole.start(grid=sc.grid(), initial_arrays=ArrayRecord(), num_rounds=5, timeout=5)
    assert len(saved) == 5
    resumed = make()
    resumed.resume_from(checkpoint.loads(saved[1]))
    resumed.start(grid=sc.grid(), initial_arrays=ArrayRecord(), num_rounds=5, timeout=5)
    assert [r["server-round"] for r in resumed.history if r["server-round"] >= 1] == [1, 2, 3, 4, 5]
    assert np.array_equal(resumed.server.x, whole.server.x)
    assert resumed.selected == whole.selected and whole.selected is not None
    other = make(rounds=7)
    other.resume_from(checkpoint.loads(saved[1]))
    with pytest.raises(ValueError, match="does not match"):
        other.start(grid=sc.grid(), initial_arrays=ArrayRecord(), num_rounds=7, timeout=5)


def test_discrete_greedy_resumed_from_a_checkpoint_ends_with_the_uninterrupted_set() -> None:
    """Discrete greedy (cohort mode): fresh nodes redo Algs. 4/5, then S continues."""
    sc = SCENARIOS["discrete-cohort"]

    def make(**options) -> DiscreteGreedyCohorts:
        server = DiscreteGreedyServer(N_COHORT, UniformMatroid(M, 4), 4, 5.0, seed=1)
        return DiscreteGreedyCohorts(server, **options)

    saved: list[bytes] = []
    whole = make(checkpoint_fn=lambda payload: saved.append(checkpoint.dumps(payload)))
    whole.start(grid=sc.grid(), initial_arrays=ArrayRecord(), num_rounds=4, timeout=5)
    assert len(saved) == 4 and len(whole.server.selected) == 4
    resumed = make()
    resumed.resume_from(checkpoint.loads(saved[1]))
    resumed.start(grid=sc.grid(), initial_arrays=ArrayRecord(), num_rounds=4, timeout=5)
    assert resumed.server.selected == whole.server.selected
    assert [r["server-round"] for r in resumed.history if r["server-round"] >= 1] == [1, 2, 3, 4]


@pytest.mark.parametrize("algorithm", ["fedsubavg", "fedadam-sub"])
def test_fedsubavg_resumed_from_a_checkpoint_ends_with_the_uninterrupted_x(algorithm) -> None:
    """FedSubAvg family (cohort mode): x, the server step's state (Adam moments) and the
    sampler survive; resume after round 2 of 4 on fresh nodes gives the same x."""
    sc = SCENARIOS["fedsubavg-cohort"]
    cfg = AppConfig.from_run_config({**FSA_SMALL, "algorithm": algorithm})
    task = load_task(cfg)

    def make(**options) -> FedSubAvgCohorts:
        return FedSubAvgCohorts(algorithm, task.n_clients, task.n_params,
                                cfg.clients_per_round, seed=cfg.seed, **options)  # fmt: skip

    run_config = {**FSA_SMALL, "algorithm": algorithm}
    grid = LocalGrid(sc.num_nodes, run_config, app=default_client_app, node_config=sc.node_config)
    saved: list[bytes] = []
    whole = make(checkpoint_fn=lambda payload: saved.append(checkpoint.dumps(payload)))
    whole.start(grid=grid, num_rounds=4, timeout=5)
    assert len(saved) == 4
    fresh = LocalGrid(sc.num_nodes, run_config, app=default_client_app, node_config=sc.node_config)
    resumed = make()
    resumed.resume_from(checkpoint.loads(saved[1]))
    resumed.start(grid=fresh, num_rounds=4, timeout=5)
    assert np.array_equal(resumed.x, whole.x) and np.abs(whole.x).max() > 0
    assert [r["server-round"] for r in resumed.history if r["server-round"] >= 1] == [1, 2, 3, 4]


class _Crash(BaseException):
    """The ServerApp process dies (SIGKILL): nothing after this line of the run happens."""


class _CrashingGrid(LocalGrid):
    """A grid whose ServerApp "dies" when it sends its ``round``-th train exchange."""

    def __init__(self, num_nodes: int, run_config: dict, round_: int) -> None:
        super().__init__(num_nodes, run_config)
        self.round, self.trains = round_, 0

    def push_messages(self, messages):
        messages = list(messages)
        if any(m.metadata.message_type.split(".")[0] == "train" for m in messages):
            self.trains += 1
            if self.trains == self.round:
                raise _Crash
        return super().push_messages(messages)


REMOTE_RESUME = {
    "fedsm": {"algorithm": "fedsm", "num-users": 40, "num-elements": 30, "k": 5,
              "clients-per-round": 0.5, "elements-per-client": 0.5, "seed": 4},
    "fedcg": {"algorithm": "fedcg", "num-users": 40, "num-elements": 30, "k": 3,
              "fedcg-rounds": 5, "clients-per-round": 0.5, "seed": 4},
    "fedsubavg": {**FSA_SMALL, "fsa-rounds": 5},
}  # fmt: skip


def _whole_then_crashed(base: dict, crashing_grid) -> tuple:
    """Run ``base`` uninterrupted ("whole") on 3 in-process nodes, then again ("crashed") on
    ``crashing_grid(nodes, cfg)``, which must end in :class:`_Crash` before a summary is
    written; return (runner, nodes, whole summary, the crashed run's config, its folder)."""
    from flower_app.registry import load_runner

    runner = load_runner(base["algorithm"])
    nodes = 3
    whole = runner.server_run(
        LocalGrid(nodes, {**base, "run-name": "whole"}),
        AppConfig.from_run_config({**base, "run-name": "whole"}),
    )
    cfg = {**base, "run-name": "crashed"}
    with pytest.raises(_Crash):
        runner.server_run(crashing_grid(nodes, cfg), AppConfig.from_run_config(cfg))
    folder = Path(base["output-dir"]) / "crashed"
    assert not (folder / "summary.json").exists()
    return runner, nodes, whole, cfg, folder


@pytest.mark.parametrize("family", sorted(REMOTE_RESUME))
def test_server_data_none_run_resumes_after_the_serverapp_died(tmp_path, family) -> None:
    """``server-data = 'none'`` + ``resume = true`` through the runner (what the ServerApp
    runs): the ServerApp dies while sending round 3; the resumed run redoes no finished round
    and ends as the uninterrupted one. The checkpoint holds the nodes' n, m (and λ), no
    client data; nodes that report another instance are refused."""
    from flower_app.results import ResumeError

    base = {**REMOTE_RESUME[family], "server-data": "none", "output-dir": str(tmp_path)}
    runner, nodes, whole, cfg, folder = _whole_then_crashed(
        base, lambda nodes, cfg: _CrashingGrid(nodes, cfg, 3)
    )
    saved = checkpoint.read_checkpoint(folder / CHECKPOINT)
    assert saved["server-round"] == 2
    assert saved["remote-problem"]["n_users"] == base["num-users"]
    grid = _CrashingGrid(nodes, {**cfg, "resume": True}, 4)  # 3 rounds left: no crash
    resumed = runner.server_run(grid, AppConfig.from_run_config({**cfg, "resume": True}))
    assert resumed["resumed-from-round"] == 2
    assert grid.trains == 3  # rounds 3-5 only: the finished rounds are not redone
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["server-round"] for r in rows if r["server-round"] >= 1] == [1, 2, 3, 4, 5]
    for key in ("selected", "objective", "train-loss", "test-loss", "initial-train-loss"):
        if key in whole:
            assert resumed[key] == pytest.approx(whole[key], rel=1e-12), key
    # nodes holding another instance: refused before any round, naming both
    other = {**cfg, "resume": True, "num-users": base["num-users"] + 2}
    with pytest.raises((ResumeError, ValueError), match="differs|now report"):
        runner.server_run(LocalGrid(nodes, other), AppConfig.from_run_config(other))


class _CrashAfterRound(LocalGrid):
    """A grid whose ServerApp "dies" at its first train exchange after the run folder holds
    the checkpoint of round ``round_`` (setup exchanges, e.g. discrete greedy's, pass)."""

    def __init__(self, num_nodes: int, run_config: dict, round_: int) -> None:
        super().__init__(num_nodes, run_config)
        self.round = round_
        self.checkpoint = Path(run_config["output-dir"]) / run_config["run-name"] / CHECKPOINT

    def push_messages(self, messages):
        messages = list(messages)
        train = any(m.metadata.message_type.split(".")[0] == "train" for m in messages)
        saved = train and self.checkpoint.exists() and checkpoint.read_checkpoint(self.checkpoint)
        if saved and saved["server-round"] >= self.round:
            raise _Crash
        return super().push_messages(messages)


#: the families (the server holding its data) whose resume ``test_resume.py`` ran each with
#: a real SuperLink killed (two to three ``flwr run`` each, 2-4 min in CI): the ServerApp
#: dies at its first train exchange after round 2
FULL_RESUME = {
    "fedcg": {"algorithm": "fedcg", "num-users": 40, "num-elements": 30, "k": 3,
              "fedcg-rounds": 5, "clients-per-round": 0.5, "seed": 2},
    "fed-discrete-greedy": {"algorithm": "fed-discrete-greedy", "num-users": 40,
                            "num-elements": 30, "k": 4, "dgreedy-kappa": 5.0, "seed": 2},
    "fedadam-sub": {**FSA_SMALL, "algorithm": "fedadam-sub", "fsa-rounds": 4},
    "maxfl": {"algorithm": "maxfl", "dataset": "synthetic-emnist", "num-users": 8,
              "clients-per-round": 4, "maxfl-rounds": 4, "maxfl-eval-every": 4,
              "maxfl-solo-steps": 2, "maxfl-local-steps": 2, "seed": 5},
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(FULL_RESUME))
def test_a_run_resumes_after_the_serverapp_died(tmp_path, family) -> None:
    """``resume = true`` through the runner (what the ServerApp runs), the server holding its
    data: the ServerApp dies after round 2; the resumed run redoes no finished round and
    ends as the uninterrupted one (S; x and the Adam moments; the model bit for bit). The
    in-process side of what ``test_resume.py`` checks with a real SuperLink killed."""
    base = {**FULL_RESUME[family], "output-dir": str(tmp_path)}
    runner, nodes, whole, cfg, folder = _whole_then_crashed(
        base, lambda nodes, cfg: _CrashAfterRound(nodes, cfg, 2)
    )
    again = {**cfg, "resume": True}
    resumed = runner.server_run(LocalGrid(nodes, again), AppConfig.from_run_config(again))
    assert resumed["resumed-from-round"] == 2

    def rounds(run: str) -> list[int]:
        rows = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [r["server-round"] for r in map(json.loads, rows) if r["server-round"] >= 1]

    assert rounds("crashed") == rounds("whole")  # each round once
    compared = [k for k in ("selected", "objective", "multilinear", "train-loss", "test-loss",
                            "test-accuracy", "model-digest") if k in whole]  # fmt: skip
    assert compared, sorted(whole)
    for key in compared:
        assert resumed[key] == whole[key], key
