"""Differential privacy of bounded sums in the shuffle model (FedSM, Appendix C).

FedSM's Proposition C.1 makes every round's sum query (ε′, δ′)-differentially private with
the real-summation protocol of Cheu et al. (EUROCRYPT 2019, Algorithms 5–6): each client
encodes its value x ∈ [0, λ] as k bits and randomises every bit; an anonymous shuffler
(here: secure aggregation, which reveals only the sum) hides who sent which bit; the server
debiases the count of ones. This module is that protocol, with the flip probability
calibrated numerically instead of by the paper's O(·) constants:

Randomiser (one value)
    x̂ = ⌊k·x/λ⌋ + Bernoulli(frac(k·x/λ)) (unbiased randomised rounding to 0..k); bits
    b_1..b_k = 1 for j ≤ x̂; each bit is replaced with probability p by a fair coin. Only
    the number of ones is needed: Bin(x̂, 1 − p/2) + Bin(k − x̂, p/2).
Analyzer (one query, n clients)
    Σ x ≈ λ/k · (C − n·k·p/2) / (1 − p) for C ones in total: unbiased, variance
    (λ/k)²·(n·k·(p/2)(1 − p/2) + rounding) / (1 − p)².
Bits
    k = max(1, ⌈ε′·√n⌉) (Cheu et al.'s choice: error O(1/ε′) independent of n).
Calibration (:func:`calibrate_flip`)
    The smallest p for which the query is (ε′, δ′)-DP with respect to one client's value
    (its x̂ moves from 0 to k: all k bits), against an adversary who knows every other
    client's bits. Among the (n − 1)·k other bits, R ~ Bin((n − 1)k, p) are fair coins (the
    "blanket"); given R the count is Bin(R, 1/2) plus the client's own bits, so
    δ(ε′) ≤ δ_{R*}(ε′) + Pr[R < R*] for any R* (adding fair coins is post-processing, so
    δ_R falls with R), where δ_R is the exact hockey-stick divergence between
    Bin(R, 1/2) ∗ Bin(k, 1 − p/2) and Bin(R, 1/2) ∗ Bin(k, p/2). This bound holds for every
    value of the other clients: a proof, not an estimate.

Composition (:func:`compose`): a client answers up to ``queries`` such sums in a run (d per
round it is sampled in, times the rounds); the run is (queries·ε′, queries·δ′)-DP by basic
composition (the paper's (ε′·m·r, δ′·m·r) with d ≤ m) and, by advanced composition
(Dwork, Rothblum, Vadhan 2010), (√(2q ln(1/δ̃))·ε′ + q·ε′(e^ε′ − 1), q·δ′ + δ̃)-DP.

Who the bound holds against
    The shuffle bound needs an analyzer that sees only each element's total: the server
    under secure aggregation, or anyone who sees only the released results (an outsider).
    A server that sees a node's or a user's report in the clear gets only the local
    randomiser's guarantee, ε_local = k·ln((2 − p)/p) per value with δ = 0
    (:func:`local_epsilon`; one value moving from 0 to λ moves all k bits, each kept with
    probability 1 − p/2). When users drop out, a query was answered by n′ < n users and
    its flip p, calibrated for n, gives the larger :func:`query_epsilon` (n′, k, p, δ′).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = [
    "ShuffleDP",
    "bits_for",
    "calibrate_flip",
    "compose",
    "debias_counts",
    "hockey_stick",
    "local_epsilon",
    "query_delta",
    "query_epsilon",
    "randomize_counts",
]


@dataclass(frozen=True)
class ShuffleDP:
    """Per-query privacy of FedSM's sums in the shuffle model.

    Parameters
    ----------
    epsilon : float
        ε′ of one sum query (one element, one round), > 0.
    delta : float
        δ′ of one sum query, in (0, 1) (default 1e-6).
    """

    epsilon: float
    delta: float = 1e-6

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"dp epsilon={self.epsilon}: expected a finite value > 0")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"dp delta={self.delta}: expected a value in (0, 1)")


def bits_for(epsilon: float, n: int) -> int:
    """Return k = max(1, ⌈ε′·√n⌉), the bits per value for a query over n clients."""
    return max(1, math.ceil(float(epsilon) * math.sqrt(max(int(n), 1))))


def hockey_stick(p: np.ndarray, q: np.ndarray, epsilon: float) -> float:
    """Return Σ_y max(0, p(y) − e^ε q(y)) (δ of the pair at ε)."""
    return float(np.maximum(p - math.exp(epsilon) * q, 0.0).sum())


def _stats():  # noqa: ANN202 - scipy.stats, imported on first use
    """Return ``scipy.stats``, imported only when a privacy bound is computed.

    Importing it pulls in scipy.optimize, linalg, spatial and more (≈ 65 MiB and seconds of
    CPU): a node's ClientApp process, which imports this module with every FedSM runner but
    computes no bound, should not pay that per message (docs/deployment.md §9).
    """
    from scipy import stats

    return stats


def _delta_given_blanket(blanket: int, k: int, flip: float, epsilon: float) -> float:
    stats = _stats()
    coins = stats.binom.pmf(np.arange(blanket + 1), blanket, 0.5)
    high = np.convolve(coins, stats.binom.pmf(np.arange(k + 1), k, 1.0 - flip / 2.0))
    low = np.convolve(coins, stats.binom.pmf(np.arange(k + 1), k, flip / 2.0))
    # the mirror y -> R + k - y swaps the two: one direction is the worst case
    return hockey_stick(high, low, epsilon)


def query_delta(n: int, k: int, flip: float, epsilon: float) -> float:
    """Return an upper bound on δ(ε) of one query over n clients (module docstring).

    Parameters
    ----------
    n : int
        Clients answering the query (≥ 1).
    k : int
        Bits per value.
    flip : float
        Probability p that a bit is replaced by a fair coin, in [0, 1].
    epsilon : float
        ε′.
    """
    if flip >= 1.0:
        return 0.0
    if flip <= 0.0:
        return 1.0
    others = (int(n) - 1) * int(k)
    if others <= 0:
        return _delta_given_blanket(0, k, flip, epsilon)
    # Pr[R < r] for r = 0..others; pick R* minimising δ_{R*} + Pr[R < R*] among quantiles
    stats = _stats()
    best = 1.0
    for tail in (1e-3, 1e-5, 1e-7, 1e-9, 1e-11, 1e-13):
        r = int(stats.binom.ppf(tail, others, flip))
        r = max(r - 1, 0)
        below = float(stats.binom.cdf(r - 1, others, flip)) if r > 0 else 0.0
        best = min(best, _delta_given_blanket(r, k, flip, epsilon) + below)
    return best


@lru_cache(maxsize=4096)
def calibrate_flip(n: int, k: int, epsilon: float, delta: float) -> float:
    """Return the smallest flip probability p (to 1e-4) making one query (ε′, δ′)-DP.

    Bisection on p (more flips: more privacy); 1.0 (every bit a fair coin, the value is
    not used) if nothing smaller is private enough.
    """
    if query_delta(n, k, 1.0 - 1e-9, epsilon) > delta:
        return 1.0
    return _bisect_private(
        lambda p: query_delta(n, k, p, epsilon) <= delta, 0.0, 1.0, abs_tol=1e-4, rel_tol=0.0
    )


def local_epsilon(k: int, flip: float) -> float:
    """Return ε of one value's randomised k bits seen alone (local DP, δ = 0).

    The count of ones is Bin(x̂, 1 − p/2) + Bin(k − x̂, p/2); moving x̂ from 0 to k changes
    its probabilities by at most ((1 − p/2)/(p/2))^k: ε = k·ln((2 − p)/p). 0 for p = 1
    (the value is not used), ∞ for p = 0.
    """
    flip = float(flip)
    if flip >= 1.0:
        return 0.0
    if flip <= 0.0:
        return math.inf
    return int(k) * math.log((2.0 - flip) / flip)


@lru_cache(maxsize=4096)
def query_epsilon(n: int, k: int, flip: float, delta: float) -> float:
    """Return the smallest ε (to 0.1 %) at which a query over n users is (ε, δ)-DP.

    For a query whose flip p was calibrated for more users than answered it (dropouts):
    bisection on :func:`query_delta`, never above :func:`local_epsilon` (which holds with
    δ = 0 whatever the others do).
    """
    hi = local_epsilon(k, flip)
    if hi == 0.0 or int(n) < 1:
        return 0.0
    if not math.isfinite(hi) or query_delta(n, k, flip, hi) > delta:
        return hi
    return _bisect_private(
        lambda e: query_delta(n, k, flip, e) <= delta, 0.0, hi, abs_tol=0.0, rel_tol=1e-3
    )


def _bisect_private(
    private: Callable[[float], bool],
    lo: float,
    hi: float,
    *,
    abs_tol: float,
    rel_tol: float,
) -> float:
    """Return the smallest value in [lo, hi] at which ``private`` holds, by bisection.

    Parameters
    ----------
    private : callable
        ``private(value) -> bool``: holds at ``hi`` and, once it holds, for every larger
        value (more flips or a larger ε: more privacy).
    lo, hi : float
        The bracket.
    abs_tol, rel_tol : float
        Stop when ``hi − lo ≤ abs_tol + rel_tol · hi`` (one of them > 0).

    Returns
    -------
    float
        The upper end of the last bracket: ``private`` holds there.
    """
    while hi - lo > abs_tol + rel_tol * hi:
        mid = (lo + hi) / 2.0
        if private(mid):
            hi = mid
        else:
            lo = mid
    return hi


def randomize_counts(
    values: np.ndarray, lam: float, k: int, flip: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Return the number of ones each value's k randomised bits hold.

    Parameters
    ----------
    values : numpy.ndarray
        The client's values, clipped to [0, λ].
    lam : float
        λ, the bound on a value (> 0).
    k : int
        Bits per value.
    flip : numpy.ndarray
        p for each value (broadcast).
    rng : numpy.random.Generator
        The client's stream for its DP noise.

    Returns
    -------
    numpy.ndarray
        int64 counts in 0..k, same shape as ``values``.
    """
    x = np.clip(np.asarray(values, dtype=np.float64) / float(lam), 0.0, 1.0) * k
    lo = np.floor(x)
    xhat = (lo + (rng.random(x.shape) < x - lo)).astype(np.int64)
    flip = np.broadcast_to(np.asarray(flip, dtype=np.float64), x.shape)
    return rng.binomial(xhat, 1.0 - flip / 2.0) + rng.binomial(k - xhat, flip / 2.0)


