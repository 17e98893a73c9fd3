"""CohortStrategy: the base of the cohort strategies (a node serves many users).

What every cohort strategy adds to :class:`~flower_app.strategies.base.RoundStrategy`: the
options of a run of this app (passed to the constructor: discovery's timeout, the wait for
nodes that left, the checkpoint after every round), discovery before round 1
(:func:`~flower_app.strategies.discovery.discover_cohorts`), re-discovery before every round
(:meth:`CohortStrategy.refresh_nodes`) and the round's sampled users grouped by the node
serving them (:meth:`CohortStrategy.group_users`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.serverapp import Grid

from flower_app.privacy.secagg_server import SecureAggregation
from flower_app.strategies.base import RoundCallback, RoundStrategy
from flower_app.strategies.discovery import (
    CohortMap,
    discover_cohorts,
    group_for_round,
    refresh_cohorts,
    wait_for_mapped_nodes,
)

__all__ = ["CohortStrategy"]


class CohortStrategy(RoundStrategy):
    """Base of the cohort strategies: discovery, re-discovery, users grouped by node.

    Parameters
    ----------
    on_round : callable, optional
        Receives each round's row as the round ends (the runners: ``metrics.jsonl``).
    min_reply_fraction : float, optional
        Least fraction of a round's sampled users whose replies must be accepted (see
        :class:`~flower_app.strategies.base.RoundStrategy`; default 0.0).
    secure_aggregation : SecureAggregation, optional
        Sum each round's node replies securely (default None: in the clear).
    checkpoint_fn : callable, optional
        Called with the checkpoint payload after every round (resumable strategies).
    discovery_timeout : float, optional
        Seconds to wait until the nodes' cohorts cover all users (default 300).
    node_return_wait : float, optional
        Seconds a round waits, before it is sent, for mapped nodes that left the grid's
        node list to be back (run_config ``node-return-wait``; e.g. a SuperNode restarted
        with its key returns under its node id); 0 (default): no wait, their users are
        skipped. After the wait, a node still away is skipped as without it.
    """

    def __init__(
        self,
        *,
        on_round: RoundCallback | None = None,
        min_reply_fraction: float = 0.0,
        secure_aggregation: SecureAggregation | None = None,
        checkpoint_fn: Callable[[dict[str, Any]], None] | None = None,
        discovery_timeout: float = 300.0,
        node_return_wait: float = 0.0,
    ) -> None:
        super().__init__(
            on_round=on_round,
            min_reply_fraction=min_reply_fraction,
            secure_aggregation=secure_aggregation,
            checkpoint_fn=checkpoint_fn,
        )
        self.discovery_timeout = float(discovery_timeout)
        self.node_return_wait = float(node_return_wait)
        #: which node serves which users (set by :meth:`discover`)
        self.cohorts: CohortMap | None = None

    def discover(self, grid: Grid, n_users: int, n_elements: int) -> CohortMap:
        """Find which node serves which users (``query.cohort``); keep and return the map.

        Raises
        ------
        flower_app.strategies.DiscoveryError
            See :func:`~flower_app.strategies.discovery.discover_cohorts`.
        """
        self.cohorts = discover_cohorts(grid, n_users, n_elements, timeout=self.discovery_timeout)
        return self.cohorts

    def refresh_nodes(self, grid: Grid) -> None:
        """Before each round: re-discover cohorts, see ``refresh_cohorts``.

        Mapped nodes that left the grid are marked offline (their users are skipped and
        recorded as missing); a node that rejoined under a new id and serves an offline
        node's users takes its place. With ``node_return_wait`` > 0, mapped nodes not in
        the grid's node list are first waited for, up to that many seconds. No-op before
        discovery.
        """
        if self.cohorts is not None:
            if self.node_return_wait > 0:
                wait_for_mapped_nodes(grid, self.cohorts, self.node_return_wait)
            self.cohorts = refresh_cohorts(
                grid, self.cohorts, timeout=min(self.exchange_timeout, 60.0)
            )

    def group_users(self, users: np.ndarray) -> dict[int, np.ndarray]:
        """Split sorted users by the node serving them, skipping offline nodes.

        See :func:`~flower_app.strategies.discovery.group_for_round`; the users of an
        offline node are recorded in the round's ``failed-nodes`` and ``users-missing``
        (reason: offline) and count against ``min_reply_fraction``.

        Raises
        ------
        RuntimeError
            Before discovery (``start`` runs it).
        """
        if self.cohorts is None:
            raise RuntimeError("discovery has not run: call start()")
        secure = self.secure_aggregation
        least = None if secure is None else int(secure.min_nodes)
        groups, skipped = group_for_round(self.cohorts, users, least)
        self._skipped.update(skipped)
        return groups
