"""FedSubAvgStrategy in plain mode: a user's torch ClientApp, Flower's start() conventions.

Each node is one client with a tiny torch model (an embedding table + a dense head); its
ClientApp is a FedAvg one plus the few lines of :mod:`flower_app.clients.fedsubavg`. The
"training" adds 1 to every parameter, so the server's aggregate is known in closed form.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_app.clients.fedsubavg import (
    declare_rows,
    heat_reply,
    load_submodel,
    submodel_reply,
)
from flower_app.strategies.errors import (
    AllRepliesRejectedError,
    InitialArraysError,
    MissingHandlerError,
)
from flower_app.strategies.fedsubavg import (
    FedAdamSubStrategy,
    FedAvgSubStrategy,
    FedProxSubStrategy,
    FedSubAvgStrategy,
    ScaffoldSubStrategy,
)
from tests.support.local_grid import LocalGrid

N_ROWS, DIM, NODES = 12, 3, 4
HOT = 7  # every node's data uses this row


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(N_ROWS, DIM)
        self.head = torch.nn.Linear(DIM, 1)


def rows_of(p: int) -> np.ndarray:
    """Rows node p's data uses: p, p+1 (cold) and the hot row."""
    return np.array(sorted({p, p + 1, HOT}))


def initial() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(Tiny().state_dict())


def user_app(log: dict, nan: bool = False, heat: bool = True, mods=None) -> ClientApp:
    """A user's ClientApp: FedAvg's shape plus the FedSubAvg helper lines."""
    app = ClientApp(mods=mods or [])

    if heat:

        @app.query("feature_heat")
        def feature_heat(msg: Message, context: Context) -> Message:
            p = int(context.node_config["partition-id"])
            item_ids = np.repeat(rows_of(p), 3)  # the data's item column, with repeats
            return heat_reply(msg, {"emb.weight": item_ids}, num_examples=10 + p)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        p = int(context.node_config["partition-id"])
        log.setdefault("configs", []).append(dict(msg.content.config_records["config"]))
        log.setdefault("rows", {})[p] = msg.content["arrays"]["emb.weight.rows"].numpy()
        model = Tiny()
        load_submodel(model, msg)
        with torch.no_grad():
            for param in model.parameters():
                param += float("nan") if nan else 1.0
        return submodel_reply(model, msg, num_examples=10 + p, metrics={"train_loss": 1.0 * p})

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        model = Tiny()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return Message(
            RecordDict({"metrics": MetricRecord({"loss": 0.5, "num-examples": 5})}),
            reply_to=msg,
        )

    return app


def grid(log: dict, **kwargs) -> LocalGrid:
    return LocalGrid(NODES, {}, app=user_app(log, **kwargs))


def strategy(cls=FedSubAvgStrategy, **kwargs) -> FedSubAvgStrategy:
    args = {"fraction_train": 1.0, "min_train_nodes": NODES, "min_available_nodes": NODES}
    return cls(sparse_keys=("emb.weight",), seed=0, **{**args, **kwargs})


def heat_counts() -> np.ndarray:
    n = np.zeros(N_ROWS)
    for p in range(NODES):
        n[rows_of(p)] += 1
    return n


# ---------------------------------------------------------------- start() conventions
def test_initial_arrays_keys_shapes_and_dtypes_round_trip() -> None:
    init = initial()
    result = strategy().start(grid({}), initial_arrays=init, num_rounds=1)
    assert list(result.arrays) == list(init)
    for key in init:
        assert result.arrays[key].shape == init[key].shape
        assert result.arrays[key].dtype == init[key].dtype
    Tiny().load_state_dict(result.arrays.to_torch_state_dict())  # loads as FedAvg's would


def test_train_config_reaches_the_client_unchanged() -> None:
    log: dict = {}
    cfg = ConfigRecord({"lr": 0.05, "local-epochs": 2, "optimizer": "sgd"})
    strategy().start(grid(log), initial_arrays=initial(), num_rounds=2, train_config=cfg)
    assert log["configs"]
    for t, got in zip([1] * NODES + [2] * NODES, log["configs"], strict=True):
        assert got == {"lr": 0.05, "local-epochs": 2, "optimizer": "sgd", "server-round": t}


