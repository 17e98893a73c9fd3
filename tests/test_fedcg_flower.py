"""FedCG strategies over Flower: bad replies, state, config errors, and `flwr run` = direct."""

from __future__ import annotations

import json

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

from direct import run_direct
from flower_app.algorithms.fedcg.continuous import FedCGServer, LocalSteps, user_direction_sum
from flower_app.algorithms.fedcg.discrete_greedy import DiscreteGreedyServer
from flower_app.clients.adapter import handle_train
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.continuous import HISTOGRAM_RECORD, ContinuousClient
from flower_app.config import AppConfig, ConfigError
from flower_app.datasets.synthetic import synthetic_facility_location
from flower_app.strategies.cohort.discrete_greedy import DiscreteGreedyCohorts
from flower_app.strategies.cohort.fedcg import FedCGCohorts
from flower_app.strategies.discovery import CohortMap
from flower_app.submodular.greedy import greedy
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import FacilityLocation, MaxRowObjective

PARTS = 3


def _setup(n=90, m=40, seed=2):
    obj = FacilityLocation(synthetic_facility_location(n, m, seed=seed).values)
    matroid = UniformMatroid(m, 3)
    contexts, clients, ranges = {}, {}, []
    for p in range(PARTS):
        first, count = cohort_range(obj.n_users, p, PARTS)
        ranges.append((first, count))
        contexts[100 + p] = Context(
            run_id=1,
            node_id=100 + p,
            node_config={"partition-id": p, "num-partitions": PARTS},
            state=RecordDict(),
            run_config={},
        )
        clients[100 + p] = (MaxRowObjective(obj.values[first : first + count]), first)
    cohorts = CohortMap(
        np.array(list(clients), dtype=object),
        np.array([f for f, _ in ranges]),
        np.array([c for _, c in ranges]),
    )

    def factory(ctx: Context) -> ContinuousClient:
        rows, first = clients[ctx.node_id]
        return ContinuousClient(rows, first, obj.n_users, 0, PARTS, matroid, state=ctx.state)

    return obj, matroid, cohorts, contexts, factory


def _answer(msgs, contexts, factory):
    return [handle_train(m, contexts[m.metadata.dst_node_id], factory) for m in msgs]


class _Grid:
    """Answers each message with ``answer(messages) -> replies`` (push, then pull)."""

    def __init__(self, answer) -> None:
        self.answer, self.replies = answer, {}

    def push_messages(self, messages):
        msgs = list(messages)
        for i, m in enumerate(msgs):
            m.metadata.__dict__["_message_id"] = f"m{len(self.replies) + i}"
        for m, r in zip(msgs, self.answer(msgs), strict=True):
            self.replies[m.metadata.message_id] = r
        return [m.metadata.message_id for m in msgs]

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in ids if i in self.replies]


def _bad(msg: Message, vec: np.ndarray, n: int, weight: float) -> Message:
    return Message(
        RecordDict(
            {
                "arrays": ArrayRecord({"0": Array(vec)}),
                "metrics": MetricRecord({"num-examples": n, "weight": weight}),
            }
        ),
        reply_to=msg,
    )


def test_fedcg_strategy_leaves_out_bad_replies_and_counts_them() -> None:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    obj, matroid, cohorts, contexts, factory = _setup()
    server = FedCGServer(obj.n_users, matroid, 5, 0.0, LocalSteps(), 1.0, seed=0)
    strategy = FedCGCohorts(server)
    strategy.cohorts = cohorts
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid=None))
    replies = _answer(msgs, contexts, factory)
    replies[1] = _bad(msgs[1], np.full(40, np.nan), 30, 30.0)  # non-finite
    replies[2] = Message(Error(code=2, reason="boom"), reply_to=msgs[2])
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["bad-replies"] == 2 and metrics["users"] == 30 and metrics["weight"] == 30
    expected, _ = user_direction_sum(
        obj, np.arange(30), np.ones(30), np.zeros(40), matroid, LocalSteps(), 0, 1
    )
    np.testing.assert_allclose(server.x, expected / 30 / 5)
    # a reply that is not a sum of bases (too much mass, or a weight that was not sent)
    msgs = list(strategy.configure_train(2, ArrayRecord(), ConfigRecord(), grid=None))
    replies = _answer(msgs, contexts, factory)
    replies[0] = _bad(msgs[0], np.full(40, 30.0), 30, 30.0)
    replies[1] = _bad(msgs[1], np.zeros(40), 30, 7.0)
    _, metrics = strategy.aggregate_train(2, replies)
    assert metrics["bad-replies"] == 2 and metrics["users"] == 30


