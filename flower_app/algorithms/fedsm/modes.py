"""FedSM's three modes behind one round protocol: plan a round, users report, server updates.

``mode``:

* ``"alg1"`` — Algorithm 1 (one element per round, :class:`~.core.FedSMServer`);
* ``"alg2"`` — Algorithm 2 (O(log m) rounds, :class:`~.alg2.FedSMAlg2Server`);
* ``"amplified"`` — Algorithm 3: 1/η steps of Algorithm 1 or 2 (``inner``) on the surrogate
  g, x ← x + η1_S after each step, and an oblivious rounding of x at the end
  (:func:`~flower_app.submodular.rounding.pipage_rounding` or ``greedy_rounding``).

:class:`FedSMRun` is the server (no Flower import); :func:`cohort_report` is what users
compute, for any cohort of them; both the Flower strategy and the direct engine (the
repository's ``direct/fedsm.py``) use exactly these two, so both engines give the same S for
the same seed. All of the server's randomness
(users, sequences, rounding) comes from one generator seeded by ``seed``, used in round
order; users' randomness from ``default_rng([seed, t, user])`` (and ``[seed, t, user, 1]``
for the sampled surrogate), t the global communication round. With ``rng="batched"``
(:class:`FedSMParams`, run_config ``fedsm-rng``) the users' draws of D come instead from a
counter-based generator keyed by (seed, t, user), for all users at once and in time
proportional to each user's support (:mod:`~flower_app.algorithms.fedsm.sampling`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flower_app.algorithms.common.counts import reciprocal_steps
from flower_app.algorithms.common.dp_noise import NoiseSource
from flower_app.algorithms.fedsm.alg2 import FedSMAlg2Server, PlainPairGains, pair_report_sum
from flower_app.algorithms.fedsm.amplify import (
    SURROGATES,
    SurrogatePairGains,
    surrogate_entries,
)
from flower_app.algorithms.fedsm.core import FedSMServer, sampled_entry_sum
from flower_app.algorithms.fedsm.dp import dp_entry_counts, dp_reporters, dp_user_sums
from flower_app.algorithms.fedsm.sampling import check_scheme
from flower_app.algorithms.fedsm.shuffle_dp import (
    ShuffleDP,
    bits_for,
    calibrate_flip,
    compose,
    debias_counts,
    local_epsilon,
    query_epsilon,
)
from flower_app.algorithms.robust.history import clamp_margin
from flower_app.algorithms.robust.reports import ReportTally
from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid
from flower_app.submodular.multilinear import multilinear_value
from flower_app.submodular.objectives import MaxRowObjective
from flower_app.submodular.rounding import check_in_polytope, greedy_rounding, pipage_rounding

__all__ = [
    "INNER",
    "MODES",
    "ROUNDINGS",
    "FedSMParams",
    "FedSMRun",
    "RoundPlan",
    "cohort_report",
]

MODES = ("alg1", "alg2", "amplified")
INNER = ("alg1", "alg2")
ROUNDINGS = ("pipage", "greedy")


@dataclass(frozen=True)
class FedSMParams:
    """Parameters of a FedSM run (every mode; unused ones are ignored).

    Attributes
    ----------
    mode : str
        ``"alg1"``, ``"alg2"`` or ``"amplified"``.
    clients_per_round : int or float
        K, a count or a fraction of n.
    elements_per_client : int or float
        d: Algorithm 1's elements per user (count or fraction of m); Algorithm 2's pairs
        per user (int cap on, or float fraction of, |X|·r').
    epsilon : float
        Algorithm 2's ε ∈ (0, 1).
    tau : float
        Algorithm 2's initial threshold (≤ 0: λ). Inside amplification it applies to g and
        is multiplied by η (g's marginal gains are η ∂G).
    levels : int
        Algorithm 2's threshold levels (0: until τ < ε·τ₀/k; −1: until |S| = k).
    j_from : int
        Algorithm 2's first prefix length: 1 (the pseudo-code) or 0 (j* = 0 allowed).
    eta : float
        Amplification step η ∈ (0, 1) with 1/η an integer.
    inner : str
        Amplification's subroutine, ``"alg1"`` or ``"alg2"``.
    surrogate : str
        ``"exact"`` (closed forms) or ``"sampled"`` (users sample R ~ y).
    samples : int
        Sets R per user and round for the sampled surrogate.
    rounding : str
        ``"pipage"`` (randomized, marginals preserved) or ``"greedy"``.
    rng : str
        How users draw D: ``"per-user"`` (default, ``default_rng([seed, t, user])`` and a
        dense d-subset; the recorded reproductions) or ``"batched"`` (a keyed Philox for all
        users at once, support-proportional; same law, other realisations).
    dp_epsilon : float
        ε′ > 0 of every sum query (one element, one round) under the shuffle-model DP of
        Appendix C (:mod:`flower_app.privacy.shuffle_dp`); 0 (default) turns it off.
        Algorithm 1 without amplification, ``rng="per-user"``.
    dp_delta : float
        δ′ of every sum query (default 1e-6).
    dp_secure : bool
        The server sees only each element's total (secure aggregation): ε against the
        server is then the shuffle bound; otherwise (replies in the clear) it is the local
        randomiser's. Default False. Set by the strategy / runner from its
        ``secure_aggregation``.
    dp_reproducible : bool
        The research mode ``dp-reproducible-noise`` (default False): marks the rows, and
        keys the randomiser by the seed in the direct engine (no privacy against the server;
        :mod:`flower_app.algorithms.common.dp_noise`). Nodes take it from their own configuration.
    history_clamp : str
        Algorithm 1 (``mode="alg1"``; the other modes ignore it): choose by the estimates
        held to a bound from each element's estimates so far
        (:mod:`flower_app.algorithms.robust.history`; a deviation from the paper against
        dishonest users). ``"noise-aware"`` (default): the mean plus
        :data:`~flower_app.algorithms.robust.history.NOISE_AWARE_MARGIN` standard errors of
        the mean; ``"mean"``: the mean itself (tighter); ``"off"``: Eq. (3) as it is (the
        paper's algorithm, what the recorded reproductions use). With a clamp the rows count
        the lowered estimates (``estimates-clamped``).
    """

    mode: str = "alg1"
    clients_per_round: int | float = 0.1
    elements_per_client: int | float = 0.1
    epsilon: float = 0.405
    tau: float = 0.0
    levels: int = 0
    j_from: int = 1
    eta: float = 0.1
    inner: str = "alg1"
    surrogate: str = "exact"
    samples: int = 4
    rounding: str = "pipage"
    rng: str = "per-user"
    dp_epsilon: float = 0.0
    dp_delta: float = 1e-6
    dp_secure: bool = False
    dp_reproducible: bool = False
    history_clamp: str = "noise-aware"

    def steps(self) -> int:
        """Return the amplification's 1/η, checking η."""
        if not (math.isfinite(self.eta) and 0.0 < self.eta < 1.0):
            raise ValueError(f"eta={self.eta} must lie in (0, 1)")
        steps = reciprocal_steps(self.eta)
        if steps is None:
            raise ValueError(f"eta={self.eta}: 1/eta must be an integer (e.g. 0.1, 0.2, 0.25)")
        return steps


@dataclass
class RoundPlan:
    """What the server sends for one communication round.

    Attributes
    ----------
    server_round : int
        Global communication round t (from 1): seeds the users' streams.
    mode : str
        ``"alg1"`` or ``"alg2"`` (the protocol actually run this round).
    users : numpy.ndarray
        Sorted global ids of the sampled users.
    selected : numpy.ndarray
        S (or T, the set of the current amplification step).
    d : int
        Elements (Alg. 1) or pairs (Alg. 2) per user.
    pool : numpy.ndarray
        Alg. 2's X (empty for Alg. 1).
    sequence : numpy.ndarray
        Alg. 2's a_1..a_r' (empty for Alg. 1).
    point : numpy.ndarray or None
        Amplification's x (None outside amplification).
    eta : float
        η (amplification).
    surrogate : str
        ``"none"``, ``"exact"`` or ``"sampled"``.
    samples : int
        Sets R per user (sampled surrogate).
    n_elements : int
        m.
    j_from : int
        Alg. 2: prefix length of pair column 0.
    rng : str
        How users draw D: ``"per-user"`` or ``"batched"`` (sent to the nodes when batched).
    dp_bits : int
        Shuffle-model DP: bits k per value (0: no DP).
    dp_flip : numpy.ndarray or None
        Shuffle-model DP: the flip probability p_e of every element (float64 (m,)).
    dp_lam : float
        Shuffle-model DP: λ, the bound on a value.
    """

    server_round: int
    mode: str
    users: np.ndarray
    selected: np.ndarray
    d: int
    pool: np.ndarray
    sequence: np.ndarray
    point: np.ndarray | None
    eta: float
    surrogate: str
    samples: int
    n_elements: int
    j_from: int = 1
    rng: str = "per-user"
    dp_bits: int = 0
    dp_flip: np.ndarray | None = None
    dp_lam: float = 0.0

    @property
    def report_size(self) -> int:
        """Length of a report: m (Alg. 1) or |X|·r' (Alg. 2)."""
        if self.mode == "alg1":
            return self.n_elements
        return int(self.pool.size * self.sequence.size)

    def y(self) -> np.ndarray:
        """Return the surrogate's base point y = x + η1_T (amplification rounds only).

        Returns
        -------
        numpy.ndarray
            float64 point of [0, 1]^m.
        """
        if self.point is None:
            raise ValueError("not an amplification round")
        out = np.array(self.point, dtype=np.float64)
        out[self.selected] += self.eta
        return np.minimum(out, 1.0)

    def values_down(self, users: int) -> int:
        """Return the numbers the server sends to a node for this round.

        Parameters
        ----------
        users : int
            Sampled users the node serves (their ids are sent).

        Returns
        -------
        int
            |S| + users + |X| + r' + 2·nnz(x).
        """
        x_nnz = 0 if self.point is None else 2 * int(np.count_nonzero(self.point))
        return self.selected.size + users + self.pool.size + self.sequence.size + x_nnz


def cohort_report(
    objective: MaxRowObjective,
    users: np.ndarray,
    ids: np.ndarray,
    plan: RoundPlan,
    seed: int,
    reproducible_noise: bool = False,
) -> tuple[np.ndarray, int]:
    """Return the users' summed reports for the round, and the positive values they sent.

    Parameters
    ----------
    objective : MaxRowObjective
        Holds (at least) the users' rows.
    users : numpy.ndarray
        Row indices of the sampled users in ``objective``.
    ids : numpy.ndarray
        Their global ids (seed their streams).
    plan : RoundPlan
        The round.
    seed : int
        Run seed.
    reproducible_noise : bool, optional
        Shuffle-model DP only: the research mode ``dp-reproducible-noise`` (default False:
        the randomiser draws from OS entropy; see :mod:`flower_app.algorithms.common.dp_noise`).
        The caller takes it from its own configuration, never from the server's message.

    Returns
    -------
    tuple
        ``(sum, hits)``: float64 vector of length ``plan.report_size`` and the number of
        positive (user, element-or-pair) values drawn.
    """
    users = np.asarray(users, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    m, t = objective.n_elements, plan.server_round
    if plan.mode == "alg1":
        pool = np.setdiff1d(np.arange(m), plan.selected)
        if not 1 <= plan.d <= pool.size:
            raise ValueError(f"d={plan.d} must lie in 1..|E \\ S| = {pool.size}")
        if users.size == 0:
            return np.zeros(m), 0
        if plan.surrogate == "none":
            current = objective.user_values(plan.selected, users)
            upos, elem, gain = objective.positive_gain_entries(current, users)
            if plan.dp_bits:
                noise = NoiseSource(reproducible_noise, seed)
                return dp_entry_counts(upos, elem, gain, ids, pool, plan, seed, noise)
        else:
            upos, elem, gain = surrogate_entries(
                objective, users, ids, plan.y(), plan.eta, plan.surrogate, plan.samples, seed, t
            )
        return sampled_entry_sum(upos, elem, gain, ids, pool, plan.d, seed, t, m, plan.rng)
    if plan.surrogate == "none":
        gains: Any = PlainPairGains(objective, users, plan.selected, plan.sequence, plan.j_from)
    else:
        gains = SurrogatePairGains(
            objective,
            users,
            ids,
            plan.y(),
            plan.eta,
            plan.sequence,
            plan.surrogate,
            plan.samples,
            seed,
            t,
            plan.j_from,
        )
    return pair_report_sum(
        gains, users, ids, plan.pool, plan.sequence.size, plan.d, seed, t, plan.rng
    )


class FedSMRun:
    """The server of every FedSM mode: plans rounds and applies the summed reports.

    Parameters
    ----------
    n_users : int
        Number of users n.
    matroid : Matroid
        The constraint (Alg. 2 and amplification support uniform and partition matroids).
    k : int
        Largest |S| (≤ rank).
    params : FedSMParams
        Mode and its parameters.
    lam : float
        λ = max_{e,i} f_i({e}) (Alg. 2's default threshold; the paper assumes it known).
    seed : int, optional
        Seed of the server's generator and of the users' streams.
    initial : sequence of int, optional
        A starting set S₀ (independent, |S₀| ≤ k; Algorithms 1 and 2 only): the run adds
        elements to it until |S| = k (default: S₀ = ∅, the paper's).
    report_bound : float, optional
        The largest value one user may report on one element (the objective's declared
        range, e.g. λ). With it, Algorithm 1's summed report (without amplification or DP)
        is held to what the users in it could honestly send: at most ``report_bound`` per
        user on each element outside S, nothing on S; values past it are clipped and
        counted in the round's row (:meth:`update`). None (default): no check.

    Raises
    ------
    ValueError
        On any parameter the mode cannot run with (before the first round).
    """

    def __init__(
        self,
        n_users: int,
        matroid: Matroid,
        k: int,
        params: FedSMParams,
        lam: float,
        seed: int = 0,
        initial: Sequence[int] = (),
        report_bound: float | None = None,
    ) -> None:
        if params.mode not in MODES:
            raise ValueError(f"fedsm mode {params.mode!r}: choose one of {', '.join(MODES)}")
        check_scheme(params.rng)
        uses_alg2 = params.mode == "alg2" or (params.mode == "amplified" and params.inner == "alg2")
        if params.mode != "alg1" and not isinstance(matroid, UniformMatroid | PartitionMatroid):
            raise ValueError(
                f"fedsm mode {params.mode!r} supports uniform and partition matroids, "
                f"not {type(matroid).__name__}"
            )
        self.steps = 1
        if params.mode == "amplified":
            if params.inner not in INNER:
                raise ValueError(f"fedsm inner={params.inner!r}: choose one of alg1, alg2")
            if params.surrogate not in SURROGATES:
                raise ValueError(
                    f"fedsm surrogate={params.surrogate!r}: choose one of {', '.join(SURROGATES)}"
                )
            if params.surrogate == "sampled" and params.samples < 1:
                raise ValueError(f"fedsm samples={params.samples} must be >= 1")
            if params.rounding not in ROUNDINGS:
                raise ValueError(
                    f"fedsm rounding={params.rounding!r}: choose one of {', '.join(ROUNDINGS)}"
                )
            self.steps = params.steps()
            if k != matroid.rank:
                raise ValueError(
                    f"amplification rounds x in the polytope of the matroid itself, so k={k} "
                    f"must equal its rank {matroid.rank} (lower partition-capacity or raise k)"
                )
        clamp_margin(params.history_clamp)  # checks the name (the other modes ignore it)
        if uses_alg2 and not (math.isfinite(params.epsilon) and 0.0 < params.epsilon < 1.0):
            raise ValueError(f"fedsm epsilon={params.epsilon} must lie in (0, 1)")
        self.initial = [int(e) for e in initial]
        if self.initial:
            if params.mode == "amplified":
                raise ValueError("amplification starts from x = 0: it takes no starting set")
            ids = np.asarray(self.initial, dtype=np.int64)
            if ids.min() < 0 or ids.max() >= matroid.n_elements or np.unique(ids).size != ids.size:
                raise ValueError(
                    f"starting set {self.initial}: expected distinct element ids in "
                    f"0..{matroid.n_elements - 1}"
                )
            if len(ids) > k or not matroid.is_independent(self.initial):
                raise ValueError(
                    f"starting set {self.initial} must be independent with at most k={k} elements"
                )
        if params.dp_epsilon:
            ShuffleDP(float(params.dp_epsilon), float(params.dp_delta))  # checks both
            if params.mode != "alg1" or params.rng != "per-user":
                raise ValueError(
                    "fedsm dp-epsilon (shuffle-model DP) is implemented for Algorithm 1 with "
                    f"rng='per-user', not mode={params.mode!r}, rng={params.rng!r}"
                )
            if not (math.isfinite(lam) and lam > 0):
                raise ValueError(f"fedsm dp-epsilon needs λ > 0 (the bound on a value), got {lam}")
        self.n_users, self.matroid, self.k = n_users, matroid, k
        self.params, self.lam, self.seed = params, float(lam), int(seed)
        if report_bound is not None and not (math.isfinite(report_bound) and report_bound > 0):
            raise ValueError(f"report bound {report_bound!r} must be positive")
        self.report_bound = None if report_bound is None else float(report_bound)
        dp_users = n_users if params.dp_epsilon else 0
        self.dp_queries = np.zeros(dp_users, dtype=np.int64)
        # per user: Σ ε of the queries it answered, under the shuffle bound (what an analyzer
        # of totals learns) and under the local randomiser's (what a server of clear replies
        # learns); the largest per-query ε of each, for advanced composition
        self.dp_eps_shuffle = np.zeros(dp_users)
        self.dp_eps_local = np.zeros(dp_users)
        self.dp_eps_max = {"shuffle": 0.0, "local": 0.0}
        self.rng = np.random.default_rng(self.seed)
        self.server_round = 0
        self.step = 0
        self.point = np.zeros(matroid.n_elements) if params.mode == "amplified" else None
        self.final: list[int] | None = None
        self.inner: Any = self._new_inner()
        self._plan: RoundPlan | None = None
        self._step_selected: list[list[int]] = []

    # ------------------------------------------------------------------ state
    def _new_inner(self) -> FedSMServer | FedSMAlg2Server:
        p = self.params
        algorithm = p.inner if p.mode == "amplified" else p.mode
        eta = p.eta if p.mode == "amplified" else 1.0
        if algorithm == "alg1":
            return FedSMServer(
                self.n_users,
                self.matroid,
                self.k,
                p.clients_per_round,
                p.elements_per_client,
                seed=self.seed,
                rng=self.rng,
                selected=list(self.initial),
                # a checkpoint written before the clamp existed holds params without it;
                # amplification's inner Algorithm 1 runs without (Algorithm 1 mode only)
                history_clamp=getattr(p, "history_clamp", False) if p.mode == "alg1" else "off",
            )
        server = FedSMAlg2Server(
            self.n_users,
            self.matroid,
            self.k,
            p.clients_per_round,
            p.elements_per_client,
            p.epsilon,
            p.tau * eta,
            self.lam * eta,
            levels=p.levels,
            seed=self.seed,
            rng=self.rng,
            j_from=p.j_from,
            selected=list(self.initial),
        )
        server.server_round = self.server_round
        return server

    @property
    def algorithm(self) -> str:
        """The protocol of the coming round, ``"alg1"`` or ``"alg2"``."""
        return "alg1" if isinstance(self.inner, FedSMServer) else "alg2"

    @property
    def done(self) -> bool:
        """True when no round is left."""
        return self.final is not None or (self.params.mode != "amplified" and self.inner.done)

    @property
    def selected(self) -> list[int]:
        """The current S (amplification: the rounded set once finished, else T)."""
        if self.final is not None:
            return list(self.final)
        return list(self.inner.selected)

    # ------------------------------------------------------------------ rounds
    def plan(self) -> RoundPlan:
        """Draw the coming round (users, and Alg. 2's sequence); return what to send."""
        if self.done:
            raise RuntimeError("the run is over")
        inner = self.inner
        if isinstance(inner, FedSMServer):
            users, d = inner.sample_users(), inner.round_d()
            pool = seq = np.zeros(0, dtype=np.int64)
        else:
            users, seq = inner.plan()
            pool, d = inner.pool, inner.round_d()
        amplified = self.params.mode == "amplified"
        self._plan = RoundPlan(
            server_round=self.server_round + 1,
            mode=self.algorithm,
            users=users,
            selected=np.asarray(inner.selected, dtype=np.int64),
            d=d,
            pool=pool,
            sequence=seq,
            point=self.point.copy() if amplified and self.point is not None else None,
            eta=self.params.eta if amplified else 1.0,
            surrogate=self.params.surrogate if amplified else "none",
            samples=self.params.samples,
            n_elements=self.matroid.n_elements,
            j_from=self.params.j_from,
            rng=self.params.rng,
        )
        if self.params.dp_epsilon:
            self._plan = self._with_dp(self._plan)
        return self._plan

    def _with_dp(self, plan: RoundPlan) -> RoundPlan:
        """Add the round's shuffle-DP parameters: k, and p_e from each element's reporters."""
        reporters = dp_reporters(plan, self.seed)
        pool = np.setdiff1d(np.arange(plan.n_elements), plan.selected)
        eps, delta = float(self.params.dp_epsilon), float(self.params.dp_delta)
        counts = reporters[pool]
        bits = bits_for(eps, int(np.median(counts[counts > 0])) if counts.any() else 1)
        flip = np.ones(plan.n_elements)
        for n in np.unique(counts[counts > 0]):
            flip[pool[counts == n]] = calibrate_flip(int(n), bits, eps, delta)
        self._dp_reporters = reporters
        return dataclasses.replace(plan, dp_bits=bits, dp_flip=flip, dp_lam=self.lam)

    def update(
        self, report_sum: np.ndarray, users: int, arrived: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Apply the summed reports of ``users`` users; return the round's metrics.

        Parameters
        ----------
        report_sum : numpy.ndarray
            Unscaled sum of the valid reports (length ``plan.report_size``).
        users : int
            Users whose reports are in the sum.
        arrived : numpy.ndarray, optional
            Shuffle-model DP: the global ids of those users (default: every sampled user).
            The debiasing counts the reporters among them, and the accounting charges them
            with the ε their queries really had (fewer reporters: less blanket).

        Returns
        -------
        dict
            ``server-round``, ``elements-added``, ``set-size`` and the mode's own keys
            (Alg. 1: ``element``, ``estimate``, with the history clamp also
            ``estimates-clamped``; Alg. 2: ``j-star``, ``r-prime``, ``pool-before``,
            ``pool-after``, ``tau``, ``level``; amplification: ``step``); with DP the
            privacy entries of :meth:`_dp_account`.
        """
        plan = self._plan
        if plan is None:
            raise RuntimeError("update() without plan()")
        self._plan = None
        self.server_round = plan.server_round
        inner = self.inner
        row: dict[str, Any] = {"server-round": plan.server_round}
        if plan.dp_bits:
            assert plan.dp_flip is not None
            ids = plan.users if arrived is None else np.unique(np.asarray(arrived, np.int64))
            if ids.size != np.asarray(plan.users).size:
                reporters = dp_reporters(plan, self.seed, ids)
            else:
                reporters = self._dp_reporters
            report_sum = debias_counts(
                report_sum, reporters, plan.dp_lam, plan.dp_bits, plan.dp_flip
            )
            row.update(self._dp_account(plan, ids, reporters))
        if self._bounded(plan):
            report_sum, checks = self._bound_sum(plan, report_sum, users)
            row.update(checks)
        if isinstance(inner, FedSMServer):
            rec = inner.select(report_sum, users)
            row.update(element=rec.element, estimate=rec.estimate, **{"elements-added": 1})
            if getattr(inner, "history", None) is not None:
                row["estimates-clamped"] = rec.clamped
        else:
            rec2 = inner.update(report_sum, users)
            row.update(
                {
                    "elements-added": len(rec2.added),
                    "added": rec2.added,
                    "j-star": rec2.j_star,
                    "r-prime": rec2.r_prime,
                    "pool-before": rec2.pool_before,
                    "pool-after": rec2.pool_after,
                    "tau": rec2.tau,
                    "level": rec2.level,
                }
            )
        row.update({"users": int(users), "d": plan.d, "user-values": int(users) * plan.d})
        row["set-size"] = len(inner.selected)
        if self.params.mode == "amplified":
            row["step"] = self.step + 1
            if inner.done:
                self._finish_step()
        return row

    def _bounded(self, plan: RoundPlan) -> bool:
        """Return True when the round's summed report is a sum of bounded user values."""
        return (
            getattr(self, "report_bound", None) is not None
            and plan.mode == "alg1"
            and plan.surrogate == "none"
            and not plan.dp_bits
        )

    def _bound_sum(
        self, plan: RoundPlan, report_sum: np.ndarray, users: int
    ) -> tuple[np.ndarray, dict[str, int]]:
        """Clip the summed report to what ``users`` honest users could send; count."""
        assert self.report_bound is not None
        tally = ReportTally()
        cap = np.full(plan.report_size, self.report_bound * int(users))
        cap[plan.selected] = 0.0
        over = report_sum > cap
        if over.any():
            tally.clip(int(over.sum()))
            report_sum = np.where(over, cap, report_sum)
        return report_sum, tally.row()

    def _dp_account(
        self, plan: RoundPlan, ids: np.ndarray, reporters: np.ndarray
    ) -> dict[str, Any]:
        """Charge the round's queries to the users who answered them; return the row entries.

        Per element e: the shuffle bound's ε at δ′ for the n′_e users whose reports arrived
        (ε′ when none dropped out, else :func:`~flower_app.algorithms.fedsm.shuffle_dp.
        query_epsilon`) and the local randomiser's ε (δ = 0). Each user is charged the sum
        over its d elements (basic composition); advanced composition uses the largest
        per-query ε and the busiest user's query count.

        Returns
        -------
        dict
            ``dp-epsilon``/``dp-delta`` (against the server, as each node verifies it: the
            worst user's local randomiser ε summed over its values, δ = 0; the rule of
            :mod:`flower_app.privacy.ledger`), ``dp-epsilon-honest-peers``/
            ``dp-delta-honest-peers`` (against the server if every other user is honest:
            the shuffle bound with secure aggregation, the local one without; the smaller
            of basic and advanced),
            ``dp-epsilon-outsider``/``dp-delta-outsider`` (shuffle bound: anyone who sees
            only totals), ``dp-epsilon-local`` (δ = 0: a server that sees the replies in the
            clear, whatever ``dp_secure`` says), ``dp-epsilon-basic``, ``dp-delta-basic``,
            ``dp-epsilon-advanced``, ``dp-delta-advanced`` (against the server),
            ``dp-queries`` (busiest user), ``dp-bits``, ``dp-flip-mean``,
            ``dp-reporters-missing`` (planned reports that did not arrive),
            ``dp-secure-sum`` and ``dp-reproducible-noise``.
        """
        assert plan.dp_flip is not None
        eps, delta = float(self.params.dp_epsilon), float(self.params.dp_delta)
        pool = np.setdiff1d(np.arange(plan.n_elements), plan.selected)
        shuffle_e = np.zeros(plan.n_elements)
        local_e = np.zeros(plan.n_elements)
        planned = self._dp_reporters
        for e in pool[reporters[pool] > 0]:
            p, n = float(plan.dp_flip[e]), int(reporters[e])
            local_e[e] = local_epsilon(plan.dp_bits, p)
            shuffle_e[e] = eps if n >= planned[e] else query_epsilon(n, plan.dp_bits, p, delta)
        if ids.size:
            self.dp_eps_shuffle[ids] += dp_user_sums(plan, self.seed, ids, shuffle_e)
            self.dp_eps_local[ids] += dp_user_sums(plan, self.seed, ids, local_e)
            self.dp_queries[ids] += plan.d
            self.dp_eps_max["shuffle"] = max(self.dp_eps_max["shuffle"], float(shuffle_e.max()))
            self.dp_eps_max["local"] = max(self.dp_eps_max["local"], float(local_e.max()))
        queries = int(self.dp_queries.max())

        def bound(kind: str, per_query_delta: float) -> dict[str, float]:
            worst = self.dp_eps_shuffle if kind == "shuffle" else self.dp_eps_local
            adv = compose(self.dp_eps_max[kind], per_query_delta, queries)
            basic = {"dp-epsilon-basic": float(worst.max()),
                     "dp-delta-basic": queries * per_query_delta}  # fmt: skip
            if adv["dp-epsilon-advanced"] >= basic["dp-epsilon-basic"]:
                adv["dp-epsilon-advanced"] = basic["dp-epsilon-basic"]
                adv["dp-delta-advanced"] = basic["dp-delta-basic"]
            return {**basic, "dp-epsilon-advanced": adv["dp-epsilon-advanced"],
                    "dp-delta-advanced": adv["dp-delta-advanced"]}  # fmt: skip

        local = bound("local", 0.0)
        server = bound("shuffle", delta) if self.params.dp_secure else local
        outsider = bound("shuffle", delta)
        return {
            "dp-epsilon-local": local["dp-epsilon-advanced"],
            # against the server, what each node can verify: its users' local randomiser,
            # summed over their values (the rule of the nodes' own ledgers)
            "dp-epsilon": local["dp-epsilon-basic"],
            "dp-delta": 0.0,
            "dp-epsilon-honest-peers": server["dp-epsilon-advanced"],
            "dp-delta-honest-peers": server["dp-delta-advanced"],
            "dp-epsilon-outsider": outsider["dp-epsilon-advanced"],
            "dp-delta-outsider": outsider["dp-delta-advanced"],
            **server,
            "dp-queries": float(queries),
            "dp-bits": plan.dp_bits,
            "dp-flip-mean": float(plan.dp_flip[pool].mean()),
            "dp-reporters-missing": int(planned[pool].sum() - reporters[pool].sum()),
            "dp-secure-sum": int(self.params.dp_secure),
            "dp-reproducible-noise": int(self.params.dp_reproducible),
        }

    def _finish_step(self) -> None:
        assert self.point is not None
        chosen = list(self.inner.selected)
        self._step_selected.append(chosen)
        self.point[chosen] += self.params.eta
        self.point = np.minimum(self.point, 1.0)
        self.step += 1
        if self.step >= self.steps:
            x = check_in_polytope(self.point, self.matroid)
            if self.params.rounding == "pipage":
                self.final = pipage_rounding(x, self.matroid, self.rng)
            else:
                self.final = greedy_rounding(x, self.matroid)
        else:
            self.inner = self._new_inner()

    @property
    def step_sets(self) -> list[list[int]]:
        """Amplification: the set S_t of every finished step."""
        return [list(s) for s in self._step_selected]

    def progress_value(self, objective: MaxRowObjective) -> float:
        """Return the experiment oracle's value of the current state (never used to decide).

        Parameters
        ----------
        objective : MaxRowObjective
            All users' rows (the oracle; the server's algorithm never reads them).

        Returns
        -------
        float
            F(S) for Alg. 1 and 2; for amplification G(x + η1_T)/n during the run and F of
            the rounded set at the end.
        """
        if self.params.mode != "amplified" or self.final is not None:
            return objective.mean_value(self.selected)
        assert self.point is not None
        y = self.point.copy()
        y[self.inner.selected] += self.params.eta
        return multilinear_value(objective, np.minimum(y, 1.0)) / max(objective.n_users, 1)
