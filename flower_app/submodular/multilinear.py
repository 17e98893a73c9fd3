"""The multilinear extension G(x) = E_{R ~ x}[Σ_i f_i(R)] of max-row objectives, exactly.

R ~ x includes each element j independently with probability x_j. For one user with
non-zero values sorted in decreasing order v_1 ≥ v_2 ≥ … (elements j_1, j_2, …) and
q_l = 1 − x_{j_l}:

    E[f_i(R)]            = Σ_p v_p x_{j_p} P_p,           P_p = Π_{l<p} q_l,
    ∂E[f_i(R)]/∂x_{j_p}  = P_p (v_p − T_p),              T_p = Σ_{k>p} v_k x_{j_k} Π_{p<l<k} q_l,

since adding j_p changes f_i only when no better element is in R (probability P_p), and then
from the expected best of the worse ones (T_p) to v_p. For coverage (all v = 1) this is the
familiar ∂_j = Π_{l ≠ j} (1 − x_l). Both recursions run over positions within rows, all rows
at once, so the cost is O(nnz + longest row) numpy operations: fast for thousands of users.

Because G is linear in each coordinate, G(x + η e_j) − G(x) = η ∂_j G(x) whenever
x_j + η ≤ 1: the gradient also gives the exact marginal gains of the amplification surrogate
g(T) = G(x + η 1_T) − G(x) of FedSM Algorithm 3.

:func:`sampled_gradient` is the sampling estimator (FedCG, Appendix C.3) that works from set
evaluations only; tests check it against the closed form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import scipy.sparse as sp

from flower_app.submodular.objectives import MaxRowObjective

__all__ = [
    "RowEntries",
    "SortedRows",
    "check_point",
    "entry_gradients",
    "entry_weights",
    "multilinear_gradient",
    "multilinear_value",
    "sampled_entry_gradients",
    "sampled_gradient",
    "set_gains",
    "sorted_rows",
]


def check_point(x: np.ndarray, n_elements: int) -> np.ndarray:
    """Return ``x`` as float64 after checking it is a point of [0, 1]^m.

    Raises
    ------
    ValueError
        On a wrong shape, non-finite entries or entries outside [0, 1].
    """
    arr = np.asarray(x, dtype=np.float64)
    if arr.shape != (n_elements,):
        raise ValueError(f"x has shape {arr.shape}, expected ({n_elements},)")
    if (
        not np.all(np.isfinite(arr))
        or arr.min(initial=0.0) < -1e-12
        or arr.max(initial=0.0) > 1 + 1e-12
    ):
        raise ValueError("x must be finite with every coordinate in [0, 1]")
    return np.clip(arr, 0.0, 1.0)


class RowEntries(Protocol):
    """Rows' non-zero entries grouped by row, values decreasing within a row."""

    val: np.ndarray
    last: np.ndarray
    by_pos: list[np.ndarray]


@dataclass
class SortedRows:
    """Non-zero entries grouped by row, values decreasing within a row (ties: by column)."""

    row: np.ndarray
    col: np.ndarray
    val: np.ndarray
    first: np.ndarray  # entry is the first of its row
    last: np.ndarray  # entry is the last of its row
    by_pos: list[np.ndarray]  # entry indices at position t of their row, t = 0, 1, …
    order: np.ndarray | None = None  # sorted entry -> index into the CSR data


def _sorted_rows(objective: MaxRowObjective, users: np.ndarray | None) -> SortedRows:
    rows = objective.values if users is None else objective.values[np.asarray(users)]
    return sorted_rows(rows)


def sorted_rows(rows: sp.csr_matrix) -> SortedRows:
    """Return the non-zero entries of ``rows`` grouped by row, values decreasing in a row."""
    counts = np.diff(rows.indptr)
    row = np.repeat(np.arange(rows.shape[0]), counts)
    order = np.lexsort((rows.indices, -rows.data, row))
    row, col, val = row[order], rows.indices[order].astype(np.int64), rows.data[order]
    pos = np.arange(row.size) - np.repeat(rows.indptr[:-1], counts)
    first = pos == 0
    last = np.zeros(row.size, dtype=bool)
    last[np.cumsum(counts[counts > 0]) - 1] = True
    by_pos_order = np.argsort(pos, kind="stable")
    bounds = np.cumsum(np.bincount(pos, minlength=1))[:-1] if pos.size else np.array([], int)
    by_pos = np.split(by_pos_order, bounds) if pos.size else []
    return SortedRows(row, col, val, first, last, by_pos, order)


