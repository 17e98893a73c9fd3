"""Client-side computations of MaxFL and its baselines: local SGD, losses, solo models.

No Flower import: the NumPyClient (:mod:`flower_app.clients.learning`) calls these for the
Flower engine, and the direct engine calls the same client in-process.

Each algorithm's client round is a :class:`LocalRule` (:data:`LOCAL_RULES` by name):
how many steps, which local steps, what the client sends; :func:`train_user` runs the rule.

Randomness: client k's draws in round t (mini-batches and dropout masks) come from
``numpy.random.default_rng([seed, t, k, purpose])`` (DESIGN principle 4); the solo model of
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
from torch.nn import functional as F  # noqa: N812

from flower_app.algorithms.common.streams import user_rng
from flower_app.algorithms.common.threads import single_thread
from flower_app.algorithms.maxfl.baselines import mwfed_local_steps, qffl_delta_h
from flower_app.algorithms.maxfl.core import aggregation_weight
from flower_app.datasets.federated import ClientData
from flower_app.models.mlp import MLP, layer_sizes

__all__ = [
    "ALGORITHMS",
    "LOCAL_RULES",
    "SOLO",
    "TRAIN",
    "TUNE",
    "LocalConfig",
    "LocalRule",
    "SoloResult",
    "UserResult",
    "evaluate",
    "local_sgd",
    "make_model",
    "perfedavg_steps",
    "pfedme_steps",
    "solo_requirement",
    "train_user",
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
        Train the local-SGD clients of one request together (:func:`local_sgd_batched`):
        the same draws as one by one, the same models up to float rounding.
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


def make_model(weights: Sequence[np.ndarray], n_classes: int, dropout: float) -> MLP:
    """Return an :class:`MLP` holding ``weights`` (its layer sizes are read from them).

    Raises
    ------
    ValueError
        If the weights' output size is not ``n_classes`` or their shapes do not chain.
    """
    n_in, hidden, n_out = layer_sizes(weights)
    if n_out != n_classes:
        raise ValueError(f"the model has {n_out} outputs; the data has {n_classes} classes")
    model = MLP(n_in=n_in, n_classes=n_classes, hidden=hidden, dropout=dropout)
    model.set_weights(weights)
    return model


def evaluate(model: MLP, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Return (mean cross-entropy, accuracy) of ``model`` on (x, y), without dropout.

    Parameters
    ----------
    model : MLP
        The model.
    x : numpy.ndarray
        float32 (n, 784) inputs.
    y : numpy.ndarray
        int64 (n,) labels.

    Returns
    -------
    tuple of float
        Loss and accuracy (both 0.0 for no examples is an error).
    """
    if len(y) == 0:
        raise ValueError("cannot evaluate on zero examples")
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        target = torch.from_numpy(y)
        loss = F.cross_entropy(logits, target, reduction="sum").item() / len(y)
        acc = (logits.argmax(dim=1) == target).double().mean().item()
    return float(loss), float(acc)


