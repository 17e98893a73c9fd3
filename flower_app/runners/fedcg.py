"""Runner of FedCG (Alg. 1), FedCG+ (Alg. 2) and the federated discrete greedy (Algs. 3-5).

Algorithm names: ``fedcg``, ``fedcg-plus``, ``fed-discrete-greedy``. Their own run_config
keys (``fedcg-*``, ``dgreedy-kappa``) are declared, with their defaults and ranges, in
:mod:`flower_app.settings` (reference: ``docs/configuration.md``; the measured effect of
``fedcg-fill-base`` in ``docs/reproductions/fedcg.md``) and read validated with ``cfg.get``.
``objective-pipage`` (the "pipage/greedy" column of the recorded sweeps) is None unless
``fedcg-report-pipage`` or ``fedcg-rounding = "pipage"`` asks for it. The common key
``clients-per-round`` is K (draws with replacement per round); the float 1.0 means full
participation.

``fedcg-rounding = "verified"`` (verified rounding, not the paper's oblivious rounding):
after FedCG's T rounds the federated discrete greedy (its importance exchanges, then k
rounds with its checks and ``dgreedy-kappa``) chooses S among the 2k elements of largest x
(:func:`~flower_app.submodular.rounding.verification_matroid`). Its rows follow FedCG's
(``server-round`` T + 1 … T + k, ``phase = "verified-rounding"``); the checkpoint stays
FedCG's last round, so a resumed run redoes these k rounds (seeded: the same S).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.client import NumPyClient
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.fedcg.continuous import (
    ROUNDINGS,
    FedCGServer,
    LocalSteps,
    UserEntries,
    round_point,
)
from flower_app.algorithms.fedcg.discrete_greedy import (
    DiscreteGreedyServer,
)
from flower_app.algorithms.robust.profiles import declared_bound
from flower_app.clients.continuous import ContinuousClient
from flower_app.config import AppConfig, ConfigError
from flower_app.experiment import (
    Experiment,
    cohort_options,
    finish_run,
    open_remote_run,
    open_run,
    remote_checkpoint_fn,
    serve_rounds,
)
from flower_app.experiment import summary_line as _base_summary_line
from flower_app.node_data import file_stamp, load_node_rows, node_groups, node_partition
from flower_app.problems import (
    SubmodularProblem,
    build_matroid,
    cohort_objective,
    config_matroid,
    load_problem,
)
from flower_app.server_data import RemoteProblem, evaluator, probe_instance
from flower_app.settings.rules import raise_size_problems, submodular_instance
from flower_app.strategies.cohort.discrete_greedy import DiscreteGreedyCohorts
from flower_app.strategies.cohort.fedcg import FedCGCohorts
from flower_app.submodular.matroids import Matroid
from flower_app.submodular.multilinear import multilinear_value
from flower_app.submodular.rounding import verification_matroid

__all__ = ["make_client", "server_run", "summary_line", "verification_server", "verify_rows"]

#: ``fedcg-rounding``'s value for verified rounding (FedCG's own server then rounds greedily,
#: for its per-round preview)
VERIFIED = "verified"
#: the ``phase`` of verified rounding's rows in metrics.jsonl
VERIFY_PHASE = "verified-rounding"


def local_steps(cfg: AppConfig) -> LocalSteps:
    """Return the users' computation configured for ``cfg.algorithm``."""
    return LocalSteps(
        steps=cfg.get("fedcg-local-steps") if cfg.algorithm == "fedcg-plus" else 1,
        gradient=cfg.get("fedcg-gradient"),
        samples=cfg.get("fedcg-gradient-samples"),
        fill_base=cfg.get("fedcg-fill-base"),
    )


def client_weights(cfg: AppConfig, problem: SubmodularProblem | RemoteProblem) -> np.ndarray | None:
    """Return p_i (None = uniform)."""
    if cfg.get("fedcg-client-weights") == "uniform":
        return None
    assert problem.objective is not None  # server-data = 'none' is refused (settings.rules)
    sizes = np.diff(problem.objective.values.indptr).astype(np.float64)
    if sizes.sum() <= 0:
        raise ConfigError("fedcg-client-weights = 'data-size' needs at least one non-zero entry")
    return sizes / sizes.sum()


def fedcg_server(
    cfg: AppConfig, problem: SubmodularProblem | RemoteProblem, matroid: Matroid
) -> FedCGServer:
    """Build (and so validate) the FedCG / FedCG+ server state of a configuration."""
    rounding = cfg.get("fedcg-rounding")
    try:
        return FedCGServer(
            problem.n_users,
            matroid,
            cfg.get("fedcg-rounds"),
            cfg.get("fedcg-eta"),
            local_steps(cfg),
            cfg.clients_per_round,
            client_weights(cfg, problem),
            seed=cfg.seed,
            rounding="greedy" if rounding == VERIFIED else rounding,
        )
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{cfg.algorithm}: {err}") from err


