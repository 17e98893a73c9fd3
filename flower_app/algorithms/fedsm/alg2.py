"""FedSM Algorithm 2 (O(log m) communication rounds): the math, with no Flower import.

Rafiey, Namani & Charalambides (2025), Section 4. State: S, the surviving set X, the
threshold τ. One communication round:

1. the server samples K users and draws a *random feasible sequence* a_1..a_r' from X
   (each a_l uniform among the elements of X still feasible with S ∪ {a_1..a_{l−1}}), so
   r' = rank(M(S, X)), truncated at k − |S|;
2. each sampled user i draws d distinct pairs (e, j) ∈ X × {1..r'} from its own stream
   ``default_rng([seed, t, i])`` and reports f_i(e | S ∪ {a_1..a_j}); a node sums its users;
3. the server scales the sum by |X|·r'/(dK) — the unbiased estimate F̂ of Lemma A.3 — and
   forms X_j = {e ∈ X : S ∪ {a_1..a_j, e} ∈ I, F̂(e | S ∪ {a_1..a_j}) ≥ τ}
   (X_{r'} = ∅: a_1..a_r' is a basis of M(S, X));
   j* = min{j : |X_j| ≤ (1 − ε)|X|}; S ← S ∪ {a_1..a_j*}; X ← X_j*;
4. when X is empty, τ ← (1 − ε)τ and X ← the elements still feasible with S (a new
   threshold level). The run ends when |S| = k, nothing is feasible, or τ has fallen below
   ε·τ₀/k (:func:`default_levels`; the paper's O(ε⁻¹ log(r/ε)) levels) or a configured
   number of levels.

A report is a vector over the pairs, pair index = (position of e in X)·r' + (j − j₀),
j₀ = ``j_from``. The
server step (:class:`FedSMAlg2Server`) and the users' step (:func:`pair_report_sum`) are
shared by the Flower strategy and the direct engine.

Choices where the paper is silent (also in the README):

* ``j_from = 1`` (default) is the pseudo-code's j ∈ {1..r'}: j* ≥ 1, so every round adds
  at least a_1, even when τ is above every gain (e.g. at τ = λ): each such threshold level
  adds one random element. ``j_from = 0`` uses j ∈ {0..r'−1} (the same |X|·r' pairs, so the
  same scale) and allows j* = 0 — shrink X, add nothing — as in Balkanski et al. (2019),
  whose algorithm this adapts, and as the proof of Lemma A.5 needs (a_1 must come from a
  large X_0). The authors' code (prefix ``a[0..j]``, j ∈ [r']) can be read either way.
* d given as an int is a cap, min(d, |X|·r') each round (the authors' ``d_cap``); given as a
  float it is a fraction of |X|·r'. τ ≤ 0 means τ = λ = max_{e,i} f_i({e}) (the paper's).
* A round without a valid reply changes nothing (it is still counted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from flower_app.algorithms.common.counts import resolve_count
from flower_app.algorithms.common.greedy_step import check_greedy_run
from flower_app.algorithms.fedsm.sampling import check_scheme, sample_users, support_draw, user_draw
from flower_app.submodular.matroids import Matroid, UniformMatroid
from flower_app.submodular.objectives import MaxRowObjective

__all__ = [
    "Alg2Round",
    "FedSMAlg2Server",
    "PairGains",
    "PlainPairGains",
    "default_levels",
    "feasibility_table",
    "pair_report_sum",
    "random_feasible_sequence",
    "support_elements",
]

#: users whose pairs are evaluated together (bounds memory: a dense chunk × m block)
_CHUNK = 512


def default_levels(k: int, epsilon: float) -> int:
    """Return the threshold levels that take τ from τ₀ below ε·τ₀/k: ⌈ln(k/ε)/ln(1/(1−ε))⌉.

    This is the paper's O(ε⁻¹ log(r/ε)) with the constant of the decay (1 − ε): below
    ε·λ/r, the r elements still to come can add at most ε·λ ≤ ε·OPT (Appendix A.2).
    """
    return max(1, math.ceil(math.log(max(k, 1) / epsilon) / -math.log1p(-epsilon)))


def random_feasible_sequence(
    matroid: Matroid,
    selected: Sequence[int],
    pool: np.ndarray,
    limit: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Draw a random feasible sequence a_1..a_r' from ``pool`` (Balkanski et al., 2019).

    Each a_l is uniform among the elements of ``pool`` that keep S ∪ {a_1..a_l} independent;
    drawing stops when none is left or after ``limit`` elements, so the length is
    r' = min(limit, rank(M(S, pool))).

    Parameters
    ----------
    matroid : Matroid
        The constraint.
    selected : sequence of int
        The current independent set S.
    pool : numpy.ndarray
        Sorted candidate elements X (outside S).
    limit : int
        Largest length (k − |S|).
    rng : numpy.random.Generator
        The server's generator.

    Returns
    -------
    numpy.ndarray
        int64 sequence a_1..a_r'.
    """
    if isinstance(matroid, UniformMatroid):  # every element of the pool stays feasible
        length = min(limit, matroid.k - len(selected), pool.size)
        return rng.choice(pool, size=max(length, 0), replace=False).astype(np.int64)
    in_pool = np.zeros(matroid.n_elements, dtype=bool)
    in_pool[pool] = True
    seq: list[int] = []
    while len(seq) < limit:
        cand = np.flatnonzero(matroid.feasible_mask([*selected, *seq]) & in_pool)
        if cand.size == 0:
            break
        seq.append(int(cand[rng.integers(cand.size)]))
    return np.asarray(seq, dtype=np.int64)