class _LocalData:
    """A client's training data for local steps on ``model`` (put in training mode).

    The first draw of ``rng`` seeds the dropout generator; every mini-batch after it comes
    from ``rng`` too (min(b, n) examples without replacement), in the order the steps ask.
    """

    def __init__(
        self, model: MLP, x: np.ndarray, y: np.ndarray, batch_size: int, rng: np.random.Generator
    ) -> None:
        self.gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        self.model, self.params = model, list(model.parameters())
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.batch_size, self.rng = batch_size, rng
        model.train()

    def batch(self) -> torch.Tensor:
        """Draw the next mini-batch's example indices."""
        n = len(self.y)
        return torch.from_numpy(self.rng.choice(n, size=min(self.batch_size, n), replace=False))

    def loss(self, idx: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the model on examples ``idx`` (dropout on)."""
        return F.cross_entropy(self.model(self.x[idx], generator=self.gen), self.y[idx])

    def grads(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Gradient of :meth:`loss` with respect to the model's parameters."""
        return torch.autograd.grad(self.loss(idx), self.params)


def local_sgd(
    model: MLP,
    x: np.ndarray,
    y: np.ndarray,
    steps: int,
    lr: float,
    batch_size: int,
    rng: np.random.Generator,
    prox_mu: float = 0.0,
    correction: Sequence[torch.Tensor] | None = None,
) -> None:
    """Run ``steps`` mini-batch SGD steps on ``model`` in place.

    Parameters
    ----------
    model : MLP
        Trained in place.
    x, y : numpy.ndarray
        The client's training data.
    steps : int
        Number of steps.
    lr : float
        Learning rate.
    batch_size : int
        b; min(b, n) examples without replacement each step.
    rng : numpy.random.Generator
        Draws the batches and seeds the dropout generator.
    prox_mu : float, optional
        FedProx: adds (μ/2)‖w − w_start‖² to the loss.
    correction : sequence of torch.Tensor, optional
        SCAFFOLD: added to every gradient (c − c_k).
    """
    data = _LocalData(model, x, y, batch_size, rng)
    params = data.params
    anchor = [p.detach().clone() for p in params] if prox_mu > 0 else None
    for _ in range(steps):
        loss = data.loss(data.batch())
        if anchor is not None:
            loss = loss + 0.5 * prox_mu * sum(
                torch.sum((p - a) ** 2) for p, a in zip(params, anchor, strict=True)
            )
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                if correction is not None:
                    g = g + correction[i]
                p.sub_(lr * g)


def local_sgd_batched(
    models: Sequence[MLP],
    data: Sequence[tuple[np.ndarray, np.ndarray]],
    steps: int,
    lr: float,
    batch_size: int,
    rngs: Sequence[np.random.Generator],
    prox_mu: float = 0.0,
    corrections: Sequence[Sequence[torch.Tensor] | None] | None = None,
) -> None:
    """Run :func:`local_sgd` on several clients' models at once, each in place.

    Each client keeps its own stream: its dropout generator is seeded and its mini-batches
    are drawn exactly as :func:`local_sgd` draws them, so every client sees the same batches
    and dropout masks as when trained alone. The clients whose mini-batch has the same size
    (min(b, n_k)) are stacked and stepped together: one batched forward pass
    (``torch.baddbmm`` over the stacked weights) and one backward pass of the sum of the
    clients' losses, whose gradient with respect to client k's weights is client k's own.
    The arithmetic is the same; only the order of the floating-point sums inside the matrix
    products may differ, so the models agree with one-by-one training to float32 rounding
    (``tests/test_maxfl_batched.py`` bounds the difference), not bit for bit.

    Parameters
    ----------
    models : sequence of MLP
        Trained in place (all with the same architecture and dropout).
    data : sequence of (x, y)
        Each client's training data.
    steps : int
        Local steps (the same for every client).
    lr : float
        Learning rate.
    batch_size : int
        b; each client uses min(b, n_k) examples without replacement per step.
    rngs : sequence of numpy.random.Generator
        Each client's stream (as for :func:`local_sgd`).
    prox_mu : float, optional
        FedProx μ (the anchor of each client is its own starting model).
    corrections : sequence of (sequence of torch.Tensor or None), optional
        SCAFFOLD: each client's correction added to every gradient.
    """
    if not (len(models) == len(data) == len(rngs)):
        raise ValueError("local_sgd_batched needs one (x, y) and one rng per model")
    items = [
        _LocalData(m, x, y, batch_size, r) for m, (x, y), r in zip(models, data, rngs, strict=True)
    ]
    corr = list(corrections) if corrections is not None else [None] * len(items)
    groups: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(min(batch_size, len(item.y)), []).append(i)
    for members in groups.values():
        _sgd_group([items[i] for i in members], [corr[i] for i in members], steps, lr, prox_mu)


def _sgd_group(
    items: list[_LocalData],
    corrections: list[Sequence[torch.Tensor] | None],
    steps: int,
    lr: float,
    prox_mu: float,
) -> None:
    """Step clients with equal mini-batch sizes together (see :func:`local_sgd_batched`)."""
    model = items[0].model
    n_layers, p = len(model.layers), model.dropout
    stacked = [
        torch.stack([it.params[j].detach() for it in items]).clone().requires_grad_(True)
        for j in range(2 * n_layers)
    ]
    anchor = [t.detach().clone() for t in stacked] if prox_mu > 0 else None
    corr = None
    if any(c is not None for c in corrections):
        corr = [
            torch.stack(
                [torch.zeros_like(items[0].params[j]) if c is None else c[j] for c in corrections]
            )
            for j in range(2 * n_layers)
        ]
    for _ in range(steps):
        idx = [it.batch() for it in items]
        h = torch.stack([it.x[i] for it, i in zip(items, idx, strict=True)])
        y = torch.stack([it.y[i] for it, i in zip(items, idx, strict=True)])
        for layer in range(n_layers):
            weight, bias = stacked[2 * layer], stacked[2 * layer + 1]
            h = torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))
            if layer == n_layers - 1:
                break
            h = F.relu(h)
            if layer == 0 and p > 0:
                keep = torch.stack([torch.rand(h.shape[1:], generator=it.gen) for it in items]) >= p
                h = h * keep / (1.0 - p)
        k, b, c = h.shape
        loss = F.cross_entropy(h.reshape(k * b, c), y.reshape(k * b), reduction="none")
        loss = loss.view(k, b).mean(dim=1).sum()
        if anchor is not None:
            loss = loss + 0.5 * prox_mu * sum(
                torch.sum((t - a) ** 2) for t, a in zip(stacked, anchor, strict=True)
            )
        grads = torch.autograd.grad(loss, stacked)
        with torch.no_grad():
            for j, (t, g) in enumerate(zip(stacked, grads, strict=True)):
                if corr is not None:
                    g = g + corr[j]
                t.sub_(lr * g)
    with torch.no_grad():
        for n, it in enumerate(items):
            for j, param in enumerate(it.params):
                param.copy_(stacked[j][n])


