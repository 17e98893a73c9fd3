"""The server side of MaxFL and each baseline, one class per rule (no Flower import).

A :class:`ServerRule` says what the sampled clients receive, which per-client settings go
with them, which reply values are valid, and how the summed replies move the server's
state (:class:`~flower_app.algorithms.maxfl.appeal.AppealServer` holds the state; a rule holds
none; the clients' side is :class:`flower_app.algorithms.maxfl.learning.LocalRule`).
:data:`RULES` maps each algorithm name of the run_config to its rule, so the protocol and
the strategy ask the rule instead of comparing names:

==============================  ===================  =====================================
algorithm                       rule                 server step
==============================  ===================  =====================================
maxfl                           :class:`MaxFLRule`   w − η_g/(Σq_k + ε) · Σ q_k Δw_k
fedavg, fedprox, perfedavg,     :class:`FedAvgRule`  w − η_g/|S| · Σ Δw_k (the clients
pfedme                                               differ, the server does not)
qffl                            :class:`QFFLRule`    w − Σ Δ_k / Σ h_k
scaffold                        :class:`ScaffoldRule`  FedAvg step, then c += Σ Δc_k / N
mwfed                           :class:`MWFedRule`   w − η_g/Σ s_k · Σ s_k Δw_k, λ_k update
==============================  ===================  =====================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from flower_app.algorithms.maxfl.baselines import (
    check_mw_eta,
    fedavg_update,
    mwfed_reweight,
    mwfed_shares,
    qffl_update,
    scaffold_control_update,
)
from flower_app.algorithms.maxfl.core import Q_MAX, adaptive_server_lr, maxfl_update

if TYPE_CHECKING:  # pragma: no cover
    from flower_app.algorithms.maxfl.appeal import AppealServer, TrainOutcome

__all__ = [
    "RULES",
    "FedAvgRule",
    "MWFedRule",
    "MaxFLRule",
    "QFFLRule",
    "ScaffoldRule",
    "ServerRule",
    "rule_for",
]


class ServerRule:
    """FedAvg's server: the base of every rule (subclasses override what differs)."""

    #: model copies in the payload and in a reply (SCAFFOLD: the model, then c)
    copies: ClassVar[int] = 1
    #: train-config key holding one weight per client (MW-Fed's ``mw-share``), or None
    share_key: ClassVar[str | None] = None
    #: the clients report ``met`` (F_k(w) < ρ_k) per client (MW-Fed)
    reports_met: ClassVar[bool] = False

    def setup(self, server: AppealServer) -> None:
        """Check the hyperparameters and create the rule's state on ``server``."""

    def user_config(self, server: AppealServer, users: np.ndarray) -> dict[str, list[float]]:
        """Return per-client train settings of the sampled ``users`` (default: none)."""
        return {}

    def check_reply(self, qs: list[float], h_sum: float, metrics: Mapping[str, Any]) -> list[bool]:
        """Check a node's reply values; return its clients' ``met`` flags (default: none).

        Parameters
        ----------
        qs : list of float
            The node's q_k values (finite).
        h_sum : float
            Its Σ h_k (finite).
        metrics : mapping
            The whole reply metrics (for rule-specific entries).

        Returns
        -------
        list of bool
            MW-Fed's met flags; empty for the other rules.

        Raises
        ------
        ValueError
            If a value is out of the rule's range.
        """
        return []

    def step(self, server: AppealServer, outcome: TrainOutcome) -> dict[str, float]:
        """Apply the step to ``server`` (called only with at least one reply summed)."""
        assert outcome.sums is not None
        n = len(server.weights)
        server.weights = fedavg_update(
            server.weights, outcome.sums[:n], outcome.users, server.server_lr
        )
        return {"server-step": server.server_lr / outcome.users}


class FedAvgRule(ServerRule):
    """FedAvg, FedProx, Per-FedAvg and pFedMe: the average of the clients' updates."""


class MaxFLRule(ServerRule):
    """MaxFL (Algorithm 1): q_k-weighted updates, adaptive global learning rate."""

    def setup(self, server: AppealServer) -> None:
        """Raise on ε ≤ 0 or η_g ≤ 0."""
        adaptive_server_lr(0.0, server.server_lr, server.eps)

    def check_reply(self, qs: list[float], h_sum: float, metrics: Mapping[str, Any]) -> list[bool]:
        """Reject q_k outside [0, 1/4] (σ'(x) cannot leave it)."""
        if any(q < 0 or q > Q_MAX + 1e-12 for q in qs):
            raise ValueError(f"q_k must lie in [0, 1/4], got {qs}")
        return []

    def step(self, server: AppealServer, outcome: TrainOutcome) -> dict[str, float]:
        """Step w ← w − η_g / (Σ q_k + ε) · Σ q_k Δw_k."""
        assert outcome.sums is not None
        q_sum = float(np.sum(outcome.q)) if outcome.q_sum is None else float(outcome.q_sum)
        server.weights = maxfl_update(
            server.weights, outcome.sums, q_sum, server.server_lr, server.eps
        )
        return {"server-step": adaptive_server_lr(q_sum, server.server_lr, server.eps)}


