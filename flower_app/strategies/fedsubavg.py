"""FedSubAvgStrategy: federated submodel averaging with feature-heat correction, + baselines.

Ding et al. (NeurIPS 2022), "Federated Submodel Optimization for Hot and Cold Data
Features", Algorithm 1, and the baselines of Section 5.1 on the same message contract:
FedAvg, FedProx (μ = 0.01), FedAdam (Table 5) and the server-side SCAFFOLD approximation of
Appendix D.2. The math lives in :mod:`flower_app.algorithms.fedsubavg`; this module moves it
over Flower's Message API.

Why not Flower's own ``FedAvg`` / ``FedProx`` / ``FedAdam``
    They broadcast one ``ArrayRecord`` (the full model) to every sampled node and average
    full arrays weighted by ``num-examples``. The submodel contract differs on each point:
    every node gets a different payload (only its sampled users' rows), a node answers
    with a sparse sum of row updates over several users (node ≠ user), the server needs
    the users' index sets before it can send anything (Algorithm 1, line 5), and FedSubAvg
    rescales each row by its feature heat, learnt in a counting round before training.
    Their *math* does fit: on a dense model, where every client touches every row, our
    FedAvg and FedAdam server steps give exactly Flower's ``FedAvg.aggregate_train`` and
    ``FedAdam.aggregate_train`` (tests/test_fedsubavg_flower_math.py checks it), and
    FedProx's clients read the same ``proximal-mu`` config key as with Flower's
    ``FedProx``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import INFO
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
from flwr.serverapp.strategy import Result, Strategy

from flower_app.algorithms.fedsubavg import (
    WEIGHTINGS,
    AdamConfig,
    ClientSampler,
    FeatureHeat,
    LocalConfig,
    RoundUpdate,
    ServerUpdate,
    client_bytes,
    make_server_update,
    merge_updates,
    resolve_clients_per_round,
)
from flower_app.strategies.discovery import CohortMap, discover_cohorts
from flower_app.strategies.replies import check_replies

__all__ = [
    "FedAdamSubStrategy",
    "FedAvgSubStrategy",
    "FedProxSubStrategy",
    "FedSubAvgStrategy",
    "ScaffoldSubStrategy",
    "decode_update",
]

RoundCallback = Callable[[dict[str, Any]], None]
EvaluateFn = Callable[[np.ndarray], dict[str, float]]


class BadReplyError(ValueError):
    """A node's reply that is left out of the aggregate."""


def decode_update(
    arrays: list[np.ndarray], allowed_rows: np.ndarray, n_users: int, metrics: dict[str, Any]
) -> RoundUpdate:
    """Check a node's train reply and return it as a :class:`RoundUpdate`.

    Parameters
    ----------
    arrays : list of numpy.ndarray
        ``[rows, sums]`` from the reply.
    allowed_rows : numpy.ndarray
        Sorted union of the submodels of the users sent to this node.
    n_users : int
        Users sent to this node.
    metrics : dict
        The reply's MetricRecord (``num-examples``, ``weight-sum``).

    Returns
    -------
    RoundUpdate
        The node's summed update.

    Raises
    ------
    BadReplyError
        On the wrong number of arrays, wrong shapes or dtypes, rows outside the node's
        submodel (or repeated, or unsorted), non-finite values, or counts that do not
        match what was sent.
    """
    if len(arrays) != 2:
        raise BadReplyError(f"expected 2 arrays [rows, sums], got {len(arrays)}")
    rows, sums = (np.asarray(a) for a in arrays)
    if rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise BadReplyError(f"rows must be a 1-D integer array, got {rows.dtype} {rows.shape}")
    if sums.shape != rows.shape or sums.dtype.kind != "f":
        raise BadReplyError(
            f"sums must be floats shaped like rows {rows.shape}, got {sums.dtype} {sums.shape}"
        )
    rows = rows.astype(np.int64)
    if rows.size > 1 and np.any(np.diff(rows) <= 0):
        raise BadReplyError("rows must be sorted and distinct")
    if not np.all(np.isin(rows, allowed_rows, assume_unique=True)):
        outside = rows[~np.isin(rows, allowed_rows, assume_unique=True)]
        raise BadReplyError(
            f"{outside.size} rows outside the node's submodel (first: {int(outside[0])})"
        )
    if not np.all(np.isfinite(sums)):
        raise BadReplyError("non-finite values in the update")
    n_ex = int(metrics["num-examples"])
    weight = float(metrics["weight-sum"])
    if n_ex != n_users:
        raise BadReplyError(f"update of {n_ex} users, {n_users} were sent")
    if not (np.isfinite(weight) and weight > 0):
        raise BadReplyError(f"weight-sum {weight} must be finite and positive")
    return RoundUpdate(rows, sums.astype(np.float64), n_ex, weight)


