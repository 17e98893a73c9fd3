"""FedCGStrategy (FedCG Alg. 1, FedCG+ Alg. 2) and FedDiscreteGreedyStrategy (Algs. 3-5).

Rafiey (ICML 2024), "Decomposable Submodular Maximization in Federated Setting". The math
lives in :mod:`flower_app.algorithms.fedcg` and :mod:`flower_app.algorithms.discrete_greedy`;
this module moves it over Flower's Message API. Both strategies first ask every node which
users it serves (:mod:`flower_app.strategies.discovery`); a node answers for its users with
one sum (what secure aggregation reveals).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_app.algorithms.discrete_greedy import DiscreteGreedyServer
from flower_app.algorithms.fedcg import FedCGServer
from flower_app.strategies.discovery import CohortMap, discover_cohorts
from flower_app.strategies.fedsm import decode_report
from flower_app.strategies.replies import check_replies

__all__ = ["FedCGStrategy", "FedDiscreteGreedyStrategy", "decode_int_report"]

RoundCallback = Callable[[dict[str, Any]], None]
_TOL = 1e-6


def decode_int_report(arrays: list[np.ndarray], n_elements: int) -> np.ndarray:
    """Decode a fixed-point report (``[index, value]`` or ``[value]``, integer values).

    Parameters
    ----------
    arrays : list of numpy.ndarray
        The reply's arrays.
    n_elements : int
        Ground-set size m.

    Returns
    -------
    numpy.ndarray
        Dense int64 vector of length m.

    Raises
    ------
    ValueError
        On wrong shapes or dtypes, ids out of range or repeated, or negative values.
    """
    if len(arrays) == 1:
        value = np.asarray(arrays[0])
        if value.shape != (n_elements,) or value.dtype.kind not in "iu":
            raise ValueError(f"dense report must be integers of shape ({n_elements},)")
        dense = value.astype(np.int64)
    elif len(arrays) == 2:
        index, value = (np.asarray(a) for a in arrays)
        if index.ndim != 1 or value.shape != index.shape or index.dtype.kind not in "iu":
            raise ValueError("sparse report needs 1-D integer ids and values of equal length")
        if value.dtype.kind not in "iu":
            raise ValueError("report values must be fixed-point integers")
        if index.size and (index.min() < 0 or index.max() >= n_elements):
            raise ValueError(f"sparse report has element ids outside 0..{n_elements - 1}")
        if np.unique(index).size != index.size:
            raise ValueError("sparse report repeats element ids")
        dense = np.zeros(n_elements, dtype=np.int64)
        dense[index.astype(np.int64)] = value.astype(np.int64)
    else:
        raise ValueError(f"a report has 1 (dense) or 2 (sparse) arrays, got {len(arrays)}")
    if (dense < 0).any():
        raise ValueError("report values must be non-negative")
    return dense


class _CohortStrategy(Strategy):
    """Shared plumbing: discovery, message building, per-round logging."""

    n_users: int
    n_elements: int
    cohorts: CohortMap | None
    history: list[dict[str, Any]]
    on_round: RoundCallback | None
    discovery_timeout: float

    def _discover(self, grid: Grid) -> None:
        self.cohorts = discover_cohorts(
            grid, self.n_users, self.n_elements, timeout=self.discovery_timeout
        )

    @staticmethod
    def _message(node: int, arrays: list[np.ndarray], config: dict, group: str) -> Message:
        content = RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord(config)})
        return Message(content, dst_node_id=node, message_type=MessageType.TRAIN, group_id=group)

    @staticmethod
    def _reply(reply: Message) -> tuple[list[np.ndarray], MetricRecord, int]:
        if reply.has_error():
            raise ValueError(f"client error: {reply.error.reason}")
        record = reply.content.array_records["arrays"]
        return (
            record.to_numpy_ndarrays(),
            reply.content.metric_records["metrics"],
            int(record.count_bytes()),
        )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Not used: F(S) is evaluated by the server's oracle (``objective_fn``)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Not used (see ``configure_evaluate``)."""
        return None

    def _log(self, row: dict[str, Any], total_rounds: int, what: str) -> None:
        self.history.append(row)
        log(
            INFO,
            "[round %d/%d] %s  users=%d nodes=%d  up=%d B down=%d B  bad=%d  %.2f s",
            row["server-round"],
            total_rounds,
            what,
            row.get("users", 0),
            row.get("nodes", 0),
            row.get("bytes-up", 0),
            row.get("bytes-down", 0),
            row.get("bad-replies", 0),
            row.get("round-time", 0.0),
        )
        if self.on_round is not None:
            self.on_round(row)


