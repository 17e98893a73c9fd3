"""What a node says when it refuses: the rule it applied, never a private value.

Flower sends the text of a ClientApp's exception back to the server (``"<class ...>:<'text'>"``).
In a secure or differentially private round that text is a channel around the protocol:
an error that printed the offending value (``|value| up to 0.6306``) told the server a
private loss to four digits. So every refusal a node makes in such a round is a
:class:`NodeRefusedError`, whose text is built from the *rule* it applied and the
*request's* own parameters (session numbers, node ids, record names, sizes the server sent),
and any other exception raised while the node computes its reply (its handler, a reply
transform, the encoding) is replaced by :func:`private_errors` with a fixed text that names
the stage and the exception's type only. The full error stays in the node's own log, for
its operator.

A refusal is still one bit: that the node refused. Where that bit depends on private data
(a value too large to encode, a non-finite loss, rows outside a table), the node limits how
often a server can ask for it: a refused question is never answered again (see
:mod:`flower_app.privacy.questions`), the encoding's range cannot be made smaller than
±2^20 per value, and a node declares its rows to FedSubAvg's heat count once per run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from logging import WARNING

from flwr.common.logger import log

__all__ = [
    "RULES",
    "NodeRefusedError",
    "SecureAggregationRefusedError",
    "private_errors",
    "refusal_rule",
]

#: the rules a node refuses by (the tag in ``[...]`` of every refusal's text)
RULES = {
    "protocol": "the request breaks the secure-aggregation protocol (parameters, stage order, "
    "consistency, keys)",
    "asked-before": "the question was answered (or refused) before: one answer per question",
    "privacy-budget": "answering would take one of the node's users past the node's privacy "
    "budget (node_config dp-max-epsilon)",
    "encoding": "a value of the reply cannot be encoded for a secure sum (non-finite, or "
    "beyond the range the session's parameters allow)",
    "transform": "the reply transform the request names cannot be applied to the node's reply",
    "computation": "the node's own computation of its reply failed (details in the node's log)",
}


class NodeRefusedError(ValueError):
    """A node refuses a request; the text names the rule and public parameters only.

    Parameters
    ----------
    rule : str
        One of :data:`RULES`.
    text : str
        What was refused and why, built from the request's parameters and the node's
        configuration only (never from its data or its reply).
    """

    def __init__(self, rule: str, text: str) -> None:
        if rule not in RULES:
            raise ValueError(f"unknown refusal rule {rule!r}")
        super().__init__(f"node refused [{rule}]: {text}")
        self.rule = rule


class SecureAggregationRefusedError(NodeRefusedError):
    """A node refuses a secure-aggregation request (a lying or broken server).

    Parameters
    ----------
    text : str
        What was refused and why (public values only).
    rule : str, optional
        One of :data:`RULES` (default ``"protocol"``).
    """

    def __init__(self, text: str, rule: str = "protocol") -> None:
        super().__init__(rule, f"secure aggregation refused: {text}")


def refusal_rule(reason: str) -> str | None:
    """Return the rule tag of a refusal's text as the server receives it, or None."""
    start = reason.find("node refused [")
    if start < 0:
        return None
    end = reason.find("]", start)
    rule = reason[start + len("node refused [") : end]
    return rule if rule in RULES else None


@contextmanager
def private_errors(stage: str) -> Iterator[None]:
    """Run code that reads the node's private data; let no private value out in an error.

    A :class:`NodeRefusedError` passes unchanged (its text holds public values only); any
    other exception is logged in full on the node and replaced by a
    :class:`NodeRefusedError` (rule ``computation``) naming ``stage`` and the exception's type.
    """
    try:
        yield
    except NodeRefusedError:
        raise
    except Exception as err:  # noqa: BLE001 - any error text may carry a private value
        log(WARNING, "%s failed on this node (kept in this log, not sent): %r", stage, err,
            exc_info=err)  # fmt: skip
        raise NodeRefusedError(
            "computation",
            f"{stage} failed on the node ({type(err).__name__}); the node's log has the details",
        ) from None