def discrete_server(
    cfg: AppConfig,
    problem: SubmodularProblem | RemoteProblem,
    matroid: Matroid,
    k: int | None = None,
) -> DiscreteGreedyServer:
    """Build (and so validate) the discrete-greedy server state of a configuration.

    ``clients-per-round`` is not read: the discrete greedy samples each user with
    probability κ_i = min(1, κ w_i) (``dgreedy-kappa``); a config that sets it is refused
    (:mod:`flower_app.settings.rules`). ``k``: its rounds (default the configured k).
    """
    lam = problem.max_singleton if problem.objective is None else problem.objective.max_singleton
    return DiscreteGreedyServer(
        problem.n_users, matroid, cfg.k if k is None else k, cfg.get("dgreedy-kappa"),
        seed=cfg.seed, report_bound=declared_bound(cfg.report_bound, lam),
    )  # fmt: skip


def verification_server(
    cfg: AppConfig, problem: SubmodularProblem | RemoteProblem, server: FedCGServer
) -> DiscreteGreedyServer | None:
    """Return the discrete greedy of verified rounding over FedCG's final x (None if not asked).

    The same κ (``dgreedy-kappa``), seed and report bound as ``fed-discrete-greedy``; the
    matroid keeps the 2k elements of largest x (per block: 2c) open.
    """
    if cfg.get("fedcg-rounding") != VERIFIED:
        return None
    matroid = verification_matroid(server.x, server.matroid)
    return discrete_server(cfg, problem, matroid, k=matroid.rank)


def verify_rows(
    log_row: Callable[[dict], None], rounds: int, kept: list[dict] | None = None
) -> Callable[[dict], None]:
    """Log verified rounding's rows after FedCG's ``rounds`` rows.

    Each row is also appended to ``kept`` (the run's history), when given.
    """

    def log_verify_row(row: dict) -> None:
        row = {**row, "server-round": rounds + int(row["server-round"]), "phase": VERIFY_PHASE}
        log_row(row)
        if kept is not None:
            kept.append(row)

    return log_verify_row


def _server(cfg: AppConfig, problem: SubmodularProblem | RemoteProblem, matroid: Matroid) -> Any:
    raise_size_problems(cfg, submodular_instance(problem, matroid))
    if cfg.algorithm == "fed-discrete-greedy":
        return discrete_server(cfg, problem, matroid)
    return fedcg_server(cfg, problem, matroid)


def _open(cfg: AppConfig, engine: str) -> Experiment:
    return open_run(cfg, engine, check=lambda p, m: _server(cfg, p, m))


def _multilinear(exp: Experiment) -> Any:
    n = max(exp.problem.n_users, 1)
    return lambda x: multilinear_value(exp.problem.objective, x) / n


def _finish(
    exp: Experiment,
    selected: list[int],
    history: list[dict],
    extra: dict,
    objective: float | None = None,
) -> dict:
    summary = finish_run(exp, selected, history, objective)
    summary.update(extra)
    exp.writer.write_summary(summary)
    return summary


def _continuous_extra(
    server: FedCGServer,
    exp: Experiment,
    evaluate: Callable[[list[int]], float | None] | None = None,
) -> dict[str, Any]:
    # the oblivious roundings of the same x, for the comparison (own stream, so the
    # configured rounding's result is untouched); pipage only when it is the configured
    # rounding or fedcg-report-pipage asks for it (else None)
    wanted = [
        rounding
        for rounding in ROUNDINGS
        if rounding != "pipage" or server.rounding == "pipage" or exp.cfg.get("fedcg-report-pipage")
    ]
    # the server's oracle, or a federated evaluation when it holds no data
    value = exp.problem.objective.mean_value if evaluate is None else evaluate
    by_rounding = {
        rounding: value(
            round_point(server.x, server.matroid, rounding, np.random.default_rng([server.seed, 1]))
        )
        for rounding in wanted
    }
    return {
        "multilinear": None if exp.remote else _multilinear(exp)(server.x),
        "objective-pipage": by_rounding.get("pipage"),
        "objective-greedy-rounding": by_rounding["greedy"],
        "x-mass": float(server.x.sum()),
        "x-support": int(np.count_nonzero(server.x > 1e-12)),
        "eta": server.eta,
        "local-steps": server.local.steps,
        "rounding": exp.cfg.get("fedcg-rounding"),
        "full-participation": bool(server.full),
        "draws-per-round": server.K,
    }


def _discrete_extra(server: DiscreteGreedyServer) -> dict[str, Any]:
    counts = [r.participants for r in server.rounds]
    return {
        "kappa": server.kappa,
        "expected-participants": server.expected,
        "mean-participants": float(np.mean(counts)) if counts else 0.0,
        "participants-by-round": counts,
    }


