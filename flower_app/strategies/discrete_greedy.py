"""FedDiscreteGreedyStrategy: the federated discrete greedy with importance factors.

Rafiey (ICML 2024), "Decomposable Submodular Maximization in Federated Setting", Algs. 3-5.
The math lives in :mod:`flower_app.algorithms.fedcg.discrete_greedy`; the message contract is the
table of :mod:`flower_app.strategies.fedcg` (rows ``train.histogram``, ``train.importance``,
``train.discrete``). :class:`DiscreteGreedyRounds` is what the public strategy and the
runners' :class:`~flower_app.strategies.cohort.discrete_greedy.DiscreteGreedyCohorts` share:
the importance exchanges (Algs. 4/5, in the clear or as secure sums), the greedy rounds'
messages and the server step.
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
from flower_app.strategies.errors import AllRepliesRejectedError, InitialArraysError
from flower_app.strategies.records import merged_config
from flower_app.strategies.replies import CheckedReplies, check_replies, int_metric
from flower_app.strategies.round_rows import warn_fixed_length
from flower_app.strategies.sampling import sample_nodes
from flower_app.strategies.submodular_records import (
    build_matroid,
    check_common,
    decode_int_report,
    matroid_entries,
    named_record,
    reply_parts,
    report_arrays,
    reported_n_elements,
    resolve_m,
    train_message,
)

__all__ = ["DiscreteGreedyRounds", "FedDiscreteGreedyStrategy", "initial_selected"]


def initial_selected(arrays: ArrayRecord) -> np.ndarray:
    """Return S₀ of ``initial_arrays``: empty, or ``"selected"`` int64.

    Raises
    ------
    InitialArraysError
        On other keys, or a ``"selected"`` that is not a 1-D integer vector.
    """
    keys = set(arrays)
    if not keys <= {"selected"}:
        raise InitialArraysError(
            f"initial_arrays has keys {sorted(keys)}; expected none or 'selected' int64"
        )
    start = np.asarray(arrays["selected"].numpy()) if keys else np.zeros(0, np.int64)
    if start.ndim != 1 or (start.size and start.dtype.kind not in "iu"):
        raise InitialArraysError("initial_arrays['selected'] must be a 1-D int vector")
    return start


class DiscreteGreedyRounds:
    """The discrete greedy's exchanges, shared by the public and the cohort strategy.

    A mixin for a :class:`~flower_app.strategies.base.RoundStrategy`: the importance
    exchanges of Algs. 4/5 (in the clear, or as secure sums), S₀, the greedy round's
    messages, its replies and the server step. The two strategies differ in whom they ask
    and in the arrays' names (``_record``, ``_round_request``).
    """

    k: int
    seed: int
    server: DiscreteGreedyServer | None
    summed_nodes: list[int]
    _expected: set[int]
    #: ``objective_fn(selected) -> float``: the true F(S), recorded per round (an oracle)
    objective_fn: Callable[[list[int]], float] | None = None

    def _init_protocol_state(self) -> None:
        #: bytes of the importance exchanges (Algs. 4/5) up and down
        self.protocol_bytes = 0
        self._nodes: list[int] = []
        self._bytes_down = 0
        self._secure_failed: dict[int, str] = {}

    def _record(self, **arrays: np.ndarray) -> ArrayRecord:
        """Return a request's arrays (named for plain nodes, by position for cohorts)."""
        raise NotImplementedError

    def _round_request(self, selected: np.ndarray) -> tuple[ArrayRecord, dict[str, Any]]:
        """Return a greedy round's arrays (S) and config entries besides seed and κ."""
        raise NotImplementedError

    def _round_nodes(self) -> list[int]:
        """Return the nodes of a greedy round (RuntimeError before ``setup``)."""
        raise NotImplementedError

    @property
    def _m(self) -> int:
        assert self.server is not None
        return self.server.matroid.n_elements

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

    def _finish_importance(
        self, grid: Grid, checked: CheckedReplies, nodes: list[int]
    ) -> tuple[list[int], int]:
        """Sum the histograms into O and send it to ``nodes`` (Alg. 5).

        Returns the nodes that took O and the replies left out.

        Raises
        ------
        AllRepliesRejectedError
            If no node accepted O.
        """
        server = self.server
        assert server is not None
        histogram = np.zeros(self._m)
        for _, (vec, _n, nbytes, _m) in checked.accepted:  # arrival order, as the sum
            histogram += vec
            self.protocol_bytes += nbytes
        server.set_histogram(histogram)
        cfg = ConfigRecord({"server-round": 0, "kappa": float(server.kappa)})
        arrays = self._record(histogram=histogram)

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
        return accepted, done.left_out

    def _log_importance(self, left_out: int) -> None:
        assert self.server is not None
        log(INFO, "importance factors: %d nodes, expected participants per round %.1f (bad %d)",
            len(self._nodes), self.server.expected, left_out)  # fmt: skip

    def _rounds_after(self, start: np.ndarray, num_rounds: int) -> int:
        r"""Start S at S₀; return the greedy rounds left, k − \|S₀\|."""
        self._start_at(start)
        assert self.server is not None
        rounds = self.k - len(self.server.selected)
        warn_fixed_length(
            "FedDiscreteGreedy", num_rounds, rounds, "one greedy round per element, k in all"
        )
        return rounds

    # ------------------------------------------------------------------ rounds
    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One ``train.discrete`` message per node (every user may participate)."""
        nodes = self._round_nodes()
        server = self.server
        assert server is not None
        selected = np.asarray(server.selected, dtype=np.int64)
        record, extra = self._round_request(selected)
        entries: dict[str, Any] = {"seed": self.seed, "kappa": float(server.kappa), **extra}
        cfg = merged_config(config, server_round, **entries)
        msgs = [train_message(n, record, cfg, "discrete") for n in nodes]
        self._bytes_down = sum(m.content.array_records["arrays"].count_bytes() for m in msgs)
        self._expected = set(nodes)
        return msgs

    def merge_senders(self, nodes: list[int]) -> int:
        """Register a secure sum as one sender (its survivors are ``summed_nodes``)."""
        return SUMMED_SENDER

    def _decode_greedy(self, record: ArrayRecord, metrics: MetricRecord, nbytes: int) -> tuple:
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
        reports = [(vec, count) for _, (vec, count, _) in checked.accepted]
        total, participants, _ = server.accept(reports)  # overflow-checked, bounded per node
        bytes_up = sum(nbytes for _, (_, _, nbytes) in checked.accepted)
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
            **rnd.checks,
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


class FedDiscreteGreedyStrategy(DiscreteGreedyRounds, RoundStrategy):
    """Federated discrete greedy with importance factors (Algs. 4/5, then Alg. 3).

    Setup (two exchanges, Algs. 4/5): every node sends its O_i = (f_i({j}))_j (ratings or
    memberships), the server broadcasts the sum O, every node computes its w_i locally,
    keeps O in its ``context.state`` and reports only κ_i (its expected participation).
    Then one greedy round per element: the server sends S; each client participates with
    probability κ_i = min(1, κ w_i) and sends its marginal gains / κ_i (fixed point, 2^-20
    units); the server adds the argmax.

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
        κ > 0 of Alg. 3 (default 50): larger asks more clients per round.
    min_available_nodes : int, optional
        Least connected nodes before setup (default 2). Every node connected then is a
        client of the whole run (Alg. 3 asks all clients each round).
    seed : int, optional
        Seeds the clients' coins ``default_rng([seed, round, user_id])``.
    secure_aggregation : SecureAggregation, optional
        Sum the histograms, the expected participations and every round's reports with
        secure aggregation (:mod:`flower_app.privacy`); default None.
    report_bound : float, optional
        The clients' declared range λ (e.g. the top rating; 1 for coverage). With it a
        report above participants · max(λ, O_e/κ) on an element is refused
        (``refused-range``); without it (default) only a report that would wrap the int64
        sum around is (``refused-overflow``, always checked).

    Notes
    -----
    A node whose histogram or importance reply is bad is left out of the run (O sums over
    the clients that answered). Later bad replies are counted in ``bad-replies``; reports
    the sum refuses
    (:meth:`~flower_app.algorithms.fedcg.discrete_greedy.DiscreteGreedyServer.accept`) in
    ``reports-refused`` and ``refused-<reason>``.
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
        *,
        secure_aggregation: SecureAggregation | None = None,
        report_bound: float | None = None,
    ) -> None:
        super().__init__(secure_aggregation=secure_aggregation)
        check_common(k, seed, min_available_nodes)
        if report_bound is not None and not (np.isfinite(report_bound) and report_bound > 0):
            raise ValueError(f"report_bound={report_bound!r} must be positive")
        self.report_bound = report_bound
        if not np.isfinite(kappa) or kappa <= 0:
            raise ValueError(f"kappa={kappa!r} must be positive")
        self.server: DiscreteGreedyServer | None = None
        self.k, self.groups, self.capacities = int(k), groups, capacities
        self.kappa, self.seed = float(kappa), int(seed)
        self.min_available_nodes = int(min_available_nodes)
        self._init_protocol_state()
        log(INFO, "FedDiscreteGreedyStrategy runs k=%d greedy rounds (Alg. 3)", self.k)

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "FedDiscreteGreedyStrategy: %s, k=%d rounds, kappa=%g, seed=%d",
            self.server.matroid if self.server is not None else f"k={self.k}",
            self.k,
            self.kappa,
            self.seed,
        )

    def _record(self, **arrays: np.ndarray) -> ArrayRecord:
        return named_record(**arrays)

    def _round_request(self, selected: np.ndarray) -> tuple[ArrayRecord, dict[str, Any]]:
        assert self.server is not None
        spec, extra = matroid_entries(self.server.matroid)
        return named_record(selected=selected, **extra), spec

    def _round_nodes(self) -> list[int]:
        if self.server is None:
            raise RuntimeError("setup has not run: call start()")
        return self._nodes

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Find the nodes, m from the histograms, then Algs. 4/5; return k − ``|S₀|``.

        ``initial_arrays`` is empty (S starts empty) or has ``"selected"`` int64: S₀.
        """
        start = initial_selected(arrays)
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
        self.server = DiscreteGreedyServer(
            len(nodes), matroid, self.k, self.kappa, seed=self.seed,
            report_bound=self.report_bound,
        )  # fmt: skip
        senders = [src for src, _ in checked.accepted]
        if senders == [SUMMED_SENDER]:
            senders = list(self.summed_nodes)
        # a client without O in its state cannot take part
        self._nodes, left_out = self._finish_importance(grid, checked, senders)
        self._log_importance(left_out)
        return self._rounds_after(start, num_rounds)

    def decode_train_reply(self, src: int, reply: Message) -> tuple[np.ndarray, int, int]:
        """Decode one fixed-point report: ``(vector, participants, bytes)``."""
        record, metrics, nbytes = reply_parts(reply)
        if reported_n_elements(metrics) != self._m:
            raise ValueError(f"reply for m={metrics['n-elements']}; the run has m={self._m}")
        return self._decode_greedy(record, metrics, nbytes)
