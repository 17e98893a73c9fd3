"""Linear maximisation over a matroid polytope: v = argmax_{w ∈ P(M)} ⟨w, g⟩.

For a non-negative weight vector g the maximum of a linear function over the matroid
polytope P(M) = conv{1_I : I ∈ I} is attained at the indicator of a *base* found by the
greedy algorithm (Edmonds, 1971): scan the elements by decreasing weight and keep each one
that leaves the set independent. This is the linear-maximisation oracle (LMO) of FedCG's
Eq. (3) and of every continuous-greedy step.

* :func:`linear_maximizer` — one weight vector; closed forms for uniform (top-k) and
  partition (top-capacity per block) matroids, the greedy algorithm with the independence
  oracle for any other :class:`~flower_app.submodular.matroids.Matroid`, e.g.
  :class:`OracleMatroid`.
* :func:`batched_linear_maximizer` — many users at once, each with a sparse weight vector
  (its gradient is zero outside the elements it rated), for uniform and partition
  matroids; fully vectorised over the users' non-zero entries.

Ties are broken by a key per entry (smaller key first; the lowest index without keys), so a
caller can break them at random from its own stream. With ``complete=True`` the set is
completed to a base with zero-weight elements, as the paper assumes ("v_i is the indicator
vector of a base"); with ``complete=False`` only the positive-weight part is kept, which is
also a vertex of P(M) maximising ⟨w, g⟩.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid

__all__ = [
    "OracleMatroid",
    "batched_linear_maximizer",
    "block_structure",
    "linear_maximizer",
]


class OracleMatroid(Matroid):
    """A matroid given only by an independence oracle (e.g. a graphic or laminar matroid).

    Parameters
    ----------
    n_elements : int
        Size of the ground set {0, …, n_elements − 1}.
    oracle : callable
        ``oracle(frozenset_of_ints) -> bool``: True when the set is independent. It must
        describe a matroid (not checked: the greedy algorithm is exact only for matroids).
    name : str, optional
        Label for ``repr``.
    """

    def __init__(
        self, n_elements: int, oracle: Callable[[frozenset[int]], bool], name: str = "oracle"
    ) -> None:
        if n_elements < 1:
            raise ValueError(f"a matroid needs at least one element, got n_elements={n_elements}")
        if not oracle(frozenset()):
            raise ValueError("the empty set must be independent")
        self.n_elements = int(n_elements)
        self.oracle = oracle
        self.name = name
        self._rank: int | None = None

    @property
    def rank(self) -> int:
        """Rank r (size of the base the greedy algorithm builds)."""
        if self._rank is None:
            base: set[int] = set()
            for e in range(self.n_elements):
                if self.oracle(frozenset(base | {e})):
                    base.add(e)
            self._rank = len(base)
        return self._rank

    def is_independent(self, selected: Iterable[int]) -> bool:
        """Return True when the set has distinct elements and the oracle accepts it."""
        arr = self._as_array(selected)
        return np.unique(arr).size == arr.size and bool(self.oracle(frozenset(arr.tolist())))

    def feasible_mask(self, selected: Iterable[int]) -> np.ndarray:
        """Return the elements e ∉ S with S ∪ {e} independent (one oracle call each)."""
        base = frozenset(self._as_array(selected).tolist())
        mask = np.zeros(self.n_elements, dtype=bool)
        for e in range(self.n_elements):
            if e not in base and self.oracle(base | {e}):
                mask[e] = True
        return mask

    def __repr__(self) -> str:
        return f"OracleMatroid(n_elements={self.n_elements}, name={self.name!r})"


def block_structure(matroid: Matroid) -> tuple[np.ndarray, np.ndarray] | None:
    """Return ``(block of each element, capacity of each block)`` or None.

    Parameters
    ----------
    matroid : Matroid
        Any matroid.

    Returns
    -------
    tuple of numpy.ndarray or None
        int64 block ids (length m) and int64 capacities (capacity capped at the block's
        size) for uniform and partition matroids; None for other matroids.
    """
    if isinstance(matroid, UniformMatroid):
        return np.zeros(matroid.n_elements, dtype=np.int64), np.array([matroid.k])
    if isinstance(matroid, PartitionMatroid):
        sizes = np.bincount(matroid.groups, minlength=matroid.capacities.size)
        return matroid.groups, np.minimum(matroid.capacities, sizes)
    return None


def _check_weights(weights: np.ndarray, n_elements: int) -> np.ndarray:
    g = np.asarray(weights, dtype=np.float64)
    if g.shape != (n_elements,):
        raise ValueError(f"weights have shape {g.shape}, expected ({n_elements},)")
    if not np.all(np.isfinite(g)):
        raise ValueError("weights must be finite")
    return g


def linear_maximizer(
    matroid: Matroid,
    weights: np.ndarray,
    tie_keys: np.ndarray | None = None,
    complete: bool = True,
) -> np.ndarray:
    """Return a vertex 1_B of P(M) maximising ⟨1_B, g⟩, as the sorted element ids of B.

    Parameters
    ----------
    matroid : Matroid
        Uniform, partition, or any matroid with an independence oracle.
    weights : numpy.ndarray
        g, length m, finite. Negative weights are never selected.
    tie_keys : numpy.ndarray, optional
        Length-m keys; among equal weights the smaller key comes first (default: the
        lower index).
    complete : bool, optional
        Complete the positive-weight part to a base with zero-weight elements (in key
        order), default True. Negative-weight elements are never added.

    Returns
    -------
    numpy.ndarray
        Sorted int64 ids of an independent set B (a base when ``complete`` and g ≥ 0).
    """
    m = matroid.n_elements
    g = _check_weights(weights, m)
    keys = np.arange(m, dtype=np.float64) if tie_keys is None else np.asarray(tie_keys, float)
    if keys.shape != (m,):
        raise ValueError(f"tie_keys have shape {keys.shape}, expected ({m},)")
    order = np.lexsort((np.arange(m), keys, -g))
    allowed = g >= 0 if complete else g > 0
    structure = block_structure(matroid)
    if structure is not None:
        blocks, caps = structure
        ordered = order[allowed[order]]
        b = blocks[ordered]
        # rank of each element within its block, in scan order
        by_block = np.argsort(b, kind="stable")
        starts = np.searchsorted(b[by_block], np.arange(caps.size))
        rank_in_block = np.empty(ordered.size, dtype=np.int64)
        rank_in_block[by_block] = np.arange(ordered.size) - starts[b[by_block]]
        chosen = ordered[rank_in_block < caps[b]]
        return np.sort(chosen).astype(np.int64)
    chosen_set: set[int] = set()
    for e in order:
        if allowed[e] and matroid.is_independent(chosen_set | {int(e)}):
            chosen_set.add(int(e))
    return np.array(sorted(chosen_set), dtype=np.int64)


def batched_linear_maximizer(
    matroid: Matroid,
    row: np.ndarray,
    col: np.ndarray,
    weight: np.ndarray,
    tie_key: np.ndarray,
    n_rows: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-capacity per (row, block) of sparse positive weights: many users' LMOs at once.

    Each row (user) has a sparse weight vector given by its entries; the entries not listed
    have weight 0. This returns, for every row, the positive-weight part of the greedy base
    of a uniform or partition matroid, and how many places each block still has for
    zero-weight elements (the caller fills them, e.g. at random: see
    :func:`flower_app.algorithms.fedcg.continuous.fill_bases`).

    Parameters
    ----------
    matroid : Matroid
        Uniform or partition matroid.
    row, col : numpy.ndarray
        int64 row (0..n_rows−1) and element of each entry; a (row, col) pair at most once.
    weight : numpy.ndarray
        float64 weight of each entry; entries with weight ≤ 0 are ignored.
    tie_key : numpy.ndarray
        float64 key of each entry; among equal weights the smaller key wins.
    n_rows : int
        Number of rows.

    Returns
    -------
    tuple of numpy.ndarray
        ``(chosen, deficit, blocks)``: ``chosen`` is a bool mask over the entries (the
        selected ones); ``deficit`` an ``(n_rows, n_blocks)`` int64 array of the places
        each row's blocks still have after the positive-weight part; ``blocks`` the block
        id of every element.

    Raises
    ------
    TypeError
        For matroids other than uniform and partition ones.
    """
    structure = block_structure(matroid)
    if structure is None:
        raise TypeError(
            f"the batched LMO supports uniform and partition matroids, not "
            f"{type(matroid).__name__}; use linear_maximizer per user"
        )
    blocks, caps = structure
    n_blocks = caps.size
    positive = weight > 0
    idx = np.flatnonzero(positive)
    b = blocks[col[idx]]
    group = row[idx] * n_blocks + b
    # rank by (−weight, key) once, then sort by (group, rank) as one int64 key: cheaper
    # than a four-key lexsort; exact ties of (weight, key) keep the entries' own order
    by_weight = np.lexsort((tie_key[idx], -weight[idx]))
    rank_w = np.empty(idx.size, dtype=np.int64)
    rank_w[by_weight] = np.arange(idx.size)
    order = np.argsort(group * max(idx.size, 1) + rank_w)
    g_sorted = group[order]
    starts = np.searchsorted(g_sorted, g_sorted, side="left")
    rank = np.arange(order.size) - starts
    keep_sorted = rank < caps[b[order]]
    chosen = np.zeros(row.size, dtype=bool)
    chosen[idx[order[keep_sorted]]] = True
    used = np.bincount(g_sorted[keep_sorted], minlength=n_rows * n_blocks).reshape(n_rows, n_blocks)
    deficit = caps[None, :] - used
    return chosen, deficit, blocks