class FedSubAvgStrategy(Strategy):
    """Federated submodel training: FedSubAvg, or a baseline on the same contract.

    Before round 1 the server asks every node which users it serves (discovery) and how
    many of its users touch each model row (the counting round: the server adds the
    nodes' reports to get the feature heat n_m and W_m). Each round t = 1..R it samples K
    users uniformly without replacement (its own generator, seeded by ``seed``), asks
    their nodes for the users' index sets S(i), sends each node its users' submodel rows,
    and updates the full model with the nodes' summed row updates by the algorithm's
    server step. Client i's batches come from ``default_rng([seed, t, i])``, so results do
    not depend on the engine or on how users are split over nodes.

    Parameters
    ----------
    n_clients : int
        Number of clients N over all nodes.
    n_params : int
        Model rows M.
    num_rounds : int
        Communication rounds R.
    clients_per_round : int or float
        K, a count or a fraction of N; a count above N raises ValueError.
    algorithm : str, optional
        ``"fedsubavg"`` (default), ``"fedavg-sub"``, ``"fedprox-sub"``, ``"fedadam-sub"``
        or ``"scaffold-sub"``; the subclasses below fix it.
    local : LocalConfig, optional
        Clients' I, B, γ and μ (default: I = 10, B = 5, γ = 0.1, μ = 0).
    weighting : str, optional
        ``"clients"`` (Algorithm 1: coefficient N/n_m, plain means) or ``"samples"``
        (App. D.4: Σw/W_m, means weighted by training-set size). Default ``"clients"``.
    adam : AdamConfig, optional
        FedAdam's server hyperparameters (default: Table 5, MovieLens).
    seed : int, optional
        Seed of all randomness (default 0).
    initial_model : numpy.ndarray, optional
        Starting model (default zeros).
    evaluate_fn : callable, optional
        ``evaluate_fn(x) -> dict`` of metrics (e.g. train loss on 10,000 samples), called
        after every round; an experiment oracle the algorithm never uses.
    on_round : callable, optional
        Receives each round's metrics dict (e.g. to append to ``metrics.jsonl``).
    round_timeout : float, optional
        Seconds to wait for one exchange's replies (default 600).
    discovery_timeout : float, optional
        Seconds to wait until the nodes' cohorts cover all users (default 300).

    Notes
    -----
    Message contract (see also :mod:`flower_app.clients.submodel`, whose NumPyClient the
    adapter :mod:`flower_app.clients.adapter` drives):

    * ``query``, ``"config"`` ``{"kind": "cohort"}`` → ``"properties"`` ConfigRecord with
      int ``partition-id``, ``num-partitions``, ``first-user``, ``num-users``,
      ``n-users-total`` (N), ``n-elements`` (M).
    * ``query``, ``{"kind": "feature-heat"}`` → ``rows``, ``clients``, ``samples`` (lists
      of int: distinct rows of the node's users, how many users touch each, their summed
      training-set sizes), ``num-users``, ``num-samples`` (int).
    * ``query``, ``{"kind": "submodel", "users": list[int]}`` → ``users``, ``offsets``
      (len + 1), ``rows`` (lists of int): the users' index sets S(i), concatenated.
    * ``train``: ``"arrays"`` ArrayRecord ``"0"`` int64 users (k,), ``"1"`` int64 offsets
      (k+1,), ``"2"`` int32 rows (Σ|S(i)|,), ``"3"`` float64 values of those rows;
      ``"config"`` ConfigRecord ``server-round``, ``seed``, ``local-iters``,
      ``batch-size`` (int), ``lr``, ``proximal-mu`` (float), ``weighting`` (str). Reply
      ``"arrays"`` ``"0"`` int64 rows (sorted, ⊆ ∪ S(i)), ``"1"`` float64 Σ_i c_i Δx_i;
      ``"metrics"`` MetricRecord ``num-examples`` (= k), ``weight-sum`` (Σ c_i),
      ``samples``.

    A reply with an error, rows outside the node's submodel, non-finite values, the wrong
    shape or a wrong user count is logged, counted in ``bad-replies`` and left out: the
    round then averages over the users whose updates arrived (K in the formulas is the
    number of accepted users).
    """

    algorithm = "fedsubavg"

    def __init__(
        self,
        n_clients: int,
        n_params: int,
        num_rounds: int,
        clients_per_round: int | float,
        *,
        algorithm: str | None = None,
        local: LocalConfig | None = None,
        weighting: str = "clients",
        adam: AdamConfig | None = None,
        seed: int = 0,
        initial_model: np.ndarray | None = None,
        evaluate_fn: EvaluateFn | None = None,
        on_round: RoundCallback | None = None,
        round_timeout: float = 600.0,
        discovery_timeout: float = 300.0,
    ) -> None:
        if algorithm is not None:
            self.algorithm = algorithm
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting {weighting!r}: choose one of {WEIGHTINGS}")
        if num_rounds < 1:
            raise ValueError(f"num_rounds={num_rounds} must be >= 1")
        self.n_clients, self.n_params = int(n_clients), int(n_params)
        self.num_rounds = int(num_rounds)
        self.k = resolve_clients_per_round(clients_per_round, self.n_clients)
        self.local = local or LocalConfig()
        self.weighting = weighting
        self.adam = adam or AdamConfig()
        self.seed = int(seed)
        self.x = (
            np.zeros(self.n_params)
            if initial_model is None
            else np.array(initial_model, dtype=np.float64, copy=True)
        )
        if self.x.shape != (self.n_params,):
            raise ValueError(f"initial_model must have shape ({self.n_params},)")
        self.evaluate_fn = evaluate_fn
        self.on_round = on_round
        self.round_timeout = float(round_timeout)
        self.discovery_timeout = float(discovery_timeout)
        self.sampler = ClientSampler(self.n_clients, self.k, self.seed)
        self.cohorts: CohortMap | None = None
        self.heat: FeatureHeat | None = None
        self.server: ServerUpdate | None = None
        self.history: list[dict[str, Any]] = []
        self.bad_replies = 0
        self._sent: dict[int, tuple[int, np.ndarray]] = {}
        self._round_stats: dict[str, Any] = {}

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "%s(%s): N=%d clients, M=%d rows, R=%d rounds, K=%d, I=%d, B=%d, lr=%g, mu=%g, "
            "weighting=%s, seed=%d",
            type(self).__name__,
            self.algorithm,
            self.n_clients,
            self.n_params,
            self.num_rounds,
            self.k,
            self.local.iters,
            self.local.batch,
            self.local.lr,
            self.local.proximal_mu,
            self.weighting,
            self.seed,
        )

    def _train_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        return ConfigRecord(
            {
                **dict(config),
                "server-round": server_round,
                "seed": self.seed,
                "local-iters": self.local.iters,
                "batch-size": self.local.batch,
                "lr": float(self.local.lr),
                "proximal-mu": float(self.local.proximal_mu),
                "weighting": self.weighting,
            }
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample K users, fetch their index sets, build one ``train`` message per node."""
        if self.cohorts is None:
            raise RuntimeError("discovery has not run: call start()")
        users = self.sampler.sample()
        groups = self.cohorts.group(users)
        index_sets, bad, up = self._fetch_index_sets(server_round, groups, grid)
        train_config = self._train_config(server_round, config)
        messages, self._sent = [], {}
        down = 0
        sizes: list[np.ndarray] = []
        for node_id, (node_users, offsets, rows) in index_sets.items():
            record = ArrayRecord(
                {
                    "0": Array(node_users.astype(np.int64)),
                    "1": Array(offsets.astype(np.int64)),
                    "2": Array(rows.astype(np.int32)),
                    "3": Array(self.x[rows]),
                }
            )
            down += record.count_bytes()
            sizes.append(np.diff(offsets))
            self._sent[node_id] = (int(node_users.size), np.unique(rows))
            messages.append(
                Message(
                    RecordDict({"arrays": record, "config": train_config}),
                    dst_node_id=node_id,
                    message_type=MessageType.TRAIN,
                    group_id=f"train-{server_round}",
                )
            )
        per_client = client_bytes(np.concatenate(sizes) if sizes else np.zeros(0, np.int64))
        self._round_stats = {
            "bad-replies": bad,
            "bytes-down": down,
            "bytes-up": up,
            "bytes-down-client-mean": float(per_client["down"].mean()) if sizes else 0.0,
            "bytes-down-client-max": int(per_client["down"].max()) if sizes else 0,
            "submodel-rows-mean": float(np.concatenate(sizes).mean()) if sizes else 0.0,
        }
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the nodes' updates, sum the valid ones and apply the server step."""
        if self.server is None:
            raise RuntimeError("the server step is built in start(), after the counting round")
        up = self._round_stats["bytes-up"]

        def decode(src: int, reply: Message) -> tuple[RoundUpdate, int]:
            record = reply.content.array_records["arrays"]
            metrics = dict(reply.content.metric_records["metrics"])
            n_users, allowed = self._sent[src]
            part = decode_update(record.to_numpy_ndarrays(), allowed, n_users, metrics)
            return part, record.count_bytes()

        checked = check_replies(replies, decode, self._sent, f"round {server_round}")
        parts = [(src, part) for src, (part, _) in checked.accepted]
        up += sum(nbytes for _, (_, nbytes) in checked.accepted)
        bad, missing = checked.bad + self._round_stats["bad-replies"], checked.missing
        # add the nodes in the order of their users, whatever the order replies arrived in
        order = {n: i for i, n in enumerate(self._sent)}
        update = merge_updates([p for _, p in sorted(parts, key=lambda sp: order[sp[0]])])
        self.server.step(self.x, update, server_round)
        self.bad_replies += bad + missing
        metrics = MetricRecord(
            {
                **{k: v for k, v in self._round_stats.items() if k not in ("bytes-up",)},
                "bad-replies": bad + missing,
                "bytes-up": up,
                "clients": update.clients,
                "nodes": len(self._sent),
                "union-rows": int(update.rows.size),
            }
        )
        return ArrayRecord({"x": Array(self.x)}), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Return no messages: the model is evaluated on the server (``evaluate_fn``)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return None (no federated evaluation)."""
        return None

    # ------------------------------------------------------------------ protocol steps
    def count_heat(self, grid: Grid) -> FeatureHeat:
        """Run the counting round: every node reports its users' row counts; sum them.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.

        Returns
        -------
        FeatureHeat
            n_m and W_m over all N clients.

        Raises
        ------
        RuntimeError
            If a node fails or the counts do not cover exactly the N clients.
        """
        if self.cohorts is None:
            raise RuntimeError("discovery has not run")
        content = RecordDict({"config": ConfigRecord({"kind": "feature-heat"})})
        msgs = [
            Message(content, dst_node_id=int(n), message_type=MessageType.QUERY, group_id="heat")
            for n in self.cohorts.node_ids
        ]
        heat = FeatureHeat.zeros(self.n_params)
        for reply in grid.send_and_receive(msgs, timeout=self.round_timeout):
            src = reply.metadata.src_node_id
            if reply.has_error():
                raise RuntimeError(f"counting round: node {src} failed: {reply.error.reason}")
            p = reply.content.config_records["properties"]
            try:
                heat.add(
                    np.asarray(p["rows"], dtype=np.int64),
                    np.asarray(p["clients"], dtype=np.int64),
                    np.asarray(p["samples"], dtype=np.int64),
                    int(p["num-users"]),
                    int(p["num-samples"]),
                )
            except (KeyError, ValueError) as err:
                raise RuntimeError(f"counting round: bad report from node {src}: {err}") from err
        if heat.n_clients != self.n_clients:
            raise RuntimeError(
                f"counting round covered {heat.n_clients} of {self.n_clients} clients"
            )
        return heat

    def _fetch_index_sets(
        self, server_round: int, groups: dict[int, np.ndarray], grid: Grid
    ) -> tuple[dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]], int, int]:
        """Ask each node for its sampled users' index sets S(i) (Algorithm 1, line 5)."""
        msgs = []
        for node_id, node_users in groups.items():
            cfg = ConfigRecord({"kind": "submodel", "users": node_users.astype(int).tolist()})
            msgs.append(
                Message(
                    RecordDict({"config": cfg}),
                    dst_node_id=node_id,
                    message_type=MessageType.QUERY,
                    group_id=f"submodel-{server_round}",
                )
            )

        def decode(src: int, reply: Message) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            p = reply.content.config_records["properties"]
            users = np.asarray(p["users"], dtype=np.int64)
            offsets = np.asarray(p["offsets"], dtype=np.int64)
            rows = np.asarray(p["rows"], dtype=np.int64)
            if not np.array_equal(users, groups[src]):
                raise BadReplyError("index sets of other users than requested")
            if (
                offsets.shape != (users.size + 1,)
                or offsets[0] != 0
                or offsets[-1] != rows.size
                or np.any(np.diff(offsets) < 0)
            ):
                raise BadReplyError("malformed offsets")
            if rows.size and (rows.min() < 0 or rows.max() >= self.n_params):
                raise BadReplyError(f"rows outside 0..{self.n_params - 1}")
            return users, offsets, rows

        replies = grid.send_and_receive(msgs, timeout=self.round_timeout)
        checked = check_replies(replies, decode, groups, f"round {server_round} (index sets)")
        out = dict(checked.accepted)
        up = sum(rows.size * 4 + offsets.size * 8 for _, offsets, rows in out.values())
        bad, missing = checked.bad, checked.missing
        # keep node order = order of the sampled users (deterministic message order)
        return {n: out[n] for n in groups if n in out}, bad + missing, up

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
        """Run discovery, the counting round and the R rounds.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        initial_arrays : ArrayRecord, optional
            ``{"x": float64 (M,)}``: a starting model (default: the constructor's).
        num_rounds : int, optional
            Overrides R.
        timeout : float, optional
            Overrides ``round_timeout``.
        train_config : ConfigRecord, optional
            Extra entries for the train messages.
        evaluate_config : ConfigRecord, optional
            Unused (evaluation runs on the server).
        evaluate_fn : callable, optional
            Flower-style ``evaluate_fn(round, arrays) -> MetricRecord``; prefer the
            constructor's.

        Returns
        -------
        Result
            ``arrays["x"]``: the final model; per-round metrics in
            ``train_metrics_clientapp``; evaluation in ``evaluate_metrics_serverapp``.
        """
        if num_rounds is not None:
            self.num_rounds = int(num_rounds)
        if timeout is not None:
            self.round_timeout = float(timeout)
        if initial_arrays is not None and "x" in initial_arrays:
            self.x = np.array(initial_arrays["x"].numpy(), dtype=np.float64, copy=True)
        self.summary()
        t0 = time.perf_counter()
        self.cohorts = discover_cohorts(
            grid, self.n_clients, self.n_params, timeout=self.discovery_timeout
        )
        self.heat = self.count_heat(grid)
        log(
            INFO,
            "counting round: feature heat dispersion n_max/n_min = %.0f (rows touched: %d)",
            self.heat.dispersion(),
            int((self.heat.clients > 0).sum()),
        )
        self.server = make_server_update(
            self.algorithm,
            self.n_params,
            self.n_clients,
            heat=self.heat,
            weighting=self.weighting,
            adam=self.adam,
        )
        result = Result()
        arrays = ArrayRecord({"x": Array(self.x)})
        for t in range(1, self.num_rounds + 1):
            r0 = time.perf_counter()
            messages = self.configure_train(t, arrays, train_config or ConfigRecord(), grid)
            replies = grid.send_and_receive(messages, timeout=self.round_timeout)
            arrays, metrics = self.aggregate_train(t, replies)
            row: dict[str, Any] = {"server-round": t, **dict(metrics)}
            if self.evaluate_fn is not None:
                row.update(self.evaluate_fn(self.x))
                result.evaluate_metrics_serverapp[t] = MetricRecord(
                    {k: float(v) for k, v in row.items() if k.endswith(("loss", "accuracy"))}
                )
            elif evaluate_fn is not None:
                res = evaluate_fn(t, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[t] = res
                    row.update(dict(res))
            row["round-time"] = time.perf_counter() - r0
            row["wall-time"] = time.perf_counter() - t0
            result.train_metrics_clientapp[t] = metrics
            self._log_round(row)
        result.arrays = arrays
        return result

    def _log_round(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        log(
            INFO,
            "[round %d/%d] train loss %s  clients=%d nodes=%d bad=%d  up=%d B down=%d B  %.2f s",
            row["server-round"],
            self.num_rounds,
            f"{row['train-loss']:.5f}" if "train-loss" in row else "n/a",
            row["clients"],
            row["nodes"],
            row["bad-replies"],
            row["bytes-up"],
            row["bytes-down"],
            row["round-time"],
        )
        if self.on_round is not None:
            self.on_round(row)


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
        μ (default 0.01, Section 5.1); replaces ``local.proximal_mu``.
    """

    algorithm = "fedprox-sub"

    def __init__(self, *args: Any, proximal_mu: float = 0.01, **kwargs: Any) -> None:
        local = kwargs.pop("local", None) or LocalConfig()
        kwargs["local"] = LocalConfig(local.iters, local.batch, local.lr, float(proximal_mu))
        super().__init__(*args, **kwargs)


class FedAdamSubStrategy(FedSubAvgStrategy):
    """FedAdam on submodels (Reddi et al.; paper Table 5 hyperparameters via ``adam``).

    Takes the parameters of :class:`FedSubAvgStrategy` (its ``algorithm`` is fixed).
    """

    algorithm = "fedadam-sub"


class ScaffoldSubStrategy(FedSubAvgStrategy):
    """The server-side SCAFFOLD approximation of App. D.2 on submodels.

    Takes the parameters of :class:`FedSubAvgStrategy` (its ``algorithm`` is fixed).
    """

    algorithm = "scaffold-sub"
