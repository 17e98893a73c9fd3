"""ContinuousClient: a node's cohort of users for FedCG, FedCG+ and the discrete greedy.

Cohort mode: a NumPyClient over the cohort's rows only (row j = global user
``first_user + j``); a node that is one client uses ``flower_app.clients.fedcg``
instead. It extends :class:`~flower_app.clients.submodular.SubmodularClient` (same
``get_properties`` for discovery and ``evaluate``) with four kinds of ``fit``, chosen by
``config["kind"]``, which :func:`~flower_app.clients.adapter.numpy_client_app` sets to the
message's action (``train.direction`` → ``"direction"``, ...):

``"direction"`` (FedCG Alg. 1 / FedCG+ Alg. 2, one round)
    parameters ``[x float64 (m,), users int64 (K_node,), weights float64 (K_node,)]``;
    config ``server-round``, ``seed``, ``local-steps``, ``gradient``, ``gradient-samples``,
    ``fill-base`` (0/1). Returns τ · Σ_i c_i Δ_i as ``[index int32, value float64]`` or
    ``[value float64 (m,)]``; ``num_examples`` = distinct users; metrics ``weight``
    (Σ c_i) and ``ids-sent``.
``"histogram"`` (round 1 of Algs. 4/5)
    no parameters. Returns ``[Σ_i O_i float64 (m,)]`` over the whole cohort.
``"importance"`` (round 2 of Algs. 4/5)
    parameters ``[O float64 (m,)]``; config ``kappa``. Stores O in ``context.state``
    (record ``"fedcg-histogram"``), computes each user's w_i locally; returns nothing but
    metrics ``expected-participants`` = Σ_i min(1, κ w_i) and ``max-w``.
``"discrete"`` (Alg. 3, one round)
    parameters ``[S int64]``; config ``server-round``, ``seed``, ``kappa``. Returns the
    fixed-point sum of the participants' reports as ``[index int32, value int64]`` or
    ``[value int64 (m,)]``; metrics ``participants``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from flower_app.algorithms.fedcg.continuous import LocalSteps, UserEntries, user_direction_sum
from flower_app.algorithms.fedcg.discrete_greedy import (
    discrete_report_sum,
    histogram_sum,
    importance_factors,
    participation_probabilities,
)
from flower_app.clients.submodular import SubmodularClient, encode_report
from flower_app.submodular.matroids import Matroid
from flower_app.submodular.objectives import MaxRowObjective

__all__ = ["HISTOGRAM_RECORD", "ContinuousClient", "local_steps", "stored_histogram"]

Config = dict[str, Any]

#: name of the ``context.state`` ArrayRecord holding the broadcast histogram O
HISTOGRAM_RECORD = "fedcg-histogram"


def local_steps(config: Any) -> LocalSteps:
    """Return a ``train.direction`` request's local computation (its config's four keys)."""
    return LocalSteps(
        steps=int(config["local-steps"]),
        gradient=str(config["gradient"]),
        samples=int(config["gradient-samples"]),
        fill_base=bool(int(config["fill-base"])),
    )


def stored_histogram(state: RecordDict) -> np.ndarray:
    """Return the histogram O a ``train.importance`` request left in the node's state.

    Raises
    ------
    ValueError
        When there is none: the importance-factor protocol (Algs. 4/5) must run first.
    """
    if HISTOGRAM_RECORD not in state.array_records:
        raise ValueError(
            "no histogram O in this node's state: the importance-factor protocol "
            "(Algs. 4/5) must run first"
        )
    return state.array_records[HISTOGRAM_RECORD]["0"].numpy()


class ContinuousClient(SubmodularClient):
    """The users of one node, for FedCG / FedCG+ / federated discrete greedy.

    Parameters
    ----------
    objective : MaxRowObjective
        Objective over the cohort's rows only.
    first_user : int
        Global index of the cohort's first user.
    n_users_total : int
        Users in the whole dataset.
    partition_id, num_partitions : int
        The node's place in the split.
    matroid : Matroid
        The public constraint (LMO and feasible elements).
    state : RecordDict, optional
        The node's ``context.state`` (keeps the histogram O between rounds); a private
        RecordDict when None.
    cache : dict, optional
        Per-process cache for :class:`~flower_app.algorithms.fedcg.continuous.UserEntries`.
    report_bound : float, optional
        The run's ``report-bound``: the users' profiles are committed (clipped to it) at
        construction, as in :class:`~flower_app.clients.submodular.SubmodularClient`.
    """

    def __init__(
        self,
        objective: MaxRowObjective,
        first_user: int,
        n_users_total: int,
        partition_id: int,
        num_partitions: int,
        matroid: Matroid,
        state: RecordDict | None = None,
        cache: dict[bytes, UserEntries] | None = None,
        report_bound: float | None = None,
    ) -> None:
        super().__init__(
            objective, first_user, n_users_total, partition_id, num_partitions,
            report_bound=report_bound,
        )  # fmt: skip
        self.matroid = matroid
        self.state = state if state is not None else RecordDict()
        self.cache = cache if cache is not None else {}

    # ------------------------------------------------------------------ helpers
    def _local_users(self, users: np.ndarray) -> np.ndarray:
        users = np.asarray(users).astype(np.int64, copy=False).ravel()
        local = users - self.first_user
        if local.size and (local.min() < 0 or local.max() >= self.num_users):
            raise ValueError(
                f"users outside this node's cohort [{self.first_user}, "
                f"{self.first_user + self.num_users})"
            )
        if np.unique(local).size != local.size:
            raise ValueError("users must be distinct (multiplicities go in the weights)")
        return local

    def _entries(self, local: np.ndarray) -> UserEntries:
        key = local.tobytes()
        if key not in self.cache:
            self.cache.clear()
            self.cache[key] = UserEntries.build(self.objective, local)
        return self.cache[key]

    # ------------------------------------------------------------------ fit kinds
    def fit(self, parameters: list[np.ndarray], config: Config) -> tuple[list, int, dict]:
        """Run one step of the protocol named by ``config["kind"]`` (module docstring)."""
        kind = str(config.get("kind", ""))
        if kind == "direction":
            return self._direction(parameters, config)
        if kind == "histogram":
            return [histogram_sum(self.objective)], self.num_users, {}
        if kind == "importance":
            return self._importance(parameters, config)
        if kind == "discrete":
            return self._discrete(parameters, config)
        raise ValueError(f"unknown fit kind {kind!r}")

    def _direction(self, parameters: list[np.ndarray], config: Config) -> tuple[list, int, dict]:
        if len(parameters) != 3:
            raise ValueError("a direction request carries [x, users, weights]")
        x = np.asarray(parameters[0], dtype=np.float64)
        local = self._local_users(parameters[1])
        weights = np.asarray(parameters[2], dtype=np.float64).ravel()
        total, sent = user_direction_sum(
            self.objective, local, weights, x, self.matroid, local_steps(config),
            int(config["seed"]), int(config["server-round"]),
            user_ids=local + self.first_user, entries=self._entries(local),
        )  # fmt: skip
        metrics = {"weight": float(weights.sum()), "ids-sent": int(sent)}
        dense = bool(config.get("secure-aggregation", 0))  # SecAgg sums equal-length vectors
        return encode_report(total, dense), int(local.size), metrics

    def _importance(self, parameters: list[np.ndarray], config: Config) -> tuple[list, int, dict]:
        if len(parameters) != 1:
            raise ValueError("an importance request carries [histogram]")
        histogram = np.asarray(parameters[0], dtype=np.float64)
        w = importance_factors(self.objective, histogram)
        kappa_i = participation_probabilities(w, float(config["kappa"]))
        self.state[HISTOGRAM_RECORD] = ArrayRecord([histogram])
        metrics = {
            "expected-participants": float(kappa_i.sum()),
            "max-w": float(w.max(initial=0.0)),
        }
        return [np.zeros(0)], self.num_users, metrics

    def _discrete(self, parameters: list[np.ndarray], config: Config) -> tuple[list, int, dict]:
        if len(parameters) != 1:
            raise ValueError("a discrete-greedy request carries [selected]")
        selected = self._selected(parameters[0])
        w = importance_factors(self.objective, stored_histogram(self.state))
        kappa_i = participation_probabilities(w, float(config["kappa"]))
        ids = np.arange(self.num_users, dtype=np.int64) + self.first_user
        total, participants = discrete_report_sum(
            self.objective, selected, self.matroid, kappa_i,
            int(config["seed"]), int(config["server-round"]), ids,
        )  # fmt: skip
        dense = bool(config.get("secure-aggregation", 0))
        return encode_report(total, dense, np.int64), self.num_users, {"participants": participants}