def test_fedprox_adds_only_proximal_mu() -> None:
    log: dict = {}
    cfg = ConfigRecord({"lr": 0.05})
    strat = strategy(FedProxSubStrategy, proximal_mu=0.1)
    strat.start(grid(log), initial_arrays=initial(), num_rounds=1, train_config=cfg)
    assert log["configs"][0] == {"lr": 0.05, "proximal-mu": 0.1, "server-round": 1}


def test_num_rounds_is_honoured() -> None:
    log: dict = {}
    strat = strategy()
    result = strat.start(grid(log), initial_arrays=initial(), num_rounds=3)
    assert [r["server-round"] for r in strat.history] == [1, 2, 3]
    assert len(log["configs"]) == 3 * NODES
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]


def test_evaluate_fn_is_called_for_rounds_0_to_t() -> None:
    calls: list[tuple[int, list[str]]] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        calls.append((server_round, list(arrays)))
        return MetricRecord({"server-loss": float(server_round)})

    init = initial()
    result = strategy().start(grid({}), initial_arrays=init, num_rounds=2, evaluate_fn=evaluate_fn)
    assert [t for t, _ in calls] == [0, 1, 2]
    assert all(keys == list(init) for _, keys in calls)
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2]


def test_federated_evaluation_sends_the_full_model_to_a_fedavg_evaluate_handler() -> None:
    strat = strategy(fraction_evaluate=1.0, min_evaluate_nodes=NODES)
    result = strat.start(grid({}), initial_arrays=initial(), num_rounds=1)
    assert result.evaluate_metrics_clientapp[1]["loss"] == 0.5
    assert result.evaluate_metrics_clientapp[1]["num-examples"] == 5 * NODES


def test_all_replies_rejected_fails_the_run() -> None:
    with pytest.raises(AllRepliesRejectedError, match="non-finite"):
        strategy().start(grid({}, nan=True), initial_arrays=initial(), num_rounds=2)


def test_missing_heat_handler_fails_fast_and_names_it() -> None:
    t0 = time.monotonic()
    with pytest.raises(MissingHandlerError, match=r'@app.query\("feature_heat"\)'):
        strategy().start(grid({}, heat=False), initial_arrays=initial(), num_rounds=1)
    assert time.monotonic() - t0 < 30


def test_initial_arrays_are_required_and_must_hold_the_sparse_keys() -> None:
    with pytest.raises(InitialArraysError, match="needs initial_arrays"):
        strategy().start(grid({}), num_rounds=1)
    with pytest.raises(InitialArraysError, match="item_emb.weight"):
        FedSubAvgStrategy(sparse_keys=("item_emb.weight",)).start(
            grid({}), initial_arrays=initial(), num_rounds=1
        )


# ---------------------------------------------------------------- the math
def test_each_node_gets_only_its_rows() -> None:
    log: dict = {}
    strategy().start(grid(log), initial_arrays=initial(), num_rounds=1)
    for p in range(NODES):
        np.testing.assert_array_equal(log["rows"][p], rows_of(p))


