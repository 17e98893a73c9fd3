"""The one way this app exchanges messages with the nodes: :func:`transmit` and :func:`exchange`.

Every message of the app goes through :func:`transmit`: a strategy round's train and
evaluate messages, its setup exchanges, the secure-aggregation protocol's steps, discovery
(:mod:`flower_app.strategies.discovery`), the node probe of ``server-data = "none"``
(:mod:`flower_app.server_data`) and the runners' federated evaluations. It

- sets each message's TTL to the exchange's timeout plus :data:`TTL_MARGIN` (Flower's
  default is 12 h: a node that was down during a round and comes back would work through
  the messages of rounds that are over before it reaches the current one);
- pushes the messages and pulls the replies every :data:`POLL_FAST` s for the first
  :data:`POLL_FAST_FOR` s, then with an interval growing ×1.5 up to :data:`POLL_SLOW` s
  (Flower's gRPC grid sleeps a fixed 3 s between pulls, so every deployment round was a
  multiple of 3 s), until every message is answered or the timeout has passed;
- returns the replies in the order the messages were sent, whatever the arrival order, so
  that sums over them do not depend on timing, with the destination of every message id
  (Flower reports an unreachable node with the SuperLink as the sender).

:func:`exchange` adds the reply checks of :func:`~flower_app.strategies.replies.check_replies`
with the exchange's decoder: error replies, replies from nodes not asked, and replies the
decoder rejects (missing records, non-finite or out-of-range values) are left out and
counted, and a node without a handler for the message raises
:class:`~flower_app.strategies.errors.MissingHandlerError`. The strategy loop checks a
round's replies in its ``aggregate_*`` steps (Flower's API hands those the replies), with
the same function.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

from flower_app.strategies.replies import CheckedReplies, check_replies

__all__ = [
    "POLL_FAST",
    "POLL_FAST_FOR",
    "POLL_SLOW",
    "TTL_MARGIN",
    "Delivery",
    "exchange",
    "expire_after",
    "messages_to",
    "transmit",
]

#: how :func:`transmit` polls for replies: every POLL_FAST seconds for the first
#: POLL_FAST_FOR seconds of an exchange, then an interval growing ×1.5 up to POLL_SLOW
POLL_FAST, POLL_FAST_FOR, POLL_SLOW = 0.005, 1.0, 0.5
#: seconds a message outlives its exchange's timeout (its TTL = timeout + this)
TTL_MARGIN = 10.0


def messages_to(
    nodes: Iterable[int], content: Any, message_type: str, group_id: str = ""
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


@dataclass
class Delivery:
    """What one exchange sent and received.

    Attributes
    ----------
    replies : list of Message
        The replies that arrived within the timeout, in the order the messages were sent.
    destinations : dict of str to int
        Message id -> destination node of every message pushed.
    expected : set of int
        The nodes the messages went to.
    """

    replies: list[Message] = field(default_factory=list)
    destinations: dict[str, int] = field(default_factory=dict)
    expected: set[int] = field(default_factory=set)

    def check(self, decode: Callable[[int, Message], Any], context: str) -> CheckedReplies:
        """Return the replies checked and decoded (see :func:`.replies.check_replies`)."""
        return check_replies(self.replies, decode, self.expected, context, self.destinations)


def transmit(grid: Grid, messages: Iterable[Message], timeout: float) -> Delivery:
    """Push messages, pull their replies until all came or ``timeout`` passed.

    See the module docstring for the TTL, the poll schedule and the order of the replies.

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    messages : iterable of Message
        The messages, one per destination node.
    timeout : float
        Seconds to wait for the replies.

    Returns
    -------
    Delivery
        The replies in send order, with every message's destination.
    """
    messages = list(messages)
    out = Delivery(expected={int(m.metadata.dst_node_id) for m in messages})
    if not messages:
        return out
    expire_after(messages, timeout)
    pushed = [str(i) for i in grid.push_messages(messages) if i]
    # push_messages sets each message's id: keep id -> destination for error replies
    out.destinations = {str(m.metadata.message_id): int(m.metadata.dst_node_id) for m in messages}
    order = {mid: pos for pos, mid in enumerate(pushed)}
    pending = set(pushed)
    start = time.monotonic()
    deadline = start + timeout
    interval = POLL_FAST
    while pending:
        got = list(grid.pull_messages(sorted(pending, key=order.__getitem__)))
        out.replies.extend(got)
        pending.difference_update(r.metadata.reply_to_message_id for r in got)
        now = time.monotonic()
        if not pending or now >= deadline:
            break
        time.sleep(min(interval, deadline - now))
        if now - start >= POLL_FAST_FOR:
            interval = min(interval * 1.5, POLL_SLOW)
    # in the order the messages were sent, whatever the arrival order: aggregates sum in
    # the same order on every run
    out.replies.sort(key=lambda r: order.get(r.metadata.reply_to_message_id, len(order)))
    return out


def exchange(
    grid: Grid,
    messages: Iterable[Message],
    decode: Callable[[int, Message], Any],
    context: str,
    timeout: float,
) -> CheckedReplies:
    """Send messages and return their replies checked and decoded.

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    messages : iterable of Message
        The messages, one per destination node.
    decode : callable
        ``decode(src_node_id, reply) -> T``; raises ``ValueError``, ``KeyError`` or
        ``TypeError`` to reject a reply (see :mod:`flower_app.strategies.replies`).
    context : str
        Prefix of the log lines, e.g. ``"discovery"``.
    timeout : float
        Seconds to wait for the replies.

    Returns
    -------
    CheckedReplies
        The accepted replies (in send order) with their decoded content, and every node
        whose reply was left out or did not come, with the reason.

    Raises
    ------
    MissingHandlerError
        If a node's ClientApp has no handler for the message it was sent.
    """
    return transmit(grid, messages, timeout).check(decode, context)
