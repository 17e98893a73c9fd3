"""Runner of FedSM (Algorithms 1, 2 and 3): ServerApp side and ClientApp side.

The family's run_config keys (``fedsm-*``) are declared, with their defaults and ranges, in
:mod:`flower_app.settings` (reference: ``docs/configuration.md``) and read validated with
``cfg.get``. Two readings not spelt out there: with ``fedsm-mode = "alg2"``,
``elements-per-client`` is d, the (element, prefix) pairs per user (an int caps them, a float
is a fraction of |X|·r'); ``fedsm-levels = 0`` runs until τ < ε·τ₀/k, i.e.
⌈ln(k/ε)/ln(1/(1−ε))⌉ levels, and −1 until |S| = k, as the authors' loop.
"""

from __future__ import annotations

from functools import lru_cache
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.client import NumPyClient
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.common.dp_noise import NO_PRIVACY_NOTE, warn_no_privacy
from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun
from flower_app.algorithms.robust.profiles import declared_bound
from flower_app.clients.submodular import SubmodularClient
from flower_app.config import AppConfig, ConfigError
from flower_app.experiment import (
    Experiment,
    cohort_options,
    finish_run,
    open_remote_run,
    open_run,
    remote_checkpoint_fn,
    serve_rounds,
    summary_line,
)
from flower_app.node_data import load_node_rows, node_partition
from flower_app.problems import SubmodularProblem, cohort_objective, load_problem
from flower_app.server_data import RemoteProblem, probe_instance
from flower_app.settings.rules import raise_size_problems, submodular_instance
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from flower_app.submodular.matroids import Matroid
from flower_app.submodular.multilinear import multilinear_value

__all__ = ["fedsm_params", "make_client", "server_run", "summary_line"]

#: totals summed over rounds into summary.json
_TOTALS = (
    "user-values",
    "values-up",
    "bytes-up",
    "values-down",
    "bytes-down",
    "positive-entries",
    "elements-added",
)


def fedsm_params(cfg: AppConfig) -> FedSMParams:
    """Return the mode and its parameters from the family's keys (see the module docstring).

    Parameters
    ----------
    cfg : AppConfig
        Validated configuration (each key already typed and in its declared range).

    Returns
    -------
    FedSMParams
        The mode and its parameters.

    Notes
    -----
    ε's and η's ranges and the keys that go with ``fedsm-dp-epsilon`` are declared in
    :mod:`flower_app.settings` (checked when ``cfg`` was made, and before Flower starts).
    """
    params = FedSMParams(
        mode=cfg.get("fedsm-mode"),
        clients_per_round=cfg.clients_per_round,
        elements_per_client=cfg.elements_per_client,
        epsilon=cfg.get("fedsm-epsilon"),
        tau=cfg.get("fedsm-tau"),
        levels=cfg.get("fedsm-levels"),
        j_from=cfg.get("fedsm-j-from"),
        eta=cfg.get("fedsm-eta"),
        inner=cfg.get("fedsm-inner"),
        surrogate=cfg.get("fedsm-surrogate"),
        samples=cfg.get("fedsm-samples"),
        rounding=cfg.get("fedsm-rounding"),
        rng=cfg.get("fedsm-rng"),
        dp_epsilon=cfg.get("fedsm-dp-epsilon"),
        dp_delta=cfg.get("fedsm-dp-delta"),
        dp_secure=bool(cfg.secure_aggregation),
        dp_reproducible=cfg.dp_reproducible_noise,
        history_clamp=cfg.get("fedsm-history-clamp"),
    )
    return params


def _lam(problem: SubmodularProblem | RemoteProblem) -> float:
    """λ = max f_i({e}): from the instance, or as the nodes reported it (server-data none)."""
    if problem.objective is None:
        return problem.max_singleton
    return problem.objective.max_singleton


