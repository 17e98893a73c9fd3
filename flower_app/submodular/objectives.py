"""Decomposable submodular objectives F(S) = (1/n) Σ_i f_i(S) with one sparse row per user.

Both objectives of the papers are *max-row* functions: user i holds a sparse non-negative
row r_i over the ground set E and

    f_i(S) = max_{j ∈ S} r_ij          (0 when S ∩ supp(r_i) = ∅).

Facility location (MovieLens) uses the ratings as r_i; maximum coverage (DBLP) is the same
function with 0/1 rows, since max_{j ∈ S} 1[j ∈ G_i] = 1 exactly when S meets G_i. Every
f_i is monotone and submodular, and so is their mean.

The marginal gain of e given S is f_i(e | S) = max(0, r_ie − c_i) with c_i = f_i(S), the
user's current best value. All gains are computed from the CSR data at once, so a full
gain vector costs O(nnz) and never touches the n × m dense matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["FacilityLocation", "MaxCoverage", "MaxRowObjective"]


class MaxRowObjective:
    """Mean over users of f_i(S) = max_{j ∈ S} r_ij for a sparse non-negative matrix.

    Parameters
    ----------
    values : scipy.sparse.csr_matrix
        Users × elements matrix of non-negative values (rows = users = clients). Explicit
        zeros are dropped; indices are sorted.
    name : str, optional
        Label used in logs and result files.

    Notes
    -----
    ``value`` and ``gains`` return sums over the given users (Σ_i, not the mean), so that a
    node can report the sum over its cohort and the server divides by n once; the mean
    objective is ``value(S) / n_users``.
    """

    def __init__(self, values: sp.spmatrix, name: str = "max-row") -> None:
        csr = sp.csr_matrix(values, dtype=np.float64, copy=True)
        csr.eliminate_zeros()
        csr.sort_indices()
        if csr.nnz and (not np.all(np.isfinite(csr.data)) or csr.data.min() < 0):
            raise ValueError(f"{name}: values must be finite and non-negative")
        self.values: sp.csr_matrix = csr
        self.name = name
        self._csc: sp.csc_matrix | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def n_users(self) -> int:
        """Number of users (rows)."""
        return int(self.values.shape[0])

    @property
    def n_elements(self) -> int:
        """Size m of the ground set (columns)."""
        return int(self.values.shape[1])

    @property
    def max_singleton(self) -> float:
        """λ = max_{e,i} f_i({e}), the largest single value (the papers' λ)."""
        return float(self.values.data.max()) if self.values.nnz else 0.0

    def _rows(self, users: np.ndarray | None) -> sp.csr_matrix:
        """Return the rows of ``users`` (all rows, not a copy, when they are 0..n−1 in order).

        The result is only read: callers never modify it.
        """
        if users is None:
            return self.values
        users = np.asarray(users, dtype=np.int64)
        if users.shape == (self.n_users,) and np.array_equal(users, np.arange(self.n_users)):
            return self.values
        return self.values[users]

    def _csc_matrix(self) -> sp.csc_matrix:
        if self._csc is None:
            self._csc = self.values.tocsc()
            self._csc.sort_indices()
        return self._csc

    def _column(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        csc = self._csc_matrix()
        start, stop = csc.indptr[e], csc.indptr[e + 1]
        return csc.indices[start:stop], csc.data[start:stop]

    # ------------------------------------------------------------------ state
    def user_values(self, selected: Sequence[int], users: np.ndarray | None = None) -> np.ndarray:
        """Return f_i(S) for each user (all users when ``users`` is None).

        Parameters
        ----------
        selected : sequence of int
            The set S (element indices).
        users : numpy.ndarray, optional
            Row indices of the users to evaluate.

        Returns
        -------
        numpy.ndarray
            float64 array of length ``len(users)`` (or ``n_users``).
        """
        sel = np.asarray(list(selected), dtype=np.int64)
        if sel.size and (sel.min() < 0 or sel.max() >= self.n_elements):
            raise IndexError(f"{self.name}: element index out of range 0..{self.n_elements - 1}")
        indptr = self.values.indptr
        if users is None:
            row_nnz = self.values.nnz
        else:
            users = np.asarray(users, dtype=np.int64)
            row_nnz = int((indptr[users + 1] - indptr[users]).sum())
        if sel.size:
            # S's columns hold fewer entries than the users' rows: take the maxima column by
            # column (the same maxima: max is exact, whichever order the entries come in)
            col_ptr = self._csc_matrix().indptr
            col_nnz = int((col_ptr[sel + 1] - col_ptr[sel]).sum())
            if col_nnz + self.n_users < row_nnz:
                return self._user_values_by_column(sel, users)
        rows = self._rows(users)
        mask = np.zeros(self.n_elements, dtype=bool)
        mask[sel] = True
        data = np.where(mask[rows.indices], rows.data, 0.0)
        out = np.zeros(rows.shape[0])
        nnz_rows = np.flatnonzero(np.diff(rows.indptr))
        if nnz_rows.size:
            out[nnz_rows] = np.maximum.reduceat(data, rows.indptr[nnz_rows])
        return out

    def _user_values_by_column(self, sel: np.ndarray, users: np.ndarray | None) -> np.ndarray:
        """:meth:`user_values` from the columns of S (CSC), in O(Σ_{e ∈ S} nnz(e) + n)."""
        csc = self._csc_matrix()
        starts, stops = csc.indptr[sel], csc.indptr[sel + 1]
        lengths = stops - starts
        offsets = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
        entries = offsets + np.arange(int(lengths.sum()))
        best = np.zeros(self.n_users)
        np.maximum.at(best, csc.indices[entries], csc.data[entries])
        return best if users is None else best[users]

    def value(self, selected: Sequence[int], users: np.ndarray | None = None) -> float:
        """Return Σ_i f_i(S) over the given users (all users when None)."""
        return float(self.user_values(selected, users).sum())

    def mean_value(self, selected: Sequence[int]) -> float:
        """Return F(S) = (1/n) Σ_i f_i(S)."""
        return self.value(selected) / max(self.n_users, 1)

    def update_current(self, current: np.ndarray, e: int) -> np.ndarray:
        """Return the users' best values after adding element ``e`` (all users).

        Parameters
        ----------
        current : numpy.ndarray
            f_i(S) for all users.
        e : int
            Element added to S.

        Returns
        -------
        numpy.ndarray
            f_i(S ∪ {e}) for all users (a new array).
        """
        rows, vals = self._column(int(e))
        out = current.copy()
        out[rows] = np.maximum(out[rows], vals)
        return out

    # ------------------------------------------------------------------ gains
    def gains(self, current: np.ndarray, users: np.ndarray | None = None) -> np.ndarray:
        """Return Σ_i f_i(e | S) for every element e, over the given users.

        Parameters
        ----------
        current : numpy.ndarray
            f_i(S) of the given users (same order as ``users``; all users when None).
        users : numpy.ndarray, optional
            Row indices of the users.

        Returns
        -------
        numpy.ndarray
            float64 vector of length ``n_elements``; elements of S have gain 0.
        """
        rows = self._rows(users)
        per_entry = rows.data - np.repeat(current, np.diff(rows.indptr))
        np.maximum(per_entry, 0.0, out=per_entry)
        return np.bincount(rows.indices, weights=per_entry, minlength=self.n_elements)

    def positive_gain_entries(
        self, current: np.ndarray, users: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return the (user position, element, gain) triples with f_i(e | S) > 0.

        Parameters
        ----------
        current : numpy.ndarray
            f_i(S) of the given users.
        users : numpy.ndarray
            Row indices of the users.

        Returns
        -------
        tuple of numpy.ndarray
            ``(pos, element, gain)`` where ``pos`` indexes into ``users``; grouped by user in
            increasing position, elements increasing within a user.
        """
        rows = self._rows(users)
        counts = np.diff(rows.indptr)
        pos = np.repeat(np.arange(rows.shape[0]), counts)
        gain = rows.data - np.repeat(current, counts)
        keep = gain > 0
        return pos[keep], rows.indices[keep].astype(np.int64), gain[keep]


class FacilityLocation(MaxRowObjective):
    """Facility location: f_i(S) = max_{j ∈ S} r_ij, r_ij ≥ 0 the user's rating of item j.

    Parameters
    ----------
    values : scipy.sparse.csr_matrix
        Users × items ratings (0 = unrated).
    name : str, optional
        Label for logs, default ``"facility-location"``.
    """

    def __init__(self, values: sp.spmatrix, name: str = "facility-location") -> None:
        super().__init__(values, name=name)


class MaxCoverage(MaxRowObjective):
    """Maximum coverage: f_i(S) = 1 if S meets user i's set G_i, else 0.

    Parameters
    ----------
    membership : scipy.sparse.csr_matrix
        Users × elements 0/1 matrix; row i is the indicator of G_i (e.g. the venues of
        researcher i).
    name : str, optional
        Label for logs, default ``"max-coverage"``.

    Raises
    ------
    ValueError
        If an entry is not 0 or 1.
    """

    def __init__(self, membership: sp.spmatrix, name: str = "max-coverage") -> None:
        super().__init__(membership, name=name)
        if self.values.nnz and not np.all(self.values.data == 1.0):
            raise ValueError(f"{name}: a coverage membership matrix must contain only 0 and 1")
