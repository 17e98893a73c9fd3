"""The direct engine for FedSubAvg and its baselines: the same rounds, in process, vectorised.

All K sampled clients of a round are trained in one vectorised call (their submodels
concatenated, see :func:`flower_app.models.sparse_logreg.local_sgd`), with the same client
streams, the same server step and the same evaluation as :class:`FedSubAvgStrategy`, so the
two engines agree for the same seed (up to the order in which floating-point sums over
clients are added: nodes sum their own users first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flower_app.algorithms.common.dp_noise import NoiseSource
from flower_app.algorithms.common.gaussian_dp import GaussianAccountant, GaussianDP
from flower_app.algorithms.fedsubavg.core import (
    AdamConfig,
    CentralSGD,
    ClientSampler,
    Evaluator,
    FeatureHeat,
    LocalConfig,
    client_bytes,
    client_round,
    count_heat,
    gather_submodels,
    make_server_update,
    resolve_clients_per_round,
)
from flower_app.algorithms.fedsubavg.dp import private_round_update
from flower_app.datasets.movielens_rating import RatingTask

__all__ = ["RunSpec", "full_heat", "run_direct_rounds"]


@dataclass(frozen=True)
class RunSpec:
    """What one run does.

    Attributes
    ----------
    algorithm : str
        ``fedsubavg``, ``fedavg-sub``, ``fedprox-sub``, ``fedadam-sub``, ``scaffold-sub``
        or ``central-sgd``.
    rounds : int
        Communication rounds R.
    clients_per_round : int or float
        K (count or fraction of N).
    seed : int
        Seed of all randomness.
    local : LocalConfig
        Clients' I, B, γ, μ (CentralSGD: I and γ; its batch is K·B).
    weighting : str
        ``"clients"`` or ``"samples"``.
    adam : AdamConfig
        FedAdam's server hyperparameters.
    dp : GaussianDP or None
        Client-level DP (:mod:`flower_app.algorithms.fedsubavg.dp`), or None.
    """

    algorithm: str
    rounds: int
    clients_per_round: int | float
    seed: int = 0
    local: LocalConfig = field(default_factory=LocalConfig)
    weighting: str = "clients"
    adam: AdamConfig = field(default_factory=AdamConfig)
    dp: GaussianDP | None = None


def full_heat(task: RatingTask) -> FeatureHeat:
    """Return the feature heat of all clients (what the counting round adds up)."""
    heat = FeatureHeat.zeros(task.n_params)
    rows, clients, samples = count_heat(task, np.arange(task.n_clients))
    heat.add(rows, clients, samples, task.n_clients, int(task.n_train))
    return heat


def run_direct_rounds(
    task: RatingTask,
    spec: RunSpec,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    x0: np.ndarray | None = None,
) -> tuple[np.ndarray, list[dict[str, Any]], FeatureHeat]:
    """Run R rounds of ``spec.algorithm`` on the direct engine.

    Parameters
    ----------
    task : RatingTask
        The data.
    spec : RunSpec
        The run.
    on_round : callable, optional
        Receives each round's metrics dict (the same keys as the Flower strategy's, except
        ``nodes``).
    x0 : numpy.ndarray, optional
        Starting model (default zeros).

    Returns
    -------
    tuple
        ``(final model, per-round metrics, feature heat)``.

    Raises
    ------
    ValueError
        If K exceeds N, or on an unknown algorithm or weighting (before round 1).
    """
    k = resolve_clients_per_round(spec.clients_per_round, task.n_clients)
    x = np.zeros(task.n_params) if x0 is None else np.array(x0, dtype=np.float64, copy=True)
    heat = full_heat(task)
    evaluate = Evaluator(task)
    central = spec.algorithm == "central-sgd"
    if central:
        sgd = CentralSGD(task, k * spec.local.batch, spec.local.iters, spec.local.lr, spec.seed)
    else:
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
        if central:
            sgd.round(x, t)
            row: dict[str, Any] = {"server-round": t, "clients": 0, "bad-replies": 0}
        else:
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