def perfedavg_steps(
    model: MLP,
    x: np.ndarray,
    y: np.ndarray,
    steps: int,
    alpha: float,
    beta: float,
    batch_size: int,
    rng: np.random.Generator,
) -> None:
    """Run ``steps`` first-order Per-FedAvg steps on ``model`` in place.

    Per-FedAvg (FO) (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020, Algorithm 1 with the
    first-order approximation): with two independent mini-batches D and D′,

        w̃ = w − α ∇f(w; D),    w ← w − β ∇f(w̃; D′).

    The server averages the resulting models (FedAvg). The MaxFL paper evaluates the global
    model as it is (Table 1) and after 5 local steps (Table 3), like every baseline.

    Which step size is the grid's learning rate is a choice (the MaxFL paper does not say):
    here β = ``maxfl-lr``, the step that moves w, so the shared η_l grid means the same
    thing for Per-FedAvg as for FedAvg's SGD, and α = ``maxfl-perfedavg-alpha`` (default
    0.01) is the personalisation step. Common implementations (e.g. FL-bench) instead use
    the local learning rate for α and a fixed β = 10⁻³; ``maxfl-lr=0.001
    maxfl-perfedavg-alpha=<η_l>`` gives that reading.

    Parameters
    ----------
    model : MLP
        Trained in place.
    x, y : numpy.ndarray
        The client's training data.
    steps : int
        Number of meta steps (each uses two mini-batches).
    alpha : float
        α, the inner (adaptation) step size (``maxfl-perfedavg-alpha``).
    beta : float
        β, the outer (meta) step size (``maxfl-lr``).
    batch_size : int
        b, for each of the two mini-batches.
    rng : numpy.random.Generator
        Draws the batches and seeds the dropout generator.
    """
    data = _LocalData(model, x, y, batch_size, rng)
    for _ in range(steps):
        start = [p.detach().clone() for p in data.params]
        grads = data.grads(data.batch())  # at w, batch D
        with torch.no_grad():
            for p, g in zip(data.params, grads, strict=True):
                p.sub_(alpha * g)
        grads = data.grads(data.batch())  # at w̃, batch D′
        with torch.no_grad():
            for p, w, g in zip(data.params, start, grads, strict=True):
                p.copy_(w - beta * g)


