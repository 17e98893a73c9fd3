"""Sums of fixed-point reports that refuse to wrap around.

numpy adds int64 arrays modulo 2^64 without a word: a report of 2^63 − 1 on an element
turns that element's sum negative, so a single sender could push any element out of the
greedy's argmax. Every integer sum of reports goes through :func:`checked_int_add`, which
refuses such a report by name (:class:`ReportOverflowError`) and leaves the running total as
it was.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["ReportOverflowError", "checked_int_add", "checked_int_sum"]

_INT64 = np.dtype(np.int64)


class ReportOverflowError(OverflowError):
    """A report, added to the running sum, would leave the int64 range."""


def _as_int64(vector: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(vector)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must be an integer vector, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ReportOverflowError(f"{what} holds a value above 2^63 - 1")
    return arr.astype(np.int64, copy=False)


def checked_int_add(total: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """Return ``total + vector`` in int64, or raise if any entry would wrap around.

    Parameters
    ----------
    total : numpy.ndarray
        The running int64 sum (not modified).
    vector : numpy.ndarray
        One report (integer dtype, same shape).

    Returns
    -------
    numpy.ndarray
        A new int64 array.

    Raises
    ------
    ReportOverflowError
        If an entry of the sum leaves [−2^63, 2^63 − 1] (the report is refused; ``total``
        is unchanged).
    ValueError
        On shapes that differ or a non-integer dtype.
    """
    a = _as_int64(total, "the running sum")
    b = _as_int64(vector, "a report")
    if a.shape != b.shape:
        raise ValueError(f"a report of shape {b.shape} added to a sum of shape {a.shape}")
    with np.errstate(over="ignore"):
        out = a + b
    # two's complement: the sum wrapped iff both terms have one sign and the result the other
    wrapped = ((a ^ out) & (b ^ out)) < 0
    if wrapped.any():
        e = int(np.flatnonzero(wrapped)[0])
        raise ReportOverflowError(
            f"the report's value {int(b[e])} at element {e} takes the sum out of int64"
        )
    return out


def checked_int_sum(vectors: Iterable[np.ndarray], n_elements: int) -> np.ndarray:
    """Return the int64 sum of ``vectors`` (length ``n_elements``), refusing any wrap-around.

    Raises
    ------
    ReportOverflowError
        At the first report whose addition would leave the int64 range.
    """
    total = np.zeros(n_elements, dtype=np.int64)
    for vector in vectors:
        total = checked_int_add(total, vector)
    return total
