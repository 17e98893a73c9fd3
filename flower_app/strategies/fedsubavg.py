"""FedSubAvgStrategy: federated submodel averaging with feature-heat correction, + baselines.

Ding et al. (NeurIPS 2022), "Federated Submodel Optimization for Hot and Cold Data
Features", Algorithm 1, and the baselines of Section 5.1 on the same message contract:
FedAvg, FedProx (μ = 0.01), FedAdam (Table 5) and the server-side SCAFFOLD approximation of
Appendix D.2. The math lives in :mod:`flower_app.algorithms.fedsubavg.core` (server steps on a
flat vector of rows) and :mod:`flower_app.algorithms.fedsubavg.named` (a model of named
arrays mapped onto that vector); this module moves it over Flower's Message API on the loop
of :class:`~flower_app.strategies.base.RoundStrategy`.

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
from collections.abc import Callable, Iterable, Sequence
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

from flower_app.algorithms.common.gaussian_dp import GaussianAccountant, GaussianDP, dp_config
from flower_app.algorithms.fedsubavg.core import (
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
from flower_app.algorithms.fedsubavg.named import (
    NamedLayout,
    named_heat,
    named_heat_from_counts,
    rows_key,
)
from flower_app.privacy.secagg_server import SecureAggregation, key_book, secure_sum
from flower_app.strategies.base import SUMMED_SENDER, RoundStrategy
from flower_app.strategies.discovery import CohortMap, discover_cohorts
from flower_app.strategies.errors import InitialArraysError, NotEnoughNodesError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.fedsubavg_cohorts import (
    HEAT_QUERY,
    HEAT_TRAIN,
    BadReplyError,
    add_heat_report,
    decode_index_sets,
    decode_update,
    heat_messages,
    index_set_messages,
)
from flower_app.strategies.records import to_metric
from flower_app.strategies.replies import CheckedReplies, int_metric
from flower_app.strategies.sampling import fedavg_evaluate_messages, sample_nodes

__all__ = [
    "HEAT_QUERY",
    "BadReplyError",
    "FedAdamSubStrategy",
    "FedAvgSubStrategy",
    "FedProxSubStrategy",
    "FedSubAvgStrategy",
    "ScaffoldSubStrategy",
    "decode_update",
]

RoundCallback = Callable[[dict[str, Any]], None]


class FedSubAvgStrategy(RoundStrategy):
    """Federated submodel training: FedSubAvg, or a baseline on the same contract.

    **Plain mode** (default): one node is one client; the model is the user's
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

    **Cohort mode** (``cohorts=True``, the reproductions): a node serves many users of a
    MovieLens-style task (flat model ``"x"`` of M rows); discovery finds the cohorts, the
    server samples K users per round (its own generator), asks their nodes for the users'
    index sets S(i) in ``before_round`` and sends each node its users' rows. Client i's
    batches come from ``default_rng([seed, t, i])``, so results do not depend on the engine
    or on how users are split over nodes. ``initial_arrays`` is ``{"x": float (M,)}`` or
    None (zeros; ``evaluate_fn`` then gets an empty ArrayRecord at round 0).

    Parameters
    ----------
    sparse_keys : sequence of str, optional
        Plain mode: names of the sparse (row-indexed) arrays of ``initial_arrays``
        (default none: every array dense; then no counting query is sent and a FedAvg
        ClientApp serves unchanged: ``FedAvgSubStrategy(weighting="samples")`` is FedAvg).
    fraction_train : float, optional
        Plain mode: fraction of the counted nodes sampled per round (default 1.0).
    min_train_nodes : int, optional
        Plain mode: least nodes sampled per round (default 2).
    min_available_nodes : int, optional
        Plain mode: nodes to wait for before the counting query (default 2).
    fraction_evaluate : float, optional
        Plain mode: fraction of nodes sent the *full* model in an ``evaluate`` message after
        each round (default 1.0, as Flower's ``FedAvg``: the one-line swap keeps the
        federated evaluation; 0.0 turns it off, e.g. with an ``evaluate_fn``, since the full
        model download is what submodels avoid).
    min_evaluate_nodes : int, optional
        Plain mode: least nodes evaluated when ``fraction_evaluate > 0`` (default 2).
    weighting : str, optional
        ``"clients"`` (Algorithm 1: coefficient N/n_m, plain means) or ``"samples"``
        (App. D.4: Σw/W_m, means weighted by ``num-examples``). Default ``"clients"``.
    seed : int, optional
        Seed of all randomness (default 0).
    algorithm : str, optional
        ``"fedsubavg"`` (default), ``"fedavg-sub"``, ``"fedprox-sub"``, ``"fedadam-sub"``
        or ``"scaffold-sub"``; the subclasses below fix it.
    adam : AdamConfig, optional
        FedAdam's server hyperparameters (default: Table 5, MovieLens).
    proximal_mu : float, optional
        FedProx's μ, sent to the clients as ``proximal-mu`` (plain mode: only when > 0;
        cohort mode: ``local.proximal_mu`` is used). Default 0.
    cohorts : bool, optional
        Cohort mode (default False).
    n_clients, n_params : int, optional
        Cohort mode: users N over all nodes and model rows M.
    clients_per_round : int or float, optional
        Cohort mode: K, a count or a fraction of N; a count above N raises ValueError.
    local : LocalConfig, optional
        Cohort mode: the clients' I, B, γ and μ, sent as ``local-iters``, ``batch-size``,
        ``lr``, ``proximal-mu`` (default: I = 10, B = 5, γ = 0.1, μ = 0).
    discovery_timeout : float, optional
        Cohort mode: seconds to wait until the cohorts cover all users (default 300).
    on_round : callable, optional
        Receives each round's row (e.g. to append to ``metrics.jsonl``).
    min_reply_fraction : float, optional
        Least fraction of a round's clients whose replies must arrive and be accepted, else
        the run stops with ``TooFewRepliesError`` (default 0.0: aggregate what came; the
        failed nodes are recorded per round).

    Notes
    -----
    Message contract (``<key>`` a sparse array of shape ``(R, *d)``, r the node's rows of it;
    ``<dense>`` any other array; k the node's sampled users):

    =================  ====================================  ==================================
    message (mode)     server → node                         node → server
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
    ``query.cohort``   ``"config"``: ``kind`` = cohort       ``"properties"``: ``partition-id``,
    (cohort)                                                 ``num-partitions``, ``first-user``,
                                                             ``num-users``, ``n-users-total``,
                                                             ``n-elements`` (int)
    ``query.``         ``"config"``: ``kind`` =              ``"properties"``: ``rows``,
    ``feature_heat``   ``"feature-heat"``                    ``clients``, ``samples`` list[int],
    (cohort)                                                 ``num-users``, ``num-samples`` int
    ``query.``         ``"config"``: ``kind``, ``users``     ``"properties"``: ``users``,
    ``submodel``       list[int]                             ``offsets`` (k+1), ``rows``
    (cohort)                                                 list[int]: S(i) concatenated
    ``train``          ``"arrays"``: ``"0"`` int64 users     ``"arrays"``: ``"0"`` int64 rows
    (cohort)           (k,), ``"1"`` int64 offsets (k+1,),   (sorted, ⊆ ∪S(i)), ``"1"`` float64
                       ``"2"`` int32 rows, ``"3"`` float64   Σ_i c_i Δx_i; ``"metrics"``:
                       values; ``"config"``: ``seed``,       ``num-examples`` (= k),
                       ``local-iters``, ``batch-size``,      ``weight-sum`` (Σ c_i),
                       ``lr``, ``proximal-mu``,              ``samples``
                       ``weighting``, ``server-round``
    =================  ====================================  ==================================

    A reply with an error, rows other than those sent, non-finite values, the wrong shape
    or count is logged, counted in ``bad-replies`` and left out (K in the formulas is the
    number of accepted clients); a round in which all are left out fails the run.
    """

    algorithm = "fedsubavg"

    supports_secure_aggregation = True

    def __init__(
        self,
        sparse_keys: Sequence[str] = (),
        *,
        fraction_train: float = 1.0,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        fraction_evaluate: float = 1.0,
        min_evaluate_nodes: int = 2,
        weighting: str = "clients",
        seed: int = 0,
        algorithm: str | None = None,
        adam: AdamConfig | None = None,
        proximal_mu: float = 0.0,
        cohorts: bool = False,
        n_clients: int | None = None,
        n_params: int | None = None,
        clients_per_round: int | float | None = None,
        local: LocalConfig | None = None,
        discovery_timeout: float = 300.0,
        on_round: RoundCallback | None = None,
        min_reply_fraction: float = 0.0,
        secure_aggregation: SecureAggregation | None = None,
        dp: GaussianDP | None = None,
    ) -> None:
        super().__init__(
            on_round=on_round,
            min_reply_fraction=min_reply_fraction,
            secure_aggregation=secure_aggregation,
        )
        if dp is not None and (secure_aggregation is None or not cohorts):
            raise ValueError("client-level DP (dp=) needs cohorts=True and secure_aggregation")
        if dp is not None and weighting != "clients":
            raise ValueError("client-level DP needs weighting='clients' (bounded sensitivity)")
        self.dp = dp
        if algorithm is not None:
            self.algorithm = algorithm
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
        self.adam = adam or AdamConfig()
        self.proximal_mu = float(proximal_mu)
        self.cohorts_mode = bool(cohorts)
        self.local = local or LocalConfig()
        self.discovery_timeout = float(discovery_timeout)
        self.node_rng = random.Random(self.seed)
        # evaluation samples from its own stream: fraction_evaluate does not move training's
        self.eval_rng = random.Random(f"{self.seed}-evaluate")
        self.heat: FeatureHeat | None = None
        self.server: ServerUpdate | None = None
        self.x = np.zeros(0)
        self.bad_replies = 0
        self.n_clients = 0 if n_clients is None else int(n_clients)
        self.n_params = 0 if n_params is None else int(n_params)
        # plain mode
        self.layout: NamedLayout | None = None
        self.node_rows: dict[int, dict[str, np.ndarray]] = {}
        # partition id each node declared in the counting query (optional)
        self.node_partition: dict[int, int] = {}
        self._declared: dict[int, int] = {}
        self._sent_values: dict[int, dict[str, np.ndarray]] = {}
        # cohort mode
        self.cohorts: CohortMap | None = None
        self.k = 0
        self.sampler: ClientSampler | None = None
        self._index_sets: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._sent: dict[int, tuple[int, np.ndarray]] = {}
        self._round_stats: dict[str, Any] = {}
        self._dp_sampled = 0
        self._support: np.ndarray | None = None
        if self.cohorts_mode:
            if n_clients is None or n_params is None or clients_per_round is None:
                raise ValueError("cohorts=True needs n_clients, n_params and clients_per_round")
            self.k = resolve_clients_per_round(clients_per_round, self.n_clients)
            self.sampler = ClientSampler(self.n_clients, self.k, self.seed)
            self.x = np.zeros(self.n_params)
        #: client-level DP: ε against the server and outsiders (cohort mode only)
        self.accountant = None if dp is None else GaussianAccountant(dp, self.n_clients)
        # cohort mode checkpoints x, the server step's state and the client sampler
        self.resumable = self.cohorts_mode


    def checkpoint_state(self) -> dict[str, Any]:
        """Return the cohort-mode server state.

        x, the server step's state (e.g. Adam moments, SCAFFOLD's c), the client sampler with
        its generator and the bad-reply count.
        """
        return {
            "x": self.x.copy(), "server": self.server, "sampler": self.sampler,
            "bad-replies": self.bad_replies, "dp-accountant": self.accountant,
        }  # fmt: skip

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint (after ``setup``'s discovery and counting round).

        Raises
        ------
        TypeError, ValueError
            If the checkpoint is not a FedSubAvg state of a model of this size.
        """
        if not isinstance(state, dict) or not {"x", "server", "sampler"} <= set(state):
            raise TypeError("a FedSubAvg checkpoint holds x, server and sampler")
        x = np.asarray(state["x"], dtype=np.float64)
        if x.shape != self.x.shape or type(state["server"]) is not type(self.server):
            raise ValueError(
                f"checkpoint of {x.size} parameters ({type(state['server']).__name__}) does "
                f"not match this run's {self.x.size} ({type(self.server).__name__})"
            )
        self.x[:] = x
        self.server, self.sampler = state["server"], state["sampler"]
        self.bad_replies = int(state.get("bad-replies", 0))
        if self.accountant is not None:  # ε goes on from where it was
            if not isinstance(state.get("dp-accountant"), GaussianAccountant):
                raise TypeError("a DP run resumes only from a checkpoint with its accountant")
            self.accountant = state["dp-accountant"]

    # ------------------------------------------------------------------ setup
    def summary(self) -> None:
        """Log the strategy's settings."""
        if self.cohorts_mode:
            log(
                INFO,
                "%s(%s, cohorts): N=%d clients, M=%d rows, K=%d, I=%d, B=%d, lr=%g, mu=%g, "
                "weighting=%s, seed=%d",
                type(self).__name__, self.algorithm, self.n_clients, self.n_params, self.k,
                self.local.iters, self.local.batch, self.local.lr, self.local.proximal_mu,
                self.weighting, self.seed,
            )
        else:
            log(
                INFO,
                "%s(%s): sparse_keys=%s, fraction_train=%g, min_train_nodes=%d, "
                "weighting=%s, seed=%d",
                type(self).__name__, self.algorithm, list(self.sparse_keys), self.fraction_train,
                self.min_train_nodes, self.weighting, self.seed,
            )

    def check_external_loop(self) -> None:
        """Refuse another loop (Flower's DP wrappers) unless the model is dense (FedAvg).

        The loops that drive a strategy from outside are Flower's DP wrappers. Flower's
        ``DifferentialPrivacy*`` wrappers clip each reply as a whole model and add
        N(0, (σC/K)²) to the aggregated model: FedAvg's sensitivity. With sparse tables
        (or in cohort mode) neither holds: a node replies with its rows only (the
        server-side clip subtracts the full model from them), and FedSubAvg multiplies
        row m's mean update by N/n_m, so one client's clipped update moves a cold row by up
        to N/n_m·C/K, far beyond the noise. Without ``sparse_keys`` every n_m = N and the
        strategy is FedAvg (uniform with ``weighting="clients"``), which the wrappers fit.

        Raises
        ------
        ValueError
            If another loop drives a strategy with sparse tables or in cohort mode.
        """
        if self.cohorts_mode or self.sparse_keys:
            raise ValueError(
                f"another loop (a Flower DP wrapper) cannot drive {type(self).__name__} with "
                "sparse tables or cohorts: the wrapper clips whole-model replies and calibrates "
                "its noise to FedAvg's mean (C/K), while a node replies with its rows only and "
                "the heat correction N/n_m amplifies one client's update on cold rows up to "
                "N/n_m times; use fsa-dp-noise (cohort mode: the noise goes into the sum, "
                "and the correction after it is post-processing) or a dense model (no "
                "sparse_keys), docs/privacy.md"
            )

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Learn the feature heat (and, in cohort mode, the cohorts); build the server step."""
        if self.cohorts_mode:
            self._setup_cohorts(grid, arrays)
        else:
            self._setup_plain(grid, arrays)
        assert self.heat is not None
        log(
            INFO,
            "counting query: parameter heat dispersion n_max/n_min = %.0f over %d clients "
            "(all touched rows, dense ones included; summary.json: parameter-heat-dispersion; "
            "entries touched: %d of %d)",
            self.heat.dispersion(), self.heat.n_clients,
            int((self.heat.clients > 0).sum()), self.heat.clients.size,
        )
        self.server = make_server_update(
            self.algorithm, self.x.size, self.heat.n_clients,
            heat=self.heat, weighting=self.weighting, adam=self.adam,
        )
        return num_rounds

    def _setup_plain(self, grid: Grid, arrays: ArrayRecord) -> None:
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
            grid, random.Random(0), 1.0, self.min_train_nodes, self.min_available_nodes,
            timeout=self.exchange_timeout,
        )
        if not self.sparse_keys:
            # a dense model: nothing to count (every heat is N), no query; FedAvg's contract
            self.node_rows = {int(n): {} for n in nodes}
            self.heat = named_heat(self.layout, [({}, 1) for _ in nodes])
            return
        config = {"sparse-keys": list(self.sparse_keys)}
        if self.secure_aggregation is not None:
            self._count_heat_plain_secure(grid, nodes, config)
            return
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

    def secure_transform(self) -> dict[str, Any] | None:
        """Plain mode under secure aggregation: nodes sum c_i (x_i − x) over the full model."""
        if self.cohorts_mode:
            return None
        return {"name": "fedsubavg-weighted-delta", "weighting": self.weighting,
                **self._sparse_rows_params()}  # fmt: skip

    def _count_heat_plain_secure(
        self, grid: Grid, nodes: list[int], config: dict[str, Any]
    ) -> None:
        """Plain mode's counting round as a secure sum; every node then gets every row."""
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

    def _decode_summed_plain(self, reply: Message) -> tuple[RoundUpdate, int, dict]:
        """Plain mode, secure aggregation: Σ c_i (x_i − x) over the full model."""
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

    def _setup_cohorts(self, grid: Grid, arrays: ArrayRecord) -> None:
        if arrays is not None and len(arrays):
            if list(arrays) != ["x"] or arrays["x"].shape != (self.n_params,):
                raise InitialArraysError(
                    f"cohort mode takes initial_arrays {{'x': float ({self.n_params},)}}, "
                    f"got keys {list(arrays)}"
                )
            self.x = np.array(arrays["x"].numpy(), dtype=np.float64, copy=True)
        self.cohorts = discover_cohorts(
            grid, self.n_clients, self.n_params, timeout=self.discovery_timeout
        )
        self.heat = self.count_heat(grid)

    def count_heat(self, grid: Grid) -> FeatureHeat:
        """Cohort mode's counting round: every node reports its users' row counts; sum them.

        Raises
        ------
        RuntimeError
            If a node fails or the counts do not cover exactly the N clients.
        """
        if self.cohorts is None:
            raise RuntimeError("discovery has not run")
        if self.secure_aggregation is not None:
            return self._count_heat_secure(grid)
        heat = FeatureHeat.zeros(self.n_params)
        messages = heat_messages(self.cohorts.node_ids, {"kind": "feature-heat"})
        for reply in self.send(grid, messages):
            src = reply.metadata.src_node_id
            if reply.has_error():
                raise RuntimeError(f"counting round: node {src} failed: {reply.error.reason}")
            try:
                add_heat_report(heat, reply)
            except (KeyError, ValueError) as err:
                raise RuntimeError(f"counting round: bad report from node {src}: {err}") from err
        if heat.n_clients != self.n_clients:
            raise RuntimeError(
                f"counting round covered {heat.n_clients} of {self.n_clients} clients"
            )
        return heat

    def _count_heat_secure(self, grid: Grid) -> FeatureHeat:
        """Run the counting round as a secure sum of dense per-row counts (all nodes)."""
        assert self.cohorts is not None and self.secure_aggregation is not None
        content = RecordDict({"config": ConfigRecord({"kind": "feature_heat"})})
        messages = messages_to(self.cohorts.node_ids, content, HEAT_TRAIN, "heat")
        outcome = secure_sum(
            lambda msgs: self.send(grid, msgs), messages, self.secure_aggregation,
            0, keys=key_book(grid),
        )  # fmt: skip
        if outcome.failed or outcome.content is None:
            raise RuntimeError(f"counting round (secure aggregation) failed: {outcome.failed}")
        arrays = outcome.content.array_records["arrays"]
        clients, samples = arrays["0"].numpy(), arrays["1"].numpy()
        metrics = outcome.content.metric_records["metrics"]
        rows = np.flatnonzero(clients)
        heat = FeatureHeat.zeros(self.n_params)
        heat.add(rows, clients[rows], samples[rows], int(metrics["num-examples"]),
                 int(metrics["num-samples"]))  # fmt: skip
        if heat.n_clients != self.n_clients:
            raise RuntimeError(
                f"counting round covered {heat.n_clients} of {self.n_clients} clients"
            )
        return heat

    # ------------------------------------------------------------------ rounds
    def before_round(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> None:
        """Cohort mode: sample K users and fetch their index sets S(i) (Alg. 1, line 5).

        Under secure aggregation the index sets are not asked for: every node gets the
        full model and cuts its users' submodels itself.
        """
        if not self.cohorts_mode:
            return
        assert self.cohorts is not None and self.sampler is not None
        groups = self.group_users(self.sampler.sample())
        if self.secure_aggregation is not None:
            self._index_sets = {n: (users, np.zeros(0), np.zeros(0)) for n, users in groups.items()}
            self._round_stats = {"bad-replies": 0, "bytes-up": 0}
            return
        replies = self.send(grid, index_set_messages(server_round, groups))
        checked = self.check(
            replies,
            lambda src, reply: decode_index_sets(reply, groups[src], self.n_params),
            f"round {server_round} (index sets)",
        )
        found = dict(checked.accepted)
        # keep node order = order of the sampled users (deterministic message order)
        self._index_sets = {n: found[n] for n in groups if n in found}
        up = sum(rows.size * 4 + offsets.size * 8 for _, offsets, rows in found.values())
        self._round_stats = {"bad-replies": checked.left_out, "bytes-up": up}

    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Return one ``train`` message per sampled node holding only its submodel."""
        if self.cohorts_mode:
            return self._cohort_train_messages(server_round, config)
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
            messages.append(_train_message(node, record, train_config, server_round))
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

    def _cohort_train_messages(self, server_round: int, config: ConfigRecord) -> list[Message]:
        train_config = self.merged_config(
            config,
            server_round,
            seed=self.seed,
            **{
                "local-iters": self.local.iters,
                "batch-size": self.local.batch,
                "lr": float(self.local.lr),
                "proximal-mu": float(self.local.proximal_mu),
                "weighting": self.weighting,
            },
        )
        messages, self._sent = [], {}
        down = 0
        sizes: list[np.ndarray] = []
        if self.secure_aggregation is not None:
            return self._secure_train_messages(server_round, train_config)
        for node_id, (node_users, offsets, rows) in self._index_sets.items():
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
            messages.append(_train_message(node_id, record, train_config, server_round))
        per_client = client_bytes(np.concatenate(sizes) if sizes else np.zeros(0, np.int64))
        self._round_stats.update(
            {
                "bytes-down": down,
                "bytes-down-client-mean": float(per_client["down"].mean()) if sizes else 0.0,
                "bytes-down-client-max": int(per_client["down"].max()) if sizes else 0,
                "submodel-rows-mean": float(np.concatenate(sizes).mean()) if sizes else 0.0,
            }
        )
        return messages

    def _secure_train_messages(self, server_round: int, config: ConfigRecord) -> list[Message]:
        """Secure aggregation: the full model and the node's users (no index sets)."""
        messages, self._sent, down = [], {}, 0
        shared = {"1": Array(self.x.astype(np.float64))}  # the same for every node
        if self.dp is not None:
            sampled = sum(int(u.size) for u, _, _ in self._index_sets.values())
            config = ConfigRecord({**dict(config), **dp_config(self.dp, sampled)})
            self._dp_sampled = sampled
            shared["2"] = Array(self._heat_support())  # where the clients put their noise
        for node_id, (node_users, _, _) in self._index_sets.items():
            record = ArrayRecord({"0": Array(node_users.astype(np.int64)), **shared})
            down += record.count_bytes()
            self._sent[node_id] = (int(node_users.size), np.zeros(0, dtype=np.int64))
            messages.append(_train_message(node_id, record, config, server_round))
        self._round_stats.update({"bytes-down": down, "submodel-rows-mean": float(self.x.size)})
        return messages

    def _heat_support(self) -> np.ndarray:
        """Return the rows some client touches (fixed once the heat is counted; cached)."""
        assert self.heat is not None
        if self._support is None:
            self._support = np.flatnonzero(self.heat.clients).astype(np.int64)
        return self._support

    def merge_senders(self, nodes: list[int]) -> int:
        """Under secure aggregation: the summed reply stands for the nodes' users."""
        self._sent[SUMMED_SENDER] = (
            sum(self._sent[n][0] for n in nodes if n in self._sent),
            np.zeros(0, dtype=np.int64),
        )
        return SUMMED_SENDER

    def forget_summed_sender(self) -> None:
        """Drop the summed sender's entry once the sum is decoded."""
        self._sent.pop(SUMMED_SENDER, None)

    def _decode_summed(self, reply: Message) -> tuple[RoundUpdate, int, dict]:
        """Decode a securely aggregated round: the union is where the sum is non-zero."""
        record = reply.content.array_records["arrays"]
        metrics = dict(reply.content.metric_records["metrics"])
        if list(record.keys()) != ["0"] or record["0"].shape != (self.n_params,):
            raise ValueError(f"the summed update must be one ({self.n_params},) array")
        dense = record["0"].numpy().astype(np.float64)
        if not np.all(np.isfinite(dense)):
            raise ValueError("the summed update is not finite")
        users = int_metric(metrics, "num-examples")
        if users != self._sent[SUMMED_SENDER][0]:
            raise ValueError(f"the sum is over {users} users, {self._sent[SUMMED_SENDER][0]} sent")
        if self.accountant is not None:  # noise on the whole heat support: that is the union
            rows = self._heat_support()
            arrived = [u for n in self.summed_nodes if n in self._index_sets
                       for u in self._index_sets[n][0]]  # fmt: skip
            self._round_stats.update(self.accountant.record(self._dp_sampled, arrived))
        else:
            rows = np.flatnonzero(dense)
        weight = float(metrics["weight-sum"])
        part = RoundUpdate(rows.astype(np.int64), dense[rows], users, weight)
        return part, 0, {}

    def decode_train_reply(self, src: int, reply: Message) -> tuple[RoundUpdate, int, dict]:
        """Check one node's reply; return its weighted update, payload bytes and metrics."""
        if src == SUMMED_SENDER:
            if self.cohorts_mode:
                return self._decode_summed(reply)
            return self._decode_summed_plain(reply)
        record = reply.content.array_records["arrays"]
        metrics = dict(reply.content.metric_records["metrics"])
        if self.cohorts_mode:
            n_users, allowed = self._sent[src]
            if list(record.keys()) != ["0", "1"]:
                raise ValueError(f"reply arrays {list(record.keys())}: expected ['0', '1']")
            part = decode_update(record.to_numpy_ndarrays(), allowed, n_users, metrics)
            return part, record.count_bytes(), {}
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
        assert self.server is not None
        sent = self._sent if self.cohorts_mode else self._sent_values
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
        if self.cohorts_mode:
            return ArrayRecord({"x": Array(self.x)}), MetricRecord(metrics)
        assert self.layout is not None
        metrics.update(_weighted_means([m for _, (_, _, m) in accepted]))
        arrays = self.layout.unflatten(self.x)
        return ArrayRecord({k: Array(v) for k, v in arrays.items()}), MetricRecord(metrics)

    # ------------------------------------------------------------------ evaluation
    def evaluate_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Plain mode with ``fraction_evaluate > 0``: the full model to a sample of nodes."""
        if self.cohorts_mode:
            return []
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

    def sent_users(self, node_id: int) -> int:
        """Return the users sampled on ``node_id`` this round (1 in plain mode)."""
        if self.cohorts_mode and node_id in self._sent:
            return int(self._sent[node_id][0])
        return 1

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
        μ (default 0.01, Section 5.1), sent as ``proximal-mu`` in every train config (cohort
        mode: replaces ``local.proximal_mu``).
    """

    algorithm = "fedprox-sub"

    def __init__(self, *args: Any, proximal_mu: float = 0.01, **kwargs: Any) -> None:
        local = kwargs.pop("local", None) or LocalConfig()
        kwargs["local"] = LocalConfig(local.iters, local.batch, local.lr, float(proximal_mu))
        super().__init__(*args, proximal_mu=proximal_mu, **kwargs)


class FedAdamSubStrategy(FedSubAvgStrategy):
    """FedAdam on submodels (Reddi et al.), Flower's ``FedAdam`` server step.

    Parameters
    ----------
    *args, **kwargs
        As :class:`FedSubAvgStrategy`.
    eta, beta_1, beta_2, tau : float, optional
        Server learning rate η (1.0), moment decays β₁ (0.9), β₂ (0.99) and adaptivity τ
        (1e-3): paper Table 5 (MovieLens); τ as Flower's. Ignored when ``adam`` is given.
    """

    algorithm = "fedadam-sub"

    def __init__(
        self,
        *args: Any,
        eta: float = 1.0,
        beta_1: float = 0.9,
        beta_2: float = 0.99,
        tau: float = 1e-3,
        **kwargs: Any,
    ) -> None:
        kwargs["adam"] = kwargs.get("adam") or AdamConfig(eta, beta_1, beta_2, tau)
        super().__init__(*args, **kwargs)


class ScaffoldSubStrategy(FedSubAvgStrategy):
    """The server-side SCAFFOLD approximation of App. D.2 on submodels.

    Takes the parameters of :class:`FedSubAvgStrategy` (its ``algorithm`` is fixed).
    """

    algorithm = "scaffold-sub"


def _train_message(
    node: int, record: ArrayRecord, config: ConfigRecord, server_round: int
) -> Message:
    """Return the round's ``train`` message to ``node`` (group id ``train-<round>``)."""
    return Message(
        RecordDict({"arrays": record, "config": config}),
        dst_node_id=node,
        message_type=MessageType.TRAIN,
        group_id=f"train-{server_round}",
    )