@pytest.mark.parametrize("weighting", ["clients", "samples"])
def test_fedsubavg_corrects_each_row_by_its_heat(weighting) -> None:
    """Every client adds 1: FedSubAvg moves every touched row by exactly 1 (N/n_m · n_m/N),
    FedAvg on submodels by n_m/N (data-size weighted for "samples"); untouched rows stay."""
    init = initial()
    x0 = init["emb.weight"].numpy()
    touched = heat_counts() > 0
    sub = strategy(weighting=weighting).start(grid({}), initial_arrays=init, num_rounds=1)
    avg = strategy(FedAvgSubStrategy, weighting=weighting).start(
        grid({}), initial_arrays=init, num_rounds=1
    )
    d_sub = sub.arrays["emb.weight"].numpy() - x0
    np.testing.assert_allclose(d_sub[touched], 1.0, rtol=1e-6)
    np.testing.assert_array_equal(d_sub[~touched], 0.0)
    w = np.array([10.0 + p for p in range(NODES)]) if weighting == "samples" else np.ones(NODES)
    share = np.zeros(N_ROWS)
    for p in range(NODES):
        share[rows_of(p)] += w[p]
    share /= w.sum()
    d_avg = avg.arrays["emb.weight"].numpy() - x0
    np.testing.assert_allclose(d_avg, np.repeat(share[:, None], DIM, axis=1), rtol=1e-6)
    for key in ("head.weight", "head.bias"):  # dense arrays: FedAvg
        for res in (sub, avg):
            np.testing.assert_allclose(res.arrays[key].numpy() - init[key].numpy(), 1.0, rtol=1e-6)
    assert sub.train_metrics_clientapp[1]["train_loss"] == pytest.approx(
        np.average(np.arange(NODES), weights=10 + np.arange(NODES))
    )


def test_fedsubavg_update_is_unbiased_over_sampled_nodes() -> None:
    """With 2 of 4 nodes per round, E[Δ_m] = 1 for every touched row (Algorithm 1)."""
    init = initial()
    x0 = init["emb.weight"].numpy().astype(np.float64)
    rounds = 200
    strat = strategy(fraction_train=0.5, min_train_nodes=2)
    deltas = []  # the change of the table in each round
    prev = x0

    def evaluate_fn(t: int, arrays: ArrayRecord) -> None:
        nonlocal prev
        now = arrays["emb.weight"].numpy().astype(np.float64)
        if t > 0:
            deltas.append(now - prev)
        prev = now

    strat.start(grid({}), initial_arrays=init, num_rounds=rounds, evaluate_fn=evaluate_fn)
    mean = np.mean(deltas, axis=0)
    touched = heat_counts() > 0
    np.testing.assert_allclose(mean[touched], 1.0, atol=0.25)
    assert all(r["clients"] == 2 for r in strat.history)


@pytest.mark.parametrize("cls", [FedAdamSubStrategy, ScaffoldSubStrategy])
def test_baselines_run_in_plain_mode(cls) -> None:
    init = initial()
    result = strategy(cls).start(grid({}), initial_arrays=init, num_rounds=2)
    assert list(result.arrays) == list(init)
    assert all(np.all(np.isfinite(result.arrays[k].numpy())) for k in init)


def test_a_reply_with_other_rows_is_left_out_and_counted() -> None:
    g = grid({})
    victim = g.node_ids[0]

    def tamper(msg: Message, reply: Message) -> Message:
        if msg.metadata.dst_node_id == victim and msg.metadata.message_type == "train":
            arrays = reply.content["arrays"]
            arrays["emb.weight.rows"] = type(arrays["emb.weight.rows"])(
                arrays["emb.weight.rows"].numpy() + 1
            )
        return reply

    g.tamper = tamper
    strat = strategy()
    strat.start(g, initial_arrays=initial(), num_rounds=1)
    assert strat.history[0]["bad-replies"] == 1 and strat.history[0]["clients"] == NODES - 1


# ---------------------------------------------------------------- client helpers
def test_client_helpers_work_on_a_mapping_of_numpy_arrays() -> None:
    from flwr.app import Array
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    rows = declare_rows(torch.tensor([[3, 1], [3, 5]]), n_rows=6)
    np.testing.assert_array_equal(rows, [1, 3, 5])
    with pytest.raises(ValueError, match="0..rows-1"):
        declare_rows([7], n_rows=6)
    record = ArrayRecord(
        {
            "t": Array(np.ones((3, 2), dtype=np.float32)),
            "t.rows": Array(rows),
            "b": Array(np.full(2, 4.0)),
        }
    )
    msg = Message(RecordDict({"arrays": record}), dst_node_id=1, message_type="train")
    model = {"t": np.zeros((6, 2), dtype=np.float32), "b": np.zeros(2)}
    got = load_submodel(model, msg)
    np.testing.assert_array_equal(got["t"], rows)
    assert model["t"][[1, 3, 5]].sum() == 6 and model["t"][[0, 2, 4]].sum() == 0
    np.testing.assert_array_equal(model["b"], [4.0, 4.0])


