"""Server steps of the MaxFL paper's baselines, with no Flower import.

All updates use Δw_k = w − w_k^(τ) (what a client moved *down* its loss), as MaxFL does.

* FedAvg (McMahan et al. 2017): w ← w − η_g · (1/|S|) Σ Δw_k (uniform over the sampled
  clients, so that MaxFL with equal gaps is exactly a FedAvg step; see
  :mod:`flower_app.algorithms.maxfl.core`).
* FedProx (Li et al. 2020): the FedAvg server step; the clients add (μ/2)‖w_k − w‖².
* q-FFL / q-FedAvg (Li et al. 2019, ICLR 2020): with L = 1/η_l,
  Δ_k = F_k(w)^q · L·Δw_k and h_k = q F_k(w)^{q−1} ‖L·Δw_k‖² + L F_k(w)^q;
  w ← w − Σ Δ_k / Σ h_k. The same formulas as Flower's
  ``flwr.serverapp.strategy.qfedavg.compute_delta_and_h`` (a test checks it), but computed
  per client and summed, so a node can send sums over its clients.
* SCAFFOLD (Karimireddy et al. 2020, option II): the clients correct their gradients by
  c − c_k; w ← w − η_g (1/|S|) Σ Δw_k, c ← c − (1/N) Σ Δc_k with Δc_k = c_k − c_k⁺
  (sign convention of Δw_k).
* MW-Fed (Blum, Haghtalab, Phillips & Shao, ICML 2021, "One for One, or All for All"),
  the incentive baseline of the MaxFL paper: multiplicative weights on the clients whose
  requirement is not met. The server keeps λ_k = 1 for every seen client k at the start.
  In round t, with sampled clients S and the *current* weights λ_k (decided by rounds
  < t, as in multiplicative weights: the distribution is fixed before the round's losses
  are seen),

  1. the server sends each k ∈ S its relative weight s_k = |S| λ_k / Σ_{j∈S} λ_j (mean 1
     over S; :func:`mwfed_shares`);
  2. client k reports whether its requirement is met at the received model,
     F_k(w) < ρ_k (same split and test as MaxFL's opt-in, ``maxfl-requirement``), runs
     τ_k = max(1, ⌊τ s_k + 1/2⌋) local SGD steps (:func:`mwfed_local_steps`) and sends
     s_k Δw_k;
  3. the server steps w ← w − η_g Σ_{k∈V} s_k Δw_k / Σ_{k∈V} s_k over the valid replies V
     (:func:`fedavg_update` with c_k = s_k: the λ-weighted average of the Δw_k), then
     multiplies the
     weight of every k ∈ V whose requirement was not met by (1 + η_mw)
     (:func:`mwfed_reweight`).

  Why both the aggregation weight and the local steps: in Blum et al. an agent whose
  constraint is violated contributes more *samples* in the next round, and the MaxFL paper
  describes MW-Fed as clients "sending higher weights to the server and performing more
  local updates". Scaling τ by s_k is what "more samples" means for local SGD; it is cheap,
  because Σ_k τ_k ≈ |S| τ (the round's compute budget is unchanged, only shifted towards
  the unsatisfied clients), and bounded (τ_k ≤ |S| τ). With equal weights MW-Fed is
  exactly FedAvg with uniform client weights. A client that inflates its reported loss
  (Byzantine, Table 4) is never "met", so its weight only grows: the opposite of MaxFL,
  whose q_k = σ'(gap) vanishes for large gaps.

  η_mw (``maxfl-mw-eta``, default 0.1) must be > 0. 0.1 is a conventional Hedge rate
  (η ≤ 1/2 keeps the multiplicative-weights regret bound); in the paper's setting (K = 5
  of 100 clients, T = 200) a client is sampled about 10 times, so a never-satisfied client
  ends with at most 1.1¹⁰ ≈ 2.6 times the weight of an always-satisfied one: a clear
  push towards the unsatisfied without letting one client take over a 5-client round.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "check_mw_eta",
    "fedavg_update",
    "mwfed_local_steps",
    "mwfed_reweight",
    "mwfed_shares",
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
    weight_sum: float,
    server_lr: float = 1.0,
) -> list[np.ndarray]:
    """Return w − η_g · Σ c_k Δw_k / Σ c_k: FedAvg's step, and MW-Fed's (c_k = s_k).

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        The global model.
    update_sum : sequence of numpy.ndarray
        Σ_k c_k Δw_k over the aggregated clients.
    weight_sum : float
        Σ_k c_k over the same clients (> 0): |S| for FedAvg (c_k = 1), Σ_k s_k for MW-Fed.
    server_lr : float, optional
        η_g (default 1: the new model is the weighted average of the local models).

    Returns
    -------
    list of numpy.ndarray
        The new model, in the dtypes of ``weights``.
    """
    _check(weights, update_sum)
    if not (np.isfinite(weight_sum) and weight_sum > 0):
        raise ValueError(f"the clients' weights Σ c_k must be finite and > 0, got {weight_sum}")
    return _step(weights, update_sum, float(server_lr) / float(weight_sum))


def _step(
    weights: Sequence[np.ndarray], update_sum: Sequence[np.ndarray], scale: float
) -> list[np.ndarray]:
    """Return w − scale · Σ Δw in float64, cast back to each weight's dtype."""
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


