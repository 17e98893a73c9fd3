"""FedSubAvg with client-level differential privacy: clipped submodel updates, dense noise.

Sparse updates need a per-row decision. A client's update lives on its submodel S(i); its
L2 norm over those rows is clipped to C (:mod:`flower_app.algorithms.common.gaussian_dp`), so one
client moves the sum by at most C (2C under replace-one neighbours, the sensitivity used).
The noise cannot stay on S(i): that would reveal which rows a client touched. Every sampled
client adds N(0, (σ·2C)²/K) to **every row of the heat support** (the rows some client
touches, public after the counting round), so the summed noise covers the whole support
and the server learns no client's rows; rows outside the support never change, as without
DP. FedSubAvg's heat correction N/n_m multiplies row m's average — its noise included — so
cold rows (small n_m) get proportionally more noise: the price of correcting their bias,
measured in docs/privacy.md. The counting round itself (the heat) is not privatised.

Weighting must be ``clients`` (c_i = 1): sample-size weights would make one client's weight,
and so the sensitivity, unbounded. Used by both engines (the direct engine's round and
:class:`~flower_app.clients.submodel.SubmodelClient` under secure aggregation), with the
clients' noise from the node's :class:`~flower_app.algorithms.common.dp_noise.NoiseSource` (OS
entropy; ``default_rng([seed, t, client, DP_NOISE])`` only in the research mode
``dp-reproducible-noise``, which gives no privacy against the server).
"""

from __future__ import annotations

import math

import numpy as np

from flower_app.algorithms.common.dp_noise import DP_NOISE, NoiseSource
from flower_app.algorithms.common.gaussian_dp import GaussianDP
from flower_app.algorithms.fedsubavg.core import (
    LocalConfig,
    RoundUpdate,
    gather_submodels,
    local_deltas,
)
from flower_app.datasets.movielens_rating import RatingTask

__all__ = ["private_round_update"]


def private_round_update(
    task: RatingTask,
    clients: np.ndarray,
    values: np.ndarray,
    ptr: np.ndarray,
    local: LocalConfig,
    seed: int,
    server_round: int,
    dp: GaussianDP,
    support: np.ndarray,
    sampled: int,
    noise: NoiseSource | None = None,
) -> RoundUpdate:
    """Train the clients, clip each update to C and add each client's share of the noise.

    Parameters
    ----------
    task, clients, values, ptr, local, seed, server_round
        As for :func:`flower_app.algorithms.fedsubavg.core.client_round` (weighting: clients).
    dp : GaussianDP
        σ and C.
    support : numpy.ndarray
        Sorted rows with n_m > 0 (the heat support): where the noise goes.
    sampled : int
        K, the clients sampled in the round over all nodes.
    noise : NoiseSource, optional
        The node's noise for the round (default: a fresh one from OS entropy).

    Returns
    -------
    RoundUpdate
        Rows = ``support``, sums = Σ_i clip(Δx_i) + noise on them, weight = number of clients.
    """
    clients = np.asarray(clients, dtype=np.int64)
    support = np.asarray(support, dtype=np.int64)
    sums = np.zeros(task.n_params)
    if clients.size:
        rows, _ = gather_submodels(task, clients)
        delta = local_deltas(task, clients, values, ptr, local, seed, server_round)
        sizes = np.diff(ptr)
        owner = np.repeat(np.arange(clients.size), sizes)
        norms = np.sqrt(np.bincount(owner, weights=delta**2, minlength=clients.size))
        factor = np.where(norms > dp.clip, dp.clip / np.maximum(norms, 1e-300), 1.0)
        np.add.at(sums, rows, delta * np.repeat(factor, sizes))
        std = dp.noise_multiplier * dp.sensitivity(False) / math.sqrt(max(int(sampled), 1))
        noise = NoiseSource() if noise is None else noise
        for u in clients:
            rng = noise.generator(server_round, int(u), DP_NOISE)
            sums[support] += rng.normal(0.0, std, support.size)
    return RoundUpdate(support, sums[support], int(clients.size), float(clients.size))