def feasibility_table(
    matroid: Matroid,
    selected: Sequence[int],
    pool: np.ndarray,
    sequence: np.ndarray,
    k: int,
    j_from: int = 0,
) -> np.ndarray:
    """Return F[x, c] = (S ∪ {a_1..a_j, pool[x]} is independent, ≤ k elements), j = c + j_from.

    Parameters
    ----------
    matroid : Matroid
        The constraint.
    selected : sequence of int
        S.
    pool : numpy.ndarray
        X.
    sequence : numpy.ndarray
        a_1..a_r'.
    k : int
        Cardinality cap of the run.
    j_from : int, optional
        Prefix length of column 0 (0 or 1).

    Returns
    -------
    numpy.ndarray
        bool array (|X|, r'), column c for the prefix a_1..a_{c + j_from}.
    """
    out = np.zeros((pool.size, sequence.size), dtype=bool)
    base = list(selected)
    for c in range(sequence.size):
        j = c + j_from
        if len(base) + j >= k or j > sequence.size:
            break
        out[:, c] = matroid.feasible_mask([*base, *sequence[:j].tolist()])[pool]
    return out


class PairGains(Protocol):
    """Evaluates the users' values for sampled (e, j) pairs (plain objective or surrogate)."""

    def active(self, users: np.ndarray, pool: np.ndarray) -> np.ndarray:
        """Return positions (into ``users``) of users that may report a positive value."""
        ...

    def evaluate(
        self, users: np.ndarray, upos: np.ndarray, elem: np.ndarray, jdx: np.ndarray
    ) -> np.ndarray:
        """Return user ``users[upos]``'s value for pair (elem, prefix a_1..a_{jdx + j_from})."""
        ...


