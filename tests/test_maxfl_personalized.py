"""Per-FedAvg (FO) and pFedMe, the MaxFL paper's personalised baselines: local steps checked
against hand-written torch computations (engine agreement: tests/test_maxfl_engine.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from flower_app.algorithms.maxfl.learning import LocalConfig
from flower_app.algorithms.maxfl.local_steps import (
    local_sgd,
    make_model,
    perfedavg_steps,
    pfedme_steps,
)
from flower_app.config import AppConfig, ConfigError
from flower_app.models.mlp import init_weights
from flower_app.runners import maxfl as runner

N_CLASSES = 4


def _data(seed: int = 0, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 784)).astype(np.float32), rng.integers(0, N_CLASSES, n)


def _model(seed: int = 1):
    return make_model(init_weights(seed, 784, N_CLASSES), N_CLASSES, dropout=0.0)


def _grads(model, x, y) -> list[torch.Tensor]:
    loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    return list(torch.autograd.grad(loss, list(model.parameters())))


def _batch(rng: np.random.Generator, n: int, b: int) -> np.ndarray:
    return rng.choice(n, size=min(b, n), replace=False)


def test_perfedavg_step_is_the_first_order_maml_update() -> None:
    """w ← w − β ∇f(w − α∇f(w; D); D′) with the two batches the client's stream draws."""
    x, y = _data()
    alpha, beta, b = 0.3, 0.05, 8
    model = _model()
    w0 = [p.detach().clone() for p in model.parameters()]
    perfedavg_steps(model, x, y, 1, alpha, beta, b, np.random.default_rng(7))

    rng = np.random.default_rng(7)
    rng.integers(2**62)  # the dropout generator's seed (dropout is 0 here)
    d1, d2 = _batch(rng, len(y), b), _batch(rng, len(y), b)
    ref = _model()
    g1 = _grads(ref, x[d1], y[d1])
    with torch.no_grad():
        for p, g in zip(ref.parameters(), g1, strict=True):
            p.sub_(alpha * g)
    g2 = _grads(ref, x[d2], y[d2])
    expected = [w - beta * g for w, g in zip(w0, g2, strict=True)]
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e, rtol=1e-6, atol=1e-7)
    # β is the step that moves w: with the same α, twice β moves w about twice as far
    far = _model()
    perfedavg_steps(far, x, y, 1, alpha, 2 * beta, b, np.random.default_rng(7))
    move = [float(torch.norm(p.detach() - w)) for p, w in zip(model.parameters(), w0, strict=True)]
    move2 = [float(torch.norm(p.detach() - w)) for p, w in zip(far.parameters(), w0, strict=True)]
    assert move2 == pytest.approx([2 * m for m in move], rel=1e-4)


def test_pfedme_with_one_inner_step_is_sgd_with_lr_eta_lambda_personal_lr() -> None:
    """K = 1, one local step: θ = w − p∇f(w; D), w ← w − ηλ(w − θ) = w − ηλp∇f(w; D)."""
    x, y = _data()
    eta, lam, plr, b = 0.05, 15.0, 0.01, 8
    a = _model()
    pfedme_steps(a, x, y, 1, eta, lam, 1, plr, b, np.random.default_rng(3))
    ref = _model()
    local_sgd(ref, x, y, 1, eta * lam * plr, b, np.random.default_rng(3))
    for p, q in zip(a.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-7)


def test_pfedme_moves_w_towards_the_personalised_optimum() -> None:
    """K inner steps approach θ* = argmin f(θ; D) + λ/2‖θ − w‖²; then w ← w − ηλ(w − θ_K)."""
    x, y = _data(n=8)
    x *= 0.05  # mild curvature, so that the inner iteration contracts at personal_lr = 0.02
    eta, lam, plr, k = 0.01, 15.0, 0.02, 60
    model = _model()
    w0 = [p.detach().clone() for p in model.parameters()]
    pfedme_steps(model, x, y, 1, eta, lam, k, plr, len(y), np.random.default_rng(0))

    theta = _model()  # the inner iteration written out (full batch: the batch order is moot)
    for _ in range(k):
        g = _grads(theta, x, y)
        with torch.no_grad():
            for p, w, gi in zip(theta.parameters(), w0, g, strict=True):
                p.sub_(plr * (gi + lam * (p - w)))
    params = list(theta.parameters())

    def residual(model_, g) -> float:  # largest entry of ∇f(θ) + λ(θ − w)
        return max(
            float((gi + lam * (p.detach() - w)).abs().max())
            for gi, p, w in zip(g, model_.parameters(), w0, strict=True)
        )

    # θ_K ≈ θ* (ReLU kinks keep the residual from vanishing entirely)
    assert residual(theta, _grads(theta, x, y)) < 0.02 * residual(_model(), _grads(_model(), x, y))
    for p, w, t in zip(model.parameters(), w0, params, strict=True):
        expected = w - eta * lam * (w - t.detach())
        torch.testing.assert_close(p.detach(), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("key", "value"),
    [("maxfl-perfedavg-alpha", 0.0), ("maxfl-pfedme-lambda", -1.0), ("maxfl-pfedme-k", 0),
     ("maxfl-pfedme-lr", 0.0)],
)  # fmt: skip
def test_bad_personalised_settings_name_the_key(key, value) -> None:
    with pytest.raises(ConfigError, match=key):  # refused by AppConfig, before the runner
        cfg = AppConfig.from_run_config(
            {"algorithm": "pfedme", "dataset": "synthetic-emnist", key: value}
        )
        runner.settings(cfg)


def test_local_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="pfedme_k"):
        LocalConfig(pfedme_k=0)
