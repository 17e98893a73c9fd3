"""FedSubAvg's cohort strategy over Flower's Message API (in-process grid, real ClientApp)
vs direct."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.supercore.task_identity import TaskIdentity

from direct.fedsubavg import direct_run, run_direct_rounds
from flower_app.algorithms.fedsubavg.core import (
    FeatureHeat,
    LocalConfig,
    RunSpec,
    full_heat,
    make_server_update,
)
from flower_app.config import AppConfig, ConfigError
from flower_app.registry import load_runner
from flower_app.runners.fedsubavg import load_task
from flower_app.strategies.cohort.fedsubavg import FedSubAvgCohorts
from flower_app.strategies.discovery import discover_cohorts
from tests.support.local_grid import LocalGrid

SMALL = {
    "algorithm": "fedsubavg",
    "dataset": "synthetic-movielens-rating",
    "num-users": 45,
    "num-elements": 40,
    "clients-per-round": 8,
    "fsa-rounds": 4,
    "seed": 5,
}


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 1
    TaskIdentity.task_id = 1


def _cfg(**extra) -> AppConfig:
    return AppConfig.from_run_config({**SMALL, **extra})


def _strategy(algorithm: str, cfg: AppConfig, **kwargs) -> FedSubAvgCohorts:
    task = load_task(cfg)
    if algorithm == "fedprox-sub":
        kwargs.setdefault("local", LocalConfig(proximal_mu=0.01))  # the paper's μ
    return FedSubAvgCohorts(
        algorithm, task.n_clients, task.n_params, cfg.clients_per_round, seed=cfg.seed, **kwargs
    )


def _rounds(cfg: AppConfig) -> int:
    return int(cfg.get("fsa-rounds"))


@pytest.mark.parametrize(
    ("algorithm", "kwargs"),
    [
        ("fedsubavg", {}),
        ("fedsubavg", {"weighting": "samples"}),
        ("fedavg-sub", {}),
        ("fedprox-sub", {}),
        ("fedadam-sub", {"weighting": "samples"}),
        ("scaffold-sub", {}),
    ],
)
def test_strategy_over_message_api_equals_direct_engine(algorithm, kwargs) -> None:
    cfg = _cfg(algorithm=algorithm)
    task = load_task(cfg)
    strategy = _strategy(algorithm, cfg, **kwargs)
    strategy.start(LocalGrid(3, cfg.to_dict()), num_rounds=_rounds(cfg))
    local = LocalConfig(proximal_mu=0.01 if algorithm == "fedprox-sub" else 0.0)
    spec = RunSpec(
        algorithm, 4, 8, seed=5, local=local, weighting=kwargs.get("weighting", "clients")
    )
    x, history, heat = run_direct_rounds(task, spec)
    np.testing.assert_allclose(strategy.x, x, rtol=1e-9, atol=1e-12)
    assert np.abs(x).max() > 0
    assert np.array_equal(strategy.heat.clients, heat.clients)  # counted, not read
    assert np.array_equal(strategy.heat.samples, heat.samples)
    for fl, di in zip(strategy.history, history, strict=True):
        assert fl["clients"] == di["clients"] == 8 and fl["bad-replies"] == 0
        assert fl["bytes-down-client-mean"] == di["bytes-down-client-mean"]
        assert fl["bytes-down-client-max"] == di["bytes-down-client-max"]
        assert fl["union-rows"] == di["union-rows"]


def test_result_does_not_depend_on_how_users_are_split_over_nodes() -> None:
    cfg = _cfg()
    models = []
    for nodes in (1, 4, 45):
        strategy = _strategy("fedsubavg", cfg)
        strategy.start(LocalGrid(nodes, cfg.to_dict()), num_rounds=_rounds(cfg))
        models.append(strategy.x)
        assert max(r["nodes"] for r in strategy.history) <= min(nodes, 8)
    np.testing.assert_allclose(models[0], models[1], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(models[0], models[2], rtol=1e-9, atol=1e-12)


def _rows_reply(msg: Message, rows: np.ndarray, sums: np.ndarray, n: int) -> Message:
    return Message(
        RecordDict(
            {
                "arrays": ArrayRecord({"0": Array(rows), "1": Array(sums)}),
                "metrics": MetricRecord({"num-examples": n, "weight-sum": float(n)}),
            }
        ),
        reply_to=msg,
    )


@pytest.mark.parametrize(
    "attack",
    ["outside", "nan", "shape", "count", "error", "dtype", "three-arrays"],
)
def test_bad_replies_are_rejected_counted_and_left_out(attack) -> None:
    cfg = _cfg(**{"fsa-rounds": 1})
    task = load_task(cfg)
    grid = LocalGrid(3, cfg.to_dict())
    victim = grid.node_ids[1]

    def tamper(msg: Message, reply: Message) -> Message:
        if msg.metadata.dst_node_id != victim or msg.metadata.message_type != "train":
            return reply
        rows = reply.content["arrays"]["0"].numpy()
        sums = reply.content["arrays"]["1"].numpy()
        n = int(reply.content["metrics"]["num-examples"])
        if attack == "outside":
            extra = np.setdiff1d(np.arange(task.n_params), rows)[:1]
            rows = np.sort(np.concatenate([rows, extra]))
            sums = np.zeros(rows.size)
        elif attack == "nan":
            sums = sums.copy()
            sums[0] = np.nan
        elif attack == "shape":
            sums = sums[:-1]
        elif attack == "count":
            n += 1
        elif attack == "error":
            return Message(Error(code=2, reason="boom"), reply_to=msg)
        elif attack == "dtype":
            rows = rows.astype(np.float64)
        elif attack == "three-arrays":
            rec = ArrayRecord({"0": Array(rows), "1": Array(sums), "2": Array(sums)})
            return Message(
                RecordDict(
                    {
                        "arrays": rec,
                        "metrics": MetricRecord({"num-examples": n, "weight-sum": float(n)}),
                    }
                ),
                reply_to=msg,
            )
        return _rows_reply(msg, rows, sums, n)

    grid.tamper = tamper
    strategy = _strategy("fedsubavg", cfg)
    strategy.start(grid, num_rounds=_rounds(cfg))
    row = strategy.history[0]
    assert row["bad-replies"] == 1 and strategy.bad_replies == 1
    assert np.all(np.isfinite(strategy.x))
    # the same round without the victim's users: the aggregate of the other nodes only
    honest = _strategy("fedsubavg", cfg)
    honest_grid = LocalGrid(3, cfg.to_dict())
    honest_grid.tamper = lambda msg, reply: (
        Message(Error(code=2, reason="left out"), reply_to=msg)
        if msg.metadata.dst_node_id == victim and msg.metadata.message_type == "train"
        else reply
    )
    honest.start(honest_grid, num_rounds=_rounds(cfg))
    np.testing.assert_array_equal(strategy.x, honest.x)
    assert row["clients"] == honest.history[0]["clients"] < 8


def test_victim_users_are_not_counted_in_k() -> None:
    cfg = _cfg(**{"fsa-rounds": 1})
    grid = LocalGrid(3, cfg.to_dict())
    victim = grid.node_ids[0]
    grid.tamper = lambda msg, reply: (
        Message(Error(code=2, reason="down"), reply_to=msg)
        if msg.metadata.dst_node_id == victim and msg.metadata.message_type == "train"
        else reply
    )
    strategy = _strategy("fedsubavg", cfg)
    strategy.start(grid, num_rounds=_rounds(cfg))
    row = strategy.history[0]
    assert row["bad-replies"] == 1 and 0 < row["clients"] < 8


def test_bad_index_set_reply_is_counted() -> None:
    cfg = _cfg(**{"fsa-rounds": 1})
    grid = LocalGrid(2, cfg.to_dict())

    def tamper(msg: Message, reply: Message) -> Message:
        if (
            msg.metadata.message_type == "query.submodel"
            and msg.metadata.dst_node_id == grid.node_ids[0]
        ):
            props = dict(reply.content["properties"])
            props["offsets"] = props["offsets"][:-1]
            return Message(RecordDict({"properties": ConfigRecord(props)}), reply_to=msg)
        return reply

    grid.tamper = tamper
    strategy = _strategy("fedsubavg", cfg)
    strategy.start(grid, num_rounds=_rounds(cfg))
    assert strategy.history[0]["bad-replies"] == 1
    assert strategy.history[0]["nodes"] <= 1


def test_client_refuses_rows_that_are_not_its_submodel() -> None:
    cfg = _cfg()
    runner = load_runner("fedsubavg")
    ctx = LocalGrid(2, cfg.to_dict()).contexts[1000]
    client = runner.make_client(cfg, ctx)
    users = np.array([0, 1])
    props = client.get_properties({"kind": "submodel", "users": [0, 1]})
    rows = np.asarray(props["rows"], dtype=np.int32)
    offsets = np.asarray(props["offsets"], dtype=np.int64)
    config = {
        "server-round": 1,
        "seed": 0,
        "local-iters": 2,
        "batch-size": 5,
        "lr": 0.1,
        "proximal-mu": 0.0,
        "weighting": "clients",
    }
    out, n, _ = client.fit([users, offsets, rows, np.zeros(rows.size)], config)
    assert n == 2 and set(out[0]).issubset(set(rows))
    wrong = rows.copy()
    wrong[0] += 1
    with pytest.raises(ValueError, match="not the users' submodels"):
        client.fit([users, offsets, wrong, np.zeros(rows.size)], config)
    with pytest.raises(ValueError, match="cohort"):
        client.fit([np.array([40]), offsets, rows, np.zeros(rows.size)], config)
    with pytest.raises(ValueError, match="finite"):
        client.fit([users, offsets, rows, np.full(rows.size, np.inf)], config)


def test_counting_round_equals_the_full_heat() -> None:
    cfg = _cfg()
    task = load_task(cfg)
    grid = LocalGrid(5, cfg.to_dict())
    strategy = _strategy("fedsubavg", cfg)
    strategy.cohorts = discover_cohorts(grid, task.n_clients, task.n_params, timeout=5)
    heat = strategy.count_heat(grid)
    ref = full_heat(task)
    assert np.array_equal(heat.clients, ref.clients) and heat.n_samples == ref.n_samples
    assert isinstance(heat, FeatureHeat)
    assert make_server_update("fedsubavg", task.n_params, task.n_clients, heat) is not None


def test_k_above_n_fails_before_round_1(tmp_path) -> None:
    with pytest.raises(ValueError, match="exceeds the 45 clients"):
        _strategy("fedsubavg", _cfg(**{"clients-per-round": 46}))
    cfg = _cfg(**{"clients-per-round": 46, "output-dir": str(tmp_path), "run-name": "bad"})
    with pytest.raises(ConfigError, match="exceeds the 45 clients"):
        direct_run(cfg)
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"fsa-weighting": "users"}, "'fsa-weighting' = 'users' is not known"),
        ({"fsa-lr": 0}, "'fsa-lr' = 0.0: must be > 0"),
        ({"fsa-rounds": 2.5}, "'fsa-rounds' = 2.5: expected an integer"),
        ({"fsa-adam-beta2": 1.0}, "'fsa-adam-beta2' = 1.0: must be < 1"),
    ],
)
def test_bad_family_keys_are_named(override, match) -> None:
    from flower_app.runners.fedsubavg import run_spec

    with pytest.raises(ConfigError, match=match):
        run_spec(_cfg(**override))


def test_server_run_writes_the_run_folder_like_direct_run(tmp_path) -> None:
    runner = load_runner("fedsubavg")
    base = {**SMALL, "output-dir": str(tmp_path)}
    flower_cfg = AppConfig.from_run_config({**base, "run-name": "flower"})
    summary = runner.server_run(LocalGrid(3, flower_cfg.to_dict()), flower_cfg)
    direct = direct_run(AppConfig.from_run_config({**base, "run-name": "direct"}))
    assert summary["engine"] == "flower" and direct["engine"] == "direct"
    np.testing.assert_allclose(
        summary["train-loss-by-round"], direct["train-loss-by-round"], rtol=1e-9
    )
    assert summary["feature-heat-dispersion"] == direct["feature-heat-dispersion"]
    rows = [
        json.loads(x) for x in (tmp_path / "flower" / "metrics.jsonl").read_text().split("\n") if x
    ]
    assert [r["server-round"] for r in rows] == [1, 2, 3, 4]
    assert "fedsubavg on synthetic-movielens-rating" in runner.summary_line(summary)
    central = direct_run(
        AppConfig.from_run_config({**base, "algorithm": "central-sgd", "run-name": "c"})
    )
    assert central["min-train-loss"] < central["initial-train-loss"]


@pytest.mark.parametrize(
    ("algorithm", "losses", "abs_sum"),
    [
        (
            "fedsubavg",
            [0.6753308423141718, 0.6695365015104724, 0.6628518142343283, 0.6589597582033335],
            16.49113033299954,
        ),
        (
            "fedadam-sub",
            [0.7907059834802478, 0.606271997174804, 0.6996571681587143, 0.6561800224436283],
            158.64932184738996,
        ),
    ],
)
def test_cohort_mode_keeps_the_numbers_recorded_before_the_redesign(
    algorithm, losses, abs_sum
) -> None:
    """Seeded cohort-mode run (SMALL, 3 nodes) computed with the hand-written start() loop."""
    from flower_app.algorithms.fedsubavg.core import Evaluator

    cfg = _cfg()
    evaluate = Evaluator(load_task(cfg))
    strategy = _strategy(algorithm, cfg)
    strategy.start(
        LocalGrid(3, cfg.to_dict()),
        initial_arrays=ArrayRecord({"x": Array(np.zeros(load_task(cfg).n_params))}),
        num_rounds=4,
        evaluate_fn=lambda t, arrays: MetricRecord(
            {k: float(v) for k, v in evaluate(arrays["x"].numpy()).items()}
        ),
    )
    got = [r["train-loss"] for r in strategy.history if r["server-round"] > 0]
    np.testing.assert_allclose(got, losses, rtol=1e-12)
    np.testing.assert_allclose(float(np.abs(strategy.x).sum()), abs_sum, rtol=1e-12)
