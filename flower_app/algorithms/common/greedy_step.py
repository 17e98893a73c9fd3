"""The greedy step the federated greedy servers share: add the best feasible element.

FedSM's Algorithm 1 (:class:`~flower_app.algorithms.fedsm.core.FedSMServer`), its
Algorithm 2 (:class:`~flower_app.algorithms.fedsm.alg2.FedSMAlg2Server`) and FedCG's discrete
greedy (:class:`~flower_app.algorithms.fedcg.discrete_greedy.DiscreteGreedyServer`) each add
up to k elements to S under a matroid, from a seed; Algorithm 1 and the discrete greedy add,
each round, the feasible element with the largest summed report, ties to the lowest element
index — as the centralized :func:`~flower_app.submodular.greedy.greedy` does, which stays
written on its own as the independent reference these servers are tested against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flower_app.submodular.matroids import Matroid

__all__ = ["best_feasible", "check_greedy_run"]


def check_greedy_run(seed: int, k: int, matroid: Matroid) -> None:
    """Check a greedy server's seed and its number of elements k.

    Raises
    ------
    ValueError
        If ``seed`` is not a non-negative int, ``k`` not a positive int, or k exceeds the
        matroid's rank.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative int")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be a positive int")
    if k > matroid.rank:
        raise ValueError(f"k={k} exceeds the matroid's rank {matroid.rank}")


def best_feasible(values: np.ndarray, matroid: Matroid, selected: Sequence[int]) -> int:
    """Return the e with S ∪ {e} independent and the largest ``values[e]`` (ties: lowest e).

    Parameters
    ----------
    values : numpy.ndarray
        One value per element: float (infeasible ones are set to −∞) or integer (to the
        dtype's minimum).
    matroid : Matroid
        The constraint.
    selected : sequence of int
        S.

    Raises
    ------
    RuntimeError
        If no element is feasible (k exceeded the rank).
    """
    feasible = matroid.feasible_mask(selected)
    if not feasible.any():
        raise RuntimeError("no feasible element left: k exceeds the rank")
    lowest = -np.inf if values.dtype.kind == "f" else np.iinfo(values.dtype).min
    return int(np.argmax(np.where(feasible, values, lowest)))
