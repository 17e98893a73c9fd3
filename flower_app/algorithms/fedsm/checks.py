"""What the server checks on a FedSM Algorithm 1 report before it sums it (both contracts).

A report is a node's sum over the users it was sent (cohort mode), one user's report (plain
mode: one node, one user), or, under secure aggregation, the sum of every surviving node.
Each honest user reports f_i(e | S) ≤ λ on the d elements of its own draw D_i ⊆ E \\ S and
nothing else, so:

* one user (its id known): every value in [0, bound], non-zero only on D_i, which the
  server recomputes from (seed, round, user) (:func:`~.sampling.user_draw`; with
  ``rng = "batched"`` a user draws only D_i ∩ A_i from its private support A_i, which the
  server cannot recompute, so only the range is checked);
* a sum over ``users`` users: at most ``bound · users`` on each element outside S, nothing on
  S (the draws of a node's users are not recomputed: at DBLP scale that would cost the
  server the users' own sampling time every round).

A report that fails is refused whole (the strategy counts it, by reason, in the round's row).
Other modes (Algorithm 2, amplification, shuffle DP) carry other quantities and are not
checked here.
"""

from __future__ import annotations

import numpy as np

from flower_app.algorithms.fedsm.modes import RoundPlan
from flower_app.algorithms.fedsm.sampling import user_draw
from flower_app.algorithms.robust.node_bounds import node_reason
from flower_app.algorithms.robust.reports import refusal_reason

__all__ = ["report_refusal"]


def report_refusal(
    report: np.ndarray,
    plan: RoundPlan,
    users: int,
    bound: float | None,
    seed: int,
    user_id: int | None = None,
) -> str | None:
    """Return why an Algorithm 1 report cannot be honest, or None (also when not checked).

    Parameters
    ----------
    report : numpy.ndarray
        The decoded dense report (length ``plan.report_size``).
    plan : RoundPlan
        The round it answers.
    users : int
        Users whose reports it sums.
    bound : float or None
        The declared range λ (``report-bound``); None: no check.
    seed : int
        The run's seed (keys the users' draws).
    user_id : int, optional
        The user's global id when the report is one user's: its draw is then checked.

    Returns
    -------
    str or None
        ``"range"``, ``"draw"`` or ``"malformed"`` (see :mod:`flower_app.algorithms.robust`),
        or None.
    """
    if bound is None or plan.mode != "alg1" or plan.surrogate != "none" or plan.dp_bits:
        return None
    report = np.asarray(report, dtype=np.float64)
    if user_id is not None and users == 1 and plan.rng == "batched":
        ids = np.flatnonzero(report)
        return refusal_reason(ids, report[ids], bound)
    if user_id is not None and users == 1:
        pool = np.setdiff1d(np.arange(plan.n_elements), plan.selected)
        if not 1 <= plan.d <= pool.size:
            return "malformed"
        draw = np.sort(pool[user_draw(int(user_id), pool.size, plan.d, seed, plan.server_round)])
        ids = np.flatnonzero(report)
        return refusal_reason(ids, report[ids], bound, draw)
    cap = np.full(report.shape, float(bound) * int(users))
    cap[np.asarray(plan.selected, dtype=np.int64)] = 0.0
    return node_reason(report, cap)
