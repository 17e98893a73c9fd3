"""Centralized baselines: greedy (Nemhauser et al., 1978), lazy greedy, and random sets.

All three return a :class:`SelectionResult` whose ``values`` hold F after each added element,
so one run to k gives the whole curve F(S_1), …, F(S_k) used in the papers' figures.
Ties in the greedy argmax go to the lowest element index; lazy greedy breaks ties the same
way and so returns exactly the same sequence as plain greedy.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from flower_app.submodular.matroids import Matroid
from flower_app.submodular.objectives import MaxRowObjective

__all__ = ["SelectionResult", "greedy", "lazy_greedy", "random_selection"]


@dataclass
class SelectionResult:
    """A sequence of selected elements and the objective after each one.

    Attributes
    ----------
    selected : list of int
        Elements in the order they were added.
    values : list of float
        F(S_t) = (1/n) Σ_i f_i(S_t) after the t-th element (t = 1..len(selected)).
    """

    selected: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    @property
    def value(self) -> float:
        """Final objective F(S) (0 for the empty set)."""
        return self.values[-1] if self.values else 0.0


def _steps(matroid: Matroid, k: int | None) -> int:
    steps = matroid.rank if k is None else int(k)
    if steps > matroid.rank:
        raise ValueError(f"k={steps} exceeds the matroid's rank {matroid.rank}")
    return steps


def greedy(objective: MaxRowObjective, matroid: Matroid, k: int | None = None) -> SelectionResult:
    """Run the standard greedy algorithm with full gain vectors (vectorized).

    Parameters
    ----------
    objective : MaxRowObjective
        The decomposable objective.
    matroid : Matroid
        Constraint; every step adds the best element e with S ∪ {e} independent.
    k : int, optional
        Number of elements to add (default: the matroid's rank).

    Returns
    -------
    SelectionResult
        The greedy sequence and F after each step.
    """
    n = max(objective.n_users, 1)
    current = np.zeros(objective.n_users)
    result = SelectionResult()
    for _ in range(_steps(matroid, k)):
        gains = objective.gains(current)
        feasible = matroid.feasible_mask(result.selected)
        if not feasible.any():
            break
        e = int(np.argmax(np.where(feasible, gains, -np.inf)))
        current = objective.update_current(current, e)
        result.selected.append(e)
        result.values.append(float(current.sum()) / n)
    return result


def lazy_greedy(
    objective: MaxRowObjective, matroid: Matroid, k: int | None = None
) -> SelectionResult:
    """Run lazy greedy (Minoux, 1978): stale gains in a max-heap are upper bounds.

    Produces the same sequence as :func:`greedy` (same lowest-index tie-break) while
    re-evaluating only the elements that reach the top of the heap.

    Parameters
    ----------
    objective : MaxRowObjective
        The decomposable objective.
    matroid : Matroid
        Constraint (elements that become infeasible are dropped from the heap).
    k : int, optional
        Number of elements to add (default: the matroid's rank).

    Returns
    -------
    SelectionResult
        The greedy sequence and F after each step.
    """
    n = max(objective.n_users, 1)
    values = objective.values.tocsc()
    current = np.zeros(objective.n_users)
    gains = objective.gains(current)
    heap = [(-float(g), e) for e, g in enumerate(gains)]
    heapq.heapify(heap)
    result = SelectionResult()
    fresh_round = np.zeros(objective.n_elements, dtype=np.int64)  # step at which gain is exact
    for step in range(1, _steps(matroid, k) + 1):
        feasible = matroid.feasible_mask(result.selected)
        chosen = None
        while heap:
            neg, e = heapq.heappop(heap)
            if not feasible[e]:
                continue
            if fresh_round[e] == step:
                chosen = e
                break
            col = slice(values.indptr[e], values.indptr[e + 1])
            gain = float(np.maximum(values.data[col] - current[values.indices[col]], 0.0).sum())
            fresh_round[e] = step
            heapq.heappush(heap, (-gain, e))
        if chosen is None:
            break
        current = objective.update_current(current, chosen)
        result.selected.append(chosen)
        result.values.append(float(current.sum()) / n)
    return result


def random_selection(
    objective: MaxRowObjective, matroid: Matroid, k: int | None = None, seed: int = 0
) -> SelectionResult:
    """Add uniformly random feasible elements: the lower reference line of the figures.

    Parameters
    ----------
    objective : MaxRowObjective
        The decomposable objective (only evaluated).
    matroid : Matroid
        Constraint.
    k : int, optional
        Number of elements (default: rank).
    seed : int, optional
        Seed of the ``numpy.random.Generator``.

    Returns
    -------
    SelectionResult
        The random sequence and F after each step.
    """
    rng = np.random.default_rng(seed)
    n = max(objective.n_users, 1)
    current = np.zeros(objective.n_users)
    result = SelectionResult()
    for _ in range(_steps(matroid, k)):
        feasible = np.flatnonzero(matroid.feasible_mask(result.selected))
        if feasible.size == 0:
            break
        e = int(rng.choice(feasible))
        current = objective.update_current(current, e)
        result.selected.append(e)
        result.values.append(float(current.sum()) / n)
    return result