def _run(cfg: AppConfig, problem: SubmodularProblem | RemoteProblem, matroid: Matroid) -> FedSMRun:
    raise_size_problems(cfg, submodular_instance(problem, matroid))
    try:
        return FedSMRun(
            problem.n_users,
            matroid,
            cfg.k,
            fedsm_params(cfg),
            _lam(problem),
            seed=cfg.seed,
            report_bound=declared_bound(cfg.report_bound, _lam(problem)),
        )
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"fedsm ({cfg.get('fedsm-mode')}): {err}") from None


def _open(cfg: AppConfig, engine: str) -> Experiment:
    if float(cfg.get("fedsm-dp-epsilon")) > 0 and cfg.dp_reproducible_noise:
        warn_no_privacy()
    return open_run(cfg, engine, check=lambda p, m: _run(cfg, p, m))


def _finish(
    exp: Experiment,
    run: FedSMRun,
    history: list[dict[str, Any]],
    objective: float | None = None,
) -> dict[str, Any]:
    """Write summary.json with the mode's own entries (rounds vs elements, communication).

    ``objective``: F(S) by federated evaluation when the server holds no data.
    """
    selected = run.selected
    summary = finish_run(exp, selected, history, objective)
    obj = exp.problem.objective
    mode = run.params.mode
    extra: dict[str, Any] = {
        "fedsm-mode": mode,
        "communication-rounds": len(history),
        "set-size": len(selected),
        "objective-by-round": [row.get("objective") for row in history],
        "set-size-by-round": [row.get("set-size") for row in history],
    }
    for key in _TOTALS:
        extra[key] = sum(int(row.get(key, 0)) for row in history)
    # server-data = none (obj None): no oracle curves, no fractional objective
    if mode == "amplified":
        assert run.point is not None
        if obj is not None:
            extra["objective-by-k"] = []
        extra["fractional-objective"] = (
            None if obj is None else multilinear_value(obj, run.point) / max(obj.n_users, 1)
        )
        extra["x"] = {str(int(e)): float(run.point[e]) for e in np.flatnonzero(run.point)}
        extra["step-sets"] = run.step_sets
        extra["steps"] = run.steps
    elif mode == "alg2" and obj is not None:  # F(S_1), ..., F(S_|S|) in the order of adding
        current, by_k = np.zeros(obj.n_users), []
        for e in selected:
            current = obj.update_current(current, e)
            by_k.append(float(current.sum()) / max(obj.n_users, 1))
        extra["objective-by-k"] = by_k
    if run.params.dp_epsilon:
        extra["privacy"] = _privacy(run, history)
    summary.update(extra)
    exp.writer.write_summary(summary)
    return summary


