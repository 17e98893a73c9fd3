"""MaxFLStrategy and the baselines of the MaxFL paper over Flower's Message API.

Cho, Jhunjhunwala, Li, Smith & Joshi (TMLR 2024), "Maximizing Global Model Appeal in
Federated Learning", Algorithm 1, with appeal-based flexible participation (Section 3),
seen and unseen clients and the metrics of Section 5. The math lives in
:mod:`flower_app.algorithms.maxfl` (server step), :mod:`flower_app.algorithms.learning`
(clients) and :mod:`flower_app.algorithms.appeal` (the round protocol, shared with the
direct engine); this module moves it over the grid.

Why the baselines are not Flower's own ``FedAvg`` / ``FedProx`` / ``QFedAvg``: those sample
*nodes* with Python's global ``random`` and treat a node as one client. Here a node serves a
cohort of clients (DESIGN principle 3), the server samples *clients* with its own seeded
generator (so both engines draw the same clients), samples only from the opt-in pool after
the mandatory rounds, and evaluates seen and unseen clients separately; none of this fits
their ``configure_*`` / ``aggregate_*``. Their server math does fit and is reused in
spirit: FedAvg's average (with uniform client weights) and q-FedAvg's
``compute_delta_and_h`` are re-implemented without Flower in
:mod:`flower_app.algorithms.fl_baselines`, and tests check them against Flower's
functions. FedProx is FedAvg's server with μ passed to the clients, as in Flower. MW-Fed
(Blum et al. 2021) has no Flower counterpart: its multiplicative weights live in
:mod:`flower_app.algorithms.fl_baselines` and :class:`~flower_app.algorithms.appeal.AppealServer`,
and each node receives its clients' relative weights in the train config (``mw-share``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_app.algorithms.appeal import AppealServer, TrainOutcome, run_protocol
from flower_app.algorithms.maxfl import Q_MAX
from flower_app.algorithms.participation import ParticipationSampler
from flower_app.strategies.discovery import CohortMap, discover_cohorts
from flower_app.strategies.replies import check_replies

__all__ = ["AppealStrategy", "MaxFLStrategy", "ReplyError", "decode_train_reply"]

RoundCallback = Callable[[dict[str, Any]], None]

#: train-config keys that hold one value per sampled client (sliced per node)
PER_USER_KEYS = ("mw-share",)


class ReplyError(ValueError):
    """A client reply that cannot be aggregated (it is counted and left out)."""


def decode_train_reply(
    reply: Message, sent_users: list[int], shapes: list[tuple[int, ...]], algorithm: str
) -> tuple[list[np.ndarray], list[float], list[float], float, list[bool]]:
    """Check one node's ``train`` reply; return its arrays, q's, losses, h-sum and met flags.

    Parameters
    ----------
    reply : Message
        The node's reply.
    sent_users : list of int
        The clients the node was asked to train.
    shapes : list of tuple
        Expected array shapes (the model's; twice for SCAFFOLD).
    algorithm : str
        The algorithm (MaxFL checks q_k ∈ [0, 1/4], q-FFL h > 0, MW-Fed needs ``met``).

    Returns
    -------
    tuple
        float64 arrays, q list, loss list, h-sum, met list (MW-Fed; empty otherwise).

    Raises
    ------
    ReplyError
        On an error reply, missing records, other users than sent, a wrong number or shape
        of arrays, or non-finite or out-of-range values.
    """
    if reply.has_error():
        raise ReplyError(f"client error: {reply.error.reason}")
    content = reply.content
    if "arrays" not in content.array_records or "metrics" not in content.metric_records:
        raise ReplyError("reply lacks the 'arrays' ArrayRecord or the 'metrics' MetricRecord")
    metrics = content.metric_records["metrics"]
    try:
        users = [int(u) for u in metrics["users"]]
        qs = [float(q) for q in metrics["q"]]
        losses = [float(v) for v in metrics["loss"]]
        h_sum = float(metrics.get("h-sum", 0.0))
    except (KeyError, TypeError) as err:
        raise ReplyError(f"metrics need lists 'users', 'q', 'loss': {err}") from err
    if users != list(sent_users):
        raise ReplyError(f"reply is for clients {users}, {list(sent_users)} were sent")
    if len(qs) != len(users) or len(losses) != len(users):
        raise ReplyError("'q' and 'loss' need one value per client")
    if not (np.all(np.isfinite(qs)) and np.all(np.isfinite(losses)) and np.isfinite(h_sum)):
        raise ReplyError("non-finite q_k, loss or h")
    if algorithm == "maxfl" and any(q < 0 or q > Q_MAX + 1e-12 for q in qs):
        raise ReplyError(f"q_k must lie in [0, 1/4], got {qs}")
    if algorithm == "qffl" and h_sum <= 0:
        raise ReplyError(f"q-FFL needs h > 0, got {h_sum}")
    met: list[bool] = []
    if algorithm == "mwfed":
        raw = metrics.get("met")
        if not isinstance(raw, list) or len(raw) != len(users):
            raise ReplyError("MW-Fed metrics need 'met': one 0/1 per client")
        if any(isinstance(v, float) or int(v) not in (0, 1) for v in raw):
            raise ReplyError(f"'met' values must be 0 or 1, got {raw}")
        met = [bool(int(v)) for v in raw]
    arrays = content.array_records["arrays"].to_numpy_ndarrays()
    if len(arrays) != len(shapes):
        raise ReplyError(f"{len(arrays)} arrays, expected {len(shapes)}")
    out = []
    for i, (a, shape) in enumerate(zip(arrays, shapes, strict=True)):
        if tuple(a.shape) != tuple(shape):
            raise ReplyError(f"array {i} has shape {a.shape}, the model needs {shape}")
        if a.dtype.kind != "f" or not np.all(np.isfinite(a)):
            raise ReplyError(f"array {i} is not a finite float array")
        out.append(a.astype(np.float64))
    return out, qs, losses, h_sum, met


class AppealStrategy(Strategy):
    """MaxFL or a baseline, with seen/unseen clients and flexible participation.

    Parameters
    ----------
    server : AppealServer
        Server state and step; ``server.algorithm`` names the algorithm.
    sampler : ParticipationSampler
        Draws each round's clients (uniform, K per round, optional opt-in pool).
    n_clients : int
        Seen plus unseen clients over all nodes (checked by discovery).
    num_rounds : int
        Communication rounds T.
    eval_every : int, optional
        Evaluate all clients every this many rounds, and at rounds 0 and T (default 10).
    tuned_final : bool, optional
        At round T also evaluate locally-tuned models (Table 3; default True).
    on_round : callable, optional
        Receives each round's metrics dict (e.g. to append to ``metrics.jsonl``).
    round_timeout : float, optional
        Seconds to wait for one request's replies (default 600).
    discovery_timeout : float, optional
        Seconds to wait until the nodes' cohorts cover all clients (default 300).

    Notes
    -----
    Message contract (the client side is :class:`flower_app.clients.learning.LearningClient`
    behind :mod:`flower_app.clients.adapter`):

    * ``query`` → ``"config"`` ConfigRecord ``{"kind": "cohort"}``; reply ``"properties"``
      ConfigRecord: int ``partition-id``, ``num-partitions``, ``first-user``, ``num-users``,
      ``n-users-total`` (seen + unseen), ``n-elements`` (model parameters).
    * ``train`` → ``"arrays"`` ArrayRecord ``"0".."5"``: the float32 MLP weights
      (``[W1 (64, 784), b1, W2 (30, 64), b2, W3 (C, 30), b3]``; SCAFFOLD appends the server
      control variate c in the same shapes, ``"6".."11"``); ``"config"`` ConfigRecord
      ``server-round`` (int), ``users`` (list of int: the node's sampled clients),
      ``algorithm`` (str); MW-Fed adds ``mw-share`` (list of float, one relative weight
      s_k per client of ``users``). Reply ``"arrays"``: float64 sums over the node's
      clients of q_k Δw_k (MaxFL), Δw_k (FedAvg, FedProx), Δ_k (q-FFL), Δw_k then Δc_k
      (SCAFFOLD) or s_k Δw_k (MW-Fed), Δw_k = w − w_k^(τ), in the model's shapes;
      ``"metrics"`` MetricRecord ``num-examples`` (int), ``users`` (list of int, as sent),
      ``q`` and ``loss`` (list of float, one per client; q_k ∈ [0, 1/4]), ``h-sum``
      (float, q-FFL's Σ h_k); MW-Fed adds ``met`` (list of int 0/1, one per client:
      F_k(w) < ρ_k).
    * ``evaluate`` with ``"config"`` ``kind = "appeal"``, ``users`` (seen clients of the
      node) → reply ``"metrics"`` ``appealing`` (list of int: F_k(w) < ρ_k). Sent to every
      node with seen clients in each round after the mandatory ones (flexible participation).
    * ``evaluate`` with ``kind = "metrics"``, ``server-round``, ``tuned`` (int 0/1) → reply
      ``"metrics"`` with per-group sums (``seen-count``, ``seen-appeal``, ``seen-acc``,
      ``seen-pref-acc``, ... and ``unseen-*``; see the client).

    A train reply with an error, a missing record, other clients than sent, a wrong number
    or shape of arrays, non-finite values, q_k outside [0, 1/4] or (MW-Fed) a missing or
    malformed ``met`` list is logged, counted in
    ``bad-replies`` and left out; the step uses the valid replies only (no step if none).
    A failed appeal reply keeps that node's clients out of the pool; a failed metrics reply
    leaves its clients out of that evaluation (``eval-failed-nodes``).
    """

    def __init__(
        self,
        server: AppealServer,
        sampler: ParticipationSampler,
        n_clients: int,
        num_rounds: int,
        eval_every: int = 10,
        tuned_final: bool = True,
        on_round: RoundCallback | None = None,
        round_timeout: float = 600.0,
        discovery_timeout: float = 300.0,
    ) -> None:
        self.server = server
        self.sampler = sampler
        self.n_clients = int(n_clients)
        self.num_rounds = int(num_rounds)
        self.eval_every = int(eval_every)
        self.tuned_final = bool(tuned_final)
        self.on_round = on_round
        self.round_timeout = float(round_timeout)
        self.discovery_timeout = float(discovery_timeout)
        self.cohorts: CohortMap | None = None
        self.history: list[dict[str, Any]] = []
        self._grid: Grid | None = None
        self._sent: dict[int, list[int]] = {}
        self._bytes_down = 0

    @property
    def algorithm(self) -> str:
        """The algorithm's name."""
        return self.server.algorithm

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the strategy's settings."""
        s = self.sampler
        log(
            INFO,
            "%s: %d seen + %d unseen clients, K=%d per round, T=%d rounds, participation=%s "
            "(mandatory rounds %d), η_g=%s, ε=%s, η_mw=%s, seed=%d",
            type(self).__name__
            if self.algorithm == "maxfl"
            else f"AppealStrategy({self.algorithm})",
            s.n_seen,
            self.n_clients - s.n_seen,
            s.clients_per_round,
            self.num_rounds,
            "flexible" if s.flexible else "all",
            s.mandatory_rounds,
            self.server.server_lr,
            self.server.eps,
            self.server.mw_eta if self.algorithm == "mwfed" else "-",
            s.seed,
        )

    def _messages(
        self,
        users: np.ndarray,
        record: ArrayRecord,
        config: dict[str, Any],
        kind: str,
        rnd: int,
        per_user: dict[str, dict[int, Any]] | None = None,
    ) -> list[Message]:
        if self.cohorts is None:
            raise RuntimeError("discovery has not run: call start()")
        out = []
        self._sent = {}
        for node_id, node_users in self.cohorts.group(np.sort(users)).items():
            self._sent[node_id] = [int(u) for u in node_users]
            node_cfg = {**config, "users": self._sent[node_id]}
            for key, values in (per_user or {}).items():
                node_cfg[key] = [values[u] for u in self._sent[node_id]]
            content = RecordDict({"arrays": record, "config": ConfigRecord(node_cfg)})
            out.append(Message(content, dst_node_id=node_id, message_type=kind, group_id=str(rnd)))
        return out

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Build one ``train`` message per node serving sampled clients.

        ``config`` must hold ``users`` (list of int): the sampled clients; a key of
        :data:`PER_USER_KEYS` (``mw-share``) holds one value per entry of ``users`` and each
        node receives the values of its own clients.
        """
        raw = dict(config)
        users = np.asarray(raw.pop("users"), dtype=np.int64)
        per_user: dict[str, dict[int, Any]] = {}
        for key in PER_USER_KEYS:
            if key in raw:
                values = list(raw.pop(key))
                if len(values) != len(users):
                    raise ValueError(f"'{key}' has {len(values)} values for {len(users)} users")
                per_user[key] = {int(u): v for u, v in zip(users, values, strict=True)}
        cfg = {**raw, "server-round": server_round, "algorithm": self.algorithm}
        messages = self._messages(users, arrays, cfg, MessageType.TRAIN, server_round, per_user)
        self._bytes_down = arrays.count_bytes() * len(messages)
        return messages

    def collect_train(self, server_round: int, replies: Iterable[Message]) -> TrainOutcome:
        """Validate the train replies and sum the valid ones (bad ones are counted)."""

        def decode(src: int, reply: Message) -> tuple:
            decoded = decode_train_reply(reply, self._sent[src], self.server.shapes, self.algorithm)
            return *decoded, reply.content.array_records["arrays"].count_bytes()

        checked = check_replies(replies, decode, self._sent, f"round {server_round}")
        sums: list[np.ndarray] | None = None
        outcome = TrainOutcome(None, 0)
        outcome.bad_replies = checked.left_out
        bytes_up = 0
        for src, (arrays, qs, losses, h, met, nbytes) in checked.accepted:
            sums = arrays if sums is None else [s + a for s, a in zip(sums, arrays, strict=True)]
            outcome.ids += self._sent[src]
            outcome.met += met
            outcome.users += len(qs)
            outcome.q += qs
            outcome.losses += losses
            outcome.h_sum += h
            bytes_up += nbytes
        outcome.sums = sums
        outcome.info = {
            "nodes": len(self._sent),
            "bytes-down": self._bytes_down,
            "bytes-up": bytes_up,
        }
        return outcome

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate, sum and apply the server step; return the new model and metrics."""
        outcome = self.collect_train(server_round, replies)
        step = self.server.step(outcome)
        metrics = MetricRecord(
            {
                "users": outcome.users,
                "bad-replies": outcome.bad_replies,
                "q-mean": float(np.mean(outcome.q)) if outcome.q else 0.0,
                "server-step": float(step["server-step"]),
            }
        )
        if outcome.sums is None:
            return None, metrics
        return ArrayRecord([np.asarray(w) for w in self.server.weights]), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask every node for metric sums over all its clients (``kind`` = metrics)."""
        if self.cohorts is None:
            return []
        cfg = {**dict(config), "kind": "metrics", "server-round": server_round}
        content = RecordDict({"arrays": arrays, "config": ConfigRecord(cfg)})
        return [
            Message(
                content,
                dst_node_id=int(n),
                message_type=MessageType.EVALUATE,
                group_id=f"eval-{server_round}",
            )
            for n in self.cohorts.node_ids
        ]

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Sum the nodes' metric sums (failed nodes counted in ``eval-failed-nodes``)."""
        sums: dict[str, float] = {}
        failed = 0
        for reply in replies:
            if reply.has_error() or "metrics" not in reply.content.metric_records:
                failed += 1
                log(WARNING, "evaluation failed on node %s", reply.metadata.src_node_id)
                continue
            for key, value in reply.content.metric_records["metrics"].items():
                if key.startswith(("seen-", "unseen-")):
                    sums[key] = sums.get(key, 0.0) + float(value)
        sums["eval-failed-nodes"] = float(failed)
        return MetricRecord(sums)

    # ------------------------------------------------------------------ transport
    def train(
        self,
        server_round: int,
        users: np.ndarray,
        payload: list[np.ndarray],
        user_config: dict[str, list[float]] | None = None,
    ) -> TrainOutcome:
        """Transport: send ``train`` messages, wait, validate and sum the replies."""
        assert self._grid is not None
        config = ConfigRecord({"users": [int(u) for u in users], **(user_config or {})})
        messages = self.configure_train(server_round, ArrayRecord(payload), config, self._grid)
        replies = self._grid.send_and_receive(messages, timeout=self.round_timeout)
        return self.collect_train(server_round, replies)

    def appeal(self, server_round: int, users: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
        """Transport: ask the nodes which of their seen clients opt in."""
        assert self._grid is not None
        cfg = {"kind": "appeal", "server-round": server_round}
        messages = self._messages(
            users, ArrayRecord(weights), cfg, MessageType.EVALUATE, server_round
        )
        pool: list[int] = []
        for reply in self._grid.send_and_receive(messages, timeout=self.round_timeout):
            src = int(reply.metadata.src_node_id)
            try:
                if reply.has_error():
                    raise ReplyError(reply.error.reason)
                got = [int(u) for u in reply.content.metric_records["metrics"]["appealing"]]
                if not set(got) <= set(self._sent.get(src, [])):
                    raise ReplyError("opt-in list names clients the node was not asked about")
            except (ReplyError, KeyError, TypeError) as err:
                log(
                    WARNING,
                    "round %d: opt-in reply of node %s left out: %s",
                    server_round,
                    src,
                    err,
                )
                continue
            pool += got
        return np.asarray(sorted(pool), dtype=np.int64)

    def evaluate(
        self, server_round: int, weights: list[np.ndarray], tuned: bool
    ) -> dict[str, float]:
        """Transport: evaluate all clients; return the summed metrics."""
        assert self._grid is not None
        cfg = ConfigRecord({"tuned": int(tuned)})
        messages = self.configure_evaluate(server_round, ArrayRecord(weights), cfg, self._grid)
        replies = self._grid.send_and_receive(messages, timeout=self.round_timeout)
        record = self.aggregate_evaluate(server_round, replies)
        return {k: float(v) for k, v in (record or {}).items()}

    # ------------------------------------------------------------------ protocol loop
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
        """Run discovery and the T rounds (:func:`~flower_app.algorithms.appeal.run_protocol`).

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        initial_arrays : ArrayRecord, optional
            Initial model (default: the server's w⁽⁰⁾).
        num_rounds : int, optional
            Must be None or equal to ``num_rounds`` given at construction.
        timeout : float, optional
            Overrides ``round_timeout``.
        train_config, evaluate_config : ConfigRecord, optional
            Not used (the protocol's config is fixed); accepted for API compatibility.
        evaluate_fn : callable, optional
            Not used: all evaluation is federated (clients hold the test data).

        Returns
        -------
        Result
            ``arrays``: the final model; the rows' metrics in ``train_metrics_clientapp``
            and ``evaluate_metrics_clientapp`` by round.
        """
        if num_rounds is not None and num_rounds != self.num_rounds:
            raise ValueError(f"num_rounds={num_rounds} differs from {self.num_rounds}")
        if initial_arrays is not None and len(initial_arrays):
            self.server.weights = [a.astype(np.float32) for a in initial_arrays.to_numpy_ndarrays()]
        if timeout is not None:
            self.round_timeout = float(timeout)
        self.summary()
        self._grid = grid
        n_params = int(sum(w.size for w in self.server.weights))
        self.cohorts = discover_cohorts(
            grid, self.n_clients, n_params, timeout=self.discovery_timeout
        )
        result = Result()

        def on_round(row: dict[str, Any]) -> None:
            self.history.append(row)
            t = int(row["server-round"])
            log(
                INFO,
                "[round %d/%d] %s pool=%s sampled=%s q̄=%s seen GM-Appeal=%s acc=%s  %.2f s",
                t,
                self.num_rounds,
                self.algorithm,
                row.get("pool-size", "-"),
                row.get("sampled", "-"),
                _fmt(row.get("q-mean")),
                _fmt(row.get("seen-gm-appeal")),
                _fmt(row.get("seen-acc")),
                row.get("round-time", 0.0),
            )
            scalars = {
                k: float(v)
                for k, v in row.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
            if "seen-acc" in row:
                result.evaluate_metrics_clientapp[t] = MetricRecord(scalars)
            else:
                result.train_metrics_clientapp[t] = MetricRecord(scalars)
            if self.on_round is not None:
                self.on_round(row)

        run_protocol(
            self.server,
            self.sampler,
            self,
            self.num_rounds,
            eval_every=self.eval_every,
            tuned_final=self.tuned_final,
            on_round=on_round,
        )
        result.arrays = ArrayRecord([np.asarray(w) for w in self.server.weights])
        self._grid = None
        return result


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


class MaxFLStrategy(AppealStrategy):
    """MaxFL (Algorithm 1): q_k-weighted updates with the adaptive global learning rate.

    Each sampled client k computes q_k = σ(F_k(w) − ρ_k)(1 − σ(F_k(w) − ρ_k)) at the
    received model (ρ_k = loss of its solo model, kept in its persistent state), runs τ
    local SGD steps and sends q_k Δw_k and q_k; the server steps
    w ← w − η_g / (Σ q_k + ε) · Σ q_k Δw_k. With ``flexible`` participation, after the
    mandatory rounds only clients with F_k(w) < ρ_k are sampled. See
    :class:`AppealStrategy` for the message contract and the remaining parameters.

    Parameters
    ----------
    weights : list of numpy.ndarray
        Initial model w⁽⁰⁾.
    n_seen : int
        Seen clients (ids 0..n_seen−1; the rest of ``n_clients`` are unseen).
    n_clients : int
        Seen plus unseen clients.
    clients_per_round : int
        K.
    num_rounds : int
        T.
    server_lr : float, optional
        η_g (default 1.0).
    eps : float, optional
        ε > 0 of the adaptive learning rate (default 1e-3); ε ≤ 0 raises ValueError.
    flexible : bool, optional
        Appeal-based flexible participation (default True).
    mandatory_rounds : int, optional
        Rounds before clients may opt out (default 10).
    seed : int, optional
        Seed of the server's client sampling (default 0).
    **kwargs
        ``eval_every``, ``tuned_final``, ``on_round``, ``round_timeout``,
        ``discovery_timeout`` of :class:`AppealStrategy`.
    """

    def __init__(
        self,
        weights: list[np.ndarray],
        n_seen: int,
        n_clients: int,
        clients_per_round: int,
        num_rounds: int,
        server_lr: float = 1.0,
        eps: float = 1e-3,
        flexible: bool = True,
        mandatory_rounds: int = 10,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        server = AppealServer("maxfl", list(weights), n_seen, server_lr=server_lr, eps=eps)
        sampler = ParticipationSampler(n_seen, clients_per_round, flexible, mandatory_rounds, seed)
        super().__init__(server, sampler, n_clients, num_rounds, **kwargs)
