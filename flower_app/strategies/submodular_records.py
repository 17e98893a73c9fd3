"""Records and checks shared by the FedCG and discrete-greedy strategies.

Report decoding (fixed-point and float, named or positional arrays), the train messages of
named actions, the ground-set size a reply announces, and the matroid given simply
(``k`` or block ``groups`` with ``capacities``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from logging import WARNING
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

from flower_app.algorithms.fedcg.continuous import matroid_spec
from flower_app.algorithms.fedsm.core import decode_report
from flower_app.strategies.errors import AllRepliesRejectedError
from flower_app.strategies.replies import CheckedReplies
from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid

#: the largest ground set a reply may announce: element ids travel as int32
MAX_ELEMENTS = 2**31 - 1
_INT64_MAX = np.iinfo(np.int64).max

__all__ = [
    "MAX_ELEMENTS",
    "build_matroid",
    "check_common",
    "checkpointed_server",
    "decode_int_report",
    "drop_replies",
    "majority_m",
    "matroid_entries",
    "named_record",
    "positional_record",
    "reply_parts",
    "report_arrays",
    "reported_n_elements",
    "resolve_m",
    "train_message",
]


def decode_int_report(arrays: list[np.ndarray], n_elements: int) -> np.ndarray:
    """Decode a fixed-point report (``[index, value]`` or ``[value]``, integer values).

    Parameters
    ----------
    arrays : list of numpy.ndarray
        The reply's arrays.
    n_elements : int
        Ground-set size m.

    Returns
    -------
    numpy.ndarray
        Dense int64 vector of length m.

    Raises
    ------
    ValueError
        On wrong shapes or dtypes, ids out of range or repeated, or negative values.
    """
    if any(np.asarray(a).dtype.kind not in "iu" for a in arrays):
        raise ValueError("report values must be fixed-point integers")
    big = [a for a in map(np.asarray, arrays) if a.dtype.kind == "u" and a.size]
    if any(a.max() > _INT64_MAX for a in big):
        raise ValueError("report values must fit in int64")
    decode_report(arrays, n_elements)  # shapes, ids and signs
    if len(arrays) == 1:
        return np.asarray(arrays[0]).astype(np.int64)
    out = np.zeros(n_elements, dtype=np.int64)
    out[np.asarray(arrays[0]).astype(np.int64)] = np.asarray(arrays[1]).astype(np.int64)
    return out


def report_arrays(record: ArrayRecord) -> list[np.ndarray]:
    """Return a report's arrays in order: named (``"ids"``, ``"values"``) or positional.

    Parameters
    ----------
    record : ArrayRecord
        A plain-mode reply (``"values"``, optionally with ``"ids"``) or a cohort-mode one
        (``"0"``, ``"1"``).

    Returns
    -------
    list of numpy.ndarray
        ``[ids, values]`` (sparse) or ``[values]`` (dense).

    Raises
    ------
    ValueError
        On unexpected keys.
    """
    keys = set(record)
    if "values" in keys:
        if not keys <= {"ids", "values"}:
            raise ValueError(f"report has keys {sorted(keys)}; expected 'values' (+ 'ids')")
        names = ["ids", "values"] if "ids" in keys else ["values"]
        return [record[k].numpy() for k in names]
    if keys and keys != {str(i) for i in range(len(keys))}:
        raise ValueError(f"report has keys {sorted(keys)}; expected 'values' (+ 'ids')")
    return record.to_numpy_ndarrays()


def named_record(**arrays: np.ndarray | None) -> ArrayRecord:
    """Return an ArrayRecord of the given named arrays (None entries left out)."""
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items() if v is not None})


def positional_record(*arrays: np.ndarray) -> ArrayRecord:
    """Return an ArrayRecord of the arrays under keys ``"0"``, ``"1"``, ... (cohorts)."""
    return ArrayRecord([np.asarray(a) for a in arrays])


def train_message(node: int, arrays: ArrayRecord, config: ConfigRecord, action: str) -> Message:
    """Return a ``train.<action>`` message to ``node`` (group id: the server round)."""
    content = RecordDict({"arrays": arrays, "config": config})
    return Message(
        content,
        dst_node_id=int(node),
        message_type=f"{MessageType.TRAIN}.{action}",
        group_id=str(config.get("server-round", action)),
    )


def reply_parts(reply: Message) -> tuple[ArrayRecord, MetricRecord, int]:
    """Return a reply's ``"arrays"``, ``"metrics"`` (empty if absent) and its bytes."""
    record = reply.content.array_records.get("arrays", ArrayRecord())
    metrics = reply.content.metric_records.get("metrics", MetricRecord())
    return record, metrics, int(record.count_bytes())


def reported_n_elements(metrics: MetricRecord) -> int:
    """Return the ground-set size m a plain-mode reply announces (metric ``n-elements``)."""
    m = metrics.get("n-elements")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1 or m > MAX_ELEMENTS:
        raise ValueError(
            f"metric 'n-elements' = {m!r}: expected the client's ground-set size "
            f"(1..{MAX_ELEMENTS}: element ids travel as int32)"
        )
    return m


