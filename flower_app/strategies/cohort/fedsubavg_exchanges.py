"""FedSubAvg's exchanges over cohorts: a node serves many users (the reproductions').

Message builders and reply decoders of
:class:`~flower_app.strategies.cohort.fedsubavg.FedSubAvgCohorts`: the counting round's
reports (``query.feature_heat``), the sampled users' index sets S(i) (``query.submodel``,
Algorithm 1 line 5) and the nodes' summed row updates (``train``). The nodes answer with
:class:`~flower_app.clients.submodel.SubmodelClient`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from flower_app.algorithms.fedsubavg.core import FeatureHeat, RoundUpdate
from flower_app.strategies.replies import int_metric

__all__ = [
    "HEAT_TRAIN",
    "SUBMODEL_QUERY",
    "BadReplyError",
    "add_heat_report",
    "decode_index_sets",
    "decode_update",
    "index_set_messages",
]

#: the counting round under secure aggregation (dense counts, summed unseen)
HEAT_TRAIN = f"{MessageType.TRAIN}.feature_heat"
#: the sampled users' index sets
SUBMODEL_QUERY = f"{MessageType.QUERY}.submodel"


class BadReplyError(ValueError):
    """A node's reply that is left out of the aggregate."""


def config_ints(record: Any, key: str) -> np.ndarray:
    """Return ``record[key]``, a list of integers in a reply's ConfigRecord, as int64.

    Raises
    ------
    BadReplyError
        If the entry is missing or is not a list of integers that fit in int64 (a float,
        bool, string, scalar or nested value is refused, never rounded).
    """
    if key not in record:
        raise BadReplyError(f"the reply lacks '{key}'")
    value = record[key]
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise BadReplyError(f"'{key}' must be a list of integers, got {type(value).__name__}")
    try:
        return np.asarray(value, dtype=np.int64).reshape(-1)
    except OverflowError as err:
        raise BadReplyError(f"'{key}' holds an integer outside int64") from err


def config_count(record: Any, key: str) -> int:
    """Return ``record[key]``, a non-negative integer count in a reply's ConfigRecord.

    Raises
    ------
    BadReplyError
        If the entry is missing, not an integer, or negative.
    """
    value = record.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadReplyError(f"'{key}' must be a non-negative integer, got {value!r}")
    return value


def add_heat_report(heat: FeatureHeat, reply: Message) -> None:
    """Add a cohort node's heat report (``"properties"`` ConfigRecord) to ``heat``.

    Raises
    ------
    BadReplyError
        On a missing record or entry, non-integer values, or (from ``FeatureHeat.add``)
        lengths that differ, rows out of range or repeated, or negative counts; ``heat`` is
        unchanged then.
    """
    if "properties" not in reply.content.config_records:
        raise BadReplyError("the heat report lacks its 'properties' ConfigRecord")
    p = reply.content.config_records["properties"]
    parts = [config_ints(p, k) for k in ("rows", "clients", "samples")]
    counts = [config_count(p, k) for k in ("num-users", "num-samples")]
    if (parts[1] > counts[0]).any() or (parts[2] > counts[1]).any():
        raise BadReplyError("a row counts more users or samples than the report covers")
    try:
        heat.add(*parts, *counts)
    except ValueError as err:
        raise BadReplyError(str(err)) from err


def index_set_messages(server_round: int, groups: dict[int, np.ndarray]) -> list[Message]:
    """Return one ``query.submodel`` message per node naming its sampled users."""
    return [
        Message(
            RecordDict(
                {"config": ConfigRecord({"kind": "submodel", "users": users.astype(int).tolist()})}
            ),
            dst_node_id=node_id,
            message_type=SUBMODEL_QUERY,
            group_id=f"submodel-{server_round}",
        )
        for node_id, users in groups.items()
    ]


def decode_index_sets(
    reply: Message, users_sent: np.ndarray, n_params: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(users, offsets, rows)`` of a node's index-set reply, or raise.

    Raises
    ------
    BadReplyError
        On other users than requested, malformed offsets or rows outside 0..M−1.
    """
    if "properties" not in reply.content.config_records:
        raise BadReplyError("the index-set reply lacks its 'properties' ConfigRecord")
    p = reply.content.config_records["properties"]
    users, offsets, rows = (config_ints(p, k) for k in ("users", "offsets", "rows"))
    if not np.array_equal(users, users_sent):
        raise BadReplyError("index sets of other users than requested")
    if (
        offsets.shape != (users.size + 1,)
        or offsets[0] != 0
        or offsets[-1] != rows.size
        or np.any(np.diff(offsets) < 0)
    ):
        raise BadReplyError("malformed offsets")
    if rows.size and (rows.min() < 0 or rows.max() >= n_params):
        raise BadReplyError(f"rows outside 0..{n_params - 1}")
    return users, offsets, rows


def decode_update(
    arrays: list[np.ndarray], allowed_rows: np.ndarray, n_users: int, metrics: dict[str, Any]
) -> RoundUpdate:
    """Check a node's train reply and return it as a :class:`RoundUpdate`.

    Parameters
    ----------
    arrays : list of numpy.ndarray
        ``[rows, sums]`` from the reply.
    allowed_rows : numpy.ndarray
        Sorted union of the submodels of the users sent to this node.
    n_users : int
        Users sent to this node.
    metrics : dict
        The reply's MetricRecord (``num-examples``, ``weight-sum``).

    Returns
    -------
    RoundUpdate
        The node's summed update.

    Raises
    ------
    BadReplyError
        On the wrong number of arrays, wrong shapes or dtypes, rows outside the node's
        submodel (or repeated, or unsorted), non-finite values, or counts that do not
        match what was sent.
    """
    if len(arrays) != 2:
        raise BadReplyError(f"expected 2 arrays [rows, sums], got {len(arrays)}")
    rows, sums = (np.asarray(a) for a in arrays)
    if rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise BadReplyError(f"rows must be a 1-D integer array, got {rows.dtype} {rows.shape}")
    if sums.shape != rows.shape or sums.dtype.kind != "f":
        raise BadReplyError(
            f"sums must be floats shaped like rows {rows.shape}, got {sums.dtype} {sums.shape}"
        )
    rows = rows.astype(np.int64)
    if rows.size > 1 and np.any(np.diff(rows) <= 0):
        raise BadReplyError("rows must be sorted and distinct")
    if not np.all(np.isin(rows, allowed_rows, assume_unique=True)):
        outside = rows[~np.isin(rows, allowed_rows, assume_unique=True)]
        raise BadReplyError(
            f"{outside.size} rows outside the node's submodel (first: {int(outside[0])})"
        )
    if not np.all(np.isfinite(sums)):
        raise BadReplyError("non-finite values in the update")
    n_ex = int_metric(metrics, "num-examples")
    weight = float(metrics["weight-sum"])
    if n_ex != n_users:
        raise BadReplyError(f"update of {n_ex} users, {n_users} were sent")
    if not (np.isfinite(weight) and weight > 0):
        raise BadReplyError(f"weight-sum {weight} must be finite and positive")
    return RoundUpdate(rows, sums.astype(np.float64), n_ex, weight)