def support_elements(
    objective: MaxRowObjective, rows: np.ndarray, current: np.ndarray | None, pool: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return (row position, position in X) of the elements where a user can gain.

    The entries of the users' rows in X, with r_ie > f_i(S) when ``current`` (f_i(S)) is
    given: outside them every pair value f_i(e | S ∪ {a_1..a_j}) (or its surrogate) is 0.
    This is the support A_i that the batched draw of :func:`pair_report_sum` samples from.
    """
    sub = objective.values[np.asarray(rows, dtype=np.int64)]
    row_of = np.repeat(np.arange(sub.shape[0]), np.diff(sub.indptr))
    pos_of = np.full(objective.n_elements, -1, dtype=np.int64)
    pos_of[pool] = np.arange(pool.size)
    xpos = pos_of[sub.indices]
    keep = (xpos >= 0) & (sub.data > 0)
    if current is not None:
        keep &= sub.data > current[row_of]
    return row_of[keep], xpos[keep]


class SequencePairs:
    """What pair values are computed from: the users' rows, the sequence a_1..a_r' and j₀.

    The base of :class:`PlainPairGains` and of the amplification's
    :class:`~flower_app.algorithms.fedsm.amplify.SurrogatePairGains`.
    """

    def __init__(
        self, objective: MaxRowObjective, users: np.ndarray, sequence: np.ndarray, j_from: int
    ) -> None:
        self.j_from = int(j_from)
        self.objective = objective
        self.users = np.asarray(users, dtype=np.int64)
        self.sequence = np.asarray(sequence, dtype=np.int64)

    def pool_mask(self, pool: np.ndarray) -> np.ndarray:
        """Return a bool mask over E of the elements in X = ``pool``."""
        in_pool = np.zeros(self.objective.n_elements, dtype=bool)
        in_pool[pool] = True
        return in_pool


class PlainPairGains(SequencePairs):
    """f_i(e | S ∪ {a_1..a_j}) = max(0, r_ie − max(f_i(S), max_{l ≤ j} r_{i a_l})), j < r'.

    Parameters
    ----------
    objective : MaxRowObjective
        Holds the users' rows.
    users : numpy.ndarray
        Row indices of the users that will be evaluated.
    selected : sequence of int
        S.
    sequence : numpy.ndarray
        a_1..a_r'.
    j_from : int, optional
        Prefix length of pair column 0 (0 or 1).
    """

    def __init__(
        self,
        objective: MaxRowObjective,
        users: np.ndarray,
        selected: Sequence[int],
        sequence: np.ndarray,
        j_from: int = 0,
    ) -> None:
        super().__init__(objective, users, sequence, j_from)
        self.current = objective.user_values(list(selected), self.users)

    def active(self, users: np.ndarray, pool: np.ndarray) -> np.ndarray:
        """Return positions of the users with a positive gain f_i(e | S) for some e ∈ X."""
        upos, elem, _ = self.objective.positive_gain_entries(self.current, self.users)
        return np.unique(upos[self.pool_mask(pool)[elem]])

    def evaluate(
        self, users: np.ndarray, upos: np.ndarray, elem: np.ndarray, jdx: np.ndarray
    ) -> np.ndarray:
        """Return the gains of the pairs (``users`` are positions into the constructor's)."""
        rows = self.objective.values[self.users[users]]
        dense = rows.toarray()
        prefix = np.hstack([self.current[users][:, None], dense[:, self.sequence]])
        best = np.maximum.accumulate(prefix, axis=1)  # column j: f_i(S ∪ {a_1..a_j})
        return np.maximum(dense[upos, elem] - best[upos, jdx + self.j_from], 0.0)

    def support(self, users: np.ndarray, pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return (index into ``users``, position in X) of the elements with f_i(e | S) > 0."""
        upos, xpos = support_elements(self.objective, self.users[users], self.current[users], pool)
        return upos, xpos


def pair_report_sum(
    gains: PairGains,
    users: np.ndarray,
    ids: np.ndarray,
    pool: np.ndarray,
    r_prime: int,
    d: int,
    seed: int,
    server_round: int,
    rng: str = "per-user",
) -> tuple[np.ndarray, int]:
    """Return Σ_i Σ_{(e, j) ∈ D_i} value_i(e, j) over the pairs, and the positive values sent.

    Pair p = x·r' + c stands for (X[x], prefix a_1..a_{c + j_from}), c = 0..r'−1.
    ``rng="per-user"``: D_i = ``user_rng(seed, t, ids[i]).choice(|X|·r', d,
    replace=False)``. ``"batched"``: when ``gains`` has ``support(users, pool)`` (the
    elements of X where user i can gain; its pairs are those elements × every prefix), only
    D_i ∩ A_i is drawn for all users at once
    (:func:`~flower_app.algorithms.fedsm.sampling.support_draw`, the same law in time
    proportional to |A_i|); otherwise D_i is drawn densely from the keyed generator
    (:func:`~flower_app.algorithms.fedsm.sampling.dense_draw`).

    Parameters
    ----------
    gains : PairGains
        Evaluator of the users' values (positions refer to ``users``).
    users : numpy.ndarray
        Row indices of the sampled users (only their count and order matter here).
    ids : numpy.ndarray
        Their global ids (seed the users' streams).
    pool : numpy.ndarray
        X.
    r_prime : int
        Length of the sequence.
    d : int
        Pairs per user, 1 ≤ d ≤ |X|·r'.
    seed : int
        Run seed.
    server_round : int
        Communication round (seeds the streams).
    rng : str, optional
        ``"per-user"`` (default) or ``"batched"``.

    Returns
    -------
    tuple
        ``(sum, hits)``: float64 vector of length |X|·r', and the number of drawn
        (user, pair) values that were positive.
    """
    n_pairs = pool.size * r_prime
    if not 1 <= d <= n_pairs:
        raise ValueError(f"d={d} pairs must lie in 1..|X|·r' = {n_pairs}")
    ids = np.asarray(ids, dtype=np.int64)
    if ids.shape != np.shape(users):
        raise ValueError("ids must have one id per user")
    batched = check_scheme(rng) == "batched"
    if batched and hasattr(gains, "support"):
        return _support_pair_sum(gains, len(users), ids, pool, r_prime, d, seed, server_round)
    out = np.zeros(n_pairs)
    hits = 0
    active = gains.active(np.arange(len(users)), pool) if len(users) else np.zeros(0, int)
    for start in range(0, active.size, _CHUNK):
        chunk = active[start : start + _CHUNK]
        draws = np.stack([user_draw(ids[a], n_pairs, d, seed, server_round, rng) for a in chunk])
        upos = np.repeat(np.arange(chunk.size), d)
        pair = draws.ravel()
        value = gains.evaluate(chunk, upos, pool[pair // r_prime], pair % r_prime)
        hits += int(np.count_nonzero(value > 0))
        out += np.bincount(pair, weights=value, minlength=n_pairs)
    return out, hits


def _support_pair_sum(
    gains: PairGains,
    n_users: int,
    ids: np.ndarray,
    pool: np.ndarray,
    r_prime: int,
    d: int,
    seed: int,
    server_round: int,
) -> tuple[np.ndarray, int]:
    """:func:`pair_report_sum`'s batched draw over the users' supports (elements × prefixes)."""
    n_pairs = pool.size * r_prime
    out = np.zeros(n_pairs)
    if n_users == 0:
        return out, 0
    upos, xpos = gains.support(np.arange(n_users), pool)  # type: ignore[attr-defined]
    upos = np.repeat(upos, r_prime)
    pair = np.repeat(xpos, r_prime) * r_prime + np.tile(np.arange(r_prime), xpos.size)
    drawn = support_draw(upos, pair, ids, n_pairs, d, seed, server_round)
    upos, pair = upos[drawn], pair[drawn]
    hits = 0
    active = np.unique(upos)
    bounds = np.searchsorted(upos, active)
    for start in range(0, active.size, _CHUNK):
        chunk = active[start : start + _CHUNK]
        lo = bounds[start]
        hi = bounds[start + _CHUNK] if start + _CHUNK < active.size else upos.size
        local = np.searchsorted(chunk, upos[lo:hi])
        value = gains.evaluate(chunk, local, pool[pair[lo:hi] // r_prime], pair[lo:hi] % r_prime)
        hits += int(np.count_nonzero(value > 0))
        out += np.bincount(pair[lo:hi], weights=value, minlength=n_pairs)
    return out, hits


@dataclass
class Alg2Round:
    """What one communication round of Algorithm 2 did and cost.

    Attributes
    ----------
    server_round : int
        Communication round, from 1.
    added : list of int
        Elements added (a_1..a_j*); empty when j* = 0 or no valid reply arrived.
    j_star : int
        j* (0: the round only shrank X).
    r_prime : int
        Length of the random feasible sequence.
    pool_before, pool_after : int
        |X| before and after the round.
    tau : float
        Threshold used.
    level : int
        Threshold level (0-based).
    users : int
        Users whose reports arrived.
    d : int
        Pairs each user drew.
    user_values : int
        Values reported by users, users·d.
    """

    server_round: int
    added: list[int]
    j_star: int
    r_prime: int
    pool_before: int
    pool_after: int
    tau: float
    level: int
    users: int
    d: int
    user_values: int


@dataclass
class FedSMAlg2Server:
    """Server state of FedSM Algorithm 2: S, X, τ, and the server's generator.

    Parameters
    ----------
    n_users : int
        Number of users n.
    matroid : Matroid
        The constraint (uniform or partition; any :class:`Matroid` works).
    k : int
        Largest |S| (r of the paper; ≤ rank).
    clients_per_round : int or float
        K as a count or a fraction of n.
    pairs_per_client : int or float
        d: an int caps the pairs per user (min(d, |X|·r')), a float is a fraction of |X|·r'.
    epsilon : float
        ε ∈ (0, 1): X must shrink by a factor (1 − ε) per round; τ decays by (1 − ε).
    tau : float
        Initial threshold; ≤ 0 means λ.
    lam : float
        λ = max_{e,i} f_i({e}) (the paper assumes it known; used when ``tau`` ≤ 0).
    levels : int, optional
        Number of threshold levels; 0 (default) means :func:`default_levels`, i.e. until τ
        falls below ε·τ₀/k; −1 means no cap: until |S| = k (the authors' loop; with
        ``j_from = 0``, whose rounds may add nothing, also until τ < 10⁻⁹τ₀).
    j_from : int, optional
        1 (default, the pseudo-code: j ∈ 1..r') or 0 (j ∈ 0..r'−1, j* = 0 allowed).
    seed : int, optional
        Seeds the server's generator and the users' streams.
    rng : numpy.random.Generator, optional
        Use this generator instead of ``default_rng(seed)``.
    """

    n_users: int
    matroid: Matroid
    k: int
    clients_per_round: int | float
    pairs_per_client: int | float
    epsilon: float
    tau: float
    lam: float
    levels: int = 0
    seed: int = 0
    rng: np.random.Generator | None = field(default=None, repr=False)
    j_from: int = 1
    selected: list[int] = field(default_factory=list)
    rounds: list[Alg2Round] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_greedy_run(self.seed, self.k, self.matroid)
        if not (math.isfinite(self.epsilon) and 0.0 < self.epsilon < 1.0):
            raise ValueError(f"epsilon={self.epsilon} must lie in (0, 1)")
        m = self.matroid.n_elements
        self.K = resolve_count(self.clients_per_round, self.n_users, "clients-per-round")
        spec = self.pairs_per_client
        if isinstance(spec, bool) or not isinstance(spec, int | float):
            raise ValueError(f"pairs per client d={spec!r}: expected an int cap or a fraction")
        if isinstance(spec, float) and not (math.isfinite(spec) and 0.0 < spec <= 1.0):
            raise ValueError(f"pairs per client d={spec}: a fraction must lie in (0, 1]")
        if isinstance(spec, int) and not 1 <= spec <= m * self.k:
            raise ValueError(
                f"pairs per client d={spec} is impossible: the pair space X × {{1..r'}} has "
                f"at most |E|·k = {m * self.k} pairs"
            )
        tau0 = self.tau if self.tau > 0 else self.lam
        if not (math.isfinite(tau0) and tau0 > 0):
            raise ValueError(f"threshold tau={self.tau} with lambda={self.lam}: need τ > 0")
        if isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < -1:
            raise ValueError(f"levels={self.levels!r} must be an int >= -1 (0: the paper's)")
        if self.j_from not in (0, 1):
            raise ValueError(f"j_from={self.j_from!r} must be 0 or 1")
        cap: float = self.levels or default_levels(self.k, self.epsilon)
        if self.levels < 0 and self.j_from == 1:  # every round adds a_1: ends by |S| = k
            cap = math.inf
        elif self.levels < 0:  # j* = 0 rounds add nothing: stop once τ < 1e-9·τ₀
            cap = math.ceil(math.log(1e-9) / math.log1p(-self.epsilon)) + 1
        self.max_levels = cap
        self.tau_now = float(tau0)
        self.level = 0
        if self.rng is None:
            self.rng = np.random.default_rng(self.seed)
        self.pool = self._fresh_pool()
        self.sequence = np.zeros(0, dtype=np.int64)
        self.server_round = 0

    def _fresh_pool(self) -> np.ndarray:
        if len(self.selected) >= self.k:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.matroid.feasible_mask(self.selected)).astype(np.int64)

    @property
    def done(self) -> bool:
        """True once |S| = k, nothing is feasible, or the threshold levels are used up."""
        return (
            len(self.selected) >= self.k or self.pool.size == 0 or (self.level >= self.max_levels)
        )

    def round_d(self) -> int:
        """Return d for the planned round: the cap or fraction applied to |X|·r'."""
        n_pairs = self.pool.size * self.sequence.size
        spec = self.pairs_per_client
        if isinstance(spec, float):
            return max(1, math.floor(spec * n_pairs + 1e-9))
        return min(int(spec), n_pairs)

    def plan(self) -> tuple[np.ndarray, np.ndarray]:
        """Draw the coming round's users and random feasible sequence.

        Returns
        -------
        tuple of numpy.ndarray
            ``(users, sequence)``: sorted global user ids and a_1..a_r' (also kept in
            ``sequence``; ``pool`` is X).
        """
        if self.done:
            raise RuntimeError("the run is over")
        users = sample_users(self.rng, self.n_users, self.K)
        self.sequence = random_feasible_sequence(
            self.matroid, self.selected, self.pool, self.k - len(self.selected), self.rng
        )
        return users, self.sequence

    def update(self, report_sum: np.ndarray, users: int) -> Alg2Round:
        """Apply the round: estimates, X_j, j*, S ← S ∪ {a_1..a_j*}, X ← X_j*.

        Parameters
        ----------
        report_sum : numpy.ndarray
            Unscaled sum of the users' pair reports, length |X|·r'.
        users : int
            Number of users whose reports are in the sum.

        Returns
        -------
        Alg2Round
            The round's record (also appended to ``rounds``).
        """
        pool, seq = self.pool, self.sequence
        r_prime = seq.size
        n_pairs = pool.size * r_prime
        if report_sum.shape != (n_pairs,) or not np.all(np.isfinite(report_sum)):
            raise ValueError(f"report sum must be a finite vector of length |X|·r' = {n_pairs}")
        d = self.round_d()
        self.server_round += 1
        record = Alg2Round(
            server_round=self.server_round,
            added=[],
            j_star=0,
            r_prime=r_prime,
            pool_before=int(pool.size),
            pool_after=int(pool.size),
            tau=self.tau_now,
            level=self.level,
            users=int(users),
            d=d,
            user_values=int(users) * d,
        )
        if users > 0:
            est = report_sum.reshape(pool.size, r_prime) * (n_pairs / (d * users))
            ok = feasibility_table(self.matroid, self.selected, pool, seq, self.k, self.j_from)
            ok &= est >= self.tau_now
            sizes = np.append(ok.sum(axis=0), 0)  # |X_j| for j = j_from.., and X_r' = ∅
            col = int(np.flatnonzero(sizes <= (1.0 - self.epsilon) * pool.size)[0])
            j_star = min(col + self.j_from, r_prime)
            record.added = [int(e) for e in seq[:j_star]]
            record.j_star = j_star
            self.selected.extend(record.added)
            self.pool = pool[ok[:, col]] if col < r_prime else pool[:0]
            record.pool_after = int(self.pool.size)
        if self.pool.size == 0 and len(self.selected) < self.k:
            self.tau_now *= 1.0 - self.epsilon
            self.level += 1
            if self.level < self.max_levels:
                self.pool = self._fresh_pool()
        self.sequence = np.zeros(0, dtype=np.int64)
        self.rounds.append(record)
        return record
