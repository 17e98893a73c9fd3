"""FedSM Algorithm 1 (Rafiey, Namani & Charalambides, 2025): the math, with no Flower import.

One communication round t = 1..r (r = k ≤ rank):

1. the server samples K users uniformly without replacement and sends them S;
2. each sampled user i draws d distinct elements D_i of E \\ S uniformly at random from its
   own stream ``numpy.random.default_rng([seed, t, i])`` and reports f_i(e | S), e ∈ D_i;
3. the server sums the reports, scales by |E \\ S| / (dK) — the unbiased estimate
   F̂(e | S) of F(e | S) = (1/n) Σ_i f_i(e | S), Eq. (3) — and adds
   argmax_{e : S ∪ {e} ∈ I} F̂(e | S) to S.

The server step (:class:`FedSMServer`) and the users' step (:func:`user_report_sum`) are
shared by the Flower strategy and by the direct engine (the repository's ``direct/``), so
both give the same S for the same seed. Because every user has its own random stream, the sum a
node reports for its sampled users does not depend on how users are split over nodes.

Choices where the paper is silent (also in the README):

* ``d`` given as a fraction is a fraction of m = |E| (the paper's d = ⌊m/10⌋), capped at
  |E \\ S| in each round; ``K`` given as a fraction is ⌊K·n⌋, at least 1.
* The argmax is taken on the unscaled sum (the scale is a positive constant per round),
  ties to the lowest element index, exactly as in :func:`~flower_app.submodular.greedy.greedy`;
  with K = n and d = |E \\ S| the algorithm therefore *is* centralized greedy.
* A user whose gains are all zero (e.g. an already covered researcher) reports only zeros
  whatever D_i is, so its draw is skipped; this changes no result.

A deviation from the paper, the app's default (run_config ``fedsm-history-clamp =
"noise-aware"``; ``FedSMServer(history_clamp="noise-aware")``, while this class's own default
is ``"off"``, the paper's maths): the argmax over the estimates held to the mean of each
element's estimates so far plus c standard errors of that mean (``"mean"``: to the mean
itself; :mod:`flower_app.algorithms.robust.history`), against a few dishonest users whose
claims win a round by the noise of one round's sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from flower_app.algorithms.common.counts import resolve_count
from flower_app.algorithms.common.greedy_step import best_feasible, check_greedy_run
from flower_app.algorithms.fedsm.sampling import check_scheme, sample_users, support_draw, user_draw
from flower_app.algorithms.robust.history import GainHistory, clamp_margin
from flower_app.submodular.matroids import Matroid
from flower_app.submodular.objectives import MaxRowObjective

__all__ = [
    "FedSMRound",
    "FedSMServer",
    "check_report",
    "decode_report",
    "sampled_entry_sum",
    "user_report_sum",
]

#: bytes of one sparse report entry on the wire: int32 element id + float64 value
ENTRY_BYTES = 12
#: users processed together when building the membership masks (bounds memory)
_CHUNK = 2048


def user_report_sum(
    objective: MaxRowObjective,
    users: np.ndarray,
    selected: Sequence[int],
    d: int,
    seed: int,
    server_round: int,
    user_ids: np.ndarray | None = None,
) -> np.ndarray:
    """Return Σ_{i ∈ users} Σ_{e ∈ D_i} f_i(e | S) e_e: the users' reports, summed.

    Parameters
    ----------
    objective : MaxRowObjective
        Holds the rows of (at least) these users.
    users : numpy.ndarray
        Row indices of the sampled users in ``objective``.
    selected : sequence of int
        The current set S.
    d : int
        Elements each user samples from E \\ S (1 ≤ d ≤ |E \\ S|).
    seed : int
        Run seed.
    server_round : int
        Communication round t (seeds the streams).
    user_ids : numpy.ndarray, optional
        Global user ids of the rows (seed the users' streams); default: ``users`` itself,
        for an objective that holds all users.

    Returns
    -------
    numpy.ndarray
        float64 vector over E of the unscaled report sums (0 outside the sampled D_i).
    """
    m = objective.n_elements
    users = np.asarray(users, dtype=np.int64)
    ids = users if user_ids is None else np.asarray(user_ids, dtype=np.int64)
    if ids.shape != users.shape:
        raise ValueError("user_ids must have one id per row")
    sel = np.asarray(list(selected), dtype=np.int64)
    remaining = np.setdiff1d(np.arange(m), sel)
    if not 1 <= d <= remaining.size:
        raise ValueError(f"d={d} must lie in 1..|E \\ S| = {remaining.size}")
    if users.size == 0:
        return np.zeros(m)
    current = objective.user_values(sel, users)
    upos, elem, gain = objective.positive_gain_entries(current, users)
    total, _ = sampled_entry_sum(upos, elem, gain, ids, remaining, d, seed, server_round, m)
    return total


def sampled_entry_sum(
    upos: np.ndarray,
    elem: np.ndarray,
    gain: np.ndarray,
    ids: np.ndarray,
    pool: np.ndarray,
    d: int,
    seed: int,
    server_round: int,
    n_elements: int,
    rng: str = "per-user",
) -> tuple[np.ndarray, int]:
    """Sum the users' gains over their own d-element draws D_i from ``pool``.

    With ``rng="per-user"`` the draw of user ``ids[p]`` is ``user_rng(seed, server_round,
    ids[p]).choice(|pool|, d, replace=False)`` (positions in ``pool``); with ``"batched"``
    only D_i ∩ A_i is drawn, A_i the user's positive entries in ``pool``, for all users at
    once (:func:`~flower_app.algorithms.fedsm.sampling.support_draw`: the same law, time
    proportional to |A_i|). Either way the sum over any set of users does not depend on how
    the users are split over nodes. Users without a positive entry in ``pool`` report only
    zeros whatever they draw, so their draw is skipped.

    Parameters
    ----------
    upos : numpy.ndarray
        Position of each entry's user in ``ids``, non-decreasing.
    elem : numpy.ndarray
        Element of each entry.
    gain : numpy.ndarray
        The user's value for that element (e.g. f_i(e | S)); entries that are not positive
        or whose element is outside ``pool`` count as zero.
    ids : numpy.ndarray
        Global user ids (seed the users' streams).
    pool : numpy.ndarray
        Sorted elements the users draw from (E \\ S for Algorithm 1).
    d : int
        Elements each user draws (1 ≤ d ≤ |pool|).
    seed : int
        Run seed.
    server_round : int
        Communication round (seeds the streams).
    n_elements : int
        Ground-set size m (length of the result).
    rng : str, optional
        ``"per-user"`` (default) or ``"batched"`` (:mod:`~flower_app.algorithms.fedsm.sampling`).

    Returns
    -------
    tuple
        ``(sum, hits)``: float64 vector over E of the summed sampled values, and the number
        of (user, element) values that were drawn and positive (what a sparse report sends).
    """
    out = np.zeros(n_elements)
    n_pool = pool.size
    pos_of = np.full(n_elements, -1, dtype=np.int64)
    pos_of[pool] = np.arange(n_pool)
    keep = (pos_of[elem] >= 0) & (gain > 0)
    upos, elem, gain = upos[keep], elem[keep], gain[keep]
    if check_scheme(rng) == "batched":
        hit = support_draw(upos, elem, ids, n_pool, d, seed, server_round)
        out += np.bincount(elem[hit], weights=gain[hit], minlength=n_elements)
        return out, int(hit.sum())
    active = np.unique(upos)
    hits = 0
    for start in range(0, active.size, _CHUNK):
        chunk = active[start : start + _CHUNK]
        draws = np.stack([user_draw(ids[a], n_pool, d, seed, server_round) for a in chunk])
        mask = np.zeros((chunk.size, n_pool), dtype=bool)
        mask[np.arange(chunk.size)[:, None], draws] = True
        lo, hi = np.searchsorted(upos, [chunk[0], chunk[-1] + 1])
        local = np.searchsorted(chunk, upos[lo:hi])
        hit = mask[local, pos_of[elem[lo:hi]]]
        hits += int(hit.sum())
        out += np.bincount(elem[lo:hi][hit], weights=gain[lo:hi][hit], minlength=n_elements)
    return out, hits


@dataclass
class FedSMRound:
    """What one communication round did and cost.

    Attributes
    ----------
    server_round : int
        Round number, from 1.
    element : int
        Element added to S.
    estimate : float
        F̂(e | S) of the added element.
    users : int
        Users sampled (K).
    d : int
        Elements each user sampled this round.
    user_values : int
        Values reported by users, K·d (the paper's per-round bit complexity unit).
    clamped : int
        With the history clamp: the candidates whose estimate it lowered (else 0).
    """

    server_round: int
    element: int
    estimate: float
    users: int
    d: int
    user_values: int
    clamped: int = 0


@dataclass
class FedSMServer:
    """Server state of FedSM Algorithm 1: S, the K/d sizes and the server's generator.

    Parameters
    ----------
    n_users : int
        Number of users n (the clients of the paper).
    matroid : Matroid
        The constraint; ``k`` rounds are run (``k`` ≤ rank).
    k : int
        Number of rounds r (elements to add).
    clients_per_round : int or float
        K as a count (int) or a fraction of n (float in (0, 1]).
    elements_per_client : int or float
        d as a count (int) or a fraction of m = |E| (float in (0, 1]).
    seed : int
        Seeds the server's ``numpy.random.Generator`` (user sampling) and the users' streams.
    rng : numpy.random.Generator, optional
        Use this generator instead of ``default_rng(seed)`` (amplification runs one
        Algorithm 1 per step on one shared server generator).
    history_clamp : str or bool, optional
        Choose by the estimates held to a bound from their own earlier estimates
        (:class:`~flower_app.algorithms.robust.history.GainHistory`; a deviation from the
        paper against dishonest users): ``"noise-aware"`` (the mean plus
        :data:`~flower_app.algorithms.robust.history.NOISE_AWARE_MARGIN` standard errors),
        ``"mean"`` (the mean; True, as written before the clamps had names) or ``"off"``
        (default here; False: Eq. (3) as it is).
    """

    n_users: int
    matroid: Matroid
    k: int
    clients_per_round: int | float
    elements_per_client: int | float
    seed: int = 0
    selected: list[int] = field(default_factory=list)
    rounds: list[FedSMRound] = field(default_factory=list)
    rng: np.random.Generator | None = field(default=None, repr=False)
    history_clamp: str | bool = "off"

    def __post_init__(self) -> None:
        check_greedy_run(self.seed, self.k, self.matroid)
        m = self.matroid.n_elements
        self.K = resolve_count(self.clients_per_round, self.n_users, "clients-per-round")
        self.d = resolve_count(self.elements_per_client, m, "elements-per-client")
        if self.rng is None:
            self.rng = np.random.default_rng(self.seed)
        margin = clamp_margin(self.history_clamp)
        self.history = None if margin is None else GainHistory(m, margin)

    @property
    def done(self) -> bool:
        """True once k elements were added."""
        return len(self.selected) >= self.k

    def round_d(self) -> int:
        """Return d for the coming round: min(d, |E \\ S|)."""
        return min(self.d, self.matroid.n_elements - len(self.selected))

    def sample_users(self) -> np.ndarray:
        """Draw the K users of the coming round (sorted global indices, :func:`sample_users`)."""
        return sample_users(self.rng, self.n_users, self.K)

    def select(self, report_sum: np.ndarray, users: int) -> FedSMRound:
        """Add the feasible element with the largest estimated marginal gain.

        Parameters
        ----------
        report_sum : numpy.ndarray
            Unscaled sum of all users' reports, length m.
        users : int
            Number of users whose reports are in the sum (K).

        Returns
        -------
        FedSMRound
            The round's record (also appended to ``rounds``).

        Notes
        -----
        With ``history_clamp`` the argmax is taken over the scaled estimates held to their
        history's bound (ties to the lowest index); ``estimate`` stays the round's F̂(e | S).
        """
        m = self.matroid.n_elements
        if report_sum.shape != (m,) or not np.all(np.isfinite(report_sum)):
            raise ValueError(f"report sum must be a finite vector of length {m}")
        d = self.round_d()
        scale = (m - len(self.selected)) / (d * max(users, 1))
        clamped = 0
        history = getattr(self, "history", None)  # None in a checkpoint from before the clamp
        if history is None:
            e = best_feasible(report_sum, self.matroid, self.selected)
        else:
            feasible = self.matroid.feasible_mask(self.selected)
            held, clamped = history.clamp(scale * report_sum, feasible)
            e = best_feasible(held, self.matroid, self.selected)
        record = FedSMRound(
            server_round=len(self.selected) + 1,
            element=e,
            estimate=float(scale * report_sum[e]),
            users=int(users),
            d=d,
            user_values=int(users) * d,
            clamped=clamped,
        )
        self.selected.append(e)
        self.rounds.append(record)
        return record


#: the largest real value a report may carry: sums over 10^8 users and products of two
#: such values stay finite in float64. A node's utilities are not otherwise bounded, so a
#: plausible but false value cannot be told from an honest one (Byzantine nodes are out of
#: this check's reach); this bound only keeps a hostile value from overflowing the server's sums.
MAX_REPORT_VALUE = 1e140


def check_report(arrays: list[np.ndarray], n_elements: int) -> tuple[np.ndarray | None, np.ndarray]:
    """Check a node's report without densifying it (``n_elements`` may be a claim).

    Parameters
    ----------
    arrays : list of numpy.ndarray
        The reply's arrays in order: ``[index, value]`` (sparse) or ``[value]`` (dense).
    n_elements : int
        Length L of the report.

    Returns
    -------
    tuple
        The ids (None for a dense report) and the values as float64.

    Raises
    ------
    ValueError
        As :func:`decode_report`.
    """
    if len(arrays) == 1:
        index, value = None, np.asarray(arrays[0])
        if value.shape != (n_elements,):
            raise ValueError(f"dense report has shape {value.shape}, expected ({n_elements},)")
    elif len(arrays) == 2:
        index, value = (np.asarray(a) for a in arrays)
        if index.ndim != 1 or value.shape != index.shape or index.dtype.kind not in "iu":
            raise ValueError("sparse report needs 1-D integer ids and values of equal length")
        if index.size and (index.min() < 0 or index.max() >= n_elements):
            raise ValueError(f"sparse report has element ids outside 0..{n_elements - 1}")
        if np.unique(index).size != index.size:
            raise ValueError("sparse report repeats element ids")
    else:
        raise ValueError(f"a report has 1 (dense) or 2 (sparse) arrays, got {len(arrays)}")
    if value.dtype.kind not in "iuf":
        raise ValueError(f"report values must be real numbers, got dtype {value.dtype}")
    values = value.astype(np.float64)
    if not np.all(np.isfinite(values)) or (values < 0).any():
        raise ValueError("report values must be finite and non-negative")
    if values.size and values.max() > MAX_REPORT_VALUE:
        raise ValueError(
            f"report values must be at most {MAX_REPORT_VALUE:g} (sums and products of larger "
            "ones overflow float64)"
        )
    return index, values


def decode_report(arrays: list[np.ndarray], n_elements: int) -> np.ndarray:
    """Decode a node's report (``[index, value]`` sparse or ``[value]`` dense) and check it.

    Parameters
    ----------
    arrays : list of numpy.ndarray
        The reply's arrays in order.
    n_elements : int
        Length L of the report (m for Algorithm 1, |X|·r' for Algorithm 2).

    Returns
    -------
    numpy.ndarray
        Dense float64 vector of length L.

    Raises
    ------
    ValueError
        On a wrong number of arrays, wrong shapes or dtypes (values must be real numbers,
        ids integers), indices out of range or duplicated, or non-finite or negative
        values (marginal gains of a monotone function are ≥ 0).
    """
    index, values = check_report(arrays, n_elements)
    if index is None:
        return values
    dense = np.zeros(n_elements)
    dense[index.astype(np.int64)] = values
    return dense
