"""The clients' local optimisers of MaxFL and its baselines, on the MLP (no Flower import).

Local SGD (with FedProx's proximal term and SCAFFOLD's correction; one client at a time, or
several stacked into one batched pass), Per-FedAvg's and pFedMe's local steps, and the model
helpers they share. A client's round — which of these it runs, and what it sends — is a
:class:`~flower_app.algorithms.maxfl.learning.LocalRule`.

A mini-batch is b examples drawn without replacement anew at every step (all examples if the
client has fewer than b), from the client's stream, whose first draw also seeds the dropout
generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from flower_app.models.mlp import MLP, layer_sizes

__all__ = [
    "evaluate",
    "local_sgd",
    "local_sgd_batched",
    "make_model",
    "perfedavg_steps",
    "pfedme_steps",
]


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
        _sgd_step(params, data.loss(data.batch()), lr, prox_mu, anchor, correction)


def _sgd_step(
    params: Sequence[torch.Tensor],
    loss: torch.Tensor,
    lr: float,
    prox_mu: float,
    anchor: Sequence[torch.Tensor] | None,
    correction: Sequence[torch.Tensor] | None,
) -> None:
    """One SGD step on ``params`` in place: ∇(loss + (μ/2)‖p − anchor‖²) + correction.

    ``anchor`` (FedProx: the starting model) and ``correction`` (SCAFFOLD: c − c_k) may be
    None. Used by :func:`local_sgd` on a client's parameters and by
    :func:`local_sgd_batched` on stacked ones (the same arithmetic).
    """
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
        _sgd_step(stacked, loss, lr, prox_mu, anchor, corr)
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
