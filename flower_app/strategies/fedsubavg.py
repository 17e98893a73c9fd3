"""FedSubAvgStrategy: federated submodel averaging with feature-heat correction, + baselines.

Ding et al. (NeurIPS 2022), "Federated Submodel Optimization for Hot and Cold Data
Features", Algorithm 1, and the baselines of Section 5.1 on the same message contract:
FedAvg, FedProx (μ = 0.01), FedAdam (Table 5) and the server-side SCAFFOLD approximation of
Appendix D.2. The math lives in :mod:`flower_app.algorithms.fedsubavg.core` (server steps on a
flat vector of rows) and :mod:`flower_app.algorithms.fedsubavg.named` (a model of named
arrays mapped onto that vector); this module moves it over Flower's Message API on the loop
of :class:`~flower_app.strategies.base.RoundStrategy`. :class:`FedSubAvgRounds` is the
round the public strategies and the runners'
:class:`~flower_app.strategies.cohort.fedsubavg.FedSubAvgCohorts` share.

Why not Flower's own ``FedAvg`` / ``FedProx`` / ``FedAdam``
    They broadcast one ``ArrayRecord`` (the full model) to every sampled node and average
    full arrays. Here every node gets a different payload (only its rows of the embedding
    tables), and FedSubAvg rescales each row's averaged update by N/n_m, its feature heat
    learnt in a counting query before round 1. Their *math* does fit: on a dense model our
    FedAvg and FedAdam server steps give exactly Flower's ``FedAvg.aggregate_train`` and
    ``FedAdam.aggregate_train`` (tests/test_fedsubavg_flower_math.py), and FedProx's
    clients read Flower's ``proximal-mu`` config key.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
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

from flower_app.algorithms.fedsubavg.core import (
    WEIGHTINGS,
    AdamConfig,
    FeatureHeat,
    RoundUpdate,
    ServerUpdate,
    make_server_update,
    merge_updates,
)
from flower_app.algorithms.fedsubavg.named import (
    NamedLayout,
    named_heat,
    named_heat_from_counts,
    rows_key,
)
from flower_app.privacy.secagg_server import SecureAggregation, key_book, secure_sum
from flower_app.strategies.base import SUMMED_SENDER, RoundStrategy
from flower_app.strategies.errors import InitialArraysError, NotEnoughNodesError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.records import to_metric
from flower_app.strategies.replies import CheckedReplies, int_metric
from flower_app.strategies.sampling import fedavg_evaluate_messages, sample_nodes

__all__ = [
    "HEAT_QUERY",
    "STRATEGIES",
    "FedAdamSubStrategy",
    "FedAvgSubStrategy",
    "FedProxSubStrategy",
    "FedSubAvgRounds",
    "FedSubAvgStrategy",
    "ScaffoldSubStrategy",
    "heat_messages",
    "train_message",
]

#: the counting round (every node declares the rows its data touch)
HEAT_QUERY = f"{MessageType.QUERY}.feature_heat"


def heat_messages(node_ids: Any, config: dict[str, Any]) -> list[Message]:
    """Return one ``query.feature_heat`` message per node with ``config``."""
    content = RecordDict({"config": ConfigRecord(config)})
    return messages_to(node_ids, content, HEAT_QUERY, "heat")


class FedSubAvgRounds:
    """FedSubAvg's round, shared by :class:`FedSubAvgStrategy` and ``FedSubAvgCohorts``.

    A mixin for a :class:`~flower_app.strategies.base.RoundStrategy`: the server step built
    from the counted feature heat, the sum of the accepted updates in node order with the
    step and the round's row, and the log line. The model is one float64 vector ``x`` of
    rows (memory O(model size), as a FedAvg server).
    """

    algorithm: str
    weighting: str
    adam: AdamConfig
    x: np.ndarray
    heat: FeatureHeat | None
    server: ServerUpdate | None

    def _init_round_state(self) -> None:
        self.heat = None
        self.server = None
        self.bad_replies = 0
        self._round_stats: dict[str, Any] = {}

    def _start_server(self) -> None:
        """Log the counted heat's dispersion; build the algorithm's server step."""
        assert self.heat is not None
        log(
            INFO,
            "counting query: parameter heat dispersion n_max/n_min = %.0f over %d clients "
            "(all touched rows, dense ones included; summary.json: parameter-heat-dispersion; "
            "entries touched: %d of %d)",
            self.heat.dispersion(), self.heat.n_clients,
            int((self.heat.clients > 0).sum()), self.heat.clients.size,
        )  # fmt: skip
        self.server = make_server_update(
            self.algorithm, self.x.size, self.heat.n_clients,
            heat=self.heat, weighting=self.weighting, adam=self.adam,
        )  # fmt: skip

    def _step(
        self, server_round: int, checked: CheckedReplies, sent: Iterable[int]
    ) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
        """Sum the accepted updates (in the order the nodes were sent) and take the step.

        Returns the round's metrics and the accepted replies in that order.
        """
        assert self.server is not None
        sent = list(sent)
        order = {n: i for i, n in enumerate(sent)}
        accepted = sorted(checked.accepted, key=lambda item: order.get(item[0], -1))
        update = merge_updates([part for _, (part, _, _) in accepted])
        self.server.step(self.x, update, server_round)
        bad = checked.left_out + int(self._round_stats.get("bad-replies", 0))
        self.bad_replies += bad
        up = int(self._round_stats.get("bytes-up", 0))
        up += sum(nbytes for _, (_, nbytes, _) in accepted)
        metrics: dict[str, Any] = {
            **{k: v for k, v in self._round_stats.items() if k not in ("bytes-up", "bad-replies")},
            "bad-replies": bad,
            "bytes-up": up,
            "clients": update.clients,
            "nodes": len([n for n in sent if n != SUMMED_SENDER]),
            "union-rows": int(update.rows.size),
        }
        return metrics, accepted

    def round_summary(self, row: dict[str, Any]) -> str:
        """Return the round's key numbers for the log line."""
        loss = next((row[k] for k in ("train-loss", "loss", "train_loss") if k in row), None)
        text = f"loss {loss:.5f}  " if isinstance(loss, int | float) else ""
        if "clients" in row:
            text += (
                f"clients={row['clients']} nodes={row['nodes']}  up={row['bytes-up']} B "
                f"down={row['bytes-down']} B"
            )
        return text


