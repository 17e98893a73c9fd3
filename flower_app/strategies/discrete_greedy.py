"""FedDiscreteGreedyStrategy: the federated discrete greedy with importance factors.

Rafiey (ICML 2024), "Decomposable Submodular Maximization in Federated Setting", Algs. 3-5.
The math lives in :mod:`flower_app.algorithms.fedcg.discrete_greedy`; the message contract is the
table of :mod:`flower_app.strategies.fedcg` (rows ``train.histogram``, ``train.importance``,
``train.discrete``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MetricRecord,
)
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.fedcg.discrete_greedy import DiscreteGreedyServer
from flower_app.algorithms.fedsm.core import check_report, decode_report
from flower_app.privacy.secagg_server import SecureAggregation, key_book, secure_sum
from flower_app.strategies.base import SUMMED_SENDER, RoundStrategy
from flower_app.strategies.discovery import CohortMap, discover_cohorts
from flower_app.strategies.errors import AllRepliesRejectedError, InitialArraysError
from flower_app.strategies.replies import CheckedReplies, check_replies, int_metric
from flower_app.strategies.round_rows import warn_fixed_length
from flower_app.strategies.sampling import sample_nodes
from flower_app.strategies.submodular_records import (
    build_matroid,
    check_common,
    checkpointed_server,
    decode_int_report,
    matroid_entries,
    named_record,
    positional_record,
    reply_parts,
    report_arrays,
    reported_n_elements,
    resolve_m,
    train_message,
)

__all__ = ["FedDiscreteGreedyStrategy"]

RoundCallback = Callable[[dict[str, Any]], None]


class FedDiscreteGreedyStrategy(RoundStrategy):
    """Federated discrete greedy with importance factors (Algs. 4/5, then Alg. 3).

    Setup (two exchanges, Algs. 4/5): every node sends Σ_i O_i over its users (O_i =
    (f_i({j}))_j: ratings or memberships), the server broadcasts the sum O, every node
    computes its users' w_i locally, keeps O in its ``context.state`` and reports only
    Σ_i κ_i (the expected participants). Then one greedy round per element: the server
    sends S; each user participates with probability κ_i = min(1, κ w_i) and sends its
    marginal gains / κ_i (fixed point, 2^-20 units); the server adds the argmax.

    **The protocol fixes its length**: it runs k rounds (k − ``|S₀|`` with a starting set
    S₀ in ``initial_arrays``), whatever ``num_rounds`` of
    :meth:`~flower_app.strategies.RoundStrategy.start` says; a different ``num_rounds`` is
    logged as not used. Message contract: the table of
    :mod:`flower_app.strategies.fedcg`.

    Parameters
    ----------
    k : int, optional
        Elements to select (default 10): the number of greedy rounds; with ``groups``,
        also the default capacity of each block.
    groups : sequence of int, optional
        Block of every element (length m): a partition matroid.
    capacities : int, sequence or mapping, optional
        Block capacities (see ``flower_app.strategies.submodular_records.build_matroid``).
    kappa : float, optional
        κ > 0 of Alg. 3 (default 50): larger asks more users per round.
    min_available_nodes : int, optional
        Plain mode: least connected nodes before setup (default 2). Every node connected
        then is a client of the whole run (Alg. 3 asks all users each round).
    seed : int, optional
        Seeds the users' coins ``default_rng([seed, round, user_id])``.
    cohorts : bool, optional
        Cohort mode (default False: plain mode).
    server : DiscreteGreedyServer, optional
        Cohort mode's prebuilt server state (required with ``cohorts=True``; the
        hyperparameters above are then not used).
    objective_fn : callable, optional
        ``objective_fn(selected) -> float``: the true F(S), recorded per round (oracle).
    discovery_timeout : float, optional
        Cohort mode: seconds to wait for all nodes (default 300).
    on_round : callable, optional
        Receives each round's row.
    min_reply_fraction : float, optional
        Least fraction of a round's clients whose replies must arrive and be accepted, else
        the run stops with ``TooFewRepliesError`` (default 0.0: aggregate what came; the
        failed nodes are recorded per round).

    Notes
    -----
    Cohort mode: a histogram must come from every node (O is a sum over all users): a
    missing or bad histogram stops the run before the first greedy round. Plain mode: a
    node whose histogram or importance reply is bad is left out of the run (O sums over
    the clients that answered). Later bad replies are counted in ``bad-replies``.
    """

    supports_secure_aggregation = True
    secure_public_metrics = ("n-elements",)

    def __init__(
        self,
        k: int = 10,
        groups: Sequence[int] | np.ndarray | None = None,
        capacities: int | Sequence[int] | Mapping[int, int] | None = None,
        kappa: float = 50.0,
        min_available_nodes: int = 2,
        seed: int = 0,
        cohorts: bool = False,
        server: DiscreteGreedyServer | None = None,
        objective_fn: Callable[[list[int]], float] | None = None,
        discovery_timeout: float = 300.0,
        on_round: RoundCallback | None = None,
        min_reply_fraction: float = 0.0,
        secure_aggregation: SecureAggregation | None = None,
    ) -> None:
        super().__init__(
            on_round=on_round,
            min_reply_fraction=min_reply_fraction,
            secure_aggregation=secure_aggregation,
        )
        check_common(cohorts, server, k, seed, min_available_nodes)
        if server is None:
            if not np.isfinite(kappa) or kappa <= 0:
                raise ValueError(f"kappa={kappa!r} must be positive")
        else:
            k, kappa, seed = server.k, server.kappa, server.seed
        self.cohort_mode = bool(cohorts)
        self.server: DiscreteGreedyServer | None = server
        self.k, self.groups, self.capacities = int(k), groups, capacities
        self.kappa, self.seed = float(kappa), int(seed)
        self.min_available_nodes = int(min_available_nodes)
        self.objective_fn = objective_fn
        self.discovery_timeout = float(discovery_timeout)
        self.cohorts: CohortMap | None = None
        self.protocol_bytes = 0
        self._nodes: list[int] = []
        self._bytes_down = 0
        # cohort mode checkpoints its server state after every round; on resume the nodes
        # get their importance factors again (setup), then S so far is restored
        self.resumable = self.cohort_mode
        log(INFO, "FedDiscreteGreedyStrategy runs k=%d greedy rounds (Alg. 3)", self.k)

    def checkpoint_state(self) -> dict[str, Any]:
        """Return the cohort-mode server state (S so far, O, the server's generator)."""
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
        log(
            INFO,
            "FedDiscreteGreedyStrategy(%s mode): %s, k=%d rounds, kappa=%g, seed=%d",
            "cohort" if self.cohort_mode else "plain",
            self.server.matroid if self.server is not None else f"k={self.k}",
            self.k,
            self.kappa,
            self.seed,
        )

    @property
    def _m(self) -> int:
        assert self.server is not None
        return self.server.matroid.n_elements

    # ------------------------------------------------------------------ setup
    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Discovery (cohort mode) or the node set (plain), then Algs. 4/5; return k − ``|S₀|``.

        ``initial_arrays`` is empty (S starts empty) or has ``"selected"`` int64: S₀.
        """
        keys = set(arrays)
        if not keys <= {"selected"}:
            raise InitialArraysError(
                f"initial_arrays has keys {sorted(keys)}; expected none or 'selected' int64"
            )
        start = np.asarray(arrays["selected"].numpy()) if keys else np.zeros(0, np.int64)
        if start.ndim != 1 or (start.size and start.dtype.kind not in "iu"):
            raise InitialArraysError("initial_arrays['selected'] must be a 1-D int vector")
        if self.cohort_mode:
            assert self.server is not None
            self.cohorts = discover_cohorts(
                grid, self.server.n_users, self._m, timeout=self.discovery_timeout
            )
            self.importance_protocol(grid, self.exchange_timeout)
        else:
            self._plain_importance(grid)
        self._start_at(start)
        rounds = self.k - len(self.server.selected)  # type: ignore[union-attr]
        warn_fixed_length(
            "FedDiscreteGreedy", num_rounds, rounds, "one greedy round per element, k in all"
        )
        return rounds

    def _start_at(self, start: np.ndarray) -> None:
        server = self.server
        assert server is not None
        chosen = [int(e) for e in start]
        if chosen and (
            min(chosen) < 0
            or max(chosen) >= self._m
            or not server.matroid.is_independent(chosen)
            or len(chosen) > server.k
        ):
            raise InitialArraysError(
                f"initial_arrays['selected'] = {chosen} is not an independent set of at most "
                f"k={server.k} of the {self._m} elements"
            )
        if chosen:
            server.selected = chosen

    def _send(
        self, grid: Grid, nodes: Iterable[int], arrays: ArrayRecord, cfg: ConfigRecord, action: str
    ) -> list[Message]:
        msgs = [train_message(n, arrays, cfg, action) for n in nodes]
        self._bytes_down = sum(m.content.array_records["arrays"].count_bytes() for m in msgs)
        self.protocol_bytes += self._bytes_down
        if self.secure_aggregation is not None:
            return self._secure_send(grid, msgs, action)
        return self.send(grid, msgs)

    def _secure_send(self, grid: Grid, msgs: list[Message], action: str) -> list[Message]:
        """Run an importance exchange (Algs. 4/5) as a secure sum; return its one reply.

        The reply comes "from" :data:`SUMMED_SENDER`; ``self.summed_nodes`` says whose
        replies are in it. A node that failed is left out (the histogram must cover every
        user in cohort mode: the caller then stops).
        """
        assert self.secure_aggregation is not None
        outcome = secure_sum(
            lambda m: self.send(grid, m), msgs, self.secure_aggregation,
            0, self.secure_public_metrics,
            keys=key_book(grid),
        )  # fmt: skip
        self.protocol_bytes += int(outcome.cost.get("secagg-bytes-up", 0))
        self.summed_nodes = list(outcome.survivors)
        self._secure_failed = dict(outcome.failed)
        self._expected = {SUMMED_SENDER}
        if outcome.content is None or outcome.template is None:
            return []
        reply = Message(outcome.content, reply_to=outcome.template)
        reply.metadata.__dict__["_src_node_id"] = SUMMED_SENDER
        return [reply]

    def _decode_histogram(self, src: int, reply: Message, m: int | None) -> tuple:
        record, metrics, nbytes = reply_parts(reply)
        parts = report_arrays(record)
        if m is None:  # m is only a claim until the majority fixes it: densify after that
            m_reply = reported_n_elements(metrics)
            check_report(parts, m_reply)
            vec: np.ndarray | list[np.ndarray] = parts
        else:
            m_reply, vec = m, decode_report(parts, m)
        return vec, int_metric(metrics, "num-examples"), nbytes, m_reply

    def _check_protocol(
        self, replies: list[Message], decode: Any, nodes: list[int]
    ) -> CheckedReplies:
        """Check an importance exchange's replies (one summed reply under SecAgg)."""
        if self.secure_aggregation is None:
            return self.check(replies, decode, "importance factors", all_rejected_fails=False)
        checked = check_replies(replies, decode, {SUMMED_SENDER}, "importance factors")
        checked.failed = dict(self._secure_failed)
        checked.bad += len(self._secure_failed)
        if self._secure_failed and checked.first_error is None:
            node, reason = sorted(self._secure_failed.items())[0]
            checked.first_error = f"node {node}: {reason}"
        return checked

    def refresh_nodes(self, grid: Grid) -> None:
        """Do not re-discover: a rejoining node has lost its importance factors.

        Every node keeps the factors of Algs. 4/5 in its own state; a node that rejoins
        under a new id would answer every round with an error.
        """

    def importance_protocol(self, grid: Grid, timeout: float) -> None:
        """Cohort mode: the two exchanges of Algs. 4/5 over all nodes.

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
        self._finish_importance(grid, checked, nodes)

    def _plain_importance(self, grid: Grid) -> None:
        """Plain mode: the node set, m from the histograms, then Algs. 4/5."""
        nodes = sample_nodes(
            grid, random.Random(self.seed), 1.0, self.min_available_nodes,
            self.min_available_nodes, timeout=self.exchange_timeout,
        )  # fmt: skip
        cfg = ConfigRecord({"server-round": 0})
        replies = self._send(grid, nodes, ArrayRecord(), cfg, "histogram")
        checked = self._check_protocol(
            replies, lambda s, r: self._decode_histogram(s, r, None), nodes
        )
        if not checked.accepted:
            raise AllRepliesRejectedError(
                f"importance factors: no usable histogram; first: {checked.first_error}"
            )
        m = resolve_m(checked, lambda value: value[3], "histogram", "importance factors")
        matroid = build_matroid(m, self.k, self.groups, self.capacities)
        self.server = DiscreteGreedyServer(len(nodes), matroid, self.k, self.kappa, seed=self.seed)
        senders = [src for src, _ in checked.accepted]
        if senders == [SUMMED_SENDER]:
            senders = list(self.summed_nodes)
        self._finish_importance(grid, checked, senders)

    def _finish_importance(self, grid: Grid, checked: CheckedReplies, nodes: list[int]) -> None:
        server = self.server
        assert server is not None
        histogram = np.zeros(self._m)
        for _, (vec, _n, nbytes, _m) in checked.accepted:  # arrival order, as the sum
            histogram += vec
            self.protocol_bytes += nbytes
        server.set_histogram(histogram)
        cfg = ConfigRecord({"server-round": 0, "kappa": float(server.kappa)})
        if self.cohort_mode:
            arrays = positional_record(histogram)
        else:
            arrays = named_record(histogram=histogram)

        def decode(src: int, reply: Message) -> tuple[float, int]:
            _, metrics, _ = reply_parts(reply)
            value = float(metrics["expected-participants"])
            users = int_metric(metrics, "num-examples", 1)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"expected participants {value}")
            if value > users:  # Σ_i min(1, κ w_i) over the node's users
                raise ValueError(f"expected participants {value:g} exceed the {users} users")
            return value, users

        replies = self._send(grid, nodes, arrays, cfg, "importance")
        done = self._check_protocol(replies, decode, nodes)
        if not done.accepted:
            raise AllRepliesRejectedError(
                f"importance factors: all replies rejected; first: {done.first_error}"
            )
        server.expected = sum(v for _, (v, _n) in done.accepted)
        accepted = sorted(src for src, _ in done.accepted)
        if accepted == [SUMMED_SENDER]:
            accepted = sorted(self.summed_nodes)
        if self.cohort_mode:
            self._nodes = nodes
        else:  # a client without O in its state cannot take part
            self._nodes = accepted
        log(
            INFO,
            "importance factors: %d nodes, expected participants per round %.1f (bad %d)",
            len(self._nodes),
            server.expected,
            done.left_out,
        )

    # ------------------------------------------------------------------ rounds
    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One ``train.discrete`` message per node (every user may participate)."""
        server = self.server
        if server is None or (self.cohort_mode and self.cohorts is None):
            raise RuntimeError("setup has not run: call start()")
        nodes = [int(n) for n in self.cohorts.node_ids] if self.cohort_mode else self._nodes
        selected = np.asarray(server.selected, dtype=np.int64)
        entries: dict[str, Any] = {"seed": self.seed, "kappa": float(server.kappa)}
        if self.cohort_mode:
            record = positional_record(selected)
        else:
            spec, extra = matroid_entries(server.matroid)
            entries.update(spec)
            record = named_record(selected=selected, **extra)
        cfg = self.merged_config(config, server_round, **entries)
        msgs = [train_message(n, record, cfg, "discrete") for n in nodes]
        self._bytes_down = sum(m.content.array_records["arrays"].count_bytes() for m in msgs)
        self._expected = set(nodes)
        return msgs

    def merge_senders(self, nodes: list[int]) -> int:
        """Register a secure sum as one sender (its survivors are ``summed_nodes``)."""
        return SUMMED_SENDER

    def decode_train_reply(self, src: int, reply: Message) -> tuple[np.ndarray, int, int]:
        """Decode one fixed-point report: ``(vector, participants, bytes)``."""
        record, metrics, nbytes = reply_parts(reply)
        if not self.cohort_mode and reported_n_elements(metrics) != self._m:
            raise ValueError(f"reply for m={metrics['n-elements']}; the run has m={self._m}")
        vec = decode_int_report(report_arrays(record), self._m)
        count = int_metric(metrics, "participants")
        if count < 0 or count > int_metric(metrics, "num-examples", 1):
            raise ValueError(f"{count} participants")
        return vec, count, nbytes

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sum the valid fixed-point reports and add the best feasible element."""
        server = self.server
        assert server is not None
        total = np.zeros(self._m, dtype=np.int64)
        participants, bytes_up = 0, 0
        for _, (vec, count, nbytes) in checked.accepted:
            total += vec
            participants += count
            bytes_up += nbytes
        rnd = server.select(total, participants)
        values: dict[str, Any] = {
            "element": rnd.element,
            "estimate": rnd.estimate,
            "participants": participants,
            "expected-participants": rnd.expected,
            "nodes": len(self._expected),
            "bytes-down": int(self._bytes_down),
            "bytes-up": bytes_up,
            "bad-replies": checked.left_out,
            "users": participants,
        }
        if self.objective_fn is not None:
            values["objective"] = float(self.objective_fn(list(server.selected)))
        selected = np.asarray(server.selected, dtype=np.int64)
        return named_record(selected=selected), MetricRecord(values)

    def finalize(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return ``{"selected"}``: S in the order it was built."""
        if self.server is None:
            return arrays
        return named_record(selected=np.asarray(self.server.selected, dtype=np.int64))

    def round_summary(self, row: dict[str, Any]) -> str:
        """Return the element added (and F(S) when an oracle is given)."""
        if "element" not in row:
            return ""
        text = f"+element {row.get('element')} participants={row.get('participants', 0)}"
        if "objective" in row:
            text += f"  F(S)={row['objective']:.6g}"
        return text
