"""The two matrix shapes the submodular tasks consume.

:class:`RatingsMatrix` (users x elements, ratings as values) feeds facility location;
:class:`VenueSets` (researchers x venues, 0/1) feeds max coverage. Both are frozen dataclasses
that validate their shapes and sparse formats on construction, so a task can trust them.
The arrays are shared, not copied: treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["RatingsMatrix", "VenueSets"]


def _is_str_array(array: np.ndarray) -> bool:
    """Return whether ``array`` holds strings (fixed-width, variable-width or str objects)."""
    if array.dtype.kind in "UT":
        return True
    if array.dtype.kind == "O":
        return all(isinstance(item, str) for item in array.flat)
    return False


def _check_csr(name: str, matrix: object) -> sp.csr_matrix:
    """Raise ``ValueError`` unless ``matrix`` is a canonical float64 CSR matrix; return it."""
    if not sp.issparse(matrix) or matrix.format != "csr":
        raise ValueError(f"{name} must be a scipy.sparse CSR matrix, got {type(matrix).__name__}")
    if matrix.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {matrix.shape}")
    if matrix.dtype != np.float64:
        raise ValueError(f"{name} must have dtype float64, got {matrix.dtype}")
    if not matrix.has_canonical_format:
        raise ValueError(
            f"{name} must have sorted column indices and no duplicate entries "
            "(call .sum_duplicates() first)"
        )
    return matrix


def _check_vector(
    owner: str, name: str, array: object, length: int, *, kind: str, axis: str
) -> None:
    """Raise ``ValueError`` unless ``array`` is a 1-D array of ``length`` with the right kind.

    ``kind`` is ``"int64"``, ``"str"`` or ``"int64|str"``.
    """
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{owner}.{name} must be a numpy array, got {type(array).__name__}")
    if array.ndim != 1 or len(array) != length:
        raise ValueError(
            f"{owner}.{name} must have one entry per {axis} ({length}), got shape {array.shape}"
        )
    ok_int = "int64" in kind and array.dtype == np.int64
    ok_str = "str" in kind and _is_str_array(array)
    if not (ok_int or ok_str):
        raise ValueError(f"{owner}.{name} must be of type {kind}, got dtype {array.dtype}")


@dataclass(frozen=True, eq=False)
class RatingsMatrix:
    """Users x elements ratings for facility location, ``f_u(S) = max_{j in S} r_uj``.

    Parameters
    ----------
    values : scipy.sparse.csr_matrix
        ``n_users x n_elements`` float64 CSR matrix in canonical format (sorted indices, no
        duplicates). Its explicit entries are the ratings, all ``> 0``; a missing entry means
        "not rated" and counts as 0 in the objective. No explicit zeros.
    user_ids : numpy.ndarray
        int64, the original user id of each row.
    element_ids : numpy.ndarray
        int64, the original element (e.g. movie) id of each column.
    element_groups : numpy.ndarray
        One string label per column (e.g. the movie's first genre), used to build partition
        matroids.
    name : str
        Dataset name, e.g. ``"movielens-1m"`` or ``"synthetic-facility-location"``.

    Raises
    ------
    ValueError
        If a field has the wrong type, dtype or length, or a value is not a positive finite
        number.
    """

    values: sp.csr_matrix
    user_ids: np.ndarray
    element_ids: np.ndarray
    element_groups: np.ndarray
    name: str

    def __post_init__(self) -> None:
        values = _check_csr("RatingsMatrix.values", self.values)
        n_users, n_elements = values.shape
        if values.nnz and not (np.all(np.isfinite(values.data)) and values.data.min() > 0):
            raise ValueError(
                "RatingsMatrix.values: explicit entries must be finite ratings > 0 "
                "(missing ratings are implicit zeros, not stored)"
            )
        _check_vector("RatingsMatrix", "user_ids", self.user_ids, n_users, kind="int64", axis="row")
        for field, kind in (("element_ids", "int64"), ("element_groups", "str")):
            _check_vector(
                "RatingsMatrix", field, getattr(self, field), n_elements, kind=kind, axis="column"
            )
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("RatingsMatrix.name must be a non-empty string")

    @property
    def n_users(self) -> int:
        """int: Number of users (rows)."""
        return int(self.values.shape[0])

    @property
    def n_elements(self) -> int:
        """int: Number of elements (columns)."""
        return int(self.values.shape[1])


@dataclass(frozen=True, eq=False)
class VenueSets:
    """Researchers x venues membership sets for max coverage.

    Researcher ``i`` is covered by a set ``S`` of venues when they published in at least one
    venue of ``S``.

    Parameters
    ----------
    matrix : scipy.sparse.csr_matrix
        ``n_researchers x n_venues`` float64 CSR matrix in canonical format whose explicit
        entries are all ``1.0``.
    researchers : numpy.ndarray
        One id per row: names (any numpy string dtype) or int64 ids.
    venues : numpy.ndarray
        One string per column, e.g. ``"conf/icml"``.
    element_groups : numpy.ndarray
        One string per column: the venue's kind, e.g. ``"conf"`` or ``"journals"`` (the first
        component of the DBLP key), used to build partition matroids.
    name : str
        Dataset name, e.g. ``"dblp-2018-2021"`` or ``"synthetic-dblp"``.

    Raises
    ------
    ValueError
        If a field has the wrong type, dtype or length, or an entry is not ``1.0``.
    """

    matrix: sp.csr_matrix
    researchers: np.ndarray
    venues: np.ndarray
    element_groups: np.ndarray
    name: str

    def __post_init__(self) -> None:
        matrix = _check_csr("VenueSets.matrix", self.matrix)
        n_researchers, n_venues = matrix.shape
        if matrix.nnz and not np.all(matrix.data == 1.0):
            raise ValueError("VenueSets.matrix: explicit entries must all be 1.0")
        _check_vector(
            "VenueSets",
            "researchers",
            self.researchers,
            n_researchers,
            kind="int64|str",
            axis="row",
        )
        for field in ("venues", "element_groups"):
            _check_vector(
                "VenueSets", field, getattr(self, field), n_venues, kind="str", axis="column"
            )
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("VenueSets.name must be a non-empty string")

    @property
    def n_users(self) -> int:
        """int: Number of researchers (rows); each is a user of the federated task."""
        return int(self.matrix.shape[0])

    @property
    def n_elements(self) -> int:
        """int: Number of venues (columns), the ground set."""
        return int(self.matrix.shape[1])