def debias_counts(
    counts: np.ndarray, reporters: np.ndarray, lam: float, k: int, flip: np.ndarray
) -> np.ndarray:
    """Return the unbiased estimate of Σ values from the summed counts of ones.

    ``λ/k · (C − n·k·p/2) / (1 − p)`` per query (0 where no client reported or p = 1).
    """
    counts = np.asarray(counts, dtype=np.float64)
    n = np.asarray(reporters, dtype=np.float64)
    flip = np.asarray(flip, dtype=np.float64)
    keep = flip < 1.0
    out = np.zeros_like(counts)
    out[keep] = (counts[keep] - n[keep] * k * flip[keep] / 2.0) / (1.0 - flip[keep])
    return out * float(lam) / k


def compose(epsilon: float, delta: float, queries: int, slack: float = 1e-6) -> dict[str, float]:
    """Return the run's privacy after ``queries`` (ε′, δ′) queries by one client.

    Returns
    -------
    dict
        ``dp-queries``, ``dp-epsilon-basic`` = q·ε′, ``dp-delta-basic`` = q·δ′,
        ``dp-epsilon-advanced`` = √(2q ln(1/δ̃))·ε′ + q·ε′(e^ε′ − 1) and
        ``dp-delta-advanced`` = q·δ′ + δ̃ (δ̃ = ``slack``); the advanced bound is reported
        as the basic one when that is smaller.
    """
    q = max(int(queries), 0)
    basic_e, basic_d = q * epsilon, q * delta
    adv_e = math.sqrt(2.0 * q * math.log(1.0 / slack)) * epsilon + q * epsilon * math.expm1(epsilon)
    adv_d = q * delta + slack
    if adv_e >= basic_e:
        adv_e, adv_d = basic_e, basic_d
    return {
        "dp-queries": float(q),
        "dp-epsilon-basic": basic_e,
        "dp-delta-basic": basic_d,
        "dp-epsilon-advanced": adv_e,
        "dp-delta-advanced": adv_d,
    }
