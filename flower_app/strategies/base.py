"""The one strategy loop of this package: ``start()`` with Flower's signature and meaning.

Every strategy of :mod:`flower_app.strategies` subclasses :class:`RoundStrategy` and supplies
only its own steps, as Flower's ``FedAvg`` does:

``setup(grid, arrays, num_rounds)``
    work before round 1 (discovery of cohorts, a counting round, the importance protocol);
    returns the number of rounds the protocol will run (the protocol may fix it: FedSM
    Algorithm 1 runs k rounds, whatever ``num_rounds`` says; it says so at construction).
``before_round(server_round, arrays, grid)``
    an exchange that must precede sampling (MaxFL's opt-in test, FedSubAvg's index sets);
    optional.
``configure_train`` / ``decode_train_reply`` / ``aggregate_accepted``
    the round: messages out, one reply checked (raise to reject it), the accepted replies
    aggregated.
``configure_evaluate`` / ``aggregate_evaluate``
    federated evaluation; return ``[]`` to skip it in a round (the default).
``finalize(arrays)``
    the ``Result.arrays`` of the run (e.g. FedCG's rounding); default: the last arrays.

The loop here does the rest, once: ``train_config``/``evaluate_config`` merged into every
message (with ``server-round``), ``evaluate_fn(server_round, arrays)`` at round 0 and after
every round, the :class:`~flwr.serverapp.strategy.Result`, reply checking (a bad reply is
counted in ``bad-replies`` and left out, never averaged in), a history of per-round rows
(``self.history``) passed to ``on_round`` as each round ends, and the log lines.

Loud failures: a round in which *every* reply was rejected raises
:class:`AllRepliesRejectedError` carrying the first rejection's reason; a round in which fewer
than ``min_reply_fraction`` of the clients asked were answered for raises
:class:`TooFewRepliesError`; a node whose ClientApp has no handler for a message raises
:class:`MissingHandlerError` naming the decorator to add, as soon as its reply arrives, and
before round 1 for the handlers a run needs only later (``probe_messages``: e.g. MaxFL's
``@app.evaluate("appeal")``, first used after the mandatory rounds).

Node failures (deployment): a node that dies mid-run gets an error reply *from the SuperLink*
("node unavailable", after the round timeout or Flower's offline detection); the loop
attributes it to the node it was sent to (by ``reply_to_message_id``), counts it once, and
records every failed node with Flower's reason in the round's row (``failed-nodes``,
``users-missing``). :meth:`RoundStrategy.failure_summary` says whether the run was degraded.
Replies are pulled with a short, growing poll interval (10 ms to 0.5 s) instead of the
gRPC grid's fixed 3 s, so a deployment round costs little more than its messages. Every
message's TTL is set to its exchange's timeout plus ``TTL_MARGIN`` (Flower's default is
12 h): a node that was down during a round and comes back does not work through the
messages of rounds that are over before it reaches the current one.
"""

from __future__ import annotations

import functools
import math
import random
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common import log
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_app.privacy.secagg_server import SecureAggregation, key_book, secure_sum

__all__ = [
    "AllRepliesRejectedError",
    "TooFewRepliesError",
    "CheckedReplies",
    "EvaluateFn",
    "InitialArraysError",
    "MissingHandlerError",
    "NotEnoughNodesError",
    "RoundStrategy",
    "check_initial_arrays",
    "check_replies",
    "expire_after",
    "handler_hint",
    "is_flower_dp_wrapper",
    "int_metric",
    "messages_to",
    "sample_nodes",
    "to_metric",
    "to_metric_record",
]

#: the sender id of a securely aggregated sum (no node has a negative id)
SUMMED_SENDER = -1

#: how ``RoundStrategy.send`` polls for replies: every POLL_FAST seconds for the first
#: POLL_FAST_FOR seconds of an exchange, then an interval growing ×1.5 up to POLL_SLOW
POLL_FAST, POLL_FAST_FOR, POLL_SLOW = 0.005, 1.0, 0.5
#: seconds a message outlives its exchange's timeout (its TTL = timeout + this)
TTL_MARGIN = 10.0

#: Flower's ``evaluate_fn``: ``(server_round, arrays) -> MetricRecord | None``
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
RoundCallback = Callable[[dict[str, Any]], None]

# what a ClientApp answers when it has no handler for a message type / action
_NO_HANDLER = re.compile(
    r"No (?P<kind>train|evaluate|query) function registered with name '(?P<action>[^']*)'"
)
_INVALID_TYPE = re.compile(r"Invalid message type: '?(?P<type>[a-z]+)")


class TooFewRepliesError(RuntimeError):
    """A round in which too few of the clients asked were answered for (node failures)."""


class AllRepliesRejectedError(TooFewRepliesError):
    """A round in which every node that was asked failed or sent a reply that was left out."""


class MissingHandlerError(RuntimeError):
    """A node's ClientApp has no handler for a message this strategy sends."""


class InitialArraysError(ValueError):
    """``initial_arrays`` does not have the keys, shapes or dtypes the strategy needs."""


class NotEnoughNodesError(RuntimeError):
    """Fewer nodes connected than the strategy needs, after waiting ``timeout`` seconds."""


# ---------------------------------------------------------------------------- replies
@dataclass
class CheckedReplies:
    """The replies of one exchange, sorted into accepted and left out.

    Attributes
    ----------
    accepted : list of (int, Any)
        Node id and decoded content of every valid reply, in arrival order.
    bad : int
        Replies left out: unexpected sender, error reply, or rejected by the decoder.
    missing : int
        Nodes that were asked and did not reply.
    first_error : str or None
        The reason of the first reply left out (or of the missing replies).
    failed : dict of int to str
        Every asked node whose reply was left out or did not come, with the reason (each
        node once; a "node unavailable" error sent by the SuperLink is the node's).
    """

    accepted: list[tuple[int, Any]] = field(default_factory=list)
    bad: int = 0
    missing: int = 0
    first_error: str | None = None
    failed: dict[int, str] = field(default_factory=dict)

    @property
    def left_out(self) -> int:
        """Bad plus missing replies (what a round records as ``bad-replies``)."""
        return self.bad + self.missing


