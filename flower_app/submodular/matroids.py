"""Matroids over a ground set {0, …, m−1}: uniform (cardinality) and partition matroids."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import numpy as np

__all__ = ["Matroid", "PartitionMatroid", "UniformMatroid"]

#: integer dtypes whose every value is an int64 (the elements' fast conversion)
_EXACT_INT64 = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                           np.uint8, np.uint16, np.uint32))  # fmt: skip


class Matroid(ABC):
    """A matroid M = (E, I) with E = {0, …, n_elements − 1}."""

    n_elements: int

    @property
    @abstractmethod
    def rank(self) -> int:
        """Rank r of the matroid (size of every basis)."""

    @abstractmethod
    def is_independent(self, selected: Iterable[int]) -> bool:
        """Return True when the set is independent (duplicates make it dependent)."""

    @abstractmethod
    def feasible_mask(self, selected: Iterable[int]) -> np.ndarray:
        """Return a bool mask over E of the elements e ∉ S with S ∪ {e} independent.

        Parameters
        ----------
        selected : iterable of int
            An independent set S.
        """

    def _as_array(self, selected: Iterable[int]) -> np.ndarray:
        arr = np.asarray(selected) if isinstance(selected, list | tuple | np.ndarray) else None
        if arr is not None and arr.ndim == 1 and arr.dtype in _EXACT_INT64:
            # a flat sequence of integers converts at once, to the values int() gives
            arr = arr.astype(np.int64, copy=False)
        else:
            arr = np.fromiter((int(e) for e in selected), dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= self.n_elements):
            raise IndexError(f"element index out of range 0..{self.n_elements - 1}")
        return arr


class UniformMatroid(Matroid):
    """Uniform matroid: the independent sets are the sets of at most ``k`` elements.

    Parameters
    ----------
    n_elements : int
        Size m of the ground set.
    k : int
        Cardinality bound (the rank), 1 ≤ k ≤ m.
    """

    def __init__(self, n_elements: int, k: int) -> None:
        if n_elements < 1:
            raise ValueError(f"a matroid needs at least one element, got n_elements={n_elements}")
        if not 1 <= k <= n_elements:
            raise ValueError(
                f"k={k} is out of range: a uniform matroid on {n_elements} elements has "
                f"rank at most {n_elements}, and k must be at least 1"
            )
        self.n_elements = int(n_elements)
        self.k = int(k)

    @property
    def rank(self) -> int:
        """Rank of the matroid, ``k``."""
        return self.k

    def is_independent(self, selected: Iterable[int]) -> bool:
        """Return True when S has at most k distinct elements."""
        arr = self._as_array(selected)
        return arr.size <= self.k and np.unique(arr).size == arr.size

    def feasible_mask(self, selected: Iterable[int]) -> np.ndarray:
        """Return the elements outside S, or none when |S| = k."""
        arr = self._as_array(selected)
        mask = np.zeros(self.n_elements, dtype=bool)
        if arr.size < self.k:
            mask[:] = True
            mask[arr] = False
        return mask

    def __repr__(self) -> str:
        return f"UniformMatroid(n_elements={self.n_elements}, k={self.k})"


class PartitionMatroid(Matroid):
    """Partition matroid: at most ``capacities[g]`` elements from each block g.

    Parameters
    ----------
    groups : array_like of int
        Block index of every element, in 0..n_groups−1.
    capacities : int or array_like of int
        Capacity of each block (one int for all blocks), each ≥ 0.
    """

    def __init__(self, groups: Iterable[int], capacities: int | Iterable[int]) -> None:
        g = np.asarray(list(groups), dtype=np.int64)
        if g.size == 0:
            raise ValueError("a partition matroid needs at least one element")
        if g.min() < 0:
            raise ValueError("block indices must be non-negative")
        n_groups = int(g.max()) + 1
        if np.isscalar(capacities):
            caps = np.full(n_groups, int(capacities), dtype=np.int64)
        else:
            caps = np.asarray(list(capacities), dtype=np.int64)  # type: ignore[arg-type]
            if caps.size < n_groups:
                raise ValueError(f"{caps.size} capacities given for {n_groups} blocks")
        if caps.min() < 0:
            raise ValueError("block capacities must be non-negative")
        self.groups = g
        self.capacities = caps
        self.n_elements = int(g.size)
        self._sizes = np.bincount(g, minlength=caps.size)

    @classmethod
    def from_labels(cls, labels: Iterable[str], capacity: int) -> PartitionMatroid:
        """Build a partition matroid from one string label per element (e.g. genres).

        Parameters
        ----------
        labels : iterable of str
            Block label of each element; blocks are numbered in sorted label order.
        capacity : int
            The same capacity for every block.
        """
        _, inverse = np.unique(np.asarray(list(labels), dtype=str), return_inverse=True)
        return cls(inverse, int(capacity))

    @property
    def rank(self) -> int:
        """Rank Σ_g min(capacity_g, |block_g|)."""
        return int(np.minimum(self.capacities, self._sizes).sum())

    def is_independent(self, selected: Iterable[int]) -> bool:
        """Return True when S has distinct elements and respects every capacity."""
        arr = self._as_array(selected)
        if np.unique(arr).size != arr.size:
            return False
        used = np.bincount(self.groups[arr], minlength=self.capacities.size)
        return bool(np.all(used <= self.capacities))

    def feasible_mask(self, selected: Iterable[int]) -> np.ndarray:
        """Return the elements outside S whose block still has room."""
        arr = self._as_array(selected)
        used = np.bincount(self.groups[arr], minlength=self.capacities.size)
        mask = (used < self.capacities)[self.groups]
        mask[arr] = False
        return mask

    def __repr__(self) -> str:
        return (
            f"PartitionMatroid(n_elements={self.n_elements}, blocks={self.capacities.size}, "
            f"rank={self.rank})"
        )
