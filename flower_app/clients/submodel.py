"""SubmodelClient: a node's users training their submodels (FedSubAvg cohort mode).

The client of the reproductions (:class:`~flower_app.strategies.cohort.fedsubavg.FedSubAvgCohorts`,
run by :mod:`flower_app.runners.fedsubavg`) on the MovieLens rating task; a user's own torch model
uses the plain-mode helpers of :mod:`flower_app.clients.fedsubavg` instead.

One MovieLens user is one client; a node serves a contiguous cohort of users
(:func:`~flower_app.clients.cohorts.cohort_range`) and answers for the users the server
sampled, summing their updates (what secure aggregation would reveal). The adapter
:func:`~flower_app.clients.adapter.numpy_client_app` routes ``query.cohort``,
``query.feature_heat``, ``query.submodel`` and ``train`` to these calls, in NumPyClient
terms:

``get_properties({"kind": "cohort"})``
    ``partition-id``, ``num-partitions``, ``first-user``, ``num-users``, ``n-users-total``,
    ``n-elements`` (= model rows M): the server's discovery.
``get_properties({"kind": "feature-heat"})``
    the counting round: ``rows`` (the distinct rows the cohort's users touch), ``clients``
    (how many of them touch each), ``samples`` (the sum of their training-set sizes), and
    ``num-users``, ``num-samples`` — all ints or lists of ints. The server adds the nodes'
    reports to get n_m; no user's own rows leave the node.
``get_properties({"kind": "submodel", "users": [...]})``
    the index sets S(i) of the named (sampled) users, Algorithm 1 line 5: ``users``,
    ``offsets`` (len(users)+1) and ``rows`` (concatenated, sorted per user).
``fit([users int64, offsets int64, rows int32, values float64], config)``
    each user's submodel as downloaded; ``config``: ``server-round``, ``seed``,
    ``local-iters``, ``batch-size``, ``lr``, ``proximal-mu``, ``weighting``. Runs I local
    SGD steps per user and returns ``[rows int64, sums float64]`` = Σ_i c_i Δx_i over the
    union of the users' rows, ``num_examples`` = number of users, and metrics
    ``weight-sum`` (Σ c_i) and ``samples`` (Σ n_i).
``evaluate([x float64 (M,)], config)``
    the cohort's mean training loss under the full model ``x``.

Under secure aggregation (``secure-aggregation`` in the config; the strategy sends
everything through :mod:`flower_app.privacy`) the counting round is a
``train.feature_heat`` message answered with dense ``[clients int64 (M,), samples int64
(M,)]`` and metric ``num-samples``; ``fit`` gets ``[users, x float64 (M,)]`` (the full
model: the server does not learn the users' index sets) and returns one dense float64
(M,) vector of Σ_i c_i Δx_i.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.client import NumPyClient

from flower_app.algorithms.common.dp_noise import NoiseSource
from flower_app.algorithms.common.gaussian_dp import dp_settings
from flower_app.algorithms.fedsubavg.core import (
    WEIGHTINGS,
    LocalConfig,
    client_round,
    count_heat,
    gather_submodels,
)
from flower_app.algorithms.fedsubavg.dp import private_round_update
from flower_app.datasets.movielens_rating import RatingTask
from flower_app.models.sparse_logreg import accuracy, log_loss
from flower_app.privacy.ledger import gaussian_release

__all__ = ["SubmodelClient"]

Config = dict[str, Any]


class SubmodelClient(NumPyClient):
    """The users of one node, for the submodel algorithms.

    Parameters
    ----------
    task : RatingTask
        The task (shared per process; only the cohort's rows are read).
    first_user : int
        Global index of the cohort's first user.
    num_users : int
        Users in the cohort.
    partition_id, num_partitions : int
        The node's place in the split.
    reproducible_noise : bool, optional
        The research mode ``dp-reproducible-noise`` (default False), from the node's own
        run_config (never from a message): DP noise keyed by (seed, round, user) instead of
        OS entropy; no privacy against the server (:mod:`flower_app.algorithms.common.dp_noise`).
    """

    def __init__(
        self,
        task: RatingTask,
        first_user: int,
        num_users: int,
        partition_id: int,
        num_partitions: int,
        reproducible_noise: bool = False,
    ) -> None:
        self.task = task
        self.reproducible_noise = bool(reproducible_noise)
        self.first_user = int(first_user)
        self.num_users = int(num_users)
        self.partition_id = int(partition_id)
        self.num_partitions = int(num_partitions)

    @property
    def users(self) -> np.ndarray:
        """Global indices of the cohort's users."""
        return np.arange(self.first_user, self.first_user + self.num_users, dtype=np.int64)

    def _own(self, users: Any) -> np.ndarray:
        users = np.asarray(users).astype(np.int64, copy=False).ravel()
        end = self.first_user + self.num_users
        if users.size and (users.min() < self.first_user or users.max() >= end):
            raise ValueError(f"users outside this node's cohort [{self.first_user}, {end})")
        if np.any(np.diff(users) <= 0):
            raise ValueError("users must be sorted and distinct")
        return users

    # ----------------------------------------------------------------- properties
    def get_properties(self, config: Config) -> dict[str, Any]:
        """Answer discovery, the counting round or a submodel request (see module doc)."""
        kind = str(config.get("kind", "cohort"))
        if kind == "cohort":
            return {
                "partition-id": self.partition_id,
                "num-partitions": self.num_partitions,
                "first-user": self.first_user,
                "num-users": self.num_users,
                "n-users-total": self.task.n_clients,
                "n-elements": self.task.n_params,
            }
        if kind == "feature-heat":
            rows, clients, samples = count_heat(self.task, self.users)
            return {
                "rows": rows.tolist(),
                "clients": clients.tolist(),
                "samples": samples.tolist(),
                "num-users": self.num_users,
                "num-samples": int(self.task.samples_per_client()[self.users].sum()),
            }
        if kind == "submodel":
            users = self._own(config.get("users", []))
            rows, ptr = gather_submodels(self.task, users)
            return {"users": users.tolist(), "offsets": ptr.tolist(), "rows": rows.tolist()}
        raise ValueError(f"unknown query kind {kind!r}")

    # ----------------------------------------------------------------- training
    def fit(self, parameters: list[np.ndarray], config: Config) -> tuple[list, int, dict]:
        """Train the sampled users' submodels; return their summed weighted row updates.

        Parameters
        ----------
        parameters : list of numpy.ndarray
            ``[users, offsets, rows, values]`` (see the module docstring).
        config : dict
            ``server-round``, ``seed``, ``local-iters``, ``batch-size``, ``lr``,
            ``proximal-mu``, ``weighting``.

        Returns
        -------
        tuple
            ``([rows, sums], number of users, {"weight-sum", "samples"})``.

        Raises
        ------
        ValueError
            If the download is malformed or a user's rows are not its submodel.
        """
        secure = bool(config.get("secure-aggregation", 0))
        if config.get("kind") == "feature_heat":
            return self._dense_heat()
        if secure:  # the full model came: the node cuts its users' submodels itself
            if len(parameters) not in (2, 3):
                raise ValueError("fit under secure aggregation expects [users, x(, support)]")
            users = self._own(parameters[0])
            x = np.asarray(parameters[1], dtype=np.float64).ravel()
            if x.shape != (self.task.n_params,) or not np.all(np.isfinite(x)):
                raise ValueError(f"the download must be the finite model ({self.task.n_params},)")
            own_rows, ptr = gather_submodels(self.task, users)
            values = x[own_rows]
        else:
            if len(parameters) != 4:
                raise ValueError("fit expects [users, offsets, rows, values]")
            users = self._own(parameters[0])
            offsets = np.asarray(parameters[1]).astype(np.int64, copy=False).ravel()
            rows = np.asarray(parameters[2]).astype(np.int64, copy=False).ravel()
            values = np.asarray(parameters[3], dtype=np.float64).ravel()
            own_rows, ptr = gather_submodels(self.task, users)
            if offsets.shape != ptr.shape or not np.array_equal(offsets, ptr):
                raise ValueError("the download's offsets do not match the users' submodels")
            if rows.shape != own_rows.shape or not np.array_equal(rows, own_rows):
                raise ValueError("the download's rows are not the users' submodels S(i)")
            if values.shape != rows.shape or not np.all(np.isfinite(values)):
                raise ValueError("the download needs one finite value per row")
        weighting = str(config.get("weighting", "clients"))
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting {weighting!r}: choose one of {WEIGHTINGS}")
        local = LocalConfig(
            iters=int(config["local-iters"]),
            batch=int(config["batch-size"]),
            lr=float(config["lr"]),
            proximal_mu=float(config.get("proximal-mu", 0.0)),
        )
        dp = dp_settings(config)
        if dp is not None:  # clip each user's update, add its share of the noise
            if not secure or len(parameters) != 3 or weighting != "clients":
                raise ValueError("client-level DP needs secure aggregation, the heat support "
                                 "and weighting 'clients'")  # fmt: skip
            support = np.asarray(parameters[2]).astype(np.int64, copy=False).ravel()
            update = private_round_update(
                self.task, users, values, ptr, local, int(config["seed"]),
                int(config["server-round"]), dp, support, int(config["dp-clients"]),
                NoiseSource(self.reproducible_noise, int(config["seed"])),
            )  # fmt: skip
        else:
            update = client_round(
                self.task,
                users,
                values,
                ptr,
                local,
                int(config["seed"]),
                int(config["server-round"]),
                weighting,
            )
        samples = int(self.task.samples_per_client()[users].sum())
        metrics: dict[str, Any] = {"weight-sum": float(update.weight), "samples": samples}
        if dp is not None:  # each user's share, charged to the node's ledger by the privacy mod
            release = gaussian_release([int(u) for u in users], dp.noise_multiplier,
                                       int(config["dp-clients"]))  # fmt: skip
            metrics.update(release.metrics())
        if secure:  # dense: only equal-length vectors can be summed, and rows would show S(i)
            dense = np.zeros(self.task.n_params)
            dense[update.rows] = update.sums
            return [dense], int(users.size), metrics
        return [update.rows.astype(np.int64), update.sums], int(users.size), metrics

    def _dense_heat(self) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        """Answer the counting round under secure aggregation with dense per-row counts."""
        rows, clients, samples = count_heat(self.task, self.users)
        dense_clients = np.zeros(self.task.n_params, dtype=np.int64)
        dense_samples = np.zeros(self.task.n_params, dtype=np.int64)
        dense_clients[rows] = clients
        dense_samples[rows] = samples
        n_samples = int(self.task.samples_per_client()[self.users].sum())
        return [dense_clients, dense_samples], self.num_users, {"num-samples": n_samples}

    def evaluate(self, parameters: list[np.ndarray], config: Config) -> tuple[float, int, dict]:
        """Return the cohort's mean training loss under the full model ``parameters[0]``.

        With ``config["kind"] == "metrics"``: the cohort's share of the server's metrics
        instead, as sums (``eval-loss-sum``, ``eval-n`` over its samples in the pooled
        train-loss sample; ``test-loss-sum``, ``test-correct``, ``test-n`` over its test
        samples), so that the nodes' sums give the pooled train loss, test loss and test
        accuracy without the server holding any data (``server-data = "none"``).
        """
        x = np.asarray(parameters[0], dtype=np.float64).ravel()
        if x.shape != (self.task.n_params,):
            raise ValueError(f"evaluate expects the full model of {self.task.n_params} rows")
        lo = int(self.task.train_ptr[self.first_user])
        hi = int(self.task.train_ptr[self.first_user + self.num_users])
        if config.get("kind") == "metrics":
            return self._metric_sums(x, lo, hi)
        if hi == lo:
            return 0.0, 0, {"loss-sum": 0.0}
        rows = self.task.train_rows[lo:hi].astype(np.int64)
        loss = log_loss(x, rows, self.task.train_y[lo:hi])
        return loss, hi - lo, {"loss-sum": loss * (hi - lo)}

    def _metric_sums(self, x: np.ndarray, lo: int, hi: int) -> tuple[float, int, dict]:
        task = self.task
        ev = task.eval_idx[(task.eval_idx >= lo) & (task.eval_idx < hi)]
        end = self.first_user + self.num_users
        mine = (task.test_client >= self.first_user) & (task.test_client < end)
        out: dict[str, Any] = {"eval-n": int(ev.size), "test-n": int(mine.sum())}
        out["eval-loss-sum"] = (
            log_loss(x, task.train_rows[ev].astype(np.int64), task.train_y[ev]) * ev.size
            if ev.size
            else 0.0
        )
        if out["test-n"]:
            rows, y = task.test_rows[mine].astype(np.int64), task.test_y[mine]
            out["test-loss-sum"] = log_loss(x, rows, y) * out["test-n"]
            out["test-correct"] = int(round(accuracy(x, rows, y) * out["test-n"]))
        else:
            out["test-loss-sum"], out["test-correct"] = 0.0, 0
        return float(out["eval-loss-sum"]), int(ev.size), out