def pfedme_steps(
    model: MLP,
    x: np.ndarray,
    y: np.ndarray,
    steps: int,
    lr: float,
    lam: float,
    k: int,
    personal_lr: float,
    batch_size: int,
    rng: np.random.Generator,
) -> None:
    """Run ``steps`` pFedMe local steps; leave the local model w in ``model``.

    pFedMe (Dinh, Tran & Nguyen, NeurIPS 2020, Algorithm 1): the client keeps a local model
    w (from the global model) and a personalised model θ (from w). Each local step draws a
    mini-batch D, approximates θ = argmin f(θ; D) + (λ/2)‖θ − w‖² by K gradient steps

        θ ← θ − personal_lr · (∇f(θ; D) + λ (θ − w)),

    then moves w ← w − η λ (w − θ). θ carries over between local steps, as in the
    authors' code. The server step w ← (1 − β) w + β · mean_k w_k is FedAvg with server
    learning rate β (``maxfl-server-lr``, default 1).

    Parameters
    ----------
    model : MLP
        In: the received model; out: the local model w after ``steps`` steps.
    x, y : numpy.ndarray
        The client's training data.
    steps : int
        Local steps R (``maxfl-local-steps``).
    lr : float
        η, the local model's step size (``maxfl-lr``).
    lam : float
        λ (``maxfl-pfedme-lambda``).
    k : int
        K inner steps (``maxfl-pfedme-k``).
    personal_lr : float
        The inner steps' size (``maxfl-pfedme-lr``).
    batch_size : int
        b.
    rng : numpy.random.Generator
        Draws the batches and seeds the dropout generator.
    """
    data = _LocalData(model, x, y, batch_size, rng)
    theta = data.params
    local = [p.detach().clone() for p in theta]
    for _ in range(steps):
        idx = data.batch()
        for _ in range(k):
            grads = data.grads(idx)
            with torch.no_grad():
                for p, w, g in zip(theta, local, grads, strict=True):
                    p.sub_(personal_lr * (g + lam * (p - w)))
        with torch.no_grad():
            for p, w in zip(theta, local, strict=True):
                w.sub_(lr * lam * (w - p))
    with torch.no_grad():
        for p, w in zip(theta, local, strict=True):
            p.copy_(w)


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

    def rho(self, requirement: str) -> float:
        """Return ρ_k for ``requirement`` (``"train"`` or ``"heldout"``)."""
        return self.rho_train if requirement == "train" else self.rho_heldout

    def to_list(self) -> list[float]:
        """Return ``[rho_train, rho_heldout, acc_heldout]``."""
        return [self.rho_train, self.rho_heldout, self.acc_heldout]


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
        model = make_model(init, n_classes, cfg.dropout)
        local_sgd(
            model,
            data.x_train,
            data.y_train,
            cfg.solo_steps,
            cfg.lr,
            cfg.batch_size,
            user_rng(seed, 0, user, SOLO),
        )
        rho_train, _ = evaluate(model, data.x_train, data.y_train)
        rho_heldout, acc = evaluate(model, data.x_test, data.y_test)
    return SoloResult(rho_train, rho_heldout, acc)


def solo_requirements(
    init: Sequence[np.ndarray],
    data: Sequence[ClientData],
    n_classes: int,
    cfg: LocalConfig,
    seed: int,
    users: Sequence[int],
) -> list[SoloResult]:
    """Return :func:`solo_requirement` of several clients, their solo models trained together.

    The solo models are trained by :func:`local_sgd_batched` (each client with its own
    stream, as :func:`solo_requirement` draws it), so the results equal one-by-one training
    up to float32 rounding.
    """
    with single_thread():
        models = [make_model(init, n_classes, cfg.dropout) for _ in users]
        local_sgd_batched(
            models, [(d.x_train, d.y_train) for d in data], cfg.solo_steps, cfg.lr,
            cfg.batch_size, [user_rng(seed, 0, u, SOLO) for u in users],
        )  # fmt: skip
        out = []
        for model, d in zip(models, data, strict=True):
            rho_train, _ = evaluate(model, d.x_train, d.y_train)
            rho_heldout, acc = evaluate(model, d.x_test, d.y_test)
            out.append(SoloResult(rho_train, rho_heldout, acc))
    return out


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