# ---------------------------------------------------------------------- MW-Fed
def check_mw_eta(eta: float) -> float:
    """Return η_mw as a float if it is finite and > 0.

    Parameters
    ----------
    eta : float
        The multiplicative-weights rate (run_config ``maxfl-mw-eta``).

    Returns
    -------
    float
        ``eta``.

    Raises
    ------
    ValueError
        If ``eta`` is not a finite number > 0 (the message names ``maxfl-mw-eta``).
    """
    ok = isinstance(eta, int | float | np.floating) and not isinstance(eta, bool)
    if not (ok and np.isfinite(eta) and eta > 0):
        raise ValueError(f"MW-Fed needs η_mw > 0 (run_config 'maxfl-mw-eta'), got {eta!r}")
    return float(eta)


def _check_mw_weights(mw_weights: np.ndarray) -> np.ndarray:
    lam = np.asarray(mw_weights, dtype=np.float64)
    if lam.ndim != 1 or not np.all(np.isfinite(lam)) or np.any(lam <= 0):
        raise ValueError(f"MW-Fed weights must be a 1-d array of finite values > 0, got {lam}")
    return lam


def mwfed_reweight(mw_weights: np.ndarray, unmet: np.ndarray, eta: float) -> np.ndarray:
    """Return λ_k · (1 + η_mw) for the clients whose requirement is not met, λ_k otherwise.

    Parameters
    ----------
    mw_weights : numpy.ndarray
        λ_k of the reporting clients (> 0).
    unmet : numpy.ndarray
        Booleans, same length: True where F_k(w) ≥ ρ_k.
    eta : float
        η_mw > 0.

    Returns
    -------
    numpy.ndarray
        The new weights (float64).
    """
    eta = check_mw_eta(eta)
    lam = _check_mw_weights(mw_weights)
    unmet = np.asarray(unmet)
    if unmet.shape != lam.shape or unmet.dtype != np.bool_:
        raise ValueError(f"unmet must be {lam.shape[0]} booleans, got {unmet!r}")
    return np.where(unmet, lam * (1.0 + eta), lam)


def mwfed_shares(mw_weights: np.ndarray) -> np.ndarray:
    """Return the relative weights s_k = |S| λ_k / Σ_{j∈S} λ_j of the sampled clients.

    Parameters
    ----------
    mw_weights : numpy.ndarray
        λ_k of the sampled clients S (> 0, at least one).

    Returns
    -------
    numpy.ndarray
        s_k (float64), mean 1; all ones when the weights are equal.
    """
    lam = _check_mw_weights(mw_weights)
    if lam.size == 0:
        raise ValueError("MW-Fed needs at least one sampled client")
    return lam.size * lam / lam.sum()


def mwfed_local_steps(share: float, local_steps: int) -> int:
    """Return client k's local steps τ_k = max(1, ⌊τ s_k + 1/2⌋).

    Parameters
    ----------
    share : float
        s_k (> 0), see :func:`mwfed_shares`.
    local_steps : int
        τ, the steps of a client of average weight (≥ 1).

    Returns
    -------
    int
        τ_k ≥ 1 (τ when s_k = 1).
    """
    if not (np.isfinite(share) and share > 0):
        raise ValueError(f"MW-Fed relative weight s_k must be finite and > 0, got {share!r}")
    if local_steps < 1:
        raise ValueError(f"local steps τ must be >= 1, got {local_steps}")
    return max(1, int(np.floor(local_steps * float(share) + 0.5)))

