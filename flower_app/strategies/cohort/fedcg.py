"""FedCGCohorts: FedCG / FedCG+ over nodes that serve many users (the runners' strategy).

The round of :class:`~flower_app.strategies.fedcg.FedCGRounds` (shared with the public
:class:`~flower_app.strategies.fedcg.FedCGStrategy`) over cohorts, from a prebuilt server
state (users N, weights p_i, K draws per round, the matroid, T, η, τ): the server samples
users, and a node answers for its sampled users with one sum (what secure aggregation
reveals).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from flower_app.algorithms.fedcg.continuous import FedCGServer
from flower_app.algorithms.fedsm.core import decode_report
from flower_app.strategies.cohort.base import CohortStrategy
from flower_app.strategies.fedcg import TOL, FedCGRounds, initial_x, start_at
from flower_app.strategies.replies import int_metric
from flower_app.strategies.round_rows import warn_fixed_length
from flower_app.strategies.submodular_records import (
    checkpointed_server,
    positional_record,
    reply_parts,
    report_arrays,
    train_message,
)

__all__ = ["FedCGCohorts"]


class FedCGCohorts(FedCGRounds, CohortStrategy):
    """FedCG (τ = 1) / FedCG+ (τ > 1) over cohorts, from a prebuilt server state.

    Each round the server draws K users (with their weights c_i) with its own generator,
    sends every node x with its sampled users and their weights, and a node replies with
    τ·Σ c_i Δ_i over them; the server sets x ← x + η Σ c_i Δ_i / Σ c_i. T is the server
    state's; after round T, x is rounded as configured. Resumable: the server state (x, the
    round, its generators) goes to ``checkpoint_fn`` after every round.

    Parameters
    ----------
    server : FedCGServer
        The server state (users N, p_i, K draws, matroid, T, η, τ, seed, rounding).
    objective_fn : callable, optional
        ``objective_fn(x) -> float``: an oracle recorded per round as ``multilinear``
        (e.g. the mean F̂(x)); the algorithm never uses it.
    evaluate_every : int, optional
        Call ``objective_fn`` every this many rounds and after the last (default 1).
    **options
        The run's options of :class:`~flower_app.strategies.cohort.base.CohortStrategy`.
        Under secure aggregation the server learns Σ c_i Δ_i, Σ c_i, the users and
        ``ids-sent``.

    Notes
    -----
    Message contract: FedCG's table (:mod:`flower_app.strategies.fedcg`) with positional
    arrays: ``train.direction`` sends ``"0"`` float64 x, ``"1"`` int64 user ids and ``"2"``
    float64 weights c_i (no matroid entries: the nodes hold the instance); the reply's
    ``"0"`` (+ ``"1"``) hold τ·Σ c_i Δ_i (dense, or ids and values), its metrics
    ``num-examples`` (the users sent), ``weight`` (Σ c_i) and ``ids-sent``. Discovery:
    ``query.cohort`` (:mod:`flower_app.strategies.discovery`). A reply whose user count
    or weight does not match what was sent is left out, besides FedCG's checks.
    """

    resumable = True
    supports_secure_aggregation = True
    secure_public_metrics = ("n-elements",)

    def __init__(
        self,
        server: FedCGServer,
        objective_fn: Callable[[np.ndarray], float] | None = None,
        evaluate_every: int = 1,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.server: FedCGServer | None = server
        self.local, self.seed, self.rounding = server.local, int(server.seed), server.rounding
        self.objective_fn = objective_fn
        self.evaluate_every = max(1, int(evaluate_every))
        self._init_round_state()

    def checkpoint_state(self) -> dict[str, Any]:
        """Return the server state (x, the round, the server's generators)."""
        return {"server": self.server}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpointed server state (after ``setup``'s discovery).

        Raises
        ------
        TypeError, ValueError
            If the checkpoint is not a FedCG server state of the same instance and T.
        """
        assert self.server is not None
        self.server = checkpointed_server(
            state, FedCGServer, self.server, "FedCG", "(m, n, T)",
            lambda s: (s.matroid.n_elements, s.n_users, s.rounds),
        )  # fmt: skip

    def summary(self) -> None:
        """Log the strategy's settings."""
        assert self.server is not None
        self._summary("FedCGCohorts", self.server.matroid, self.server.eta)

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Check ``initial_arrays`` (x₀), discover the cohorts; return the rounds left of T."""
        server = self.server
        assert server is not None
        x0 = initial_x(arrays)
        self.selected = None
        warn_fixed_length("FedCG", num_rounds, server.rounds, "T of the server state")
        if x0 is not None:
            start_at(server, x0)
        self.discover(grid, server.n_users, server.matroid.n_elements)
        return server.rounds - server.t

    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Draw the round's users; send each node x, its users and their weights."""
        self._sent, self._bytes_down = {}, 0
        if self.cohorts is None or self.server is None:
            raise RuntimeError("discovery has not run: call start()")
        users, weights = self.server.sample()
        self._draws = self.server.K
        cfg = self._config(config, server_round)
        x = self.server.x.astype(np.float64)
        messages = []
        for node, node_users in self.group_users(users).items():
            node_weights = weights[np.searchsorted(users, node_users)]
            record = positional_record(x, node_users.astype(np.int64), node_weights)
            messages.append(train_message(node, record, cfg, "direction"))
            self._sent[node] = (int(node_users.size), float(node_weights.sum()))
        return self._sent_messages(messages)

    def decode_train_reply(self, src: int, reply: Message) -> tuple:
        """Decode one node's summed report: ``(vector, users, weight, bytes, ids, m)``."""
        assert self.server is not None
        record, metrics, nbytes = reply_parts(reply)
        m = self.server.matroid.n_elements
        vec = decode_report(report_arrays(record), m)
        n_sent, w_sent = self._sent[src]
        n_ex, weight = int_metric(metrics, "num-examples"), float(metrics["weight"])
        if (
            n_ex != n_sent
            or not np.isfinite(weight)
            or abs(weight - w_sent) > TOL * max(1.0, w_sent)
        ):
            raise ValueError(f"update for {n_ex} users / weight {weight}, sent {n_sent} / {w_sent}")
        self._check_mass(vec, weight)
        return vec, n_ex, weight, nbytes, int_metric(metrics, "ids-sent", 0), m

    def finalize(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return ``{"x", "selected"}`` of the run (the last round already rounded x)."""
        return self._arrays()
