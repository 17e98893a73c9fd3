"""LearningClient: a node's cohort of clients for MaxFL and its baselines (a NumPyClient).

A node serves a contiguous range of the federation's clients, seen and unseen (a node is not
a client: :mod:`flower_app.clients.cohorts`). Each client's solo-model results — its
requirement ρ_k — are computed the first time they are needed and kept in the node's
persistent state: ``context.state`` under Flower (:class:`RecordState`), a plain dict in the
direct engine (:class:`DictState`). SCAFFOLD's client control variates c_k live there too.

The NumPyClient methods and what they exchange (the strategy side is
:class:`flower_app.strategies.cohort.maxfl.MaxFLCohorts`):

``get_properties({"kind": "cohort"})``
    ``partition-id``, ``num-partitions``, ``first-user``, ``num-users``, ``n-users-total``,
    ``n-elements`` (= number of model parameters; checked by the server's discovery).
``fit(parameters, {"server-round", "users", "algorithm"[, "mw-share"]})``
    trains the listed seen clients from ``parameters`` (the model; for SCAFFOLD the model
    then the server control variate) and returns the float64 sums of their arrays (see
    :class:`~flower_app.algorithms.maxfl.learning.UserResult`), ``len(users)`` and metrics
    ``users`` (list of int), ``q`` and ``loss`` (lists of float, one per user),
    ``h-sum`` (float; q-FFL). MW-Fed: ``mw-share`` (list of float, one s_k > 0 per user,
    required) sets each client's weight and local steps; the metrics add ``met`` (list
    of int 0/1: F_k(w) < ρ_k with the loss as reported). Under secure aggregation
    (``secure-aggregation`` in the config) the metrics are sums only: ``q-sum``,
    ``loss-sum``, ``h-sum`` (MW-Fed refuses it: its step needs each client's ``met``).
    With client-level DP (``dp-noise``, ``dp-clip``, ``dp-clients`` in the config; MaxFL and
    FedAvg) each client's update is clipped, weighted and noised before it is summed
    (:func:`flower_app.algorithms.common.gaussian_dp.privatize`; the noise from the node's OS
    entropy, :mod:`flower_app.algorithms.common.dp_noise`) and the metrics are ``q-sum``
    (Σ (q_k C + noise) / C) and ``h-sum`` = 0: no loss is released.
``evaluate(parameters, {"kind": "appeal", "users"})``
    metrics ``appealing``: the listed clients for which F_k(w) < ρ_k (requirement split).
    Byzantine clients always opt in (an attacker wants to be sampled; they lie about their
    loss only in ``fit``).
``evaluate(parameters, {"kind": "metrics", "server-round", "tuned"})``
    sums over the node's clients, per group g ∈ {seen, unseen}: ``g-count``, ``g-loss``,
    ``g-acc``, ``g-appeal`` (held-out loss of w below that of ŵ_k: Eq. 1 with true losses
    estimated on held-out data), ``g-appeal-req`` (F_k(w) < ρ_k on the requirement split),
    ``g-pref-acc`` (accuracy of w if it appeals, else of ŵ_k), and with ``tuned`` = 1 the
    same after ``tune_steps`` local steps: ``g-tuned-appeal``, ``g-tuned-acc``,
    ``g-tuned-pref-acc``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.client import NumPyClient

from flower_app.algorithms.common.dp_noise import DP_NOISE, NoiseSource
from flower_app.algorithms.common.gaussian_dp import (
    DP_ALGORITHMS,
    GaussianDP,
    dp_settings,
    privatize,
)
from flower_app.algorithms.common.threads import single_thread
from flower_app.algorithms.maxfl.learning import (
    LOCAL_RULES,
    LocalConfig,
    SoloResult,
    solo_requirement,
    solo_requirements,
    train_users,
    tuned_eval,
)
from flower_app.algorithms.maxfl.local_steps import evaluate, make_model
from flower_app.algorithms.maxfl.server_rules import rule_for
from flower_app.datasets.federated import Federation
from flower_app.models.mlp import MLP
from flower_app.privacy.ledger import gaussian_release

__all__ = ["DictState", "LearningClient", "RecordState", "byzantine_clients"]

GROUPS = ("seen", "unseen")


class DictState:
    """Persistent client state in a plain dict (direct engine).

    Parameters
    ----------
    store : dict, optional
        The backing dict (a new one if None).
    """

    def __init__(self, store: dict[str, Any] | None = None) -> None:
        self.store = {} if store is None else store

    def get_solo(self, user: int) -> SoloResult | None:
        """Return client ``user``'s solo results, or None."""
        values = self.store.get(f"solo-{user}")
        return None if values is None else SoloResult(*values)

    def set_solo(self, user: int, solo: SoloResult) -> None:
        """Keep client ``user``'s solo results."""
        self.store[f"solo-{user}"] = solo.to_list()

    def get_control(self, user: int) -> list[np.ndarray] | None:
        """Return client ``user``'s SCAFFOLD control variate, or None."""
        return self.store.get(f"control-{user}")

    def set_control(self, user: int, control: Sequence[np.ndarray]) -> None:
        """Keep client ``user``'s SCAFFOLD control variate."""
        self.store[f"control-{user}"] = [np.asarray(c, np.float32) for c in control]