class QFFLRule(ServerRule):
    """q-FFL (Li et al. 2020): w ← w − Σ Δ_k / Σ h_k."""

    def check_reply(self, qs: list[float], h_sum: float, metrics: Mapping[str, Any]) -> list[bool]:
        """Reject h ≤ 0."""
        if h_sum <= 0:
            raise ValueError(f"q-FFL needs h > 0, got {h_sum}")
        return []

    def step(self, server: AppealServer, outcome: TrainOutcome) -> dict[str, float]:
        """Step w ← w − Σ Δ_k / Σ h_k."""
        assert outcome.sums is not None
        server.weights = qffl_update(server.weights, outcome.sums, outcome.h_sum)
        return {"server-step": 1.0 / outcome.h_sum}


class ScaffoldRule(ServerRule):
    """SCAFFOLD: FedAvg's step on w, and the server control variate c."""

    copies: ClassVar[int] = 2

    def setup(self, server: AppealServer) -> None:
        """Start c at zeros unless given."""
        if server.control is None:
            server.control = [np.zeros_like(w) for w in server.weights]

    def step(self, server: AppealServer, outcome: TrainOutcome) -> dict[str, float]:
        """FedAvg's step, then c ← c + Σ Δc_k / N."""
        assert outcome.sums is not None and server.control is not None
        out = super().step(server, outcome)
        n = len(server.weights)
        server.control = scaffold_control_update(server.control, outcome.sums[n:], server.n_seen)
        return out


class MWFedRule(ServerRule):
    """MW-Fed (Blum et al. 2021): multiplicative weights λ_k of the unmet clients."""

    share_key: ClassVar[str | None] = "mw-share"
    reports_met: ClassVar[bool] = True

    def setup(self, server: AppealServer) -> None:
        """Check η_mw and start λ at ones unless given."""
        server.mw_eta = check_mw_eta(server.mw_eta)
        if server.mw_weights is None:
            server.mw_weights = np.ones(server.n_seen, dtype=np.float64)
        server.mw_weights = np.asarray(server.mw_weights, dtype=np.float64)
        if server.mw_weights.shape != (server.n_seen,):
            raise ValueError(f"MW-Fed needs {server.n_seen} weights, got {server.mw_weights.shape}")

    def user_config(self, server: AppealServer, users: np.ndarray) -> dict[str, list[float]]:
        """``mw-share``: s_k = |S| λ_k / Σ_{j∈S} λ_j per sampled client (remembered)."""
        if len(users) == 0:
            return {}
        assert server.mw_weights is not None
        ids = [int(u) for u in users]
        shares = mwfed_shares(server.mw_weights[ids])
        server._shares = {u: float(s) for u, s in zip(ids, shares, strict=True)}  # noqa: SLF001
        return {self.share_key: [float(s) for s in shares]}

    def check_reply(self, qs: list[float], h_sum: float, metrics: Mapping[str, Any]) -> list[bool]:
        """Require ``met``: one 0/1 per client."""
        raw = metrics.get("met")
        if not isinstance(raw, list) or len(raw) != len(qs):
            raise ValueError("MW-Fed metrics need 'met': one 0/1 per client")
        if any(isinstance(v, float) or int(v) not in (0, 1) for v in raw):
            raise ValueError(f"'met' values must be 0 or 1, got {raw}")
        return [bool(int(v)) for v in raw]

    def step(self, server: AppealServer, outcome: TrainOutcome) -> dict[str, float]:
        """Step w ← w − η_g/Σ s_k · Σ s_k Δw_k, then raise λ_k of the unmet clients."""
        shares = server._shares  # noqa: SLF001
        assert server.mw_weights is not None and outcome.sums is not None
        if len(outcome.ids) != outcome.users or len(outcome.met) != outcome.users:
            raise ValueError("MW-Fed needs the ids and met flags of every aggregated client")
        missing = [u for u in outcome.ids if u not in shares]
        if missing:
            raise ValueError(f"MW-Fed: clients {missing} were not sent a weight this round")
        share_sum = float(sum(shares[u] for u in sorted(outcome.ids)))  # engine-free order
        server.weights = fedavg_update(server.weights, outcome.sums, share_sum, server.server_lr)
        ids = np.asarray(outcome.ids, dtype=np.int64)
        unmet = ~np.asarray(outcome.met, dtype=bool)
        server.mw_weights[ids] = mwfed_reweight(server.mw_weights[ids], unmet, server.mw_eta)
        share_max = max(shares.values())
        server._shares = {}  # noqa: SLF001
        return {
            "server-step": server.server_lr / share_sum,
            "mw-unmet": int(unmet.sum()),
            "mw-share-max": float(share_max),
            "mw-weight-max": float(server.mw_weights.max()),
        }


#: algorithm name -> its server rule
RULES: dict[str, type[ServerRule]] = {
    "maxfl": MaxFLRule,
    "fedavg": FedAvgRule,
    "fedprox": FedAvgRule,
    "perfedavg": FedAvgRule,
    "pfedme": FedAvgRule,
    "qffl": QFFLRule,
    "scaffold": ScaffoldRule,
    "mwfed": MWFedRule,
}


def rule_for(algorithm: str) -> ServerRule:
    """Return the server rule of ``algorithm`` (ValueError naming the known ones)."""
    if algorithm not in RULES:
        raise ValueError(f"algorithm {algorithm!r} is not one of {tuple(RULES)}")
    return RULES[algorithm]()
