"""MaxFLCohorts: MaxFL and its baselines over nodes that serve many clients (the runners').

Cho, Jhunjhunwala, Li, Smith & Joshi (TMLR 2024), "Maximizing Global Model Appeal in
Federated Learning": the round protocol of the reproductions
(:mod:`flower_app.algorithms.maxfl.appeal`, shared with the direct engine) as the hooks of
:class:`~flower_app.strategies.cohort.base.CohortStrategy`. A node serves a cohort of the
paper's clients, the server samples *clients* with its own seeded generator, evaluates seen
and unseen clients, and the nodes send per-cohort sums; the model is the direct engine's,
bit for bit. It also runs the baselines fedavg, fedprox, qffl, scaffold, mwfed, perfedavg
and pfedme.

Why the baselines are not Flower's own ``FedAvg`` / ``FedProx`` / ``QFedAvg`` here: those
sample nodes, not clients of a cohort, and know neither the opt-in pool nor the seen/unseen
evaluation. Their server math is re-implemented without Flower in
:mod:`flower_app.algorithms.maxfl.baselines` and tested against Flower's functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.common.gaussian_dp import (
    DP_ALGORITHMS,
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
from flower_app.algorithms.maxfl.core import Q_MAX
from flower_app.algorithms.maxfl.participation import ParticipationSampler
from flower_app.algorithms.maxfl.server_rules import RULES, MWFedRule, rule_for
from flower_app.strategies.base import SUMMED_SENDER
from flower_app.strategies.cohort.base import CohortStrategy
from flower_app.strategies.errors import InitialArraysError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.maxfl import APPEAL_MESSAGE
from flower_app.strategies.records import to_metric_record
from flower_app.strategies.replies import CheckedReplies

__all__ = [
    "METRICS_MESSAGE",
    "AppealStrategy",
    "MaxFLCohorts",
    "ReplyError",
    "decode_cohort_reply",
    "decode_summed_reply",
]

#: train-config keys that hold one value per sampled client (sliced per node)
PER_USER_KEYS = tuple(sorted({r.share_key for r in RULES.values() if r.share_key}))
#: the metric sums over a node's clients: a node answers ``@app.evaluate("metrics")``
METRICS_MESSAGE = f"{MessageType.EVALUATE}.metrics"


class ReplyError(ValueError):
    """A client reply that cannot be aggregated (it is counted and left out)."""


def decode_cohort_reply(
    reply: Message, sent_users: list[int], shapes: list[tuple[int, ...]], algorithm: str
) -> tuple[list[np.ndarray], list[float], list[float], float, list[bool]]:
    """Check one node's cohort-mode ``train`` reply; return arrays, q's, losses, h, met.

    Parameters
    ----------
    reply : Message
        The node's reply (without error; errors are handled by the base).
    sent_users : list of int
        The clients the node was asked to train.
    shapes : list of tuple
        Expected array shapes (the model's; twice for SCAFFOLD).
    algorithm : str
        The algorithm; its server rule checks the values (MaxFL: q_k ∈ [0, 1/4], q-FFL:
        h > 0, MW-Fed: ``met``; :mod:`flower_app.algorithms.maxfl.server_rules`).

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
        users = [_user_id(u) for u in metrics["users"]]
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
    try:
        met = rule_for(algorithm).check_reply(qs, h_sum, metrics)
    except ValueError as err:
        raise ReplyError(str(err)) from err
    record = content.array_records["arrays"]
    if list(record.keys()) != [str(i) for i in range(len(shapes))]:
        raise ReplyError(f"arrays {list(record.keys())}, expected '0'..'{len(shapes) - 1}'")
    arrays = record.to_numpy_ndarrays()
    out = []
    for i, (a, shape) in enumerate(zip(arrays, shapes, strict=True)):
        if tuple(a.shape) != tuple(shape):
            raise ReplyError(f"array {i} has shape {a.shape}, the model needs {shape}")
        if a.dtype.kind != "f" or not np.all(np.isfinite(a)):
            raise ReplyError(f"array {i} is not a finite float array")
        out.append(a.astype(np.float64))
    return out, qs, losses, h_sum, met


def _user_id(value: Any) -> int:
    """Return a user id from a metric list entry (TypeError unless it is an int)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"user id {value!r} is not an int")
    return value


def decode_summed_reply(
    reply: Message, users: int, shapes: list[tuple[int, ...]], noisy: bool = False
) -> tuple[list[np.ndarray], int, float, float | None, float]:
    """Check a securely aggregated cohort reply; return sums, users, Σq, Σloss, Σh.

    With ``noisy`` (client-level DP) Σq carries noise: it is clamped at 0 instead of
    range-checked, and there is no loss (None).

    Raises
    ------
    ReplyError
        If the summed ``num-examples`` is not the clients sent, a sum is missing or
        non-finite, Σ q_k leaves [0, users/4], or the arrays do not have the model's shapes.
    """
    content = reply.content
    metrics = content.metric_records["metrics"]
    if int(metrics["num-examples"]) != users:
        raise ReplyError(f"the sum is over {metrics['num-examples']} clients, {users} were sent")
    try:
        q_sum = float(metrics["q-sum"])
        loss_sum = None if noisy else float(metrics["loss-sum"])
        h_sum = float(metrics.get("h-sum", 0.0))
    except (KeyError, TypeError) as err:
        raise ReplyError(f"a secure reply needs 'q-sum', 'loss-sum': {err}") from err
    if not np.all(np.isfinite([q_sum, 0.0 if loss_sum is None else loss_sum, h_sum])):
        raise ReplyError("non-finite Σ q_k, Σ loss or Σ h")
    if not noisy and (q_sum < -1e-6 or q_sum > users * Q_MAX + 1e-6):
        raise ReplyError(f"Σ q_k = {q_sum} outside [0, {users}/4]")
    record = content.array_records["arrays"]
    if list(record.keys()) != [str(i) for i in range(len(shapes))]:
        raise ReplyError(f"arrays {list(record.keys())}, expected '0'..'{len(shapes) - 1}'")
    sums = [a.astype(np.float64) for a in record.to_numpy_ndarrays()]
    for i, (a, shape) in enumerate(zip(sums, shapes, strict=True)):
        if tuple(a.shape) != tuple(shape) or not np.all(np.isfinite(a)):
            raise ReplyError(
                f"summed array {i} has shape {a.shape} (model: {shape}) or non-finite values"
            )
    return sums, users, max(q_sum, 0.0), loss_sum, h_sum


class MaxFLCohorts(CohortStrategy):
    """MaxFL or a baseline over cohorts: seen/unseen clients, flexible participation.

    The reproductions' strategy (:func:`flower_app.runners.maxfl.server_run`). One round
    runs the steps of the round protocol (:mod:`flower_app.algorithms.maxfl.appeal`) as the base's
    hooks: ``before_round`` asks for the opt-in pool (flexible participation, after the
    mandatory rounds; reused while the model is unchanged) and samples the round's
    clients with the server's generator; ``train_messages`` / ``aggregate_train`` send
    the model to the nodes serving them and apply the algorithm's step;
    ``evaluate_messages`` evaluates all clients at round 0 (``evaluate_initial``), every
    ``eval_every`` rounds and at the last round, and returns no message in other rounds.

    Parameters
    ----------
    server : AppealServer
        Server state and step; ``server.algorithm`` names the algorithm.
    sampler : ParticipationSampler
        Draws each round's clients (uniform, K per round, optional opt-in pool).
    n_clients : int
        Seen plus unseen clients over all nodes (checked by discovery).
    eval_every : int, optional
        Evaluate all clients every this many rounds, and at rounds 0 and T (default 10).
    tuned_final : bool, optional
        At round T also evaluate locally-tuned models (Table 3; default True).
    dp : GaussianDP, optional
        Client-level DP with distributed Gaussian noise
        (:mod:`flower_app.algorithms.common.gaussian_dp`; MaxFL and FedAvg, needs
        ``secure_aggregation``): every sampled client clips, weights and noises its update
        (noise from its node's OS entropy); each round's row adds ``dp-epsilon`` (against
        the server: the worst client over the rounds it took part in, no amplification),
        ``dp-epsilon-outsider`` (amplified by sampling) and the noise that arrived
        (:class:`~flower_app.algorithms.common.gaussian_dp.GaussianAccountant`, kept in
        ``self.accountant``), and no training loss. Default None.
    **options
        The run's options of :class:`~flower_app.strategies.cohort.base.CohortStrategy`.
        Under secure aggregation (``secure_aggregation``) nodes reply with sums only
        (``q-sum``, ``loss-sum``, ``h-sum`` instead of the per-client lists) and the
        server learns Σ_k q_k Δw_k (fixed point, 2^-(f+1) per value and node), Σ q_k,
        Σ F_k(w), Σ h_k and the number of clients. MW-Fed refuses it (its step needs every
        client's ``met``). The opt-in pool and the evaluation sums still travel per node.

    Notes
    -----
    Message contract: the table below; the client side is
    :class:`flower_app.clients.learning.LearningClient` behind
    :func:`flower_app.clients.numpy_client_app`.

    A train reply with an error, a missing record, other clients than sent, a wrong number
    or shape of arrays, non-finite values, q_k outside [0, 1/4] or (MW-Fed) a missing or
    malformed ``met`` list is logged, counted in ``bad-replies`` and left out; the step uses
    the valid replies only; a round in which nodes were sent messages and none replied
    usably raises :class:`~flower_app.strategies.base.AllRepliesRejectedError`. A failed
    opt-in reply keeps that node's clients out of the pool; a failed metrics reply leaves
    its clients out of that evaluation (``eval-failed-nodes``).

    Resumable (``checkpoint_fn`` / ``resume_from``): the server, the client sampler and the
    opt-in pool cache are checkpointed after every round.

    ``w`` is the list of float32 MLP arrays ``"0".."5"`` (``[W1 (64, 784), b1, W2 (30,
    64), b2, W3 (C, 30), b3]``); per-client values are lists in the order of ``users``.

    ===============  ===================================  ==================================
    message          request                              reply
    ===============  ===================================  ==================================
    query.cohort     ``config``: ``kind`` = ``cohort``    ``properties`` ConfigRecord
                                                          (int): ``partition-id``,
                                                          ``num-partitions``,
                                                          ``first-user``, ``num-users``,
                                                          ``n-users-total``, ``n-elements``
    train            ``arrays``: w (SCAFFOLD appends c,   ``arrays``: float64 sums over the
                     ``"6".."11"``); ``config``:          node's clients of q_k Δw_k
                     ``server-round`` (int), ``users``    (MaxFL), Δw_k (FedAvg, FedProx),
                     (list of int), ``algorithm`` (str),  Δ_k (q-FFL), Δw_k then Δc_k
                     MW-Fed: ``mw-share`` (list of        (SCAFFOLD), s_k Δw_k (MW-Fed);
                     float s_k)                           ``metrics``: ``num-examples``,
                                                          ``users`` (as sent), ``q``,
                                                          ``loss`` (lists of float, q_k ∈
                                                          [0, 1/4]), ``h-sum`` (float),
                                                          MW-Fed: ``met`` (list of 0/1)
    evaluate.appeal  ``arrays``: w; ``config``:           ``metrics``: ``appealing`` (list
                     ``users`` (the node's seen           of int: F_k(w) < ρ_k)
                     clients), ``server-round``
    evaluate.        ``arrays``: w; ``config``:           ``metrics``: per-group sums
    metrics          ``server-round``, ``tuned`` (int     ``seen-count``, ``seen-acc``,
                     0/1)                                 ..., ``unseen-*``
    ===============  ===================================  ==================================
    """

    #: evaluate all clients before round 1 (the reproductions' round-0 row)
    evaluate_initial = True
    initial_evaluation_note = (
        "every client is asked once; on first contact it trains its solo model for ρ_k "
        "(maxfl-solo-steps), which takes most of this step"
    )
    resumable = True
    supports_secure_aggregation = True

    def __init__(
        self,
        server: AppealServer,
        sampler: ParticipationSampler,
        n_clients: int,
        eval_every: int = 10,
        tuned_final: bool = True,
        dp: GaussianDP | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if dp is not None and self.secure_aggregation is None:
            raise ValueError(
                "client-level DP (dp=) needs secure_aggregation: the clients add the noise, "
                "so only a securely aggregated sum is private"
            )
        if dp is not None and server.algorithm not in DP_ALGORITHMS:
            raise ValueError(f"client-level DP is implemented for {DP_ALGORITHMS}")
        self.dp = dp
        self.accountant = None if dp is None else GaussianAccountant(dp, sampler.n_seen)
        self._dp_sampled = 0
        if self.secure_aggregation is not None and server.rule.reports_met:
            raise ValueError(
                f"{server.algorithm} does not support secure aggregation: its step needs "
                "each client's 'met' (MW-Fed's multiplicative weights are per client)"
            )
        if int(eval_every) < 1:
            raise ValueError("eval_every must be >= 1")
        self.server = server
        self.sampler = sampler
        self.n_clients = int(n_clients)
        self.eval_every = int(eval_every)
        self.tuned_final = bool(tuned_final)
        self.num_rounds = 0
        self._sent: dict[int, list[int]] = {}
        self._bytes_down = 0
        self._users = np.zeros(0, dtype=np.int64)
        self._pool_size = 0
        self._pool = PoolCache()

    @property
    def algorithm(self) -> str:
        """The algorithm's name."""
        return self.server.algorithm

    def checkpoint_state(self) -> tuple[Any, ...]:
        """Return the server (w, the algorithm's state), the client sampler and the pool cache.

        With client-level DP the privacy accountant follows (ε must go on from where it was).

        Client-side state (ρ_k) is recomputed by the nodes from their data; algorithms that
        keep per-client state across rounds on the nodes (SCAFFOLD's c_i, Per-FedAvg,
        pFedMe) lose it when the nodes restart, so their resumed run may differ.
        """
        if self.accountant is not None:
            return self.server, self.sampler, self._pool, self.accountant
        return self.server, self.sampler, self._pool

    def restore_state(self, state: tuple[Any, ...]) -> None:
        """Continue from a checkpoint (after ``setup``'s discovery)."""
        server, sampler, pool = state[:3]
        if self.accountant is not None:
            if len(state) < 4 or not isinstance(state[3], GaussianAccountant):
                raise TypeError("a DP run resumes only from a checkpoint with its accountant")
            self.accountant = state[3]
        if not isinstance(server, AppealServer) or not isinstance(sampler, ParticipationSampler):
            raise TypeError("a MaxFL checkpoint holds (AppealServer, ParticipationSampler, ...)")
        self.server, self.sampler, self._pool = server, sampler, pool

    # ------------------------------------------------------------------ hooks
    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Take w⁽⁰⁾ from ``arrays`` (if given) and discover the nodes' cohorts."""
        if int(num_rounds) < 1:
            raise ValueError("num_rounds must be >= 1")
        if arrays is not None and len(arrays):
            self.server.weights = [a.astype(np.float32) for a in arrays.to_numpy_ndarrays()]
        if not self.server.weights:
            raise InitialArraysError("cohort mode needs initial_arrays (the model w⁽⁰⁾)")
        n_params = int(sum(w.size for w in self.server.weights))
        self.discover(grid, self.n_clients, n_params)
        self.num_rounds = int(num_rounds)
        self._pool = PoolCache()
        return self.num_rounds

    def before_round(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> None:
        """Ask for the opt-in pool if this round needs it, then sample the round's clients."""
        pool = None
        if self.sampler.needs_pool(server_round):
            seen = np.arange(self.server.n_seen)
            pool = self._pool.get(
                self.server.weights, lambda: self._ask_pool(server_round, seen, grid)
            )
        self._users = self.sampler.sample(pool)
        self._pool_size = self.server.n_seen if pool is None else len(pool)

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
        for node_id, node_users in self.group_users(np.sort(users)).items():
            self._sent[node_id] = [int(u) for u in node_users]
            node_cfg = {**config, "users": self._sent[node_id]}
            for key, values in (per_user or {}).items():
                node_cfg[key] = [values[u] for u in self._sent[node_id]]
            content = RecordDict({"arrays": record, "config": ConfigRecord(node_cfg)})
            out.append(Message(content, dst_node_id=node_id, message_type=kind, group_id=str(rnd)))
        return out

    def _ask_pool(self, server_round: int, users: np.ndarray, grid: Grid) -> np.ndarray:
        """Ask the nodes which of their seen clients opt in (F_k(w) < ρ_k)."""
        cfg = {"server-round": server_round}
        record = ArrayRecord([np.asarray(w) for w in self.server.weights])
        messages = self._messages(users, record, cfg, APPEAL_MESSAGE, server_round)
        sent = dict(self._sent)

        def decode(src: int, reply: Message) -> list[int]:
            got = [_user_id(u) for u in reply.content.metric_records["metrics"]["appealing"]]
            if not set(got) <= set(sent.get(src, [])):
                raise ReplyError("opt-in list names clients the node was not asked about")
            return got

        checked = self.check(
            self.send(grid, messages),
            decode,
            f"round {server_round} opt-in",
            all_rejected_fails=False,
        )
        pool = [u for _, got in checked.accepted for u in got]
        return np.asarray(sorted(pool), dtype=np.int64)

    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Build one ``train`` message per node serving the round's sampled clients.

        The clients are those sampled in :meth:`before_round`, unless ``config`` holds
        ``users`` (list of int); a key of ``PER_USER_KEYS`` (``mw-share``) then holds
        one value per entry of ``users``. Each node receives its own clients' values.
        """
        raw = dict(config)
        if "users" in raw:
            users = np.asarray(raw.pop("users"), dtype=np.int64)
            user_cfg = {key: list(raw.pop(key)) for key in PER_USER_KEYS if key in raw}
        else:
            users = self._users
            user_cfg = self.server.user_config(users) if users.size else {}
        per_user: dict[str, dict[int, Any]] = {}
        for key, values in user_cfg.items():
            if len(values) != len(users):
                raise ValueError(f"'{key}' has {len(values)} values for {len(users)} users")
            per_user[key] = {int(u): v for u, v in zip(users, values, strict=True)}
        if users.size == 0:
            self._sent = {}
            self._bytes_down = 0
            return []
        cfg = dict(self.merged_config(raw, server_round, algorithm=self.algorithm))
        if self.dp is not None:
            cfg.update(dp_config(self.dp, int(users.size)))
            self._dp_sampled = int(users.size)
        payload = ArrayRecord([np.asarray(a) for a in self.server.payload()])
        messages = self._messages(users, payload, cfg, MessageType.TRAIN, server_round, per_user)
        self._bytes_down = payload.count_bytes() * len(messages)
        return messages

    def sent_users(self, node_id: int) -> int:
        """Return the clients sampled on ``node_id`` this round (1 if none)."""
        return len(self._sent[node_id]) if node_id in self._sent else 1

    def decode_train_reply(self, src: int, reply: Message) -> Any:
        """Check one node's train reply (see ``decode_cohort_reply``)."""
        if src == SUMMED_SENDER:
            return decode_summed_reply(
                reply, len(self._sent[src]), self.server.shapes, noisy=self.dp is not None
            )
        decoded = decode_cohort_reply(reply, self._sent[src], self.server.shapes, self.algorithm)
        return *decoded, reply.content.array_records["arrays"].count_bytes()

    def merge_senders(self, nodes: list[int]) -> int:
        """Under secure aggregation: the summed reply stands for all the nodes' clients."""
        self._sent[SUMMED_SENDER] = [u for n in nodes for u in self._sent.get(n, [])]
        return SUMMED_SENDER

    def forget_summed_sender(self) -> None:
        """Drop the summed sender's entry once the sum is decoded."""
        self._sent.pop(SUMMED_SENDER, None)

    def collect_train(self, server_round: int, replies: Iterable[Message]) -> TrainOutcome:
        """Validate the train replies and sum the valid ones (bad ones are counted).

        Raises
        ------
        AllRepliesRejectedError
            If this strategy sent the round's messages and no reply was accepted.
        """
        if not self._sent:
            return TrainOutcome(None, 0)
        checked = self.check(
            replies,
            self.decode_train_reply,
            f"round {server_round}",
            expected=self._sent,
            all_rejected_fails=bool(self._expected),
            train_round=server_round,
        )
        return self._sum(checked)

    def _sum(self, checked: CheckedReplies) -> TrainOutcome:
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
        """Validate, sum and apply the server step; return the new model and the row."""
        return self._apply_step(server_round, self.collect_train(server_round, replies))

    def _apply_step(
        self, server_round: int, outcome: TrainOutcome
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Apply the algorithm's step to the round's sums; return the model and the row."""
        row = round_row(server_round, self._pool_size, self._users.size)
        row.update(self.server.step(outcome))
        row.update(outcome_row(outcome))
        row.pop("server-round")
        metrics = to_metric_record(row)
        if outcome.sums is None:
            return None, metrics
        return ArrayRecord([np.asarray(w) for w in self.server.weights]), metrics

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Apply the step to a securely aggregated round (one summed reply, or none).

        Rounds in the clear go through :meth:`aggregate_train`, which sums the replies.
        """
        outcome = TrainOutcome(None, 0, bad_replies=checked.left_out)
        outcome.info = {"nodes": len(self._sent), "bytes-down": self._bytes_down}
        for _, (sums, users, q_sum, loss_sum, h_sum) in checked.accepted:
            outcome.sums, outcome.users = sums, users
            outcome.q_sum, outcome.loss_sum, outcome.h_sum = q_sum, loss_sum, h_sum
        if self.accountant is not None and self.dp is not None:
            if outcome.q_sum is not None:
                outcome.q_sum = max(outcome.q_sum, q_sum_floor(self.dp))
            # the clients whose noisy updates are in the sum: those of the surviving nodes
            arrived = [u for n in self.summed_nodes for u in self._sent.get(n, [])]
            outcome.info.update(
                self.accountant.record(self._dp_sampled, arrived if checked.accepted else [])
            )
        return self._apply_step(server_round, outcome)

    def evaluate_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask every node for metric sums over all its clients in evaluation rounds."""
        if self.cohorts is None or not evaluates_at(server_round, self.num_rounds, self.eval_every):
            return []
        tuned = self.tuned_final and server_round == self.num_rounds
        cfg = {**dict(config), "server-round": server_round, "tuned": int(tuned)}
        record = ArrayRecord([np.asarray(w) for w in self.server.weights])
        content = RecordDict({"arrays": record, "config": ConfigRecord(cfg)})
        return messages_to(self.cohorts.node_ids, content, METRICS_MESSAGE, f"eval-{server_round}")

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Sum the nodes' metric sums and return the means (``seen-acc``, ...).

        Failed nodes are left out and counted in ``eval-failed-nodes`` (recorded when > 0).
        """
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
        out = summarise_metrics(sums)
        if failed:
            out["eval-failed-nodes"] = float(failed)
        return MetricRecord(out)

    def finalize(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return the final model (without SCAFFOLD's control variate)."""
        return ArrayRecord([np.asarray(w) for w in self.server.weights])

    def round_summary(self, row: dict[str, Any]) -> str:
        """Return the round's key numbers for the log line."""
        return (
            f"{self.algorithm} pool={row.get('pool-size', '-')} sampled={row.get('sampled', '-')}"
            f" q̄={_fmt(row.get('q-mean'))} seen GM-Appeal={_fmt(row.get('seen-gm-appeal'))}"
            f" acc={_fmt(row.get('seen-acc'))}"
        )

    def summary(self) -> None:
        """Log the strategy's settings."""
        s = self.sampler
        log(
            INFO,
            "%s: %d seen + %d unseen clients, K=%d per round, participation=%s "
            "(mandatory rounds %d), η_g=%s, ε=%s, η_mw=%s, eval every %d, seed=%d",
            f"{type(self).__name__}({self.algorithm})",
            s.n_seen,
            self.n_clients - s.n_seen,
            s.clients_per_round,
            "flexible" if s.flexible else "all",
            s.mandatory_rounds,
            self.server.server_lr,
            self.server.eps,
            self.server.mw_eta if isinstance(self.server.rule, MWFedRule) else "-",
            self.eval_every,
            s.seed,
        )


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


#: the name of :class:`MaxFLCohorts` in earlier versions (MaxFL's baselines on the appeal
#: protocol), kept importable from :mod:`flower_app.strategies`
AppealStrategy = MaxFLCohorts