def _prefix_and_tail(sr: SortedRows, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return P (probability no better element is in R) and T (expected best worse one)."""
    return _prefix_and_tail_xe(sr, x[sr.col])


def _prefix_and_tail_xe(sr: RowEntries, xe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`_prefix_and_tail`, with one inclusion probability per (sorted) entry."""
    q = 1.0 - xe
    prefix = np.ones(sr.val.size)
    for idx in sr.by_pos[1:]:  # position t ≥ 1: the previous entry of the row is idx − 1
        prefix[idx] = prefix[idx - 1] * q[idx - 1]
    tail = np.zeros(sr.val.size)
    for idx in reversed(sr.by_pos):
        inner = idx[~sr.last[idx]]
        nxt = inner + 1
        tail[inner] = xe[nxt] * sr.val[nxt] + q[nxt] * tail[nxt]
    return prefix, tail


def entry_weights(sr: RowEntries, xe: np.ndarray) -> np.ndarray:
    """Return ∂E[f_i(R)]/∂x_j = P_p (v_p − T_p) at every sorted entry (≥ 0).

    Parameters
    ----------
    sr : RowEntries
        The rows' entries (:func:`sorted_rows`, or FedCG's batch of users).
    xe : numpy.ndarray
        The inclusion probability of each entry, in [0, 1]: rows may sit at different
        points (FedCG+'s local iterates, FedSM's amplification surrogate).
    """
    prefix, tail = _prefix_and_tail_xe(sr, xe)
    return prefix * np.maximum(sr.val - tail, 0.0)


def set_gains(row: np.ndarray, val: np.ndarray, in_r: np.ndarray, n_rows: int) -> np.ndarray:
    """Return f_i(R ∪ {j}) − f_i(R ∖ {j}) at every entry (i, j), for one set R per row.

    The sampled estimators' step (the FedCG paper's Appendix C.3): for j ∉ R the gain of
    adding j; for j ∈ R only the row's unique best element of R loses something when
    removed (down to the runner-up).

    Parameters
    ----------
    row, val : numpy.ndarray
        Row index and value of every entry.
    in_r : numpy.ndarray
        bool per entry: its element is in its row's set R.
    n_rows : int
        Number of rows.
    """
    data_in = np.where(in_r, val, 0.0)
    best = np.zeros(n_rows)
    np.maximum.at(best, row, data_in)
    # f(R ∪ j) − f(R) for j ∉ R
    out_gain = np.where(in_r, 0.0, np.maximum(val - best[row], 0.0))
    # f(R) − f(R ∖ j) for j ∈ R: only the row's best element in R, against the runner-up
    is_best = in_r & (data_in == best[row]) & (data_in > 0)
    n_best = np.bincount(row[is_best], minlength=n_rows)
    second = np.zeros(n_rows)
    np.maximum.at(second, row, np.where(is_best, 0.0, data_in))
    in_gain = np.where(is_best & (n_best[row] == 1), data_in - second[row], 0.0)
    return out_gain + in_gain


def multilinear_value(
    objective: MaxRowObjective, x: np.ndarray, users: np.ndarray | None = None
) -> float:
    """Return G(x) = Σ_i E_{R ~ x}[f_i(R)] over the given users (all when None).

    Parameters
    ----------
    objective : MaxRowObjective
        The objective.
    x : numpy.ndarray
        Point of [0, 1]^m.
    users : numpy.ndarray, optional
        Row indices.

    Returns
    -------
    float
        The sum over users (divide by n for the mean-form F).
    """
    x = check_point(x, objective.n_elements)
    sr = _sorted_rows(objective, users)
    if sr.val.size == 0:
        return 0.0
    prefix, _ = _prefix_and_tail(sr, x)
    return float(np.sum(sr.val * x[sr.col] * prefix))


def multilinear_gradient(
    objective: MaxRowObjective, x: np.ndarray, users: np.ndarray | None = None
) -> np.ndarray:
    """Return ∇G(x) = Σ_i ∇E_{R ~ x}[f_i(R)] over the given users, exactly.

    Parameters
    ----------
    objective : MaxRowObjective
        The objective.
    x : numpy.ndarray
        Point of [0, 1]^m.
    users : numpy.ndarray, optional
        Row indices.

    Returns
    -------
    numpy.ndarray
        float64 vector of length m; ∂_j G = E[f(R ∪ {j}) − f(R ∖ {j})] ≥ 0.
    """
    x = check_point(x, objective.n_elements)
    sr = _sorted_rows(objective, users)
    if sr.val.size == 0:
        return np.zeros(objective.n_elements)
    weights = entry_weights(sr, x[sr.col])
    return np.bincount(sr.col, weights=weights, minlength=objective.n_elements)


def sampled_gradient(
    objective: MaxRowObjective,
    x: np.ndarray,
    rng: np.random.Generator,
    samples: int,
    users: np.ndarray | None = None,
) -> np.ndarray:
    """Estimate ∇G(x) from set evaluations: mean over R ~ x of f(R ∪ {j}) − f(R ∖ {j}).

    This is the estimator of Appendix C.3 of the FedCG paper (unbiased for every j); it needs
    only the values of f on sets, so it serves any objective, at the cost of variance.

    Parameters
    ----------
    objective : MaxRowObjective
        The objective.
    x : numpy.ndarray
        Point of [0, 1]^m.
    rng : numpy.random.Generator
        Source of the sets R.
    samples : int
        Number of sets R averaged (≥ 1).
    users : numpy.ndarray, optional
        Row indices.

    Returns
    -------
    numpy.ndarray
        float64 estimate of the gradient (sum over users).
    """
    x = check_point(x, objective.n_elements)
    if samples < 1:
        raise ValueError(f"samples={samples} must be >= 1")
    rows = objective.values if users is None else objective.values[np.asarray(users)]
    counts = np.diff(rows.indptr)
    row = np.repeat(np.arange(rows.shape[0]), counts)
    m = objective.n_elements
    total = np.zeros(m)
    for _ in range(samples):
        in_r = rng.random(m) < x
        gains = set_gains(row, rows.data, in_r[rows.indices], rows.shape[0])
        total += np.bincount(rows.indices, weights=gains, minlength=m)
    return total / samples


def entry_gradients(
    rows: sp.csr_matrix, xe: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return every row's exact partial derivatives, one per non-zero entry.

    Each row is a user of a max-row objective whose own point gives entry ``k`` (in CSR
    order) the inclusion probability ``xe[k]``; rows may thus sit at different points (the
    amplification surrogate of FedSM evaluates one user at several points as several rows).

    Parameters
    ----------
    rows : scipy.sparse.csr_matrix
        Non-negative rows (users × elements).
    xe : numpy.ndarray
        Inclusion probability of each stored entry, aligned with ``rows.data``; in [0, 1].

    Returns
    -------
    tuple of numpy.ndarray
        ``(row, col, weight)`` with weight = ∂ E[f_row(R)] / ∂x_col ≥ 0, grouped by row in
        increasing order (values decreasing within a row).
    """
    xe = np.asarray(xe, dtype=np.float64)
    if xe.shape != (rows.nnz,):
        raise ValueError(f"xe has shape {xe.shape}, expected ({rows.nnz},)")
    sr = sorted_rows(sp.csr_matrix(rows))
    if sr.val.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0)
    return sr.row, sr.col, entry_weights(sr, np.clip(xe[sr.order], 0.0, 1.0))


def sampled_entry_gradients(
    rows: sp.csr_matrix, xe: np.ndarray, uniforms: np.ndarray
) -> np.ndarray:
    """Estimate each entry's partial derivative from sampled sets, row by row.

    The set of sample ``s`` holds entry ``k`` when ``uniforms[k, s] < xe[k]``; the estimate
    of ∂_j is the mean of f(R ∪ {j}) − f(R ∖ {j}) (unbiased, as :func:`sampled_gradient`),
    but each row uses its own uniforms, so users can draw them from their own streams.

    Parameters
    ----------
    rows : scipy.sparse.csr_matrix
        Non-negative rows (users × elements), indices sorted.
    xe : numpy.ndarray
        Inclusion probability of each stored entry, aligned with ``rows.data``.
    uniforms : numpy.ndarray
        ``(nnz, samples)`` uniforms in [0, 1), aligned with ``rows.data``.

    Returns
    -------
    numpy.ndarray
        float64 estimate per stored entry (CSR order).
    """
    nnz = rows.nnz
    if uniforms.ndim != 2 or uniforms.shape[0] != nnz or uniforms.shape[1] < 1:
        raise ValueError(f"uniforms must have shape ({nnz}, samples >= 1)")
    n_rows = rows.shape[0]
    row = np.repeat(np.arange(n_rows), np.diff(rows.indptr))
    total = np.zeros(nnz)
    for s in range(uniforms.shape[1]):
        total += set_gains(row, rows.data, uniforms[:, s] < xe, n_rows)
    return total / uniforms.shape[1]