class LocalRule:
    """One client's round of an algorithm (base: FedAvg's τ local SGD steps, sends Δw_k).

    Subclasses override what their algorithm changes; :data:`LOCAL_RULES` maps each name of
    :data:`ALGORITHMS` to its rule and :func:`train_user` runs it.
    """

    #: the client needs its requirement ρ_k (a :class:`SoloResult`)
    needs_rho: bool = False

    def steps(self, cfg: LocalConfig, mw_share: float) -> int:
        """Return the local steps of this round (τ)."""
        return cfg.local_steps

    def correction(
        self,
        control: Sequence[np.ndarray] | None,
        client_control: Sequence[np.ndarray] | None,
    ) -> list[torch.Tensor] | None:
        """Return the gradient correction of the local steps (SCAFFOLD's c − c_k)."""
        return None

    def run(
        self,
        model: MLP,
        data: ClientData,
        steps: int,
        cfg: LocalConfig,
        rng: np.random.Generator,
        correction: list[torch.Tensor] | None,
    ) -> None:
        """Run the local steps on ``model`` in place (local SGD)."""
        local_sgd(
            model, data.x_train, data.y_train, steps, cfg.lr, cfg.batch_size, rng,
            prox_mu=self.prox_mu(cfg), correction=correction,
        )  # fmt: skip

    def prox_mu(self, cfg: LocalConfig) -> float:
        """Return the proximal weight μ of the local objective (0: none)."""
        return 0.0

    def finish(
        self,
        result: UserResult,
        delta: list[np.ndarray],
        cfg: LocalConfig,
        solo: SoloResult | None,
        mw_share: float,
        control: Sequence[np.ndarray] | None,
        client_control: Sequence[np.ndarray] | None,
    ) -> None:
        """Fill ``result.arrays`` (and the rule's extras) from Δw_k = w − w_k."""
        result.arrays = delta


class FedProxRule(LocalRule):
    """FedProx: local SGD on F_k(w') + μ/2 ‖w' − w‖²."""

    def prox_mu(self, cfg: LocalConfig) -> float:
        """Return μ (``maxfl-prox-mu``)."""
        return cfg.prox_mu


class PerFedAvgRule(LocalRule):
    """Per-FedAvg (first-order MAML) local steps."""

    def run(
        self,
        model: MLP,
        data: ClientData,
        steps: int,
        cfg: LocalConfig,
        rng: np.random.Generator,
        correction: list[torch.Tensor] | None,
    ) -> None:
        """Run Per-FedAvg's steps."""
        perfedavg_steps(
            model, data.x_train, data.y_train, steps, cfg.perfedavg_alpha, cfg.lr,
            cfg.batch_size, rng,
        )  # fmt: skip


class PFedMeRule(LocalRule):
    """PFedMe's local steps (Moreau envelopes)."""

    def run(
        self,
        model: MLP,
        data: ClientData,
        steps: int,
        cfg: LocalConfig,
        rng: np.random.Generator,
        correction: list[torch.Tensor] | None,
    ) -> None:
        """Run pFedMe's steps."""
        pfedme_steps(
            model, data.x_train, data.y_train, steps, cfg.lr, cfg.pfedme_lambda,
            cfg.pfedme_k, cfg.pfedme_lr, cfg.batch_size, rng,
        )  # fmt: skip


class MaxFLLocalRule(LocalRule):
    """MaxFL: sends q_k Δw_k with q_k = σ'(F_k(w) − ρ_k)."""

    needs_rho = True

    def finish(
        self,
        result: UserResult,
        delta: list[np.ndarray],
        cfg: LocalConfig,
        solo: SoloResult | None,
        mw_share: float,
        control: Sequence[np.ndarray] | None,
        client_control: Sequence[np.ndarray] | None,
    ) -> None:
        """Weight Δw_k by q_k."""
        assert solo is not None
        result.q = float(aggregation_weight(result.loss, solo.rho(cfg.requirement)))
        result.arrays = [result.q * d for d in delta]


