"""The rows of a run: each round's failed nodes, the run's failure summary, the log's ETA.

Node failures (deployment): a node that dies mid-run gets an error reply *from the
SuperLink* ("node unavailable", after the round timeout or Flower's offline detection); the
loop attributes it to the node it was sent to (by ``reply_to_message_id``), counts it once,
and records every failed node with Flower's reason in the round's row (``failed-nodes``,
``users-missing``); :func:`failure_summary` says whether the run was degraded.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import WARNING
from typing import Any

from flwr.common import log

__all__ = ["eta", "failed_nodes", "failure_summary", "warn_fixed_length"]


def failed_nodes(
    skipped: Mapping[int, tuple[int, str]],
    failed: Mapping[int, str],
    users: Mapping[int, int],
) -> list[dict[str, Any]]:
    """Return a round's ``failed-nodes`` entries: node id, users it stood for, reason.

    Parameters
    ----------
    skipped : mapping of int to (int, str)
        Nodes not sent to (offline), with their users and the reason.
    failed : mapping of int to str
        Nodes whose reply was left out or did not come, with the reason.
    users : mapping of int to int
        The users each node in ``failed`` stood for.
    """
    out = [
        {"node-id": int(n), "users": int(count), "reason": reason}
        for n, (count, reason) in sorted(skipped.items())
    ]
    out += [
        {"node-id": int(n), "users": int(users[n]), "reason": reason}
        for n, reason in sorted(failed.items())
    ]
    return out


def failure_summary(failures: list[dict[str, Any]]) -> dict[str, Any]:
    """Return what a run lost to node failures, for ``summary.json``.

    Parameters
    ----------
    failures : list of dict
        One entry per degraded round: ``server-round``, ``failed-nodes``,
        ``users-missing``.

    Returns
    -------
    dict
        ``degraded`` (bool), ``rounds-degraded`` (rounds with a failed node),
        ``nodes-failed`` (distinct node ids), ``users-missing`` (sum over rounds) and
        ``first-failure`` (round, node and Flower's reason), or ``None`` values when
        nothing failed.
    """
    nodes = sorted({int(f["node-id"]) for r in failures for f in r["failed-nodes"]})
    first = None
    if failures:
        r = failures[0]
        first = {"server-round": r["server-round"], **r["failed-nodes"][0]}
    return {
        "degraded": bool(failures),
        "rounds-degraded": [int(r["server-round"]) for r in failures],
        "nodes-failed": nodes,
        "users-missing": int(sum(r["users-missing"] for r in failures)),
        "first-failure": first,
    }


def eta(history: list[dict[str, Any]], t: int, total: int) -> str:
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
