"""FedSubAvgCohorts: FedSubAvg and its baselines over nodes that serve many users.

The round of :class:`~flower_app.strategies.fedsubavg.FedSubAvgRounds` (shared with the
public :class:`~flower_app.strategies.fedsubavg.FedSubAvgStrategy`) over cohorts of a
MovieLens-style task (flat model ``"x"`` of M rows): the runners' strategy. The exchanges'
messages and decoders are :mod:`flower_app.strategies.cohort.fedsubavg_exchanges`.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
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
    client_bytes,
    resolve_clients_per_round,
)
from flower_app.privacy.secagg_server import key_book, secure_sum
from flower_app.strategies.base import SUMMED_SENDER
from flower_app.strategies.cohort.base import CohortStrategy
from flower_app.strategies.cohort.fedsubavg_exchanges import (
    HEAT_TRAIN,
    add_heat_report,
    decode_index_sets,
    decode_update,
    index_set_messages,
)
from flower_app.strategies.errors import InitialArraysError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.fedsubavg import (
    FedSubAvgRounds,
    external_loop_refused,
    heat_messages,
    train_message,
)
from flower_app.strategies.replies import CheckedReplies, int_metric

__all__ = ["FedSubAvgCohorts"]


class FedSubAvgCohorts(FedSubAvgRounds, CohortStrategy):
    """FedSubAvg or a baseline over cohorts (the reproductions' strategy).

    A node serves many users of a MovieLens-style task (flat model ``"x"`` of M rows);
    discovery finds the cohorts, a counting round sums the feature heat, the server samples
    K users per round (its own generator), asks their nodes for the users' index sets S(i)
    in ``before_round`` and sends each node its users' rows. Client i's batches come from
    ``default_rng([seed, t, i])``, so results do not depend on the engine or on how users
    are split over nodes. ``initial_arrays`` is ``{"x": float (M,)}`` or None (zeros;
    ``evaluate_fn`` then gets an empty ArrayRecord at round 0). Resumable: x, the server
    step's state (e.g. Adam moments, SCAFFOLD's c), the client sampler and the bad-reply
    count go to ``checkpoint_fn`` after every round.

    Parameters
    ----------
    algorithm : str
        ``"fedsubavg"``, ``"fedavg-sub"``, ``"fedprox-sub"``, ``"fedadam-sub"`` or
        ``"scaffold-sub"``.
    n_clients, n_params : int
        Users N over all nodes and model rows M.
    clients_per_round : int or float
        K, a count or a fraction of N; a count above N raises ValueError.
    seed : int, optional
        Seed of all randomness (default 0).
    weighting : str, optional
        ``"clients"`` (Algorithm 1, default) or ``"samples"`` (App. D.4).
    local : LocalConfig, optional
        The clients' I, B, γ and μ, sent as ``local-iters``, ``batch-size``, ``lr``,
        ``proximal-mu`` (default: I = 10, B = 5, γ = 0.1, μ = 0).
    adam : AdamConfig, optional
        FedAdam's server hyperparameters (default: Table 5, MovieLens).
    dp : GaussianDP, optional
        Client-level DP with distributed Gaussian noise (needs ``secure_aggregation`` and
        ``weighting="clients"``): the accountant is ``self.accountant``. Default None.
    **options
        The run's options of :class:`~flower_app.strategies.cohort.base.CohortStrategy`.
        Under secure aggregation the counting round is a secure sum of dense counts, the
        index sets are not asked for (every node gets the full model and cuts its users'
        submodels itself) and the server learns only the sum of the nodes' updates.

    Notes
    -----
    Message contract (k the node's sampled users):

    =================  ====================================  ==================================
    message            server → node                         node → server
    =================  ====================================  ==================================
    ``query.cohort``   ``"config"``: ``kind`` = cohort       ``"properties"``: ``partition-id``,
                                                             ``num-partitions``, ``first-user``,
                                                             ``num-users``, ``n-users-total``,
                                                             ``n-elements`` (int)
    ``query.``         ``"config"``: ``kind`` =              ``"properties"``: ``rows``,
    ``feature_heat``   ``"feature-heat"``                    ``clients``, ``samples`` list[int],
                                                             ``num-users``, ``num-samples`` int
    ``query.``         ``"config"``: ``kind``, ``users``     ``"properties"``: ``users``,
    ``submodel``       list[int]                             ``offsets`` (k+1), ``rows``
                                                             list[int]: S(i) concatenated
    ``train``          ``"arrays"``: ``"0"`` int64 users     ``"arrays"``: ``"0"`` int64 rows
                       (k,), ``"1"`` int64 offsets (k+1,),   (sorted, ⊆ ∪S(i)), ``"1"`` float64
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

    resumable = True
    supports_secure_aggregation = True

    def __init__(
        self,
        algorithm: str,
        n_clients: int,
        n_params: int,
        clients_per_round: int | float,
        seed: int = 0,
        weighting: str = "clients",
        local: LocalConfig | None = None,
        adam: AdamConfig | None = None,
        dp: GaussianDP | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if dp is not None and self.secure_aggregation is None:
            raise ValueError("client-level DP (dp=) needs secure_aggregation")
        if dp is not None and weighting != "clients":
            raise ValueError("client-level DP needs weighting='clients' (bounded sensitivity)")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting {weighting!r}: choose one of {WEIGHTINGS}")
        self.algorithm, self.weighting, self.dp = algorithm, weighting, dp
        self.seed = int(seed)
        self.adam = adam or AdamConfig()
        self.local = local or LocalConfig()
        self.n_clients, self.n_params = int(n_clients), int(n_params)
        self.k = resolve_clients_per_round(clients_per_round, self.n_clients)
        self.sampler = ClientSampler(self.n_clients, self.k, self.seed)
        self.x = np.zeros(self.n_params)
        #: client-level DP: ε against the server and outsiders
        self.accountant = None if dp is None else GaussianAccountant(dp, self.n_clients)
        self._index_sets: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._sent: dict[int, tuple[int, np.ndarray]] = {}
        self._dp_sampled = 0
        self._support: np.ndarray | None = None
        self._init_round_state()

    def checkpoint_state(self) -> dict[str, Any]:
        """Return the server state.

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

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "%s(%s): N=%d clients, M=%d rows, K=%d, I=%d, B=%d, lr=%g, mu=%g, "
            "weighting=%s, seed=%d",
            type(self).__name__, self.algorithm, self.n_clients, self.n_params, self.k,
            self.local.iters, self.local.batch, self.local.lr, self.local.proximal_mu,
            self.weighting, self.seed,
        )  # fmt: skip

    def check_external_loop(self) -> None:
        """Refuse another loop (Flower's DP wrappers): see ``FedSubAvgStrategy``'s.

        Raises
        ------
        ValueError
            Always: a node replies with its users' rows, summed.
        """
        raise external_loop_refused(type(self).__name__)

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Discover the cohorts, count the feature heat; build the server step."""
        if arrays is not None and len(arrays):
            if list(arrays) != ["x"] or arrays["x"].shape != (self.n_params,):
                raise InitialArraysError(
                    f"cohort mode takes initial_arrays {{'x': float ({self.n_params},)}}, "
                    f"got keys {list(arrays)}"
                )
            self.x = np.array(arrays["x"].numpy(), dtype=np.float64, copy=True)
        self.discover(grid, self.n_clients, self.n_params)
        self.heat = self.count_heat(grid)
        self._start_server()
        return num_rounds

    def count_heat(self, grid: Grid) -> FeatureHeat:
        """Run the counting round: every node reports its users' row counts; sum them.

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

    def before_round(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> None:
        """Sample K users and fetch their index sets S(i) (Alg. 1, line 5).

        Under secure aggregation the index sets are not asked for: every node gets the
        full model and cuts its users' submodels itself.
        """
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
        """Return one ``train`` message per node: its users' index sets and rows of x."""
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
            messages.append(train_message(node_id, record, train_config, server_round))
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
            messages.append(train_message(node_id, record, config, server_round))
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
            return self._decode_summed(reply)
        record = reply.content.array_records["arrays"]
        metrics = dict(reply.content.metric_records["metrics"])
        n_users, allowed = self._sent[src]
        if list(record.keys()) != ["0", "1"]:
            raise ValueError(f"reply arrays {list(record.keys())}: expected ['0', '1']")
        part = decode_update(record.to_numpy_ndarrays(), allowed, n_users, metrics)
        return part, record.count_bytes(), {}

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sum the accepted updates (in node order) and apply the algorithm's server step."""
        metrics, _ = self._step(server_round, checked, self._sent)
        return ArrayRecord({"x": Array(self.x)}), MetricRecord(metrics)

    def sent_users(self, node_id: int) -> int:
        """Return the users sampled on ``node_id`` this round (1 if none)."""
        return int(self._sent[node_id][0]) if node_id in self._sent else 1