def server_run(grid: Grid, cfg: AppConfig) -> dict[str, Any]:
    """Run the configured strategy over the grid and write the run folder.

    With ``server-data = "none"`` the server reads no client data: sizes from the nodes,
    the matroid from configuration, no per-round objective, F(S) of the final set (and of
    the other rounding, for FedCG) by a federated evaluation (Σ f_i(S) over the nodes), no
    greedy reference and no multilinear F̂(x) (:mod:`flower_app.server_data`).
    """
    remote = cfg.server_data == "none"
    if remote:
        problem = probe_instance(grid, cfg.dataset, cfg.discovery_timeout)
        exp = open_remote_run(cfg, problem, "flower", check=lambda p, m: _server(cfg, p, m))
    else:
        exp = _open(cfg, "flower")
    log(20, "run folder: %s", exp.writer.folder)
    # the checkpoint of a run without server data also holds the nodes' n and m
    options = cohort_options(
        cfg, exp.writer, remote_checkpoint_fn(exp.writer, exp.problem) if remote else None
    )
    server = _server(cfg, exp.problem, exp.matroid)
    if isinstance(server, DiscreteGreedyServer):
        strategy = DiscreteGreedyCohorts(
            server, objective_fn=None if remote else exp.problem.objective.mean_value, **options
        )
        serve_rounds(strategy, grid, exp.writer, cfg, server.k)
        server = strategy.server
        extra = {**_discrete_extra(server), "protocol-bytes": strategy.protocol_bytes}
        selected = list(server.selected)
        objective = None
        if remote:
            evaluate = evaluator(grid, strategy, server.n_users, cfg.round_timeout)
            objective = evaluate(selected)
        return _finish(exp, selected, strategy.history, extra, objective)
    fedcg = FedCGCohorts(
        server, objective_fn=None if remote else _multilinear(exp), evaluate_every=10, **options
    )
    serve_rounds(fedcg, grid, exp.writer, cfg, server.rounds)
    server = fedcg.server  # a resumed run continues the checkpoint's server state
    assert server is not None
    selected = fedcg.selected if fedcg.selected is not None else server.round_solution()
    history = list(fedcg.history)
    verify = verification_server(cfg, exp.problem, server)
    if verify is not None:
        log(20, "verified rounding: the discrete greedy over the %d elements of largest x",
            int(np.count_nonzero(verify.matroid.groups < verify.matroid.capacities.size - 1)))
        # no checkpoint of its own: FedCG's last one stays, and a resume redoes these rounds
        verifier = DiscreteGreedyCohorts(
            verify,
            objective_fn=None if remote else exp.problem.objective.mean_value,
            **{**options, "on_round": verify_rows(exp.writer.log_round, server.rounds, history),
               "checkpoint_fn": None},
        )  # fmt: skip
        verifier.start(grid=grid, num_rounds=verify.k, timeout=cfg.round_timeout)
        exp.writer.record_failures(verifier.failure_summary())
        selected = list(verifier.server.selected)
    if not remote:
        return _finish(exp, selected, history, _continuous_extra(server, exp))
    evaluate = evaluator(grid, fedcg, server.n_users, cfg.round_timeout)
    extra = _continuous_extra(server, exp, evaluate)
    return _finish(exp, selected, history, extra, evaluate(selected))


@lru_cache(maxsize=64)
def _cohort(cfg: AppConfig, partition_id: int, num_partitions: int) -> tuple:
    problem = load_problem(cfg)
    objective, first = cohort_objective(problem, partition_id, num_partitions)
    cache: dict[bytes, UserEntries] = {}
    return objective, first, problem.n_users, build_matroid(cfg, problem), cache


@lru_cache(maxsize=16)
def _node_file(cfg: AppConfig, path: str, stamp: tuple) -> tuple:
    """Return a node's own file (node_config ``data-path``) and the matroid over its groups."""
    rows = load_node_rows(path, cfg.dataset)
    groups = None if cfg.matroid == "uniform" else node_groups(rows)
    matroid = config_matroid(cfg, f"the node's file {path}", rows.n_elements, groups)
    cache: dict[bytes, UserEntries] = {}
    return rows.objective, rows.first_user, rows.n_users_total, matroid, cache


def make_client(cfg: AppConfig, context: Context) -> NumPyClient:
    """Return the node's ContinuousClient (its cohort; its state is ``context.state``).

    With node_config ``data-path`` the node reads only its own file (checksum verified;
    a partition matroid's groups from ``element-groups.csv`` next to it); else it loads the
    configured instance and keeps its cohort's rows.
    """
    pid, parts, path = node_partition(context.node_config)
    if path is not None:
        objective, first, n_total, matroid, cache = _node_file(cfg, path, file_stamp(path))
    else:
        objective, first, n_total, matroid, cache = _cohort(cfg, pid, parts)
    return ContinuousClient(
        objective, first, n_total, pid, parts, matroid, state=context.state, cache=cache,
        report_bound=cfg.report_bound,
    )  # fmt: skip


def summary_line(summary: dict) -> str:
    """Return the one-line result printed at the end of a run."""
    line = _base_summary_line(summary)
    if "mean-participants" in summary:
        line += (
            f"; participants/round {summary['mean-participants']:.1f} "
            f"(expected {summary['expected-participants']:.1f})"
        )
    elif summary.get("multilinear") is not None:
        line += f"; F^(x) = {summary['multilinear']:.6g} ({summary['rounding']} rounding)"
    return line
