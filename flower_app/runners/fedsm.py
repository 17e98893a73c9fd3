"""Runner of FedSM (Algorithm 1): ServerApp side, ClientApp side and direct engine."""

from __future__ import annotations

import time
from functools import lru_cache
from logging import INFO
from typing import Any

from flwr.app import Context
from flwr.client import NumPyClient
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.fedsm import FedSMRound, FedSMServer, run_fedsm_direct
from flower_app.clients.submodular import SubmodularClient
from flower_app.config import AppConfig
from flower_app.experiment import Experiment, finish_run, open_run, partition_of, summary_line
from flower_app.problems import SubmodularProblem, cohort_objective, load_problem
from flower_app.strategies.fedsm import FedSMStrategy
from flower_app.submodular.matroids import Matroid

__all__ = ["direct_run", "make_client", "server_run", "summary_line"]


def _server(cfg: AppConfig, problem: SubmodularProblem, matroid: Matroid) -> FedSMServer:
    return FedSMServer(
        problem.n_users,
        matroid,
        cfg.k,
        cfg.clients_per_round,
        cfg.elements_per_client,
        seed=cfg.seed,
    )


def _open(cfg: AppConfig, engine: str) -> Experiment:
    return open_run(cfg, engine, check=lambda p, m: _server(cfg, p, m))


def server_run(grid: Grid, cfg: AppConfig) -> dict[str, Any]:
    """Run FedSMStrategy over the grid and write the run folder; return the summary."""
    exp = _open(cfg, "flower")
    log(INFO, "run folder: %s", exp.writer.folder)
    strategy = FedSMStrategy(
        n_users=exp.problem.n_users,
        matroid=exp.matroid,
        k=cfg.k,
        clients_per_round=cfg.clients_per_round,
        elements_per_client=cfg.elements_per_client,
        seed=cfg.seed,
        evaluate_fn=exp.problem.objective.mean_value,
        on_round=exp.writer.log_round,
        round_timeout=cfg.round_timeout,
        discovery_timeout=cfg.discovery_timeout,
    )
    strategy.start(grid=grid)
    return finish_run(exp, list(strategy.server.selected), strategy.history)


def direct_run(cfg: AppConfig, progress: bool = False) -> dict[str, Any]:
    """Run FedSM Algorithm 1 on the direct engine and write the run folder."""
    exp = _open(cfg, "direct")
    server = _server(cfg, exp.problem, exp.matroid)
    history: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.k, desc=f"fedsm {cfg.dataset} seed {cfg.seed}", leave=False)
    t0 = time.perf_counter()

    def on_round(rnd: FedSMRound, value: float) -> None:
        s = len(server.selected)
        row = {
            "server-round": rnd.server_round,
            "element": rnd.element,
            "estimate": rnd.estimate,
            "objective": value,
            "users": rnd.users,
            "d": rnd.d,
            "user-values": rnd.user_values,
            # protocol bytes with one user per node: S down (int64), d sparse entries up
            "bytes-down": rnd.users * (s - 1) * 8,
            "bytes-up": rnd.user_values * 12,
            "wall-time": time.perf_counter() - t0,
        }
        history.append(row)
        exp.writer.log_round(row)
        if bar is not None:
            bar.update(1)

    selected = run_fedsm_direct(exp.problem.objective, server, on_round)
    if bar is not None:
        bar.close()
    return finish_run(exp, selected, history)


def make_client(cfg: AppConfig, context: Context) -> NumPyClient:
    """Return the node's SubmodularClient (its cohort of users)."""
    return _client(cfg, *partition_of(context))


@lru_cache(maxsize=64)
def _client(cfg: AppConfig, partition_id: int, num_partitions: int) -> SubmodularClient:
    problem = load_problem(cfg)
    objective, first = cohort_objective(problem, partition_id, num_partitions)
    return SubmodularClient(objective, first, problem.n_users, partition_id, num_partitions)