def handler_hint(reason: str, message_type: str) -> str | None:
    """Return how to fix a 'no handler' client error, or None if it is another error."""
    m = _NO_HANDLER.search(reason)
    if m:
        kind, action = m["kind"], m["action"]
        deco = f"@app.{kind}()" if action == "default" else f'@app.{kind}("{action}")'
        return f"its ClientApp has no {deco} handler for '{message_type}' messages: add one"
    m = _INVALID_TYPE.search(reason)
    if m:
        return (
            f"its ClientApp cannot answer '{message_type}' messages ({reason.strip()}); a legacy "
            "ClientApp(client_fn=...) answers only Flower's compat messages: wrap the "
            "NumPyClient with flower_app.clients.numpy_client_app, or use the Message-API "
            "client helpers of flower_app.clients"
        )
    return None


def check_replies(
    replies: Iterable[Message],
    decode: Callable[[int, Message], Any],
    expected: Iterable[int],
    context: str,
    sent: Mapping[str, int] | None = None,
) -> CheckedReplies:
    """Decode the replies of one exchange, leaving out (and counting) the bad ones.

    Parameters
    ----------
    replies : iterable of Message
        What ``grid.send_and_receive`` returned.
    decode : callable
        ``decode(src_node_id, reply) -> T``; raises ``ValueError`` (or ``KeyError`` /
        ``TypeError`` for missing or mistyped records) to reject a reply. Called only on
        replies without an error from nodes in ``expected``.
    expected : iterable of int
        The nodes the messages went to.
    context : str
        Prefix of the log lines, e.g. ``"round 3"``.
    sent : mapping of str to int, optional
        Message id -> destination node of the messages sent: an error reply that the
        SuperLink sends for an unreachable node is then counted as that node's failure
        (once), not as a reply from an unexpected sender plus a missing reply.

    Returns
    -------
    CheckedReplies
        Accepted replies with their decoded content, the counts of the others, and every
        failed node with its reason.

    Raises
    ------
    MissingHandlerError
        If a node's ClientApp has no handler for the message it was sent.
    """
    expected = {int(n) for n in expected}
    sent = {} if sent is None else sent
    out = CheckedReplies()
    answered: set[int] = set()
    for reply in replies:
        src = int(reply.metadata.src_node_id)
        if src not in expected and reply.has_error():
            # Flower reports an unreachable node with the SuperLink as the sender
            src = int(sent.get(reply.metadata.reply_to_message_id, src))
        if src in answered and src in expected:
            continue  # one verdict per node
        answered.add(src)
        try:
            if reply.has_error():
                reason = str(reply.error.reason)
                hint = handler_hint(reason, reply.metadata.message_type)
                if hint is not None:
                    raise MissingHandlerError(f"{context}: node {src}: {hint}")
                if src not in expected:
                    raise ValueError(f"delivery failed: {reason}")
                if int(reply.error.code) == ErrorCode.NODE_UNAVAILABLE:
                    raise ValueError(f"node unavailable: {reason}")
                raise ValueError(f"client error: {reason}")
            if src not in expected:
                raise ValueError("reply from a node that was not sent anything")
            value = decode(src, reply)
        except (ValueError, KeyError, TypeError) as err:
            out.bad += 1
            if src in expected:
                out.failed[src] = str(err)
            if out.first_error is None:
                out.first_error = f"node {src}: {err}"
            log(WARNING, "%s: reply of node %s left out: %s", context, src, err)
            continue
        out.accepted.append((src, value))
    missing = sorted(expected - answered)
    out.missing = len(missing)
    for node in missing:
        out.failed[node] = "no reply within the timeout"
    if out.missing:
        log(WARNING, "%s: %d nodes did not reply in time", context, out.missing)
        if out.first_error is None:
            out.first_error = f"{out.missing} nodes did not reply in time"
    return out


# ---------------------------------------------------------------------------- records
def int_metric(metrics: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """Return ``metrics[key]`` as an int; reject anything but an integral number.

    Parameters
    ----------
    metrics : mapping
        A reply's MetricRecord (or a dict of it).
    key : str
        The metric.
    default : int, optional
        Value when the metric is absent (default: it is required).

    Returns
    -------
    int
        The value (a float is accepted only if it is finite and integral, e.g. ``3.0``).

    Raises
    ------
    KeyError
        If the metric is absent and there is no default.
    ValueError
        If the value is a list, a bool, non-finite or not integral (``int(inf)`` would
        raise OverflowError, ``int(2.5)`` would silently give 2).
    """
    value = metrics[key] if default is None or key in metrics else default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"metric '{key}' = {value!r}: expected an integer")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"metric '{key}' = {value!r}: expected an integer")
    return int(value)


