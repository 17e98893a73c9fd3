"""MaxFLStrategy as a drop-in for FedAvg: plain mode against a user-style ClientApp.

The ClientApp below is what a user writes: a FedAvg app (named arrays in, named arrays and
``num-examples`` out) plus the helpers of :mod:`flower_app.clients.maxfl`. Each of
Flower's ``start()`` conventions is checked over the in-process grid; the runners' cohort
class (``MaxFLCohorts``) still gives the recorded seeded model of the reproductions' engine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from maxfl_configs import SMALL

from direct import run_direct
from flower_app.algorithms.maxfl.appeal import AppealServer
from flower_app.algorithms.maxfl.core import aggregation_weight, maxfl_update
from flower_app.algorithms.maxfl.participation import ParticipationSampler
from flower_app.clients.adapter import numpy_client_app
from flower_app.clients.maxfl import appeal_reply, ensure_rho, maxfl_metrics, stored_rho
from flower_app.config import AppConfig
from flower_app.runners import maxfl as runner
from flower_app.strategies.cohort.maxfl import MaxFLCohorts
from flower_app.strategies.errors import (
    AllRepliesRejectedError,
    InitialArraysError,
    MissingHandlerError,
)
from flower_app.strategies.maxfl import MaxFLStrategy
from tests.support.local_grid import LocalGrid

DIM = 4


def initial() -> ArrayRecord:
    """A 'state_dict': a linear layer plus an integer buffer, as torch models have."""
    return ArrayRecord(
        {
            "fc.weight": Array(np.zeros((1, DIM), np.float32)),
            "fc.bias": Array(np.zeros(1, np.float32)),
            "bn.num_batches_tracked": Array(np.array(0, np.int64)),
        }
    )


def local_data(pid: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(pid)
    x = rng.normal(size=(40, DIM)).astype(np.float32)
    y = x @ np.full(DIM, 1.0 + 0.5 * pid, np.float32) + 0.1 * rng.normal(size=40)
    return x, y.astype(np.float32)


def mse(w: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((x @ w["fc.weight"][0] + w["fc.bias"][0] - y) ** 2))


def sgd(w: dict[str, np.ndarray], x, y, lr: float, steps: int) -> dict[str, np.ndarray]:
    w = {k: v.copy() for k, v in w.items()}
    for _ in range(steps):
        err = x @ w["fc.weight"][0] + w["fc.bias"][0] - y
        w["fc.weight"] = w["fc.weight"] - lr * (2 * err @ x / len(y))[None, :]
        w["fc.bias"] = w["fc.bias"] - lr * np.array([2 * err.mean()], np.float32)
        w["bn.num_batches_tracked"] = w["bn.num_batches_tracked"] + 1
    return w


def as_dict(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: record[k].numpy() for k in record}


def user_app(
    configs: list | None = None, maxfl: bool = True, appeal: bool = True, mods=None
) -> ClientApp:
    """A FedAvg ClientApp; with ``maxfl`` its train reply adds F_k(w) and ρ_k (3 lines)."""
    app = ClientApp(mods=mods or [])

    def load(msg: Message, context: Context):
        pid = int(context.node_config["partition-id"])
        return as_dict(msg.content.array_records["arrays"]), *local_data(pid)

    def rho_of(context: Context, x, y) -> float:  # ρ_k: the loss of a model trained alone
        solo = sgd(as_dict(initial()), x, y, lr=0.05, steps=int(context.node_config["solo"]))
        return ensure_rho(context, lambda: mse(solo, x, y))

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        w, x, y = load(msg, context)
        config = msg.content.config_records["config"]
        if configs is not None:
            configs.append(dict(config))
        new = sgd(w, x, y, float(config["lr"]), int(config["local-steps"]))
        if maxfl:  # the app's own train_loss (after training) stays beside F_k(w) and ρ_k
            own = {"num-examples": len(y), "train_loss": mse(new, x, y)}
            metrics = maxfl_metrics(mse(w, x, y), rho_of(context, x, y), own)
        else:
            metrics = MetricRecord({"num-examples": len(y), "train_loss": mse(new, x, y)})
        arrays = ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        w, x, y = load(msg, context)
        metrics = MetricRecord({"eval-loss": mse(w, x, y), "num-examples": len(y)})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    if appeal:

        @app.evaluate("appeal")
        def opt_in(msg: Message, context: Context) -> Message:
            w, x, y = load(msg, context)
            return appeal_reply(msg, mse(w, x, y), rho_of(context, x, y))

    return app


def grid(app: ClientApp, nodes: int = 4, solo=lambda i: 2) -> LocalGrid:
    return LocalGrid(
        nodes,
        {},
        app=app,
        node_config=lambda i: {"partition-id": i, "num-partitions": nodes, "solo": solo(i)},
    )


TRAIN = ConfigRecord({"lr": 0.05, "local-steps": 3, "note": "mine"})


def run(app: ClientApp, rounds: int = 3, nodes: int = 4, **kwargs):
    strategy = MaxFLStrategy(**{"mandatory_rounds": 1, "seed": 3, **kwargs})
    g = grid(app, nodes)
    result = strategy.start(grid=g, initial_arrays=initial(), num_rounds=rounds, train_config=TRAIN)
    return strategy, result, g


# ------------------------------------------------------------------ start() conventions
def test_initial_arrays_keys_round_trip() -> None:
    _, result, _ = run(user_app())
    assert list(result.arrays.keys()) == list(initial().keys())
    got = as_dict(result.arrays)
    assert got["fc.weight"].dtype == np.float32 and got["fc.weight"].shape == (1, DIM)
    assert got["bn.num_batches_tracked"].dtype == np.int64  # not averaged: a reply's value
    assert float(np.abs(got["fc.weight"]).sum()) > 0  # it trained


def test_train_config_reaches_the_client_unchanged() -> None:
    configs: list[dict] = []
    run(user_app(configs), rounds=2)
    assert configs
    for cfg in configs:
        assert cfg == {**dict(TRAIN), "server-round": cfg["server-round"]}
    assert {c["server-round"] for c in configs} == {1, 2}


def test_num_rounds_is_honoured_and_rows_are_kept() -> None:
    strategy, result, _ = run(user_app(), rounds=4)
    assert [r["server-round"] for r in strategy.history] == [1, 2, 3, 4]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3, 4]
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2, 3, 4]  # FedAvg-style
    row = result.train_metrics_clientapp[1]
    assert row["nodes"] == 4 and row["bad-replies"] == 0 and 0 < row["q-mean"] <= 0.25
    # the strategy's F_k(w) (the received model's loss) and the app's own train_loss (after
    # training, averaged by num-examples as FedAvg does) under names that cannot be confused
    assert "train-loss" not in row and row["received-loss"] > row["train_loss"] > 0


def test_evaluate_fn_is_called_for_rounds_0_to_t() -> None:
    calls: list[tuple[int, list[str]]] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        calls.append((server_round, list(arrays.keys())))
        return MetricRecord({"loss": mse(as_dict(arrays), *local_data(0))})

    strategy = MaxFLStrategy(mandatory_rounds=1)
    result = strategy.start(
        grid=grid(user_app()),
        initial_arrays=initial(),
        num_rounds=3,
        train_config=TRAIN,
        evaluate_fn=evaluate_fn,
    )
    assert [t for t, _ in calls] == [0, 1, 2, 3]
    assert all(keys == list(initial().keys()) for _, keys in calls)
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3]


def test_all_replies_rejected_fails_the_run() -> None:
    """A plain FedAvg ClientApp reports no ρ_k: every reply is left out, the run fails."""
    with pytest.raises(AllRepliesRejectedError, match="'train-loss'"):
        run(user_app(maxfl=False), rounds=2)


def test_missing_opt_in_handler_is_named_before_round_1() -> None:
    # the opt-in test is first needed after the mandatory rounds (10 by default): a run of
    # 3 rounds never sends it, yet the missing handler stops the run before round 1
    sent: list[str] = []
    g = grid(user_app(appeal=False))
    g.tamper = lambda msg, reply: sent.append(msg.metadata.message_type) or reply
    with pytest.raises(MissingHandlerError, match=r'before round 1: .*@app.evaluate\("appeal"\)'):
        MaxFLStrategy().start(grid=g, initial_arrays=initial(), num_rounds=3, train_config=TRAIN)
    assert set(sent) == {"evaluate.appeal"}  # nothing was trained
    # without flexible participation the opt-in handler is not needed
    run(user_app(appeal=False), rounds=3, flexible=False)


def test_missing_initial_arrays_raise() -> None:
    with pytest.raises(InitialArraysError, match="initial_arrays"):
        MaxFLStrategy().start(grid=grid(user_app()), num_rounds=1)


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="ε > 0"):
        MaxFLStrategy(eps=0.0)
    with pytest.raises(ValueError, match="fraction_train"):
        MaxFLStrategy(fraction_train=0.0)


# ------------------------------------------------------------------ the MaxFL step
def test_one_round_is_the_maxfl_update_of_the_replies() -> None:
    strategy, result, g = run(user_app(), rounds=1, fraction_evaluate=0.0, server_lr=0.7)
    w0 = as_dict(initial())
    losses, rhos, deltas = [], [], []
    for i, nid in enumerate(g.node_ids):
        x, y = local_data(i)
        losses.append(mse(w0, x, y))
        rhos.append(stored_rho(g.contexts[nid]))
        new = sgd(w0, x, y, 0.05, 3)
        deltas.append({k: w0[k].astype(np.float64) - new[k] for k in ("fc.weight", "fc.bias")})
    q = aggregation_weight(np.array(losses), np.array(rhos))
    sums = [
        sum(qk * d[k] for qk, d in zip(q, deltas, strict=True)) for k in ("fc.weight", "fc.bias")
    ]
    want = maxfl_update([w0["fc.weight"], w0["fc.bias"]], sums, float(q.sum()), 0.7, 1e-3)
    got = as_dict(result.arrays)
    np.testing.assert_allclose(got["fc.weight"], want[0], rtol=1e-6)
    np.testing.assert_allclose(got["fc.bias"], want[1], rtol=1e-6)
    assert strategy.history[0]["q-sum"] == pytest.approx(float(q.sum()))


def test_rho_is_computed_once_per_node() -> None:
    calls: list[int] = []
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    assert ensure_rho(ctx, lambda: calls.append(1) or 0.5) == 0.5
    assert ensure_rho(ctx, lambda: calls.append(1) or 9.0) == 0.5
    assert calls == [1] and stored_rho(ctx) == 0.5
    with pytest.raises(ValueError, match="finite"):
        ensure_rho(Context(1, 1, {}, RecordDict(), {}), lambda: float("nan"))


def test_only_nodes_the_model_appeals_to_train_after_the_mandatory_rounds() -> None:
    """Nodes 0 and 1 have near-perfect solo models (ρ ≈ noise): w never appeals to them."""
    trained: list[tuple[int, int]] = []
    g = grid(user_app(), solo=lambda i: 400 if i < 2 else 1)

    def record(msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type == "train":
            cfg = msg.content.config_records["config"]
            trained.append((int(cfg["server-round"]), msg.metadata.dst_node_id))
        return reply

    g.tamper = record
    strategy = MaxFLStrategy(mandatory_rounds=1, seed=1, fraction_evaluate=0.0)
    strategy.start(grid=g, initial_arrays=initial(), num_rounds=3, train_config=TRAIN)
    first = {n for t, n in trained if t == 1}
    later = {n for t, n in trained if t > 1}
    assert first == set(g.node_ids)  # mandatory round: everyone
    assert later and later <= set(g.node_ids[2:])  # then only the opt-in pool
    assert [r["pool-size"] for r in strategy.history[1:]] == [2, 2]


# ------------------------------------------------------------------ cohort mode unchanged
#: model digests of seeded SMALL runs of the direct engine, recorded before the strategies
#: moved onto RoundStrategy and the server steps became classes (the Flower paths give the
#: same models: tests/test_maxfl_engine.py)
PINNED = {
    "maxfl": "9fb1e34e75b59a5f",
    "mwfed": "01ed9e3cebafb7ff",
    "scaffold": "3a4d0f6afdce7a0c",
    "qffl": "00e248a3cb5ac284",
}
MWFED = {
    "algorithm": "mwfed",
    "maxfl-participation": "all",
    "maxfl-byzantine": 0.34,
    "maxfl-solo-steps": 1,
    "maxfl-rounds": 4,
}


ALL = {"maxfl-participation": "all"}


@pytest.mark.parametrize(
    "extra",
    [{}, MWFED, {**ALL, "algorithm": "scaffold"}, {**ALL, "algorithm": "qffl"}],
    ids=["maxfl", "mwfed", "scaffold", "qffl"],
)
def test_cohort_runs_keep_the_pinned_models(tmp_path, extra) -> None:
    cfg = AppConfig.from_run_config(
        {**SMALL, **extra, "output-dir": str(tmp_path), "run-name": "pin"}
    )
    assert run_direct(cfg)["model-digest"] == PINNED[cfg.algorithm]


def test_the_cohort_class_runs_the_reproductions_protocol() -> None:
    """``MaxFLCohorts`` over cohort nodes gives the pinned model (``MaxFLStrategy`` is
    plain only: a cohort argument is refused)."""
    s = runner.settings(AppConfig.from_run_config(SMALL))
    server = AppealServer("maxfl", [], s.n_seen, server_lr=s.server_lr, eps=s.eps)
    sampler = ParticipationSampler(
        s.n_seen, s.clients_per_round, True, s.mandatory_rounds, s.seed
    )
    strategy = MaxFLCohorts(server, sampler, s.n_clients, eval_every=s.eval_every)
    result = strategy.start(
        grid=LocalGrid(5, SMALL),
        initial_arrays=ArrayRecord(runner._init(s)),  # noqa: SLF001
        num_rounds=s.rounds,
    )
    assert runner.model_digest(result.arrays.to_numpy_ndarrays()) == PINNED["maxfl"]
    assert [r["server-round"] for r in strategy.history] == [0, 1, 2, 3]
    assert "seen-acc" in strategy.history[-1]
    for cohort_only in ({"cohorts": True}, {"n_seen": 4}, {"clients_per_round": 2}):
        with pytest.raises(TypeError, match="unexpected keyword"):
            MaxFLStrategy(**cohort_only)


# ------------------------------------------------------------------ legacy NumPyClient
class LegacyClient(NumPyClient):
    """A NumPyClient app (positional arrays) reporting F_k(w) and ρ_k in its metrics."""

    def __init__(self, pid: int) -> None:
        self.x, self.y = local_data(pid)

    def _w(self, parameters):
        return {"fc.weight": parameters[0], "fc.bias": parameters[1]}

    def fit(self, parameters, config):
        w = self._w(parameters)
        new = sgd({**w, "bn.num_batches_tracked": np.array(0)}, self.x, self.y, 0.05, 3)
        metrics = {"train-loss": mse(w, self.x, self.y), "rho": 5.0}
        return [new["fc.weight"], new["fc.bias"]], len(self.y), metrics

    def evaluate(self, parameters, config):
        loss = mse(self._w(parameters), self.x, self.y)
        return loss, len(self.y), {"train-loss": loss, "rho": 5.0}


def test_legacy_numpy_client_app_serves_plain_mode() -> None:
    """numpy_client_app routes train, evaluate and evaluate.appeal to a NumPyClient."""
    app = numpy_client_app(lambda ctx: LegacyClient(int(ctx.node_config["partition-id"])))
    start = ArrayRecord([np.zeros((1, DIM), np.float32), np.zeros(1, np.float32)])
    strategy = MaxFLStrategy(mandatory_rounds=1, seed=0)
    result = strategy.start(grid=grid(app), initial_arrays=start, num_rounds=3)
    assert list(result.arrays.keys()) == ["0", "1"]
    assert strategy.history[-1]["pool-size"] >= 0 and strategy.history[0]["nodes"] == 4
    assert "loss" in result.evaluate_metrics_clientapp[3]


# ------------------------------------------------------------------ the example's own app
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fmnist-maxfl"


def test_example_client_app_with_synthetic_images(tmp_path, monkeypatch) -> None:
    """examples/fmnist-maxfl's torch ClientApp in plain mode, on random IDX files."""
    from flower_app.datasets.idx import write_idx

    rng = np.random.default_rng(0)
    for split, n in (("train", 400), ("t10k", 100)):
        images = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from fmnist_maxfl.client_app import app
    from fmnist_maxfl.task import Net

    run_config = {
        "local-epochs": 1, "lr": 0.05, "batch-size": 32, "seed": 0, "alpha": 1.0,
        "data-dir": str(tmp_path), "train-examples": 400, "test-examples": 100,
    }  # fmt: skip
    g = LocalGrid(4, run_config, app=app)
    start = ArrayRecord(Net().state_dict())
    strategy = MaxFLStrategy(mandatory_rounds=1, seed=0)
    result = strategy.start(
        grid=g, initial_arrays=start, num_rounds=2, train_config=ConfigRecord({"lr": 0.05})
    )
    Net().load_state_dict(result.arrays.to_torch_state_dict())  # same keys, loads
    assert list(result.arrays.keys()) == list(start.keys())
    assert [r["server-round"] for r in strategy.history] == [1, 2]
    assert all(stored_rho(g.contexts[n]) is not None for n in g.node_ids)
    assert "eval_acc" in result.evaluate_metrics_clientapp[2]


