"""Rounding a fractional point of a matroid polytope to an independent set.

All roundings are *oblivious*: they never evaluate the objective (FedCG's Remark 4.4), so
the server can round without the clients' data. Each runs in O(n log n) for n elements
(uniform and partition matroids).

* :func:`pipage_rounding` — randomized pipage (dependent) rounding for uniform and partition
  matroids: inside every block it moves mass between two fractional coordinates along
  e_i − e_j, choosing the direction so that each step keeps E[x] unchanged, until at most one
  coordinate of the block is fractional; that one is rounded up with probability equal to its
  value (room is left since the block's sum is then below its capacity). Marginals are
  preserved exactly, P[j ∈ R] = x_j, and because a multilinear extension of a submodular
  function is convex along e_i − e_j, E[F(R)] ≥ G(x). The pairs are taken from a stack of
  the block's fractional coordinates in index order (the last two; the one of them that is
  still fractional goes back on top), so one step costs O(1). ``method="reference"`` keeps
  the first implementation, which rebuilt the list of fractional coordinates after every
  step (O(n²)); both make the same pairs in the same order and draw the same random numbers,
  so they return the same set for the same generator state (tested).
* :func:`swap_rounding` — randomized swap rounding (Chekuri, Vondrák and Zenklusen, FOCS
  2010) of x written as a convex combination of bases; see its docstring.
* :func:`greedy_rounding` — deterministic: add elements by decreasing x_j while independent.
* :func:`complete_by_order` — complete an independent set to a base by decreasing x_j
  (:func:`complete_by_scan`: the same by its definition, the reference it is tested against).
* :func:`verification_matroid` — not a rounding itself: the candidates of *verified
  rounding*, where the federated discrete greedy (which asks the users for values, with its
  checks and budgets) chooses the set among the elements of largest x instead of taking the
  top of x blindly.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid

__all__ = [
    "PIPAGE_METHODS",
    "blocks_of",
    "check_in_polytope",
    "complete_by_order",
    "complete_by_scan",
    "greedy_rounding",
    "pipage_rounding",
    "swap_rounding",
    "verification_matroid",
]

_EPS = 1e-9
#: ``method`` values of :func:`pipage_rounding`
PIPAGE_METHODS = ("fast", "reference")


def blocks_of(matroid: Matroid) -> list[tuple[np.ndarray, int]]:
    """Return the (elements, capacity) blocks of a uniform or partition matroid.

    Elements of a block are in increasing order; empty blocks are left out. O(n log n).

    Raises
    ------
    TypeError
        For other matroids.
    """
    if isinstance(matroid, UniformMatroid):
        return [(np.arange(matroid.n_elements), matroid.k)]
    if isinstance(matroid, PartitionMatroid):
        sizes = np.bincount(matroid.groups, minlength=matroid.capacities.size)
        parts = np.split(np.argsort(matroid.groups, kind="stable"), np.cumsum(sizes)[:-1])
        return [(parts[g], int(cap)) for g, cap in enumerate(matroid.capacities) if sizes[g] > 0]
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


def _fractional(y: np.ndarray, elements: np.ndarray) -> np.ndarray:
    """Return the elements (in their order) with _EPS < y < 1 − _EPS."""
    ye = y[elements]
    return elements[(ye > _EPS) & (ye < 1 - _EPS)]


def pipage_rounding(
    x: np.ndarray, matroid: Matroid, rng: np.random.Generator, method: str = "fast"
) -> list[int]:
    """Round x in the polytope of a uniform or partition matroid to an independent set.

    Parameters
    ----------
    x : numpy.ndarray
        Point of the matroid polytope (checked).
    matroid : Matroid
        Uniform or partition matroid.
    rng : numpy.random.Generator
        Source of randomness: one ``rng.random()`` per pipage step, and one for the last
        fractional coordinate of a block, in block order.
    method : str, optional
        ``"fast"`` (default; O(n log n), the sort of the blocks, then O(1) per step) or
        ``"reference"`` (the first implementation, O(n²)). Same pairs, same draws: the same
        set for the same generator state, and the generator is left in the same state.

    Returns
    -------
    list of int
        Sorted element indices of an independent set R with P[j ∈ R] = x_j; a base when
        x is a base (every block's sum equals its rank, up to 1e-9).

    Raises
    ------
    ValueError
        For an unknown ``method`` or a point outside the polytope.
    """
    if method not in PIPAGE_METHODS:
        raise ValueError(f"method={method!r}: choose one of {', '.join(PIPAGE_METHODS)}")
    y = check_in_polytope(x, matroid).copy()
    if method == "reference":
        _pipage_reference(y, matroid, rng)
    else:
        _pipage_fast(y, matroid, rng)
    selected = [int(e) for e in np.flatnonzero(y > 0.5)]
    if not matroid.is_independent(selected):  # cannot happen for a point of the polytope
        raise RuntimeError("pipage rounding produced a dependent set")
    return selected


def _pipage_reference(y: np.ndarray, matroid: Matroid, rng: np.random.Generator) -> None:
    """Run the first implementation (O(n²)): it rebuilds the fractional list each step."""
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


def _pipage_fast(y: np.ndarray, matroid: Matroid, rng: np.random.Generator) -> None:
    """Pipage rounding of y in place, one O(1) step per pair (same pairs as the reference).

    The reference pairs the last two entries of the block's fractional list and then drops
    the entries that became integral; only those two entries changed, and their order is
    kept, so the list is a stack: pop i (top) and j, push back j and then i if still
    fractional. Float arithmetic is IEEE double in both (Python floats here, numpy float64
    scalars there), so every value and every comparison agree bit for bit.
    """
    random = rng.random
    lo, hi = _EPS, 1 - _EPS
    for elements, _ in blocks_of(matroid):
        stack = _fractional(y, elements).tolist()
        if not stack:
            continue
        vals = dict(zip(stack, y[stack].tolist(), strict=True))
        while len(stack) >= 2:
            i = stack.pop()
            j = stack.pop()
            yi, yj = vals[i], vals[j]
            up = min(1.0 - yi, yj)  # y_i += up, y_j -= up
            down = min(yi, 1.0 - yj)  # y_i -= down, y_j += down
            if random() < down / (up + down):
                yi, yj = yi + up, yj - up
            else:
                yi, yj = yi - down, yj + down
            vals[i], vals[j] = yi, yj
            if lo < yj < hi:
                stack.append(j)
            if lo < yi < hi:
                stack.append(i)
        if stack:
            e = stack[0]
            vals[e] = 1.0 if random() < vals[e] else 0.0
        keys = list(vals)
        y[keys] = [vals[e] for e in keys]


def swap_rounding(x: np.ndarray, matroid: Matroid, rng: np.random.Generator) -> list[int]:
    """Round x in the polytope of a uniform or partition matroid by randomized swap rounding.

    Swap rounding (Chekuri, Vondrák and Zenklusen, *Dependent randomized rounding via
    exchange properties of combinatorial structures*, FOCS 2010) writes x = Σ_t β_t 1_{B_t}
    as a convex combination of bases and merges them one after the other: C ← B_1, then for
    t = 2, 3, …, while C ≠ B_t, take i ∈ C \\ B_t and j ∈ B_t \\ C with both exchanges
    feasible and, with probability β_t / (β_1 + … + β_t), replace i by j in C (otherwise
    keep i). The result is a base with P[j ∈ C] = x_j, and its indicators are negatively
    correlated (Chernoff-type concentration for linear functions, E[F(C)] ≥ G(x) for
    submodular F).

    Blocks are rounded independently (each is a uniform matroid). Inside a block the
    decomposition is the one of systematic sampling: lay the fractional coordinates on
    [0, s) in index order, element j on [c_{j−1}, c_j); for u ∈ [0, 1) the base B_u holds,
    for each of the s "tracks" l = 0, …, s − 1, the element whose interval contains l + u.
    As u grows each track moves from one element to the next, so consecutive bases differ
    by one exchange, and the weight of the bases before level u is u. The pairs of the
    merges are kept as a matching between C \\ B and B \\ C, updated in O(1) per
    exchange, and a pair created at level u₀ is not re-drawn at every later merge: the
    probability that it survives all merges up to level w is Π β/(β_1 + … + β_t) = u₀ / w,
    so its switch level u₀ / V (V uniform on (0, 1]) is drawn once and put on a heap. A
    block costs O(n log n). A block whose fractional sum s is not an integer (x inside the
    polytope, not on a base) gets a dummy coordinate of value ⌈s⌉ − s, dropped afterwards
    (room exists: the block's sum is below its capacity).

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
        Sorted element indices of an independent set C with P[j ∈ C] = x_j; a base when x
        is a base.
    """
    y = check_in_polytope(x, matroid)
    selected = np.flatnonzero(y >= 1 - _EPS).tolist()
    for elements, cap in blocks_of(matroid):
        frac = _fractional(y, elements)
        if frac.size == 0:
            continue
        ones = int(np.count_nonzero(y[elements] >= 1 - _EPS))
        chosen = _swap_block(y[frac], cap - ones, rng)
        selected.extend(frac[chosen].tolist())
    selected.sort()
    if not matroid.is_independent(selected):  # cannot happen for a point of the polytope
        raise RuntimeError("swap rounding produced a dependent set")
    return selected


def _swap_block(values: np.ndarray, room: int, rng: np.random.Generator) -> np.ndarray:
    """Swap rounding of one block's fractional values (each in (0, 1)); positions chosen."""
    n = values.size
    total = math.fsum(values.tolist())
    size = math.floor(total)
    rest = total - size
    w = values
    if rest > 1 - _EPS:  # the sum is an integer up to float error
        size += 1
    elif rest > _EPS and size + 1 <= room:  # inside the polytope: a dummy fills the base
        size += 1
        w = np.append(values, size - total)
    size = min(size, room)
    if size <= 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(w)
    # track l starts (u = 0) on the first element whose interval passes l
    start = np.searchsorted(ends, np.arange(size), side="right")
    start = np.minimum(start, w.size - 1)
    # boundary c_i = l + u: at level u track l moves from element i to element i + 1
    bound = ends[:-1]
    track = np.floor(bound)
    level = bound - track
    keep = (level > 0) & (track < size)
    order = np.flatnonzero(keep)[np.argsort(level[keep], kind="stable")]
    levels = level[order].tolist()
    leaving = order.tolist()

    m = w.size
    in_c = [False] * m
    in_b = [False] * m
    for e in start.tolist():
        in_c[e] = in_b[e] = True
    partner = [-1] * m  # c ∈ C \ B ↔ d ∈ B \ C, both ways
    stamp = [0] * m  # current clock of c ∈ C \ B; heap entries with another stamp are stale
    heap: list[tuple[float, int, int]] = []
    random = rng.random

    def clock(c: int, at: float) -> None:
        stamp[c] += 1
        fire = at / (1.0 - random())
        if fire < 1.0:
            heapq.heappush(heap, (fire, c, stamp[c]))

    def switch_until(limit: float) -> None:
        while heap and heap[0][0] <= limit:
            _, c, s = heapq.heappop(heap)
            if s != stamp[c] or not in_c[c] or in_b[c]:
                continue
            d = partner[c]
            in_c[c], in_c[d] = False, True
            partner[c] = partner[d] = -1

    for u, a in zip(levels, leaving, strict=True):
        switch_until(u)
        b = a + 1
        in_b[a], in_b[b] = False, True
        if in_c[b]:  # b joins C ∩ B; its partner d is free
            d = partner[b]
            partner[b] = -1
            stamp[b] += 1
            if d == a:  # the pair (b, a) resolves itself
                partner[a] = -1
                continue
        else:
            d = b
        if in_c[a]:  # a leaves C ∩ B: a new pair (a, d), its clock starts now
            partner[a], partner[d] = d, a
            clock(a, u)
        else:  # a was in B \ C: its partner c takes d instead
            c = partner[a]
            partner[a] = -1
            partner[c], partner[d] = d, c
    switch_until(1.0)
    chosen = np.flatnonzero(np.array(in_c[:n], dtype=bool))
    return chosen


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
        A basis (elements with x_j = 0 fill remaining room last, in index order): in each
        block, the top min(capacity, size) elements by (−x_j, j). O(n log n).
    """
    y = check_in_polytope(x, matroid)
    return complete_by_order([], y, matroid)


def complete_by_order(selected: list[int], x: np.ndarray, matroid: Matroid) -> list[int]:
    """Complete an independent set to a base by decreasing x_j (ties: lower index).

    Equivalent to scanning all elements by (−x_j, j) and adding each one whose block still
    has room, until the set has the matroid's rank; done per block in O(n log n).

    Parameters
    ----------
    selected : list of int
        An independent set S.
    x : numpy.ndarray
        Order of preference (float, length n; not checked against the polytope).
    matroid : Matroid
        Uniform or partition matroid.

    Returns
    -------
    list of int
        Sorted element indices of a base containing S.
    """
    y = np.asarray(x, dtype=np.float64)
    taken = np.zeros(matroid.n_elements, dtype=bool)
    taken[np.asarray(selected, dtype=np.int64)] = True
    out = [np.flatnonzero(taken)]
    for elements, cap in blocks_of(matroid):
        free = elements[~taken[elements]]
        room = min(cap, elements.size) - (elements.size - free.size)
        if room > 0:
            out.append(free[np.lexsort((free, -y[free]))][:room])
    return sorted(int(e) for e in np.concatenate(out))


def complete_by_scan(selected: list[int], x: np.ndarray, matroid: Matroid) -> list[int]:
    """:func:`complete_by_order` by its definition, for any matroid: the reference.

    Scans all elements by (−x_j, j) and adds each one that keeps the set independent, one
    independence check (O(n)) per element: the first implementation of the greedy rounding,
    which :func:`complete_by_order` and :func:`greedy_rounding` are tested and measured
    against (``tests/test_rounding_fast.py``, ``benchmarks/rounding_speed.py``).
    """
    chosen = list(selected)
    for e in np.lexsort((np.arange(x.size), -x)):
        if len(chosen) >= matroid.rank:
            break
        if matroid.feasible_mask(chosen)[e]:
            chosen.append(int(e))
    return sorted(chosen)


def verification_matroid(x: np.ndarray, matroid: Matroid, factor: int = 2) -> PartitionMatroid:
    """Return the matroid of verified rounding: the top of x per block, the rest closed.

    In each block of ``matroid`` (capacity c), the ``factor``·c elements of largest x (ties:
    lower index, the order of :func:`greedy_rounding`) keep the block's capacity; every other
    element goes to one extra block of capacity 0. A set independent in the result is
    independent in ``matroid``, and :func:`greedy_rounding`'s set is one of its bases, so a
    greedy over it chooses among a superset of what greedy rounding would take.

    Parameters
    ----------
    x : numpy.ndarray
        Point of the matroid polytope (checked).
    matroid : Matroid
        Uniform or partition matroid.
    factor : int, optional
        Candidates per unit of capacity (default 2: 2k candidates for a uniform matroid of
        rank k), at least 1.

    Returns
    -------
    PartitionMatroid
        Over the same elements, of the same rank.
    """
    if int(factor) < 1:
        raise ValueError(f"factor={factor!r} must be at least 1")
    y = check_in_polytope(x, matroid)
    blocks = blocks_of(matroid)
    groups = np.full(matroid.n_elements, len(blocks), dtype=np.int64)
    capacities = []
    for b, (elements, cap) in enumerate(blocks):
        top = elements[np.lexsort((elements, -y[elements]))][: int(factor) * cap]
        groups[top] = b
        capacities.append(cap)
    return PartitionMatroid(groups, [*capacities, 0])
