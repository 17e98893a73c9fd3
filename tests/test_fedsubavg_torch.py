"""FedSubAvg on the torch tasks (Sent140 LSTM, Amazon DIN): direct engine against Flower.

Tiny calibrated stand-ins (8 clients) keep this fast. The same run through ``flwr run``
(Flower's simulation engine, 8 SuperNodes, the strategy in plain mode, one client per node)
and through the direct engine must give the same rows: the same clients each round (the
nodes declare their partition ids, so the sample does not depend on the node ids Flower
draws), the same local losses and the same evaluated model, to the bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from direct import run_direct
from direct.fedsubavg_torch import run_torch_direct
from flower_app.algorithms.fedsubavg.named import NamedLayout
from flower_app.algorithms.fedsubavg.torch_engine import (
    TorchLocalConfig,
    TorchRunSpec,
    initial_state,
    load_values,
    local_train,
    model_values,
)
from flower_app.algorithms.fedsubavg.torch_tasks import (
    METRIC_KEYS,
    AmazonTask,
    Sent140Task,
    auc,
)
from flower_app.clients.torch_tasks import TorchTaskClient
from flower_app.config import AppConfig, ConfigError
from flower_app.datasets.amazon import synthetic_amazon
from flower_app.datasets.sent140 import synthetic_sent140
from flower_app.registry import load_runner
from tests.support.local_grid import LocalGrid

N = 8


def _sent140() -> Sent140Task:
    data = synthetic_sent140(seed=0, n_clients=N, n_samples=N * 50, vocab_size=400,
                             target_dispersion=6)  # fmt: skip
    return Sent140Task(data, eval_samples=200)


def _amazon() -> AmazonTask:
    data = synthetic_amazon(seed=0, n_clients=N, n_samples=N * 66, n_items=300,
                            target_dispersion=6, n_categories=5)  # fmt: skip
    return AmazonTask(data, eval_samples=200)


TASKS = {"sent140": _sent140, "amazon": _amazon}

#: the same tiny stand-ins through the app's run_config (load_torch_task scales N, samples,
#: vocabulary / items and the target dispersion as _sent140 / _amazon above); Sent140 with
#: the planted embedding, so the ServerApp and the ClientApps build the same initialisation
RUNS = {
    "sent140": {"algorithm": "fedsubavg", "dataset": "synthetic-sent140", "num-users": N,
                "num-elements": 400, "clients-per-round": 4, "fsa-rounds": 3, "seed": 5,
                "fsa-embedding-init": "planted"},
    "amazon": {"algorithm": "fedadam-sub", "dataset": "synthetic-amazon", "num-users": N,
               "num-elements": 300, "clients-per-round": 3, "fsa-rounds": 2, "seed": 2,
               "fsa-batch-size": 4, "fsa-lr-decay": 0.999, "fsa-clip-norm": 5.0,
               "fsa-weighting": "samples", "fsa-adam-eta": 0.001, "fsa-adam-beta2": 0.999},
}  # fmt: skip


def _rows(folder: Path) -> list[dict]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _config(run: dict, folder: Path, name: str) -> AppConfig:
    return AppConfig.from_run_config({**run, "output-dir": str(folder), "run-name": name})


def test_in_process_flower_grid_equals_the_direct_engine(tmp_path: Path) -> None:
    """The ServerApp's strategy and the real ClientApp (torch tasks) over an in-process grid,
    one node per client: the direct engine's rows, bit for bit (no Ray: the same check
    through Flower's simulation engine runs in CI, below)."""
    run = RUNS["sent140"]
    direct = run_direct(_config(run, tmp_path, "direct"))
    flower = load_runner("fedsubavg").server_run(LocalGrid(N, run), _config(run, tmp_path, "grid"))
    _assert_same_rows(run, tmp_path / "grid", direct)
    assert flower["train-loss"] == direct["train-loss"] != direct["initial-train-loss"]


