"""One answer per question: what a node keeps so that a repeated question learns nothing new.

A server that may ask the same question again can average fresh noise away (K repeated
sessions leave the noise of one reply shrinking like 1/√K) or, without noise, subtract two
sums that differ by one node. So a node answers each *question* once, keeps that answer
(with its noise) while the question is open, and takes part in at most one unmasked sum
for it:

* **The same question** is the same message type (``train``, ``query.cohort``, ...) and the
  same content: every array, metric and configuration value of the request, except the
  labels that do not change what is asked: the secure-aggregation record (session,
  announced nodes, keys), ``server-round`` and ``secure-aggregation`` in ``"config"``. What
  that means per family (the model, S or x sent; the users sampled on the node; the DP
  parameters) is in docs/privacy.md.
* **Open**: the node computed its answer for a session that has not been unmasked. A rerun
  of the question (a new session after another node dropped out) is answered from the kept
  answer under fresh masks, only if the rerun's announced nodes are a subset of the last
  session's and its encoding (fractional bits, public metrics, transform) is the same.
* **Closed**: the node unmasked a session of the question, answered it in the clear, or
  refused it; or a new question began while it was open (its answer is dropped). A closed
  question is refused (rule ``asked-before``), never answered with a fresh draw.

Why the subset rule: every session of one question then has a node set nested in or
disjoint from every other's; with each node unmasking one session per question and a
connected ring (:mod:`flower_app.privacy.topology`), the sums a server can open for one
question are over disjoint groups of at least three nodes, never a single node's answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from flower_app.privacy.refusals import SecureAggregationRefusedError

__all__ = ["QUESTION_LABELS", "QuestionBook", "question_digest"]

#: the node's record of its questions in its Context
QUESTIONS_RECORD = "secagg-questions"
#: configuration entries that label a request without changing what it asks
QUESTION_LABELS = frozenset({"server-round", "secure-aggregation"})
#: the record that carries the secure-aggregation protocol (a label as a whole)
_PROTOCOL_RECORD = "secagg"


def question_digest(message_type: str, content: RecordDict) -> bytes:
    """Return the SHA-256 identity of the question a request asks (see the module docstring)."""
    h = hashlib.sha256(b"flower_app question v1|")
    h.update(repr(str(message_type)).encode())
    for name, record in sorted(content.items()):
        if name == _PROTOCOL_RECORD:
            continue
        h.update(repr((name, type(record).__name__)).encode())
        if isinstance(record, ArrayRecord):
            for key, arr in record.items():
                h.update(repr((key, arr.dtype, tuple(arr.shape))).encode())
                h.update(arr.data)
        else:
            items = record.items()
            if name == "config" and isinstance(record, ConfigRecord):
                items = ((k, v) for k, v in items if k not in QUESTION_LABELS)
            h.update(repr(sorted(items)).encode())
    return h.digest()


class QuestionBook:
    """The questions a node has answered in this run, kept in its Context.

    ``closed``: digests of questions never to be answered again; ``open``: the digest of
    the question whose answer is kept for reruns (or empty), with the announced nodes of
    its last session and the digest of its encoding.
    """

    def __init__(self, context: Context) -> None:
        self.context = context
        rec = context.state.get(QUESTIONS_RECORD)
        data: dict[str, Any] = dict(rec) if isinstance(rec, ConfigRecord) else {}
        self.closed: set[bytes] = {bytes(d) for d in data.get("closed", [])}
        self.open: bytes = bytes(data.get("open", b""))
        self.announced: set[int] = {int(n) for n in data.get("announced", [])}
        self.encoding: bytes = bytes(data.get("encoding", b""))

    def save(self) -> None:
        """Write the book back to the node's Context."""
        self.context.state[QUESTIONS_RECORD] = ConfigRecord(
            {
                "closed": sorted(self.closed),
                "open": self.open,
                "announced": [str(n) for n in sorted(self.announced)],
                "encoding": self.encoding,
            }
        )

    def admit(self, question: bytes, announced: Iterable[int] | None, encoding: bytes) -> bool:
        """Check a request against the book; return True if it reruns the open question.

        Parameters
        ----------
        question : bytes
            :func:`question_digest` of the request.
        announced : iterable of int or None
            The session's announced nodes (None: a request answered in the clear).
        encoding : bytes
            Digest of how the answer is encoded (fractional bits, public metrics,
            transform); empty in the clear.

        Raises
        ------
        SecureAggregationRefusedError
            (rule ``asked-before``) for a closed question, or a rerun whose nodes are not a
            subset of the last session's or whose encoding differs.
        """
        if question in self.closed:
            raise SecureAggregationRefusedError(
                "this node answered (or refused) this question before and answers each "
                "question once (the round number does not make it a new one)",
                rule="asked-before",
            )
        if question != self.open:
            return False
        nodes = set() if announced is None else {int(n) for n in announced}
        if announced is None or not nodes <= self.announced or encoding != self.encoding:
            raise SecureAggregationRefusedError(
                "a rerun of an open question may only leave nodes out of its last session, "
                "with the same encoding",
                rule="asked-before",
            )
        self.announced = nodes
        return True

    def begin(self, question: bytes, announced: Iterable[int] | None, encoding: bytes) -> None:
        """Start answering a new question: the open one (if any) is closed, its answer dropped."""
        if self.open:
            self.closed.add(self.open)
        if announced is None:  # answered in the clear: closed once answered
            self.open, self.announced, self.encoding = b"", set(), b""
            self.closed.add(question)
            return
        self.open = question
        self.announced = {int(n) for n in announced}
        self.encoding = encoding

    def close(self, question: bytes) -> None:
        """Close a question (unmasked, refused or answered in the clear)."""
        self.closed.add(question)
        if question == self.open:
            self.open, self.announced, self.encoding = b"", set(), b""
