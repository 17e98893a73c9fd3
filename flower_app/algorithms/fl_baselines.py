"""Server steps of the MaxFL paper's baselines, with no Flower import.

All updates use Δw_k = w − w_k^(τ) (what a client moved *down* its loss), as MaxFL does.

* FedAvg (McMahan et al. 2017): w ← w − η_g · (1/|S|) Σ Δw_k (uniform over the sampled
  clients, so that MaxFL with equal gaps is exactly a FedAvg step; see
  :mod:`flower_app.algorithms.maxfl`).
* FedProx (Li et al. 2020): the FedAvg server step; the clients add (μ/2)‖w_k − w‖².
* q-FFL / q-FedAvg (Li et al. 2019, ICLR 2020): with L = 1/η_l,
  Δ_k = F_k(w)^q · L·Δw_k and h_k = q F_k(w)^{q−1} ‖L·Δw_k‖² + L F_k(w)^q;
  w ← w − Σ Δ_k / Σ h_k. The same formulas as Flower's
  ``flwr.serverapp.strategy.qfedavg.compute_delta_and_h`` (a test checks it), but computed
  per client and summed, so a node can send sums over its clients.
* SCAFFOLD (Karimireddy et al. 2020, option II): the clients correct their gradients by
  c − c_k; w ← w − η_g (1/|S|) Σ Δw_k, c ← c − (1/N) Σ Δc_k with Δc_k = c_k − c_k⁺
  (sign convention of Δw_k).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "fedavg_update",
    "qffl_delta_h",
    "qffl_update",
    "scaffold_control_update",
]


def _check(weights: Sequence[np.ndarray], updates: Sequence[np.ndarray]) -> None:
    if len(weights) != len(updates):
        raise ValueError(f"{len(updates)} update arrays for {len(weights)} weights")
    for w, u in zip(weights, updates, strict=True):
        if np.shape(u) != np.shape(w):
            raise ValueError(f"update shape {np.shape(u)} != weight shape {np.shape(w)}")


def fedavg_update(
    weights: Sequence[np.ndarray],
    update_sum: Sequence[np.ndarray],
    n_clients: int,
    server_lr: float = 1.0,
) -> list[np.ndarray]:
    """Return w − η_g · Σ Δw_k / |S|.

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        The global model.
    update_sum : sequence of numpy.ndarray
        Σ_k Δw_k over the aggregated clients.
    n_clients : int
        |S|, the number of clients in the sum (≥ 1).
    server_lr : float, optional
        η_g (default 1: the new model is the average of the local models).

    Returns
    -------
    list of numpy.ndarray
        The new model, in the dtypes of ``weights``.
    """
    _check(weights, update_sum)
    if n_clients < 1:
        raise ValueError("FedAvg needs at least one client update")
    scale = float(server_lr) / n_clients
    return [
        (np.asarray(w, np.float64) - scale * np.asarray(u, np.float64)).astype(np.asarray(w).dtype)
        for w, u in zip(weights, update_sum, strict=True)
    ]


def qffl_delta_h(
    update: Sequence[np.ndarray], loss: float, q: float, lipschitz: float
) -> tuple[list[np.ndarray], float]:
    """Return one client's q-FFL (Δ_k, h_k).

    Parameters
    ----------
    update : sequence of numpy.ndarray
        Δw_k = w − w_k^(τ).
    loss : float
        F_k(w), the client's training loss at the received model (> 0).
    q : float
        Fairness parameter (q = 0 is FedAvg with step 1/L).
    lipschitz : float
        L, estimated as 1 / η_l.

    Returns
    -------
    tuple
        Δ_k (list of float64 arrays) and h_k (float).
    """
    if not np.isfinite(loss) or loss < 0:
        raise ValueError(f"q-FFL needs a finite, non-negative loss, got {loss}")
    grad = [lipschitz * np.asarray(u, np.float64) for u in update]
    norm = float(sum(np.sum(np.square(g)) for g in grad))
    loss_q = float(np.float_power(loss + 1e-10, q))
    delta = [loss_q * g for g in grad]
    h = q * float(np.float_power(loss + 1e-10, q - 1)) * norm + lipschitz * loss_q
    return delta, h


def qffl_update(
    weights: Sequence[np.ndarray], delta_sum: Sequence[np.ndarray], h_sum: float
) -> list[np.ndarray]:
    """Return w − Σ Δ_k / Σ h_k (q-FedAvg server step).

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        The global model.
    delta_sum : sequence of numpy.ndarray
        Σ_k Δ_k.
    h_sum : float
        Σ_k h_k (> 0).

    Returns
    -------
    list of numpy.ndarray
        The new model.
    """
    _check(weights, delta_sum)
    if not (np.isfinite(h_sum) and h_sum > 0):
        raise ValueError(f"Σ h_k must be finite and > 0, got {h_sum}")
    return [
        (np.asarray(w, np.float64) - np.asarray(d, np.float64) / h_sum).astype(np.asarray(w).dtype)
        for w, d in zip(weights, delta_sum, strict=True)
    ]


def scaffold_control_update(
    control: Sequence[np.ndarray], control_delta_sum: Sequence[np.ndarray], n_total: int
) -> list[np.ndarray]:
    """Return the server control variate c − (1/N) Σ Δc_k (Δc_k = c_k − c_k⁺).

    Parameters
    ----------
    control : sequence of numpy.ndarray
        c.
    control_delta_sum : sequence of numpy.ndarray
        Σ_k (c_k − c_k⁺) over the sampled clients.
    n_total : int
        N, the number of clients that can be sampled.

    Returns
    -------
    list of numpy.ndarray
        The new c (float32).
    """
    _check(control, control_delta_sum)
    return [
        (np.asarray(c, np.float64) - np.asarray(d, np.float64) / n_total).astype(np.float32)
        for c, d in zip(control, control_delta_sum, strict=True)
    ]
