"""FedSubAvg's direct engine: the same rounds as the Flower strategy, in process, vectorised.

All K sampled clients of a round are trained in one vectorised call (their submodels
concatenated, see :func:`flower_app.models.sparse_logreg.local_sgd`), with the same client
streams, the same server step and the same evaluation as the Flower strategy, so the two
engines agree for the same seed (up to the order in which floating-point sums over clients
are added: nodes sum their own users first). :func:`direct_run` is the runner's direct side
(:mod:`flower_app.runners.fedsubavg` holds what both engines share); the torch tasks run in
:mod:`direct.fedsubavg_torch`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from direct.rounds import DirectRounds
from flower_app.algorithms.common.dp_noise import NoiseSource
from flower_app.algorithms.common.gaussian_dp import GaussianAccountant
from flower_app.algorithms.fedsubavg.core import (
    ClientSampler,
    Evaluator,
    FeatureHeat,
    RunSpec,
    client_bytes,
    client_round,
    full_heat,
    gather_submodels,
    make_server_update,
    resolve_clients_per_round,
    run_central_sgd,
)
from flower_app.algorithms.fedsubavg.dp import private_round_update
from flower_app.config import AppConfig
from flower_app.datasets.movielens_rating import RatingTask
from flower_app.registry import FEDSUBAVG_TORCH_DATASETS
from flower_app.runners.fedsubavg import _finish, _open

__all__ = ["direct_run", "run_direct_rounds"]


def run_direct_rounds(
    task: RatingTask,
    spec: RunSpec,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[np.ndarray, list[dict[str, Any]], FeatureHeat]:
    """Run R rounds of ``spec.algorithm`` on the direct engine.

    CentralSGD runs as the ServerApp runs it
    (:func:`~flower_app.algorithms.fedsubavg.core.run_central_sgd`).

    Parameters
    ----------
    task : RatingTask
        The data.
    spec : RunSpec
        The run.
    on_round : callable, optional
        Receives each round's metrics dict (the same keys as the Flower strategy's, except
        ``nodes``).

    Returns
    -------
    tuple
        ``(final model, per-round metrics, feature heat)``.

    Raises
    ------
    ValueError
        If K exceeds N, or on an unknown algorithm or weighting (before round 1).
    """
    if spec.algorithm == "central-sgd":
        return run_central_sgd(task, spec, on_round)
    k = resolve_clients_per_round(spec.clients_per_round, task.n_clients)
    x = np.zeros(task.n_params)
    heat = full_heat(task)
    evaluate = Evaluator(task)
    server = make_server_update(
        spec.algorithm, task.n_params, task.n_clients, heat, spec.weighting, spec.adam
    )
    sampler = ClientSampler(task.n_clients, k, spec.seed)
    sizes = task.submodel_sizes()
    accountant = None if spec.dp is None else GaussianAccountant(spec.dp, task.n_clients)
    history: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for t in range(1, spec.rounds + 1):
        r0 = time.perf_counter()
        users = sampler.sample()
        rows, ptr = gather_submodels(task, users)
        if spec.dp is None:
            update = client_round(
                task, users, x[rows], ptr, spec.local, spec.seed, t, spec.weighting
            )
        else:
            update = private_round_update(
                task, users, x[rows], ptr, spec.local, spec.seed, t, spec.dp,
                np.flatnonzero(heat.clients), users.size,
                NoiseSource(spec.dp.reproducible, spec.seed),
            )  # fmt: skip
        server.step(x, update, t)
        b = client_bytes(sizes[users])
        row = {
            "server-round": t,
            "clients": update.clients,
            "bad-replies": 0,
            "bytes-down": int(b["down"].sum()),
            "bytes-up": int(b["up"].sum()),
            "bytes-down-client-mean": float(b["down"].mean()),
            "bytes-down-client-max": int(b["down"].max()),
            "submodel-rows-mean": float(sizes[users].mean()),
            "union-rows": int(update.rows.size),
        }
        if accountant is not None:  # every sampled client is in the sum
            row.update(accountant.record(int(users.size), users))
        row.update(evaluate(x))
        row["round-time"] = time.perf_counter() - r0
        row["wall-time"] = time.perf_counter() - t0
        history.append(row)
        if on_round is not None:
            on_round(row)
    return x, history, heat


def direct_run(cfg: AppConfig, progress: bool = False) -> dict[str, Any]:
    """Run the algorithm on the direct engine and write the run folder; return the summary."""
    if cfg.dataset in FEDSUBAVG_TORCH_DATASETS:
        from direct.fedsubavg_torch import direct_run as torch_direct_run

        return torch_direct_run(cfg, progress)
    run = _open(cfg, "direct")
    x0_loss = Evaluator(run.task)(np.zeros(run.task.n_params))["train-loss"]
    desc = f"{cfg.algorithm} seed {cfg.seed}"
    rounds = DirectRounds(run.writer, progress, desc, run.spec.rounds, timed=False)
    _, history, heat = run_direct_rounds(run.task, run.spec, rounds.log)
    rounds.close()
    return _finish(run, history, heat, x0_loss)