class QFFLLocalRule(LocalRule):
    """Q-FFL: sends Δ_k and h_k (Li et al. 2020)."""

    def finish(
        self,
        result: UserResult,
        delta: list[np.ndarray],
        cfg: LocalConfig,
        solo: SoloResult | None,
        mw_share: float,
        control: Sequence[np.ndarray] | None,
        client_control: Sequence[np.ndarray] | None,
    ) -> None:
        """Compute Δ_k and h_k from Δw_k and the training loss."""
        delta_k, h = qffl_delta_h(delta, result.train_loss, cfg.qffl_q, 1.0 / cfg.lr)
        result.arrays, result.h = delta_k, h


class ScaffoldLocalRule(LocalRule):
    """SCAFFOLD (option II): corrected local steps, sends Δw_k then Δc_k."""

    def correction(
        self,
        control: Sequence[np.ndarray] | None,
        client_control: Sequence[np.ndarray] | None,
    ) -> list[torch.Tensor]:
        """Return c − c_k (c_k = 0 the first time)."""
        if control is None:
            raise ValueError("SCAFFOLD needs the server control variate")
        ck = client_control if client_control is not None else [np.zeros_like(c) for c in control]
        return [
            torch.from_numpy(np.asarray(c, np.float32) - np.asarray(k, np.float32))
            for c, k in zip(control, ck, strict=True)
        ]

    def finish(
        self,
        result: UserResult,
        delta: list[np.ndarray],
        cfg: LocalConfig,
        solo: SoloResult | None,
        mw_share: float,
        control: Sequence[np.ndarray] | None,
        client_control: Sequence[np.ndarray] | None,
    ) -> None:
        """c_k⁺ = c_k − c + (w − w_k)/(τ η_l); send Δw_k then Δc_k = c_k − c_k⁺."""
        assert control is not None
        ck = client_control if client_control is not None else [np.zeros_like(c) for c in control]
        scale = 1.0 / (cfg.local_steps * cfg.lr)
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

    def steps(self, cfg: LocalConfig, mw_share: float) -> int:
        """Return τ_k = max(1, ⌊τ s_k + 1/2⌋)."""
        return mwfed_local_steps(mw_share, cfg.local_steps)

    def finish(
        self,
        result: UserResult,
        delta: list[np.ndarray],
        cfg: LocalConfig,
        solo: SoloResult | None,
        mw_share: float,
        control: Sequence[np.ndarray] | None,
        client_control: Sequence[np.ndarray] | None,
    ) -> None:
        """Send s_k Δw_k; met = F_k(w) < ρ_k (with the loss as reported)."""
        assert solo is not None
        result.met = bool(result.loss < solo.rho(cfg.requirement))
        result.arrays = [float(mw_share) * d for d in delta]


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
        algorithm, weights, data, n_classes, cfg, seed, server_round, user, solo, byzantine,
        control, client_control, mw_share,
    )  # fmt: skip
    with single_thread():
        job.rule.run(job.model, data, job.steps, cfg, job.rng, job.correction)
    return _finish(job)


@dataclass
class _UserJob:
    """One client's round between its losses (before training) and its reply."""

    rule: LocalRule
    model: MLP
    data: ClientData
    steps: int
    rng: np.random.Generator
    correction: list[torch.Tensor] | None
    weights: Sequence[np.ndarray]
    loss: float
    train_loss: float
    args: dict[str, Any]


