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
    client that drops out removes 1/K of the noise variance (see Dropouts).
Noise source
    Each client's share comes from its node's :class:`~flower_app.algorithms.common.dp_noise.
    NoiseSource`: OS entropy, fresh per node and round, never a seed (the server holds the
    seed); ``dp-reproducible-noise`` is a research mode that gives no privacy against the
    server (:mod:`flower_app.algorithms.common.dp_noise`).
Accounting (:class:`GaussianAccountant`, Google's ``dp_accounting``, Rényi DP)
    *Against the server* (reported first, ``dp-epsilon``): the server chose the sample, so
    there is no amplification by sampling; a client's releases are the rounds its noisy
    update reached the sum, each a Gaussian mechanism with the noise that *arrived*, and
    the figure is the worst client's. *Against outside observers*
    (``dp-epsilon-outsider``): the same rounds as sampled-without-replacement Gaussian
    mechanisms (K of n, composed over the rounds), capped by the server's figure (an
    outsider sees less than the server).
Dropouts
    A client's share has variance (σ·Δ₂)²/K for the K clients *sampled*; when only K′ of
    them reach the sum (nodes that failed or were offline), the sum carries noise
    multiplier σ·√(K′/K). Calibrating the shares to the survivors would need the dropout
    set before the replies are committed, which secure aggregation does not give, so the
    accountant charges every round with the noise that arrived (``dp-noise-arrived``):
    ε grows when clients drop out, and ``min_reply_fraction`` bounds how far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from flower_app.algorithms.common.dp_noise import DP_NOISE

__all__ = [
    "ACCOUNTANT",
    "DP_ALGORITHMS",
    "DP_NOISE",
    "GaussianAccountant",
    "GaussianDP",
    "dp_config",
    "q_sum_floor",
    "dp_settings",
    "gaussian_epsilon",
    "privacy_summary",
    "privatize",
    "server_epsilon",
]

