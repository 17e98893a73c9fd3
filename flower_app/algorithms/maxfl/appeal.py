"""The round protocol shared by MaxFL and its baselines, its pieces written once for both engines.

The Flower strategy (:class:`flower_app.strategies.cohort.maxfl.MaxFLCohorts`) runs the
protocol's steps as the hooks of its base's loop, and the direct engine (the repository's
``direct/maxfl.py``) runs them in one loop that calls the clients in-process, with the pieces
written here (:class:`PoolCache`, :func:`round_row`, :func:`outcome_row`,
:func:`evaluates_at`, :func:`summarise_metrics`), in the same order: opt-in request,
sampling, training, step, evaluation; so both engines draw the same clients and produce the
same rows. The server state and its step per algorithm are :class:`AppealServer`. No Flower
import.

One round t = 1..T:

1. with flexible participation and t > ``mandatory_rounds``, every seen client says whether
   the current model appeals to it (F_k(w) < ρ_k); the pool is those that do, else all
   seen clients (F_k(w) is deterministic, so when no client trained since the last opt-in
   request the model is unchanged and the previous pool is reused without asking again);
2. the server samples min(K, |pool|) clients from the pool (its own generator);
3. the sampled clients train (with per-client settings from
   :meth:`AppealServer.user_config`: MW-Fed's relative weights); the server steps (no step
   if none trained);
4. every ``eval_every`` rounds, and at round 0 and T, all clients (seen and unseen) are
   evaluated; at T also after local tuning (Table 3) if asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flower_app.algorithms.maxfl.learning import ALGORITHMS
from flower_app.algorithms.maxfl.server_rules import ServerRule, rule_for

__all__ = [
    "AppealServer",
    "PoolCache",
    "TrainOutcome",
    "evaluates_at",
    "outcome_row",
    "round_row",
    "same_model",
    "summarise_metrics",
]


@dataclass
class TrainOutcome:
    """What the clients of one round sent, summed over the valid replies.

    Attributes
    ----------
    sums : list of numpy.ndarray or None
        Sum of the clients' arrays (None if no valid reply).
    users : int
        Clients whose arrays are in the sums.
    q : list of float
        Their MaxFL weights.
    losses : list of float
        Their reported losses F_k(w).
    h_sum : float
        Σ h_k (q-FFL).
    ids : list of int
        The clients whose arrays are in the sums, in the order of ``q`` and ``losses``.
    met : list of bool
        MW-Fed: whether each of them reported F_k(w) < ρ_k (empty for other algorithms).
    q_sum, loss_sum : float or None
        Σ q_k and Σ F_k(w) when only the sums are known (secure aggregation: ``q`` and
        ``losses`` are then empty); None otherwise.
    bad_replies : int
        Replies left out (errors, invalid content, timeouts).
    info : dict
        Transport extras recorded in the round's row (e.g. bytes).
    """

    sums: list[np.ndarray] | None
    users: int
    q: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    h_sum: float = 0.0
    ids: list[int] = field(default_factory=list)
    met: list[bool] = field(default_factory=list)
    q_sum: float | None = None
    loss_sum: float | None = None
    bad_replies: int = 0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class AppealServer:
    """Server state of MaxFL or a baseline; its step is the algorithm's server rule.

    Parameters
    ----------
    algorithm : str
        ``maxfl``, ``fedavg``, ``fedprox``, ``qffl``, ``scaffold``, ``mwfed``, ``perfedavg`` or
        ``pfedme`` (the last two step as FedAvg; their clients differ).
    weights : list of numpy.ndarray
        The initial global model w⁽⁰⁾ (float32).
    n_seen : int
        Seen clients (SCAFFOLD's N; MW-Fed keeps one weight per seen client).
    server_lr : float, optional
        η_g (default 1.0; unused by q-FFL, whose step is Σ Δ_k / Σ h_k).
    eps : float, optional
        MaxFL's ε > 0 (default 1e-3).
    mw_eta : float, optional
        MW-Fed's η_mw > 0 (default 0.1; see :mod:`flower_app.algorithms.maxfl.baselines`).
    control : list of numpy.ndarray, optional
        SCAFFOLD's server control variate c (zeros if None).
    mw_weights : numpy.ndarray, optional
        MW-Fed's λ_k of the seen clients (ones if None).
    """

    algorithm: str
    weights: list[np.ndarray]
    n_seen: int
    server_lr: float = 1.0
    eps: float = 1e-3
    mw_eta: float = 0.1
    control: list[np.ndarray] | None = None
    mw_weights: np.ndarray | None = None
    _shares: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    rule: ServerRule = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm {self.algorithm!r} is not one of {ALGORITHMS}")
        self.rule = rule_for(self.algorithm)
        self.weights = [np.asarray(w, np.float32) for w in self.weights]
        self.rule.setup(self)

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the arrays a node must send back (the model's, per rule copy)."""
        return [w.shape for w in self.weights] * self.rule.copies

    def payload(self) -> list[np.ndarray]:
        """Return what the sampled clients receive: w (and c for SCAFFOLD)."""
        return list(self.weights) + (list(self.control) if self.control is not None else [])

    def user_config(self, users: np.ndarray) -> dict[str, list[float]]:
        """Return the per-client train settings of this round's sampled ``users``.

        MW-Fed: ``{"mw-share": [s_k, ...]}``, the relative weights
        s_k = |S| λ_k / Σ_{j∈S} λ_j in the order of ``users`` (remembered for
        :meth:`step`); other algorithms: ``{}``. See
        :mod:`~flower_app.algorithms.maxfl.server_rules`.

        Parameters
        ----------
        users : numpy.ndarray
            The sampled seen clients S.

        Returns
        -------
        dict
            Config key -> one value per entry of ``users``.
        """
        return self.rule.user_config(self, users)

    def step(self, outcome: TrainOutcome) -> dict[str, float]:
        """Apply the algorithm's server step (its rule) to the round's summed replies.

        Parameters
        ----------
        outcome : TrainOutcome
            The valid replies, summed.

        Returns
        -------
        dict
            ``server-step``: the step size applied to the summed arrays (0 if no step);
            MW-Fed adds ``mw-unmet`` (clients not met this round), ``mw-share-max`` (the
            largest s_k sent) and ``mw-weight-max`` (the largest λ_k after the update).
        """
        if outcome.sums is None or outcome.users == 0:
            return {"server-step": 0.0}
        return self.rule.step(self, outcome)


def summarise_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Turn per-group metric sums into means: ``seen-gm-appeal``, ``unseen-acc``, ...

    Parameters
    ----------
    sums : dict
        Keys ``<group>-count`` and ``<group>-<metric>`` summed over clients.

    Returns
    -------
    dict
        ``<group>-gm-appeal`` (from ``appeal``), ``<group>-<metric>`` means otherwise.
    """
    out: dict[str, float] = {}
    for g in ("seen", "unseen"):
        count = sums.get(f"{g}-count", 0.0)
        if count <= 0:
            continue
        for key, value in sums.items():
            if not key.startswith(g + "-") or key == f"{g}-count":
                continue
            name = key[len(g) + 1 :]
            name = {"appeal": "gm-appeal", "tuned-appeal": "tuned-gm-appeal"}.get(name, name)
            out[f"{g}-{name}"] = float(value) / count
    return out


def same_model(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Return True if two models have equal arrays (same count, shapes and values)."""
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


class PoolCache:
    """The last opt-in answer, reused while the model it was asked about is unchanged.

    F_k(w) is deterministic, so when no client trained since the last opt-in request the
    answer is the same and the clients are not asked again (both engines use this).
    """

    def __init__(self) -> None:
        self.model: list[np.ndarray] | None = None
        self.key: Any = None
        self.pool: Any = None

    def get(self, weights: list[np.ndarray], ask: Callable[[], Any], key: Any = None) -> Any:
        """Return the cached pool if ``weights`` (and ``key``) are unchanged, else ``ask()``.

        Parameters
        ----------
        weights : list of numpy.ndarray
            The current model.
        ask : callable
            Asks the clients; its result is cached with a copy of ``weights``.
        key : any, optional
            Something else the answer depends on (e.g. the nodes asked), compared with ``==``.

        Returns
        -------
        any
            The pool.
        """
        if self.model is not None and self.key == key and same_model(self.model, weights):
            return self.pool
        self.pool = ask()
        self.model = [np.array(w, copy=True) for w in weights]
        self.key = key
        return self.pool


def round_row(server_round: int, pool_size: int, sampled: int) -> dict[str, Any]:
    """Return the start of a round's row: ``server-round``, ``pool-size``, ``sampled``."""
    return {"server-round": server_round, "pool-size": int(pool_size), "sampled": int(sampled)}


def outcome_row(outcome: TrainOutcome) -> dict[str, Any]:
    """Return what a round's row records of its train replies (both engines).

    ``users``, ``bad-replies``, ``q-mean``, ``train-loss`` (None if no client trained) and
    the transport's extras (``outcome.info``).
    """
    if outcome.q_sum is not None:  # sums only (SecAgg); no loss under DP
        users = max(outcome.users, 1)
        loss = outcome.loss_sum
        return {
            "users": outcome.users,
            "bad-replies": outcome.bad_replies,
            "q-mean": outcome.q_sum / users if outcome.users else 0.0,
            "train-loss": loss / users if outcome.users and loss is not None else None,
            **outcome.info,
        }
    return {
        "users": outcome.users,
        "bad-replies": outcome.bad_replies,
        "q-mean": float(np.mean(outcome.q)) if outcome.q else 0.0,
        "train-loss": float(np.mean(outcome.losses)) if outcome.losses else None,
        **outcome.info,
    }


def evaluates_at(server_round: int, num_rounds: int, eval_every: int) -> bool:
    """Whether all clients are evaluated after round ``server_round`` (0, every k-th, T)."""
    return server_round == 0 or server_round % eval_every == 0 or server_round == num_rounds