class RecordState(DictState):
    """Persistent client state in Flower's ``context.state`` (a RecordDict).

    Solo results live in the MetricRecord ``"maxfl-solo"`` (key: user id, value:
    ``[rho_train, rho_heldout, acc_heldout]``), control variates in ArrayRecords
    ``"scaffold-c-<user>"``.

    Parameters
    ----------
    state : RecordDict
        ``context.state`` of the node.
    """

    def __init__(self, state: RecordDict) -> None:
        self.state = state

    def get_solo(self, user: int) -> SoloResult | None:
        """Return client ``user``'s solo results, or None."""
        if "maxfl-solo" not in self.state:
            return None
        values = self.state["maxfl-solo"].get(str(user))
        return None if values is None else SoloResult(*(float(v) for v in values))

    def set_solo(self, user: int, solo: SoloResult) -> None:
        """Keep client ``user``'s solo results."""
        record = self.state["maxfl-solo"] if "maxfl-solo" in self.state else MetricRecord()
        record[str(user)] = [float(v) for v in solo.to_list()]
        self.state["maxfl-solo"] = record

    def get_control(self, user: int) -> list[np.ndarray] | None:
        """Return client ``user``'s SCAFFOLD control variate, or None."""
        key = f"scaffold-c-{user}"
        return self.state[key].to_numpy_ndarrays() if key in self.state else None

    def set_control(self, user: int, control: Sequence[np.ndarray]) -> None:
        """Keep client ``user``'s SCAFFOLD control variate."""
        self.state[f"scaffold-c-{user}"] = ArrayRecord([np.asarray(c, np.float32) for c in control])


def byzantine_clients(n_seen: int, fraction: float, seed: int) -> np.ndarray:
    """Return the sorted ids of the Byzantine seen clients (``round(fraction · n_seen)``)."""
    count = int(round(fraction * n_seen))
    rng = np.random.default_rng([int(seed), 4])
    return np.sort(rng.choice(n_seen, size=count, replace=False)) if count else np.zeros(0, int)