# one Flower run per task (Ray actors importing torch): CI runs them (``long``); the default
# suite's Flower check of the FedSubAvg family is test_fedsubavg_flwr.py's
@pytest.mark.flwr
@pytest.mark.long
@pytest.mark.parametrize("name", ["sent140", "amazon"])
def test_flwr_run_equals_the_direct_engine(name: str, flower_cli, tmp_path: Path) -> None:
    """One SuperNode per client (partition ids 0..7); Flower's node ids are random."""
    run = RUNS[name]
    result = flower_cli.run(run, num_supernodes=N)
    assert result.status == "finished:completed", result.output
    direct = run_direct(_config(run, tmp_path, "direct"))
    _assert_same_rows(run, result.folder, direct)
    assert result.summary["train-loss"] == direct["train-loss"] != direct["initial-train-loss"]
    assert direct["full-model-bytes"] > direct["client-download-bytes-mean"] > 0


def _assert_same_rows(run: dict, folder: Path, direct: dict) -> None:
    flower, ref = _rows(folder), _rows(Path(direct["run-folder"]))
    assert [r["server-round"] for r in flower] == [r["server-round"] for r in ref]
    assert [r["server-round"] for r in ref] == list(range(run["fsa-rounds"] + 1))
    for got, want in zip(flower, ref, strict=True):
        for key in METRIC_KEYS:
            if key in want:  # the evaluated model: the same to the bit
                assert got[key] == want[key] or (np.isnan(want[key]) and np.isnan(got[key]))
        if "local-train-loss" in want:
            assert got["local-train-loss"] == pytest.approx(want["local-train-loss"], rel=1e-9)
            assert got["clients"] == want["clients"] == run["clients-per-round"]


def test_a_federation_of_the_wrong_size_is_refused() -> None:
    from flwr.app import Context, RecordDict

    from flower_app.registry import load_runner

    cfg = AppConfig.from_run_config(RUNS["sent140"])
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 3},
                      state=RecordDict(), run_config={})  # fmt: skip
    with pytest.raises(ConfigError, match="runs one per node; start 8 SuperNodes"):
        load_runner("fedsubavg").make_client(cfg, context)
    with pytest.raises(ConfigError, match="not supported on the torch tasks"):
        run_direct(AppConfig.from_run_config({**RUNS["sent140"], "secure-aggregation": True}))


def test_local_training_moves_only_the_clients_rows() -> None:
    task = _amazon()
    named = initial_state(task, 0)
    layout = NamedLayout.from_arrays(named, task.sparse_keys)
    model = task.make_model()
    load_values(model, named, {})
    rows = task.client_rows(3)
    local_train(task, model, 3, TorchLocalConfig(batch=4, lr=0.5), seed=0, server_round=1)
    after = model_values(model, {}, list(layout.keys))
    for key in task.sparse_keys:
        moved = np.flatnonzero(np.any(after[key] != named[key], axis=1))
        assert moved.size > 0 and set(moved) <= set(rows[key].tolist()), key


def test_same_seed_same_run_and_another_seed_another() -> None:
    task = _sent140()
    spec = TorchRunSpec("fedavg-sub", rounds=2, clients_per_round=3, seed=1)
    a, b = run_torch_direct(task, spec), run_torch_direct(task, spec)
    c = run_torch_direct(task, TorchRunSpec("fedavg-sub", rounds=2, clients_per_round=3, seed=2))
    assert a[-1]["train-loss"] == b[-1]["train-loss"]
    assert a[-1]["train-loss"] != c[-1]["train-loss"]


def test_central_sgd_runs_and_learns() -> None:
    rows = run_torch_direct(_sent140(), TorchRunSpec("central-sgd", rounds=3, clients_per_round=4,
                                                     seed=0))  # fmt: skip
    assert rows[-1]["train-loss"] < rows[0]["train-loss"]


def test_bad_settings_fail_clearly() -> None:
    task = _sent140()
    with pytest.raises(ValueError, match="proximal_mu"):
        run_torch_direct(task, TorchRunSpec("fedprox-sub", rounds=1, clients_per_round=2))
    with pytest.raises(ValueError, match="algorithm"):
        TorchRunSpec("fedsgd", rounds=1, clients_per_round=2)
    with pytest.raises(ValueError, match="partition-id 8 is not a client"):
        TorchTaskClient(task, N)


def test_auc_matches_pair_counting() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.random(200), 1)  # ties
    pos, neg = s[y == 1], s[y == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auc(y, s) == pytest.approx(pairs / (pos.size * neg.size))
    assert np.isnan(auc(np.ones(5), np.arange(5)))
