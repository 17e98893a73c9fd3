"""Federated discrete greedy with importance factors (Rafiey, ICML 2024, Algs. 3, 4, 5).

Importance factors, two communication rounds (Alg. 4 for facility location, Alg. 5 for
max coverage; for max-row objectives f_i(S) = max_{j∈S} r_ij both are the same protocol):

1. every user sends O_i = (f_i({1}), …, f_i({n})) (its ratings, or its 0/1 memberships);
   the secure aggregator sums them into the histogram O = Σ_i O_i (O_j = F({j}) in sum
   form, or |G_j|) and the server broadcasts O;
2. every user computes w_i = max_j f_i({j}) / O_j locally (= max_{a ∋ i} 1/|G_a| for
   coverage) and never sends it.

Each greedy round t = 1..k (Alg. 3): the server sends S; user i participates with
probability κ_i = min(1, κ·w_i) (its own stream ``default_rng([seed, t, user])``) and then
sends Δ_i[e] = (f_i(S ∪ {e}) − f_i(S)) / κ_i for every e with S ∪ {e} independent; the
server adds argmax_e Σ_i Δ_i[e]. Σ_i κ_i is the expected number of participants per round.

Reports are fixed-point integers (``round(Δ_i · 2^20)``, int64), as a secure aggregator
over a finite group would need them anyway: sums are then exact in any order, so the set
does not depend on how users are split over nodes. Ties go to the lowest element index.

Both engines add the nodes' reports with :meth:`DiscreteGreedyServer.accept`: a report above
what its participants could honestly send (at most max(λ, O_e/κ) per participant and
element:
:func:`~flower_app.algorithms.robust.node_bounds.discrete_element_bounds`) or one that would
wrap the int64 sum around (:class:`~flower_app.algorithms.robust.sums.ReportOverflowError`)
is refused and counted in the round's record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from flower_app.algorithms.common.greedy_step import best_feasible, check_greedy_run
from flower_app.algorithms.common.streams import first_uniforms, user_rng
from flower_app.algorithms.robust.node_bounds import discrete_element_bounds, node_reason
from flower_app.algorithms.robust.reports import ReportTally
from flower_app.algorithms.robust.sums import ReportOverflowError, checked_int_add
from flower_app.submodular.matroids import Matroid
from flower_app.submodular.objectives import MaxRowObjective

__all__ = [
    "FIXED_POINT_SCALE",
    "DiscreteGreedyRound",
    "DiscreteGreedyServer",
    "discrete_report_sum",
    "histogram_sum",
    "importance_factors",
    "participation_probabilities",
    "set_function_importance",
    "set_function_report",
]

#: reports are integers in units of 2^-20
FIXED_POINT_SCALE = float(2**20)
_INT_LIMIT = float(2**62)


def histogram_sum(objective: MaxRowObjective, users: np.ndarray | None = None) -> np.ndarray:
    """Return Σ_i O_i over the given users: the first round of Algs. 4/5.

    Parameters
    ----------
    objective : MaxRowObjective
        Holds the users' rows.
    users : numpy.ndarray, optional
        Row indices (all rows when None).

    Returns
    -------
    numpy.ndarray
        float64 vector of length m: Σ_i f_i({j}) for every element j.
    """
    rows = objective.values if users is None else objective.values[np.asarray(users)]
    return np.bincount(rows.indices, weights=rows.data, minlength=objective.n_elements)


def importance_factors(
    objective: MaxRowObjective, histogram: np.ndarray, users: np.ndarray | None = None
) -> np.ndarray:
    """Return w_i = max_j f_i({j}) / O_j for the given users (second round of Algs. 4/5).

    Parameters
    ----------
    objective : MaxRowObjective
        Holds the users' rows.
    histogram : numpy.ndarray
        O = Σ over *all* users of O_i (length m, finite, ≥ 0).
    users : numpy.ndarray, optional
        Row indices (all rows when None).

    Returns
    -------
    numpy.ndarray
        float64 w_i ∈ [0, 1] (0 for a user with an empty row).

    Raises
    ------
    ValueError
        If the histogram has the wrong shape, is not finite, or is 0 on an element that
        one of these users values (it cannot be the sum over all users).
    """
    o = np.asarray(histogram, dtype=np.float64)
    if o.shape != (objective.n_elements,) or not np.all(np.isfinite(o)) or (o < 0).any():
        raise ValueError(
            f"the histogram must be a finite non-negative vector of length {objective.n_elements}"
        )
    rows = objective.values if users is None else objective.values[np.asarray(users)]
    denom = o[rows.indices]
    if (denom <= 0).any():
        raise ValueError("the histogram is 0 on an element a user values: it is not Σ_i O_i")
    ratio = rows.data / denom
    out = np.zeros(rows.shape[0])
    nonempty = np.flatnonzero(np.diff(rows.indptr))
    if nonempty.size:
        out[nonempty] = np.maximum.reduceat(ratio, rows.indptr[nonempty])
    return out


def participation_probabilities(w: np.ndarray, kappa: float) -> np.ndarray:
    """Return κ_i = min(1, κ·w_i).

    Parameters
    ----------
    w : numpy.ndarray
        Importance factors.
    kappa : float
        κ > 0.

    Returns
    -------
    numpy.ndarray
        Participation probabilities.
    """
    if not np.isfinite(kappa) or kappa <= 0:
        raise ValueError(f"κ={kappa!r} must be positive")
    return np.minimum(1.0, kappa * np.asarray(w, dtype=np.float64))


def discrete_report_sum(
    objective: MaxRowObjective,
    selected: Sequence[int],
    matroid: Matroid,
    kappa_i: np.ndarray,
    seed: int,
    server_round: int,
    user_ids: np.ndarray,
) -> tuple[np.ndarray, int]:
    """Return the fixed-point sum Σ_{i participating} Δ_i and the number of participants.

    Parameters
    ----------
    objective : MaxRowObjective
        The users' rows (row j ↔ ``user_ids[j]``).
    selected : sequence of int
        The current set S.
    matroid : Matroid
        Only elements e with S ∪ {e} independent get reports.
    kappa_i : numpy.ndarray
        Participation probability of each row.
    seed : int
        Run seed.
    server_round : int
        Round t (seeds the users' coins).
    user_ids : numpy.ndarray
        Global user ids of the rows.

    Returns
    -------
    tuple
        ``(sum, participants)``: int64 vector of length m in units of 2^-20; count.
    """
    m = objective.n_elements
    ids = np.asarray(user_ids, dtype=np.int64)
    kappa_i = np.asarray(kappa_i, dtype=np.float64)
    if ids.shape != (objective.n_users,) or kappa_i.shape != ids.shape:
        raise ValueError("one user id and one κ_i per row are needed")
    coin = np.ones(ids.size, dtype=bool)
    flip = np.flatnonzero(kappa_i < 1.0)  # each user's coin: its stream's first uniform
    coin[flip] = first_uniforms(seed, server_round, ids[flip]) < kappa_i[flip]
    users = np.flatnonzero(coin & (kappa_i > 0))
    out = np.zeros(m, dtype=np.int64)
    if users.size == 0:
        return out, 0
    sel = np.asarray(list(selected), dtype=np.int64)
    current = objective.user_values(sel, users)
    pos, elem, gain = objective.positive_gain_entries(current, users)
    feasible = matroid.feasible_mask(sel)
    keep = feasible[elem]
    scaled = np.rint(gain[keep] / kappa_i[users[pos[keep]]] * FIXED_POINT_SCALE)
    totals = np.bincount(elem[keep], weights=scaled, minlength=m)
    if totals.max(initial=0.0) >= _INT_LIMIT:
        raise OverflowError("a report sum exceeds the fixed-point range: raise κ")
    # the float sums of integers below 2^53 are exact; above, add as int64 per entry
    if totals.max(initial=0.0) < 2.0**53:
        out = totals.astype(np.int64)
    else:
        np.add.at(out, elem[keep], scaled.astype(np.int64))
    return out, int(users.size)


@dataclass
class DiscreteGreedyRound:
    """One round of Alg. 3.

    Attributes
    ----------
    server_round : int
        Round number, from 1.
    element : int
        Element added.
    estimate : float
        Σ_i Δ_i[e] of the added element (the estimate of Σ_i f_i(e | S)).
    participants : int
        Users that sent a report.
    expected : float
        Σ_i κ_i (expected participants).
    checks : dict
        What :meth:`DiscreteGreedyServer.accept` refused this round
        (:meth:`~flower_app.algorithms.robust.reports.ReportTally.row`; empty if the sum was
        not made by it).
    """

    server_round: int
    element: int
    estimate: float
    participants: int
    expected: float
    checks: dict[str, int] = field(default_factory=dict)


@dataclass
class DiscreteGreedyServer:
    """Server state of Alg. 3: S, κ, the histogram and the expected participation.

    Parameters
    ----------
    n_users : int
        Number of users N.
    matroid : Matroid
        The constraint.
    k : int
        Rounds (elements added), ≤ rank.
    kappa : float
        κ > 0 (κ_i = min(1, κ·w_i)).
    seed : int
        Seeds the users' coins.
    report_bound : float, optional
        λ, the largest value one user can hold (the objective's declared range); with it
        :meth:`accept` refuses a node's report above what its participants could honestly
        send. None: only the overflow check.
    """

    n_users: int
    matroid: Matroid
    k: int
    kappa: float
    seed: int = 0
    selected: list[int] = field(default_factory=list)
    rounds: list[DiscreteGreedyRound] = field(default_factory=list)
    histogram: np.ndarray | None = None
    expected: float = 0.0
    report_bound: float | None = None
    _checks: dict[str, int] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_greedy_run(self.seed, self.k, self.matroid)
        if not np.isfinite(self.kappa) or self.kappa <= 0:
            raise ValueError(f"κ={self.kappa!r} must be positive")
        if self.report_bound is not None and not (
            np.isfinite(self.report_bound) and self.report_bound > 0
        ):
            raise ValueError(f"report bound {self.report_bound!r} must be positive")

    @property
    def done(self) -> bool:
        """True once k elements were added."""
        return len(self.selected) >= self.k

    def set_histogram(self, histogram: np.ndarray) -> None:
        """Store O = Σ_i O_i (checked) to broadcast it."""
        o = np.asarray(histogram, dtype=np.float64)
        if o.shape != (self.matroid.n_elements,) or not np.all(np.isfinite(o)) or (o < 0).any():
            raise ValueError("the histogram must be finite, non-negative, one entry per element")
        self.histogram = o

    def accept(
        self, reports: Sequence[tuple[np.ndarray, int]]
    ) -> tuple[np.ndarray, int, ReportTally]:
        """Sum the nodes' fixed-point reports, refusing those no honest users could send.

        A report is refused (left out of the sum, its participants not counted) when adding
        it would wrap the int64 sum around (``refused-overflow``,
        :class:`~flower_app.algorithms.robust.sums.ReportOverflowError`), or when a value
        exceeds ``participants · max(λ, O_e/κ)`` in fixed point (``refused-range``; with
        :attr:`report_bound` λ and the histogram set). The tally goes into the next
        :meth:`select`'s record.

        Parameters
        ----------
        reports : sequence of (numpy.ndarray, int)
            Each node's int64 report (length m) and its number of participants.

        Returns
        -------
        tuple
            ``(total, participants, tally)``.
        """
        m = self.matroid.n_elements
        tally = ReportTally()
        cap = None
        if self.report_bound is not None and self.histogram is not None:
            # an honest participant sends rint(Δ·2^20) ≤ B_e·2^20 + 1/2 on element e
            cap = discrete_element_bounds(self.histogram, self.report_bound, self.kappa)
            cap = cap * FIXED_POINT_SCALE + 0.5
        total = np.zeros(m, dtype=np.int64)
        participants = 0
        for vec, count in reports:
            vec = np.asarray(vec)
            if vec.shape != (m,) or vec.dtype.kind not in "iu" or count < 0:
                tally.refuse("malformed")
                continue
            try:
                added = checked_int_add(total, vec)
            except ReportOverflowError:
                tally.refuse("overflow")
                continue
            if cap is not None:
                reason = node_reason(vec, np.floor(cap * int(count)))
                if reason is not None:
                    tally.refuse(reason)
                    continue
            total = added
            participants += int(count)
        self._checks = tally.row()
        return total, participants, tally

    def select(self, report_sum: np.ndarray, participants: int) -> DiscreteGreedyRound:
        """Add argmax over feasible e of the summed reports (ties: lowest index).

        Parameters
        ----------
        report_sum : numpy.ndarray
            int64 fixed-point sum of the participants' reports.
        participants : int
            Users whose reports are in the sum.

        Returns
        -------
        DiscreteGreedyRound
            The round's record (also appended to ``rounds``).
        """
        m = self.matroid.n_elements
        report = np.asarray(report_sum)
        if report.shape != (m,) or report.dtype.kind not in "iu":
            raise ValueError(f"the report sum must be an integer vector of length {m}")
        e = best_feasible(report.astype(np.int64), self.matroid, self.selected)
        record = DiscreteGreedyRound(
            len(self.selected) + 1,
            e,
            float(report[e]) / FIXED_POINT_SCALE,
            int(participants),
            float(self.expected),
            dict(self._checks or {}),
        )
        self._checks = None
        self.selected.append(e)
        self.rounds.append(record)
        return record


def set_function_importance(singletons: np.ndarray, histogram: np.ndarray) -> float:
    """Return w_i = max_j f_i({j}) / O_j of one user from its singleton values O_i.

    The second round of Algs. 4/5 for any set function (``singletons`` = ``gains(∅)``).

    Parameters
    ----------
    singletons : numpy.ndarray
        O_i = (f_i({j}))_j of the user (length m, ≥ 0).
    histogram : numpy.ndarray
        O = Σ over all users of O_i.

    Returns
    -------
    float
        w_i ∈ [0, 1] (0 when f_i({j}) = 0 for every j).

    Raises
    ------
    ValueError
        On a histogram of the wrong shape, not finite, or 0 where the user's O_i is not.
    """
    own = np.asarray(singletons, dtype=np.float64)
    o = np.asarray(histogram, dtype=np.float64)
    if o.shape != own.shape or not np.all(np.isfinite(o)) or (o < 0).any():
        raise ValueError(f"the histogram must be a finite non-negative vector of length {own.size}")
    support = own > 0
    if (o[support] <= 0).any():
        raise ValueError("the histogram is 0 on an element a user values: it is not Σ_i O_i")
    return float((own[support] / o[support]).max(initial=0.0))


def set_function_report(
    gains: np.ndarray,
    selected: Sequence[int],
    matroid: Matroid,
    kappa_i: float,
    seed: int,
    server_round: int,
    user_id: int,
) -> tuple[np.ndarray, int]:
    """Return one user's fixed-point report Δ_i of Alg. 3 and whether it participates (0/1).

    The same coin and encoding as :func:`discrete_report_sum`, for a user whose f_i is
    given by its marginal gains ``gains = f_i(S ∪ {e}) − f_i(S)`` (length m).

    Parameters
    ----------
    gains : numpy.ndarray
        The user's marginal gains at S for every element.
    selected : sequence of int
        The current set S.
    matroid : Matroid
        Only elements e with S ∪ {e} independent get reports.
    kappa_i : float
        The user's participation probability.
    seed, server_round, user_id : int
        Seed the user's coin ``default_rng([seed, server_round, user_id])``.

    Returns
    -------
    tuple
        ``(report, participants)``: int64 vector in units of 2^-20; 1 or 0.
    """
    m = matroid.n_elements
    gain = np.asarray(gains, dtype=np.float64)
    if gain.shape != (m,) or not np.all(np.isfinite(gain)):
        raise ValueError(f"gains(S) must return a finite float vector of length {m}")
    out = np.zeros(m, dtype=np.int64)
    coin = kappa_i >= 1.0 or user_rng(seed, server_round, int(user_id)).random() < kappa_i
    if not coin or kappa_i <= 0:
        return out, 0
    keep = np.flatnonzero((gain > 0) & matroid.feasible_mask(list(selected)))
    scaled = np.rint(gain[keep] / kappa_i * FIXED_POINT_SCALE)
    if scaled.max(initial=0.0) >= _INT_LIMIT:
        raise OverflowError("a report exceeds the fixed-point range: raise κ")
    out[keep] = scaled.astype(np.int64)
    return out, 1