def majority_m(checked: CheckedReplies, m_of: Callable[[Any], int]) -> int:
    """Return the most common m among accepted replies (ties: the smaller), warning on a split."""
    counts = Counter(m_of(value) for _, value in checked.accepted)
    best = max(counts.values())
    m = min(k for k, c in counts.items() if c == best)
    if len(counts) > 1:
        log(WARNING, "nodes report different ground sets %s; using m=%d", dict(counts), m)
    return m


def drop_replies(
    checked: CheckedReplies, keep: Callable[[int, Any], str | None], context: str
) -> None:
    """Leave out accepted replies for which ``keep`` returns a reason; fail if none stays."""
    accepted = []
    for src, value in checked.accepted:
        reason = keep(src, value)
        if reason is None:
            accepted.append((src, value))
            continue
        checked.bad += 1
        checked.failed[int(src)] = reason
        checked.first_error = checked.first_error or f"node {src}: {reason}"
        log(WARNING, "%s: reply of node %s left out: %s", context, src, reason)
    checked.accepted = accepted
    if not accepted:
        raise AllRepliesRejectedError(
            f"{context}: all replies were rejected; first: {checked.first_error}"
        )


def resolve_m(checked: CheckedReplies, m_of: Callable[[Any], int], what: str, context: str) -> int:
    """Fix the ground-set size m by the replies' majority; leave out the others; decode.

    Each accepted value is a tuple whose first item is an undecoded report and from which
    ``m_of`` reads the m it announces. The replies announcing another m are left out
    ("``what`` for m=…; the run has m=…"), the others' reports decoded
    (:func:`~flower_app.algorithms.fedsm.core.decode_report`) in place.

    Returns
    -------
    int
        m.
    """
    m = majority_m(checked, m_of)
    drop_replies(
        checked,
        lambda _, value: (
            None if m_of(value) == m else f"{what} for m={m_of(value)}; the run has m={m}"
        ),
        context,
    )
    checked.accepted = [
        (src, (decode_report(value[0], m), *value[1:])) for src, value in checked.accepted
    ]
    return m


def build_matroid(
    n_elements: int,
    k: int,
    groups: Sequence[int] | np.ndarray | None = None,
    capacities: int | Sequence[int] | Mapping[int, int] | None = None,
) -> Matroid:
    """Build the constraint from simple arguments.

    Parameters
    ----------
    n_elements : int
        Ground-set size m.
    k : int
        Cardinality bound (a uniform matroid) when ``groups`` is None.
    groups : sequence of int, optional
        Block of every element (length m): a partition matroid.
    capacities : int, sequence or mapping, optional
        Per-block capacities (one int for all, a list by block, or ``{block: capacity}``;
        blocks missing from a mapping get 0); default ``k`` per block.

    Returns
    -------
    Matroid
        ``UniformMatroid(m, k)`` or ``PartitionMatroid(groups, capacities)``.
    """
    if groups is None:
        return UniformMatroid(int(n_elements), int(k))
    g = np.asarray(groups, dtype=np.int64)
    if g.shape != (int(n_elements),):
        raise ValueError(f"groups has {g.size} entries; the ground set has {n_elements}")
    caps: Any = int(k) if capacities is None else capacities
    if isinstance(caps, Mapping):
        dense = np.zeros(int(g.max()) + 1, dtype=np.int64)
        for block, cap in caps.items():
            dense[int(block)] = int(cap)
        caps = dense
    return PartitionMatroid(g, caps)


def matroid_entries(matroid: Matroid) -> tuple[dict[str, Any], dict[str, np.ndarray | None]]:
    """Return the config entries and arrays that describe ``matroid`` to plain-mode clients."""
    k, groups, caps = matroid_spec(matroid)
    return {"matroid-k": k}, {"matroid-groups": groups, "matroid-capacities": caps}


def check_common(k: int, seed: int, min_available_nodes: int) -> None:
    """Check the constructor arguments the FedCG and discrete-greedy strategies share.

    Raises
    ------
    ValueError
        Naming the argument and what it must be.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative int")
    if min_available_nodes < 1:
        raise ValueError(f"min_available_nodes={min_available_nodes} must be at least 1")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be a positive int")


def checkpointed_server(
    state: Any, cls: type, current: Any, what: str, names: str, sizes: Callable[[Any], tuple]
) -> Any:
    """Return the server state of a checkpoint ``{"server": cls}`` of this same instance.

    Parameters
    ----------
    state : Any
        What the checkpoint holds.
    cls : type
        The server state's class.
    current : object
        This run's server state (built by ``setup``).
    what : str
        The algorithm, for the error message.
    names : str
        The sizes compared, for the error message (e.g. ``"(m, n, T)"``).
    sizes : callable
        ``sizes(server) -> tuple``: what must match between the checkpoint and this run.

    Raises
    ------
    TypeError
        If the checkpoint does not hold a ``cls``.
    ValueError
        If its sizes differ from this run's.
    """
    server = state.get("server") if isinstance(state, dict) else None
    if not isinstance(server, cls):
        raise TypeError(f"a {what} checkpoint holds {{'server': {cls.__name__}}}")
    mine, theirs = sizes(current), sizes(server)
    if mine != theirs:
        raise ValueError(f"checkpoint {names} = {theirs} does not match this run's {mine}")
    return server
