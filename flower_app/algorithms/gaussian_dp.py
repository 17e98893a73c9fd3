"""Client-level differential privacy by clipping and distributed Gaussian noise.

The DP-FedAvg recipe (McMahan et al., ICLR 2018; Flower's
``DifferentialPrivacyClientSideFixedClipping``) for the learning families, with the noise
*distributed*: every sampled client adds its share, so that the sum the server obtains under
secure aggregation is already private and the server never sees an unnoised aggregate.

Per client (:func:`privatize`)
    Clip the update Δ to L2 norm C, weight it as the algorithm does (MaxFL: q_k Δ_k with
    q_k ≤ 1/4; FedAvg: Δ_k), and add N(0, (σ·Δ₂)² / K) to every coordinate, K being the
    clients sampled in the round. MaxFL's step also divides by Σ q_k, so its clients send
    q_k·C plus noise of the same scale in one extra coordinate (the vector (q_k Δ_k, q_k C)
    has norm ≤ √2·C/4).
Sensitivity
    Δ₂ is the replace-one L2 sensitivity of the sum (one client's contribution swapped for
    another's: twice the bound on one contribution): 2·√2·C/4 for MaxFL, 2·C for FedAvg.
    The sum of K clients' shares is N(0, (σ·Δ₂)²) per coordinate when all K reply; every
    client that drops out removes 1/K of the noise variance (the accounting assumes none).
Accounting (:func:`gaussian_epsilon`)
    T rounds of the sampled Gaussian mechanism (K of n clients without replacement, noise
    multiplier σ), composed with the Rényi-DP accountant of Google's ``dp_accounting``
    (the accountant Flower's DP strategies use, ``flwr[dp]``).

Streams: client k's noise in round t comes from ``default_rng([seed, t, k, DP_NOISE])``, so the
result does not depend on how clients are split over nodes or on the engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DP_ALGORITHMS",
    "DP_NOISE",
    "GaussianDP",
    "dp_config",
    "q_sum_floor",
    "dp_round_info",
    "dp_settings",
    "gaussian_epsilon",
    "privatize",
]

#: the fourth word of a client's DP noise stream key
DP_NOISE = 0xD7

#: the algorithms with client-level Gaussian DP (their step is a function of a clipped sum)
DP_ALGORITHMS = ("maxfl", "fedavg")


@dataclass(frozen=True)
class GaussianDP:
    """Settings of client-level Gaussian DP.

    Parameters
    ----------
    noise_multiplier : float
        σ > 0: noise std over the replace-one sensitivity.
    clip : float
        C > 0: the L2 bound on a client's update Δ_k.
    delta : float
        δ at which the run's ε is reported (default 1e-5).
    """

    noise_multiplier: float
    clip: float = 1.0
    delta: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"dp {name}={value}: expected a finite value > 0")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"dp delta={self.delta}: expected a value in (0, 1)")

    def sensitivity(self, weighted: bool) -> float:
        """Return Δ₂ of the summed vector (MaxFL's ``weighted`` or FedAvg's)."""
        return 2.0 * (math.sqrt(2.0) * self.clip / 4.0 if weighted else self.clip)


def privatize(
    delta: Sequence[np.ndarray],
    q: float | None,
    dp: GaussianDP,
    clients: int,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], float]:
    """Return one client's clipped, weighted, noised contribution.

    Parameters
    ----------
    delta : sequence of numpy.ndarray
        Its update Δ_k (unweighted).
    q : float or None
        MaxFL's q_k (None: FedAvg, unweighted).
    dp : GaussianDP
        σ and C.
    clients : int
        K, the clients sampled this round (each adds 1/K of the noise variance).
    rng : numpy.random.Generator
        The client's DP stream.

    Returns
    -------
    tuple
        ``(arrays, q_term)``: q_k·clip(Δ_k) (or clip(Δ_k)) plus noise, and q_k·C plus noise
        (0.0 for FedAvg).
    """
    norm = math.sqrt(sum(float(np.sum(np.square(d, dtype=np.float64))) for d in delta))
    factor = min(1.0, dp.clip / norm) if norm > 0 else 1.0
    weight = 1.0 if q is None else float(q)
    std = dp.noise_multiplier * dp.sensitivity(q is not None) / math.sqrt(max(clients, 1))
    arrays = [weight * factor * np.asarray(d, np.float64) + rng.normal(0.0, std, np.shape(d))
              for d in delta]  # fmt: skip
    q_term = 0.0 if q is None else weight * dp.clip + float(rng.normal(0.0, std))
    return arrays, q_term


def gaussian_epsilon(
    noise_multiplier: float, sampled: int, population: int, rounds: int, delta: float
) -> float:
    """Return ε after ``rounds`` sampled Gaussian releases (RDP accountant, dp_accounting).

    K = ``sampled`` of n = ``population`` clients without replacement each round,
    replace-one neighbours.
    """
    if rounds <= 0:
        return 0.0
    from dp_accounting import NeighboringRelation, dp_event, rdp

    accountant = rdp.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    event = dp_event.SampledWithoutReplacementDpEvent(
        int(population), int(sampled), dp_event.GaussianDpEvent(float(noise_multiplier))
    )
    accountant.compose(event, int(rounds))
    return float(accountant.get_epsilon(float(delta)))


def q_sum_floor(dp: GaussianDP) -> float:
    """Return the floor of MaxFL's noisy Σ q_k: the standard deviation of its noise.

    MaxFL steps by η_g / (Σ q_k + ε); a noisy Σ q_k near 0 would make that step explode, so
    the server uses max(noisy Σ q_k, this floor) — a deviation from the paper's step that DP
    forces (DP-FedAvg fixes its denominator for the same reason).
    """
    return dp.noise_multiplier * dp.sensitivity(True) / dp.clip


def dp_round_info(dp: GaussianDP, sampled: int, population: int, rounds: int) -> dict[str, float]:
    """Return a round row's privacy entries after ``rounds`` rounds of ``sampled`` clients.

    ``dp-noise-multiplier``, ``dp-clip``, ``dp-delta`` and ``dp-epsilon`` (the run so far).
    """
    return {
        "dp-noise-multiplier": float(dp.noise_multiplier),
        "dp-clip": float(dp.clip),
        "dp-delta": float(dp.delta),
        "dp-epsilon": gaussian_epsilon(dp.noise_multiplier, sampled, population, rounds, dp.delta),
    }


def dp_settings(config: dict[str, object]) -> GaussianDP | None:
    """Return the round's DP settings from a client's train config (``dp-noise`` > 0), or None."""
    noise = float(config.get("dp-noise", 0.0))  # type: ignore[arg-type]
    if noise <= 0:
        return None
    return GaussianDP(noise, float(config["dp-clip"]))  # type: ignore[arg-type]


def dp_config(dp: GaussianDP, sampled: int) -> dict[str, float | int]:
    """Return the train-config entries that tell clients to privatise (``dp-noise``, ...)."""
    return {"dp-noise": float(dp.noise_multiplier), "dp-clip": float(dp.clip),
            "dp-clients": int(sampled)}  # fmt: skip
