"""One FedSM user with *any* utility f_i: its report, its value, its λ_i (no Flower import).

A node that is one client (the strategies' plain mode) holds one user i. Its utility is
either

* a one-row :class:`~flower_app.submodular.objectives.MaxRowObjective` — facility location
  f_i(S) = max_{j ∈ S} score_j, or coverage (0/1 scores) — which takes the fast paths of
  :func:`~flower_app.algorithms.fedsm.modes.cohort_report` (every mode, amplification
  included), or
* a :class:`GainsUtility`: a user-supplied, vectorised marginal-gain callable
  ``gains_fn(selected, candidates) -> f_i(e | S) for every e in candidates`` (Algorithms 1
  and 2).

Either way the user draws its d elements (or pairs) from its own stream
``default_rng([seed, t, user])`` exactly as a cohort's user does
(:func:`~flower_app.algorithms.fedsm.core.sampled_entry_sum`,
:func:`~flower_app.algorithms.fedsm.alg2.pair_report_sum`), so a run over one-user nodes
gives the same S as the cohort engines for the same seed.

With ``rng="batched"`` (:mod:`~flower_app.algorithms.fedsm.sampling`) score data still gives
the cohort engines' S (the same support-proportional draw), but a gains callable, whose
support the node cannot know, draws D densely from the keyed generator: the same law, other
draws, so a callable and score data then give different (equally distributed) sets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from flower_app.algorithms.common.dp_noise import DP_STREAM, NoiseSource
from flower_app.algorithms.fedsm.alg2 import pair_report_sum
from flower_app.algorithms.fedsm.modes import RoundPlan, cohort_report
from flower_app.algorithms.fedsm.sampling import check_scheme, user_draw
from flower_app.algorithms.fedsm.shuffle_dp import randomize_counts
from flower_app.submodular.objectives import MaxRowObjective

__all__ = [
    "GainsFn",
    "GainsUtility",
    "UserUtility",
    "user_max_singleton",
    "user_report",
    "user_value",
]

#: ``gains_fn(selected, candidates) -> gains``: f_i(e | S) for every e in ``candidates``
GainsFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
#: tolerance below zero accepted for a marginal gain (rounding), reported as 0
_NEG_TOL = 1e-9


class GainsUtility:
    """A user's monotone submodular f_i given by its vectorised marginal gains.

    Parameters
    ----------
    gains_fn : callable
        ``gains_fn(selected, candidates) -> numpy.ndarray``: f_i(e | S) for every element e
        of ``candidates`` (int64 array) given S = ``selected`` (int64 array); one float per
        candidate, ≥ 0 (f_i monotone), 0 for elements of S.
    n_elements : int
        Size m of the ground set E = {0, .., m−1} (every node must use the same).
    value_fn : callable, optional
        ``value_fn(selected) -> float``: f_i(S). Default: the sum of the gains along S
        (f_i(∅) = 0 assumed), ``|S|`` calls of ``gains_fn``.
    """

    def __init__(
        self,
        gains_fn: GainsFn,
        n_elements: int,
        value_fn: Callable[[np.ndarray], float] | None = None,
    ) -> None:
        if isinstance(n_elements, bool) or not isinstance(n_elements, int) or n_elements < 1:
            raise ValueError(f"n_elements={n_elements!r} must be a positive int")
        self.gains_fn = gains_fn
        self.n_elements = int(n_elements)
        self.value_fn = value_fn

    def gains(self, selected: Sequence[int], candidates: np.ndarray) -> np.ndarray:
        """Return f_i(e | S) for the candidates, checked (finite, ≥ 0, one per candidate).

        Parameters
        ----------
        selected : sequence of int
            S.
        candidates : numpy.ndarray
            Elements e.

        Returns
        -------
        numpy.ndarray
            float64 gains, negatives within rounding set to 0.

        Raises
        ------
        ValueError
            If the callable returns the wrong shape, non-finite or negative values.
        """
        sel = np.asarray(list(selected), dtype=np.int64)
        cand = np.asarray(candidates, dtype=np.int64)
        out = np.asarray(self.gains_fn(sel, cand), dtype=np.float64).reshape(-1)
        if out.shape != cand.shape:
            raise ValueError(f"gains_fn returned {out.shape[0]} gains for {cand.size} candidates")
        if not np.all(np.isfinite(out)) or (out < -_NEG_TOL).any():
            raise ValueError("gains_fn must return finite, non-negative gains (f_i monotone)")
        return np.maximum(out, 0.0)

    def value(self, selected: Sequence[int]) -> float:
        """Return f_i(S)."""
        sel = np.asarray(list(selected), dtype=np.int64)
        if self.value_fn is not None:
            return float(self.value_fn(sel))
        return float(sum(self.gains(sel[:j], sel[j : j + 1])[0] for j in range(sel.size)))


#: what a one-user node holds: score data (fast paths) or a gains callable
UserUtility = MaxRowObjective | GainsUtility


class _CallablePairGains:
    """Algorithm 2's pair values f_i(e | S ∪ {a_1..a_j}) from a :class:`GainsUtility`."""

    def __init__(
        self, utility: GainsUtility, selected: np.ndarray, sequence: np.ndarray, j_from: int
    ) -> None:
        self.utility = utility
        self.selected = [int(e) for e in selected]
        self.sequence = [int(e) for e in sequence]
        self.j_from = int(j_from)

    def active(self, users: np.ndarray, pool: np.ndarray) -> np.ndarray:
        """Return every user (a callable cannot tell in advance who reports zeros only)."""
        return np.arange(len(users))

    def evaluate(
        self, users: np.ndarray, upos: np.ndarray, elem: np.ndarray, jdx: np.ndarray
    ) -> np.ndarray:
        """Return the pairs' gains, one ``gains_fn`` call per prefix length."""
        out = np.zeros(elem.size)
        for j in np.unique(jdx):
            rows = jdx == j
            prefix = self.selected + self.sequence[: int(j) + self.j_from]
            out[rows] = self.utility.gains(prefix, elem[rows])
        return out