def _privacy(run: FedSMRun, history: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the run's privacy accounting (shuffle-model DP): per query and composed."""
    last = next((r for r in reversed(history) if "dp-epsilon" in r), {})
    secure = bool(run.params.dp_secure)
    return {
        "mechanism": "shuffle-model bounded sums (Cheu et al. 2019), FedSM Appendix C",
        "accountant": "flower_app.algorithms.fedsm.shuffle_dp: exact hockey-stick bound per query, "
        "basic and advanced composition over the busiest user's queries",
        "epsilon-against-server": last.get("dp-epsilon"),
        "delta-against-server": last.get("dp-delta"),
        "epsilon-against-server-means": (
            "the worst user's local randomiser epsilon summed over the values it reported "
            "(delta 0): what each node verifies for its own users, whoever else reported (in "
            "a Flower run, the largest figure the nodes' own ledgers reported)"
        ),
        "epsilon-if-peers-honest": last.get("dp-epsilon-honest-peers"),
        "delta-if-peers-honest": last.get("dp-delta-honest-peers"),
        "epsilon-if-peers-honest-means": (
            "secure aggregation: the server sees only each element's total, so the shuffle "
            "bound holds if the other users are honest (for the users whose reports "
            "arrived)" if secure else
            "no secure aggregation: the server sees each node's (plain mode: each user's) "
            "report, so only the local randomiser's epsilon holds"
        ),
        "epsilon-against-outsiders": last.get("dp-epsilon-outsider"),
        "delta-against-outsiders": last.get("dp-delta-outsider"),
        "epsilon-against-outsiders-means": "shuffle bound: for anyone who sees only totals",
        "dp-epsilon-per-query": float(run.params.dp_epsilon),
        "dp-delta-per-query": float(run.params.dp_delta),
        "dp-bits-per-value": [row.get("dp-bits") for row in history],
        **{k: last[k] for k in last if k.startswith(("dp-queries", "dp-epsilon-", "dp-delta-"))},
        "reproducible-noise": bool(run.params.dp_reproducible),
        "privacy-against-server": NO_PRIVACY_NOTE if run.params.dp_reproducible else (
            "randomiser from each node's OS entropy: the server cannot regenerate it"
        ),
    }


def server_run(grid: Grid, cfg: AppConfig) -> dict[str, Any]:
    """Run FedSMCohorts over the grid and write the run folder; return the summary.

    With ``server-data = "none"`` the server reads no client data: sizes and λ from the
    nodes, the matroid from configuration, F(S) by federated evaluation after the last
    round (``federated_evaluation=True``), no greedy reference (:mod:`flower_app.server_data`).
    """
    remote = cfg.server_data == "none"
    if remote:
        problem = probe_instance(grid, cfg.dataset, cfg.discovery_timeout)
        exp = open_remote_run(cfg, problem, "flower", check=lambda p, m: _run(cfg, p, m))
        log(INFO, "run folder: %s (server-data = none)", exp.writer.folder)
        # resumable like the run with server data; the checkpoint also holds the nodes' n, m, λ
        options = cohort_options(cfg, exp.writer, remote_checkpoint_fn(exp.writer, problem))
        lam = problem.max_singleton
        options["federated_evaluation"] = True
    else:
        exp = _open(cfg, "flower")
        log(INFO, "run folder: %s", exp.writer.folder)
        obj = exp.problem.objective
        options = cohort_options(cfg, exp.writer)
        lam = obj.max_singleton
        options["progress_fn"] = lambda run: run.progress_value(obj)
    strategy = FedSMCohorts(
        exp.problem.n_users, exp.matroid, cfg.k, fedsm_params(cfg), seed=cfg.seed, lam=lam,
        report_bound=declared_bound(cfg.report_bound, lam), **options,
    )  # fmt: skip
    result = serve_rounds(strategy, grid, exp.writer, cfg, cfg.k)
    assert strategy.run is not None
    objective = None
    if remote and result.evaluate_metrics_clientapp:
        evaluations = result.evaluate_metrics_clientapp
        objective = evaluations[max(evaluations)].get("objective")
    return _finish(exp, strategy.run, strategy.history, objective)


def make_client(cfg: AppConfig, context: Context) -> NumPyClient:
    """Return the node's SubmodularClient (its cohort of users).

    With node_config ``data-path`` the node reads only its own file (checksum verified
    against the manifest next to it, :mod:`flower_app.node_data`); else it loads the
    configured instance and keeps its cohort's rows.
    """
    pid, parts, path = node_partition(context.node_config)
    if path is not None:
        rows = load_node_rows(path, cfg.dataset)
        return SubmodularClient(rows.objective, rows.first_user, rows.n_users_total, pid, parts,
                                reproducible_noise=cfg.dp_reproducible_noise,
                                report_bound=cfg.report_bound)  # fmt: skip
    return _client(cfg, pid, parts)


@lru_cache(maxsize=64)
def _client(cfg: AppConfig, partition_id: int, num_partitions: int) -> SubmodularClient:
    problem = load_problem(cfg)
    objective, first = cohort_objective(problem, partition_id, num_partitions)
    return SubmodularClient(objective, first, problem.n_users, partition_id, num_partitions,
                            reproducible_noise=cfg.dp_reproducible_noise,
                            report_bound=cfg.report_bound)  # fmt: skip
