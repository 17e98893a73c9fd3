"""FedCG (Alg. 1) and FedCG+ (Alg. 2) of Rafiey (ICML 2024): the math, with no Flower import.

The server keeps x in the matroid polytope P, starting at 0. One communication round t:

1. the server picks the round's users by the *client sampling scheme*: K draws with
   replacement, user i with probability p_i (a user drawn twice counts twice); or, with
   full participation, every user once with weight p_i;
2. each chosen user i sets x_i ← x and takes τ local continuous-greedy steps
   (τ = 1 is FedCG): g ← ∇f̂_i(x_i) (exact, or the sampling estimate of Appendix C.3 from
   ``samples`` sets R ~ x_i), v ← argmax_{v ∈ P} ⟨v, g⟩ (a base of M), x_i ← x_i + v/τ;
   it sends Δ_i = x_i − x (for τ = 1 the base v_i itself, O(r log n) bits);
3. the server sets x ← x + η · Σ_i c_i Δ_i / Σ_i c_i, c_i = multiplicity (sampled) or p_i
   (full participation).

After the last round x is rounded obliviously (pipage or greedy rounding, Remark 4.4).

Users' randomness (tie-breaking in the LMO, random completion to a base, the sets R of the
estimator) comes from ``default_rng([seed, round, user])`` only, drawn in a fixed order per
user, so a node's sum over its users does not depend on how users are split over nodes. A
node sends τ · Σ_i c_i Δ_i, whose entries are integer multiples of c_i: with integer c_i
(multiplicities, uniform weights) every sum is exact in float64, and the Flower engine and
the direct engine produce bit-identical x.

Choices where the paper is silent (stated in the README too):

* the local iterate x_i can leave [0, 1]^m when τ > 1 (x_i = x + Σ v/τ); the gradient is
  then evaluated at min(x_i, 1);
* ties in the LMO are broken at random (each user's own stream), as the authors' DBLP
  script does; a base is completed with random zero-gradient elements (``fill_base``;
  off: the user sends only the positive-gradient part, also an argmax vertex). With the
  filler every sampled user adds r − |support| random elements, so x ends fractional on
  (nearly) every element: on a 48,482-user × 57,910-element coverage stand-in (k = 10,
  T = 20, 10 % per round) all 57,910 coordinates of x were fractional with the filler
  against 25,552 without, the rounds took 9.7 s against 3.3 s, greedy rounding reached
  greedy's F either way, and pipage rounding 0.022 of it with the filler against 0.849
  without (``benchmarks/fedcg_fill_base.py``, ``docs/reproductions/fedcg.md``);
* ``clients_per_round = 1.0`` means full participation; any other value K draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from flower_app.algorithms.common.counts import resolve_count
from flower_app.algorithms.common.streams import user_rng
from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid
from flower_app.submodular.multilinear import entry_weights, set_gains, sorted_rows
from flower_app.submodular.objectives import MaxRowObjective
from flower_app.submodular.polytope import (
    batched_linear_maximizer,
    block_structure,
    linear_maximizer,
)
from flower_app.submodular.rounding import (
    check_in_polytope,
    complete_by_order,
    greedy_rounding,
    pipage_rounding,
    swap_rounding,
)

__all__ = [
    "GRADIENTS",
    "ROUNDINGS",
    "FedCGRound",
    "FedCGServer",
    "LocalSteps",
    "UserEntries",
    "complete_to_base",
    "entry_gradient",
    "round_point",
    "matroid_from_spec",
    "matroid_spec",
    "sampled_set_gradient",
    "set_function_direction",
    "user_direction_sum",
]

#: a per-user set function given by its marginal gains: ``gains(S) -> f(S ∪ {e}) − f(S)``
#: for every element e (float64, length m; the entries of S itself are not used)
GainsFn = Callable[[np.ndarray], np.ndarray]

GRADIENTS = ("exact", "sampled")
ROUNDINGS = ("pipage", "greedy")


# ---------------------------------------------------------------------------- user side
@dataclass
class UserEntries:
    """The non-zero entries of some users' rows, values decreasing within a row.

    Attributes
    ----------
    row : numpy.ndarray
        Position of the entry's user in the batch (0..n_rows−1), grouped.
    col, val : numpy.ndarray
        Element and value r_ij of each entry.
    last : numpy.ndarray
        Entry is the last of its row.
    by_pos : list of numpy.ndarray
        Entry indices at position p of their row, p = 0, 1, ….
    counts : numpy.ndarray
        Entries per row.
    lookup_keys, lookup_order : numpy.ndarray
        Sorted ``row * m + col`` and the entry of each, to find (row, element) pairs.
    n_rows, n_elements : int
        Batch size and m.
    """

    row: np.ndarray
    col: np.ndarray
    val: np.ndarray
    last: np.ndarray
    by_pos: list[np.ndarray]
    counts: np.ndarray
    lookup_keys: np.ndarray
    lookup_order: np.ndarray
    n_rows: int
    n_elements: int

    @classmethod
    def build(cls, objective: MaxRowObjective, users: np.ndarray) -> UserEntries:
        """Collect the rows of ``users`` (row indices of ``objective``).

        Parameters
        ----------
        objective : MaxRowObjective
            Holds the rows.
        users : numpy.ndarray
            Row indices, in batch order.

        Returns
        -------
        UserEntries
            The batch's entries.
        """
        rows = objective.values[np.asarray(users, dtype=np.int64)]
        counts = np.diff(rows.indptr).astype(np.int64)
        sr = sorted_rows(rows)
        m = objective.n_elements
        keys = sr.row * m + sr.col
        lookup_order = np.argsort(keys, kind="stable")
        return cls(
            sr.row, sr.col, sr.val, sr.last, sr.by_pos, counts, keys[lookup_order],
            lookup_order, int(rows.shape[0]), m,
        )  # fmt: skip

    def find(self, row: np.ndarray, col: np.ndarray) -> np.ndarray:
        """Return the entry index of each (row, element) pair, −1 where there is none."""
        keys = row * self.n_elements + col
        at = np.searchsorted(self.lookup_keys, keys)
        at_c = np.minimum(at, max(self.lookup_keys.size - 1, 0))
        hit = (at < self.lookup_keys.size) & (self.lookup_keys[at_c] == keys)
        return np.where(hit, self.lookup_order[at_c] if self.lookup_keys.size else -1, -1)


def entry_gradient(entries: UserEntries, xe: np.ndarray) -> np.ndarray:
    """Return ∂f̂_i/∂x_j at each entry (i, j), exactly, with x_j given per entry.

    For a row with values v_1 ≥ v_2 ≥ … and q_l = 1 − x_l, ∂_{j_p} = P_p (v_p − T_p) with
    P_p = Π_{l<p} q_l and T_p the expected best of the worse elements (see
    :mod:`flower_app.submodular.multilinear`); per-entry x lets every user have its own
    local iterate.

    Parameters
    ----------
    entries : UserEntries
        The batch.
    xe : numpy.ndarray
        x_j of each entry (in [0, 1]).

    Returns
    -------
    numpy.ndarray
        float64 gradient entries (≥ 0); elements outside a row's support have gradient 0.
    """
    return entry_weights(entries, xe)


def sampled_entry_gradient(
    entries: UserEntries, xe: np.ndarray, uniforms: np.ndarray
) -> np.ndarray:
    """Estimate the gradient from sets R ~ x: mean of f_i(R ∪ {j}) − f_i(R ∖ {j}).

    The estimator of Appendix C.3: it only evaluates f_i on sets. Element j is in the
    s-th set R of its row when ``uniforms[s, entry] < x_j``.

    Parameters
    ----------
    entries : UserEntries
        The batch.
    xe : numpy.ndarray
        x_j of each entry.
    uniforms : numpy.ndarray
        ``(samples, n_entries)`` uniforms in [0, 1) from the users' own streams.

    Returns
    -------
    numpy.ndarray
        Unbiased float64 estimates, one per entry.
    """
    total = np.zeros(entries.val.size)
    for u in uniforms:
        total += set_gains(entries.row, entries.val, u < xe, entries.n_rows)
    return total / max(len(uniforms), 1)


def complete_to_base(
    matroid: Matroid,
    chosen_cols: np.ndarray,
    deficit: np.ndarray,
    blocks: np.ndarray,
    members: list[np.ndarray],
    rng: np.random.Generator,
) -> np.ndarray:
    """Draw the zero-weight elements that complete one user's set to a base, at random.

    Parameters
    ----------
    matroid : Matroid
        Uniform or partition matroid (only used in messages).
    chosen_cols : numpy.ndarray
        The user's positive-weight elements already chosen.
    deficit : numpy.ndarray
        Free places per block.
    blocks : numpy.ndarray
        Block of every element.
    members : list of numpy.ndarray
        Elements of each block.
    rng : numpy.random.Generator
        The user's stream.

    Returns
    -------
    numpy.ndarray
        int64 elements added, block by block (uniformly random among the block's free ones).
    """
    out = []
    for b in np.flatnonzero(deficit > 0):
        block = members[b]
        taken = chosen_cols[blocks[chosen_cols] == b]
        need = int(deficit[b])
        if need + taken.size > block.size:
            raise RuntimeError(f"{matroid}: block {b} cannot hold {need} more elements")
        draw = block[rng.choice(block.size, need + taken.size, replace=False)]
        out.append(draw[~np.isin(draw, taken)][:need])
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class LocalSteps:
    """How a user computes its update: τ steps, the gradient, and the base completion.

    Attributes
    ----------
    steps : int
        τ ≥ 1 local steps (1: FedCG).
    gradient : str
        ``"exact"`` (closed form) or ``"sampled"`` (Appendix C.3 estimator).
    samples : int
        Sets R per gradient estimate (``"sampled"`` only), ≥ 1.
    fill_base : bool
        Complete each LMO answer to a base with random zero-gradient elements (the
        default, as the authors' DBLP script). The filler is noise mass: x becomes
        fractional on almost every element (all 57,910 of a shopping-trips set system, against
        25,552 without), the rounds cost more (9.7 s against 3.3 s there), greedy rounding
        is unaffected (F(S)/greedy 1.0 both ways) and pipage rounding is ruined (0.022
        against 0.849). False sends only the positive-gradient part, also an argmax vertex.
    """

    steps: int = 1
    gradient: str = "exact"
    samples: int = 10
    fill_base: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"local steps τ={self.steps!r} must be a positive int")
        if self.gradient not in GRADIENTS:
            raise ValueError(f"gradient={self.gradient!r}: choose one of {', '.join(GRADIENTS)}")
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"gradient samples m={self.samples!r} must be a positive int")


def user_direction_sum(
    objective: MaxRowObjective,
    users: np.ndarray,
    weights: np.ndarray,
    x: np.ndarray,
    matroid: Matroid,
    local: LocalSteps,
    seed: int,
    server_round: int,
    user_ids: np.ndarray | None = None,
    entries: UserEntries | None = None,
) -> tuple[np.ndarray, int]:
    """Return τ · Σ_i c_i Δ_i over the given users, and the number of element ids they send.

    Parameters
    ----------
    objective : MaxRowObjective
        Holds (at least) these users' rows.
    users : numpy.ndarray
        Distinct row indices of the users in ``objective``.
    weights : numpy.ndarray
        c_i ≥ 0 per user (multiplicity, or p_i with full participation).
    x : numpy.ndarray
        The server's point x^(t) (in P).
    matroid : Matroid
        The constraint.
    local : LocalSteps
        τ, gradient kind, samples, base completion.
    seed : int
        Run seed.
    server_round : int
        Communication round t (seeds the users' streams).
    user_ids : numpy.ndarray, optional
        Global ids of the users (seed their streams); default ``users``.
    entries : UserEntries, optional
        Prebuilt ``UserEntries.build(objective, users)`` (a cache).

    Returns
    -------
    tuple
        ``(vector, ids_sent)``: float64 vector of length m, Σ_i c_i Σ_j v_ij (integer
        multiples of the c_i); and Σ_i τ·|v_i|, the element ids the users would send.
    """
    m = objective.n_elements
    users = np.asarray(users, dtype=np.int64)
    ids = users if user_ids is None else np.asarray(user_ids, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    if ids.shape != users.shape or weights.shape != users.shape:
        raise ValueError("users, user_ids and weights must have the same length")
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    if x.shape != (m,):
        raise ValueError(f"x has shape {x.shape}, expected ({m},)")
    total = np.zeros(m)
    if users.size == 0:
        return total, 0
    ent = entries if entries is not None else UserEntries.build(objective, users)
    rngs = [user_rng(seed, server_round, int(i)) for i in ids]
    structure = block_structure(matroid)
    acc = np.zeros(ent.val.size)  # Σ of the local v's on each entry
    sent = 0
    for _ in range(local.steps):
        xe = np.minimum(x[ent.col] + acc / local.steps, 1.0)
        uniforms, keys = [], []
        for r, c in zip(rngs, ent.counts, strict=True):
            if local.gradient == "sampled":
                uniforms.append(r.random((local.samples, c)))
            keys.append(r.random(c))
        if local.gradient == "sampled":
            grad = sampled_entry_gradient(ent, xe, np.concatenate(uniforms, axis=1))
        else:
            grad = entry_gradient(ent, xe)
        key = np.concatenate(keys) if keys else np.zeros(0)
        if structure is None:
            sel_rows, sel_cols = _general_lmo(matroid, ent, grad, key, rngs, local.fill_base)
        else:
            sel_rows, sel_cols = _block_lmo(matroid, ent, grad, key, rngs, local.fill_base)
        total += np.bincount(sel_cols, weights=weights[sel_rows], minlength=m)
        sent += int(sel_cols.size)
        hit = ent.find(sel_rows, sel_cols)
        np.add.at(acc, hit[hit >= 0], 1.0)
    return total, sent


def _block_lmo(
    matroid: Matroid,
    ent: UserEntries,
    grad: np.ndarray,
    key: np.ndarray,
    rngs: list[np.random.Generator],
    fill_base: bool,
) -> tuple[np.ndarray, np.ndarray]:
    chosen, deficit, blocks = batched_linear_maximizer(
        matroid, ent.row, ent.col, grad, key, ent.n_rows
    )
    rows, cols = [ent.row[chosen]], [ent.col[chosen]]
    if fill_base:
        members = [np.flatnonzero(blocks == b) for b in range(deficit.shape[1])]
        starts = np.concatenate([[0], np.cumsum(ent.counts)])
        for i in np.flatnonzero(deficit.sum(axis=1) > 0):
            mine = ent.col[starts[i] : starts[i + 1]][chosen[starts[i] : starts[i + 1]]]
            extra = complete_to_base(matroid, mine, deficit[i], blocks, members, rngs[i])
            rows.append(np.full(extra.size, i, dtype=np.int64))
            cols.append(extra)
    return np.concatenate(rows), np.concatenate(cols)


def _general_lmo(
    matroid: Matroid,
    ent: UserEntries,
    grad: np.ndarray,
    key: np.ndarray,
    rngs: list[np.random.Generator],
    fill_base: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy with the independence oracle, one user at a time (any matroid)."""
    m = ent.n_elements
    starts = np.concatenate([[0], np.cumsum(ent.counts)])
    rows, cols = [], []
    for i in range(ent.n_rows):
        sl = slice(starts[i], starts[i + 1])
        g = np.zeros(m)
        g[ent.col[sl]] = grad[sl]
        keys = 1.0 + rngs[i].random(m) if fill_base else np.ones(m)
        keys[ent.col[sl]] = key[sl]
        base = linear_maximizer(matroid, g, tie_keys=keys, complete=fill_base)
        rows.append(np.full(base.size, i, dtype=np.int64))
        cols.append(base)
    return np.concatenate(rows), np.concatenate(cols)


# ---------------------------------------------------------------------------- any set function
def _gains(gains: GainsFn, selected: np.ndarray, m: int) -> np.ndarray:
    out = np.asarray(gains(np.asarray(selected, dtype=np.int64)), dtype=np.float64)
    if out.shape != (m,) or not np.all(np.isfinite(out)):
        raise ValueError(f"gains(S) must return a finite float vector of length {m}")
    return np.maximum(out, 0.0)


def sampled_set_gradient(
    gains: GainsFn, x: np.ndarray, samples: int, rng: np.random.Generator
) -> np.ndarray:
    """Estimate ∇F(x) of any monotone set function from its marginal gains (App. C.3).

    ∂F/∂x_j = E_{R∼x}[f(R ∪ {j}) − f(R ∖ {j})]: for each of ``samples`` sets R (j ∈ R with
    probability x_j), one call ``gains(R)`` gives the terms of every j ∉ R and one call
    ``gains(R ∖ {j})`` per j ∈ R the others.

    Parameters
    ----------
    gains : callable
        ``gains(S) -> f(S ∪ {e}) − f(S)`` for every e (float64, length m).
    x : numpy.ndarray
        The point, in [0, 1]^m.
    samples : int
        Sets R drawn.
    rng : numpy.random.Generator
        The user's stream.

    Returns
    -------
    numpy.ndarray
        Unbiased float64 estimate of the gradient (≥ 0).
    """
    m = x.size
    total = np.zeros(m)
    for _ in range(samples):
        in_r = rng.random(m) < x
        members = np.flatnonzero(in_r)
        g = _gains(gains, members, m)
        g[members] = 0.0
        for j in members:
            g[j] = _gains(gains, members[members != j], m)[j]
        total += g
    return total / max(samples, 1)


def set_function_direction(
    gains: GainsFn,
    x: np.ndarray,
    matroid: Matroid,
    local: LocalSteps,
    seed: int,
    server_round: int,
    user_id: int,
    gradient: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, int]:
    """Return τ · Δ_i of one user whose f_i is known only through its marginal gains.

    The same τ local continuous-greedy steps as :func:`user_direction_sum`, for any
    monotone submodular f_i: the gradient is ``gradient(x)`` when the user can compute it
    exactly (and ``local.gradient == "exact"``), else the sampling estimate of
    :func:`sampled_set_gradient` with ``local.samples`` sets; the LMO is
    :func:`~flower_app.submodular.polytope.linear_maximizer` with random tie keys.

    Parameters
    ----------
    gains : callable
        ``gains(S) -> f_i(S ∪ {e}) − f_i(S)`` for every e.
    x : numpy.ndarray
        The server's point (clipped to [0, 1]).
    matroid : Matroid
        The constraint.
    local : LocalSteps
        τ, gradient kind, samples, base completion.
    seed, server_round, user_id : int
        Seed the user's stream ``default_rng([seed, server_round, user_id])``.
    gradient : callable, optional
        ``gradient(x) -> ∇F_i(x)`` (float64, length m), the exact multilinear gradient.

    Returns
    -------
    tuple
        ``(vector, ids_sent)``: the sum of the τ vertices (float64, length m) and the
        number of element ids in them.
    """
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    m = matroid.n_elements
    if x.shape != (m,):
        raise ValueError(f"x has shape {x.shape}, expected ({m},)")
    rng = user_rng(seed, server_round, int(user_id))
    total = np.zeros(m)
    sent = 0
    for _ in range(local.steps):
        xi = np.minimum(x + total / local.steps, 1.0)
        if gradient is not None and local.gradient == "exact":
            g = np.asarray(gradient(xi), dtype=np.float64)
            if g.shape != (m,) or not np.all(np.isfinite(g)):
                raise ValueError(f"gradient(x) must return a finite vector of length {m}")
        else:
            g = sampled_set_gradient(gains, xi, local.samples, rng)
        base = linear_maximizer(
            matroid, np.maximum(g, 0.0), tie_keys=rng.random(m), complete=local.fill_base
        )
        total[base] += 1.0
        sent += int(base.size)
    return total, sent


def matroid_spec(matroid: Matroid) -> tuple[int, np.ndarray | None, np.ndarray | None]:
    """Describe a uniform or partition matroid for a message: ``(k, groups, capacities)``.

    Returns ``(k, None, None)`` for a uniform matroid of rank k (the client knows m), and
    ``(0, groups int64 (m,), capacities int64 (G,))`` for a partition matroid.
    """
    if isinstance(matroid, UniformMatroid):
        return int(matroid.k), None, None
    if isinstance(matroid, PartitionMatroid):
        return 0, matroid.groups.astype(np.int64), matroid.capacities.astype(np.int64)
    raise ValueError(f"{matroid} cannot be sent to clients: use a uniform or partition matroid")


def matroid_from_spec(
    n_elements: int, k: int, groups: np.ndarray | None, capacities: np.ndarray | None
) -> Matroid:
    """Rebuild the matroid of :func:`matroid_spec` (checked against the client's m)."""
    if groups is None:
        return UniformMatroid(int(n_elements), int(k))
    groups = np.asarray(groups)
    if groups.shape != (n_elements,) or groups.dtype.kind not in "iu":
        raise ValueError(f"matroid groups must be {n_elements} integer block ids")
    if capacities is None:
        raise ValueError("a partition matroid needs its capacities")
    return PartitionMatroid(groups, np.asarray(capacities).astype(np.int64))


# ---------------------------------------------------------------------------- server side
@dataclass
class FedCGRound:
    """What one communication round did and cost.

    Attributes
    ----------
    server_round : int
        Round number, from 1.
    users : int
        Distinct users that took part.
    draws : int
        Client draws K (= users with full participation).
    weight : float
        Σ c_i of the users whose updates arrived.
    ids_sent : int
        Element ids the users sent (τ·r per user with bases).
    step_norm : float
        ‖η Δ‖₁ added to x.
    """

    server_round: int
    users: int
    draws: int
    weight: float
    ids_sent: int
    step_norm: float


@dataclass
class FedCGServer:
    """Server state of FedCG / FedCG+: x, the round counter and the server's generator.

    Parameters
    ----------
    n_users : int
        Number of users N.
    matroid : Matroid
        The constraint M (x stays in its polytope).
    rounds : int
        Communication rounds (T for FedCG, T/τ for FedCG+), ≥ 1.
    eta : float
        Server step η > 0 with η · rounds ≤ 1 (so that x stays in P); 0 means 1/rounds.
    local : LocalSteps
        The users' computation (τ = 1: FedCG).
    clients_per_round : int or float
        K draws per round (count, or fraction of N); the float 1.0 means full
        participation.
    p : numpy.ndarray, optional
        Client weights p_i ≥ 0 summing to 1 (default uniform 1/N).
    seed : int
        Seeds the server's generator (sampling, rounding) and the users' streams.
    rounding : str
        ``"pipage"`` (randomised, then completed to a base by decreasing x) or
        ``"greedy"``.
    """

    n_users: int
    matroid: Matroid
    rounds: int
    eta: float
    local: LocalSteps
    clients_per_round: int | float = 1.0
    p: np.ndarray | None = None
    seed: int = 0
    rounding: str = "pipage"
    x: np.ndarray = field(init=False)
    t: int = field(init=False, default=0)
    history: list[FedCGRound] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be a non-negative int")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"T={self.rounds!r}: the number of rounds must be a positive int")
        eta = float(self.eta)
        if not np.isfinite(eta) or eta < 0:
            raise ValueError(f"η={self.eta!r} must be positive (0 selects η = 1/T)")
        self.eta = eta if eta > 0 else 1.0 / self.rounds
        if self.eta * self.rounds > 1 + 1e-12:
            raise ValueError(
                f"η·T = {self.eta}·{self.rounds} = {self.eta * self.rounds:.4g} > 1: x would "
                "leave the matroid polytope; lower η or T"
            )
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding={self.rounding!r}: choose one of {', '.join(ROUNDINGS)}")
        if self.n_users < 1:
            raise ValueError("FedCG needs at least one user")
        if self.p is None:
            self.p = np.full(self.n_users, 1.0 / self.n_users)
        else:
            p = np.asarray(self.p, dtype=np.float64)
            if p.shape != (self.n_users,) or not np.all(np.isfinite(p)) or (p < 0).any():
                raise ValueError(f"p must hold {self.n_users} finite non-negative weights")
            if abs(p.sum() - 1.0) > 1e-9:
                raise ValueError(f"the client weights p_i sum to {p.sum():.12g}, not 1")
            self.p = p
        self.full = isinstance(self.clients_per_round, float) and self.clients_per_round == 1.0
        self.K = (
            self.n_users
            if self.full
            else resolve_count(self.clients_per_round, self.n_users, "clients-per-round")
        )
        self._uniform = bool(np.all(self.p == self.p[0]))
        self.rng = np.random.default_rng(self.seed)
        self.x = np.zeros(self.matroid.n_elements)

    @property
    def done(self) -> bool:
        """True after the last round."""
        return self.t >= self.rounds

    def sample(self) -> tuple[np.ndarray, np.ndarray]:
        """Pick the coming round's users.

        Returns
        -------
        tuple of numpy.ndarray
            Sorted distinct global user ids and their weights c_i: multiplicities of the
            K draws (client sampling scheme), or p_i (full participation; 1 when uniform,
            so that sums stay exact).
        """
        if self.full:
            users = np.arange(self.n_users, dtype=np.int64)
            weights = np.ones(self.n_users) if self._uniform else self.p.copy()
            return users, weights
        draws = self.rng.choice(self.n_users, size=self.K, replace=True, p=self.p)
        users, counts = np.unique(draws, return_counts=True)
        return users.astype(np.int64), counts.astype(np.float64)

    def step(
        self, direction_sum: np.ndarray, weight: float, users: int, ids_sent: int
    ) -> FedCGRound:
        """Apply x ← x + η · direction_sum / (τ · weight).

        Parameters
        ----------
        direction_sum : numpy.ndarray
            τ · Σ_i c_i Δ_i over the users whose updates arrived.
        weight : float
            Σ_i c_i over the same users (0: no update arrived; x is kept).
        users : int
            Distinct users in the sum.
        ids_sent : int
            Element ids sent by the users.

        Returns
        -------
        FedCGRound
            The round's record (also appended to ``history``).
        """
        m = self.matroid.n_elements
        direction_sum = np.asarray(direction_sum, dtype=np.float64)
        if direction_sum.shape != (m,) or not np.all(np.isfinite(direction_sum)):
            raise ValueError(f"the direction sum must be a finite vector of length {m}")
        self.t += 1
        step = np.zeros(m)
        if weight > 0:
            step = self.eta * direction_sum / (self.local.steps * weight)
            self.x = self.x + step
        record = FedCGRound(
            self.t, int(users), int(self.K), float(weight), int(ids_sent), float(step.sum())
        )
        self.history.append(record)
        return record

    def round_solution(self) -> list[int]:
        """Round x to an independent set (oblivious; the server's own generator)."""
        return round_point(self.x, self.matroid, self.rounding, self.rng)


def round_point(
    x: np.ndarray, matroid: Matroid, rounding: str, rng: np.random.Generator
) -> list[int]:
    """Round a point of P(M) to an independent set without looking at the objective.

    Parameters
    ----------
    x : numpy.ndarray
        A point of the polytope (checked: a clear error otherwise).
    matroid : Matroid
        Uniform or partition matroid.
    rounding : str
        ``"pipage"``: pipage rounding (P[j ∈ S] = x_j), then completed to a base by
        decreasing x_j (still oblivious; more elements never hurt a monotone F);
        ``"greedy"``: elements by decreasing x_j while independent; ``"swap"``: swap
        rounding (same marginals), completed like pipage (not a ``fedcg-rounding`` value).
        Each is O(m log m) (see :mod:`flower_app.submodular.rounding`).
    rng : numpy.random.Generator
        Randomness of pipage and swap rounding.

    Returns
    -------
    list of int
        Sorted element ids of an independent set.
    """
    y = check_in_polytope(x, matroid)
    if rounding == "greedy":
        return greedy_rounding(y, matroid)
    if rounding == "pipage":
        return complete_by_order(pipage_rounding(y, matroid, rng), y, matroid)
    if rounding == "swap":
        return complete_by_order(swap_rounding(y, matroid, rng), y, matroid)
    raise ValueError(f"rounding={rounding!r}: choose one of {', '.join(ROUNDINGS)} (or swap)")
