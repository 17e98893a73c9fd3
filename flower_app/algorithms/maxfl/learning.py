"""A client's round of MaxFL and its baselines: the rule per algorithm, solo models, tuning.

No Flower import: the NumPyClient (:mod:`flower_app.clients.learning`) calls these for the
Flower engine, and the direct engine calls the same client in-process.

Each algorithm's client round is a :class:`LocalRule` (:data:`LOCAL_RULES` by name):
how many steps, which local steps (from :mod:`~flower_app.algorithms.maxfl.local_steps`),
what the client sends; :func:`train_user` runs the rule on a :class:`ClientRequest`.

Randomness: client k's draws in round t (mini-batches and dropout masks) come from
``numpy.random.default_rng([seed, t, k, purpose])`` and nothing else; the solo model of
the warm-up uses round 0, purpose :data:`SOLO`. Torch runs on one thread inside these
functions, so results do not depend on the process's thread count.

Choices where the paper is silent (also in the README):

* a mini-batch is b examples drawn without replacement anew at every step (all examples if
  the client has fewer than b);
* the solo model ŵ_k starts from the same initial model w⁽⁰⁾ as federated training
  (``init_weights(seed)``) and runs ``solo_steps`` (100) local SGD steps with the same
  learning rate and batch size;
* ``requirement="train"``: ρ_k = F_k(ŵ_k) and the gaps F_k(w) − ρ_k (for q_k and for
  opting in) use the client's training split (Section 3); ``"heldout"``: both use the
  client's held-out split, i.e. the estimate of the true loss f_k of Definition 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from flower_app.algorithms.common.streams import user_rng
from flower_app.algorithms.common.threads import single_thread
from flower_app.algorithms.maxfl.baselines import mwfed_local_steps, qffl_delta_h
from flower_app.algorithms.maxfl.core import aggregation_weight
from flower_app.algorithms.maxfl.local_steps import (
    evaluate,
    local_sgd,
    local_sgd_batched,
    make_model,
    perfedavg_steps,
    pfedme_steps,
)
from flower_app.datasets.federated import ClientData
from flower_app.models.mlp import MLP

__all__ = [
    "ALGORITHMS",
    "LOCAL_RULES",
    "SOLO",
    "TRAIN",
    "TUNE",
    "ClientRequest",
    "LocalConfig",
    "LocalRule",
    "SoloResult",
    "UserResult",
    "solo_requirement",
    "solo_requirements",
    "train_user",
    "train_users",
    "tuned_eval",
]

TRAIN, SOLO, TUNE, BYZANTINE = 0, 1, 2, 3
ALGORITHMS = ("maxfl", "fedavg", "fedprox", "qffl", "scaffold", "mwfed", "perfedavg", "pfedme")
REQUIREMENTS = ("train", "heldout")


@dataclass(frozen=True)
class LocalConfig:
    """Hyperparameters of the clients' computation.

    Attributes
    ----------
    lr : float
        Local learning rate η_l.
    batch_size : int
        Mini-batch size b.
    local_steps : int
        Local SGD steps τ per round.
    dropout : float
        Dropout rate of the MLP.
    solo_steps : int
        SGD steps of the solo model ŵ_k that defines ρ_k.
    tune_steps : int
        Local steps of the locally-tuned evaluation (Table 3: 5).
    requirement : str
        ``"train"`` or ``"heldout"``: the split of ρ_k and of the gaps.
    prox_mu : float
        FedProx μ.
    qffl_q : float
        q of q-FFL.
    byzantine_loss : float
        What a Byzantine client adds to its reported loss.
    byzantine_noise : float
        Standard deviation of the Gaussian noise a Byzantine client adds to Δw.
    perfedavg_alpha : float
        Per-FedAvg's inner (adaptation) step size α; the outer step that moves w uses
        ``lr`` (β).
    pfedme_lambda : float
        pFedMe's regularisation λ between the personalised model θ and the local model.
    pfedme_k : int
        pFedMe's inner steps K that approximate θ per local step.
    pfedme_lr : float
        pFedMe's personal learning rate (the inner steps on θ).
    batched : bool
        Train the local-SGD clients of one request together
        (:func:`~.local_steps.local_sgd_batched`): the same draws as one by one, the same
        models up to float rounding.
    """

    lr: float = 0.05
    batch_size: int = 64
    local_steps: int = 10
    dropout: float = 0.2
    solo_steps: int = 100
    tune_steps: int = 5
    requirement: str = "train"
    prox_mu: float = 0.01
    qffl_q: float = 1.0
    byzantine_loss: float = 10.0
    byzantine_noise: float = 0.1
    perfedavg_alpha: float = 0.01
    pfedme_lambda: float = 15.0
    pfedme_k: int = 5
    pfedme_lr: float = 0.01
    batched: bool = False

    def __post_init__(self) -> None:
        if self.requirement not in REQUIREMENTS:
            raise ValueError(f"requirement must be one of {REQUIREMENTS}")
        if self.lr <= 0 or self.batch_size < 1 or self.local_steps < 1:
            raise ValueError("lr must be > 0, batch_size and local_steps >= 1")
        if self.solo_steps < 0 or self.tune_steps < 0:
            raise ValueError("solo_steps and tune_steps must be >= 0")
        if self.perfedavg_alpha <= 0 or self.pfedme_lambda <= 0 or self.pfedme_lr <= 0:
            raise ValueError("perfedavg_alpha, pfedme_lambda and pfedme_lr must be > 0")
        if self.pfedme_k < 1:
            raise ValueError("pfedme_k must be >= 1")


@dataclass(frozen=True)
class SoloResult:
    """What a client keeps from its solo model ŵ_k.

    Attributes
    ----------
    rho_train : float
        F_k(ŵ_k) on the training split.
    rho_heldout : float
        Loss of ŵ_k on the held-out split (estimate of f_k(ŵ_k)).
    acc_heldout : float
        Held-out accuracy of ŵ_k (for the preferred-model accuracy).
    """

    rho_train: float
    rho_heldout: float
    acc_heldout: float

    @classmethod
    def measure(cls, model: MLP, data: ClientData) -> SoloResult:
        """Return the losses of the trained solo ``model`` on both splits, and its accuracy."""
        rho_train, _ = evaluate(model, data.x_train, data.y_train)
        rho_heldout, acc = evaluate(model, data.x_test, data.y_test)
        return cls(rho_train, rho_heldout, acc)

    def rho(self, requirement: str) -> float:
        """Return ρ_k for ``requirement`` (``"train"`` or ``"heldout"``)."""
        return self.rho_train if requirement == "train" else self.rho_heldout

    def to_list(self) -> list[float]:
        """Return ``[rho_train, rho_heldout, acc_heldout]``."""
        return [self.rho_train, self.rho_heldout, self.acc_heldout]


def _sgd_from(
    weights: Sequence[np.ndarray],
    data: ClientData,
    n_classes: int,
    cfg: LocalConfig,
    steps: int,
    rng: np.random.Generator,
) -> MLP:
    """Return a model from ``weights`` after ``steps`` local SGD steps (inside single_thread)."""
    model = make_model(weights, n_classes, cfg.dropout)
    local_sgd(model, data.x_train, data.y_train, steps, cfg.lr, cfg.batch_size, rng)
    return model


def solo_requirement(
    init: Sequence[np.ndarray],
    data: ClientData,
    n_classes: int,
    cfg: LocalConfig,
    seed: int,
    user: int,
) -> SoloResult:
    """Train client ``user``'s solo model ŵ_k and return its losses (ρ_k) and accuracy.

    Parameters
    ----------
    init : sequence of numpy.ndarray
        w⁽⁰⁾, the initial global model.
    data : ClientData
        The client's data.
    n_classes : int
        Number of classes.
    cfg : LocalConfig
        ``solo_steps``, ``lr``, ``batch_size``, ``dropout``.
    seed : int
        Run seed.
    user : int
        Client id.

    Returns
    -------
    SoloResult
        ρ on both splits and the held-out accuracy.
    """
    with single_thread():
        model = _sgd_from(init, data, n_classes, cfg, cfg.solo_steps, user_rng(seed, 0, user, SOLO))
        return SoloResult.measure(model, data)


def solo_requirements(
    init: Sequence[np.ndarray],
    data: Sequence[ClientData],
    n_classes: int,
    cfg: LocalConfig,
    seed: int,
    users: Sequence[int],
) -> list[SoloResult]:
    """Return :func:`solo_requirement` of several clients, their solo models trained together.

    The solo models are trained by :func:`~.local_steps.local_sgd_batched` (each client with
    its own stream, as :func:`solo_requirement` draws it), so the results equal one-by-one
    training up to float32 rounding.
    """
    with single_thread():
        models = [make_model(init, n_classes, cfg.dropout) for _ in users]
        local_sgd_batched(
            models, [(d.x_train, d.y_train) for d in data], cfg.solo_steps, cfg.lr,
            cfg.batch_size, [user_rng(seed, 0, u, SOLO) for u in users],
        )  # fmt: skip
        return [SoloResult.measure(model, d) for model, d in zip(models, data, strict=True)]


@dataclass
class UserResult:
    """One client's contribution to a round.

    Attributes
    ----------
    loss : float
        F_k(w) at the received model on the requirement split (as reported).
    train_loss : float
        F_k(w) on the training split (q-FFL uses it).
    q : float
        MaxFL aggregation weight (0 for other algorithms).
    h : float
        q-FFL h_k (0 for other algorithms).
    met : bool
        Whether F_k(w) < ρ_k at the received model, on the requirement split and with the
        loss as reported (MW-Fed; False for other algorithms).
    local_steps : int
        Local SGD steps run (τ, or MW-Fed's τ_k).
    arrays : list of numpy.ndarray
        float64 arrays this client adds to the node's sum: q_k Δw_k (MaxFL), Δw_k
        (FedAvg, FedProx), Δ_k (q-FFL), Δw_k then Δc_k (SCAFFOLD), s_k Δw_k (MW-Fed).
    new_control : list of numpy.ndarray, optional
        SCAFFOLD: the client's new control variate c_k⁺.
    """

    loss: float
    train_loss: float
    q: float = 0.0
    h: float = 0.0
    met: bool = False
    local_steps: int = 0
    arrays: list[np.ndarray] = field(default_factory=list)
    new_control: list[np.ndarray] | None = None


@dataclass(frozen=True)
class ClientRequest:
    """One client's round as asked: the arguments of :func:`train_user` (see there)."""

    algorithm: str
    weights: Sequence[np.ndarray]
    data: ClientData
    n_classes: int
    cfg: LocalConfig
    seed: int
    server_round: int
    user: int
    solo: SoloResult | None
    byzantine: bool = False
    control: Sequence[np.ndarray] | None = None
    client_control: Sequence[np.ndarray] | None = None
    mw_share: float = 1.0


@dataclass
class ClientJob:
    """One client's round between its losses (before training) and its reply."""

    request: ClientRequest
    rule: LocalRule
    model: MLP
    steps: int
    rng: np.random.Generator
    correction: list[torch.Tensor] | None
    loss: float
    train_loss: float


class LocalRule:
    """One client's round of an algorithm (base: FedAvg's τ local SGD steps, sends Δw_k).

    Subclasses override what their algorithm changes; :data:`LOCAL_RULES` maps each name of
    :data:`ALGORITHMS` to its rule and :func:`train_user` runs it.
    """

    #: the client needs its requirement ρ_k (a :class:`SoloResult`)
    needs_rho: bool = False

    def steps(self, request: ClientRequest) -> int:
        """Return the local steps of this round (τ)."""
        return request.cfg.local_steps

    def correction(self, request: ClientRequest) -> list[torch.Tensor] | None:
        """Return the gradient correction of the local steps (SCAFFOLD's c − c_k)."""
        return None

    def run(self, job: ClientJob) -> None:
        """Run the local steps on ``job.model`` in place (local SGD)."""
        data, cfg = job.request.data, job.request.cfg
        local_sgd(
            job.model, data.x_train, data.y_train, job.steps, cfg.lr, cfg.batch_size, job.rng,
            prox_mu=self.prox_mu(cfg), correction=job.correction,
        )  # fmt: skip

    def prox_mu(self, cfg: LocalConfig) -> float:
        """Return the proximal weight μ of the local objective (0: none)."""
        return 0.0

    def finish(self, result: UserResult, delta: list[np.ndarray], request: ClientRequest) -> None:
        """Fill ``result.arrays`` (and the rule's extras) from Δw_k = w − w_k."""
        result.arrays = delta


class FedProxRule(LocalRule):
    """FedProx: local SGD on F_k(w') + μ/2 ‖w' − w‖²."""

    def prox_mu(self, cfg: LocalConfig) -> float:
        """Return μ (``maxfl-prox-mu``)."""
        return cfg.prox_mu


class PerFedAvgRule(LocalRule):
    """Per-FedAvg (first-order MAML) local steps."""

    def run(self, job: ClientJob) -> None:
        """Run Per-FedAvg's steps."""
        data, cfg = job.request.data, job.request.cfg
        perfedavg_steps(
            job.model, data.x_train, data.y_train, job.steps, cfg.perfedavg_alpha, cfg.lr,
            cfg.batch_size, job.rng,
        )  # fmt: skip


class PFedMeRule(LocalRule):
    """PFedMe's local steps (Moreau envelopes)."""

    def run(self, job: ClientJob) -> None:
        """Run pFedMe's steps."""
        data, cfg = job.request.data, job.request.cfg
        pfedme_steps(
            job.model, data.x_train, data.y_train, job.steps, cfg.lr, cfg.pfedme_lambda,
            cfg.pfedme_k, cfg.pfedme_lr, cfg.batch_size, job.rng,
        )  # fmt: skip


class MaxFLLocalRule(LocalRule):
    """MaxFL: sends q_k Δw_k with q_k = σ'(F_k(w) − ρ_k)."""

    needs_rho = True

    def finish(self, result: UserResult, delta: list[np.ndarray], request: ClientRequest) -> None:
        """Weight Δw_k by q_k."""
        assert request.solo is not None
        rho = request.solo.rho(request.cfg.requirement)
        result.q = float(aggregation_weight(result.loss, rho))
        result.arrays = [result.q * d for d in delta]


class QFFLLocalRule(LocalRule):
    """Q-FFL: sends Δ_k and h_k (Li et al. 2020)."""

    def finish(self, result: UserResult, delta: list[np.ndarray], request: ClientRequest) -> None:
        """Compute Δ_k and h_k from Δw_k and the training loss."""
        cfg = request.cfg
        delta_k, h = qffl_delta_h(delta, result.train_loss, cfg.qffl_q, 1.0 / cfg.lr)
        result.arrays, result.h = delta_k, h


class ScaffoldLocalRule(LocalRule):
    """SCAFFOLD (option II): corrected local steps, sends Δw_k then Δc_k."""

    @staticmethod
    def _client_control(request: ClientRequest) -> Sequence[np.ndarray]:
        """Return c_k (zeros the first time)."""
        assert request.control is not None
        if request.client_control is not None:
            return request.client_control
        return [np.zeros_like(c) for c in request.control]

    def correction(self, request: ClientRequest) -> list[torch.Tensor]:
        """Return c − c_k (c_k = 0 the first time)."""
        if request.control is None:
            raise ValueError("SCAFFOLD needs the server control variate")
        return [
            torch.from_numpy(np.asarray(c, np.float32) - np.asarray(k, np.float32))
            for c, k in zip(request.control, self._client_control(request), strict=True)
        ]

    def finish(self, result: UserResult, delta: list[np.ndarray], request: ClientRequest) -> None:
        """c_k⁺ = c_k − c + (w − w_k)/(τ η_l); send Δw_k then Δc_k = c_k − c_k⁺."""
        control, ck = request.control, self._client_control(request)
        assert control is not None
        scale = 1.0 / (request.cfg.local_steps * request.cfg.lr)
        new_ck = [
            np.asarray(k, np.float64) - np.asarray(c, np.float64) + scale * d
            for k, c, d in zip(ck, control, delta, strict=True)
        ]
        dc = [np.asarray(k, np.float64) - n for k, n in zip(ck, new_ck, strict=True)]
        result.arrays = delta + dc
        result.new_control = [c.astype(np.float32) for c in new_ck]


class MWFedLocalRule(LocalRule):
    """MW-Fed: τ_k steps from the relative weight s_k, sends s_k Δw_k and the met flag."""

    needs_rho = True

    def steps(self, request: ClientRequest) -> int:
        """Return τ_k = max(1, ⌊τ s_k + 1/2⌋)."""
        return mwfed_local_steps(request.mw_share, request.cfg.local_steps)

    def finish(self, result: UserResult, delta: list[np.ndarray], request: ClientRequest) -> None:
        """Send s_k Δw_k; met = F_k(w) < ρ_k (with the loss as reported)."""
        assert request.solo is not None
        result.met = bool(result.loss < request.solo.rho(request.cfg.requirement))
        result.arrays = [float(request.mw_share) * d for d in delta]


#: algorithm name -> its client rule
LOCAL_RULES: dict[str, type[LocalRule]] = {
    "maxfl": MaxFLLocalRule,
    "fedavg": LocalRule,
    "fedprox": FedProxRule,
    "qffl": QFFLLocalRule,
    "scaffold": ScaffoldLocalRule,
    "mwfed": MWFedLocalRule,
    "perfedavg": PerFedAvgRule,
    "pfedme": PFedMeRule,
}


def train_user(
    algorithm: str,
    weights: Sequence[np.ndarray],
    data: ClientData,
    n_classes: int,
    cfg: LocalConfig,
    seed: int,
    server_round: int,
    user: int,
    solo: SoloResult | None,
    byzantine: bool = False,
    control: Sequence[np.ndarray] | None = None,
    client_control: Sequence[np.ndarray] | None = None,
    mw_share: float = 1.0,
) -> UserResult:
    """Run one client's round of ``algorithm`` from the global model ``weights``.

    Parameters
    ----------
    algorithm : str
        One of :data:`ALGORITHMS`.
    weights : sequence of numpy.ndarray
        The received global model w.
    data : ClientData
        The client's data.
    n_classes : int
        Number of classes.
    cfg : LocalConfig
        Hyperparameters.
    seed : int
        Run seed.
    server_round : int
        Round t (≥ 1).
    user : int
        Client id.
    solo : SoloResult or None
        The client's solo results (ρ_k); required by MaxFL and MW-Fed.
    byzantine : bool, optional
        Report a loss inflated by ``cfg.byzantine_loss`` and add Gaussian noise of standard
        deviation ``cfg.byzantine_noise`` to Δw (Table 4). The inflated loss is what MaxFL's
        q_k and MW-Fed's "met" flag are computed from (the attack: claim a large gap).
    control : sequence of numpy.ndarray, optional
        SCAFFOLD server control variate c.
    client_control : sequence of numpy.ndarray, optional
        SCAFFOLD client control variate c_k (zeros if None).
    mw_share : float, optional
        MW-Fed's relative weight s_k from the server (default 1): the client runs
        τ_k = max(1, ⌊τ s_k + 1/2⌋) steps and sends s_k Δw_k.

    Returns
    -------
    UserResult
        The client's loss, weight and arrays.
    """
    job = _prepare(
        ClientRequest(
            algorithm, weights, data, n_classes, cfg, seed, server_round, user, solo,
            byzantine, control, client_control, mw_share,
        )
    )  # fmt: skip
    with single_thread():
        job.rule.run(job)
    return _finish(job)


def _prepare(request: ClientRequest) -> ClientJob:
    """Check the request, build the client's model and compute its reported losses."""
    r = request
    if r.algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {r.algorithm!r} is not known; choose one of {ALGORITHMS}")
    rule = LOCAL_RULES[r.algorithm]()
    if rule.needs_rho and r.solo is None:
        raise ValueError(f"client {r.user}: ρ_k is missing (no solo model result)")
    steps = rule.steps(r)
    rng = user_rng(r.seed, r.server_round, r.user, TRAIN)
    with single_thread():
        model = make_model(r.weights, r.n_classes, r.cfg.dropout)
        train_loss, _ = evaluate(model, r.data.x_train, r.data.y_train)
        if r.cfg.requirement == "train":
            loss = train_loss
        else:
            loss, _ = evaluate(model, r.data.x_test, r.data.y_test)
    if r.byzantine:
        loss += r.cfg.byzantine_loss
        train_loss += r.cfg.byzantine_loss
    return ClientJob(
        r, rule, model, steps, rng, rule.correction(r), float(loss), float(train_loss)
    )


def _finish(job: ClientJob) -> UserResult:
    """Return the client's reply from its trained model."""
    r = job.request
    new = job.model.get_weights()
    delta = [
        np.asarray(w, np.float64) - np.asarray(v, np.float64)
        for w, v in zip(r.weights, new, strict=True)
    ]
    if r.byzantine:
        noise_rng = user_rng(r.seed, r.server_round, r.user, BYZANTINE)
        delta = [d + noise_rng.normal(0.0, r.cfg.byzantine_noise, size=d.shape) for d in delta]
    result = UserResult(loss=job.loss, train_loss=job.train_loss, local_steps=job.steps)
    job.rule.finish(result, delta, r)
    return result


def train_users(requests: Sequence[dict[str, Any]], batched: bool = False) -> list[UserResult]:
    """Run several clients' rounds (each request: the keyword arguments of :func:`train_user`).

    With ``batched`` false this is :func:`train_user` for each request, in order. With
    ``batched`` true, the clients whose rule trains by plain local SGD (FedAvg, FedProx,
    SCAFFOLD, q-FFL, MaxFL, MW-Fed) and whose local steps are equal are trained together by
    :func:`~.local_steps.local_sgd_batched` (same draws, same models up to float rounding);
    Per-FedAvg and pFedMe clients are trained one by one.

    Returns
    -------
    list of UserResult
        One result per request, in order.
    """
    if not batched:
        return [train_user(**r) for r in requests]
    jobs = [_prepare(ClientRequest(**r)) for r in requests]
    together: dict[tuple[type, int], list[ClientJob]] = {}
    with single_thread():
        for job in jobs:
            if type(job.rule).run is LocalRule.run:
                together.setdefault((type(job.rule), job.steps), []).append(job)
            else:
                job.rule.run(job)
        for group in together.values():
            cfg = group[0].request.cfg
            local_sgd_batched(
                [j.model for j in group],
                [(j.request.data.x_train, j.request.data.y_train) for j in group],
                group[0].steps, cfg.lr, cfg.batch_size, [j.rng for j in group],
                prox_mu=group[0].rule.prox_mu(cfg), corrections=[j.correction for j in group],
            )  # fmt: skip
    return [_finish(job) for job in jobs]


def tuned_eval(
    weights: Sequence[np.ndarray],
    data: ClientData,
    n_classes: int,
    cfg: LocalConfig,
    seed: int,
    server_round: int,
    user: int,
) -> tuple[float, float]:
    """Return held-out (loss, accuracy) after ``cfg.tune_steps`` local steps from ``weights``.

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        The global model.
    data : ClientData
        The client's data.
    n_classes : int
        Number of classes.
    cfg : LocalConfig
        ``tune_steps``, ``lr``, ``batch_size``, ``dropout``.
    seed : int
        Run seed.
    server_round : int
        The evaluated round (seeds the stream, purpose :data:`TUNE`).
    user : int
        Client id.

    Returns
    -------
    tuple of float
        Loss and accuracy of the locally-tuned model on the held-out split.
    """
    with single_thread():
        rng = user_rng(seed, server_round, user, TUNE)
        model = _sgd_from(weights, data, n_classes, cfg, cfg.tune_steps, rng)
        return evaluate(model, data.x_test, data.y_test)