def fedavg_app() -> ClientApp:
    """A FedAvg ClientApp as Flower's quickstart writes it (no FedSubAvg helper)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        p = int(context.node_config["partition-id"])
        model = Tiny()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        with torch.no_grad():
            for param in model.parameters():
                param += 1.0 + p
        metrics = MetricRecord({"train_loss": 1.0 * p, "num-examples": 10 + p})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    return app


def test_the_public_strategies_take_no_cohort_arguments() -> None:
    """Cohorts are the runners' FedSubAvgCohorts; the baselines fix their algorithm."""
    for cohort_only in ({"cohorts": True}, {"n_clients": 10}, {"algorithm": "fedavg-sub"}):
        with pytest.raises(TypeError, match="unexpected keyword"):
            FedSubAvgStrategy(**cohort_only)
    assert FedProxSubStrategy(proximal_mu=0.1).proximal_mu == 0.1
    assert FedSubAvgStrategy().proximal_mu == 0.0


def test_without_sparse_keys_a_fedavg_clientapp_serves_and_the_result_is_fedavg() -> None:
    from flwr.serverapp.strategy import FedAvg

    init = initial()
    ours = FedAvgSubStrategy(
        weighting="samples", fraction_evaluate=0.0, min_train_nodes=NODES,
        min_available_nodes=NODES,
    ).start(LocalGrid(NODES, {}, app=fedavg_app()), initial_arrays=init, num_rounds=2)  # fmt: skip
    flower = FedAvg(
        fraction_evaluate=0.0, min_train_nodes=NODES, min_available_nodes=NODES
    ).start(LocalGrid(NODES, {}, app=fedavg_app()), initial_arrays=init, num_rounds=2)
    assert list(ours.arrays) == list(flower.arrays)
    for key in init:
        np.testing.assert_allclose(
            ours.arrays[key].numpy(), flower.arrays[key].numpy(), rtol=1e-6, atol=1e-6
        )
    assert ours.train_metrics_clientapp[2]["train_loss"] == pytest.approx(
        flower.train_metrics_clientapp[2]["train_loss"]
    )


# ---------------------------------------------------------------- secure aggregation
@pytest.mark.parametrize("weighting", ["clients", "samples"])
def test_plain_mode_under_secure_aggregation_reaches_the_plain_model(weighting) -> None:
    """The user's ClientApp plus the mod: the counting round becomes a secure sum of dense
    counts (the same heat), every node gets the whole tables (the server learns no node's
    rows), each node's update is cut to the rows it declared; the model is the plain run's
    within the fixed-point error and the server receives no node's rows or update."""
    from flower_app.privacy import SecureAggregation, secure_aggregation_mod

    plain = strategy(weighting=weighting)
    want = plain.start(grid=grid({}), initial_arrays=initial(), num_rounds=2)
    g = LocalGrid(NODES, {}, app=user_app({}, mods=[secure_aggregation_mod]))
    received = []
    pull = g.pull_messages
    g.pull_messages = lambda ids: [received.append(r) or r for r in pull(ids)]
    secure = strategy(weighting=weighting, secure_aggregation=SecureAggregation())
    got = secure.start(grid=g, initial_arrays=initial(), num_rounds=2)
    assert np.array_equal(secure.heat.clients, plain.heat.clients)
    assert np.array_equal(secure.heat.samples, plain.heat.samples)
    for key in want.arrays:
        np.testing.assert_allclose(got.arrays[key].numpy(), want.arrays[key].numpy(),
                                   rtol=0, atol=1e-5)  # fmt: skip
    for msg in received:
        if not msg.has_error() and msg.content.array_records:
            assert set(msg.content.array_records) == {"secagg-vector"}