def to_metric(value: Any) -> Any:
    """Turn a value into what a MetricRecord accepts (Python int/float or lists of them)."""
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [to_metric(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [to_metric(v) for v in value]
    return value


def to_metric_record(values: Mapping[str, Any]) -> MetricRecord:
    """Return a MetricRecord of the numeric entries of ``values`` (None and strings dropped)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        value = to_metric(value)
        if isinstance(value, int | float) or (
            isinstance(value, list) and all(isinstance(v, int | float) for v in value)
        ):
            out[key] = value
    return MetricRecord(out)


def check_initial_arrays(
    arrays: ArrayRecord | None, expected: Mapping[str, tuple[tuple[int, ...], str]] | None
) -> None:
    """Check ``initial_arrays`` against the keys, shapes and dtype kinds a strategy needs.

    Parameters
    ----------
    arrays : ArrayRecord or None
        What the user passed to ``start``.
    expected : mapping or None
        key -> (shape, dtype kinds, e.g. ``"f"`` or ``"iu"``); None accepts anything.

    Raises
    ------
    InitialArraysError
        Naming the missing, extra or mis-shaped keys.
    """
    if expected is None:
        return
    got = {} if arrays is None else {k: arrays[k] for k in arrays}
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    if missing or extra:
        raise InitialArraysError(
            f"initial_arrays has keys {sorted(got)}; expected {list(expected)}"
            + (f" (missing {missing})" if missing else "")
            + (f" (unexpected {extra})" if extra else "")
        )
    for key, (shape, kinds) in expected.items():
        a = got[key]
        if tuple(a.shape) != tuple(shape):
            raise InitialArraysError(
                f"initial_arrays['{key}'] has shape {tuple(a.shape)}, expected {tuple(shape)}"
            )
        if np.dtype(a.dtype).kind not in kinds:
            raise InitialArraysError(
                f"initial_arrays['{key}'] has dtype {a.dtype}, expected kind {kinds!r}"
            )


# ---------------------------------------------------------------------------- messages
def messages_to(
    nodes: Iterable[int], content: RecordDict, message_type: str, group_id: str = ""
) -> list[Message]:
    """Return one message per node, all carrying the same ``content``.

    Parameters
    ----------
    nodes : iterable of int
        The destination node ids, in the order the messages are returned.
    content : RecordDict
        What every node receives (one object: the messages share it).
    message_type : str
        E.g. ``MessageType.EVALUATE`` or ``"evaluate.appeal"``.
    group_id : str, optional
        The messages' group id (default none).

    Returns
    -------
    list of Message
        One message per node.
    """
    return [
        Message(content, dst_node_id=int(n), message_type=message_type, group_id=group_id)
        for n in nodes
    ]


def expire_after(messages: Iterable[Message], timeout: float) -> None:
    """Set each message's TTL so that it expires ``TTL_MARGIN`` s after ``timeout`` from now.

    The SuperLink does not deliver an expired message, so a node that returns after a
    round's timeout never runs that round's work (with Flower's default 12 h TTL a node
    that came back worked through every round it had missed and answered each current
    round too late). Messages whose TTL is already shorter keep it; an infinite
    ``timeout`` changes nothing.
    """
    if not math.isfinite(timeout):
        return
    now = time.time()
    for msg in messages:
        ttl = (now - msg.metadata.created_at) + max(timeout, 0.0) + TTL_MARGIN
        if not msg.metadata.ttl or ttl < msg.metadata.ttl:
            msg.metadata.ttl = ttl


# ---------------------------------------------------------------------------- sampling
def _external_driver(strategy: Strategy) -> Strategy | None:
    """Return the strategy on the call stack that wraps ``strategy`` (its ``.strategy``).

    Flower's wrappers (the ``DifferentialPrivacy*`` strategies) keep the wrapped strategy
    in ``self.strategy`` and call it from their own ``configure_train``.
    """
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not strategy and getattr(owner, "strategy", None) is strategy:
            return owner
        frame = frame.f_back
    return None


def is_flower_dp_wrapper(driver: object) -> bool:
    """Return True if ``driver`` is one of Flower's four ``DifferentialPrivacy*`` wrappers."""
    from flwr.serverapp.strategy import (
        DifferentialPrivacyClientSideAdaptiveClipping,
        DifferentialPrivacyClientSideFixedClipping,
        DifferentialPrivacyServerSideAdaptiveClipping,
        DifferentialPrivacyServerSideFixedClipping,
    )

    return isinstance(
        driver,
        DifferentialPrivacyClientSideAdaptiveClipping
        | DifferentialPrivacyClientSideFixedClipping
        | DifferentialPrivacyServerSideAdaptiveClipping
        | DifferentialPrivacyServerSideFixedClipping,
    )


def _external_guard(inner: Callable[..., Iterable[Message]], prepare: bool) -> Callable:
    """Wrap a ``configure_*`` hook for loops other than :meth:`RoundStrategy.start`.

    See :meth:`RoundStrategy.__init_subclass__`: outside the strategy's own loop the
    returned messages' destinations become the expected senders of the exchange
    (``prepare``: after running ``setup`` / ``before_round`` first).
    """

    @functools.wraps(inner)
    def configure(
        self: RoundStrategy,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
    ) -> Iterable[Message]:
        if self._own_loop or grid is None:  # no grid: called alone (e.g. a unit test)
            return inner(self, server_round, arrays, config, grid)
        if prepare:
            arrays = self._prepare_external(server_round, arrays, grid)
        messages = list(inner(self, server_round, arrays, config, grid))
        self._expected = {int(m.metadata.dst_node_id) for m in messages}
        self._sent_ids = {}
        return messages

    configure._external_guard = True  # type: ignore[attr-defined]
    return configure


def sample_nodes(
    grid: Grid,
    rng: random.Random,
    fraction: float,
    min_nodes: int,
    min_available: int,
    timeout: float = 300.0,
    poll_interval: float = 0.5,
) -> list[int]:
    """Sample nodes as Flower's ``FedAvg`` does, with a seeded ``random.Random``.

    Waits until at least ``max(min_nodes, min_available)`` nodes are connected, then draws
    ``max(int(fraction · available), min_nodes)`` of them without replacement from the
    sorted node ids (node ids are 64-bit: sampled with Python's ``random``, never numpy).

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    rng : random.Random
        The strategy's node sampler.
    fraction : float
        Fraction of available nodes, in (0, 1].
    min_nodes : int
        Least number of nodes to sample.
    min_available : int
        Least number of connected nodes before sampling.
    timeout : float
        Seconds to wait for enough nodes.
    poll_interval : float
        Seconds between looks at the grid.

    Returns
    -------
    list of int
        The sampled node ids.

    Raises
    ------
    NotEnoughNodesError
        If not enough nodes connected within ``timeout``.
    """
    need = max(int(min_nodes), int(min_available), 1)
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= need:
            break
        if time.monotonic() > deadline:
            raise NotEnoughNodesError(
                f"{len(nodes)} nodes connected after {timeout:.0f} s; the strategy needs "
                f"{need} (min_available_nodes / min_train_nodes)"
            )
        time.sleep(poll_interval)
    count = min(len(nodes), max(int(fraction * len(nodes)), int(min_nodes), 1))
    return sorted(rng.sample(nodes, count))


# ---------------------------------------------------------------------------- the loop
class RoundStrategy(Strategy):
    """Base of every strategy here: Flower's ``start()`` loop, written once.

    Subclasses implement ``configure_train``, ``decode_train_reply`` and
    ``aggregate_accepted`` (and optionally ``setup``, ``before_round``,
    ``configure_evaluate``/``aggregate_evaluate``, ``finalize``, ``round_summary``).

    Parameters
    ----------
    on_round : callable, optional
        Receives each round's row (a dict of the round's metrics) as the round ends, e.g. to
        append it to ``metrics.jsonl``.
    min_reply_fraction : float, optional
        Least fraction of the round's clients (users, in cohort mode) whose replies must be
        accepted; a round below it raises :class:`TooFewRepliesError` instead of going on
        with a different result. Default 0.0: like Flower's ``FedAvg``, a round aggregates
        whatever came (the loss is recorded in the round's ``failed-nodes`` and
        ``users-missing``); a round with no usable reply always fails.
    secure_aggregation : SecureAggregation, optional
        Sum each round's train replies with secure aggregation
        (:mod:`flower_app.privacy`): the server obtains only the sum of the nodes'
        replies; the nodes' ClientApps need
        :func:`~flower_app.privacy.secure_aggregation_mod`. Default None (replies in the
        clear). Strategies whose
        aggregate is not a sum of replies refuse it (``supports_secure_aggregation``).
    """

    #: also send ``configure_evaluate(0, ...)`` before round 1 (federated initial evaluation)
    evaluate_initial: bool = False
    #: logged before that round-0 evaluation, which may take long (e.g. MaxFL's solo models)
    initial_evaluation_note: str = ""
    #: the strategy implements :meth:`checkpoint_state` / :meth:`restore_state`
    resumable: bool = False
    #: the round's aggregate is a function of the sum of the train replies (see
    #: :meth:`RoundStrategy.merge_senders`), so secure aggregation can replace the replies
    #: by their sum
    supports_secure_aggregation: bool = False
    #: metrics of a train reply sent in the clear under secure aggregation (every node
    #: must send the same value, e.g. FedSM's ``num-elements``); all others are summed
    secure_public_metrics: tuple[str, ...] = ()
    #: cohort mode: seconds a round waits, before it is sent, for mapped nodes that left the
    #: grid's node list to be back (run_config ``node-return-wait``; e.g. a SuperNode
    #: restarted with its key returns under its node id); 0: no wait, their users are
    #: skipped. After the wait, a node still away is skipped as without it
    node_return_wait: float = 0.0

    def secure_transform(self) -> dict[str, Any] | None:
        """Return the reply transform the nodes apply under secure aggregation, or None.

        For plain-mode replies that are not sums as they are (MaxFL's trained models):
        ``{"name": <flower_app.privacy.transforms name>, <param>: <value>, ...}``.
        """
        return None

    def __init__(
        self,
        on_round: RoundCallback | None = None,
        min_reply_fraction: float = 0.0,
        secure_aggregation: SecureAggregation | None = None,
    ) -> None:
        if not 0.0 <= float(min_reply_fraction) <= 1.0:
            raise ValueError(f"min_reply_fraction={min_reply_fraction}: expected a value in [0, 1]")
        if secure_aggregation is not None:
            if not isinstance(secure_aggregation, SecureAggregation):
                raise TypeError(
                    "secure_aggregation must be a flower_app.privacy.SecureAggregation, not "
                    f"{type(secure_aggregation).__name__}"
                )
            if not self.supports_secure_aggregation:
                raise ValueError(
                    f"{type(self).__name__} does not support secure aggregation yet: its "
                    "aggregate is not computed from the sum of the replies alone"
                )
        self.secure_aggregation = secure_aggregation
        self.on_round = on_round
        self.min_reply_fraction = float(min_reply_fraction)
        self.history: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self._expected: set[int] = set()
        self._sent_ids: dict[str, int] = {}
        self._last_checked: CheckedReplies | None = None
        self._skipped: dict[int, tuple[int, str]] = {}
        self._summed_nodes: list[int] = []
        self._own_loop = False  # inside this class's start()
        self._external_setup = False  # setup() run for another loop (Flower's wrappers)
        self._prepared_round = 0
        #: called as ``checkpoint_fn(payload)`` after every round (resumable strategies)
        self.checkpoint_fn: Callable[[dict[str, Any]], None] | None = None
        self._resume: dict[str, Any] | None = None
        self._timeout = 3600.0
        self._t0 = 0.0

    #: rounds ``setup`` is told when another loop drives the strategy (it does not say)
    external_num_rounds: int = 1_000_000

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Let another ``start()`` loop drive the strategy (e.g. Flower's DP wrappers).

        Flower's ``Strategy.start`` (and so ``DifferentialPrivacyServerSideFixedClipping``
        and friends, which wrap a strategy and run their own loop) calls only
        ``configure_train``/``aggregate_train``/``configure_evaluate``/
        ``aggregate_evaluate``, and sends the messages itself: this class's :meth:`send`,
        which records whom each exchange went to, is bypassed. So every subclass's
        ``configure_train`` and ``configure_evaluate`` are wrapped: outside this class's
        own ``start()``, the messages they return are remembered as the expected senders
        of the replies that the next ``aggregate_*`` call checks (without this, the
        evaluate replies of nodes that were not trained in the round were rejected as
        "reply from a node that was not sent anything"), and the first
        ``configure_train`` runs :meth:`setup` (with :attr:`external_num_rounds` rounds)
        and every round first runs :meth:`before_round`. Called without a grid (a unit
        test that prepared the strategy itself), they run alone.
        """
        super().__init_subclass__(**kwargs)
        for name in ("configure_train", "configure_evaluate"):
            inner = cls.__dict__.get(name)
            if inner is None or getattr(inner, "_external_guard", False):
                continue
            setattr(cls, name, _external_guard(inner, prepare=name == "configure_train"))

    def _prepare_external(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> ArrayRecord:
        """Run ``setup`` once and ``before_round`` once per round for another loop."""
        if self.secure_aggregation is not None:
            raise RuntimeError(
                f"{type(self).__name__} with secure_aggregation must run its own start(): "
                "another loop (e.g. a Flower DP wrapper) sends each reply in the clear"
            )
        if not self._external_setup:
            self.check_driver(_external_driver(self))
            check_initial_arrays(arrays, self.expected_initial_arrays())
            self._t0 = time.perf_counter()
            self.setup(grid, arrays, self.external_num_rounds)
            arrays = self.initial_state(arrays)
            self._external_setup = True
        if self._prepared_round != server_round:
            self._prepared_round = server_round
            self.refresh_nodes(grid)
            self.before_round(server_round, arrays, grid)
        return arrays

    # ------------------------------------------------------------------ hooks
    def check_driver(self, driver: Strategy | None) -> None:
        """Refuse (raise) or warn about the wrapper whose loop drives this strategy.

        Called once, before ``setup``, when another loop drives the strategy; ``driver``
        is the wrapping strategy found on the call stack (e.g. one of Flower's
        ``DifferentialPrivacy*`` wrappers, whose ``strategy`` attribute is this one), or
        None. Default: accept every driver.
        """

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Prepare the run before round 1; return the number of rounds to run.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        arrays : ArrayRecord
            ``initial_arrays`` (already checked by :meth:`expected_initial_arrays`).
        num_rounds : int
            What the caller asked for.

        Returns
        -------
        int
            Rounds to run (``num_rounds`` unless the protocol fixes its length).
        """
        return num_rounds

    def initial_state(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return the arrays of round 0, after ``setup`` (default: ``initial_arrays``).

        A strategy whose starting point exists only after ``setup`` (e.g. x = 0 of a ground
        set whose size the nodes reported) returns it here; ``evaluate_fn(0, ...)`` and round
        1 receive it.
        """
        return arrays

    def expected_initial_arrays(self) -> Mapping[str, tuple[tuple[int, ...], str]] | None:
        """Return key -> (shape, dtype kinds) that ``initial_arrays`` must have, or None."""
        return None

    def before_round(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> None:
        """Exchange what must precede the round's sampling (default: nothing)."""

    def probe_messages(
        self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """Return requests for the handlers the run needs only after round 1 (default none).

        Sent once before round 1, after ``setup``. Each is a real request of its kind (e.g.
        MaxFL's opt-in test of the initial model), so a ClientApp answers it as it will
        later; the replies are discarded. A node without the handler stops the run there
        with :class:`MissingHandlerError` naming the decorator to add.
        """
        return []

    def _probe_handlers(self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord) -> None:
        messages = list(self.probe_messages(grid, arrays, config))
        if not messages:
            return
        kinds = sorted({m.metadata.message_type for m in messages})
        for reply in self.send(grid, messages, timeout=min(self._timeout, 600.0)):
            hint = None
            if reply.has_error():
                hint = handler_hint(str(reply.error.reason), reply.metadata.message_type)
            if hint is not None:
                src = self._sent_ids.get(reply.metadata.reply_to_message_id)
                raise MissingHandlerError(f"before round 1: node {src}: {hint}")
        log(INFO, "before round 1: the nodes answer %s", ", ".join(kinds))

    def decode_train_reply(self, src: int, reply: Message) -> Any:
        """Check one train reply and return its decoded content (raise to reject it)."""
        raise NotImplementedError

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the accepted train replies of a round."""
        raise NotImplementedError

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Return no messages: no federated evaluation unless a subclass asks for it."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return None (no federated evaluation by default)."""
        return None

    def finished(self) -> bool:
        """Return True once the protocol has ended, before the rounds ``setup`` returned.

        For protocols whose length shows only as they run (FedSM Algorithm 2 stops when its
        thresholds are used up): ``setup`` returns an upper bound, this says when to stop.
        """
        return False

    def finalize(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return ``Result.arrays`` of the run (default: the last round's arrays)."""
        return arrays

    def round_summary(self, row: dict[str, Any]) -> str:
        """Return the short text of a round's log line (the strategy's key numbers)."""
        return ""

    def refresh_nodes(self, grid: Grid) -> None:
        """Before each round: re-discover cohorts (cohort mode), see ``refresh_cohorts``.

        Mapped nodes that left the grid are marked offline (their users are skipped and
        recorded as missing); a node that rejoined under a new id and serves an offline
        node's users takes its place. With ``node_return_wait`` > 0, mapped nodes not in
        the grid's node list are first waited for, up to that many seconds. No-op without a
        ``cohorts`` map (plain mode samples from the grid's current nodes every round
        anyway).
        """
        from flower_app.strategies.discovery import (
            CohortMap,
            refresh_cohorts,
            wait_for_mapped_nodes,
        )

        cohorts = getattr(self, "cohorts", None)
        if isinstance(cohorts, CohortMap):
            if self.node_return_wait > 0:
                wait_for_mapped_nodes(grid, cohorts, self.node_return_wait)
            self.cohorts = refresh_cohorts(grid, cohorts, timeout=min(self._timeout, 60.0))

    def group_users(self, users: np.ndarray) -> dict[int, np.ndarray]:
        """Split sorted users by the node serving them, skipping offline nodes.

        The users of an offline node are recorded in the round's ``failed-nodes`` and
        ``users-missing`` (reason: offline) and count against ``min_reply_fraction``.
        Under secure aggregation, when the users sit on fewer than ``min_nodes`` nodes,
        other online nodes are added with no users (they reply zeros), so that the round
        can be summed securely (e.g. K = 2 users on one node).
        """
        cohorts = self.cohorts  # type: ignore[attr-defined]
        groups = cohorts.group(users)
        for node in [n for n in groups if n in cohorts.offline]:
            self._skipped[node] = (
                int(groups.pop(node).size),
                "node offline (left the SuperLink's node list; not sent)",
            )
        if self.secure_aggregation is not None:
            # a secure sum needs at least min_nodes nodes: when the sampled users sit on
            # fewer, other online nodes take part with no users (their replies are zeros;
            # the server learns the same sum over the sampled users)
            least = int(self.secure_aggregation.min_nodes)
            idle = [int(n) for n in cohorts.node_ids
                    if int(n) not in groups and int(n) not in cohorts.offline]  # fmt: skip
            for node in idle[: max(0, least - len(groups))]:
                groups[node] = np.zeros(0, dtype=np.asarray(users).dtype)
            order = {int(n): i for i, n in enumerate(cohorts.node_ids)}
            groups = dict(sorted(groups.items(), key=lambda item: order[item[0]]))
        return groups

    def checkpoint_state(self) -> Any:
        """Return the server-side state to resume from after a round.

        A resumable strategy (``resumable = True``) returns everything its next round
        depends on besides the arrays (e.g. FedSM's run: S so far, its random generator),
        as a run folder's checkpoint can store it: plain data, numpy arrays and generators,
        and objects of the types registered in :mod:`flower_app.checkpoint_types` (an own
        strategy registers its own with :func:`flower_app.checkpoint.register_type`).
        """
        raise NotImplementedError(f"{type(self).__name__} is not resumable")

    def restore_state(self, state: Any) -> None:
        """Put back what :meth:`checkpoint_state` returned (after ``setup``)."""
        raise NotImplementedError(f"{type(self).__name__} is not resumable")

    def resume_from(self, payload: dict[str, Any]) -> None:
        """Make the next ``start()`` continue after the checkpoint's round.

        ``start()`` still runs ``setup`` (discovery: node ids may have changed), then
        restores the state, the arrays, the history and the failures of the checkpoint,
        and runs the remaining rounds only.

        Parameters
        ----------
        payload : dict
            What ``checkpoint_fn`` received after the last finished round.
        """
        if not self.resumable:
            raise NotImplementedError(f"{type(self).__name__} is not resumable")
        self._resume = payload

    def sent_users(self, node_id: int) -> int:
        """Return how many clients (users) the round's message to ``node_id`` stands for.

        1 in plain mode; a cohort strategy returns the users it sampled on the node, so that
        ``users-missing`` and ``min_reply_fraction`` count users, not nodes.
        """
        return 1

    def failure_summary(self) -> dict[str, Any]:
        """Return what the run lost to node failures, for ``summary.json``.

        Returns
        -------
        dict
            ``degraded`` (bool), ``rounds-degraded`` (rounds with a failed node),
            ``nodes-failed`` (distinct node ids), ``users-missing`` (sum over rounds) and
            ``first-failure`` (round, node and Flower's reason), or ``None`` values when
            nothing failed.
        """
        nodes = sorted({int(f["node-id"]) for r in self.failures for f in r["failed-nodes"]})
        first = None
        if self.failures:
            r = self.failures[0]
            first = {"server-round": r["server-round"], **r["failed-nodes"][0]}
        return {
            "degraded": bool(self.failures),
            "rounds-degraded": [int(r["server-round"]) for r in self.failures],
            "nodes-failed": nodes,
            "users-missing": int(sum(r["users-missing"] for r in self.failures)),
            "first-failure": first,
        }

    # ------------------------------------------------------------------ helpers
    def send(
        self, grid: Grid, messages: Iterable[Message], timeout: float | None = None
    ) -> list[Message]:
        """Send messages, remember whom they went to, and return the replies.

        Pushes the messages and pulls replies every ``POLL_FAST`` (5 ms) for the first
        ``POLL_FAST_FOR`` (1 s), then with an interval growing ×1.5 up to 0.5 s, until
        every message is answered or ``timeout`` (default: ``start``'s) has passed; the
        messages expire ``TTL_MARGIN`` s after that (``expire_after``).
        Flower's gRPC grid sleeps a fixed 3 s between pulls (every deployment round was a
        multiple of 3 s); a growing interval from the start added up to a third of a
        short round's time in simulation, where a pull is a lookup in memory. Replies are
        returned in the order the messages were sent, so that sums over them do not depend
        on arrival order.
        """
        messages = list(messages)
        self._expected = {int(m.metadata.dst_node_id) for m in messages}
        self._sent_ids = {}
        if not messages:
            return []
        wait = self._timeout if timeout is None else timeout
        expire_after(messages, wait)
        pushed = [str(i) for i in grid.push_messages(messages) if i]
        # push_messages sets each message's id: keep id -> destination for error replies
        self._sent_ids = {str(m.metadata.message_id): int(m.metadata.dst_node_id) for m in messages}
        order = {mid: pos for pos, mid in enumerate(pushed)}
        pending = set(pushed)
        replies: list[Message] = []
        start = time.monotonic()
        deadline = start + wait
        interval = POLL_FAST
        while pending:
            got = list(grid.pull_messages(sorted(pending, key=order.__getitem__)))
            replies.extend(got)
            pending.difference_update(r.metadata.reply_to_message_id for r in got)
            now = time.monotonic()
            if not pending or now >= deadline:
                break
            time.sleep(min(interval, deadline - now))
            if now - start >= POLL_FAST_FOR:
                interval = min(interval * 1.5, POLL_SLOW)
        # in the order the messages were sent, whatever the arrival order: aggregates sum
        # in the same order on every run
        replies.sort(key=lambda r: order.get(r.metadata.reply_to_message_id, len(order)))
        return replies

    def check(
        self,
        replies: Iterable[Message],
        decode: Callable[[int, Message], Any],
        context: str,
        expected: Iterable[int] | None = None,
        all_rejected_fails: bool = True,
        train_round: int | None = None,
    ) -> CheckedReplies:
        """Check replies against the nodes last sent to; fail loudly if none is usable.

        With ``train_round`` (the replies of a round's training exchange), the failed nodes
        are kept for the round's row and ``min_reply_fraction`` is enforced.

        Raises
        ------
        AllRepliesRejectedError
            If ``all_rejected_fails`` and nodes were asked but no reply was accepted.
        TooFewRepliesError
            If ``train_round`` is given and fewer than ``min_reply_fraction`` of the round's
            clients were answered for.
        """
        expected = self._expected if expected is None else {int(n) for n in expected}
        checked = check_replies(replies, decode, expected, context, self._sent_ids)
        if all_rejected_fails and expected and not checked.accepted:
            raise AllRepliesRejectedError(
                f"{context}: all {len(expected)} replies were rejected; first: "
                f"{checked.first_error}"
            )
        if train_round is not None:
            self._enforce_replies(train_round, checked, expected, all_rejected_fails)
        return checked

    def _enforce_replies(
        self,
        train_round: int,
        checked: CheckedReplies,
        expected: set[int],
        all_rejected_fails: bool,
    ) -> None:
        """Keep a round's checked replies for its row; enforce ``min_reply_fraction``."""
        self._last_checked = checked
        asked = {n: self.sent_users(n) for n in expected}
        accepted = {n for n, _ in checked.accepted}
        answered = sum(asked.get(n, 0) for n in accepted)
        if SUMMED_SENDER in accepted:  # a secure sum stands for its survivors
            answered += sum(asked.get(n, 0) for n in self._summed_nodes)
        total = sum(asked.values()) + sum(u for u, _ in self._skipped.values())
        if total and not answered and all_rejected_fails:
            raise AllRepliesRejectedError(
                f"round {train_round}: no client's reply accepted ({total} asked); "
                f"failed nodes: {self._failed_text(checked)}"
            )
        if total and answered < self.min_reply_fraction * total:
            raise TooFewRepliesError(
                f"round {train_round}: replies for {answered} of {total} clients "
                f"accepted, below min_reply_fraction={self.min_reply_fraction:g}; "
                f"failed nodes: {self._failed_text(checked)}"
            )

    def _failed_text(self, checked: CheckedReplies) -> str:
        reasons = {n: r for n, (_, r) in self._skipped.items()} | checked.failed
        return "; ".join(f"{n}: {r}" for n, r in sorted(reasons.items())) or "none"

    @staticmethod
    def merged_config(config: ConfigRecord | None, server_round: int, **extra: Any) -> ConfigRecord:
        """Return the user's config with ``server-round`` and the strategy's entries."""
        return ConfigRecord({**dict(config or {}), **extra, "server-round": int(server_round)})

    def evaluate_like_fedavg(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
        rng: random.Random,
        group: str,
    ) -> list[Message]:
        """Return plain mode's ``evaluate`` messages, as Flower's ``FedAvg`` sends them.

        The model and the user's ``evaluate_config`` (plus ``server-round``) go to a sample
        of the connected nodes (``sample_nodes``): ``fraction_evaluate`` of them, at
        least ``min_evaluate_nodes``, once ``min_available_nodes`` are connected (three
        attributes the strategy sets, as ``FedAvg`` does). No message when
        ``fraction_evaluate`` is 0.

        Parameters
        ----------
        server_round : int
            The round (0: the initial model).
        arrays : ArrayRecord
            The model every sampled node evaluates.
        config : ConfigRecord
            The user's ``evaluate_config``.
        grid : Grid
            The ServerApp's grid.
        rng : random.Random
            The strategy's evaluation sampler (its own stream, so that evaluating does not
            change which nodes train).
        group : str
            Prefix of the messages' group id, ``<group>-<server_round>``.

        Returns
        -------
        list of Message
            One ``evaluate`` message per sampled node (none if ``fraction_evaluate`` is 0).
        """
        fraction = float(self.fraction_evaluate)  # type: ignore[attr-defined]
        if fraction <= 0:
            return []
        least = int(self.min_evaluate_nodes)  # type: ignore[attr-defined]
        available = int(self.min_available_nodes)  # type: ignore[attr-defined]
        nodes = sample_nodes(grid, rng, fraction, least, available, self._timeout)
        content = RecordDict({"arrays": arrays, "config": self.merged_config(config, server_round)})
        return messages_to(nodes, content, MessageType.EVALUATE, f"{group}-{server_round}")

    # ------------------------------------------------------------------ Strategy API
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the replies (bad ones counted, all bad fails) and aggregate the rest."""
        checked = self.check(
            replies, self.decode_train_reply, f"round {server_round}", train_round=server_round
        )
        arrays, metrics = self.aggregate_accepted(server_round, checked)
        if metrics is not None and "bad-replies" not in metrics:
            metrics["bad-replies"] = int(checked.left_out)
        return arrays, metrics

    def merge_senders(self, nodes: list[int]) -> int:
        """Register the sum of ``nodes``' replies as one sender; return its id.

        Under secure aggregation the server receives one summed reply for the round's
        surviving nodes; :meth:`decode_train_reply` is called on it with the id returned
        here, so the strategy's per-sender bookkeeping (e.g. users sent per node) must
        answer for that id with the survivors' total. Default: ``self._sent[-1]`` = the
        sum of ``self._sent[n]``; returns -1 (no node has a negative id).
        """
        sent = getattr(self, "_sent", None)
        if isinstance(sent, dict):
            sent[SUMMED_SENDER] = sum(int(sent.get(n, 0)) for n in nodes)
        return SUMMED_SENDER

    def secure_train(
        self, server_round: int, grid: Grid, messages: list[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run a round's train exchange under secure aggregation and aggregate the sum.

        The summed reply is decoded by :meth:`decode_train_reply` as one sender (see
        :meth:`merge_senders`); if the strategy rejects it, the round fails (a single bad
        reply cannot be singled out of a sum). The protocol's cost (messages, bytes, time)
        goes into the round's metrics.

        Raises
        ------
        AllRepliesRejectedError
            If no node's reply could be summed, or the sum was rejected.
        """
        assert self.secure_aggregation is not None
        context = f"round {server_round}"
        expected = {int(m.metadata.dst_node_id) for m in messages}
        # the same neighbour ring every round for the same nodes: pairwise keys are derived
        # once per pair and run (a ring reshuffled each round costs every node an ECDH per
        # new neighbour per round)
        rng = random.Random(f"{getattr(self, 'seed', 0)}-secagg")
        outcome = secure_sum(
            lambda msgs: self.send(grid, msgs),
            messages,
            self.secure_aggregation,
            rng,
            server_round,
            self.secure_public_metrics,
            self.secure_transform(),
            keys=key_book(grid),
        )
        checked = CheckedReplies(failed=dict(outcome.failed), bad=outcome.bad)
        checked.missing = len(outcome.failed) - outcome.bad
        for node, reason in sorted(outcome.failed.items()):
            log(WARNING, "%s: node %s left out: %s", context, node, reason)
            if checked.first_error is None:
                checked.first_error = f"node {node}: {reason}"
        for node, reason in sorted(outcome.unmask_rejected.items()):
            log(WARNING, "%s: node %s's unmask reply left out (its reply is in the sum): %s",
                context, node, reason)  # fmt: skip
        if outcome.content is not None and outcome.template is not None:
            self._summed_nodes = list(outcome.survivors)
            sender = self.merge_senders(outcome.survivors)
            reply = Message(outcome.content, reply_to=outcome.template)
            try:
                checked.accepted.append((sender, self.decode_train_reply(sender, reply)))
            except (ValueError, KeyError, TypeError) as err:
                raise AllRepliesRejectedError(
                    f"{context}: the securely aggregated sum of {len(outcome.survivors)} "
                    f"nodes was rejected: {err} (a single bad reply cannot be singled out "
                    "of a sum)"
                ) from err
            finally:
                sent = getattr(self, "_sent", None)
                if isinstance(sent, dict):
                    sent.pop(SUMMED_SENDER, None)
        self._expected = expected
        self._enforce_replies(server_round, checked, expected, True)
        arrays, metrics = self.aggregate_accepted(server_round, checked)
        if metrics is not None:
            metrics["bad-replies"] = int(checked.left_out)
            metrics["secagg-nodes"] = len(outcome.survivors)
            metrics["secagg-unmask-rejected"] = len(outcome.unmask_rejected)
            for key, value in outcome.cost.items():
                metrics[key] = value
            if "secagg-bytes-up" in outcome.cost:  # what really went up, not the sum's size
                metrics["bytes-up"] = int(outcome.cost["secagg-bytes-up"])
                metrics["bytes-up-max-client"] = int(outcome.cost["secagg-bytes-up-max-node"])
        return arrays, metrics

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Run the strategy over the grid, as Flower's ``Strategy.start`` does.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        initial_arrays : ArrayRecord, optional
            The starting model (learning strategies: required, its keys come back in
            ``Result.arrays``) or starting point; see the strategy's docstring.
        num_rounds : int, optional
            Rounds to run (default 3); a protocol that fixes its own length says so in its
            docstring and logs the length it runs.
        timeout : float, optional
            Seconds to wait for the replies of one exchange (default 3600).
        train_config, evaluate_config : ConfigRecord, optional
            Entries merged into every train / evaluate message (``server-round`` added).
        evaluate_fn : callable, optional
            ``evaluate_fn(server_round, arrays) -> MetricRecord | None``, called with the
            initial arrays (round 0) and after every round.

        Returns
        -------
        Result
            ``arrays`` (see the strategy), per-round ``train_metrics_clientapp``,
            ``evaluate_metrics_clientapp`` and ``evaluate_metrics_serverapp``.

        Raises
        ------
        InitialArraysError, AllRepliesRejectedError, MissingHandlerError
            See the module docstring.
        """
        check_initial_arrays(initial_arrays, self.expected_initial_arrays())
        arrays = ArrayRecord() if initial_arrays is None else initial_arrays
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        self._timeout = float(timeout)
        self._own_loop = True
        try:
            return self._start(grid, arrays, num_rounds, train_config, evaluate_config, evaluate_fn)
        finally:
            self._own_loop = False

    def _start(
        self,
        grid: Grid,
        arrays: ArrayRecord,
        num_rounds: int,
        train_config: ConfigRecord,
        evaluate_config: ConfigRecord,
        evaluate_fn: EvaluateFn | None,
    ) -> Result:
        """Run the loop of :meth:`start` (see there)."""
        log(INFO, "Starting %s strategy:", type(self).__name__)
        self.summary()
        self._t0 = time.perf_counter()
        total = int(self.setup(grid, arrays, int(num_rounds)))
        arrays = self.initial_state(arrays)
        self._probe_handlers(grid, arrays, evaluate_config)
        result = Result()
        first = 1
        if self._resume is not None:
            first = self._restore(self._resume, result) + 1
            arrays = result.arrays if len(result.arrays) else arrays
            log(INFO, "resuming after round %d of %d", first - 1, total)
        row0: dict[str, Any] = {}
        if self.evaluate_initial and first == 1:
            log(INFO, "[round 0/%d] evaluating the initial model%s", total,
                f": {self.initial_evaluation_note}" if self.initial_evaluation_note else "")
            row0.update(self._evaluate(0, arrays, evaluate_config, grid, result))
        if evaluate_fn is not None and first == 1:
            res = evaluate_fn(0, arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
                row0.update(dict(res))
        if row0:
            self._emit({"server-round": 0, **row0}, total)
        for t in range(first, total + 1):
            if self.finished():
                break
            r0 = time.perf_counter()
            self.refresh_nodes(grid)
            self.before_round(t, arrays, grid)
            messages = self.configure_train(t, arrays, train_config, grid)
            if self.secure_aggregation is None:
                new_arrays, metrics = self.aggregate_train(t, self.send(grid, messages))
            else:
                new_arrays, metrics = self.secure_train(t, grid, list(messages))
            if new_arrays is not None:
                arrays = new_arrays
                result.arrays = new_arrays
            row: dict[str, Any] = {"server-round": t}
            if metrics is not None:
                result.train_metrics_clientapp[t] = metrics
                row.update(dict(metrics))
            self._record_failures(t, row)
            row.update(self._evaluate(t, arrays, evaluate_config, grid, result))
            if evaluate_fn is not None:
                res = evaluate_fn(t, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[t] = res
                    row.update(dict(res))
            row["round-time"] = time.perf_counter() - r0
            self._emit(row, total)
            if self.resumable and self.checkpoint_fn is not None:
                self.checkpoint_fn(
                    {
                        "server-round": t,
                        "arrays": {k: arrays[k].numpy() for k in arrays},
                        "state": self.checkpoint_state(),
                        "history": list(self.history),
                        "failures": list(self.failures),
                    }
                )
        result.arrays = self.finalize(arrays)
        log(INFO, "%s finished in %.2f s", type(self).__name__, time.perf_counter() - self._t0)
        return result

    def _restore(self, payload: dict[str, Any], result: Result) -> int:
        """Restore a checkpoint into the strategy and ``result``; return its round."""
        self.restore_state(payload["state"])
        self.history = list(payload["history"])
        self.failures = list(payload["failures"])
        if payload["arrays"]:
            result.arrays = ArrayRecord({k: Array(v) for k, v in payload["arrays"].items()})
        self._resume = None
        return int(payload["server-round"])

    def _evaluate(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
        result: Result,
    ) -> dict[str, Any]:
        messages = list(self.configure_evaluate(server_round, arrays, config, grid))
        if not messages:
            return {}
        res = self.aggregate_evaluate(server_round, self.send(grid, messages))
        if res is None:
            return {}
        result.evaluate_metrics_clientapp[server_round] = res
        return dict(res)

    def _record_failures(self, server_round: int, row: dict[str, Any]) -> None:
        """Add the round's failed nodes and missing users to its row (and to ``failures``)."""
        checked, self._last_checked = self._last_checked, None
        skipped, self._skipped = self._skipped, {}
        failed = [
            {"node-id": int(n), "users": int(users), "reason": reason}
            for n, (users, reason) in sorted(skipped.items())
        ]
        if checked is not None:
            failed += [
                {"node-id": int(n), "users": int(self.sent_users(n)), "reason": reason}
                for n, reason in sorted(checked.failed.items())
            ]
        if not failed:
            return
        missing = sum(f["users"] for f in failed)
        row["failed-nodes"] = failed
        row["users-missing"] = missing
        self.failures.append(
            {"server-round": server_round, "failed-nodes": failed, "users-missing": missing}
        )

    def _emit(self, row: dict[str, Any], total: int) -> None:
        row["wall-time"] = time.perf_counter() - self._t0
        self.history.append(row)
        t = int(row["server-round"])
        open_ended = bool(getattr(self, "rounds_open_ended", False))
        log(
            INFO,
            "[round %d/%s] %s  bad=%s  %.2f s%s",
            t,
            "?" if open_ended else total,
            self.round_summary(row),
            row.get("bad-replies", 0),
            row.get("round-time", 0.0),
            "" if open_ended else _eta(self.history, t, total),
        )
        if self.on_round is not None:
            self.on_round(row)

    def summary(self) -> None:
        """Log the strategy's settings (subclasses say more)."""
        log(INFO, "%s", type(self).__name__)


def _eta(history: list[dict[str, Any]], t: int, total: int) -> str:
    """Return ``"  eta 2m05s"`` (mean round time × rounds left), or "" under 5 s."""
    times = [float(r["round-time"]) for r in history if r.get("server-round", 0) >= 1
             and "round-time" in r]  # fmt: skip
    if not times or t >= total:
        return ""
    left = sum(times) / len(times) * (total - t)
    if left < 5.0:
        return ""
    minutes, seconds = divmod(int(round(left)), 60)
    hours, minutes = divmod(minutes, 60)
    text = f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
    return f"  eta {text}"


def warn_fixed_length(name: str, asked: int, runs: int, why: str) -> None:
    """Log that a protocol runs ``runs`` rounds although ``asked`` were requested."""
    if asked != runs:
        log(WARNING, "%s runs %d rounds (%s); num_rounds=%d is not used", name, runs, why, asked)