class FedSubAvgStrategy(FedSubAvgRounds, RoundStrategy):
    """Federated submodel training: FedSubAvg, or a baseline on the same contract.

    One node is one client; the model is the user's
    ``initial_arrays`` (e.g. ``ArrayRecord(model.state_dict())``), of which ``sparse_keys``
    name the embedding-like tables (first axis = rows); all other arrays are dense and
    behave as in FedAvg. In ``setup`` every connected node declares the rows of each sparse
    table its data touches (``query.feature_heat``); the server sums the feature heat n_m
    per row (N for dense arrays) and W_m (samples, for ``weighting="samples"``). Each round
    it samples nodes like Flower's ``FedAvg`` (``fraction_train``, ``min_train_nodes``,
    seeded ``random.Random(seed)``) among those counted, sends each only its rows of the
    sparse tables plus the dense arrays, and applies the server step to the averaged
    updates Δ̄: FedSubAvg multiplies row m's by N/n_m (Algorithm 1, line 9; Σw/W_m for
    ``"samples"``, App. D.4), i.e. plain FedAvg on dense arrays. ``Result.arrays`` has the
    keys, shapes and dtypes of ``initial_arrays``; ``num_rounds`` is honoured. Nodes that
    connect after the counting query are not sampled (their rows were not counted). The
    server keeps the model as one float64 vector (plus, for FedAdam/SCAFFOLD, state of the
    same size): memory O(model size), as a FedAvg server.

    (This app's reproductions, where a node serves many users of a MovieLens-style task,
    run :class:`~flower_app.strategies.cohort.fedsubavg.FedSubAvgCohorts`: the same server
    steps.)

    Parameters
    ----------
    sparse_keys : sequence of str, optional
        Names of the sparse (row-indexed) arrays of ``initial_arrays``
        (default none: every array dense; then no counting query is sent and a FedAvg
        ClientApp serves unchanged: ``FedAvgSubStrategy(weighting="samples")`` is FedAvg).
    fraction_train : float, optional
        Fraction of the counted nodes sampled per round (default 1.0).
    min_train_nodes : int, optional
        Least nodes sampled per round (default 2).
    min_available_nodes : int, optional
        Nodes to wait for before the counting query (default 2).
    fraction_evaluate : float, optional
        Fraction of nodes sent the *full* model in an ``evaluate`` message after
        each round (default 1.0, as Flower's ``FedAvg``: the one-line swap keeps the
        federated evaluation; 0.0 turns it off, e.g. with an ``evaluate_fn``, since the full
        model download is what submodels avoid).
    min_evaluate_nodes : int, optional
        Least nodes evaluated when ``fraction_evaluate > 0`` (default 2).
    weighting : str, optional
        ``"clients"`` (Algorithm 1: coefficient N/n_m, plain means) or ``"samples"``
        (App. D.4: Σw/W_m, means weighted by ``num-examples``). Default ``"clients"``.
    seed : int, optional
        Seed of the node sampling (``random.Random(seed)``; default 0).
    secure_aggregation : SecureAggregation, optional
        Under secure aggregation the counting query is a secure sum (every node then gets
        the whole tables) and each round's nodes send c_i (x_i − x) over the full model,
        summed by their ``secure_aggregation_mod`` (transform
        ``fedsubavg-weighted-delta``): the server learns only the sums. Default None.

    Notes
    -----
    Message contract (``<key>`` a sparse array of shape ``(R, *d)``, r the node's rows of it;
    ``<dense>`` any other array):

    =================  ====================================  ==================================
    message            server → node                         node → server
    =================  ====================================  ==================================
    ``query.``         ``"config"``: ``sparse-keys``         ``"arrays"``: ``"<key>.rows"``
    ``feature_heat``   list[str]                             int64 (r,) distinct rows per
    (plain)                                                  sparse key; ``"metrics"``:
                                                             ``num-examples`` int (+ optional
                                                             ``partition-id`` int: then the
                                                             sample is drawn over partitions)
    ``train``          ``"arrays"``: ``"<key>"``             ``"arrays"``: the same keys, rows
    (plain)            ``(r, *d)`` model dtype,              and shapes, updated values;
                       ``"<key>.rows"`` int64 (r,) sorted,   ``"metrics"``: ``num-examples``
                       ``"<dense>"`` whole; ``"config"``:    int (> 0 for ``"samples"``);
                       the user's ``train_config`` +         other numbers are averaged by
                       ``server-round`` (+ ``proximal-mu``   ``num-examples``
                       float, FedProx)
    ``evaluate``       ``"arrays"``: the full model (the     ``"metrics"``: ``num-examples`` +
    (plain, if         initial keys); ``"config"``:          numbers, averaged by
    fraction_eval.)    ``evaluate_config`` + server-round    ``num-examples``
    =================  ====================================  ==================================

    A reply with an error, rows other than those sent, non-finite values, the wrong shape
    or count is logged, counted in ``bad-replies`` and left out (K in the formulas is the
    number of accepted clients); a round in which all are left out fails the run.
    """

    algorithm = "fedsubavg"
    #: FedProx's μ, sent to the clients as ``proximal-mu`` when > 0 (:class:`FedProxSubStrategy`)
    proximal_mu: float = 0.0

    supports_secure_aggregation = True

    def __init__(
        self,
        sparse_keys: Sequence[str] = (),
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighting: str = "clients",
        seed: int = 0,
        secure_aggregation: SecureAggregation | None = None,
    ) -> None:
        super().__init__(secure_aggregation=secure_aggregation)
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting {weighting!r}: choose one of {WEIGHTINGS}")
        if isinstance(sparse_keys, str):
            sparse_keys = (sparse_keys,)
        self.sparse_keys = tuple(sparse_keys)
        self.fraction_train = float(fraction_train)
        self.min_train_nodes = int(min_train_nodes)
        self.min_available_nodes = int(min_available_nodes)
        self.fraction_evaluate = float(fraction_evaluate)
        self.min_evaluate_nodes = int(min_evaluate_nodes)
        self.weighting = weighting
        self.seed = int(seed)
        self.adam = AdamConfig()
        self.node_rng = random.Random(self.seed)
        # evaluation samples from its own stream: fraction_evaluate does not move training's
        self.eval_rng = random.Random(f"{self.seed}-evaluate")
        self.x = np.zeros(0)
        self.n_clients = 0
        self.n_params = 0
        self.layout: NamedLayout | None = None
        self.node_rows: dict[int, dict[str, np.ndarray]] = {}
        # partition id each node declared in the counting query (optional)
        self.node_partition: dict[int, int] = {}
        self._declared: dict[int, int] = {}
        self._sent_values: dict[int, dict[str, np.ndarray]] = {}
        self._init_round_state()

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "%s(%s): sparse_keys=%s, fraction_train=%g, min_train_nodes=%d, "
            "weighting=%s, seed=%d",
            type(self).__name__, self.algorithm, list(self.sparse_keys), self.fraction_train,
            self.min_train_nodes, self.weighting, self.seed,
        )  # fmt: skip

    def check_external_loop(self) -> None:
        """Refuse another loop (Flower's DP wrappers) unless the model is dense (FedAvg).

        The loops that drive a strategy from outside are Flower's DP wrappers. Flower's
        ``DifferentialPrivacy*`` wrappers clip each reply as a whole model and add
        N(0, (σC/K)²) to the aggregated model: FedAvg's sensitivity. With sparse tables
        neither holds: a node replies with its rows only (the server-side clip subtracts
        the full model from them), and FedSubAvg multiplies row m's mean update by N/n_m,
        so one client's clipped update moves a cold row by up to N/n_m·C/K, far beyond the
        noise. Without ``sparse_keys`` every n_m = N and the strategy is FedAvg (uniform
        with ``weighting="clients"``), which the wrappers fit.

        Raises
        ------
        ValueError
            If another loop drives a strategy with sparse tables.
        """
        if self.sparse_keys:
            raise external_loop_refused(type(self).__name__)

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Learn the feature heat (counting query); build the server step."""
        if arrays is None or len(arrays) == 0:
            raise InitialArraysError(
                "FedSubAvgStrategy needs initial_arrays: the model's named arrays, e.g. "
                "ArrayRecord(model.state_dict())"
            )
        named = {k: arrays[k].numpy() for k in arrays}
        try:
            self.layout = NamedLayout.from_arrays(named, self.sparse_keys)
        except ValueError as err:
            raise InitialArraysError(f"initial_arrays: {err}") from err
        self.x = self.layout.flatten(named)
        nodes = sample_nodes(
            grid,
            random.Random(0),
            1.0,
            self.min_train_nodes,
            self.min_available_nodes,
            timeout=self.exchange_timeout,
        )
        config = {"sparse-keys": list(self.sparse_keys)}
        if not self.sparse_keys:
            # a dense model: nothing to count (every heat is N), no query; FedAvg's contract
            self.node_rows = {int(n): {} for n in nodes}
            self.heat = named_heat(self.layout, [({}, 1) for _ in nodes])
        elif self.secure_aggregation is not None:
            self._count_heat_secure(grid, nodes, config)
        else:
            self._count_heat(grid, nodes, config)
        self._start_server()
        return num_rounds

    def _count_heat(self, grid: Grid, nodes: list[int], config: dict[str, Any]) -> None:
        """Run the counting query in the clear: every node's rows and examples."""
        assert self.layout is not None
        replies = self.send(grid, heat_messages(nodes, config))
        self._declared = {}
        checked = self.check(replies, self._decode_heat, "counting query")
        self.node_rows = {src: rows for src, (rows, _) in checked.accepted}
        self.node_partition = self._partition_order([src for src, _ in checked.accepted])
        self.bad_replies += checked.left_out
        self.heat = named_heat(self.layout, [v for _, v in checked.accepted])
        self.n_clients, self.n_params = self.heat.n_clients, self.layout.size

    def _sparse_rows_params(self) -> dict[str, int]:
        assert self.layout is not None
        return {f"rows-{k}": int(self.layout.n_rows(k)) for k in self.sparse_keys}

    def _count_heat_secure(self, grid: Grid, nodes: list[int], config: dict[str, Any]) -> None:
        """Run the counting query as a secure sum; every node then gets every row."""
        assert self.layout is not None and self.secure_aggregation is not None
        outcome = secure_sum(
            lambda msgs: self.send(grid, msgs), heat_messages(nodes, config),
            self.secure_aggregation, 0,
            transform={"name": "fedsubavg-heat", **self._sparse_rows_params()},
            keys=key_book(grid),
        )  # fmt: skip
        if outcome.content is None:
            raise RuntimeError(f"counting round (secure aggregation) failed: {outcome.failed}")
        self.bad_replies += len(outcome.failed)
        arrays = outcome.content.array_records["arrays"]
        metrics = outcome.content.metric_records["metrics"]
        self.heat = named_heat_from_counts(
            self.layout,
            {k: arrays[k].numpy() for k in self.sparse_keys},
            {k: arrays[f"{k}.samples"].numpy() for k in self.sparse_keys},
            int(metrics["clients"]),
            int(metrics["num-examples"]),
        )
        full = {k: np.arange(self.layout.n_rows(k), dtype=np.int64) for k in self.sparse_keys}
        # no node's rows are known: every node that took part gets the whole tables
        self.node_rows = {int(n): full for n in outcome.survivors}
        self.n_clients, self.n_params = self.heat.n_clients, self.layout.size

    def _decode_summed(self, reply: Message) -> tuple[RoundUpdate, int, dict]:
        """Decode a secure sum: Σ c_i (x_i − x) over the full model."""
        assert self.layout is not None
        record = reply.content.array_records["arrays"]
        metrics = reply.content.metric_records["metrics"]
        if sorted(record.keys()) != sorted(self.layout.keys):
            raise ValueError(f"summed arrays {sorted(record.keys())}, the model's "
                             f"{sorted(self.layout.keys)}")  # fmt: skip
        delta = self.layout.flatten({k: record[k].numpy() for k in self.layout.keys})
        if not np.all(np.isfinite(delta)):
            raise ValueError("the summed update is not finite")
        dense = np.concatenate(
            [self.layout.entries(k) for k in self.layout.keys if k not in self.layout.sparse]
            or [np.zeros(0, dtype=np.int64)]
        )
        touched = np.union1d(dense, np.flatnonzero(delta))  # the union: where the sum moved
        clients = int(metrics["clients"])
        part = RoundUpdate(touched.astype(np.int64), delta[touched], clients,
                           float(metrics["weight-sum"]))  # fmt: skip
        return part, 0, {}

    def _decode_heat(self, src: int, reply: Message) -> tuple[dict[str, np.ndarray], int]:
        assert self.layout is not None
        record = reply.content.array_records["arrays"]
        metrics = reply.content.metric_records["metrics"]
        n = int_metric(metrics, "num-examples")
        if n < 0 or (self.weighting == "samples" and n == 0):
            raise ValueError(f"num-examples = {n} in the heat reply")
        pid = int_metric(metrics, "partition-id", -1) if "partition-id" in metrics else None
        if pid is not None and pid < 0:
            raise ValueError(f"partition-id = {pid} in the heat reply")
        rows = {}
        for key in self.sparse_keys:
            if rows_key(key) not in record:
                raise ValueError(f"the heat reply lacks '{rows_key(key)}'")
            rows[key] = self.layout.check_rows(key, record[rows_key(key)].numpy())
        if pid is not None:
            self._declared[src] = pid
        return rows, n

    def _partition_order(self, nodes: list[int]) -> dict[int, int]:
        """Return node -> partition id if every counted node declared a distinct one.

        Then training samples clients by partition id (the same clients for the same seed
        whatever node ids the SuperLink gave); otherwise by node id, as Flower's FedAvg.
        """
        declared = {n: self._declared[n] for n in nodes if n in self._declared}
        if not declared:
            return {}
        if len(declared) < len(nodes) or len(set(declared.values())) < len(declared):
            log(WARNING, "counting query: partition ids missing or repeated (%d of %d nodes, "
                "%d distinct); sampling by node id", len(declared), len(nodes),
                len(set(declared.values())))  # fmt: skip
            return {}
        return declared

    def secure_transform(self) -> dict[str, Any] | None:
        """Under secure aggregation the nodes sum c_i (x_i − x) over the full model."""
        return {"name": "fedsubavg-weighted-delta", "weighting": self.weighting,
                **self._sparse_rows_params()}  # fmt: skip

    # ------------------------------------------------------------------ rounds
    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Return one ``train`` message per sampled node holding only its submodel."""
        assert self.layout is not None
        nodes = self._sample_counted(grid)
        extra = {"proximal-mu": self.proximal_mu} if self.proximal_mu > 0 else {}
        train_config = self.merged_config(config, server_round, **extra)
        messages, self._sent_values = [], {}
        down = 0
        for node in nodes:
            rows = self.node_rows.get(node, {})
            values = self.layout.gather(self.x, rows)
            self._sent_values[node] = values
            record = ArrayRecord()
            for key in self.layout.keys:
                record[key] = Array(np.array(values[key], order="C"))  # 0-d stays 0-d
                if key in self.layout.sparse:
                    record[rows_key(key)] = Array(rows[key])
            down += record.count_bytes()
            messages.append(train_message(node, record, train_config, server_round))
        self._round_stats = {"bytes-down": down}
        return messages

    def _sample_counted(self, grid: Grid) -> list[int]:
        """Sample like FedAvg among the connected nodes that answered the counting query."""
        counted = self.node_rows if self.sparse_keys else None
        nodes = [int(n) for n in grid.get_node_ids() if counted is None or int(n) in counted]
        if not nodes:
            raise NotEnoughNodesError("no node that answered the counting query is connected")
        part = self.node_partition
        by_partition = bool(part) and all(n in part for n in nodes)
        order = (lambda n: part[n]) if by_partition else (lambda n: n)
        nodes.sort(key=order)
        count = min(len(nodes), max(int(self.fraction_train * len(nodes)), self.min_train_nodes))
        return sorted(self.node_rng.sample(nodes, max(count, 1)), key=order)

    def merge_senders(self, nodes: list[int]) -> int:
        """Under secure aggregation: the summed reply is one sender (``summed_nodes``)."""
        return SUMMED_SENDER

    def decode_train_reply(self, src: int, reply: Message) -> tuple[RoundUpdate, int, dict]:
        """Check one node's reply; return its weighted update, payload bytes and metrics."""
        if src == SUMMED_SENDER:
            return self._decode_summed(reply)
        record = reply.content.array_records["arrays"]
        metrics = dict(reply.content.metric_records["metrics"])
        assert self.layout is not None
        rows = self.node_rows.get(src, {})
        expected = set(self.layout.keys) | {rows_key(k) for k in self.layout.sparse}
        if set(record) != expected:
            raise ValueError(
                f"reply arrays {sorted(record)} differ from the submodel sent {sorted(expected)}"
            )
        for key in self.layout.sparse:
            got = record[rows_key(key)].numpy()
            if got.dtype.kind not in "iu" or not np.array_equal(got, rows[key]):
                raise ValueError(f"'{rows_key(key)}' differs from the rows sent")
        for key in self.layout.keys:
            kind, sent = record[key].numpy().dtype.kind, self._sent_values[src][key].dtype.kind
            if kind != sent and not (kind in "iu" and sent in "iu"):
                raise ValueError(f"'{key}' has dtype kind {kind!r}, the model {sent!r}")
        n = metrics.get("num-examples")
        if not isinstance(n, int) or n < 0 or (self.weighting == "samples" and n == 0):
            raise ValueError(f"num-examples = {n!r}: expected a non-negative int")
        weight = 1.0 if self.weighting == "clients" else float(n)
        received = {k: record[k].numpy() for k in self.layout.keys}
        part = self.layout.update(self._sent_values[src], received, rows, weight)
        return part, record.count_bytes(), metrics

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sum the accepted updates (in node order) and apply the algorithm's server step."""
        assert self.layout is not None
        metrics, accepted = self._step(server_round, checked, self._sent_values)
        metrics.update(_weighted_means([m for _, (_, _, m) in accepted]))
        arrays = self.layout.unflatten(self.x)
        return ArrayRecord({k: Array(v) for k, v in arrays.items()}), MetricRecord(metrics)

    # ------------------------------------------------------------------ evaluation
    def evaluate_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """With ``fraction_evaluate > 0``: the full model to a sample of nodes."""
        sample = (self.fraction_evaluate, self.min_evaluate_nodes, self.min_available_nodes)
        return fedavg_evaluate_messages(grid, self.eval_rng, server_round, arrays, config,
                                        "evaluate", sample, self.exchange_timeout)  # fmt: skip

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Average the nodes' evaluation metrics weighted by ``num-examples``."""
        checked = self.check(
            replies,
            lambda src, reply: dict(reply.content.metric_records["metrics"]),
            f"round {server_round} (evaluate)",
            all_rejected_fails=False,
        )
        if not checked.accepted:
            return None
        return MetricRecord(_weighted_means([m for _, m in checked.accepted]))