def _check_one_row(utility: MaxRowObjective) -> None:
    if utility.n_users != 1:
        raise ValueError(f"a one-user node holds one row of scores, got {utility.n_users}")


def user_report(
    utility: UserUtility,
    plan: RoundPlan,
    user_id: int,
    seed: int,
    reproducible_noise: bool = False,
) -> tuple[np.ndarray, int]:
    """Return one user's report for the round, and the number of positive values in it.

    Parameters
    ----------
    utility : MaxRowObjective or GainsUtility
        The user's f_i (a one-row score matrix, or a gains callable).
    plan : RoundPlan
        The round (its ``users`` are ignored: this is user ``user_id``).
    user_id : int
        The user's global id (seeds its stream ``default_rng([seed, t, user_id])``).
    seed : int
        Run seed.
    reproducible_noise : bool, optional
        Shuffle-model DP (``plan.dp_bits`` > 0): the research mode ``dp-reproducible-noise``
        (default False: the randomiser draws from OS entropy). Take it from the node's own
        configuration, never from the server's message.

    Returns
    -------
    tuple
        ``(report, hits)``: float64 vector of length ``plan.report_size`` (m for Algorithm
        1, |X|·r' for Algorithm 2) and the count of its positive entries; under DP the
        report holds the randomised counts of ones of the d drawn elements.

    Raises
    ------
    ValueError
        On a d outside its range, or amplification with a gains callable.
    """
    ids = np.array([int(user_id)], dtype=np.int64)
    if isinstance(utility, MaxRowObjective):
        _check_one_row(utility)
        return cohort_report(utility, np.zeros(1, dtype=np.int64), ids, plan, seed,
                             reproducible_noise=reproducible_noise)  # fmt: skip
    if plan.surrogate != "none":
        raise ValueError(
            "amplification needs the multilinear extension of f_i: give score data "
            "(facility location / coverage), not a gains callable"
        )
    m, t = utility.n_elements, plan.server_round
    if plan.mode == "alg2":
        gains = _CallablePairGains(utility, plan.selected, plan.sequence, plan.j_from)
        return pair_report_sum(
            gains,
            np.zeros(1, dtype=np.int64),
            ids,
            plan.pool,
            plan.sequence.size,
            plan.d,
            seed,
            t,
            plan.rng,
        )
    pool = np.setdiff1d(np.arange(m), plan.selected)
    if not 1 <= plan.d <= pool.size:
        raise ValueError(f"d={plan.d} must lie in 1..|E \\ S| = {pool.size}")
    elements = pool[user_draw(int(user_id), pool.size, plan.d, seed, t, check_scheme(plan.rng))]
    values = utility.gains(plan.selected, elements)
    out = np.zeros(m)
    if plan.dp_bits:  # shuffle-model DP: k randomised bits per drawn value, counts of ones
        assert plan.dp_flip is not None
        rng = NoiseSource(reproducible_noise, seed).generator(t, int(user_id), DP_STREAM)
        out[elements] = randomize_counts(
            np.asarray(values, np.float64), plan.dp_lam, plan.dp_bits, plan.dp_flip[elements], rng
        )
        return out, int(np.count_nonzero(np.asarray(values) > 0))
    out[elements] = values
    return out, int(np.count_nonzero(values > 0))


def user_value(utility: UserUtility, selected: Sequence[int]) -> float:
    """Return f_i(S) of one user."""
    if isinstance(utility, MaxRowObjective):
        _check_one_row(utility)
        return utility.value(list(selected))
    return utility.value(selected)


def user_max_singleton(utility: UserUtility) -> float:
    """Return λ_i = max_e f_i({e}) (Algorithm 2's default threshold is max_i λ_i)."""
    if isinstance(utility, MaxRowObjective):
        return utility.max_singleton
    gains = utility.gains([], np.arange(utility.n_elements))
    return float(gains.max()) if gains.size else 0.0
