"""FedSubAvg on a model of named arrays (embedding tables + dense layers): the math, no Flower.

The server steps of :mod:`flower_app.algorithms.fedsubavg.core` act on one flat float64 vector
whose entries are the model's rows. A user's model is a mapping of named arrays (e.g. a
torch ``state_dict``) in which some arrays are *sparse*: embedding-like tables whose first
axis indexes rows that a client touches only if its data uses them (item ids, user ids,
feature ids). :class:`NamedLayout` maps such a model onto a flat vector and back, so the
same server steps apply unchanged:

* a sparse table ``T`` of shape ``(R, d1, d2, ...)`` holds R rows of ``w = d1·d2·...``
  entries; row ``r`` is the flat entries ``offset + r·w + [0, w)``;
* a dense array is in every client's submodel: every client touches all its entries, so
  its feature heat is N (the correction N/n_m is 1: FedAvg).

The feature heat of an entry is the heat of its row (:func:`named_heat`): how many clients
declared that row (n_m), and the sum of their training samples (W_m, App. D.4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from flower_app.algorithms.fedsubavg.core import FeatureHeat, RoundUpdate

__all__ = [
    "ROWS_SUFFIX",
    "NamedLayout",
    "named_heat",
    "named_heat_from_counts",
    "rows_key",
    "unique_rows",
]

#: suffix of the record key holding a sparse array's row ids (``"<key>.rows"``)
ROWS_SUFFIX = ".rows"


def rows_key(key: str) -> str:
    """Return the record key of the row ids of sparse array ``key``."""
    return f"{key}{ROWS_SUFFIX}"


def unique_rows(ids: Iterable[int] | np.ndarray, n_rows: int | None = None) -> np.ndarray:
    """Return the distinct row ids in ``ids``, sorted, as int64.

    Parameters
    ----------
    ids : array-like of int
        Row ids a client's data uses (any shape; repeats allowed), e.g. a column of item ids.
    n_rows : int, optional
        Rows of the table; when given, ids outside ``0..n_rows-1`` raise ValueError.

    Returns
    -------
    numpy.ndarray
        Sorted distinct int64 row ids.
    """
    rows = np.unique(np.asarray(ids).astype(np.int64, copy=False).ravel())
    if rows.size and (rows[0] < 0 or (n_rows is not None and rows[-1] >= n_rows)):
        bound = "" if n_rows is None else f" (the table has {n_rows} rows)"
        raise ValueError(f"row ids must lie in 0..rows-1{bound}; got {rows[0]}..{rows[-1]}")
    return rows


@dataclass(frozen=True)
class NamedLayout:
    """Where each named array lives in the flat float64 vector the server steps act on.

    Attributes
    ----------
    keys : tuple of str
        Array names, in the model's order.
    shapes : tuple of tuple of int
        Their shapes.
    dtypes : tuple of numpy.dtype
        Their dtypes (restored by :meth:`unflatten`).
    sparse : frozenset of str
        Names of the sparse (row-indexed) arrays.
    offsets : tuple of int
        Flat offset of each array (``len(keys) + 1`` entries; the last is the size).
    """

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    sparse: frozenset[str]
    offsets: tuple[int, ...]

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, np.ndarray], sparse_keys: Iterable[str]
    ) -> NamedLayout:
        """Return the layout of ``arrays`` with ``sparse_keys`` as the row-indexed tables.

        Parameters
        ----------
        arrays : mapping of str to numpy.ndarray
            The model (e.g. a state_dict turned into numpy arrays).
        sparse_keys : iterable of str
            Names of the embedding-like tables (first axis = rows).

        Raises
        ------
        ValueError
            If a sparse key is not in ``arrays`` or is a scalar, or a key ends with
            :data:`ROWS_SUFFIX` and clashes with a sparse array's row-id key.
        """
        sparse = frozenset(sparse_keys)
        missing = sorted(sparse - set(arrays))
        if missing:
            raise ValueError(f"sparse keys {missing} are not arrays of the model {list(arrays)}")
        for key in sparse:
            if np.ndim(arrays[key]) < 1:
                raise ValueError(f"sparse array '{key}' must have at least one axis (rows)")
            if rows_key(key) in arrays:
                raise ValueError(f"the model has an array '{rows_key(key)}', the row-id key of "
                                 f"sparse array '{key}': rename one")
        keys = tuple(arrays)
        shapes = tuple(tuple(int(s) for s in np.shape(arrays[k])) for k in keys)
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        offsets = tuple(int(v) for v in np.concatenate([[0], np.cumsum(sizes)]))
        dtypes = tuple(np.asarray(arrays[k]).dtype for k in keys)
        return cls(keys, shapes, dtypes, sparse, offsets)

    # ---------------------------------------------------------------- sizes
    @property
    def size(self) -> int:
        """Entries of the whole model."""
        return self.offsets[-1]

    def index(self, key: str) -> int:
        """Return the position of ``key`` in :attr:`keys`."""
        return self.keys.index(key)

    def n_rows(self, key: str) -> int:
        """Rows of sparse array ``key`` (its first axis)."""
        return self.shapes[self.index(key)][0]

    def row_width(self, key: str) -> int:
        """Entries per row of sparse array ``key``."""
        return int(np.prod(self.shapes[self.index(key)][1:], dtype=np.int64))

    # ---------------------------------------------------------------- conversions
    def flatten(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """Return the model as one float64 vector (checks keys and shapes)."""
        if set(arrays) != set(self.keys):
            raise ValueError(f"arrays have keys {sorted(arrays)}, expected {sorted(self.keys)}")
        x = np.empty(self.size)
        for i, key in enumerate(self.keys):
            a = np.asarray(arrays[key])
            if a.shape != self.shapes[i]:
                raise ValueError(f"'{key}' has shape {a.shape}, expected {self.shapes[i]}")
            x[self.offsets[i] : self.offsets[i + 1]] = a.ravel()
        return x

    def unflatten(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Return the named arrays of flat vector ``x`` in their shapes and dtypes."""
        return {k: self._cast(k, x[self.offsets[i] : self.offsets[i + 1]]).reshape(self.shapes[i])
                for i, k in enumerate(self.keys)}

    def _cast(self, key: str, values: np.ndarray) -> np.ndarray:
        dtype = self.dtypes[self.index(key)]
        if dtype.kind in "iub":
            values = np.rint(values)
        return values.astype(dtype)

    def entries(self, key: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Return the flat indices of array ``key`` (all of it, or the given rows of it)."""
        i = self.index(key)
        start, stop = self.offsets[i], self.offsets[i + 1]
        if rows is None:
            return np.arange(start, stop, dtype=np.int64)
        w = self.row_width(key)
        rows = np.asarray(rows, dtype=np.int64)
        return (start + rows[:, None] * w + np.arange(w, dtype=np.int64)).ravel()

    def submodel_entries(self, rows: Mapping[str, np.ndarray]) -> np.ndarray:
        """Return the sorted flat indices of a submodel: the given rows + every dense array."""
        parts = [self.entries(k, rows[k] if k in self.sparse else None) for k in self.keys]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def gather(self, x: np.ndarray, rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Return a submodel's values: ``rows[k]`` of each sparse array, dense arrays whole.

        Sparse arrays come back shaped ``(len(rows[k]), *shape[1:])``, every array in the
        model's dtype.
        """
        out = {}
        for i, key in enumerate(self.keys):
            if key in self.sparse:
                shape = (len(rows[key]), *self.shapes[i][1:])
                out[key] = self._cast(key, x[self.entries(key, rows[key])]).reshape(shape)
            else:
                out[key] = self._cast(key, x[self.offsets[i] : self.offsets[i + 1]]).reshape(
                    self.shapes[i]
                )
        return out

    def check_rows(self, key: str, rows: np.ndarray) -> np.ndarray:
        """Return ``rows`` as int64 if they are sorted, distinct and in range; else raise."""
        rows = np.asarray(rows)
        if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
            raise ValueError(f"'{rows_key(key)}' must be a 1-D integer array, got "
                             f"{rows.dtype} {rows.shape}")
        rows = rows.astype(np.int64)
        if rows.size and (rows[0] < 0 or rows[-1] >= self.n_rows(key)):
            raise ValueError(f"'{rows_key(key)}' has rows outside 0..{self.n_rows(key) - 1}")
        if rows.size > 1 and np.any(np.diff(rows) <= 0):
            raise ValueError(f"'{rows_key(key)}' must be sorted and distinct")
        return rows

    def update(
        self,
        sent: Mapping[str, np.ndarray],
        received: Mapping[str, np.ndarray],
        rows: Mapping[str, np.ndarray],
        weight: float,
    ) -> RoundUpdate:
        """Return one client's weighted update c_i·Δx_i on its submodel entries.

        Parameters
        ----------
        sent : mapping
            The submodel values sent (as :meth:`gather` returned them).
        received : mapping
            The client's updated values, same keys and shapes.
        rows : mapping
            The client's rows per sparse array.
        weight : float
            c_i (1, or the client's training samples).

        Returns
        -------
        RoundUpdate
            ``rows`` = the flat submodel entries (sorted), ``sums`` = c_i·(received − sent).

        Raises
        ------
        ValueError
            On a missing key, a shape that differs from what was sent, or non-finite values.
        """
        deltas = []
        for key in self.keys:
            if key not in received:
                raise ValueError(f"the reply lacks array '{key}'")
            got, ref = np.asarray(received[key]), np.asarray(sent[key])
            if got.shape != ref.shape:
                raise ValueError(f"'{key}' has shape {got.shape}, {ref.shape} was sent")
            if got.dtype.kind not in "fiub":
                raise ValueError(f"'{key}' has dtype {got.dtype}, expected numbers")
            d = got.astype(np.float64).ravel() - ref.astype(np.float64).ravel()
            if not np.all(np.isfinite(d)):
                raise ValueError(f"non-finite values in '{key}'")
            deltas.append(d)
        sums = np.concatenate(deltas) * float(weight) if deltas else np.zeros(0)
        return RoundUpdate(self.submodel_entries(rows), sums, 1, float(weight))


def named_heat_from_counts(
    layout: NamedLayout,
    row_clients: Mapping[str, np.ndarray],
    row_samples: Mapping[str, np.ndarray],
    n_clients: int,
    n_samples: int,
) -> FeatureHeat:
    """Return the heat of every flat entry from per-row counts (e.g. a secure sum).

    Parameters
    ----------
    layout : NamedLayout
        The model.
    row_clients, row_samples : mapping of str to numpy.ndarray
        Per sparse array: clients touching each row, and the sum of their samples.
    n_clients, n_samples : int
        N and Σ n_j (dense entries get them).
    """
    heat = FeatureHeat.zeros(layout.size)
    for i, key in enumerate(layout.keys):
        lo, hi = layout.offsets[i], layout.offsets[i + 1]
        if key in layout.sparse:
            w = layout.row_width(key)
            heat.clients[lo:hi] = np.repeat(np.asarray(row_clients[key], np.int64), w)
            heat.samples[lo:hi] = np.repeat(np.asarray(row_samples[key], np.int64), w)
        else:
            heat.clients[lo:hi] = n_clients
            heat.samples[lo:hi] = n_samples
    heat.n_clients, heat.n_samples = int(n_clients), int(n_samples)
    return heat


def named_heat(
    layout: NamedLayout, reports: Iterable[tuple[Mapping[str, np.ndarray], int]]
) -> FeatureHeat:
    """Add the clients' row declarations into the feature heat of every flat entry.

    Parameters
    ----------
    layout : NamedLayout
        The model.
    reports : iterable of (mapping, int)
        Per client: its distinct rows per sparse array (as :meth:`NamedLayout.check_rows`
        accepts) and its training samples n_j.

    Returns
    -------
    FeatureHeat
        Per flat entry: n_m = clients whose rows include the entry's row (N for dense
        entries) and W_m = the sum of their samples; ``n_clients`` = N, ``n_samples`` = Σ n_j.
    """
    row_clients = {k: np.zeros(layout.n_rows(k), dtype=np.int64) for k in layout.sparse}
    row_samples = {k: np.zeros(layout.n_rows(k), dtype=np.int64) for k in layout.sparse}
    n, total = 0, 0
    for rows, samples in reports:
        n += 1
        total += int(samples)
        for key in layout.sparse:
            r = rows.get(key, np.zeros(0, dtype=np.int64))
            row_clients[key][r] += 1
            row_samples[key][r] += int(samples)
    heat = FeatureHeat.zeros(layout.size)
    for i, key in enumerate(layout.keys):
        lo, hi = layout.offsets[i], layout.offsets[i + 1]
        if key in layout.sparse:
            w = layout.row_width(key)
            heat.clients[lo:hi] = np.repeat(row_clients[key], w)
            heat.samples[lo:hi] = np.repeat(row_samples[key], w)
        else:
            heat.clients[lo:hi] = n
            heat.samples[lo:hi] = total
    heat.n_clients, heat.n_samples = n, total
    return heat
