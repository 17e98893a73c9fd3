"""Sorting a round's replies into accepted ones and ones left out (DESIGN principle 6).

Every strategy of this package treats replies the same way: a reply from a node that was
not asked, an error reply, or one its decoder rejects is logged, counted and left out of
the aggregate; a node that was asked and did not reply in time is counted too. Only the
decoding differs, so each strategy passes its own ``decode``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from logging import WARNING
from typing import Generic, TypeVar

from flwr.app import Message
from flwr.common import log

__all__ = ["CheckedReplies", "check_replies"]

T = TypeVar("T")


@dataclass
class CheckedReplies(Generic[T]):
    """The outcome of :func:`check_replies`.

    Attributes
    ----------
    accepted : list of (int, T)
        Node id and decoded content of every valid reply, in arrival order.
    bad : int
        Replies left out: unexpected sender, error reply, or rejected by the decoder.
    missing : int
        Nodes that were asked and did not reply.
    """

    accepted: list[tuple[int, T]] = field(default_factory=list)
    bad: int = 0
    missing: int = 0

    @property
    def left_out(self) -> int:
        """Bad plus missing replies (what the round records as ``bad-replies``)."""
        return self.bad + self.missing


def check_replies(
    replies: Iterable[Message],
    decode: Callable[[int, Message], T],
    expected: Collection[int],
    context: str,
) -> CheckedReplies[T]:
    """Decode the replies of one exchange, leaving out (and counting) the bad ones.

    Parameters
    ----------
    replies : iterable of Message
        What ``grid.send_and_receive`` returned.
    decode : callable
        ``decode(src_node_id, reply) -> T``; raises ``ValueError`` (or ``KeyError`` /
        ``TypeError`` for missing or mistyped records) to reject a reply. Called only on
        replies without an error from nodes in ``expected``.
    expected : collection of int
        The nodes the messages went to.
    context : str
        Prefix of the log lines, e.g. ``"round 3"``.

    Returns
    -------
    CheckedReplies
        Accepted replies with their decoded content, and the counts of the others.
    """
    out: CheckedReplies[T] = CheckedReplies()
    answered: set[int] = set()
    for reply in replies:
        src = int(reply.metadata.src_node_id)
        answered.add(src)
        try:
            if src not in expected:
                raise ValueError("reply from a node that was not sent anything")
            if reply.has_error():
                raise ValueError(f"client error: {reply.error.reason}")
            value = decode(src, reply)
        except (ValueError, KeyError, TypeError) as err:
            out.bad += 1
            log(WARNING, "%s: reply of node %s left out: %s", context, src, err)
            continue
        out.accepted.append((src, value))
    out.missing = len(set(expected) - answered)
    if out.missing:
        log(WARNING, "%s: %d nodes did not reply in time", context, out.missing)
    return out