#: what computes every ε of this module (named in summary.json)
ACCOUNTANT = "Google dp_accounting, Renyi-DP accountant (RdpAccountant)"

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
    reproducible : bool
        The research mode ``dp-reproducible-noise`` (default False): the noise is keyed by
        the seed and gives no privacy against the server
        (:mod:`flower_app.algorithms.common.dp_noise`). Server side it only marks the rows and
        ``summary.json``; a node takes it from its own configuration, never from a message.
    """

    noise_multiplier: float
    clip: float = 1.0
    delta: float = 1e-5
    reproducible: bool = False

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
        The client's noise (:meth:`flower_app.algorithms.common.dp_noise.NoiseSource.generator`:
        OS entropy unless in the research mode).

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


def _rdp_epsilon(events: Sequence[tuple[object, int]], delta: float) -> float:
    from dp_accounting import NeighboringRelation, rdp

    accountant = rdp.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    for event, count in events:
        accountant.compose(event, int(count))
    return float(accountant.get_epsilon(float(delta)))


@lru_cache(maxsize=1024)
def _sampled_rdp(population: int, sampled: int, sigma: float) -> np.ndarray:
    """Return the RDP curve of one sampled-without-replacement Gaussian round (cached).

    Its computation takes seconds at small n; rounds differ only in how many times each
    curve is added (RDP composes additively), so each distinct (n, K, σ) is computed once.
    ``dp_accounting`` 0.6 (pinned) keeps the composed curve in ``RdpAccountant._rdp``, over
    its ``DEFAULT_RDP_ORDERS``.
    """
    from dp_accounting import NeighboringRelation, dp_event, rdp

    accountant = rdp.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_event.SampledWithoutReplacementDpEvent(
        int(population), int(sampled), dp_event.GaussianDpEvent(float(sigma))))  # fmt: skip
    curve = np.array(accountant._rdp, dtype=np.float64)
    curve.flags.writeable = False
    return curve


def gaussian_epsilon(
    noise_multiplier: float, sampled: int, population: int, rounds: int, delta: float
) -> float:
    """Return ε after ``rounds`` sampled Gaussian releases (RDP accountant, dp_accounting).

    K = ``sampled`` of n = ``population`` clients without replacement each round,
    replace-one neighbours: amplification by sampling, valid against an observer who does
    not know who was sampled (an *outsider*; not the server, which sampled them).
    """
    if rounds <= 0:
        return 0.0
    from dp_accounting import dp_event

    event = dp_event.SampledWithoutReplacementDpEvent(
        int(population), int(sampled), dp_event.GaussianDpEvent(float(noise_multiplier))
    )
    return _rdp_epsilon([(event, int(rounds))], delta)


def server_epsilon(precision: float, delta: float) -> float:
    """Return ε against the server of a client whose rounds sum to ``precision`` = Σ_t 1/σ_t².

    The server knows whom it sampled: each round the client's noisy update reached the sum
    is a Gaussian mechanism with noise multiplier σ_t (no amplification), and r of them
    compose (Rényi DP is additive, α/(2σ_t²) per round) as one Gaussian mechanism with
    σ = (Σ_t 1/σ_t²)^(-1/2): r rounds at σ give σ/√r. Computed by ``dp_accounting``'s RDP
    accountant; 0 for a client that never took part.
    """
    if precision <= 0:
        return 0.0
    from dp_accounting import dp_event

    return _rdp_epsilon([(dp_event.GaussianDpEvent(1.0 / math.sqrt(float(precision))), 1)], delta)


class GaussianAccountant:
    """Track ε of client-level Gaussian DP against the server and against outsiders.

    Parameters
    ----------
    dp : GaussianDP
        σ, C and δ.
    population : int
        n, the clients that can be sampled (ids 0..n−1).

    Notes
    -----
    Call :meth:`record` once per round with the clients whose noisy updates are in the
    round's sum. Per client it keeps the rounds taken part in and two sums of 1/σ_t²:
    with σ_t the client's own noise share, σ/√K (ε against the server, ``dp-epsilon``: the
    noise its node can verify, the rule each node's own ledger applies,
    :mod:`flower_app.privacy.ledger`), and with σ_t the noise multiplier that arrived,
    σ·√(K′/K) (``dp-epsilon-honest-peers``: what holds if every client in the sum is
    honest). Both are :func:`server_epsilon` of the worst client's sum. ε against outsiders
    composes one sampled-without-replacement Gaussian event per round (K of n, σ_t) and is
    reported as the smaller of that and the honest-peers figure, since an outsider sees a
    subset of what the server sees.
    """

    def __init__(self, dp: GaussianDP, population: int) -> None:
        if int(population) < 1:
            raise ValueError(f"population={population}: expected >= 1 client")
        self.dp = dp
        self.population = int(population)
        self.precision = np.zeros(self.population)
        self.own_precision = np.zeros(self.population)
        self.rounds = np.zeros(self.population, dtype=np.int64)
        self.events: dict[tuple[int, float], int] = {}

    def record(self, sampled: int, arrived: Sequence[int] | np.ndarray) -> dict[str, float]:
        """Charge one round and return its privacy entries (the run so far).

        Parameters
        ----------
        sampled : int
            K, the clients sampled (each added noise of variance (σΔ₂)²/K).
        arrived : sequence of int
            Ids of the clients whose noisy updates are in the sum (⊆ the sampled ones).

        Returns
        -------
        dict
            ``dp-epsilon`` (against the server: the worst client's own noise shares, no
            amplification), ``dp-epsilon-honest-peers`` (the same with all the noise that
            arrived), ``dp-epsilon-outsider`` (amplified by sampling, ≤ the honest-peers
            figure),
            ``dp-noise-arrived`` (σ·√(K′/K) of this round's sum), ``dp-clients-in-sum``
            (K′), ``dp-rounds-worst-client``, ``dp-noise-multiplier``, ``dp-clip``,
            ``dp-delta`` and ``dp-reproducible-noise`` (1 in the research mode).
        """
        ids = np.unique(np.asarray(arrived, dtype=np.int64))
        if ids.size and (ids[0] < 0 or ids[-1] >= self.population):
            raise ValueError(f"client ids outside 0..{self.population - 1}")
        sampled = max(int(sampled), int(ids.size), 1)
        sigma = float(self.dp.noise_multiplier) * math.sqrt(ids.size / sampled)
        if ids.size:
            self.precision[ids] += 1.0 / sigma**2
            # the client's own share alone: σ/√K (what its node can verify)
            self.own_precision[ids] += sampled / float(self.dp.noise_multiplier) ** 2
            self.rounds[ids] += 1
            key = (sampled, sigma)
            self.events[key] = self.events.get(key, 0) + 1
        return {
            **self.info(),
            "dp-noise-arrived": sigma,
            "dp-clients-in-sum": int(ids.size),
        }

    def epsilon_server(self) -> float:
        """Return ε against the server so far: the worst client's own noise shares.

        What its node can verify (:mod:`flower_app.privacy.ledger`); no amplification.
        """
        return server_epsilon(float(self.own_precision.max()), self.dp.delta)

    def epsilon_honest_peers(self) -> float:
        """Return ε against the server so far if every client in each sum is honest.

        The worst client's, with all the noise that arrived (no amplification).
        """
        return server_epsilon(float(self.precision.max()), self.dp.delta)

    def epsilon_outsider(self) -> float:
        """Return ε against outside observers so far (amplified by sampling, capped)."""
        if not self.events:
            return 0.0
        from dp_accounting import rdp

        total = sum(count * _sampled_rdp(self.population, k, sigma)
                    for (k, sigma), count in self.events.items())  # fmt: skip
        eps, _ = rdp.compute_epsilon(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, total,
                                     float(self.dp.delta))  # fmt: skip
        return min(float(eps), self.epsilon_honest_peers())

    def info(self) -> dict[str, float]:
        """Return the run's privacy entries so far (see :meth:`record`)."""
        worst = int(np.argmax(self.precision))
        return {
            "dp-epsilon": self.epsilon_server(),
            "dp-epsilon-honest-peers": self.epsilon_honest_peers(),
            "dp-epsilon-outsider": self.epsilon_outsider(),
            "dp-rounds-worst-client": int(self.rounds[worst]),
            "dp-noise-multiplier": float(self.dp.noise_multiplier),
            "dp-clip": float(self.dp.clip),
            "dp-delta": float(self.dp.delta),
            "dp-reproducible-noise": int(self.dp.reproducible),
        }

    def summary(self) -> dict[str, object]:
        """Return the ``privacy`` record of ``summary.json``."""
        return privacy_summary(self.dp, self.info())


def privacy_summary(dp: GaussianDP, info: dict[str, float]) -> dict[str, object]:
    """Return the ``privacy`` record of ``summary.json`` from the last round's entries.

    Parameters
    ----------
    dp : GaussianDP
        The run's settings (``reproducible`` marks the research mode).
    info : dict
        The privacy entries of the last round (:meth:`GaussianAccountant.record`).
    """
    from flower_app.algorithms.common.dp_noise import NO_PRIVACY_NOTE

    return {
        "mechanism": "client-level Gaussian DP, distributed noise under secure aggregation",
        "accountant": ACCOUNTANT,
        "epsilon-against-server": info.get("dp-epsilon", 0.0),
        "epsilon-against-server-means": (
            "the worst client's epsilon over the rounds its noisy update reached the sum, "
            "counting only the client's own noise share (what its node can verify; in a "
            "Flower run, the largest figure the nodes' own ledgers reported); no "
            "amplification by sampling (the server knows whom it sampled)"
        ),
        "epsilon-if-peers-honest": info.get("dp-epsilon-honest-peers", 0.0),
        "epsilon-if-peers-honest-means": (
            "the same with all the noise that arrived in each sum: holds only if every "
            "other client in the sum is honest"
        ),
        "epsilon-against-outsiders": info.get("dp-epsilon-outsider", 0.0),
        "epsilon-against-outsiders-means": (
            "amplified by sampling (K of n without replacement per round), for observers who "
            "do not know who was sampled; capped by the server's figure"
        ),
        "delta": float(dp.delta),
        "rounds-worst-client": info.get("dp-rounds-worst-client", 0),
        "noise-multiplier": float(dp.noise_multiplier),
        "clip": float(dp.clip),
        "reproducible-noise": bool(dp.reproducible),
        "privacy-against-server": NO_PRIVACY_NOTE if dp.reproducible else (
            "noise from each node's OS entropy: the server cannot regenerate it"
        ),
    }


def q_sum_floor(dp: GaussianDP) -> float:
    """Return the floor of MaxFL's noisy Σ q_k: the standard deviation of its noise.

    MaxFL steps by η_g / (Σ q_k + ε); a noisy Σ q_k near 0 would make that step explode, so
    the server uses max(noisy Σ q_k, this floor) — a deviation from the paper's step that DP
    forces (DP-FedAvg fixes its denominator for the same reason).
    """
    return dp.noise_multiplier * dp.sensitivity(True) / dp.clip


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
