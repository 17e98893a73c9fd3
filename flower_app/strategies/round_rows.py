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

from flower_app.privacy.refusals import refusal_rule

__all__ = ["eta", "failed_nodes", "failure_summary", "node_privacy_row", "warn_fixed_length"]


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
    for entry in out:  # a node's own refusal names its rule (e.g. privacy-budget)
        rule = refusal_rule(entry["reason"])
        if rule is not None:
            entry["refused"] = rule
    return out


def node_privacy_row(row: dict[str, Any], figures: Mapping[int, Mapping[str, Any]]) -> None:
    """Put the nodes' own privacy figures (their ledgers' last reports) into a round's row.

    ``dp-epsilon-nodes`` is the largest ε a node reported for one of its users;
    ``dp-epsilon`` (against the server) becomes the larger of that and the strategy's own
    figure, so that the run reports what the nodes verified; ``dp-budget-stopped`` lists
    the nodes that refused the round because their privacy budget is spent.
    """
    stopped = [
        f["node-id"] for f in row.get("failed-nodes", []) if f.get("refused") == "privacy-budget"
    ]
    if stopped:
        row["dp-budget-stopped"] = stopped
        log(WARNING, "round %s: nodes %s refused: their privacy budget is spent",
            row.get("server-round"), stopped)  # fmt: skip
    if not figures:
        return
    worst = max(float(v.get("dp-epsilon", 0.0)) for v in figures.values())
    row["dp-epsilon-nodes"] = worst
    row["dp-delta-nodes"] = max(float(v.get("dp-delta", 0.0)) for v in figures.values())
    row["dp-epsilon"] = max(float(row.get("dp-epsilon", 0.0)), worst)


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
        nothing failed; ``nodes-refused`` (node id -> the rule it refused by, e.g.
        ``privacy-budget``: a node whose own privacy budget is spent stops answering).
    """
    nodes = sorted({int(f["node-id"]) for r in failures for f in r["failed-nodes"]})
    refused = {
        int(f["node-id"]): str(f["refused"])
        for r in failures for f in r["failed-nodes"] if "refused" in f
    }  # fmt: skip
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
        "nodes-refused": {str(n): rule for n, rule in sorted(refused.items())},
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
