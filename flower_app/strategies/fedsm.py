"""FedSMStrategy: federated submodular maximisation by sampled marginal gains.

Rafiey, Namani & Charalambides (2025), "Federated Submodular Maximization: Improved
Communication Rounds and Bit Complexity": Algorithm 1 (r rounds), Algorithm 2 (O(log m)
rounds) and Algorithm 3 (amplification). The math lives in :mod:`flower_app.algorithms`
(:mod:`~flower_app.algorithms.fedsm_modes` ties the modes together); this module moves it
over Flower's Message API.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_app.algorithms.fedsm_modes import FedSMParams, FedSMRun, RoundPlan
from flower_app.strategies.discovery import CohortMap, discover_cohorts
from flower_app.strategies.replies import check_replies
from flower_app.submodular.matroids import Matroid

__all__ = ["FedSMStrategy", "decode_report", "plan_arrays"]

RoundCallback = Callable[[dict[str, Any]], None]


def decode_report(arrays: list[np.ndarray], n_elements: int) -> np.ndarray:
    """Decode a node's report (``[index, value]`` sparse or ``[value]`` dense) and check it.

    Parameters
    ----------
    arrays : list of numpy.ndarray
        The reply's arrays in order.
    n_elements : int
        Ground-set size m.

    Returns
    -------
    numpy.ndarray
        Dense float64 vector of length m.

    Raises
    ------
    ValueError
        On a wrong number of arrays, wrong shapes or dtypes, indices out of range or
        duplicated, or non-finite or negative values (marginal gains of a monotone
        function are ≥ 0).
    """
    if len(arrays) == 1:
        value = np.asarray(arrays[0])
        if value.shape != (n_elements,):
            raise ValueError(f"dense report has shape {value.shape}, expected ({n_elements},)")
        dense = value.astype(np.float64)
    elif len(arrays) == 2:
        index, value = (np.asarray(a) for a in arrays)
        if index.ndim != 1 or value.shape != index.shape or index.dtype.kind not in "iu":
            raise ValueError("sparse report needs 1-D integer ids and values of equal length")
        if index.size and (index.min() < 0 or index.max() >= n_elements):
            raise ValueError(f"sparse report has element ids outside 0..{n_elements - 1}")
        if np.unique(index).size != index.size:
            raise ValueError("sparse report repeats element ids")
        dense = np.zeros(n_elements)
        dense[index.astype(np.int64)] = value.astype(np.float64)
    else:
        raise ValueError(f"a report has 1 (dense) or 2 (sparse) arrays, got {len(arrays)}")
    if not np.all(np.isfinite(dense)) or (dense < 0).any():
        raise ValueError("report values must be finite and non-negative")
    return dense


def plan_arrays(plan: RoundPlan, node_users: np.ndarray) -> list[np.ndarray]:
    """Return the arrays of a ``train`` message: S, users, [X, a], [x ids, x values].

    Parameters
    ----------
    plan : RoundPlan
        The round.
    node_users : numpy.ndarray
        The node's sampled users.

    Returns
    -------
    list of numpy.ndarray
        ``[S int64, users int64]``, then ``[X int32, a int64]`` for Algorithm 2, then
        ``[ids int32, values float64]`` of the non-zero coordinates of x for amplification.
    """
    arrays = [np.asarray(plan.selected, dtype=np.int64), node_users.astype(np.int64)]
    if plan.mode == "alg2":
        arrays += [plan.pool.astype(np.int32), plan.sequence.astype(np.int64)]
    if plan.surrogate != "none" and plan.point is not None:
        nz = np.flatnonzero(plan.point)
        arrays += [nz.astype(np.int32), plan.point[nz].astype(np.float64)]
    return arrays


class FedSMStrategy(Strategy):
    """Federated submodular maximisation with K users and d sampled values per user.

    Algorithm 1 (``mode="alg1"``, default): each communication round t = 1..k the server
    samples K users uniformly without replacement (its own ``numpy.random.Generator``,
    seeded by ``seed``) and sends S to the nodes that serve them; each sampled user draws d
    distinct elements of E \\ S from its own stream ``default_rng([seed, t, user])`` and
    reports f_i(e | S) for them; a node replies with the sum over its sampled users; the
    server scales by |E \\ S| / (dK) (Eq. 3) and adds the feasible element with the largest
    estimate. Algorithm 2 (``mode="alg2"``): the server also sends the surviving set X and a
    random feasible sequence a_1..a_r' drawn from X; users report f_i(e | S ∪ {a_1..a_j}) for
    d sampled pairs (e, j); the server adds a_1..a_j* and shrinks X
    (:mod:`flower_app.algorithms.fedsm_alg2`). Amplification (``mode="amplified"``): 1/η
    steps of Algorithm 1 or 2 on the surrogate g, with x sent along
    (:mod:`flower_app.algorithms.fedsm_amplify`), and an oblivious rounding at the end. Before
    round 1 the server asks every node which users it serves (discovery).

    Parameters
    ----------
    n_users : int
        Number of users n over all nodes.
    matroid : Matroid
        The constraint M; ``k`` must not exceed its rank.
    k : int
        Largest |S| (Algorithm 1: communication rounds r = elements added).
    clients_per_round : int or float, optional
        K, as a count or a fraction of n (default 0.1); ignored when ``params`` is given.
    elements_per_client : int or float, optional
        d, as a count or a fraction of m (default 0.1); Algorithm 1 caps it at |E \\ S| each
        round; ignored when ``params`` is given.
    seed : int, optional
        Seed of all randomness (default 0).
    evaluate_fn : callable, optional
        ``evaluate_fn(selected) -> float``: the true F(S) for the round records (an
        experiment oracle; the algorithm never uses it). Without it (and without
        ``progress_fn``) the strategy asks all nodes for Σ f_i(S) once, after the last round.
    on_round : callable, optional
        Receives each round's metrics dict (e.g. to append to ``metrics.jsonl``).
    round_timeout : float, optional
        Seconds to wait for one round's replies (default 600).
    discovery_timeout : float, optional
        Seconds to wait until the nodes' cohorts cover all users (default 300).
    params : FedSMParams, optional
        Mode and all its parameters (default: Algorithm 1 with the K and d above).
    lam : float, optional
        λ = max_{e,i} f_i({e}), Algorithm 2's default initial threshold (default 0: then a
        positive ``params.tau`` is required for Algorithm 2).
    progress_fn : callable, optional
        ``progress_fn(run) -> float``: the oracle's value of the run's state, preferred to
        ``evaluate_fn`` (amplification records G(x + η1_T) during the run).

    Notes
    -----
    Message contract (see also :mod:`flower_app.clients.adapter`):

    * ``query`` → ``"config"`` ConfigRecord ``{"kind": "cohort"}``; reply ``"properties"``
      ConfigRecord with int ``partition-id``, ``num-partitions``, ``first-user``,
      ``num-users``, ``n-users-total``, ``n-elements``.
    * ``train`` → ``"arrays"`` ArrayRecord ``"0"``: int64 S (|S|,) (T inside an
      amplification step), ``"1"``: int64 sampled user ids on that node (K_node,); for
      Algorithm 2 also ``"2"``: int32 X (|X|,), ``"3"``: int64 a_1..a_r' (r',); for
      amplification then int32 ids and float64 values of the non-zero coordinates of x.
      ``"config"`` ConfigRecord ``server-round``, ``d``, ``seed`` (int), ``mode`` (str
      ``"alg1"``/``"alg2"``) and, for amplification, ``surrogate`` (``"exact"``/
      ``"sampled"``), ``eta`` (float), ``samples`` (int); Algorithm 2 adds ``j-from`` (int
      0 or 1: the prefix length of pair column 0). Reply ``"arrays"`` ``"0"``: int32
      ids, ``"1"``: float64 summed reports (sparse) or ``"0"``: float64 (L,) (dense), where L
      = m for Algorithm 1 and |X|·r' for Algorithm 2 (pair (e, j) at index
      pos_X(e)·r' + j − j-from); ``"metrics"`` MetricRecord ``num-examples`` (= K_node),
      ``user-values``, ``positive-entries``.
    * ``evaluate`` → ``"arrays"`` ``"0"``: int64 S; reply ``"metrics"`` ``objective-sum``,
      ``loss``, ``num-examples``.

    A reply with an error, a malformed report, or a count that does not match the users it
    was sent is logged, counted in ``bad-replies`` and left out of the sum; the estimate is
    then scaled by the users whose reports arrived.
    """

    def __init__(
        self,
        n_users: int,
        matroid: Matroid,
        k: int,
        clients_per_round: int | float = 0.1,
        elements_per_client: int | float = 0.1,
        seed: int = 0,
        evaluate_fn: Callable[[list[int]], float] | None = None,
        on_round: RoundCallback | None = None,
        round_timeout: float = 600.0,
        discovery_timeout: float = 300.0,
        params: FedSMParams | None = None,
        lam: float = 0.0,
        progress_fn: Callable[[FedSMRun], float] | None = None,
    ) -> None:
        if params is None:
            params = FedSMParams("alg1", clients_per_round, elements_per_client)
        self.params = params
        self.run = FedSMRun(n_users, matroid, k, params, lam, seed=seed)
        self.n_users, self.k, self.seed = n_users, k, seed
        self.matroid = matroid
        self.evaluate_fn = evaluate_fn
        self.progress_fn = progress_fn
        self.on_round = on_round
        self.round_timeout = float(round_timeout)
        self.discovery_timeout = float(discovery_timeout)
        self.cohorts: CohortMap | None = None
        self.history: list[dict[str, Any]] = []
        self._sent: dict[int, int] = {}
        self._plan: RoundPlan | None = None
        self._down: dict[str, int] = {}
        self._extra: dict[str, Any] = {}

    @property
    def server(self) -> Any:
        """The current inner server (Algorithm 1's :class:`FedSMServer` in mode alg1)."""
        return self.run.inner

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the strategy's settings."""
        p = self.params
        log(
            INFO,
            "FedSMStrategy(%s): n=%d users, m=%d elements, k=%d, K=%s users/round, "
            "d=%s per user, matroid=%s, seed=%d%s",
            p.mode,
            self.n_users,
            self.matroid.n_elements,
            self.k,
            p.clients_per_round,
            p.elements_per_client,
            self.matroid,
            self.seed,
            "" if p.mode == "alg1" else f", {p}",
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Plan the round and build one ``train`` message per node that serves a sampled user."""
        if self.cohorts is None:
            raise RuntimeError("discovery has not run: call start()")
        plan = self._plan = self.run.plan()
        entries: dict[str, Any] = {
            **dict(config),
            "server-round": plan.server_round,
            "d": plan.d,
            "seed": self.seed,
            "mode": plan.mode,
        }
        if plan.mode == "alg2":
            entries["j-from"] = plan.j_from
        if plan.surrogate != "none":
            entries.update(surrogate=plan.surrogate, eta=plan.eta, samples=plan.samples)
        config = ConfigRecord(entries)
        messages, self._sent = [], {}
        self._down = {"bytes": 0, "values": 0, "bytes-max": 0, "values-max": 0}
        for node_id, node_users in self.cohorts.group(plan.users).items():
            record = ArrayRecord(plan_arrays(plan, node_users))
            nbytes, nvalues = record.count_bytes(), plan.values_down(int(node_users.size))
            self._down["bytes"] += nbytes
            self._down["values"] += nvalues
            self._down["bytes-max"] = max(self._down["bytes-max"], nbytes)
            self._down["values-max"] = max(self._down["values-max"], nvalues)
            self._sent[node_id] = int(node_users.size)
            content = RecordDict({"arrays": record, "config": config})
            messages.append(
                Message(
                    content,
                    dst_node_id=node_id,
                    message_type=MessageType.TRAIN,
                    group_id=str(server_round),
                )
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sum the valid reports and apply the server step of the current mode."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("aggregate_train() without configure_train()")
        size = plan.report_size

        def decode(src: int, reply: Message) -> tuple[np.ndarray, int, MetricRecord, int, int]:
            record = reply.content.array_records["arrays"]
            metrics = reply.content.metric_records["metrics"]
            ndarrays = record.to_numpy_ndarrays()
            report = decode_report(ndarrays, size)
            n_ex = int(metrics["num-examples"])
            if n_ex != self._sent[src]:
                raise ValueError(f"reports for {n_ex} users, {self._sent[src]} were sent")
            return report, n_ex, metrics, record.count_bytes(), sum(int(a.size) for a in ndarrays)

        checked = check_replies(replies, decode, self._sent, f"round {server_round}")
        total, users, user_values = np.zeros(size), 0, 0
        up = {"bytes": 0, "values": 0, "bytes-max": 0, "values-max": 0, "positive": 0}
        for _, (report, n_ex, metrics, nbytes, nvalues) in checked.accepted:
            total += report
            users += n_ex
            up["bytes"] += nbytes
            up["values"] += nvalues
            up["bytes-max"] = max(up["bytes-max"], nbytes)
            up["values-max"] = max(up["values-max"], nvalues)
            up["positive"] += int(metrics.get("positive-entries", 0))
            user_values += int(metrics.get("user-values", 0))
        row = self.run.update(total, users)
        self._plan = None
        self._extra = {"added": row.pop("added", None)}
        nodes = max(len(self._sent), 1)
        row.update(
            {
                "nodes": len(self._sent),
                "user-values": user_values,
                "values-up": up["values"],
                "values-up-per-client": up["values"] / max(len(checked.accepted), 1),
                "values-up-max-client": up["values-max"],
                "bytes-up": up["bytes"],
                "bytes-up-max-client": up["bytes-max"],
                "positive-entries": up["positive"],
                "values-down": self._down["values"],
                "values-down-per-client": self._down["values"] / nodes,
                "bytes-down": self._down["bytes"],
                "bytes-down-max-client": self._down["bytes-max"],
                "bad-replies": checked.left_out,
            }
        )
        metrics = MetricRecord({key: _metric(v) for key, v in row.items()})
        return ArrayRecord([np.asarray(self.run.selected, dtype=np.int64)]), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask every node for Σ f_i(S) over its users (used when no ``evaluate_fn``)."""
        if self.cohorts is None:
            return []
        content = RecordDict({"arrays": arrays, "config": ConfigRecord(dict(config))})
        return [
            Message(content, dst_node_id=int(n), message_type=MessageType.EVALUATE)
            for n in self.cohorts.node_ids
        ]

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return F(S) = Σ_nodes objective-sum / n, or None if a node failed."""
        total, users = 0.0, 0
        for reply in replies:
            if reply.has_error():
                log(WARNING, "evaluation failed on node %s", reply.metadata.src_node_id)
                return None
            metrics = reply.content.metric_records["metrics"]
            total += float(metrics["objective-sum"])
            users += int(metrics["num-examples"])
        if users != self.n_users:
            return None
        return MetricRecord({"objective": total / users})

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
        """Run discovery and the rounds of the configured mode.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        initial_arrays : ArrayRecord, optional
            Ignored (S starts empty, as in the paper); accepted for API compatibility.
        num_rounds : int, optional
            Must be None (or, for Algorithm 1, equal to ``k``): the protocol fixes its length.
        timeout : float, optional
            Overrides ``round_timeout``.
        train_config, evaluate_config : ConfigRecord, optional
            Extra entries for the train / evaluate messages.
        evaluate_fn : callable, optional
            Flower-style ``evaluate_fn(round, arrays)``; prefer the constructor's.

        Returns
        -------
        Result
            ``arrays["0"]``: the selected set in order; per-round metrics in
            ``train_metrics_clientapp``; F(S) per round in ``evaluate_metrics_serverapp``.
        """
        if num_rounds is not None and (self.params.mode != "alg1" or num_rounds != self.k):
            raise ValueError(
                f"num_rounds={num_rounds}: the protocol fixes its own length "
                f"(mode {self.params.mode}, k={self.k}); pass None"
            )
        round_timeout = self.round_timeout if timeout is None else float(timeout)
        self.summary()
        t0 = time.perf_counter()
        self.cohorts = discover_cohorts(
            grid, self.n_users, self.matroid.n_elements, timeout=self.discovery_timeout
        )
        result = Result()
        arrays = ArrayRecord([np.zeros(0, dtype=np.int64)])
        while not self.run.done:
            t = self.run.server_round + 1
            r0 = time.perf_counter()
            messages = self.configure_train(t, arrays, train_config or ConfigRecord(), grid)
            replies = grid.send_and_receive(messages, timeout=round_timeout)
            arrays, metrics = self.aggregate_train(t, replies)
            row: dict[str, Any] = {**dict(metrics)}
            if self._extra.get("added") is not None:
                row["added"] = self._extra["added"]
            if self.progress_fn is not None:
                row["objective"] = float(self.progress_fn(self.run))
            elif self.evaluate_fn is not None:
                row["objective"] = float(self.evaluate_fn(list(self.run.selected)))
            elif evaluate_fn is not None:
                res = evaluate_fn(t, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[t] = res
                    row.update(dict(res))
            if "objective" in row:
                result.evaluate_metrics_serverapp[t] = MetricRecord({"objective": row["objective"]})
            row["round-time"] = time.perf_counter() - r0
            row["wall-time"] = time.perf_counter() - t0
            result.train_metrics_clientapp[t] = metrics
            self._log_round(row)
        last = self.run.server_round
        if self.evaluate_fn is None and self.progress_fn is None and evaluate_fn is None:
            msgs = self.configure_evaluate(last, arrays, evaluate_config or ConfigRecord(), grid)
            res = self.aggregate_evaluate(last, grid.send_and_receive(msgs, timeout=round_timeout))
            if res is not None:
                result.evaluate_metrics_clientapp[last] = res
                self.history[-1]["objective"] = float(res["objective"])
        result.arrays = ArrayRecord([np.asarray(self.run.selected, dtype=np.int64)])
        return result

    def _log_round(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        log(
            INFO,
            "[round %d] +%d -> |S|=%d/%d  F=%s  users=%d nodes=%d  up=%d B down=%d B  %.2f s",
            row["server-round"],
            row["elements-added"],
            row["set-size"],
            self.k,
            f"{row['objective']:.6g}" if "objective" in row else "n/a",
            row["users"],
            row["nodes"],
            row["bytes-up"],
            row["bytes-down"],
            row["round-time"],
        )
        if self.on_round is not None:
            self.on_round(row)


def _metric(value: Any) -> Any:
    """Turn a value into what a MetricRecord accepts (Python int/float or lists of them)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list):
        return [_metric(v) for v in value]
    return value
