"""FedSM's direct engine: any mode (Algorithms 1, 2 and 3) in one process.

:func:`run_rounds` is the in-process loop over :class:`~flower_app.algorithms.fedsm.modes.FedSMRun`
and :func:`~flower_app.algorithms.fedsm.modes.cohort_report`, exactly the two pieces the
Flower strategy uses, so both engines give the same S for the same seed; :func:`direct_run`
is the runner's direct side (:mod:`flower_app.runners.fedsm` holds what both engines share).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from direct.rounds import DirectRounds
from flower_app.algorithms.fedsm.core import ENTRY_BYTES
from flower_app.algorithms.fedsm.modes import FedSMRun, cohort_report
from flower_app.algorithms.robust.profiles import commit_profiles
from flower_app.config import AppConfig
from flower_app.runners.fedsm import _finish, _open, _run
from flower_app.submodular.objectives import MaxRowObjective

__all__ = ["direct_run", "run_rounds"]


def run_rounds(
    objective: MaxRowObjective,
    run: FedSMRun,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    oracle: MaxRowObjective | None = None,
) -> list[int]:
    """Run any FedSM mode in one process (the direct engine), one user per "node".

    Parameters
    ----------
    objective : MaxRowObjective
        All users' rows (the profiles their reports are computed from).
    run : FedSMRun
        Fresh server state.
    on_round : callable, optional
        Receives each round's metrics, with the oracle's ``objective`` and the modelled
        communication of one-user nodes (``values-*``, ``bytes-*``).
    oracle : MaxRowObjective, optional
        The rows the row's ``objective`` F(S) is computed on (default ``objective``; the
        true data when the reports come from profiles clipped at setup).

    Returns
    -------
    list of int
        The final S.
    """
    while not run.done:
        plan = run.plan()
        total, hits = cohort_report(objective, plan.users, plan.users, plan, run.seed,
                                    reproducible_noise=run.params.dp_reproducible)  # fmt: skip
        row = run.update(total, plan.users.size)
        k_users = plan.users.size
        down = plan.values_down(1)
        row.update(
            {
                "values-up": 2 * hits,
                "bytes-up": ENTRY_BYTES * hits,
                "values-up-per-client": 2 * hits / max(k_users, 1),
                "values-down": k_users * down,
                "values-down-per-client": down,
                "bytes-down": k_users * 8 * down,
                "positive-entries": hits,
                "objective": run.progress_value(objective if oracle is None else oracle),
            }
        )
        if on_round is not None:
            on_round(row)
    return run.selected


def direct_run(cfg: AppConfig, progress: bool = False) -> dict[str, Any]:
    """Run the configured FedSM mode on the direct engine and write the run folder."""
    exp = _open(cfg, "direct")
    run = _run(cfg, exp.problem, exp.matroid)
    desc = f"fedsm {run.params.mode} {cfg.dataset} seed {cfg.seed}"
    rounds = DirectRounds(exp.writer, progress, desc)
    # the one in-process node computes every report from the profiles committed at setup
    committed, clipped = commit_profiles(exp.problem.objective, run.report_bound or 0.0)
    run_rounds(committed, run, rounds.log, oracle=exp.problem.objective)
    rounds.close()
    summary = _finish(exp, run, rounds.history)
    summary["profile-values-clipped"] = clipped
    exp.writer.write_summary(summary)
    return summary