def _weighted_means(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Average numeric metrics weighted by ``num-examples`` (summed), as Flower's FedAvg."""
    total = sum(int(m.get("num-examples", 0)) for m in metrics)
    out: dict[str, Any] = {"num-examples": total}
    keys = {k for m in metrics for k, v in m.items() if isinstance(v, int | float)}
    for key in sorted(keys - {"num-examples"}):
        pairs = [(float(m[key]), int(m.get("num-examples", 0))) for m in metrics if key in m]
        weight = sum(w for _, w in pairs)
        if weight:
            value = sum(v * w for v, w in pairs) / weight
        else:
            value = float(np.mean([v for v, _ in pairs]))
        out[key] = to_metric(value)
    return out


class FedAvgSubStrategy(FedSubAvgStrategy):
    """FedAvg on submodels: X_m += Δ̄_m, no feature-heat correction.

    Takes the parameters of :class:`FedSubAvgStrategy` (its ``algorithm`` is fixed).
    """

    algorithm = "fedavg-sub"


class FedProxSubStrategy(FedSubAvgStrategy):
    """FedProx on submodels: FedAvg's server step; clients add μ(x − x¹) (μ = 0.01).

    Parameters
    ----------
    *args, **kwargs
        As :class:`FedSubAvgStrategy`.
    proximal_mu : float, optional
        μ (default 0.01, Section 5.1), sent as ``proximal-mu`` in every train config.
    """

    algorithm = "fedprox-sub"

    def __init__(self, *args: Any, proximal_mu: float = 0.01, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.proximal_mu = float(proximal_mu)


class FedAdamSubStrategy(FedSubAvgStrategy):
    """FedAdam on submodels (Reddi et al.), Flower's ``FedAdam`` server step.

    Parameters
    ----------
    *args, **kwargs
        As :class:`FedSubAvgStrategy`.
    adam : AdamConfig, optional
        The server's learning rate η, moment decays β₁, β₂ and adaptivity τ
        (:class:`~flower_app.algorithms.fedsubavg.core.AdamConfig`; default
        ``AdamConfig()``: 1.0, 0.9, 0.99 and 1e-3, paper Table 5 (MovieLens); τ as
        Flower's ``FedAdam``).
    """

    algorithm = "fedadam-sub"

    def __init__(self, *args: Any, adam: AdamConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.adam = AdamConfig() if adam is None else adam


class ScaffoldSubStrategy(FedSubAvgStrategy):
    """The server-side SCAFFOLD approximation of App. D.2 on submodels.

    Takes the parameters of :class:`FedSubAvgStrategy` (its ``algorithm`` is fixed).
    """

    algorithm = "scaffold-sub"


def train_message(
    node: int, record: ArrayRecord, config: ConfigRecord, server_round: int
) -> Message:
    """Return the round's ``train`` message to ``node`` (group id ``train-<round>``)."""
    return Message(
        RecordDict({"arrays": record, "config": config}),
        dst_node_id=node,
        message_type=MessageType.TRAIN,
        group_id=f"train-{server_round}",
    )


#: algorithm name (run_config ``algorithm``) -> its public strategy
STRATEGIES: dict[str, type[FedSubAvgStrategy]] = {
    cls.algorithm: cls
    for cls in (
        FedSubAvgStrategy, FedAvgSubStrategy, FedProxSubStrategy, FedAdamSubStrategy,
        ScaffoldSubStrategy,
    )
}  # fmt: skip


def external_loop_refused(name: str) -> ValueError:
    """Return the error of another loop (a Flower DP wrapper) driving a submodel strategy."""
    return ValueError(
        f"another loop (a Flower DP wrapper) cannot drive {name} with "
        "sparse tables or cohorts: the wrapper clips whole-model replies and calibrates "
        "its noise to FedAvg's mean (C/K), while a node replies with its rows only and "
        "the heat correction N/n_m amplifies one client's update on cold rows up to "
        "N/n_m times; use fsa-dp-noise (cohort mode: the noise goes into the sum, "
        "and the correction after it is post-processing) or a dense model (no "
        "sparse_keys), docs/privacy.md"
    )
