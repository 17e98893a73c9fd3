"""MaxFLStrategy: maximise global-model appeal, a drop-in for Flower's ``FedAvg``.

Cho, Jhunjhunwala, Li, Smith & Joshi (TMLR 2024), "Maximizing Global Model Appeal in
Federated Learning", Algorithm 1, with appeal-based flexible participation (Section 3). The
math lives in :mod:`flower_app.algorithms.maxfl.core` (q_k and the server step); this module
moves it over the grid as the hooks of :class:`~flower_app.strategies.base.RoundStrategy`,
which owns ``start()``. One node is one client, as with Flower's ``FedAvg``: nodes are
sampled from ``grid.get_node_ids()`` (``fraction_train``, ``min_train_nodes``, seeded by
``seed``); the client replies FedAvg's ``arrays`` plus two metrics (the received model's
loss on its training data and its requirement ρ_k) and the server computes q_k and Δw_k
itself. Client helpers: ``flower_app.clients.maxfl``.

This app's reproductions (a node serves a cohort of the paper's clients, seen and unseen
clients, the baselines) run :class:`~flower_app.strategies.cohort.maxfl.MaxFLCohorts`.
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

from flower_app.algorithms.maxfl.appeal import PoolCache
from flower_app.algorithms.maxfl.core import (
    Q_MAX,
    adaptive_server_lr,
    aggregation_weight,
    maxfl_update,
)
from flower_app.algorithms.maxfl.participation import warn_empty_pool
from flower_app.privacy.secagg_server import SecureAggregation
from flower_app.strategies.base import SUMMED_SENDER, RoundStrategy
from flower_app.strategies.errors import InitialArraysError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.records import to_metric_record
from flower_app.strategies.replies import CheckedReplies, int_metric
from flower_app.strategies.sampling import fedavg_evaluate_messages, sample_nodes

__all__ = ["APPEAL_MESSAGE", "RHO_KEY", "TRAIN_LOSS_KEY", "MaxFLStrategy"]

#: the opt-in request: a ClientApp answers it with ``@app.evaluate("appeal")``
APPEAL_MESSAGE = f"{MessageType.EVALUATE}.appeal"
#: the metric of F_k(w), the received model's loss on the client's training data (as
#: :func:`flower_app.clients.maxfl.maxfl_metrics` writes it; Flower's ``QFedAvg`` reads
#: its loss the same way)
TRAIN_LOSS_KEY = "train-loss"
#: the metric of ρ_k, the client's requirement
RHO_KEY = "rho"

#: the round diagnostics in ``train_metrics_clientapp`` (the app's own train metrics pass
#: through beside them; one of these names in a reply is not passed through)
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


class MaxFLStrategy(RoundStrategy):
    """MaxFL (Algorithm 1): q_k-weighted updates with the adaptive global learning rate.

    A drop-in for Flower's ``FedAvg`` (one node = one client): ``MaxFLStrategy(...).start(grid=grid,
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
        Seeds the node sampling (``random.Random(seed)``; default 0).
    weighted_by_key : str, optional
        Metric weighting the federated evaluation's average (default ``"num-examples"``),
        as in ``FedAvg``.
    secure_aggregation : SecureAggregation, optional
        The nodes' ``secure_aggregation_mod`` turns each reply (w_k, F_k(w), ρ_k) into
        q_k (w − w_k), q_k, F_k(w) and [F_k(w) < ρ_k] before summing (transform
        ``maxfl-weighted-delta``), so the user's ClientApp is unchanged and the server
        learns only the sums; non-floating arrays keep the server's values. Default None.

    Notes
    -----
    Message contract. ``w`` is the user's model as an ArrayRecord (e.g. a torch
    ``state_dict``) with the keys, shapes and dtypes of ``initial_arrays``; only its
    floating arrays are stepped. The metric names are ``TRAIN_LOSS_KEY`` (``train-loss``)
    and ``RHO_KEY`` (``rho``), as ``flower_app.clients.maxfl`` writes them.

    ===============  ===================================  ==================================
    message          request                              reply
    ===============  ===================================  ==================================
    train            ``arrays``: w; ``config``: the       ``arrays``: the trained model
                     user's ``train_config`` unchanged    (same keys, shapes, float
                     plus ``server-round`` (int)          dtypes); ``metrics``:
                                                          ``num-examples`` (int ≥ 0),
                                                          ``train-loss`` (float: F_k(w),
                                                          the *received* model's loss on
                                                          the local training data),
                                                          ``rho`` (float: ρ_k); the app's
                                                          own numbers are averaged into
                                                          the Result as ``FedAvg`` does
    evaluate.appeal  ``arrays``: w; ``config``:           ``metrics``: ``train-loss``
                     ``server-round``. To every node      (F_k(w)), ``rho`` (ρ_k); the node
                     each round after                     is in the pool if F_k(w) < ρ_k
                     ``mandatory_rounds`` (``flexible``;
                     not again while w is unchanged)
    evaluate         ``arrays``: w; ``config``: the       ``metrics`` with
                     user's ``evaluate_config`` plus      ``num-examples``; averaged
                     ``server-round``                     weighted by it, as ``FedAvg``
    ===============  ===================================  ==================================

    Client helpers: ``flower_app.clients.maxfl`` (``ensure_rho``,
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

    supports_secure_aggregation = True

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
        weighted_by_key: str = "num-examples",
        *,
        secure_aggregation: SecureAggregation | None = None,
    ) -> None:
        adaptive_server_lr(0.0, server_lr, eps)  # raises on ε ≤ 0 or η_g ≤ 0
        if not 0.0 < fraction_train <= 1.0 or not 0.0 <= fraction_evaluate <= 1.0:
            raise ValueError("fraction_train must lie in (0, 1], fraction_evaluate in [0, 1]")
        if int(mandatory_rounds) < 0:
            raise ValueError("mandatory_rounds must be >= 0")
        super().__init__(secure_aggregation=secure_aggregation)
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
        self.weighted_by_key = weighted_by_key
        self.num_rounds = 0
        self._global: dict[str, np.ndarray] = {}
        self._nodes: list[int] = []
        self._pool = PoolCache()
        self._pool_size = 0
        self._empty_pool_warned = False
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
        for a guarantee calibrated to MaxFL use this app's runs with client-level DP
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
        """Keep w (``initial_arrays``) and reset the node sampler; return ``num_rounds``."""
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
        """Sample nodes (from the opt-in pool after the mandatory rounds)."""
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
        if not self.flexible:
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
            loss = _finite(metrics, TRAIN_LOSS_KEY)
            return loss < _finite(metrics, RHO_KEY)

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
        """Send w and the user's config (plus ``server-round``) to the sampled nodes."""
        content = RecordDict({"arrays": arrays, "config": self.merged_config(config, server_round)})
        return messages_to(self._nodes, content, MessageType.TRAIN, str(server_round))

    def merge_senders(self, nodes: list[int]) -> int:
        """Under secure aggregation: the summed reply is one sender (``summed_nodes``)."""
        return SUMMED_SENDER

    def secure_transform(self) -> dict[str, Any] | None:
        """Under secure aggregation the nodes sum q_k (w − w_k), not their models."""
        return {"name": "maxfl-weighted-delta", "loss-key": TRAIN_LOSS_KEY,
                "rho-key": RHO_KEY, "weight-key": self.weighted_by_key}  # fmt: skip

    def _decode_summed_plain(self, reply: Message) -> Any:
        """Decode a secure sum: Σ q_k Δw_k per floating array and the sums."""
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
        """Check a reply; return (arrays, F_k(w), ρ_k, num-examples, own metrics)."""
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
        loss = _finite(metrics, TRAIN_LOSS_KEY)
        rho = _finite(metrics, RHO_KEY)
        own = {
            k: v for k, v in metrics.items()
            if k not in (TRAIN_LOSS_KEY, RHO_KEY, "num-examples")
            and isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)
        }  # fmt: skip
        return arrays, loss, rho, n, own

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Compute q_k and Δw_k from the replies, then take the MaxFL step."""
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
        """Send w to ``fraction_evaluate`` of the nodes, as ``FedAvg`` does."""
        sample = (self.fraction_evaluate, self.min_evaluate_nodes, self.min_available_nodes)
        return fedavg_evaluate_messages(grid, self._eval_rng, server_round, arrays, config, "eval",
                                        sample, self.exchange_timeout)  # fmt: skip

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Average the valid replies' metrics weighted by ``weighted_by_key``."""

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

    def round_summary(self, row: dict[str, Any]) -> str:
        """Return the round's key numbers for the log line."""
        return (
            f"pool={row.get('pool-size', '-')} nodes={row.get('nodes', '-')}"
            f" q̄={_fmt(row.get('q-mean'))} F_k(w)={_fmt(row.get('received-loss'))}"
            f" appeal={_fmt(row.get('appeal'))}"
        )

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "MaxFLStrategy: fraction_train=%s (min %d nodes, %d available), "
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


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"
