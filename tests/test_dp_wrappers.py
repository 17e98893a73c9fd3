"""Flower's four DP wrappers drive MaxFL and FedAvg-mode FedSubAvg without losing a reply.

Each wrapper (server-/client-side × fixed/adaptive clipping; the client-side ones with
Flower's clipping mod on the ClientApp) runs its own ``start()`` loop around the strategy
on the in-process grid with the real ClientApp: 10 nodes, half of them trained per round,
all of them evaluated. Before the fix, the evaluate replies of the 5 nodes not trained in
the round were rejected ("reply from a node that was not sent anything"). Each node's
evaluate reply carries its partition id with weight 1, so the federated mean is 4.5 only if
all ten arrived; every train reply must be accepted too.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from flower_app.clients.maxfl import maxfl_metrics
from flower_app.strategies import FedSubAvgStrategy
from flower_app.strategies.maxfl import MaxFLStrategy
from tests.support.local_grid import LocalGrid

NODES, ROUNDS, DIM = 10, 2, 3

FIXED = {"clipping_norm": 1.0}
ADAPTIVE = {"initial_clipping_norm": 1.0}
WRAPPERS = [
    (DifferentialPrivacyServerSideFixedClipping, FIXED, None),
    (DifferentialPrivacyClientSideFixedClipping, FIXED, fixedclipping_mod),
    (DifferentialPrivacyServerSideAdaptiveClipping, ADAPTIVE, None),
    (DifferentialPrivacyClientSideAdaptiveClipping, ADAPTIVE, adaptiveclipping_mod),
]


def initial() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(DIM, np.float32)), "b": Array(np.zeros(1, np.float32))})


def user_app(maxfl: bool, mod) -> ClientApp:
    """A FedAvg ClientApp (MaxFL: plus F_k(w) and ρ_k); evaluate replies its partition id.

    Flower's clipping mods go on the train handler (they need the wrapper's clipping norm,
    which only train messages carry).
    """
    app = ClientApp()

    @app.train(mods=[mod] if mod is not None else None)
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        arrays = msg.content.array_records["arrays"]
        new = {k: arrays[k].numpy() + np.float32(0.1 * (pid + 1)) for k in arrays}
        metrics = {"num-examples": 1}
        record = (
            maxfl_metrics(1.0 + 0.1 * pid, 0.5, metrics) if maxfl else MetricRecord(metrics)
        )
        out = ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()})
        return Message(RecordDict({"arrays": out, "metrics": record}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = MetricRecord({"pid": float(pid), "num-examples": 1})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app


def inner_strategy(kind: str):
    if kind == "maxfl":
        return MaxFLStrategy(fraction_train=0.5, fraction_evaluate=1.0, flexible=False, seed=2,
                             min_train_nodes=2, min_available_nodes=NODES)  # fmt: skip
    # FedAvg-mode FedSubAvg: no sparse tables, every n_m = N, clients weighted equally
    return FedSubAvgStrategy(fraction_train=0.5, fraction_evaluate=1.0, seed=2,
                             min_available_nodes=NODES)  # fmt: skip


@pytest.mark.parametrize("kind", ["maxfl", "fedsubavg"])
@pytest.mark.parametrize(("wrapper", "extra", "mod"), WRAPPERS)
def test_every_dp_wrapper_drives_the_strategy_without_losing_a_reply(kind, wrapper, extra, mod):
    inner = inner_strategy(kind)
    dp = wrapper(inner, noise_multiplier=0.1, num_sampled_clients=NODES // 2, **extra)
    result = dp.start(grid=LocalGrid(NODES, {}, app=user_app(kind == "maxfl", mod)),
                      initial_arrays=initial(), num_rounds=ROUNDS)  # fmt: skip
    assert sorted(result.evaluate_metrics_clientapp) == list(range(1, ROUNDS + 1))
    for t in range(1, ROUNDS + 1):  # every evaluate reply arrived: the mean of 0..9
        assert result.evaluate_metrics_clientapp[t]["pid"] == pytest.approx(4.5)
        train = result.train_metrics_clientapp[t]
        assert int(train.get("bad-replies", 0)) == 0
        if kind == "maxfl":
            assert int(train["nodes"]) == NODES // 2
    assert all(np.all(np.isfinite(result.arrays[k].numpy())) for k in result.arrays)


@pytest.mark.parametrize(("wrapper", "extra", "mod"), WRAPPERS)
def test_fedsubavg_with_sparse_tables_refuses_every_dp_wrapper(wrapper, extra, mod) -> None:
    """The wrappers' whole-model clipping and FedAvg-calibrated noise do not fit sparse
    replies corrected by N/n_m: refused before anything is sent, saying why."""
    inner = FedSubAvgStrategy(sparse_keys=["w"], seed=2, min_available_nodes=NODES)
    dp = wrapper(inner, noise_multiplier=0.1, num_sampled_clients=NODES // 2, **extra)
    with pytest.raises(ValueError, match="sparse tables or cohorts.*N/n_m"):
        dp.start(grid=LocalGrid(NODES, {}, app=user_app(False, mod)), initial_arrays=initial(),
                 num_rounds=1)  # fmt: skip
