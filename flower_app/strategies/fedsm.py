"""FedSMStrategy: federated submodular maximisation by sampled marginal gains (Alg. 1).

Rafiey, Namani & Charalambides (2025), "Federated Submodular Maximization: Improved
Communication Rounds and Bit Complexity", Algorithm 1. The math lives in
:mod:`flower_app.algorithms.fedsm`; this module moves it over Flower's Message API.
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

from flower_app.algorithms.fedsm import FedSMServer
from flower_app.strategies.discovery import CohortMap, discover_cohorts
from flower_app.submodular.matroids import Matroid

__all__ = ["FedSMStrategy", "decode_report"]

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


class FedSMStrategy(Strategy):
    """Federated submodular maximisation with K users and d sampled gains per round.

    Each communication round t = 1..k the server samples K users uniformly without
    replacement (its own ``numpy.random.Generator``, seeded by ``seed``) and sends S to the
    nodes that serve them; each sampled user draws d distinct elements of E \\ S from its
    own stream ``default_rng([seed, t, user])`` and reports f_i(e | S) for them; a node
    replies with the sum over its sampled users; the server scales by |E \\ S| / (dK)
    (Eq. 3) and adds the feasible element with the largest estimate. Before round 1 the
    server asks every node which users it serves (discovery).

    Parameters
    ----------
    n_users : int
        Number of users n over all nodes.
    matroid : Matroid
        The constraint M; ``k`` must not exceed its rank.
    k : int
        Communication rounds r = elements added (the paper uses r = rank).
    clients_per_round : int or float, optional
        K, as a count or a fraction of n (default 0.1).
    elements_per_client : int or float, optional
        d, as a count or a fraction of m (default 0.1); capped at |E \\ S| each round.
    seed : int, optional
        Seed of all randomness (default 0).
    evaluate_fn : callable, optional
        ``evaluate_fn(selected) -> float``: the true F(S) for the round records (an
        experiment oracle; the algorithm never uses it). Without it the strategy asks all
        nodes for Σ f_i(S) once, after the last round.
    on_round : callable, optional
        Receives each round's metrics dict (e.g. to append to ``metrics.jsonl``).
    round_timeout : float, optional
        Seconds to wait for one round's replies (default 600).
    discovery_timeout : float, optional
        Seconds to wait until the nodes' cohorts cover all users (default 300).

    Notes
    -----
    Message contract (see also :mod:`flower_app.clients.adapter`):

    * ``query`` → ``"config"`` ConfigRecord ``{"kind": "cohort"}``; reply ``"properties"``
      ConfigRecord with int ``partition-id``, ``num-partitions``, ``first-user``,
      ``num-users``, ``n-users-total``, ``n-elements``.
    * ``train`` → ``"arrays"`` ArrayRecord ``"0"``: int64 S (|S|,), ``"1"``: int64 sampled
      user ids on that node (K_node,); ``"config"`` ConfigRecord ``server-round``, ``d``,
      ``seed`` (int). Reply ``"arrays"`` ``"0"``: int32 ids, ``"1"``: float64 summed
      reports (sparse) or ``"0"``: float64 (m,) (dense); ``"metrics"`` MetricRecord
      ``num-examples`` (= K_node), ``user-values``, ``positive-entries``.
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
    ) -> None:
        self.server = FedSMServer(
            n_users, matroid, k, clients_per_round, elements_per_client, seed=seed
        )
        self.matroid = matroid
        self.evaluate_fn = evaluate_fn
        self.on_round = on_round
        self.round_timeout = float(round_timeout)
        self.discovery_timeout = float(discovery_timeout)
        self.cohorts: CohortMap | None = None
        self.history: list[dict[str, Any]] = []
        self._sent: dict[int, int] = {}
        self._bytes_down = 0

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the strategy's settings."""
        s = self.server
        log(
            INFO,
            "FedSMStrategy(Alg. 1): n=%d users, m=%d elements, k=%d rounds, K=%d users/round, "
            "d=%d elements/user, matroid=%s, seed=%d",
            s.n_users,
            self.matroid.n_elements,
            s.k,
            s.K,
            s.d,
            self.matroid,
            s.seed,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample K users and build one ``train`` message per node that serves some."""
        if self.cohorts is None:
            raise RuntimeError("discovery has not run: call start()")
        users = self.server.sample_users()
        config = ConfigRecord(
            {
                **dict(config),
                "server-round": server_round,
                "d": self.server.round_d(),
                "seed": self.server.seed,
            }
        )
        selected = np.asarray(self.server.selected, dtype=np.int64)
        messages, self._sent, self._bytes_down = [], {}, 0
        for node_id, node_users in self.cohorts.group(users).items():
            record = ArrayRecord([selected, node_users.astype(np.int64)])
            self._bytes_down += record.count_bytes()
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
        """Sum the valid reports and add the best feasible element to S."""
        m = self.matroid.n_elements
        total, users, bad, bytes_up, user_values = np.zeros(m), 0, 0, 0, 0
        answered: set[int] = set()
        for reply in replies:
            src = int(reply.metadata.src_node_id)
            answered.add(src)
            try:
                if reply.has_error():
                    raise ValueError(f"client error: {reply.error.reason}")
                record = reply.content.array_records["arrays"]
                metrics = reply.content.metric_records["metrics"]
                report = decode_report(record.to_numpy_ndarrays(), m)
                n_ex = int(metrics["num-examples"])
                if n_ex != self._sent.get(src):
                    raise ValueError(f"reports for {n_ex} users, {self._sent.get(src)} were sent")
            except (ValueError, KeyError, TypeError) as err:
                bad += 1
                log(WARNING, "round %d: reply of node %s left out: %s", server_round, src, err)
                continue
            total += report
            users += n_ex
            bytes_up += record.count_bytes()
            user_values += int(metrics.get("user-values", 0))
        missing = len(set(self._sent) - answered)
        if missing:
            log(WARNING, "round %d: %d nodes did not reply in time", server_round, missing)
        rnd = self.server.select(total, users)
        metrics = MetricRecord(
            {
                "element": rnd.element,
                "estimate": rnd.estimate,
                "users": users,
                "nodes": len(self._sent),
                "d": rnd.d,
                "user-values": user_values,
                "bytes-down": self._bytes_down,
                "bytes-up": bytes_up,
                "bad-replies": bad + missing,
            }
        )
        return ArrayRecord([np.asarray(self.server.selected, dtype=np.int64)]), metrics

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
        if users != self.server.n_users:
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
        """Run discovery and the k rounds of Algorithm 1.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        initial_arrays : ArrayRecord, optional
            Ignored (S starts empty, as in the paper); accepted for API compatibility.
        num_rounds : int, optional
            Must be None or equal to ``k``: the protocol's length is fixed by k.
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
        if num_rounds is not None and num_rounds != self.server.k:
            raise ValueError(f"num_rounds={num_rounds} differs from k={self.server.k}")
        round_timeout = self.round_timeout if timeout is None else float(timeout)
        self.summary()
        t0 = time.perf_counter()
        self.cohorts = discover_cohorts(
            grid, self.server.n_users, self.matroid.n_elements, timeout=self.discovery_timeout
        )
        result = Result()
        arrays = ArrayRecord([np.zeros(0, dtype=np.int64)])
        while not self.server.done:
            t = len(self.server.selected) + 1
            r0 = time.perf_counter()
            messages = self.configure_train(t, arrays, train_config or ConfigRecord(), grid)
            replies = grid.send_and_receive(messages, timeout=round_timeout)
            arrays, metrics = self.aggregate_train(t, replies)
            row: dict[str, Any] = {"server-round": t, **dict(metrics)}
            if self.evaluate_fn is not None:
                row["objective"] = float(self.evaluate_fn(list(self.server.selected)))
                result.evaluate_metrics_serverapp[t] = MetricRecord({"objective": row["objective"]})
            elif evaluate_fn is not None:
                res = evaluate_fn(t, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[t] = res
                    row.update(dict(res))
            row["round-time"] = time.perf_counter() - r0
            row["wall-time"] = time.perf_counter() - t0
            result.train_metrics_clientapp[t] = metrics
            self._log_round(row)
        if self.evaluate_fn is None and evaluate_fn is None:
            msgs = self.configure_evaluate(
                self.server.k, arrays, evaluate_config or ConfigRecord(), grid
            )
            res = self.aggregate_evaluate(
                self.server.k, grid.send_and_receive(msgs, timeout=round_timeout)
            )
            if res is not None:
                result.evaluate_metrics_clientapp[self.server.k] = res
                self.history[-1]["objective"] = float(res["objective"])
        result.arrays = arrays
        return result

    def _log_round(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        log(
            INFO,
            "[round %d/%d] +element %d  F(S)=%s  users=%d nodes=%d  up=%d B down=%d B  %.2f s",
            row["server-round"],
            self.server.k,
            row["element"],
            f"{row['objective']:.6g}" if "objective" in row else "n/a",
            row["users"],
            row["nodes"],
            row["bytes-up"],
            row["bytes-down"],
            row["round-time"],
        )
        if self.on_round is not None:
            self.on_round(row)