# ------------------------------------------------------------------ Flower's DP wrappers
def test_flowers_dp_wrappers_drive_maxfl_like_fedavg() -> None:
    """Flower's ``DifferentialPrivacy*FixedClipping`` wrap MaxFLStrategy as they wrap FedAvg
    (their own start() loop drives configure_train/aggregate_train): with no noise and a
    loose clip the run is the plain one; with noise the model moves; client-side clipping
    runs with Flower's ``fixedclipping_mod`` on the user's ClientApp."""
    from flwr.clientapp.mod import fixedclipping_mod
    from flwr.serverapp.strategy import (
        DifferentialPrivacyClientSideFixedClipping,
        DifferentialPrivacyServerSideFixedClipping,
    )

    def wrapped(wrapper, app: ClientApp, noise: float):
        inner = MaxFLStrategy(mandatory_rounds=1, seed=3, flexible=False)
        dp = wrapper(inner, noise_multiplier=noise, clipping_norm=100.0, num_sampled_clients=4)
        result = dp.start(grid=grid(app), initial_arrays=initial(), num_rounds=3,
                          train_config=TRAIN)  # fmt: skip
        return as_dict(result.arrays), inner

    _, plain, _ = run(user_app(), flexible=False)
    clean, inner = wrapped(DifferentialPrivacyServerSideFixedClipping, user_app(), 0.0)
    assert inner.external.setup_done  # setup and sampling ran for Flower's loop
    for key, value in as_dict(plain.arrays).items():
        np.testing.assert_allclose(clean[key], value, rtol=1e-6, atol=1e-7)
    noisy, _ = wrapped(DifferentialPrivacyServerSideFixedClipping, user_app(), 0.05)
    moved = max(np.abs(noisy[k] - clean[k]).max() for k in clean if clean[k].dtype.kind == "f")
    assert moved > 1e-4
    client_side, _ = wrapped(
        DifferentialPrivacyClientSideFixedClipping, user_app(mods=[fixedclipping_mod]), 0.0
    )
    for key, value in clean.items():
        np.testing.assert_allclose(client_side[key], value, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ secure aggregation
def test_plain_mode_under_secure_aggregation_keeps_the_users_clientapp() -> None:
    """The user's FedAvg-style ClientApp plus the mod: the nodes sum q_k (w − w_k), q_k,
    F_k(w) and the appeal flags; the model's floating arrays match the plain run within the
    fixed-point error, and no reply the server receives holds a node's model."""
    from flower_app.privacy import SecureAggregation, secure_aggregation_mod

    plain_strategy, plain, _ = run(user_app(), flexible=False)
    strategy = MaxFLStrategy(mandatory_rounds=1, seed=3, flexible=False,
                             secure_aggregation=SecureAggregation())  # fmt: skip
    g = grid(user_app(mods=[secure_aggregation_mod]))
    replies = []
    pull = g.pull_messages
    g.pull_messages = lambda ids: [replies.append(r) or r for r in pull(ids)]
    result = strategy.start(grid=g, initial_arrays=initial(), num_rounds=3, train_config=TRAIN)
    got, want = as_dict(result.arrays), as_dict(plain.arrays)
    for key, value in want.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5)
    rows = [r for r in strategy.history if r["server-round"] >= 1]
    plain_rows = [r for r in plain_strategy.history if r["server-round"] >= 1]
    for r, p in zip(rows, plain_rows, strict=True):
        assert r["secagg-nodes"] == 4 and r["q-sum"] == pytest.approx(p["q-sum"], abs=1e-6)
        assert r["received-loss"] == pytest.approx(p["received-loss"], rel=1e-6)
    trains = [m for m in replies if m.metadata.message_type == "train" and not m.has_error()]
    assert trains and all(set(m.content.array_records) <= {"secagg-vector"} for m in trains)
