"""Which seen clients train in a round: uniform sampling, optionally from an opt-in pool.

Appeal-based flexible participation (MaxFL paper, Section 3 and Table 1): during the first
``mandatory_rounds`` rounds every seen client takes part when selected; afterwards only the
clients that find the current global model appealing (F_k(w) < ρ_k) are in the pool the server
samples from. The server's ``numpy.random.Generator`` (seeded by ``seed``) draws
min(K, |pool|) clients without replacement; both engines use this class, so they sample
the same clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import WARNING

import numpy as np
from flwr.common import log

__all__ = ["ParticipationSampler", "warn_empty_pool"]

#: said once per run when the opt-in pool first comes back empty
EMPTY_POOL = (
    "the opt-in pool is empty: no seen client finds the global model appealing (F_k(w) >= "
    "rho_k on its training data for every k), so this round trains nobody; the model then "
    "does not change and the pool stays empty for the rest of the run"
)


def warn_empty_pool(warned: bool, pool_size: int) -> bool:
    """Log :data:`EMPTY_POOL` the first time the pool is empty; return the new ``warned``."""
    if pool_size == 0 and not warned:
        log(WARNING, EMPTY_POOL)
        return True
    return warned


@dataclass
class ParticipationSampler:
    """Draws each round's clients.

    Parameters
    ----------
    n_seen : int
        Seen clients (ids 0..n_seen−1).
    clients_per_round : int
        K.
    flexible : bool
        Appeal-based flexible participation after ``mandatory_rounds``.
    mandatory_rounds : int
        Rounds in which every seen client is in the pool (the paper: 10 of 200).
    seed : int
        Seeds the generator.
    """

    n_seen: int
    clients_per_round: int
    flexible: bool = False
    mandatory_rounds: int = 10
    seed: int = 0
    rng: np.random.Generator = field(init=False, repr=False)
    _warned: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.clients_per_round <= self.n_seen:
            raise ValueError(
                f"clients per round K={self.clients_per_round} must lie in 1..{self.n_seen}"
            )
        if self.mandatory_rounds < 0:
            raise ValueError("mandatory_rounds must be >= 0")
        self.rng = np.random.default_rng(self.seed)

    def needs_pool(self, server_round: int) -> bool:
        """Whether round ``server_round`` (from 1) samples from the opt-in pool."""
        return self.flexible and server_round > self.mandatory_rounds

    def sample(self, pool: np.ndarray | None = None) -> np.ndarray:
        """Draw min(K, |pool|) clients without replacement.

        Parameters
        ----------
        pool : numpy.ndarray, optional
            Client ids that may be drawn (None: all seen clients).

        Returns
        -------
        numpy.ndarray
            Sorted int64 client ids (empty if the pool is empty).
        """
        if pool is None:
            pool = np.arange(self.n_seen)
        pool = np.unique(np.asarray(pool, dtype=np.int64))
        if pool.size and (pool[0] < 0 or pool[-1] >= self.n_seen):
            raise ValueError("the pool may only hold seen clients")
        if pool.size == 0:
            self._warned = warn_empty_pool(self._warned, 0)
            return pool
        k = min(self.clients_per_round, pool.size)
        return np.sort(self.rng.choice(pool, size=k, replace=False))
