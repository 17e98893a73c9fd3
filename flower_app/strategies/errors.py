"""The errors the strategies raise, importable without the loop that raises them."""

from __future__ import annotations

__all__ = [
    "AllRepliesRejectedError",
    "InitialArraysError",
    "MissingHandlerError",
    "NotEnoughNodesError",
    "TooFewRepliesError",
]


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
