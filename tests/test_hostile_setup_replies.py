"""Hostile replies to the exchanges outside the training rounds, fuzzed.

``test_hostile_replies.py`` covers every strategy's *train* replies. The other exchanges a
node answers are fuzzed here: FedSM plain mode's setup (``train`` with ``stage=setup``),
FedSubAvg's counting query (``query.feature_heat``, both modes) and index-set query
(``query.submodel``, cohort mode), MaxFL's opt-in test (``evaluate.appeal``), the discrete
greedy's histogram and importance exchanges (``train.histogram`` / ``train.importance``),
and the cohort discovery (``query.cohort``).

In each run ONE node's reply to the exchange is replaced by a reply hypothesis draws: an
error, an empty or random content, or the honest reply with one record entry deleted,
renamed, or set to NaN, ±inf, a huge or negative number, a string, a list or an array of
another shape or dtype. The run must then either (1) end as the run in which that reply
never arrived (the node left out: same result, same rows) or (2) stop with one of the
documented errors naming the problem (``AllRepliesRejectedError``, ``TooFewRepliesError``,
``DiscoveryError``, or the ``RuntimeError`` of an exchange that must cover every user) —
never an unrelated exception from inside the code, never another result.

A *plausible* false value (a histogram entry of 3 instead of 2) cannot be told from an honest
one: that is a Byzantine node, outside what a decoder can check. What is checked is every
bound the protocol implies (counts within the users a report covers, expected participants
at most the node's users, values below ``MAX_REPORT_VALUE``, so no hostile value overflows the
server's sums).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flower_app.strategies.discovery import DiscoveryError
from flower_app.strategies.errors import TooFewRepliesError
from tests.test_hostile_replies import EXAMPLES, SCENARIOS, Outcome, _same, _without_reasons

#: (scenario, predicate on the request that picks the exchange)
EXCHANGES: dict[str, tuple[str, Callable[[Message], bool]]] = {
    "fedsm-plain setup": (
        "fedsm-plain",
        lambda m: m.metadata.message_type == "train"
        and m.content.config_records.get("config", {}).get("stage") == "setup",
    ),
    "fedsubavg-plain heat": ("fedsubavg-plain", lambda m: m.metadata.message_type
                             == "query.feature_heat"),
    "fedsubavg-cohort heat": ("fedsubavg-cohort", lambda m: m.metadata.message_type
                              == "query.feature_heat"),
    "fedsubavg-cohort index sets": ("fedsubavg-cohort", lambda m: m.metadata.message_type
                                    == "query.submodel"),
    "maxfl-plain opt-in": ("maxfl-plain", lambda m: m.metadata.message_type
                           == "evaluate.appeal"),
    "discrete-plain histogram": ("discrete-plain", lambda m: m.metadata.message_type
                                 == "train.histogram"),
    "discrete-plain importance": ("discrete-plain", lambda m: m.metadata.message_type
                                  == "train.importance"),
    "discrete-cohort histogram": ("discrete-cohort", lambda m: m.metadata.message_type
                                  == "train.histogram"),
    "fedsm-cohort discovery": ("fedsm-cohort", lambda m: m.metadata.message_type
                               == "query.cohort"),
}  # fmt: skip

#: optional entries whose absence legitimately changes a run (not fuzzed): FedSM plain mode
#: orders its users by ``partition-id`` when nodes give one, by node id otherwise
OPTIONAL = {"partition-id"}

#: what a run may stop with when a reply to an exchange is bad (each names the problem)
LOUD = (TooFewRepliesError, DiscoveryError, RuntimeError)

BAD_VALUES = [float("nan"), float("inf"), -float("inf"), -1, -(10**12), 10**18, 2.5, "x",
              [1.0, 2.0], True]  # fmt: skip


def _run(name: str, hostile: Callable[[Message, Message], Message | None]) -> Outcome:
    """Run the exchange's scenario; the first node asked in it gets ``hostile``'s reply."""
    sc_name, picks = EXCHANGES[name]
    sc = SCENARIOS[sc_name]
    grid = sc.grid()
    seen: dict[str, Any] = {"target": None, "done": False}

    def tamper(msg: Message, reply: Message) -> Message | None:
        if seen["done"] or not picks(msg):
            return reply
        if seen["target"] is None:
            seen["target"] = msg.metadata.dst_node_id
        if msg.metadata.dst_node_id != seen["target"]:
            return reply
        seen["done"] = True  # only its first reply to the exchange
        return hostile(msg, reply)

    grid.tamper = tamper
    strategy = sc.make_strategy()
    result = strategy.start(grid, **sc.start())
    arrays = {k: (str(a.dtype), tuple(a.shape), bytes(a.data)) for k, a in result.arrays.items()}
    rows = [
        {k: _without_reasons(v) for k, v in row.items() if k not in ("round-time", "wall-time")}
        for row in strategy.history
    ]
    return Outcome(arrays, rows, sc.state(strategy), seen["target"])


_BASELINES: dict[str, Outcome | BaseException] = {}
_HONEST: dict[str, Outcome] = {}


def _honest(name: str) -> Outcome:
    """The run in which every reply is honest (computed once per exchange)."""
    if name not in _HONEST:
        _HONEST[name] = _run(name, lambda msg, reply: reply)
    return _HONEST[name]


def _baseline(name: str) -> Outcome | BaseException:
    """The run in which that reply never arrives (or the error it stops with)."""
    if name not in _BASELINES:
        try:
            _BASELINES[name] = _run(name, lambda msg, reply: None)
        except LOUD as err:
            _BASELINES[name] = err
    return _BASELINES[name]


def _bad_value(draw: st.DrawFn, like: Any) -> Any:
    if isinstance(like, np.ndarray):
        choice = draw(st.sampled_from(["nan", "shape", "dtype", "negative", "huge"]))
        if choice == "nan" and like.dtype.kind == "f" and like.size:
            out = like.copy()
            out.flat[draw(st.integers(0, like.size - 1))] = np.nan
            return out
        if choice == "shape":
            return np.zeros(like.size + draw(st.integers(1, 5)), dtype=like.dtype)
        if choice == "dtype":
            return like.astype(np.float64) + 0.5 if like.dtype.kind in "iu" else like.astype(
                np.int64
            )  # fmt: skip
        if choice == "negative":
            return -np.abs(like) - 1
        if like.dtype.kind in "iu":  # the largest the dtype holds, up to 2**40
            return np.full_like(like, min(2**40, int(np.iinfo(like.dtype).max)))
        return np.full_like(like, 1e300)
    return draw(st.sampled_from(BAD_VALUES))


@st.composite
def hostile(draw: st.DrawFn, msg: Message, reply: Message) -> Message:
    """Draw a hostile reply to ``msg`` from the honest ``reply``."""
    kind = draw(st.sampled_from(["error", "empty", "drop", "rename", "value", "extra"]))
    if kind == "error" or reply.has_error():
        return Message(Error(code=draw(st.integers(0, 10)), reason="hostile"), reply_to=msg)
    if kind == "empty":
        return Message(RecordDict(), reply_to=msg)
    content = RecordDict()
    entries = []
    for name, record in reply.content.items():
        if isinstance(record, ArrayRecord):
            content[name] = ArrayRecord({k: Array(record[k].numpy()) for k in record})
        else:
            content[name] = type(record)(dict(record))
        entries += [(name, key) for key in content[name] if key not in OPTIONAL]
    if not entries or kind == "extra":
        record_name = draw(st.sampled_from(["arrays", "metrics", "properties", "junk"]))
        value = draw(st.sampled_from([1, -3, 2.5, float("nan")]))
        extra = {"arrays": lambda: ArrayRecord({"junk": Array(np.ones(3))}),
                 "metrics": lambda: MetricRecord({"junk": value}),
                 "properties": lambda: ConfigRecord({"junk": value}),
                 "junk": lambda: ConfigRecord({"junk": "x"})}[record_name]()  # fmt: skip
        content[record_name] = extra
        return Message(content, reply_to=msg)
    name, key = draw(st.sampled_from(entries))
    record = content[name]
    if kind == "drop":
        del record[key]
    elif kind == "rename":
        record[key + "-x"] = record[key]
        del record[key]
    else:
        old = record[key].numpy() if isinstance(record, ArrayRecord) else record[key]
        new = _bad_value(draw, old)
        if isinstance(record, ArrayRecord):
            record[key] = Array(np.asarray(new)) if isinstance(new, np.ndarray) else Array(
                np.asarray([0.0])
            )  # fmt: skip
        else:
            try:
                record[key] = new
            except (TypeError, ValueError):  # a record type that refuses it: drop instead
                del record[key]
    return Message(content, reply_to=msg)


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR")


@pytest.mark.parametrize("name", list(EXCHANGES))
@settings(
    max_examples=max(EXAMPLES // 2, 10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_hostile_reply_outside_the_rounds_is_left_out_or_fails_loudly(name, data) -> None:
    ref = _baseline(name)

    def reply(msg: Message, honest: Message) -> Message:
        return data.draw(hostile(msg, honest), label="reply")

    try:
        got = _run(name, reply)
    except LOUD as err:
        assert str(err), "a loud failure names its reason"
        return
    # it completed: exactly as without that reply, or exactly as the honest run (a hostile
    # value that happens to be harmless, e.g. a renamed optional key, must change nothing)
    honest = _honest(name)
    same_as_missing = isinstance(ref, Outcome) and (
        got.arrays == ref.arrays and _same(got.rows, ref.rows) and _same(got.state, ref.state)
    )
    same_as_honest = (
        got.arrays == honest.arrays and _same(got.rows, honest.rows)
        and _same(got.state, honest.state)
    )  # fmt: skip
    assert same_as_missing or same_as_honest, f"{name}: a hostile reply changed the result"
