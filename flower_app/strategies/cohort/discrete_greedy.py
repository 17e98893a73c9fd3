"""DiscreteGreedyCohorts: the federated discrete greedy over nodes that serve many users.

The importance exchanges and greedy rounds of
:class:`~flower_app.strategies.discrete_greedy.DiscreteGreedyRounds` (shared with the public
:class:`~flower_app.strategies.discrete_greedy.FedDiscreteGreedyStrategy`) over cohorts,
from a prebuilt server state: every node sends Σ_i O_i over its users, and answers each
greedy round for its participating users with one sum.
"""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.fedcg.discrete_greedy import DiscreteGreedyServer
from flower_app.strategies.base import SUMMED_SENDER
from flower_app.strategies.cohort.base import CohortStrategy
from flower_app.strategies.discrete_greedy import DiscreteGreedyRounds, initial_selected
from flower_app.strategies.submodular_records import (
    checkpointed_server,
    positional_record,
    reply_parts,
)

__all__ = ["DiscreteGreedyCohorts"]


class DiscreteGreedyCohorts(DiscreteGreedyRounds, CohortStrategy):
    """The discrete greedy (Algs. 4/5, then Alg. 3) over cohorts, from a server state.

    Setup: discovery, then the importance exchanges over every node (Σ_i O_i over a node's
    users; O broadcast; Σ_i κ_i back). Then k greedy rounds over every node. The nodes keep
    O in their state, so cohorts are not re-discovered before a round (a node that rejoins
    under a new id has lost its factors). Resumable: the server state (S so far, O, its
    generator) goes to ``checkpoint_fn`` after every round; a resumed run redoes the
    importance exchanges (the nodes announce their factors again), then continues S.

    Parameters
    ----------
    server : DiscreteGreedyServer
        The server state (users n, matroid, k, κ, seed).
    objective_fn : callable, optional
        ``objective_fn(selected) -> float``: the true F(S), recorded per round (an oracle).
    **options
        The run's options of :class:`~flower_app.strategies.cohort.base.CohortStrategy`.

    Notes
    -----
    Message contract: the discrete greedy's rows of FedCG's table
    (:mod:`flower_app.strategies.fedcg`) with positional arrays (``"0"``: O, or S) and no
    matroid entries. A histogram must come from every node (O is a sum over all users): a
    missing or bad histogram stops the run before the first greedy round. Later bad
    replies are counted in ``bad-replies``.
    """

    resumable = True
    supports_secure_aggregation = True
    secure_public_metrics = ("n-elements",)

    def __init__(
        self,
        server: DiscreteGreedyServer,
        objective_fn: Callable[[list[int]], float] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.server: DiscreteGreedyServer | None = server
        self.k, self.kappa, self.seed = int(server.k), float(server.kappa), int(server.seed)
        self.objective_fn = objective_fn
        self._init_protocol_state()

    def checkpoint_state(self) -> dict[str, Any]:
        """Return the server state (S so far, O, the server's generator)."""
        return {"server": self.server}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpointed server state (after ``setup``'s Algs. 4/5).

        Raises
        ------
        TypeError, ValueError
            If the checkpoint is not a discrete-greedy server state of the same instance.
        """
        assert self.server is not None
        server = checkpointed_server(
            state, DiscreteGreedyServer, self.server, "discrete-greedy", "(m, n, k)",
            lambda s: (s.matroid.n_elements, s.n_users, s.k),
        )  # fmt: skip
        server.expected = self.server.expected  # what this run's nodes announced again
        self.server = server

    def summary(self) -> None:
        """Log the strategy's settings."""
        assert self.server is not None
        log(INFO, "DiscreteGreedyCohorts: %s, k=%d rounds, kappa=%g, seed=%d",
            self.server.matroid, self.k, self.kappa, self.seed)  # fmt: skip

    def _record(self, **arrays: np.ndarray) -> ArrayRecord:
        return positional_record(*arrays.values())

    def _round_request(self, selected: np.ndarray) -> tuple[ArrayRecord, dict[str, Any]]:
        return positional_record(selected), {}

    def _round_nodes(self) -> list[int]:
        if self.server is None or self.cohorts is None:
            raise RuntimeError("setup has not run: call start()")
        return [int(n) for n in self.cohorts.node_ids]

    def refresh_nodes(self, grid: Grid) -> None:
        """Do not re-discover: a rejoining node has lost its importance factors.

        Every node keeps the factors of Algs. 4/5 in its own state; a node that rejoins
        under a new id would answer every round with an error.
        """

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Discovery, then Algs. 4/5 over every node; return k − ``|S₀|``.

        ``initial_arrays`` is empty (S starts empty) or has ``"selected"`` int64: S₀.
        """
        start = initial_selected(arrays)
        assert self.server is not None
        self.discover(grid, self.server.n_users, self._m)
        self.importance_protocol(grid, self.exchange_timeout)
        return self._rounds_after(start, num_rounds)

    def importance_protocol(self, grid: Grid, timeout: float) -> None:
        """Run the two exchanges of Algs. 4/5 over all nodes.

        Raises
        ------
        RuntimeError
            If a node's histogram is missing or malformed (O would be wrong for everyone).
        """
        assert self.cohorts is not None and self.server is not None
        self.exchange_timeout = float(timeout)
        cohorts = self.cohorts
        counts = {int(n): int(c) for n, c in zip(cohorts.node_ids, cohorts.counts, strict=True)}
        nodes = list(counts)
        cfg = ConfigRecord({"server-round": 0})
        replies = self._send(grid, nodes, ArrayRecord(), cfg, "histogram")

        def decode(src: int, reply: Message) -> tuple:
            value = self._decode_histogram(src, reply, self._m)
            want = counts[src] if src != SUMMED_SENDER else sum(counts.values())
            if value[1] != want:
                raise ValueError("histogram over the wrong number of users")
            return value

        checked = self._check_protocol(replies, decode, nodes)
        if checked.left_out:
            raise RuntimeError(
                f"importance factors (Alg. 4/5): {checked.left_out} of {len(nodes)} nodes sent "
                f"no valid histogram (first: {checked.first_error}); the histogram must sum "
                "over all users, so the run stops here"
            )
        _, left_out = self._finish_importance(grid, checked, nodes)
        self._nodes = nodes
        self._log_importance(left_out)

    def decode_train_reply(self, src: int, reply: Message) -> tuple[np.ndarray, int, int]:
        """Decode one node's fixed-point sum: ``(vector, participants, bytes)``."""
        return self._decode_greedy(*reply_parts(reply))