def _prepare(
    algorithm: str,
    weights: Sequence[np.ndarray],
    data: ClientData,
    n_classes: int,
    cfg: LocalConfig,
    seed: int,
    server_round: int,
    user: int,
    solo: SoloResult | None,
    byzantine: bool,
    control: Sequence[np.ndarray] | None,
    client_control: Sequence[np.ndarray] | None,
    mw_share: float,
) -> _UserJob:
    """Check the request, build the client's model and compute its reported losses."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not known; choose one of {ALGORITHMS}")
    rule = LOCAL_RULES[algorithm]()
    if rule.needs_rho and solo is None:
        raise ValueError(f"client {user}: ρ_k is missing (no solo model result)")
    steps = rule.steps(cfg, mw_share)
    rng = user_rng(seed, server_round, user, TRAIN)
    with single_thread():
        model = make_model(weights, n_classes, cfg.dropout)
        train_loss, _ = evaluate(model, data.x_train, data.y_train)
        if cfg.requirement == "train":
            loss = train_loss
        else:
            loss, _ = evaluate(model, data.x_test, data.y_test)
    if byzantine:
        loss += cfg.byzantine_loss
        train_loss += cfg.byzantine_loss
    args = {
        "cfg": cfg, "seed": seed, "server_round": server_round, "user": user, "solo": solo,
        "byzantine": byzantine, "control": control, "client_control": client_control,
        "mw_share": mw_share,
    }  # fmt: skip
    return _UserJob(
        rule, model, data, steps, rng, rule.correction(control, client_control), weights,
        float(loss), float(train_loss), args,
    )  # fmt: skip


def _finish(job: _UserJob) -> UserResult:
    """Return the client's reply from its trained model."""
    a = job.args
    cfg = a["cfg"]
    new = job.model.get_weights()
    delta = [
        np.asarray(w, np.float64) - np.asarray(v, np.float64)
        for w, v in zip(job.weights, new, strict=True)
    ]
    if a["byzantine"]:
        noise_rng = user_rng(a["seed"], a["server_round"], a["user"], BYZANTINE)
        delta = [d + noise_rng.normal(0.0, cfg.byzantine_noise, size=d.shape) for d in delta]
    result = UserResult(loss=job.loss, train_loss=job.train_loss, local_steps=job.steps)
    job.rule.finish(result, delta, cfg, a["solo"], a["mw_share"], a["control"], a["client_control"])
    return result


def train_users(requests: Sequence[dict[str, Any]], batched: bool = False) -> list[UserResult]:
    """Run several clients' rounds (each request: the keyword arguments of :func:`train_user`).

    With ``batched`` false this is :func:`train_user` for each request, in order. With
    ``batched`` true, the clients whose rule trains by plain local SGD (FedAvg, FedProx,
    SCAFFOLD, q-FFL, MaxFL, MW-Fed) and whose local steps are equal are trained together by
    :func:`local_sgd_batched` (same draws, same models up to float rounding); Per-FedAvg and
    pFedMe clients are trained one by one.

    Returns
    -------
    list of UserResult
        One result per request, in order.
    """
    if not batched:
        return [train_user(**r) for r in requests]
    jobs = [
        _prepare(
            r["algorithm"],
            r["weights"],
            r["data"],
            r["n_classes"],
            r["cfg"],
            r["seed"],
            r["server_round"],
            r["user"],
            r["solo"],
            r.get("byzantine", False),
            r.get("control"),
            r.get("client_control"),
            r.get("mw_share", 1.0),
        )  # fmt: skip
        for r in requests
    ]
    together: dict[tuple[type, int], list[_UserJob]] = {}
    with single_thread():
        for job in jobs:
            if type(job.rule).run is LocalRule.run:
                together.setdefault((type(job.rule), job.steps), []).append(job)
            else:
                job.rule.run(job.model, job.data, job.steps, job.args["cfg"], job.rng,
                             job.correction)  # fmt: skip
        for group in together.values():
            cfg = group[0].args["cfg"]
            local_sgd_batched(
                [j.model for j in group],
                [(j.data.x_train, j.data.y_train) for j in group],
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
        model = make_model(weights, n_classes, cfg.dropout)
        local_sgd(
            model,
            data.x_train,
            data.y_train,
            cfg.tune_steps,
            cfg.lr,
            cfg.batch_size,
            user_rng(seed, server_round, user, TUNE),
        )
        return evaluate(model, data.x_test, data.y_test)
