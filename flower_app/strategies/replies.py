"""Reply checking: every reply of every exchange is sorted into accepted and left out.

A reply is left out (and counted) when it is an error reply (a ClientApp that failed,
Flower's "node unavailable"), when it comes from a node that was not asked, or when the
exchange's decoder rejects it: a missing or mistyped record, a non-finite number or one
out of its range (:func:`int_metric`, :func:`float_metric`). A node whose ClientApp has no
handler for the message raises :class:`~flower_app.strategies.errors.MissingHandlerError`
naming the decorator to add.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

from flwr.app import Message
from flwr.common import log
from flwr.common.constant import ErrorCode

from flower_app.privacy.ledger import NODE_PRIVACY_RECORD, RELEASE_KEYS
from flower_app.strategies.errors import MissingHandlerError

__all__ = [
    "CheckedReplies",
    "check_replies",
    "float_metric",
    "handler_hint",
    "int_metric",
]

# what a ClientApp answers when it has no handler for a message type / action
_NO_HANDLER = re.compile(
    r"No (?P<kind>train|evaluate|query) function registered with name '(?P<action>[^']*)'"
)
_INVALID_TYPE = re.compile(r"Invalid message type: '?(?P<type>[a-z]+)")


@dataclass
class CheckedReplies:
    """The replies of one exchange, sorted into accepted and left out.

    Attributes
    ----------
    accepted : list of (int, Any)
        Node id and decoded content of every valid reply, in send order.
    bad : int
        Replies left out: unexpected sender, error reply, or rejected by the decoder.
    missing : int
        Nodes that were asked and did not reply.
    first_error : str or None
        The reason of the first reply left out (or of the missing replies).
    failed : dict of int to str
        Every asked node whose reply was left out or did not come, with the reason (each
        node once; a "node unavailable" error sent by the SuperLink is the node's).
    errors : dict of int to str
        The asked nodes that sent an error reply, with Flower's reason (a subset of
        ``failed``: a node worth asking again, unlike one whose reply was malformed).
    silent : list of int
        The asked nodes that did not reply (a subset of ``failed``).
    node_privacy : dict of int to dict
        The clear ``"node-privacy"`` figures of the nodes that sent them (each node's own
        privacy ledger, :mod:`flower_app.privacy.ledger`).
    """

    accepted: list[tuple[int, Any]] = field(default_factory=list)
    bad: int = 0
    missing: int = 0
    first_error: str | None = None
    failed: dict[int, str] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    silent: list[int] = field(default_factory=list)
    node_privacy: dict[int, dict[str, Any]] = field(default_factory=dict)

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
        What the exchange returned (:func:`~flower_app.strategies.exchange.transmit`).
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
                out.errors[src] = reason
                if int(reply.error.code) == ErrorCode.NODE_UNAVAILABLE:
                    raise ValueError(f"node unavailable: {reason}")
                raise ValueError(f"client error: {reason}")
            if src not in expected:
                raise ValueError("reply from a node that was not sent anything")
            metrics = reply.content.metric_records.get("metrics")
            if metrics is not None and RELEASE_KEYS[0] in metrics:
                raise ValueError(
                    "the reply declares a differentially private release that no privacy mod "
                    "charged: the node's ClientApp lacks flower_app.privacy."
                    "secure_aggregation_mod, which keeps the node's privacy budget"
                )
            figures = reply.content.metric_records.get(NODE_PRIVACY_RECORD)
            if figures is not None:
                out.node_privacy[src] = dict(figures)
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
    out.silent = missing
    for node in missing:
        out.failed[node] = "no reply within the timeout"
    if out.missing:
        log(WARNING, "%s: %d nodes did not reply in time", context, out.missing)
        if out.first_error is None:
            out.first_error = f"{out.missing} nodes did not reply in time"
    return out


def int_metric(
    metrics: Mapping[str, Any],
    key: str,
    default: int | None = None,
    low: int | None = None,
    high: int | None = None,
) -> int:
    """Return ``metrics[key]`` as an int; reject anything but an integral number.

    Parameters
    ----------
    metrics : mapping
        A reply's MetricRecord (or a dict of it).
    key : str
        The metric.
    default : int, optional
        Value when the metric is absent (default: it is required).
    low, high : int, optional
        Least and greatest value accepted (default: no bound).

    Returns
    -------
    int
        The value (a float is accepted only if it is finite and integral, e.g. ``3.0``).

    Raises
    ------
    KeyError
        If the metric is absent and there is no default.
    ValueError
        If the value is a list, a bool, non-finite, not integral (``int(inf)`` would raise
        OverflowError, ``int(2.5)`` would silently give 2) or out of ``[low, high]``.
    """
    value = metrics[key] if default is None or key in metrics else default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"metric '{key}' = {value!r}: expected an integer")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"metric '{key}' = {value!r}: expected an integer")
    _check_range(key, value, low, high)
    return int(value)


def float_metric(
    metrics: Mapping[str, Any],
    key: str,
    low: float | None = None,
    high: float | None = None,
) -> float:
    """Return ``metrics[key]`` as a finite float in ``[low, high]``; reject anything else.

    Parameters
    ----------
    metrics : mapping
        A reply's MetricRecord (or a dict of it).
    key : str
        The metric (required).
    low, high : float, optional
        Least and greatest value accepted (default: no bound).

    Returns
    -------
    float
        The value.

    Raises
    ------
    KeyError
        If the metric is absent.
    ValueError
        If the value is a list, a bool, NaN or infinite, or out of ``[low, high]``.
    """
    value = metrics[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"metric '{key}' = {value!r}: expected a number")
    if not math.isfinite(value):
        raise ValueError(f"metric '{key}' = {value!r}: expected a finite number")
    _check_range(key, value, low, high)
    return float(value)


def _check_range(key: str, value: float, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ValueError(f"metric '{key}' = {value!r}: expected a value in {bounds}")
