"""Batched local SGD (``maxfl-batched-clients``): the same draws as one by one, the same models
up to float32 rounding, and a client's model independent of the clients batched with it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from direct import run_direct
from flower_app.algorithms.common.streams import user_rng
from flower_app.algorithms.common.threads import single_thread
from flower_app.algorithms.maxfl.learning import TRAIN
from flower_app.algorithms.maxfl.local_steps import local_sgd, local_sgd_batched, make_model
from flower_app.config import AppConfig
from flower_app.models.mlp import MLP
from flower_app.results import read_rows

#: float32 weights after 10 SGD steps at lr 0.1: one-by-one and batched differ only by the
#: order of the sums inside the matrix products
ATOL = 1e-5


def _clients(sizes: list[int], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(n, 20)).astype(np.float32), rng.integers(0, 5, size=n))
        for n in sizes
    ]


def _init(seed: int = 1) -> list[np.ndarray]:
    torch.manual_seed(seed)
    return MLP(n_in=20, n_classes=5, dropout=0.3).get_weights()


def _one_by_one(data, prox_mu=0.0, corrections=None, steps=10, b=8) -> list[list[np.ndarray]]:
    out = []
    with single_thread():
        for k, (x, y) in enumerate(data):
            model = make_model(_init(), 5, 0.3)
            local_sgd(
                model, x, y, steps, 0.1, b, user_rng(3, 1, k, TRAIN), prox_mu=prox_mu,
                correction=None if corrections is None else corrections[k],
            )  # fmt: skip
            out.append(model.get_weights())
    return out


def _batched(data, users, prox_mu=0.0, corrections=None, steps=10, b=8):
    models = [make_model(_init(), 5, 0.3) for _ in users]
    with single_thread():
        local_sgd_batched(
            models, [data[k] for k in users], steps, 0.1, b,
            [user_rng(3, 1, k, TRAIN) for k in users],
            prox_mu=prox_mu,
            corrections=None if corrections is None else [corrections[k] for k in users],
        )  # fmt: skip
    return [m.get_weights() for m in models]


@pytest.mark.parametrize("prox_mu", [0.0, 0.05])
@pytest.mark.parametrize("with_correction", [False, True])
def test_batched_equals_one_by_one_to_float_rounding(prox_mu, with_correction) -> None:
    data = _clients([30, 12, 5, 30, 8])  # n < b for two clients: groups of their own
    corrections = None
    if with_correction:
        g = torch.Generator().manual_seed(5)
        corrections = [[0.01 * torch.randn(w.shape, generator=g) for w in _init()] for _ in data]
    alone = _one_by_one(data, prox_mu, corrections)
    together = _batched(data, list(range(len(data))), prox_mu, corrections)
    moved = max(float(np.abs(a - w).max()) for a, w in zip(alone[0], _init(), strict=True))
    assert moved > 1e-2  # training did something
    for a_client, t_client in zip(alone, together, strict=True):
        for a, t in zip(a_client, t_client, strict=True):
            np.testing.assert_allclose(t, a, rtol=0, atol=ATOL)


def test_a_clients_model_does_not_depend_on_its_batch() -> None:
    """Engines agree exactly: a cohort node batches its own users, the direct engine all."""
    data = _clients([30, 30, 30, 30], seed=2)
    all_four = _batched(data, [0, 1, 2, 3])
    pairs = _batched(data, [0, 1]) + _batched(data, [2, 3])
    alone = _batched(data, [2])
    for x, y in zip(all_four, pairs, strict=True):
        for a, b in zip(x, y, strict=True):
            assert np.array_equal(a, b)
    for a, b in zip(all_four[2], alone[0], strict=True):
        assert np.array_equal(a, b)


SMALL = {
    "dataset": "synthetic-emnist",
    "num-users": 8,
    "clients-per-round": 4,
    "maxfl-rounds": 3,
    "maxfl-eval-every": 1,
    "maxfl-mandatory-rounds": 1,
    "maxfl-solo-steps": 10,
    "maxfl-local-steps": 5,
    "maxfl-participation": "all",
    "seed": 2,
}


@pytest.mark.parametrize("algorithm", ["maxfl", "fedprox", "scaffold", "mwfed", "pfedme"])
def test_direct_engine_batched_run_matches_one_by_one(algorithm) -> None:
    out = tempfile.mkdtemp()
    runs = {}
    for batched in (False, True):
        cfg = AppConfig.from_run_config(
            {**SMALL, "algorithm": algorithm, "maxfl-batched-clients": batched,
             "output-dir": out, "run-name": f"{algorithm}-{batched}"}
        )  # fmt: skip
        runs[batched] = run_direct(cfg)
    one, many = runs[False], runs[True]
    for key in ("seen-loss", "unseen-loss", "seen-tuned-acc"):
        assert many["final"][key] == pytest.approx(one["final"][key], rel=1e-4), key
    rows = {b: read_rows(Path(r["run-folder"])) for b, r in runs.items()}
    assert [r.get("users") for r in rows[True]] == [r.get("users") for r in rows[False]]
    for a, b in zip(rows[False], rows[True], strict=True):
        if a.get("train-loss") is not None:
            assert b["train-loss"] == pytest.approx(a["train-loss"], rel=1e-4)
    if algorithm == "pfedme":  # not batched (its own local steps): bit for bit
        assert many["model-digest"] == one["model-digest"]


def test_solo_models_trained_together_match_one_by_one() -> None:
    from flower_app.algorithms.maxfl.learning import (
        LocalConfig,
        solo_requirement,
        solo_requirements,
    )
    from flower_app.datasets.federated import ClientData

    raw = _clients([40, 45, 60], seed=4)
    data = [ClientData(x[:30], y[:30], x[30:], y[30:], False) for x, y in raw]
    cfg = LocalConfig(solo_steps=15, batch_size=16, dropout=0.3, lr=0.1)
    users = (3, 1, 8)
    alone = [solo_requirement(_init(), d, 5, cfg, 7, u) for u, d in zip(users, data, strict=True)]
    together = solo_requirements(_init(), data, 5, cfg, 7, users)
    for a, t in zip(alone, together, strict=True):
        np.testing.assert_allclose(t.to_list(), a.to_list(), rtol=1e-5)
    assert len({round(a.rho_train, 6) for a in alone}) == 3  # three different clients
