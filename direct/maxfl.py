"""MaxFL's direct engine: the round protocol of MaxFL and its baselines in one process.

:func:`run_protocol` runs the rounds of :mod:`flower_app.algorithms.maxfl.appeal` (opt-in
request, sampling, training, step, evaluation) with that module's pieces, in the order the
Flower strategy (:class:`~flower_app.strategies.cohort.maxfl.MaxFLCohorts`) runs them as
hooks; :class:`DirectTransport` calls one
:class:`~flower_app.clients.learning.LearningClient` that serves every client. So both
engines draw the same clients and produce the same rows. :func:`direct_run` is the runner's
direct side (:mod:`flower_app.runners.maxfl` holds what both engines share).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from direct.rounds import DirectRounds
from flower_app.algorithms.common.gaussian_dp import (
    GaussianAccountant,
    GaussianDP,
    dp_config,
    q_sum_floor,
)
from flower_app.algorithms.maxfl.appeal import (
    AppealServer,
    PoolCache,
    TrainOutcome,
    evaluates_at,
    outcome_row,
    round_row,
    summarise_metrics,
)
from flower_app.algorithms.maxfl.participation import ParticipationSampler
from flower_app.clients.learning import DictState, LearningClient
from flower_app.config import AppConfig
from flower_app.runners.maxfl import _client, _finish, _open, _server, settings

__all__ = ["DirectTransport", "direct_run", "run_protocol"]


class DirectTransport:
    """The direct engine's transport: calls a LearningClient in-process (no Flower).

    Parameters
    ----------
    client : LearningClient
        A client that serves every client id.
    algorithm : str
        The algorithm (sent in the fit config, as the strategy does).
    """

    def __init__(
        self,
        client: LearningClient,
        algorithm: str,
        dp: GaussianDP | None = None,
        population: int = 0,
    ) -> None:
        self.client = client
        self.algorithm = algorithm
        self.dp, self.population = dp, int(population)
        self.accountant = None if dp is None else GaussianAccountant(dp, self.population)

    def train(
        self,
        server_round: int,
        users: np.ndarray,
        payload: list[np.ndarray],
        user_config: dict[str, list[float]] | None = None,
    ) -> TrainOutcome:
        """Train ``users`` from ``payload`` and return their summed arrays."""
        config = {
            "server-round": server_round,
            "users": [int(u) for u in users],
            "algorithm": self.algorithm,
            **(user_config or {}),
        }
        if self.dp is not None:
            config.update(dp_config(self.dp, users.size))
        sums, n, metrics = self.client.fit(payload, config)
        if self.dp is not None:  # sums only, as a securely aggregated round gives them
            out = TrainOutcome(sums=[np.asarray(a, np.float64) for a in sums], users=n,
                               q_sum=max(float(metrics["q-sum"]), q_sum_floor(self.dp)),
                               h_sum=0.0)  # fmt: skip
            assert self.accountant is not None  # every sampled client is in the sum
            out.info = self.accountant.record(int(users.size), users)
            return out
        return TrainOutcome(
            sums=[np.asarray(a, np.float64) for a in sums],
            users=n,
            q=list(metrics["q"]),
            losses=list(metrics["loss"]),
            h_sum=float(metrics["h-sum"]),
            ids=[int(u) for u in metrics["users"]],
            met=[bool(v) for v in metrics.get("met", [])],
        )

    def appeal(self, server_round: int, users: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
        """Return the seen clients that opt in."""
        config = {"kind": "appeal", "users": [int(u) for u in users]}
        _, _, metrics = self.client.evaluate(weights, config)
        return np.asarray(metrics["appealing"], dtype=np.int64)

    def evaluate(
        self, server_round: int, weights: list[np.ndarray], tuned: bool
    ) -> dict[str, float]:
        """Return the metric sums over all clients."""
        config = {"kind": "metrics", "server-round": server_round, "tuned": int(tuned)}
        _, _, sums = self.client.evaluate(weights, config)
        return sums


def run_protocol(
    server: AppealServer,
    sampler: ParticipationSampler,
    transport: DirectTransport,
    num_rounds: int,
    eval_every: int = 10,
    tuned_final: bool = True,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``num_rounds`` rounds; return one row per round (round 0 = initial evaluation).

    Parameters
    ----------
    server : AppealServer
        Server state (updated in place).
    sampler : ParticipationSampler
        Draws the clients (flexible participation lives here).
    transport : DirectTransport
        Reaches the clients.
    num_rounds : int
        T.
    eval_every : int, optional
        Evaluate all clients every this many rounds (default 10; also rounds 0 and T).
    tuned_final : bool, optional
        Also evaluate locally-tuned models at round T (default True).
    on_round : callable, optional
        Receives each row as soon as the round ends.

    Returns
    -------
    list of dict
        The rows.
    """
    if num_rounds < 1 or eval_every < 1:
        raise ValueError("num_rounds and eval_every must be >= 1")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def emit(row: dict[str, Any]) -> None:
        row["wall-time"] = time.perf_counter() - t0
        rows.append(row)
        if on_round is not None:
            on_round(row)

    seen = np.arange(server.n_seen)
    emit({"server-round": 0, **summarise_metrics(transport.evaluate(0, server.weights, False))})
    cache = PoolCache()
    for t in range(1, num_rounds + 1):
        r0 = time.perf_counter()
        pool = None
        if sampler.needs_pool(t):
            pool = cache.get(server.weights, lambda t=t: transport.appeal(t, seen, server.weights))
        users = sampler.sample(pool)
        row = round_row(t, server.n_seen if pool is None else len(pool), users.size)
        outcome = TrainOutcome(None, 0)
        if users.size:
            outcome = transport.train(t, users, server.payload(), server.user_config(users))
        row.update(server.step(outcome))
        row.update(outcome_row(outcome))
        if evaluates_at(t, num_rounds, eval_every):
            tuned = tuned_final and t == num_rounds
            row.update(summarise_metrics(transport.evaluate(t, server.weights, tuned)))
        row["round-time"] = time.perf_counter() - r0
        emit(row)
    return rows


def direct_run(cfg: AppConfig, progress: bool = False) -> dict[str, Any]:
    """Run the family's algorithm on the direct engine and write the run folder."""
    s = settings(cfg)
    started = time.perf_counter()
    writer = _open(cfg, s, "direct")
    server, sampler = _server(s)
    client = _client(s, 0, s.n_clients, DictState(), 0, 1)
    desc = f"{s.algorithm} {s.dataset} seed {s.seed}"
    rounds = DirectRounds(writer, progress, desc, s.rounds + 1, timed=False)
    transport = DirectTransport(client, s.algorithm, s.dp, s.n_seen)
    rows = run_protocol(
        server,
        sampler,
        transport,
        s.rounds,
        eval_every=s.eval_every,
        on_round=rounds.log,
    )
    rounds.close()
    return _finish(writer, s, "direct", rows, server.weights, started, transport.accountant)