class FedCGStrategy(_CohortStrategy):
    """Federated continuous greedy: FedCG (τ = 1, Alg. 1) and FedCG+ (τ > 1, Alg. 2).

    Each round the server picks users by the client sampling scheme (K draws with
    replacement, probability p_i; or everyone with weight p_i), sends x to the nodes that
    serve them, and each user takes τ local continuous-greedy steps from x; a node replies
    with τ · Σ_i c_i Δ_i over its users; the server sets x ← x + η Σ c_i Δ_i / Σ c_i. After
    the last round x is rounded without the objective (Remark 4.4).

    Parameters
    ----------
    server : FedCGServer
        The server state (η, T, τ, sampling, rounding, seed; validated on construction).
    n_users : int
        Users over all nodes (must equal ``server.n_users``).
    objective_fn : callable, optional
        ``objective_fn(x) -> float``: an experiment oracle recorded per round (e.g. the
        mean multilinear value F̂(x)); the algorithm never uses it.
    on_round : callable, optional
        Receives each round's metrics dict.
    round_timeout : float, optional
        Seconds to wait for one round's replies (default 600).
    discovery_timeout : float, optional
        Seconds to wait until the nodes' cohorts cover all users (default 300).
    evaluate_every : int, optional
        Call ``objective_fn`` every this many rounds and after the last (default 1).

    Notes
    -----
    Message contract (see also :mod:`flower_app.clients.continuous`):

    * ``query`` → discovery, as in :class:`~flower_app.strategies.fedsm.FedSMStrategy`.
    * ``train`` → ``"arrays"``: ``"0"`` float64 x (m,), ``"1"`` int64 user ids on that
      node (K_node,), ``"2"`` float64 weights c_i (K_node,); ``"config"``: ``kind`` =
      ``"direction"``, ``server-round``, ``seed``, ``local-steps``, ``gradient``,
      ``gradient-samples``, ``fill-base`` (int). Reply ``"arrays"``: ``"0"`` int32 ids,
      ``"1"`` float64 values (sparse) or ``"0"`` float64 (m,) (dense); ``"metrics"``:
      ``num-examples`` (= K_node), ``weight`` (Σ c_i), ``ids-sent``.

    A reply with an error, a malformed or non-finite report, a weight or user count that
    does not match what was sent, a coordinate above τ·Σ c_i, or a total mass that is not
    that of τ bases (τ r Σ c_i; at most that without base completion) is logged, counted in
    ``bad-replies`` and left out; the step is then normalised by the weight that arrived.
    """

    def __init__(
        self,
        server: FedCGServer,
        n_users: int,
        objective_fn: Callable[[np.ndarray], float] | None = None,
        on_round: RoundCallback | None = None,
        round_timeout: float = 600.0,
        discovery_timeout: float = 300.0,
        evaluate_every: int = 1,
    ) -> None:
        if n_users != server.n_users:
            raise ValueError(f"n_users={n_users} differs from the server's {server.n_users}")
        self.server = server
        self.n_users = int(n_users)
        self.n_elements = server.matroid.n_elements
        self.objective_fn = objective_fn
        self.on_round = on_round
        self.round_timeout = float(round_timeout)
        self.discovery_timeout = float(discovery_timeout)
        self.cohorts = None
        self.history = []
        self.selected: list[int] = []
        self.evaluate_every = max(1, int(evaluate_every))
        self._sent: dict[int, tuple[int, float]] = {}
        self._bytes_down = 0

    def summary(self) -> None:
        """Log the strategy's settings."""
        s = self.server
        log(
            INFO,
            "FedCGStrategy(%s): N=%d users, m=%d, T=%d rounds, eta=%.4g, tau=%d, %s, "
            "gradient=%s, rounding=%s, matroid=%s, seed=%d",
            "FedCG" if s.local.steps == 1 else "FedCG+",
            s.n_users,
            self.n_elements,
            s.rounds,
            s.eta,
            s.local.steps,
            "full participation" if s.full else f"K={s.K} draws",
            s.local.gradient,
            s.rounding,
            s.matroid,
            s.seed,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Pick the round's users and build one ``train`` message per node serving some."""
        if self.cohorts is None:
            raise RuntimeError("discovery has not run: call start()")
        users, weights = self.server.sample()
        local = self.server.local
        cfg = {
            **dict(config),
            "kind": "direction",
            "server-round": server_round,
            "seed": self.server.seed,
            "local-steps": local.steps,
            "gradient": local.gradient,
            "gradient-samples": local.samples,
            "fill-base": int(local.fill_base),
        }
        x = self.server.x.astype(np.float64)
        messages, self._sent, self._bytes_down = [], {}, 0
        for node, node_users in self.cohorts.group(users).items():
            at = np.searchsorted(users, node_users)
            node_weights = weights[at]
            msg = self._message(
                node, [x, node_users.astype(np.int64), node_weights], cfg, str(server_round)
            )
            self._bytes_down += msg.content.array_records["arrays"].count_bytes()
            self._sent[node] = (int(node_users.size), float(node_weights.sum()))
            messages.append(msg)
        return messages

    def _check(self, vec: np.ndarray, metrics: MetricRecord, src: int) -> tuple[int, float]:
        n_sent, w_sent = self._sent.get(src, (None, None))
        n_ex, weight = int(metrics["num-examples"]), float(metrics["weight"])
        if n_ex != n_sent or abs(weight - w_sent) > _TOL * max(1.0, w_sent):
            raise ValueError(f"update for {n_ex} users / weight {weight}, sent {n_sent} / {w_sent}")
        tau, rank = self.server.local.steps, self.server.matroid.rank
        cap = tau * weight
        if vec.max(initial=0.0) > cap * (1 + _TOL):
            raise ValueError(f"a coordinate exceeds τ·Σc = {cap:g}: not a sum of τ vertices")
        mass, full = float(vec.sum()), tau * rank * weight
        if mass > full * (1 + _TOL) + _TOL or (
            self.server.local.fill_base and abs(mass - full) > _TOL * max(1.0, full)
        ):
            raise ValueError(f"total mass {mass:g} is not that of τ bases ({full:g})")
        return n_ex, weight

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sum the valid updates and take the server step."""

        def decode(src: int, reply: Message) -> tuple[np.ndarray, int, float, int, int]:
            arrays, metrics, nbytes = self._reply(reply)
            vec = decode_report(arrays, self.n_elements)
            n_ex, w = self._check(vec, metrics, src)
            return vec, n_ex, w, nbytes, int(metrics.get("ids-sent", 0))

        checked = check_replies(replies, decode, self._sent, f"round {server_round}")
        total, users, weight, bytes_up, ids_sent = np.zeros(self.n_elements), 0, 0.0, 0, 0
        for _, (vec, n_ex, w, nbytes, ids) in checked.accepted:
            total += vec
            users += n_ex
            weight += w
            bytes_up += nbytes
            ids_sent += ids
        rnd = self.server.step(total, weight, users, ids_sent)
        metrics = MetricRecord(
            {
                "users": users,
                "draws": rnd.draws,
                "nodes": len(self._sent),
                "weight": weight,
                "ids-sent": ids_sent,
                "step-mass": rnd.step_norm,
                "bytes-down": self._bytes_down,
                "bytes-up": bytes_up,
                "bad-replies": checked.left_out,
            }
        )
        return ArrayRecord([self.server.x.copy()]), metrics

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run discovery, the T rounds, and the final rounding.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        initial_arrays : ArrayRecord, optional
            Ignored (x starts at 0, as in the paper).
        num_rounds : int, optional
            Must be None or equal to the server's T.
        timeout : float, optional
            Overrides ``round_timeout``.
        train_config : ConfigRecord, optional
            Extra entries for the train messages.
        evaluate_config : ConfigRecord, optional
            Unused (evaluation is the server's oracle).
        evaluate_fn : callable, optional
            Flower-style ``evaluate_fn(round, arrays)`` called with x after each round.

        Returns
        -------
        Result
            ``arrays``: ``"0"`` final x, ``"1"`` the rounded set; per-round metrics in
            ``train_metrics_clientapp``.
        """
        if num_rounds is not None and num_rounds != self.server.rounds:
            raise ValueError(f"num_rounds={num_rounds} differs from T={self.server.rounds}")
        round_timeout = self.round_timeout if timeout is None else float(timeout)
        self.summary()
        t0 = time.perf_counter()
        self._discover(grid)
        result = Result()
        arrays = ArrayRecord([self.server.x.copy()])
        while not self.server.done:
            t = self.server.t + 1
            r0 = time.perf_counter()
            messages = self.configure_train(t, arrays, train_config or ConfigRecord(), grid)
            replies = grid.send_and_receive(messages, timeout=round_timeout)
            arrays, metrics = self.aggregate_train(t, replies)
            row: dict[str, Any] = {"server-round": t, **dict(metrics)}
            if self.objective_fn is not None and (
                t % self.evaluate_every == 0 or t == self.server.rounds
            ):
                row["multilinear"] = float(self.objective_fn(self.server.x))
            if evaluate_fn is not None:
                res = evaluate_fn(t, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[t] = res
            row["round-time"] = time.perf_counter() - r0
            row["wall-time"] = time.perf_counter() - t0
            result.train_metrics_clientapp[t] = metrics
            what = f"F^(x)={row['multilinear']:.6g}" if "multilinear" in row else ""
            self._log(row, self.server.rounds, what)
        self.selected = self.server.round_solution()
        result.arrays = ArrayRecord(
            [self.server.x.copy(), np.asarray(self.selected, dtype=np.int64)]
        )
        return result


class FedDiscreteGreedyStrategy(_CohortStrategy):
    """Federated discrete greedy with importance factors (Algs. 4/5, then Alg. 3).

    Two protocol rounds compute the importance factors: every node sends Σ_i O_i over its
    users (ratings or memberships), the server broadcasts the sum O, every node computes
    its users' w_i locally, keeps O in its ``context.state`` and reports only Σ_i κ_i
    (the expected participants). Then k greedy rounds: the server sends S to every node;
    each user participates with probability κ_i = min(1, κ w_i) and sends its marginal
    gains / κ_i (fixed point, 2^-20 units); the server adds the argmax.

    Parameters
    ----------
    server : DiscreteGreedyServer
        The server state (k, κ, seed, matroid).
    objective_fn : callable, optional
        ``objective_fn(selected) -> float``: the true F(S), recorded per round (oracle).
    on_round : callable, optional
        Receives each round's metrics dict.
    round_timeout : float, optional
        Seconds to wait for one round's replies (default 600).
    discovery_timeout : float, optional
        Seconds to wait for all nodes (default 300).

    Notes
    -----
    Message contract (all ``train``; ``"config"`` carries ``kind``):

    * ``kind="histogram"``: no arrays. Reply ``"arrays"`` ``"0"`` float64 (m,) = Σ_i O_i;
      ``"metrics"`` ``num-examples`` (= cohort size).
    * ``kind="importance"``: ``"arrays"`` ``"0"`` float64 O (m,); config ``kappa``. Reply
      ``"metrics"`` ``expected-participants``, ``max-w``, ``num-examples``.
    * ``kind="discrete"``: ``"arrays"`` ``"0"`` int64 S; config ``server-round``, ``seed``,
      ``kappa``. Reply ``"arrays"`` ``"0"`` int32 ids, ``"1"`` int64 fixed-point sums
      (sparse) or ``"0"`` int64 (m,); ``"metrics"`` ``participants``, ``num-examples``.

    A histogram must come from every node (O is a sum over all users): a missing or bad
    histogram stops the run before the first greedy round with a clear error. Later bad
    replies are counted in ``bad-replies`` and left out.
    """

    def __init__(
        self,
        server: DiscreteGreedyServer,
        objective_fn: Callable[[list[int]], float] | None = None,
        on_round: RoundCallback | None = None,
        round_timeout: float = 600.0,
        discovery_timeout: float = 300.0,
    ) -> None:
        self.server = server
        self.n_users = int(server.n_users)
        self.n_elements = server.matroid.n_elements
        self.objective_fn = objective_fn
        self.on_round = on_round
        self.round_timeout = float(round_timeout)
        self.discovery_timeout = float(discovery_timeout)
        self.cohorts = None
        self.history = []
        self.protocol_bytes = 0

    def summary(self) -> None:
        """Log the strategy's settings."""
        s = self.server
        log(
            INFO,
            "FedDiscreteGreedyStrategy: N=%d users, m=%d, k=%d, kappa=%g, matroid=%s, seed=%d",
            s.n_users,
            self.n_elements,
            s.k,
            s.kappa,
            s.matroid,
            s.seed,
        )

    def _broadcast(
        self, grid: Grid, arrays: list[np.ndarray], cfg: dict, group: str, timeout: float
    ) -> list[Message]:
        assert self.cohorts is not None
        msgs = [self._message(int(n), arrays, cfg, group) for n in self.cohorts.node_ids]
        self._bytes_down = sum(m.content.array_records["arrays"].count_bytes() for m in msgs)
        self.protocol_bytes += self._bytes_down
        return list(grid.send_and_receive(msgs, timeout=timeout))

    def importance_protocol(self, grid: Grid, timeout: float) -> None:
        """Run the two rounds of Algs. 4/5; set the histogram and the expected participation.

        Raises
        ------
        RuntimeError
            If a node's histogram is missing or malformed (O would be wrong for everyone).
        """
        assert self.cohorts is not None
        counts = dict(
            zip((int(n) for n in self.cohorts.node_ids), self.cohorts.counts, strict=True)
        )
        histogram, seen = np.zeros(self.n_elements), set()
        for reply in self._broadcast(grid, [], {"kind": "histogram"}, "histogram", timeout):
            src = int(reply.metadata.src_node_id)
            try:
                arrays, metrics, nbytes = self._reply(reply)
                vec = decode_report(arrays, self.n_elements)
                if int(metrics["num-examples"]) != counts.get(src):
                    raise ValueError("histogram over the wrong number of users")
            except (ValueError, KeyError, TypeError) as err:
                raise RuntimeError(
                    f"importance factors (Alg. 4/5): node {src} sent no valid histogram ({err}); "
                    "the histogram must sum over all users, so the run stops here"
                ) from err
            histogram += vec
            seen.add(src)
            self.protocol_bytes += nbytes
        if len(seen) != len(counts):
            raise RuntimeError(
                f"importance factors: only {len(seen)} of {len(counts)} nodes sent a histogram"
            )
        self.server.set_histogram(histogram)
        cfg = {"kind": "importance", "kappa": float(self.server.kappa)}

        def decode(src: int, reply: Message) -> float:
            _, metrics, _ = self._reply(reply)
            value = float(metrics["expected-participants"])
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"expected participants {value}")
            return value

        replies = self._broadcast(grid, [histogram], cfg, "importance", timeout)
        checked = check_replies(replies, decode, counts, "importance")
        expected, bad = sum(v for _, v in checked.accepted), checked.left_out
        self.server.expected = expected
        log(
            INFO, "importance factors: expected participants per round %.1f (bad %d)", expected, bad
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sum the valid fixed-point reports and add the best feasible element."""
        assert self.cohorts is not None

        def decode(src: int, reply: Message) -> tuple[np.ndarray, int, int]:
            arrays, metrics, nbytes = self._reply(reply)
            vec = decode_int_report(arrays, self.n_elements)
            count = int(metrics["participants"])
            if count < 0 or count > int(metrics["num-examples"]):
                raise ValueError(f"{count} participants")
            return vec, count, nbytes

        nodes = {int(n) for n in self.cohorts.node_ids}
        checked = check_replies(replies, decode, nodes, f"round {server_round}")
        total = np.zeros(self.n_elements, dtype=np.int64)
        participants, bytes_up = 0, 0
        for _, (vec, count, nbytes) in checked.accepted:
            total += vec
            participants += count
            bytes_up += nbytes
        rnd = self.server.select(total, participants)
        metrics = MetricRecord(
            {
                "element": rnd.element,
                "estimate": rnd.estimate,
                "participants": participants,
                "expected-participants": rnd.expected,
                "nodes": len(self.cohorts.node_ids),
                "bytes-down": self._bytes_down,
                "bytes-up": bytes_up,
                "bad-replies": checked.left_out,
            }
        )
        return ArrayRecord([np.asarray(self.server.selected, dtype=np.int64)]), metrics

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Build one ``discrete`` message per node (every user may participate)."""
        assert self.cohorts is not None
        cfg = {
            **dict(config),
            "kind": "discrete",
            "server-round": server_round,
            "seed": self.server.seed,
            "kappa": float(self.server.kappa),
        }
        selected = np.asarray(self.server.selected, dtype=np.int64)
        msgs = [
            self._message(int(n), [selected], cfg, str(server_round)) for n in self.cohorts.node_ids
        ]
        self._bytes_down = sum(m.content.array_records["arrays"].count_bytes() for m in msgs)
        return msgs

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run discovery, the importance protocol and the k greedy rounds.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        initial_arrays : ArrayRecord, optional
            Ignored (S starts empty).
        num_rounds : int, optional
            Must be None or equal to k.
        timeout : float, optional
            Overrides ``round_timeout``.
        train_config : ConfigRecord, optional
            Extra entries for the greedy rounds' messages.
        evaluate_config : ConfigRecord, optional
            Unused.
        evaluate_fn : callable, optional
            Flower-style ``evaluate_fn(round, arrays)`` called with S after each round.

        Returns
        -------
        Result
            ``arrays["0"]``: the selected set in order; per-round metrics in
            ``train_metrics_clientapp``.
        """
        if num_rounds is not None and num_rounds != self.server.k:
            raise ValueError(f"num_rounds={num_rounds} differs from k={self.server.k}")
        round_timeout = self.round_timeout if timeout is None else float(timeout)
        self.summary()
        t0 = time.perf_counter()
        self._discover(grid)
        self.importance_protocol(grid, round_timeout)
        result = Result()
        arrays = ArrayRecord([np.zeros(0, dtype=np.int64)])
        while not self.server.done:
            t = len(self.server.selected) + 1
            r0 = time.perf_counter()
            messages = self.configure_train(t, arrays, train_config or ConfigRecord(), grid)
            replies = grid.send_and_receive(messages, timeout=round_timeout)
            arrays, metrics = self.aggregate_train(t, replies)
            row: dict[str, Any] = {"server-round": t, **dict(metrics)}
            if self.objective_fn is not None:
                row["objective"] = float(self.objective_fn(list(self.server.selected)))
            if evaluate_fn is not None:
                res = evaluate_fn(t, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[t] = res
            row["users"] = row["participants"]
            row["round-time"] = time.perf_counter() - r0
            row["wall-time"] = time.perf_counter() - t0
            result.train_metrics_clientapp[t] = metrics
            what = f"+element {row['element']}" + (
                f" F(S)={row['objective']:.6g}" if "objective" in row else ""
            )
            self._log(row, self.server.k, what)
        result.arrays = arrays
        return result