def test_discrete_strategy_keeps_the_histogram_in_context_state() -> None:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    obj, matroid, cohorts, contexts, factory = _setup()
    server = DiscreteGreedyServer(obj.n_users, matroid, 3, 1e9, seed=1)
    strategy = DiscreteGreedyCohorts(server)
    strategy.cohorts = cohorts

    grid = _Grid(lambda msgs: _answer(msgs, contexts, factory))
    strategy.importance_protocol(grid, timeout=10)
    assert all(HISTOGRAM_RECORD in ctx.state.array_records for ctx in contexts.values())
    assert server.expected == pytest.approx(obj.n_users)
    for t in (1, 2, 3):
        msgs = list(strategy.configure_train(t, ArrayRecord(), ConfigRecord(), None))
        replies = _answer(msgs, contexts, factory)
        if t == 2:
            replies[0] = Message(Error(code=2, reason="down"), reply_to=msgs[0])
        _, metrics = strategy.aggregate_train(t, replies)
        assert metrics["bad-replies"] == (1 if t == 2 else 0)
    assert len(server.selected) == 3
    first = greedy(obj, matroid, 1).selected[0]
    assert server.selected[0] == first
    # a node whose state lost O answers with an error, which is counted
    contexts[101].state = RecordDict()
    msgs = list(strategy.configure_train(4, ArrayRecord(), ConfigRecord(), None))
    with pytest.raises(ValueError, match="importance-factor protocol"):
        factory(contexts[101]).fit([np.zeros(0, dtype=np.int64)], {"kind": "discrete"})


def test_missing_histogram_stops_the_run_before_greedy_rounds() -> None:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    obj, matroid, cohorts, contexts, factory = _setup()
    strategy = DiscreteGreedyCohorts(DiscreteGreedyServer(obj.n_users, matroid, 3, 5.0))
    strategy.cohorts = cohorts

    def answer(msgs):
        replies = _answer(msgs, contexts, factory)
        replies[0] = Message(Error(code=2, reason="down"), reply_to=msgs[0])
        return replies

    with pytest.raises(RuntimeError, match="sent no valid histogram"):
        strategy.importance_protocol(_Grid(answer), timeout=10)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"algorithm": "fedcg", "fedcg-eta": -0.5}, "'fedcg-eta' = -0.5: must be >= 0"),
        ({"algorithm": "fedcg", "fedcg-rounds": 0}, "'fedcg-rounds' = 0"),
        ({"algorithm": "fedcg", "fedcg-eta": 0.5}, "η·T .* > 1"),
        ({"algorithm": "fedcg-plus", "fedcg-local-steps": 0}, "'fedcg-local-steps' = 0"),
        ({"algorithm": "fedcg", "fedcg-rounding": "swap"}, "'fedcg-rounding' = 'swap'"),
        ({"algorithm": "fed-discrete-greedy", "dgreedy-kappa": 0.0}, "'dgreedy-kappa' = 0.0"),
    ],
)
def test_bad_config_fails_before_any_round(tmp_path, override, match) -> None:
    with pytest.raises(ConfigError, match=match):  # from AppConfig, or from the runner's checks
        cfg = AppConfig.from_run_config(
            {"num-users": 30, "num-elements": 20, "k": 3, "output-dir": str(tmp_path), **override}
        )
        run_direct(cfg)
    assert not any(tmp_path.iterdir())  # nothing written


# ---------------------------------------------------------------------------- flwr run
SMALL = {
    "num-users": 40,
    "num-elements": 50,
    "k": 4,
    "seed": 5,
    "fedcg-rounds": 6,
}


def _direct(tmp_path, run_config: dict) -> dict:
    cfg = AppConfig.from_run_config(
        {**run_config, "output-dir": str(tmp_path), "run-name": "direct"}
    )
    return run_direct(cfg)


def _rows(run) -> list[dict]:
    return [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.flwr
@pytest.mark.parametrize(
    ("config", "num_supernodes"),
    [
        ({"algorithm": "fedcg", "clients-per-round": 0.5}, 3),
        pytest.param(
            {
                "algorithm": "fedcg-plus",
                "clients-per-round": 1.0,
                "fedcg-local-steps": 3,
                "fedcg-gradient": "sampled",
                "fedcg-gradient-samples": 3,
                "fedcg-rounding": "pipage",
            },
            7,
            marks=pytest.mark.long,
        ),
        pytest.param(
            {"algorithm": "fed-discrete-greedy", "dgreedy-kappa": 4.0}, 5, marks=pytest.mark.long
        ),
        pytest.param(
            {"algorithm": "fedcg", "fedcg-rounding": "verified", "dgreedy-kappa": 4.0},
            3,
            marks=pytest.mark.long,
        ),
    ],
)
def test_flwr_run_gives_the_direct_engine_result(
    flower_cli, tmp_path, config, num_supernodes
) -> None:
    run_config = {**SMALL, **config}
    run = flower_cli.run(run_config, num_supernodes=num_supernodes)
    assert run.status == "finished:completed", run.output
    direct = _direct(tmp_path, run_config)
    summary = run.summary
    assert summary["selected"] == direct["selected"]
    assert summary["objective"] == pytest.approx(direct["objective"])
    rows = _rows(run)
    assert all(r["bad-replies"] == 0 for r in rows)
    if config["algorithm"] == "fed-discrete-greedy":
        assert summary["participants-by-round"] == direct["participants-by-round"]
        assert summary["expected-participants"] == pytest.approx(direct["expected-participants"])
    else:
        assert summary["multilinear"] == direct["multilinear"]  # bit-identical x
        verified = run_config["k"] if config.get("fedcg-rounding") == "verified" else 0
        assert len(rows) == run_config["fedcg-rounds"] + verified
