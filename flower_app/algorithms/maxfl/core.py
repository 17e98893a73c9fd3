"""MaxFL (Cho, Jhunjhunwala, Li, Smith & Joshi, TMLR 2024): the math, with no Flower import.

Objective (Eq. 3): minimise F̃(w) = (1/M) Σ_k σ(F_k(w) − ρ_k), a smooth proxy of the fraction
of clients that do *not* find w appealing (GM-Appeal, Eq. 1, counts F_k(w) < ρ_k).

Algorithm 1, one round t:

1. the server samples clients S and sends them w;
2. client k computes its aggregation weight at the received model,
   q_k = σ(F_k(w) − ρ_k)(1 − σ(F_k(w) − ρ_k)) ∈ [0, 1/4] (Eq. 4), runs τ local SGD steps
   from w and sends Δw_k = w − w_k^(τ) and q_k;
3. the server steps w ← w − η_g / (Σ_{k∈S} q_k + ε) · Σ_{k∈S} q_k Δw_k (adaptive global
   learning rate of Section 3, with ε > 0).

When all sampled clients have the same gap F_k(w) − ρ_k (so the same q), the step is
w − η_g·Kq/(Kq + ε) · (1/K) Σ Δw_k: a FedAvg step with server learning rate η_g·Kq/(Kq+ε).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "Q_MAX",
    "adaptive_server_lr",
    "aggregation_weight",
    "gm_appeal",
    "maxfl_objective",
    "maxfl_update",
    "sigmoid",
]

#: the largest possible aggregation weight, σ(0)(1 − σ(0))
Q_MAX = 0.25


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    """Return σ(x) = 1 / (1 + e^−x), computed without overflow.

    Parameters
    ----------
    x : array_like
        Input.

    Returns
    -------
    numpy.ndarray
        σ(x), float64.
    """
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gap(losses: np.ndarray | float, rhos: np.ndarray | float) -> np.ndarray:
    losses = np.asarray(losses, dtype=np.float64)
    if rhos is None:
        raise ValueError("ρ_k is missing: every client needs its requirement before training")
    rhos = np.asarray(rhos, dtype=np.float64)
    if not np.all(np.isfinite(rhos)):
        raise ValueError(f"ρ_k must be finite, got {rhos}")
    if not np.all(np.isfinite(losses)):
        raise ValueError(f"losses F_k(w) must be finite, got {losses}")
    return losses - rhos


def aggregation_weight(losses: np.ndarray | float, rhos: np.ndarray | float) -> np.ndarray:
    """Return q_k = σ(F_k(w) − ρ_k)(1 − σ(F_k(w) − ρ_k)), Eq. (4).

    Parameters
    ----------
    losses : array_like
        F_k(w) of each client at the received model.
    rhos : array_like
        The clients' requirements ρ_k.

    Returns
    -------
    numpy.ndarray
        q_k in [0, 1/4], float64, the shape of the broadcast inputs.

    Raises
    ------
    ValueError
        If ρ_k is missing (None) or any input is non-finite.
    """
    s = sigmoid(_gap(losses, rhos))
    return s * (1.0 - s)


def adaptive_server_lr(q_sum: float, server_lr: float, eps: float) -> float:
    """Return the adaptive global learning rate η_g / (Σ q_k + ε) (Section 3).

    Parameters
    ----------
    q_sum : float
        Σ_{k∈S} q_k over the clients whose updates are aggregated (≥ 0).
    server_lr : float
        η_g.
    eps : float
        ε > 0.

    Returns
    -------
    float
        The step size applied to Σ q_k Δw_k.

    Raises
    ------
    ValueError
        If ε ≤ 0, η_g ≤ 0, or Σ q_k is negative or non-finite.
    """
    if not (isinstance(eps, int | float) and np.isfinite(eps) and eps > 0):
        raise ValueError(f"MaxFL needs ε > 0 (maxfl-eps), got {eps!r}")
    if not (np.isfinite(server_lr) and server_lr > 0):
        raise ValueError(f"the server learning rate η_g must be > 0, got {server_lr!r}")
    if not (np.isfinite(q_sum) and q_sum >= 0):
        raise ValueError(f"Σ q_k must be finite and >= 0, got {q_sum!r}")
    return float(server_lr) / (float(q_sum) + float(eps))


def maxfl_update(
    weights: Sequence[np.ndarray],
    weighted_update_sum: Sequence[np.ndarray],
    q_sum: float,
    server_lr: float,
    eps: float,
) -> list[np.ndarray]:
    """Return w − η_g / (Σ q_k + ε) · Σ q_k Δw_k (Algorithm 1, line 13).

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        The global model w.
    weighted_update_sum : sequence of numpy.ndarray
        Σ_k q_k Δw_k with Δw_k = w − w_k^(τ), same shapes as ``weights``.
    q_sum : float
        Σ_k q_k over the same clients.
    server_lr : float
        η_g.
    eps : float
        ε > 0.

    Returns
    -------
    list of numpy.ndarray
        The new global model, in the dtypes of ``weights`` (computed in float64).
    """
    if len(weights) != len(weighted_update_sum):
        raise ValueError(f"{len(weighted_update_sum)} update arrays for {len(weights)} weights")
    step = adaptive_server_lr(q_sum, server_lr, eps)
    out = []
    for w, u in zip(weights, weighted_update_sum, strict=True):
        if np.shape(u) != np.shape(w):
            raise ValueError(f"update shape {np.shape(u)} != weight shape {np.shape(w)}")
        new = np.asarray(w, dtype=np.float64) - step * np.asarray(u, dtype=np.float64)
        out.append(new.astype(np.asarray(w).dtype))
    return out


def maxfl_objective(losses: np.ndarray, rhos: np.ndarray) -> float:
    """Return F̃ = mean_k σ(F_k(w) − ρ_k), the MaxFL objective (Eq. 3)."""
    return float(np.mean(sigmoid(_gap(losses, rhos))))


def gm_appeal(losses: np.ndarray, rhos: np.ndarray) -> float:
    """Return GM-Appeal = mean_k 1{f_k(w) < ρ_k} (Eq. 1); 0.0 for no clients."""
    gap = _gap(losses, rhos)
    return float(np.mean(gap < 0)) if gap.size else 0.0
