"""FedSMCohorts: FedSM over nodes that serve many users (the runners' strategy).

The round of :class:`~flower_app.strategies.fedsm.FedSMRounds` (shared with the public
:class:`~flower_app.strategies.fedsm.FedSMStrategy`) over cohorts: the server knows n and
the matroid, discovery maps users to nodes, and each node reports the sum over its sampled
users. The numbers are the direct engine's (``direct.run_direct``, in the repository).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun, RoundPlan
from flower_app.strategies.cohort.base import CohortStrategy
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.fedsm import FedSMRounds, checked_params, initial_set
from flower_app.submodular.matroids import Matroid

__all__ = ["FedSMCohorts", "plan_arrays"]


def plan_arrays(plan: RoundPlan, node_users: np.ndarray) -> list[np.ndarray]:
    """Return the arrays of a cohort ``train`` message: S, users, [X, a], [x ids, x values].

    Parameters
    ----------
    plan : RoundPlan
        The round.
    node_users : numpy.ndarray
        The node's sampled users.

    Returns
    -------
    list of numpy.ndarray
        ``[S int64, users int64]``, then ``[X int32, a int64]`` for Algorithm 2, then
        ``[ids int32, values float64]`` of the non-zero coordinates of x for amplification.
    """
    arrays = [np.asarray(plan.selected, dtype=np.int64), node_users.astype(np.int64)]
    if plan.mode == "alg2":
        arrays += [plan.pool.astype(np.int32), plan.sequence.astype(np.int64)]
    if plan.surrogate != "none" and plan.point is not None:
        nz = np.flatnonzero(plan.point)
        arrays += [nz.astype(np.int32), plan.point[nz].astype(np.float64)]
    return arrays


class FedSMCohorts(FedSMRounds, CohortStrategy):
    r"""FedSM (Algorithms 1-3) over cohorts: n and the matroid known, users sampled.

    The rounds and their numbers are those of
    :class:`~flower_app.strategies.fedsm.FedSMStrategy` with one user per node; here a
    node serves many users (``num-partitions``) and answers for its sampled users with
    one sum. Resumable: the run's state (S so far, the mode's server state, its random
    generator) goes to ``checkpoint_fn`` after every round, and ``resume_from(payload)``
    before ``start`` continues after that round with the same result as an uninterrupted
    run.

    Parameters
    ----------
    n_users : int
        Users n over all nodes.
    matroid : Matroid
        The constraint (its ground set: the m elements).
    k : int
        Largest \|S\|.
    params : FedSMParams
        The mode and its parameters (K, d, ε, τ, η, ..., the users' draws, DP, Algorithm
        1's history clamp, ``"noise-aware"`` by default: a deviation from the paper).
    seed : int, optional
        Seed of all randomness (default 0).
    lam : float, optional
        λ = max_{e,i} f_i({e}) for Algorithm 2's default threshold (default 0).
    progress_fn : callable, optional
        ``progress_fn(run) -> float``: an experiment oracle's F of the run's state, recorded
        as each round's ``objective`` (never used to decide).
    federated_evaluation : bool, optional
        After the last round, ask every node for Σ_i f_i(S) over its users (default False;
        runs without server data).
    report_bound : float, optional
        The declared range λ (``report-bound``): Algorithm 1's node sums are held to it per
        user sent (a node with one sampled user: to its own draw too) and refused
        otherwise; a secure sum above it is clipped
        (:mod:`flower_app.algorithms.fedsm.checks`). None (default): not checked.
    **options
        The run's options of :class:`~flower_app.strategies.cohort.base.CohortStrategy`
        (``on_round``, ``min_reply_fraction``, ``secure_aggregation``, ``checkpoint_fn``,
        ``discovery_timeout``, ``node_return_wait``). Under secure aggregation the nodes
        report densely and the server learns only Σ of the reports, of ``num-examples``,
        ``user-values`` and ``positive-entries``.

    Notes
    -----
    Message contract (``config`` entries as in
    :class:`~flower_app.strategies.fedsm.FedSMStrategy`'s table, without ``stage`` and
    ``user-id``):

    ==============  ================================================================
    message         records
    ==============  ================================================================
    ``query.``      ``"config"``: ``kind="cohort"``; reply ``"properties"``:
    ``cohort``      ``partition-id``, ``num-partitions``, ``first-user``,
                    ``num-users``, ``n-users-total``, ``n-elements`` int.
    ``train``       ``"arrays"`` by position: ``"0"`` int64 S, ``"1"`` int64 the node's
                    sampled user ids; Alg. 2 ``"2"`` int32 X, ``"3"`` int64 a;
                    amplification then int32 ids, float64 values of x.
    reply           ``"arrays"``: ``"0"`` int32 ids, ``"1"`` float64 values (sparse) or
                    ``"0"`` float64 (L,) (dense), summed over the node's users;
                    ``"metrics"``: ``num-examples`` = users sent, ``user-values``,
                    ``positive-entries``.
    ``evaluate``    ``"arrays"``: ``selected``; reply ``"metrics"``: ``objective-sum``
                    Σ_i f_i(S), ``num-examples``, ``loss``.
    ==============  ================================================================
    """

    resumable = True
    supports_secure_aggregation = True
    secure_public_metrics = ("num-elements",)

    def __init__(
        self,
        n_users: int,
        matroid: Matroid,
        k: int,
        params: FedSMParams,
        seed: int = 0,
        lam: float = 0.0,
        progress_fn: Callable[[FedSMRun], float] | None = None,
        federated_evaluation: bool = False,
        report_bound: float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.report_bound = None if report_bound is None else float(report_bound)
        self.params = checked_params(params, k, seed, self.secure_aggregation)
        self.k, self.seed = k, seed
        self.n_users, self.matroid = int(n_users), matroid
        self.n_elements = matroid.n_elements
        self.lam = float(lam)
        self.progress_fn = progress_fn
        self.federated_evaluation = bool(federated_evaluation)
        self.run: FedSMRun | None = self._new_run([])
        self._init_round_state()

    def _new_run(self, initial: list[int]) -> FedSMRun:
        return FedSMRun(
            self.n_users, self.matroid, self.k, self.params, self.lam, seed=self.seed,
            initial=initial, report_bound=self.report_bound,
        )  # fmt: skip

    def summary(self) -> None:
        """Log the strategy's settings."""
        p = self.params
        log(
            INFO,
            "FedSMCohorts(%s): n=%d users, m=%d elements, k=%d, K=%s users/round, "
            "d=%s per user, matroid=%s, seed=%d%s",
            p.mode, self.n_users, self.n_elements, self.k, p.clients_per_round,
            p.elements_per_client, self.matroid, self.seed, "" if p.mode == "alg1" else f", {p}",
        )  # fmt: skip

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Discover the cohorts; return the rounds to run."""
        initial = initial_set(arrays)
        self._started = True
        if initial:
            self.run = self._new_run(initial)
        self.discover(grid, self.n_users, self.n_elements)
        return self._rounds_to_run(initial, num_rounds)

    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Plan the round; send every node S and its sampled users."""
        if self.cohorts is None:
            raise RuntimeError("discovery has not run: call start()")
        plan, entries = self._plan_round()
        groups = self.group_users(plan.users)
        self._sent_users = {int(n): np.asarray(u, np.int64) for n, u in groups.items()}
        targets = [
            (node, ArrayRecord(plan_arrays(plan, users)), int(users.size), entries)
            for node, users in groups.items()
        ]
        return self._round_messages(plan, targets, config, server_round)

    def decode_train_reply(self, src: int, reply: Message) -> tuple[np.ndarray, int, int, int, int]:
        """Check one node's summed report; return (report, users, bytes, values, positive)."""
        keys = ["0", "1"] if "1" in reply.content.array_records["arrays"] else ["0"]
        return self._decode_report(src, reply, keys)

    def checkpoint_state(self) -> FedSMRun:
        """Return the run (S so far, the mode's server state, its random generator)."""
        return self._require_run()

    def restore_state(self, state: FedSMRun) -> None:
        """Continue from a checkpointed run (after ``setup``'s discovery)."""
        if not isinstance(state, FedSMRun):
            raise TypeError(f"a FedSM checkpoint holds a FedSMRun, not {type(state).__name__}")
        self.run = state

    def evaluate_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask every node for Σ f_i(S) over its users (after the last round, if asked)."""
        content = self._evaluate_content(arrays, config, server_round)
        if content is None:
            return []
        nodes = [] if self.cohorts is None else [int(n) for n in self.cohorts.node_ids]
        self._expected = set(nodes)
        return messages_to(nodes, content, MessageType.EVALUATE)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return F(S) = Σ f_i(S) / n, or None if a node failed (logged)."""
        return self._objective(server_round, replies, "objective-sum")
