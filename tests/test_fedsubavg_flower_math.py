"""Our server steps on a dense model equal Flower's own FedAvg and FedAdam strategies.

Flower's strategies do not fit the submodel message contract (see
:mod:`flower_app.strategies.fedsubavg`), but where every client returns its full model their
math must be ours: a client that does not touch row m returns it unchanged, i.e. Δ_{i,m} = 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg
from flwr.supercore.task_identity import TaskIdentity

from flower_app.algorithms.fedsubavg.core import (
    AdamConfig,
    RoundUpdate,
    ServerAdam,
    SubmodelAveraging,
)


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 1
    TaskIdentity.task_id = 1


def _replies(x: np.ndarray, deltas: np.ndarray, weights: np.ndarray) -> list[Message]:
    out = []
    for i, (d, w) in enumerate(zip(deltas, weights, strict=True)):
        content = RecordDict(
            {
                "arrays": ArrayRecord({"x": Array(x + d)}),
                "metrics": MetricRecord({"num-examples": int(w)}),
            }
        )
        out.append(Message(content, dst_node_id=100 + i, message_type="train"))
    return out


def _sparse_update(deltas: np.ndarray, weights: np.ndarray) -> RoundUpdate:
    touched = np.flatnonzero(np.any(deltas != 0, axis=0))
    sums = (weights[:, None] * deltas).sum(axis=0)[touched]
    return RoundUpdate(touched, sums, deltas.shape[0], float(weights.sum()))


def _world(seed: int, n: int = 6, m: int = 20):
    rng = np.random.default_rng(seed)
    member = rng.random((n, m)) < 0.4
    deltas = np.where(member, rng.normal(size=(n, m)), 0.0)
    weights = rng.integers(1, 30, size=n).astype(float)
    return rng.normal(size=m), deltas, weights


def test_fedavg_on_submodels_is_flowers_fedavg() -> None:
    x, deltas, weights = _world(0)
    flower = FedAvg()
    arrays, _ = flower.aggregate_train(1, _replies(x, deltas, weights))
    ours = x.copy()
    SubmodelAveraging(None, "samples").step(ours, _sparse_update(deltas, weights), 1)
    np.testing.assert_allclose(ours, arrays["x"].numpy(), rtol=1e-12, atol=1e-12)


def test_fedadam_on_submodels_is_flowers_fedadam_over_rounds() -> None:
    adam = AdamConfig(eta=1.0, beta1=0.9, beta2=0.99, tau=1e-3)  # Table 5 (MovieLens)
    flower = FedAdam(eta=adam.eta, eta_l=0.1, beta_1=adam.beta1, beta_2=adam.beta2, tau=adam.tau)
    x0, _, _ = _world(1)
    ours = ServerAdam(x0.size, adam)
    x_ours, x_flower = x0.copy(), x0.copy()
    for t in range(1, 6):
        _, deltas, weights = _world(10 + t)
        flower.current_arrays = {"x": x_flower.copy()}  # what configure_train records
        arrays, _ = flower.aggregate_train(t, _replies(x_flower, deltas, weights))
        x_flower = arrays["x"].numpy()
        ours.step(x_ours, _sparse_update(deltas, weights), t)
        np.testing.assert_allclose(x_ours, x_flower, rtol=1e-10, atol=1e-12)
