"""The strategy base: Flower's start() meaning, reply checking, loud failures, node sampling.

A toy strategy (each sampled node returns its arrays plus its partition id; the server
averages) runs over the in-process grid against small ClientApps written as a user would.
"""

from __future__ import annotations

import math
import random
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from flower_app.clients.adapter import numpy_client_app
from flower_app.strategies.base import RoundStrategy
from flower_app.strategies.discovery import discover_cohorts
from flower_app.strategies.errors import (
    AllRepliesRejectedError,
    InitialArraysError,
    MissingHandlerError,
    NotEnoughNodesError,
)
from flower_app.strategies.exchange import TTL_MARGIN, expire_after
from flower_app.strategies.records import check_initial_arrays, to_metric_record
from flower_app.strategies.sampling import sample_nodes
from tests.support.local_grid import LocalGrid


def rec(**arrays: np.ndarray) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


class ToyStrategy(RoundStrategy):
    """Average of the sampled nodes' arrays, like FedAvg with equal weights."""

    def __init__(self, fraction_train: float = 1.0, seed: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fraction_train = fraction_train
        self.rng = random.Random(seed)
        self.configs: list[dict] = []

    def expected_initial_arrays(self):
        return {"w": ((3,), "f")}

    def train_messages(self, server_round, arrays, config, grid):
        nodes = sample_nodes(grid, self.rng, self.fraction_train, 1, 1, timeout=1)
        cfg = self.merged_config(config, server_round)
        return [
            Message(RecordDict({"arrays": arrays, "config": cfg}), dst_node_id=n,
                    message_type="train")
            for n in nodes
        ]

    def decode_train_reply(self, src, reply):
        arrays = reply.content.array_records["arrays"]
        w = arrays["w"].numpy()
        if not np.all(np.isfinite(w)):
            raise ValueError("non-finite update")
        return w

    def aggregate_accepted(self, server_round, checked):
        mean = np.mean([w for _, w in checked.accepted], axis=0)
        return rec(w=mean), MetricRecord({"nodes": len(checked.accepted)})

    def round_summary(self, row):
        return f"nodes={row.get('nodes')}"


def user_app(seen: list, nan: bool = False) -> ClientApp:
    """A plain user ClientApp: adds 1 to w (or returns NaN), records the config it got."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        seen.append(dict(msg.content.config_records["config"]))
        w = msg.content.array_records["arrays"]["w"].numpy() + 1.0
        if nan:
            w = w * np.nan
        metrics = MetricRecord({"num-examples": 1})
        return Message(RecordDict({"arrays": rec(w=w), "metrics": metrics}),
                       reply_to=msg)

    return app


def test_start_keeps_flowers_meaning():
    seen: list = []
    grid = LocalGrid(4, {}, app=user_app(seen))
    calls: list = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord):
        calls.append((server_round, arrays["w"].numpy().copy()))
        return MetricRecord({"w0": float(arrays["w"].numpy()[0])})

    strategy = ToyStrategy()
    initial = rec(w=np.zeros(3, dtype=np.float32))
    result = strategy.start(
        grid, initial, num_rounds=4, train_config=ConfigRecord({"lr": 0.05, "opt": "sgd"}),
        evaluate_fn=evaluate_fn,
    )
    # keys and dtype round-trip; four rounds of +1
    assert list(result.arrays.keys()) == ["w"]
    np.testing.assert_allclose(result.arrays["w"].numpy(), 4.0)
    # the user's train config reaches every client unchanged, plus server-round
    assert {c["lr"] for c in seen} == {0.05} and {c["opt"] for c in seen} == {"sgd"}
    assert sorted({c["server-round"] for c in seen}) == [1, 2, 3, 4]
    # evaluate_fn at rounds 0..T, with the arrays of that round
    assert [r for r, _ in calls] == [0, 1, 2, 3, 4]
    assert [float(w[0]) for _, w in calls] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3, 4]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3, 4]
    assert [row["server-round"] for row in strategy.history] == [0, 1, 2, 3, 4]


def test_all_replies_rejected_fails_with_the_first_reason():
    grid = LocalGrid(3, {}, app=user_app([], nan=True))
    with pytest.raises(AllRepliesRejectedError, match="non-finite update"):
        ToyStrategy().start(grid, rec(w=np.zeros(3)), num_rounds=2)


def test_one_bad_reply_is_counted_and_left_out():
    grid = LocalGrid(3, {}, app=user_app([]))
    bad_node = grid.node_ids[0]

    def tamper(msg, reply):
        if msg.metadata.dst_node_id == bad_node:
            w = reply.content.array_records["arrays"]["w"].numpy() * np.nan
            return Message(
                RecordDict({"arrays": rec(w=w),
                            "metrics": MetricRecord({"num-examples": 1})}),
                reply_to=msg,
            )
        return reply

    grid.tamper = tamper
    strategy = ToyStrategy()
    result = strategy.start(grid, rec(w=np.zeros(3)), num_rounds=1)
    np.testing.assert_allclose(result.arrays["w"].numpy(), 1.0)  # NaN never averaged in
    assert strategy.history[-1]["bad-replies"] == 1
    assert strategy.history[-1]["nodes"] == 2


def test_missing_handler_is_named_at_once():
    app = ClientApp()  # a user's app with no train handler

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:  # pragma: no cover
        return Message(RecordDict(), reply_to=msg)

    grid = LocalGrid(2, {}, app=app)
    t0 = time.monotonic()
    with pytest.raises(MissingHandlerError, match=r"@app\.train\(\)"):
        ToyStrategy().start(grid, rec(w=np.zeros(3)), num_rounds=1)
    assert time.monotonic() - t0 < 30


def test_discovery_names_the_cohort_handler_at_once():
    grid = LocalGrid(2, {}, app=user_app([]))  # a FedAvg-style app: no query handler
    t0 = time.monotonic()
    with pytest.raises(MissingHandlerError, match=r'@app\.query\("cohort"\)'):
        discover_cohorts(grid, n_users=10, n_elements=5, timeout=300)
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        (rec(v=np.zeros(3)), "missing"),
        (rec(w=np.zeros(4)), "shape"),
        (rec(w=np.zeros(3, dtype=np.int64)), "dtype"),
        (None, "missing"),
    ],
)
def test_wrong_initial_arrays_raise(arrays, match):
    with pytest.raises(InitialArraysError, match=match):
        check_initial_arrays(arrays, {"w": ((3,), "f")})


class _Nodes(Grid):
    """A grid whose nodes appear one by one (the simulation engine registering them)."""

    def __init__(self, ids, appear_every=0.0):
        self.ids, self.t0, self.every = ids, time.monotonic(), appear_every

    def get_node_ids(self):
        if not self.every:
            return list(self.ids)
        return self.ids[: int((time.monotonic() - self.t0) / self.every) + 1]

    run = property(lambda self: None)
    set_run = create_message = push_messages = pull_messages = send_and_receive = None
    get_nodes = None


def test_sample_nodes_is_seeded_and_waits_for_min_available():
    ids = [2**63 + i * 7919 for i in range(20)]  # 64-bit node ids
    a = sample_nodes(_Nodes(ids), random.Random(3), 0.25, 2, 2)
    b = sample_nodes(_Nodes(list(reversed(ids))), random.Random(3), 0.25, 2, 2)
    assert a == b and len(a) == 5 and set(a) <= set(ids)
    assert sample_nodes(_Nodes(ids), random.Random(3), 0.01, 3, 2) .__len__() == 3
    slow = _Nodes(ids[:4], appear_every=0.05)
    assert len(sample_nodes(slow, random.Random(0), 1.0, 1, 4, timeout=5, poll_interval=0.01)) == 4
    with pytest.raises(NotEnoughNodesError, match="2 nodes connected"):
        sample_nodes(_Nodes(ids[:2]), random.Random(0), 1.0, 1, 3, timeout=0.1, poll_interval=0.01)


def test_metric_record_takes_numpy_values():
    record = to_metric_record(
        {"a": np.int64(3), "b": np.float32(0.5), "c": np.array([1, 2]), "d": True, "e": None,
         "f": "text"}
    )
    assert dict(record) == {"a": 3, "b": 0.5, "c": [1, 2], "d": 1}


class _AddOne(NumPyClient):
    """A legacy NumPyClient: fit adds 1, get_properties echoes the config."""

    def get_properties(self, config):
        return {"kind": str(config.get("kind", "")), "n": 7}

    def fit(self, parameters, config):
        return [p + 1.0 for p in parameters], 1, {"lr": float(config["lr"])}

    def evaluate(self, parameters, config):
        return float(parameters[0].sum()), 3, {}


def test_numpy_client_app_serves_a_legacy_numpy_client():
    app = numpy_client_app(lambda context: _AddOne())
    grid = LocalGrid(2, {}, app=app)
    node = grid.node_ids[0]
    for mtype in ("train", "train.direction"):
        msg = Message(
            RecordDict({"arrays": ArrayRecord([np.zeros(2)]),
                        "config": ConfigRecord({"lr": 0.5})}),
            dst_node_id=node, message_type=mtype,
        )
        (reply,) = grid.send_and_receive([msg])
        np.testing.assert_allclose(reply.content.array_records["arrays"]["0"].numpy(), 1.0)
        assert dict(reply.content.metric_records["metrics"]) == {"lr": 0.5, "num-examples": 1}
    query = Message(RecordDict({}), dst_node_id=node, message_type="query.cohort")
    (reply,) = grid.send_and_receive([query])
    assert dict(reply.content.config_records["properties"]) == {"kind": "cohort", "n": 7}
    ev = Message(RecordDict({"arrays": ArrayRecord([np.ones(2)])}), dst_node_id=node,
                 message_type="evaluate")
    (reply,) = grid.send_and_receive([ev])
    assert dict(reply.content.metric_records["metrics"]) == {"loss": 2.0, "num-examples": 3}


class _LateReplies(LocalGrid):
    """LocalGrid whose replies become visible only at the ``ready_at``-th pull."""

    def __init__(self, ready_at: int) -> None:
        super().__init__(2, {}, app=numpy_client_app(lambda context: _AddOne()))
        self.ready_at, self.pulls = ready_at, 0

    def pull_messages(self, message_ids):
        self.pulls += 1
        return super().pull_messages(message_ids) if self.pulls >= self.ready_at else []


def test_send_polls_every_5_ms_at_first_and_backs_off_after_a_second(monkeypatch):
    """A reply ready between pulls is read within POLL_FAST during an exchange's first second
    (a growing interval from the start added up to a third of a short simulated round), and
    the interval grows ×1.5 to POLL_SLOW only afterwards (fewer pulls on a long wait)."""
    import flower_app.strategies.exchange as base

    slept: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(base.time, "sleep", lambda s: (slept.append(s), real_sleep(s)))

    def exchange(grid: _LateReplies) -> list[Message]:
        msgs = [
            Message(RecordDict({"arrays": ArrayRecord([np.zeros(2)]),
                                "config": ConfigRecord({"lr": 0.5})}),
                    dst_node_id=n, message_type="train")
            for n in grid.node_ids
        ]  # fmt: skip
        return ToyStrategy().send(grid, msgs, timeout=30.0)

    grid = _LateReplies(ready_at=12)
    start = time.monotonic()
    replies = exchange(grid)
    assert len(replies) == 2 and grid.pulls == 12
    if time.monotonic() - start < base.POLL_FAST_FOR:  # a stalled machine may take longer
        assert slept == [base.POLL_FAST] * 11
    slept.clear()
    grid = _LateReplies(ready_at=10**9)  # never ready: back-off until the timeout
    strategy = ToyStrategy()
    msgs = [Message(RecordDict({}), dst_node_id=grid.node_ids[0], message_type="train")]
    start = time.monotonic()
    assert strategy.send(grid, msgs, timeout=2.0) == []
    assert 2.0 <= time.monotonic() - start < 3.0
    assert all(s <= base.POLL_FAST + 1e-12 for s in slept[:20])  # the first 100 ms
    grown = [s for s in slept if s > base.POLL_FAST]
    assert grown and max(grown) <= base.POLL_SLOW
    assert len(slept) < 1.0 / base.POLL_FAST + 20  # not 400 pulls in 2 s


def test_messages_expire_shortly_after_their_exchange_timeout():
    """A round's messages get TTL = timeout + TTL_MARGIN (Flower's default is 12 h, so a
    node that came back worked through every round it had missed before the current one);
    a shorter TTL is kept, an infinite timeout keeps Flower's default."""
    grid = LocalGrid(3, {}, app=numpy_client_app(lambda context: _AddOne()))
    msgs = [Message(RecordDict({}), dst_node_id=n, message_type="train") for n in grid.node_ids]
    default = msgs[0].metadata.ttl
    assert default >= 3600
    msgs[2].metadata.ttl = 5.0
    expire_after(msgs, 20.0)
    for m in msgs[:2]:
        assert 20.0 + TTL_MARGIN <= m.metadata.ttl < 20.0 + TTL_MARGIN + 5
        assert m.metadata.created_at + m.metadata.ttl > time.time() + 20.0
    assert msgs[2].metadata.ttl == 5.0
    fresh = [Message(RecordDict({}), dst_node_id=grid.node_ids[0], message_type="train")]
    expire_after(fresh, math.inf)
    assert fresh[0].metadata.ttl == default
    # RoundStrategy.send sets it on everything it pushes
    sent = [Message(RecordDict({"arrays": ArrayRecord([np.zeros(2)]),
                                "config": ConfigRecord({"lr": 0.5})}),
                    dst_node_id=n, message_type="train") for n in grid.node_ids]  # fmt: skip
    assert len(ToyStrategy().send(grid, sent, timeout=7.0)) == 3
    assert all(m.metadata.ttl < 7.0 + TTL_MARGIN + 5 for m in sent)