class LearningClient(NumPyClient):
    """A node's clients for MaxFL and its baselines.

    Parameters
    ----------
    federation : Federation
        All clients' data (the node only touches its own range).
    first_user : int
        First client id the node serves.
    num_users : int
        How many consecutive clients it serves.
    algorithm : str
        ``maxfl``, ``fedavg``, ``fedprox``, ``qffl``, ``scaffold``, ``mwfed``, ``perfedavg`` or
        ``pfedme``.
    local : LocalConfig
        Hyperparameters of the clients.
    init_weights : sequence of numpy.ndarray
        w⁽⁰⁾ (the solo models start from it).
    seed : int
        Run seed (seeds every client's streams).
    state : DictState
        Persistent state (:class:`RecordState` under Flower).
    byzantine : numpy.ndarray, optional
        Ids of Byzantine seen clients.
    partition_id, num_partitions : int, optional
        Reported in discovery.
    reproducible_noise : bool, optional
        The research mode ``dp-reproducible-noise`` (default False), from the node's own
        run_config: DP noise keyed by (seed, round, client) instead of OS entropy; no
        privacy against the server (:mod:`flower_app.algorithms.common.dp_noise`). A message
        cannot switch it on.
    """

    def __init__(
        self,
        federation: Federation,
        first_user: int,
        num_users: int,
        algorithm: str,
        local: LocalConfig,
        init_weights: Sequence[np.ndarray],
        seed: int,
        state: DictState,
        byzantine: np.ndarray | None = None,
        partition_id: int = 0,
        num_partitions: int = 1,
        reproducible_noise: bool = False,
    ) -> None:
        self.fed = federation
        self.first = int(first_user)
        self.count = int(num_users)
        self.algorithm = algorithm
        self.rule = rule_for(algorithm)
        self.local = local
        self.init = [np.asarray(w, np.float32) for w in init_weights]
        self.seed = int(seed)
        self.state = state
        self.byzantine = set() if byzantine is None else {int(u) for u in byzantine}
        self.partition_id = int(partition_id)
        self.num_partitions = int(num_partitions)
        self.reproducible_noise = bool(reproducible_noise)

    # ------------------------------------------------------------------ helpers
    def _own(self, users: Sequence[int], seen_only: bool) -> list[int]:
        out = [int(u) for u in users]
        for u in out:
            if not self.first <= u < self.first + self.count:
                raise ValueError(
                    f"client {u} is not served by this node "
                    f"({self.first}..{self.first + self.count - 1})"
                )
            if seen_only and u >= self.fed.n_seen:
                raise ValueError(f"client {u} is unseen and never trains")
        return out

    def solo(self, user: int) -> SoloResult:
        """Return client ``user``'s solo results (ρ_k), computing and storing them once."""
        solo = self.state.get_solo(user)
        if solo is None:
            if self.local.solo_steps < 1:
                raise ValueError(
                    f"client {user}: ρ_k is missing and solo training is disabled "
                    "(maxfl-solo-steps = 0)"
                )
            data = self.fed.client(user)
            solo = solo_requirement(
                self.init, data, self.fed.n_classes, self.local, self.seed, user
            )
            self.state.set_solo(user, solo)
        return solo

    def _ensure_solos(self, users: Sequence[int]) -> None:
        """With batched clients: train the missing solo models of ``users`` together."""
        if not self.local.batched or self.local.solo_steps < 1:
            return
        missing = [u for u in users if self.state.get_solo(u) is None]
        if not missing:
            return
        solos = solo_requirements(
            self.init, [self.fed.client(u) for u in missing], self.fed.n_classes, self.local,
            self.seed, missing,
        )  # fmt: skip
        for u, solo in zip(missing, solos, strict=True):
            self.state.set_solo(u, solo)

    # ------------------------------------------------------------------ NumPyClient
    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        """Announce the cohort (discovery)."""
        return {
            "partition-id": self.partition_id,
            "num-partitions": self.num_partitions,
            "first-user": self.first,
            "num-users": self.count,
            "n-users-total": self.fed.n_clients,
            "n-elements": int(sum(w.size for w in self.init)),
        }

    def fit(
        self, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        """Train the listed clients one round and return the sums of their arrays."""
        users = self._own(config["users"], seen_only=True)
        server_round = int(config["server-round"])
        n_model = len(self.init)
        weights = [np.asarray(p) for p in parameters[:n_model]]
        control = [np.asarray(p) for p in parameters[n_model:]] or None
        if self.rule.copies > 1 and control is None:
            raise ValueError(f"{self.algorithm} needs the server control variate after the model")
        shares = [1.0] * len(users)
        key = self.rule.share_key
        if key is not None:
            if key not in config:
                raise ValueError(f"{self.algorithm} needs '{key}' (one relative weight per user)")
            shares = [float(v) for v in config[key]]
            if len(shares) != len(users):
                raise ValueError(f"'{key}' has {len(shares)} values for {len(users)} users")
        sums: list[np.ndarray] | None = None
        qs, losses, met, h_sum = [], [], [], 0.0
        if LOCAL_RULES[self.algorithm].needs_rho:
            self._ensure_solos(users)
        requests = [
            {
                "algorithm": self.algorithm,
                "weights": weights,
                "data": self.fed.client(u),
                "n_classes": self.fed.n_classes,
                "cfg": self.local,
                "seed": self.seed,
                "server_round": server_round,
                "user": u,
                "solo": self.solo(u) if LOCAL_RULES[self.algorithm].needs_rho else None,
                "byzantine": u in self.byzantine,
                "control": control,
                "client_control": self.state.get_control(u) if control is not None else None,
                "mw_share": share,
            }
            for u, share in zip(users, shares, strict=True)
        ]
        results = train_users(requests, batched=self.local.batched)
        dp = dp_settings(config)
        q_terms = 0.0
        noise = NoiseSource(self.reproducible_noise, self.seed)  # this node, this round
        for u, res in zip(users, results, strict=True):
            if res.new_control is not None:
                self.state.set_control(u, res.new_control)
            if dp is not None:  # clip, weight and add this client's share of the noise
                rng = noise.generator(server_round, u, DP_NOISE)
                res.arrays, q_term = self._privatize(res, dp, config, rng)
                q_terms += q_term
            sums = (
                res.arrays
                if sums is None
                else [s + a for s, a in zip(sums, res.arrays, strict=True)]
            )
            qs.append(res.q)
            losses.append(res.loss)
            met.append(int(res.met))
            h_sum += res.h
        if sums is None:
            if not config.get("secure-aggregation"):
                raise ValueError("fit needs at least one client")
            # a node with no sampled user in a secure round (it only makes the sum possible):
            # zeros of the reply's shapes
            sums = [np.zeros(w.shape, np.float64) for w in weights] * self.rule.copies
        if dp is not None:  # Σ (q_k C + noise) / C; no loss: it is not privatised
            release = gaussian_release(
                [int(u) for u in users], dp.noise_multiplier, int(config["dp-clients"])
            )  # each client's share, charged to the node's ledger by the privacy mod
            return sums, len(users), {"q-sum": q_terms / dp.clip, "h-sum": 0.0,
                                      **release.metrics()}  # fmt: skip
        if config.get("secure-aggregation"):  # only sums: the server sees Σ over all nodes
            if self.rule.reports_met:
                raise ValueError(f"{self.algorithm} needs per-client replies, not sums")
            sums_only = {"q-sum": float(np.sum(qs)), "loss-sum": float(np.sum(losses)),
                         "h-sum": float(h_sum)}  # fmt: skip
            return sums, len(users), sums_only
        metrics: dict[str, Any] = {"users": users, "q": qs, "loss": losses, "h-sum": float(h_sum)}
        if self.rule.reports_met:
            metrics["met"] = met
        return sums, len(users), metrics

    def _privatize(
        self, res: Any, dp: GaussianDP, config: dict[str, Any], rng: np.random.Generator
    ) -> tuple[list[np.ndarray], float]:
        """Clip, weight and noise one client's update (see ``gaussian_dp.privatize``).

        ``rng`` is the node's noise for this round (OS entropy unless in the research mode).
        """
        if self.algorithm not in DP_ALGORITHMS:
            raise ValueError(f"{self.algorithm} has no client-level DP here ({DP_ALGORITHMS})")
        if self.algorithm == "maxfl":  # res.arrays = q_k Δ_k
            q = float(res.q)
            zeros = [np.zeros_like(a) for a in res.arrays]
            delta = [a / q for a in res.arrays] if q > 0 else zeros
        else:
            q, delta = None, res.arrays
        return privatize(delta, q, dp, int(config["dp-clients"]), rng)

    def evaluate(
        self, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[float, int, dict[str, Any]]:
        """Answer an opt-in (``kind`` = appeal) or a metrics (``kind`` = metrics) request."""
        kind = str(config.get("kind", "metrics"))
        weights = [np.asarray(p) for p in parameters[: len(self.init)]]
        if kind == "appeal":
            users = self._own(config["users"], seen_only=True)
            with single_thread():
                model = make_model(weights, self.fed.n_classes, self.local.dropout)
            self._ensure_solos([u for u in users if u not in self.byzantine])
            appealing = [u for u in users if self._appeals(model, u)]
            return 0.0, len(users), {"appealing": appealing}
        if kind != "metrics":
            raise ValueError(f"unknown evaluate kind {kind!r}")
        return self._metrics(weights, int(config.get("server-round", 0)), bool(config.get("tuned")))

    def _appeals(self, model: MLP, user: int) -> bool:
        if user in self.byzantine:
            return True  # an attacker stays in the pool to be sampled
        data = self.fed.client(user)
        with single_thread():
            if self.local.requirement == "train":
                loss, _ = evaluate(model, data.x_train, data.y_train)
            else:
                loss, _ = evaluate(model, data.x_test, data.y_test)
        return loss < self.solo(user).rho(self.local.requirement)

    def _metrics(
        self, weights: Sequence[np.ndarray], server_round: int, tuned: bool
    ) -> tuple[float, int, dict[str, Any]]:
        sums: dict[str, float] = {}
        for g in GROUPS:
            keys = ["count", "loss", "acc", "appeal", "appeal-req", "pref-acc"]
            if tuned:
                keys += ["tuned-appeal", "tuned-acc", "tuned-pref-acc"]
            sums.update({f"{g}-{k}": 0.0 for k in keys})
        with single_thread():
            model = make_model(weights, self.fed.n_classes, self.local.dropout)
        total_loss = 0.0
        self._ensure_solos(range(self.first, self.first + self.count))
        for u in range(self.first, self.first + self.count):
            g = "seen" if u < self.fed.n_seen else "unseen"
            data = self.fed.client(u)
            solo = self.solo(u)
            with single_thread():
                loss, acc = evaluate(model, data.x_test, data.y_test)
                req_loss = (
                    evaluate(model, data.x_train, data.y_train)[0]
                    if self.local.requirement == "train"
                    else loss
                )
            appeal = loss < solo.rho_heldout
            sums[f"{g}-count"] += 1
            sums[f"{g}-loss"] += loss
            sums[f"{g}-acc"] += acc
            sums[f"{g}-appeal"] += float(appeal)
            sums[f"{g}-appeal-req"] += float(req_loss < solo.rho(self.local.requirement))
            sums[f"{g}-pref-acc"] += acc if appeal else solo.acc_heldout
            if tuned:
                t_loss, t_acc = tuned_eval(
                    weights, data, self.fed.n_classes, self.local, self.seed, server_round, u
                )
                t_appeal = t_loss < solo.rho_heldout
                sums[f"{g}-tuned-appeal"] += float(t_appeal)
                sums[f"{g}-tuned-acc"] += t_acc
                sums[f"{g}-tuned-pref-acc"] += t_acc if t_appeal else solo.acc_heldout
            total_loss += loss
        return total_loss / max(self.count, 1), self.count, sums
