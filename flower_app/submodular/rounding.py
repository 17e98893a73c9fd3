"""Rounding a fractional point of a matroid polytope to an independent set.

Both roundings are *oblivious*: they never evaluate the objective (FedCG's Remark 4.4), so
the server can round without the clients' data.

* :func:`pipage_rounding` — randomized pipage (dependent) rounding for uniform and partition
  matroids: inside every block it moves mass between two fractional coordinates along
  e_i − e_j, choosing the direction so that each step keeps E[x] unchanged, until at most one
  coordinate of the block is fractional; that one is rounded up with probability equal to its
  value (room is left since the block's sum is then below its capacity). Marginals are
  preserved exactly, P[j ∈ R] = x_j, and because a multilinear extension of a submodular
  function is convex along e_i − e_j, E[F(R)] ≥ G(x).
* :func:`greedy_rounding` — deterministic: add elements by decreasing x_j while independent.
"""

from __future__ import annotations

import numpy as np

from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid

__all__ = ["blocks_of", "check_in_polytope", "greedy_rounding", "pipage_rounding"]

_EPS = 1e-9


def blocks_of(matroid: Matroid) -> list[tuple[np.ndarray, int]]:
    """Return the (elements, capacity) blocks of a uniform or partition matroid.

    Raises
    ------
    TypeError
        For other matroids.
    """
    if isinstance(matroid, UniformMatroid):
        return [(np.arange(matroid.n_elements), matroid.k)]
    if isinstance(matroid, PartitionMatroid):
        return [
            (np.flatnonzero(matroid.groups == g), int(cap))
            for g, cap in enumerate(matroid.capacities)
            if np.any(matroid.groups == g)
        ]
    raise TypeError(
        f"rounding supports uniform and partition matroids, not {type(matroid).__name__}"
    )


def check_in_polytope(x: np.ndarray, matroid: Matroid, tol: float = 1e-7) -> np.ndarray:
    """Return ``x`` (float64, clipped to [0, 1]) after checking it lies in the matroid polytope.

    Parameters
    ----------
    x : numpy.ndarray
        Candidate point.
    matroid : Matroid
        Uniform or partition matroid.
    tol : float, optional
        Slack allowed for floating-point error.

    Raises
    ------
    ValueError
        If x has the wrong shape, leaves [0, 1]^m, or a block's sum exceeds its capacity.
    """
    arr = np.asarray(x, dtype=np.float64)
    if arr.shape != (matroid.n_elements,):
        raise ValueError(f"x has shape {arr.shape}, expected ({matroid.n_elements},)")
    if not np.all(np.isfinite(arr)) or arr.min() < -tol or arr.max() > 1 + tol:
        raise ValueError("x is outside the matroid polytope: coordinates must lie in [0, 1]")
    for elements, cap in blocks_of(matroid):
        total = float(arr[elements].sum())
        if total > cap + tol:
            raise ValueError(
                f"x is outside the matroid polytope: a block of {elements.size} elements sums "
                f"to {total:.6g} > capacity {cap}"
            )
    return np.clip(arr, 0.0, 1.0)


def pipage_rounding(x: np.ndarray, matroid: Matroid, rng: np.random.Generator) -> list[int]:
    """Round x in the polytope of a uniform or partition matroid to an independent set.

    Parameters
    ----------
    x : numpy.ndarray
        Point of the matroid polytope (checked).
    matroid : Matroid
        Uniform or partition matroid.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    list of int
        Sorted element indices of an independent set R with P[j ∈ R] = x_j.
    """
    y = check_in_polytope(x, matroid).copy()
    for elements, _ in blocks_of(matroid):
        frac = [int(e) for e in elements if _EPS < y[e] < 1 - _EPS]
        while len(frac) >= 2:
            i, j = frac[-1], frac[-2]
            up = min(1.0 - y[i], y[j])  # y_i += up, y_j -= up
            down = min(y[i], 1.0 - y[j])  # y_i -= down, y_j += down
            if rng.random() < down / (up + down):
                y[i], y[j] = y[i] + up, y[j] - up
            else:
                y[i], y[j] = y[i] - down, y[j] + down
            frac = [e for e in frac if _EPS < y[e] < 1 - _EPS]
        if frac:
            e = frac[0]
            y[e] = 1.0 if rng.random() < y[e] else 0.0
    selected = [int(e) for e in np.flatnonzero(y > 0.5)]
    if not matroid.is_independent(selected):  # cannot happen for a point of the polytope
        raise RuntimeError("pipage rounding produced a dependent set")
    return selected


def greedy_rounding(x: np.ndarray, matroid: Matroid) -> list[int]:
    """Add elements by decreasing x_j (ties: lower index) while the set stays independent.

    Parameters
    ----------
    x : numpy.ndarray
        Point of the matroid polytope (checked).
    matroid : Matroid
        Uniform or partition matroid.

    Returns
    -------
    list of int
        A basis (elements with x_j = 0 fill remaining room last, in index order).
    """
    y = check_in_polytope(x, matroid)
    selected: list[int] = []
    for e in np.lexsort((np.arange(y.size), -y)):
        if len(selected) == matroid.rank:
            break
        if matroid.feasible_mask(selected)[e]:
            selected.append(int(e))
    return sorted(selected)
