"""MaxFLStrategy and the baselines of the MaxFL paper, on the package's strategy base.

Cho, Jhunjhunwala, Li, Smith & Joshi (TMLR 2024), "Maximizing Global Model Appeal in
Federated Learning", Algorithm 1, with appeal-based flexible participation (Section 3). The
math lives in :mod:`flower_app.algorithms.maxfl.core` (q_k and the server step),
:mod:`flower_app.algorithms.maxfl.learning` (the paper's clients) and
:mod:`flower_app.algorithms.maxfl.appeal` (the round protocol of the reproductions, shared with
the direct engine); this module moves it over the grid as the hooks of
:class:`~flower_app.strategies.base.RoundStrategy`, which owns ``start()``.

Two modes:

*Plain* (:class:`MaxFLStrategy`, the default): one node is one client, as with Flower's
``FedAvg``. Nodes are sampled from ``grid.get_node_ids()`` (``fraction_train``,
``min_train_nodes``, seeded by ``seed``); the client replies FedAvg's ``arrays`` plus two
metrics (the received model's loss on its training data and its requirement ρ_k) and the
server computes q_k and Δw_k itself. Client helpers: ``flower_app.clients.maxfl``.

*Cohort* (``MaxFLStrategy(cohorts=True, ...)`` and :class:`AppealStrategy`, which also runs
the baselines fedavg, fedprox, qffl, scaffold, mwfed, perfedavg and pfedme): a node serves a
cohort of the paper's clients (discovery by ``query.cohort``), the server samples *clients*
with its own seeded generator, evaluates seen and unseen clients, and the nodes send
per-cohort sums. Every reproduction runs in this mode (:mod:`flower_app.runners.maxfl`),
and gives the direct engine's model bit for bit.

Why the baselines are not Flower's own ``FedAvg`` / ``FedProx`` / ``QFedAvg`` in cohort
mode: those sample nodes, not clients of a cohort, and know neither the opt-in pool nor the
seen/unseen evaluation. Their server math is re-implemented without Flower in
:mod:`flower_app.algorithms.maxfl.baselines` and tested against Flower's functions.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

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
from flower_app.algorithms.maxfl.core import (
    Q_MAX,
    adaptive_server_lr,
    aggregation_weight,
    maxfl_update,
)
from flower_app.algorithms.maxfl.participation import ParticipationSampler, warn_empty_pool
from flower_app.algorithms.maxfl.server_rules import RULES, MWFedRule, rule_for
from flower_app.privacy.secagg_server import SecureAggregation
from flower_app.strategies.base import SUMMED_SENDER, RoundCallback, RoundStrategy
from flower_app.strategies.discovery import CohortMap, discover_cohorts
from flower_app.strategies.errors import InitialArraysError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.records import to_metric_record
from flower_app.strategies.replies import CheckedReplies, int_metric
from flower_app.strategies.sampling import fedavg_evaluate_messages, sample_nodes

__all__ = [
    "APPEAL_MESSAGE",
    "AppealStrategy",
    "MaxFLStrategy",
    "ReplyError",
    "decode_cohort_reply",
]

#: train-config keys that hold one value per sampled client (sliced per node)
PER_USER_KEYS = tuple(sorted({r.share_key for r in RULES.values() if r.share_key}))

#: plain mode's round diagnostics in ``train_metrics_clientapp`` (the app's own train
#: metrics pass through beside them; one of these names in a reply is not passed through)
DIAGNOSTICS = frozenset(
    {"pool-size", "sampled", "nodes", "num-examples", "q-mean", "q-sum", "server-step",
     "received-loss", "appeal", "bad-replies"}
)  # fmt: skip


def _own_means(decoded: list[tuple], taken: set[str]) -> dict[str, float]:
    """Average the app's own train metrics over the replies, weighted by ``num-examples``.

    As Flower's ``FedAvg`` does (its ``aggregate_metricrecords``): a metric every accepted
    reply carries; keys the strategy itself reports are left out.
    """
    owns = [own for *_, own in decoded]
    weights = np.array([n for *_, n, _ in decoded], dtype=np.float64)
    if not owns or weights.sum() <= 0:
        return {}
    keys = [k for k in owns[0] if k not in taken and all(k in o for o in owns)]
    return {k: float(np.dot(weights, [o[k] for o in owns]) / weights.sum()) for k in keys}


#: the opt-in request of plain mode: a ClientApp answers it with ``@app.evaluate("appeal")``
APPEAL_MESSAGE = f"{MessageType.EVALUATE}.appeal"
#: cohort mode's metric sums over a node's clients: a node answers ``@app.evaluate("metrics")``
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


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


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


class AppealStrategy(RoundStrategy):
    """MaxFL or a baseline in cohort mode: seen/unseen clients, flexible participation.

    The reproductions' strategy (:func:`flower_app.runners.maxfl.server_run`). One round
    runs the steps of :func:`flower_app.algorithms.maxfl.appeal.run_protocol` as the base's
    hooks: ``before_round`` asks for the opt-in pool (flexible participation, after the
    mandatory rounds; reused while the model is unchanged) and samples the round's
    clients with the server's generator; ``configure_train`` / ``aggregate_train`` send
    the model to the nodes serving them and apply the algorithm's step;
    ``configure_evaluate`` evaluates all clients at round 0 (``evaluate_initial``), every
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
    on_round : callable, optional
        Receives each round's row (e.g. to append it to ``metrics.jsonl``).
    min_reply_fraction : float, optional
        Least fraction of a round's clients whose replies must arrive and be accepted, else
        the run stops with ``TooFewRepliesError`` (default 0.0: aggregate what came; the
        failed nodes are recorded per round).
    discovery_timeout : float, optional
        Seconds to wait until the nodes' cohorts cover all clients (default 300).
    dp : GaussianDP, optional
        Client-level DP with distributed Gaussian noise
        (:mod:`flower_app.algorithms.common.gaussian_dp`; MaxFL and FedAvg, needs
        ``secure_aggregation``): every sampled client clips, weights and noises its update
        (noise from its node's OS entropy); each round's row adds ``dp-epsilon`` (against
        the server: the worst client over the rounds it took part in, no amplification),
        ``dp-epsilon-outsider`` (amplified by sampling) and the noise that arrived
        (:class:`~flower_app.algorithms.common.gaussian_dp.GaussianAccountant`, kept in
        ``self.accountant``), and no training loss. Default None.
    secure_aggregation : SecureAggregation, optional
        Sum each round's train replies with secure aggregation (:mod:`flower_app.privacy`):
        nodes then reply with sums only (``q-sum``, ``loss-sum``, ``h-sum`` instead of the
        per-client lists) and the server learns Σ_k q_k Δw_k (fixed point, 2^-(f+1) per
        value and node), Σ q_k, Σ F_k(w), Σ h_k and the number of clients. MW-Fed refuses
        it (its step needs every client's ``met``). The opt-in pool and the evaluation
        sums still travel per node. Default None.

    Notes
    -----
    Message contract: the table of :class:`MaxFLStrategy` (rows "cohort"); the client
    side is :class:`flower_app.clients.learning.LearningClient` behind
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
        on_round: RoundCallback | None = None,
        min_reply_fraction: float = 0.0,
        discovery_timeout: float = 300.0,
        secure_aggregation: SecureAggregation | None = None,
        dp: GaussianDP | None = None,
    ) -> None:
        super().__init__(on_round, min_reply_fraction, secure_aggregation)
        if dp is not None and secure_aggregation is None:
            raise ValueError(
                "client-level DP (dp=) needs secure_aggregation: the clients add the noise, "
                "so only a securely aggregated sum is private"
            )
        if dp is not None and server.algorithm not in DP_ALGORITHMS:
            raise ValueError(f"client-level DP is implemented for {DP_ALGORITHMS}")
        self.dp = dp
        self.accountant = None if dp is None else GaussianAccountant(dp, sampler.n_seen)
        self._dp_sampled = 0
        if secure_aggregation is not None and server.rule.reports_met:
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
        self.discovery_timeout = float(discovery_timeout)
        self.num_rounds = 0
        self.cohorts: CohortMap | None = None
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
        self.cohorts = discover_cohorts(
            grid, self.n_clients, n_params, timeout=self.discovery_timeout
        )
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
        """Return the clients sampled on ``node_id`` this round (cohort mode), else 1."""
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


class MaxFLStrategy(AppealStrategy):
    """MaxFL (Algorithm 1): q_k-weighted updates with the adaptive global learning rate.

    A drop-in for Flower's ``FedAvg``: ``MaxFLStrategy(...).start(grid=grid,
    initial_arrays=ArrayRecord(model.state_dict()), num_rounds=..., train_config=...,
    evaluate_fn=...)``. Each sampled client k reports F_k(w), the loss of the model it
    received on its training data, and its requirement ρ_k (the loss of a model it trained
    alone); the server computes q_k = σ(F_k(w) − ρ_k)(1 − σ(F_k(w) − ρ_k)) and
    Δw_k = w − w_k and steps w ← w − η_g / (Σ q_k + ε) · Σ q_k Δw_k
    (:func:`flower_app.algorithms.maxfl.core.maxfl_update`). With ``flexible`` participation,
    after ``mandatory_rounds`` rounds only nodes for which F_k(w) < ρ_k are sampled.

    Parameters
    ----------
    fraction_train : float, optional
        Fraction of the available nodes sampled per round (default 1.0), as in ``FedAvg``.
        After the mandatory rounds the same number is drawn from the opt-in pool (all of
        it if smaller).
    fraction_evaluate : float, optional
        Fraction of the nodes sent an ``evaluate`` message after every round (default 1.0;
        0 disables federated evaluation).
    min_train_nodes, min_evaluate_nodes : int, optional
        Least nodes sampled for training / evaluation (default 2 each).
    min_available_nodes : int, optional
        Least connected nodes before a round starts (default 2).
    server_lr : float, optional
        η_g > 0 (default 1.0).
    eps : float, optional
        ε > 0 of the adaptive learning rate (default 1e-3); ε ≤ 0 raises ValueError.
    flexible : bool, optional
        Appeal-based flexible participation (default True).
    mandatory_rounds : int, optional
        Rounds before clients may opt out (default 10).
    seed : int, optional
        Seeds the node sampling (plain mode, ``random.Random(seed)``) or the client
        sampling (cohort mode) (default 0).
    train_loss_key, rho_key : str, optional
        Metric names of F_k(w) and ρ_k in the replies (default ``"train-loss"`` and
        ``"rho"``; Flower's ``QFedAvg`` reads its loss under ``train_loss_key`` the same
        way).
    weighted_by_key : str, optional
        Metric weighting the federated evaluation's average (default ``"num-examples"``).
    on_round : callable, optional
        Receives each round's row as the round ends.
    min_reply_fraction : float, optional
        Least fraction of a round's clients whose replies must arrive and be accepted, else
        the run stops with ``TooFewRepliesError`` (default 0.0: aggregate what came; the
        failed nodes are recorded per round).
    cohorts : bool, optional
        Cohort mode (default False): nodes serve many of the paper's clients, discovered
        by ``query.cohort``; needs ``n_seen`` and ``clients_per_round`` and a
        :class:`~flower_app.clients.learning.LearningClient` behind every node (see
        :class:`AppealStrategy`).
    n_seen : int, optional
        Cohort mode: seen clients (ids 0..n_seen−1).
    n_clients : int, optional
        Cohort mode: seen plus unseen clients (default ``n_seen``).
    clients_per_round : int, optional
        Cohort mode: K.
    eval_every, tuned_final, discovery_timeout : optional
        Cohort mode: see :class:`AppealStrategy`.
    secure_aggregation : SecureAggregation, optional
        Cohort mode: see :class:`AppealStrategy`. Plain mode: the nodes'
        ``secure_aggregation_mod`` turns each reply (w_k, F_k(w), ρ_k) into q_k (w − w_k),
        q_k, F_k(w) and [F_k(w) < ρ_k] before summing (transform
        ``maxfl-weighted-delta``), so the user's ClientApp is unchanged and the server
        learns only the sums; non-floating arrays keep the server's values.

    Notes
    -----
    Message contract, both modes. Plain: ``w`` is the user's model as an ArrayRecord (e.g.
    a torch ``state_dict``) with the keys, shapes and dtypes of ``initial_arrays``; only
    its floating arrays are stepped. Cohort: ``w`` is the list of float32 MLP arrays
    ``"0".."5"`` (``[W1 (64, 784), b1, W2 (30, 64), b2, W3 (C, 30), b3]``); per-client
    values are lists in the order of ``users``.

    ======  ===============  ===================================  ==================================
    mode    message          request                              reply
    ======  ===============  ===================================  ==================================
    plain   train            ``arrays``: w; ``config``: the       ``arrays``: the trained model
                             user's ``train_config`` unchanged    (same keys, shapes, float
                             plus ``server-round`` (int)          dtypes); ``metrics``:
                                                                  ``num-examples`` (int ≥ 0),
                                                                  ``train-loss`` (float: F_k(w),
                                                                  the *received* model's loss on
                                                                  the local training data),
                                                                  ``rho`` (float: ρ_k); the app's
                                                                  own numbers are averaged into
                                                                  the Result as ``FedAvg`` does
    plain   evaluate.appeal  ``arrays``: w; ``config``:           ``metrics``: ``train-loss``
                             ``server-round``. To every node      (F_k(w)), ``rho`` (ρ_k); the node
                             each round after                     is in the pool if F_k(w) < ρ_k
                             ``mandatory_rounds`` (``flexible``;
                             not again while w is unchanged)
    plain   evaluate         ``arrays``: w; ``config``: the       ``metrics`` with
                             user's ``evaluate_config`` plus      ``num-examples``; averaged
                             ``server-round``                     weighted by it, as ``FedAvg``
    cohort  query.cohort     ``config``: ``kind`` = ``cohort``    ``properties`` ConfigRecord
                                                                  (int): ``partition-id``,
                                                                  ``num-partitions``,
                                                                  ``first-user``, ``num-users``,
                                                                  ``n-users-total``, ``n-elements``
    cohort  train            ``arrays``: w (SCAFFOLD appends c,   ``arrays``: float64 sums over the
                             ``"6".."11"``); ``config``:          node's clients of q_k Δw_k
                             ``server-round`` (int), ``users``    (MaxFL), Δw_k (FedAvg, FedProx),
                             (list of int), ``algorithm`` (str),  Δ_k (q-FFL), Δw_k then Δc_k
                             MW-Fed: ``mw-share`` (list of        (SCAFFOLD), s_k Δw_k (MW-Fed);
                             float s_k)                           ``metrics``: ``num-examples``,
                                                                  ``users`` (as sent), ``q``,
                                                                  ``loss`` (lists of float, q_k ∈
                                                                  [0, 1/4]), ``h-sum`` (float),
                                                                  MW-Fed: ``met`` (list of 0/1)
    cohort  evaluate.appeal  ``arrays``: w; ``config``:           ``metrics``: ``appealing`` (list
                             ``users`` (the node's seen           of int: F_k(w) < ρ_k)
                             clients), ``server-round``
    cohort  evaluate.        ``arrays``: w; ``config``:           ``metrics``: per-group sums
            metrics          ``server-round``, ``tuned`` (int     ``seen-count``, ``seen-acc``,
                             0/1)                                 ..., ``unseen-*``
    ======  ===============  ===================================  ==================================

    Plain mode's client helpers: ``flower_app.clients.maxfl`` (``ensure_rho``,
    ``maxfl_metrics``, ``appeal_reply``). A train reply without these records or keys, with
    other keys or shapes than w, non-finite floats, or a negative ``num-examples`` is logged,
    counted in ``bad-replies`` and left out; a round in which all are left out raises
    :class:`~flower_app.strategies.base.AllRepliesRejectedError`. A node without an
    ``@app.evaluate("appeal")`` handler raises
    :class:`~flower_app.strategies.base.MissingHandlerError` naming it before round 1 (flexible
    participation sends every node the opt-in test of the initial model first). Non-floating
    arrays (e.g. BatchNorm's ``num_batches_tracked``) are taken from the accepted reply with
    the most examples. Each round's ``train_metrics_clientapp`` holds ``pool-size``,
    ``sampled``, ``nodes``, ``num-examples``, ``q-mean``, ``q-sum``, ``server-step``,
    ``received-loss`` (mean F_k(w): the loss of the model the nodes *received*, before their
    training), ``appeal`` (fraction of trained nodes with F_k(w) < ρ_k) and ``bad-replies``;
    beside them, the app's own train metrics (e.g. ``train_loss`` after training), averaged
    weighted by ``num-examples`` as ``FedAvg`` does.
    """

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        server_lr: float = 1.0,
        eps: float = 1e-3,
        flexible: bool = True,
        mandatory_rounds: int = 10,
        seed: int = 0,
        train_loss_key: str = "train-loss",
        rho_key: str = "rho",
        weighted_by_key: str = "num-examples",
        on_round: RoundCallback | None = None,
        min_reply_fraction: float = 0.0,
        cohorts: bool = False,
        n_seen: int | None = None,
        n_clients: int | None = None,
        clients_per_round: int | None = None,
        eval_every: int = 10,
        tuned_final: bool = True,
        discovery_timeout: float = 300.0,
        secure_aggregation: SecureAggregation | None = None,
    ) -> None:
        adaptive_server_lr(0.0, server_lr, eps)  # raises on ε ≤ 0 or η_g ≤ 0
        if not 0.0 < fraction_train <= 1.0 or not 0.0 <= fraction_evaluate <= 1.0:
            raise ValueError("fraction_train must lie in (0, 1], fraction_evaluate in [0, 1]")
        if int(mandatory_rounds) < 0:
            raise ValueError("mandatory_rounds must be >= 0")
        self.cohort_mode = bool(cohorts)
        if self.cohort_mode:
            if n_seen is None or clients_per_round is None:
                raise ValueError("cohort mode needs n_seen and clients_per_round")
            server = AppealServer("maxfl", [], int(n_seen), server_lr=server_lr, eps=eps)
            sampler = ParticipationSampler(
                int(n_seen), int(clients_per_round), flexible, int(mandatory_rounds), seed
            )
            total = int(n_seen) if n_clients is None else int(n_clients)
        else:
            server = AppealServer("maxfl", [], 0, server_lr=server_lr, eps=eps)
            sampler = ParticipationSampler(1, 1, flexible, int(mandatory_rounds), seed)
            total = 0
        super().__init__(
            server,
            sampler,
            total,
            eval_every=eval_every,
            tuned_final=tuned_final,
            on_round=on_round,
            min_reply_fraction=min_reply_fraction,
            discovery_timeout=discovery_timeout,
            secure_aggregation=secure_aggregation,
        )
        self.evaluate_initial = self.cohort_mode
        self.resumable = self.cohort_mode  # plain mode keeps more state: not resumable yet
        self.fraction_train = float(fraction_train)
        self.fraction_evaluate = float(fraction_evaluate)
        self.min_train_nodes = int(min_train_nodes)
        self.min_evaluate_nodes = int(min_evaluate_nodes)
        self.min_available_nodes = int(min_available_nodes)
        self.server_lr = float(server_lr)
        self.eps = float(eps)
        self.flexible = bool(flexible)
        self.mandatory_rounds = int(mandatory_rounds)
        self.seed = int(seed)
        self.train_loss_key = train_loss_key
        self.rho_key = rho_key
        self.weighted_by_key = weighted_by_key
        self._global: dict[str, np.ndarray] = {}
        self._nodes: list[int] = []
        self._node_rng = random.Random(self.seed)
        self._eval_rng = random.Random(f"evaluate-{self.seed}")

    # ------------------------------------------------------------------ setup
    def check_external_loop(self) -> None:
        """Warn when another loop drives MaxFL: a Flower DP wrapper's noise is FedAvg's.

        The loops that drive a strategy from outside are Flower's DP wrappers. Flower's
        ``DifferentialPrivacy*`` wrappers add N(0, (σC/K)²) to the aggregated
        model, calibrated to FedAvg's uniform mean of K clipped updates (sensitivity C/K).
        MaxFL's step divides Σ q_k Δ_k by Σ q_k + ε: when the other clients' q_k are near
        0, one client moves the model by up to η_g·C, so the wrapper's σ is not MaxFL's
        noise multiplier (at worst it is σ/(K·η_g)). The wrappers run and lose no reply;
        for a guarantee calibrated to MaxFL use cohort mode with client-level DP
        (``maxfl-dp-noise``, :mod:`flower_app.algorithms.common.gaussian_dp`).
        """
        log(
            WARNING,
            "another loop drives MaxFLStrategy: a Flower DP wrapper's noise sigma*C/K is "
            "calibrated for FedAvg's uniform mean; MaxFL divides by sum(q_k) + eps, so one "
            "client can move the model by up to server_lr*C and the wrapper's noise "
            "multiplier is not MaxFL's (docs/privacy.md, 'Flower's DP wrappers')",
        )

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Cohort mode: discovery; plain mode: keep w and reset the node sampler."""
        if self.cohort_mode:
            return super().setup(grid, arrays, num_rounds)
        if arrays is None or not len(arrays):
            raise InitialArraysError(
                "MaxFLStrategy needs initial_arrays: the model, e.g. "
                "ArrayRecord(model.state_dict())"
            )
        self._global = {key: arrays[key].numpy() for key in arrays}
        if not any(a.dtype.kind == "f" for a in self._global.values()):
            raise InitialArraysError("initial_arrays holds no floating array to train")
        self._node_rng = random.Random(self.seed)
        self._eval_rng = random.Random(f"evaluate-{self.seed}")
        self._pool = PoolCache()
        self._empty_pool_warned = False
        self.num_rounds = int(num_rounds)
        return self.num_rounds

    # ------------------------------------------------------------------ sampling
    def before_round(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> None:
        """Plain mode: sample nodes (from the opt-in pool after the mandatory rounds)."""
        if self.cohort_mode:
            super().before_round(server_round, arrays, grid)
            return
        if not (self.flexible and server_round > self.mandatory_rounds):
            self._nodes = sample_nodes(
                grid,
                self._node_rng,
                self.fraction_train,
                self.min_train_nodes,
                self.min_available_nodes,
                self.exchange_timeout,
            )
            self._pool_size = len(grid.get_node_ids())
            return
        everyone = sample_nodes(
            grid, random.Random(0), 1.0, self.min_train_nodes, self.min_available_nodes,
            self.exchange_timeout,
        )  # fmt: skip
        pool = self._pool.get(
            list(self._global.values()),
            lambda: self._ask_appeal(server_round, everyone, grid),
            key=tuple(everyone),
        )
        count = max(int(self.fraction_train * len(everyone)), self.min_train_nodes, 1)
        self._nodes = sorted(self._node_rng.sample(pool, min(count, len(pool))))
        self._pool_size = len(pool)
        self._empty_pool_warned = warn_empty_pool(self._empty_pool_warned, len(pool))

    def probe_messages(
        self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """Plain flexible mode: the opt-in test of the initial model, to every node.

        ``evaluate.appeal`` is first needed after ``mandatory_rounds``; asking it before
        round 1 (a real request; the answers are not used) makes a ClientApp without
        ``@app.evaluate("appeal")`` fail then, not after the mandatory rounds.
        """
        if self.cohort_mode or not self.flexible:
            return []
        everyone = sample_nodes(
            grid, random.Random(0), 1.0, self.min_train_nodes, self.min_available_nodes,
            self.exchange_timeout,
        )  # fmt: skip
        return self._appeal_messages(0, everyone)

    def _appeal_messages(self, server_round: int, nodes: list[int]) -> list[Message]:
        content = RecordDict(
            {
                "arrays": self._record(self._global),
                "config": ConfigRecord({"server-round": int(server_round)}),
            }
        )
        return messages_to(nodes, content, APPEAL_MESSAGE, f"appeal-{server_round}")

    def _ask_appeal(self, server_round: int, nodes: list[int], grid: Grid) -> list[int]:
        """Send ``evaluate.appeal`` to ``nodes``; return those with F_k(w) < ρ_k."""
        messages = self._appeal_messages(server_round, nodes)

        def decode(src: int, reply: Message) -> bool:
            metrics = _metrics_of(reply)
            loss = _finite(metrics, self.train_loss_key)
            return loss < _finite(metrics, self.rho_key)

        checked = self.check(
            self.send(grid, messages), decode, f"round {server_round} opt-in",
            all_rejected_fails=False,
        )  # fmt: skip
        pool = sorted(src for src, appeals in checked.accepted if appeals)
        log(INFO, "round %d: %d of %d nodes opt in", server_round, len(pool), len(nodes))
        return pool

    # ------------------------------------------------------------------ train
    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Plain mode: send w and the user's config (plus ``server-round``) to the nodes."""
        if self.cohort_mode:
            return super().train_messages(server_round, arrays, config, grid)
        content = RecordDict({"arrays": arrays, "config": self.merged_config(config, server_round)})
        return messages_to(self._nodes, content, MessageType.TRAIN, str(server_round))

    def secure_transform(self) -> dict[str, Any] | None:
        """Plain mode under secure aggregation: nodes sum q_k (w − w_k), not their models."""
        if self.cohort_mode:
            return None
        return {"name": "maxfl-weighted-delta", "loss-key": self.train_loss_key,
                "rho-key": self.rho_key, "weight-key": self.weighted_by_key}  # fmt: skip

    def _decode_summed_plain(self, reply: Message) -> Any:
        """Plain mode, secure aggregation: Σ q_k Δw_k per floating array and the sums."""
        record = reply.content.array_records["arrays"]
        metrics = reply.content.metric_records["metrics"]
        floats = [k for k, w in self._global.items() if w.dtype.kind == "f"]
        if sorted(record.keys()) != sorted(floats):
            raise ValueError(f"summed arrays {sorted(record.keys())}, the model's {floats}")
        sums = {k: record[k].numpy().astype(np.float64) for k in floats}
        for k, a in sums.items():
            if a.shape != self._global[k].shape or not np.all(np.isfinite(a)):
                raise ValueError(f"summed '{k}' has shape {a.shape} or non-finite values")
        nodes = len(self.summed_nodes)
        q_sum = float(metrics["q-sum"])
        if not (np.isfinite(q_sum) and -1e-6 <= q_sum <= nodes * Q_MAX + 1e-6):
            raise ValueError(f"Σ q_k = {q_sum} outside [0, {nodes}/4]")
        return ("summed", sums, max(q_sum, 0.0), float(metrics["loss-sum"]),
                int(metrics["appeal"]), int_metric(metrics, "num-examples"), nodes)  # fmt: skip

    def decode_train_reply(self, src: int, reply: Message) -> Any:
        """Plain mode: check a reply; return (arrays, F_k(w), ρ_k, num-examples)."""
        if self.cohort_mode:
            return super().decode_train_reply(src, reply)
        if src == SUMMED_SENDER:
            return self._decode_summed_plain(reply)
        content = reply.content
        if "arrays" not in content.array_records:
            raise ValueError("the reply has no 'arrays' ArrayRecord (the trained model)")
        record = content.array_records["arrays"]
        metrics = _metrics_of(reply)
        if set(record.keys()) != set(self._global):
            raise ValueError(
                f"the reply's arrays have keys {sorted(record.keys())}, the model "
                f"{sorted(self._global)}"
            )
        arrays: dict[str, np.ndarray] = {}
        for key, w in self._global.items():
            a = record[key].numpy()
            if a.shape != w.shape:
                raise ValueError(f"'{key}' has shape {a.shape}, the model {w.shape}")
            if w.dtype.kind == "f" and (a.dtype.kind != "f" or not np.all(np.isfinite(a))):
                raise ValueError(f"'{key}' is not a finite floating array")
            if w.dtype.kind != "f" and a.dtype.kind != w.dtype.kind:
                raise ValueError(f"'{key}' has dtype {a.dtype}, the model {w.dtype}")
            arrays[key] = a
        n = int_metric(metrics, "num-examples")
        if n < 0:
            raise ValueError(f"metrics need 'num-examples' >= 0, got {n!r}")
        loss = _finite(metrics, self.train_loss_key)
        rho = _finite(metrics, self.rho_key)
        own = {
            k: v for k, v in metrics.items()
            if k not in (self.train_loss_key, self.rho_key, "num-examples")
            and isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)
        }  # fmt: skip
        return arrays, loss, rho, n, own

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Plain mode: the base's checks, then :meth:`aggregate_accepted`."""
        if self.cohort_mode:
            return super().aggregate_train(server_round, replies)
        return RoundStrategy.aggregate_train(self, server_round, replies)

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Plain mode: q_k and Δw_k from the replies, then the MaxFL step."""
        row: dict[str, Any] = {"pool-size": self._pool_size, "sampled": len(self._nodes)}
        if not checked.accepted:
            return None, to_metric_record({**row, "nodes": 0, "server-step": 0.0})
        if checked.accepted[0][0] == SUMMED_SENDER:
            return self._step_summed(row, checked.accepted[0][1])
        losses = np.array([loss for _, (_, loss, _, _, _) in checked.accepted])
        rhos = np.array([rho for _, (_, _, rho, _, _) in checked.accepted])
        qs = aggregation_weight(losses, rhos)
        floats = [k for k, w in self._global.items() if w.dtype.kind == "f"]
        sums = [np.zeros(self._global[k].shape, np.float64) for k in floats]
        for q, (_, (arrays, _, _, _, _)) in zip(qs, checked.accepted, strict=True):
            for s, k in zip(sums, floats, strict=True):
                s += q * (self._global[k].astype(np.float64) - arrays[k].astype(np.float64))
        q_sum = float(np.sum(qs))
        stepped = maxfl_update(
            [self._global[k] for k in floats], sums, q_sum, self.server_lr, self.eps
        )
        new = dict(zip(floats, stepped, strict=True))
        largest = max(checked.accepted, key=lambda r: r[1][3])[1][0]
        self._global = {k: new[k] if k in new else largest[k] for k in self._global}
        row.update(_own_means([r for _, r in checked.accepted], set(row) | DIAGNOSTICS))
        row.update(
            {
                "nodes": len(checked.accepted),
                "num-examples": int(sum(n for _, (_, _, _, n, _) in checked.accepted)),
                "q-mean": float(np.mean(qs)),
                "q-sum": q_sum,
                "server-step": adaptive_server_lr(q_sum, self.server_lr, self.eps),
                "received-loss": float(np.mean(losses)),
                "appeal": float(np.mean(losses < rhos)),
            }
        )
        return self._record(self._global), to_metric_record(row)

    def _step_summed(
        self, row: dict[str, Any], decoded: tuple
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Take the MaxFL step from a securely aggregated round (non-floating arrays kept)."""
        _, sums, q_sum, loss_sum, appeal, n_examples, nodes = decoded
        floats = [k for k, w in self._global.items() if w.dtype.kind == "f"]
        stepped = maxfl_update(
            [self._global[k] for k in floats], [sums[k] for k in floats], q_sum,
            self.server_lr, self.eps,
        )  # fmt: skip
        self._global = {**self._global, **dict(zip(floats, stepped, strict=True))}
        row.update(
            {
                "nodes": nodes,
                "num-examples": n_examples,
                "q-mean": q_sum / max(nodes, 1),
                "q-sum": q_sum,
                "server-step": adaptive_server_lr(q_sum, self.server_lr, self.eps),
                "received-loss": loss_sum / max(nodes, 1),
                "appeal": appeal / max(nodes, 1),
            }
        )
        return self._record(self._global), to_metric_record(row)

    # ------------------------------------------------------------------ evaluate
    def evaluate_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Plain mode: send w to ``fraction_evaluate`` of the nodes, as ``FedAvg`` does."""
        if self.cohort_mode:
            return super().evaluate_messages(server_round, arrays, config, grid)
        sample = (self.fraction_evaluate, self.min_evaluate_nodes, self.min_available_nodes)
        return fedavg_evaluate_messages(grid, self._eval_rng, server_round, arrays, config, "eval",
                                        sample, self.exchange_timeout)  # fmt: skip

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Plain mode: average the valid replies' metrics weighted by ``num-examples``."""
        if self.cohort_mode:
            return super().aggregate_evaluate(server_round, replies)

        def decode(src: int, reply: Message) -> RecordDict:
            metrics = _metrics_of(reply)
            if not isinstance(metrics.get(self.weighted_by_key), int | float):
                raise ValueError(f"metrics need '{self.weighted_by_key}'")
            return RecordDict({"metrics": metrics})

        checked = self.check(
            replies, decode, f"round {server_round} evaluate", all_rejected_fails=False
        )
        if not checked.accepted:
            return None
        return aggregate_metricrecords([c for _, c in checked.accepted], self.weighted_by_key)

    def finalize(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return the final model (plain mode: in the keys of ``initial_arrays``)."""
        return super().finalize(arrays) if self.cohort_mode else arrays

    def round_summary(self, row: dict[str, Any]) -> str:
        """Return the round's key numbers for the log line."""
        if self.cohort_mode:
            return super().round_summary(row)
        return (
            f"pool={row.get('pool-size', '-')} nodes={row.get('nodes', '-')}"
            f" q̄={_fmt(row.get('q-mean'))} F_k(w)={_fmt(row.get('received-loss'))}"
            f" appeal={_fmt(row.get('appeal'))}"
        )

    def summary(self) -> None:
        """Log the strategy's settings."""
        if self.cohort_mode:
            super().summary()
            return
        log(
            INFO,
            "MaxFLStrategy (plain mode): fraction_train=%s (min %d nodes, %d available), "
            "fraction_evaluate=%s, η_g=%s, ε=%s, participation=%s (mandatory rounds %d), "
            "seed=%d",
            self.fraction_train,
            self.min_train_nodes,
            self.min_available_nodes,
            self.fraction_evaluate,
            self.server_lr,
            self.eps,
            "flexible" if self.flexible else "all",
            self.mandatory_rounds,
            self.seed,
        )

    @staticmethod
    def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
        # np.ascontiguousarray would turn 0-d arrays (e.g. counters) into shape (1,)
        return ArrayRecord({k: Array(np.array(a, order="C")) for k, a in arrays.items()})


def _metrics_of(reply: Message) -> MetricRecord:
    """Return the reply's ``metrics`` MetricRecord (ValueError if absent)."""
    if "metrics" not in reply.content.metric_records:
        raise ValueError("the reply has no 'metrics' MetricRecord")
    return reply.content.metric_records["metrics"]


def _finite(metrics: MetricRecord, key: str) -> float:
    """Return ``metrics[key]`` as a finite float (ValueError naming the key otherwise)."""
    value = metrics.get(key)
    if not isinstance(value, int | float) or not np.isfinite(value):
        hint = " (report it with flower_app.clients.maxfl.maxfl_metrics)" if value is None else ""
        raise ValueError(f"metrics need a finite '{key}', got {value!r}{hint}")
    return float(value)
