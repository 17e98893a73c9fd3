"""Node-local data: export per-node files + manifest; nodes read only their file; a server
with ``server-data = "none"`` reads no client data and picks the same S."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flwr.app import Context, RecordDict
from maxfl_configs import SMALL

from flower_app.clients.cohorts import cohort_range
from flower_app.config import AppConfig, ConfigError
from flower_app.export import export_dataset, main
from flower_app.node_data import NodeDataError, load_node_rows, read_groups, sha256_file
from flower_app.problems import load_problem
from flower_app.registry import load_runner
from flower_app.strategies.discovery import DiscoveryError
from tests.support.local_grid import LocalGrid

#: a small synthetic facility-location instance (the one exported and simulated)
INSTANCE = {"dataset": "synthetic-facility-location", "num-users": 60, "num-elements": 30}
NODES = 3


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export")
    args = ["--dataset", INSTANCE["dataset"], "--num-users", "60", "--num-elements", "30"]
    assert main([*args, "--num-partitions", str(NODES), "--out", str(out)]) == 0
    return out


def _data_path(folder: Path, ext: str = "parquet"):
    return lambda i: {"data-path": str(folder / f"node-{i}.{ext}")}


def _run(run_config: dict, node_config=None) -> dict:
    cfg = AppConfig.from_run_config(run_config)
    grid = LocalGrid(NODES, run_config, node_config=node_config)
    return load_runner(cfg.algorithm).server_run(grid, cfg)


def test_export_writes_the_cohort_split_and_a_manifest(export) -> None:
    manifest = json.loads((export / "manifest.json").read_text())
    problem = load_problem(AppConfig.from_run_config(INSTANCE))
    assert (manifest["n-users"], manifest["n-elements"]) == (60, 30)
    assert manifest["num-partitions"] == NODES
    assert sum(f["rows"] for f in manifest["files"]) == problem.objective.values.nnz
    for p, entry in enumerate(manifest["files"]):
        path = export / entry["file"]
        assert entry["sha256"] == sha256_file(path)
        assert (entry["first-user"], entry["num-users"]) == cohort_range(60, p, NODES)
        frame = pd.read_parquet(path)
        assert list(frame.columns) == ["user", "item", "value"]
        first, count = cohort_range(60, p, NODES)
        block = problem.objective.values[first : first + count].toarray()
        rebuilt = np.zeros_like(block)
        rebuilt[frame["user"].to_numpy() - first, frame["item"].to_numpy()] = frame["value"]
        assert np.array_equal(block, rebuilt)  # float64 values, bit for bit
    groups = read_groups(export / "element-groups.csv", 30)
    assert np.array_equal(groups, problem.element_groups)


@pytest.mark.parametrize(
    "config",
    [
        {"algorithm": "fedsm", "k": 5, "clients-per-round": 0.5},
        {"algorithm": "fedsm", "k": 5, "fedsm-mode": "alg2", "clients-per-round": 0.5},
        {
            "algorithm": "fedsm",
            "k": 4,
            "fedsm-mode": "amplified",
            "fedsm-eta": 0.5,
            "clients-per-round": 0.5,
        },
        {"algorithm": "fedsm", "k": 6, "matroid": "partition", "partition-capacity": 1},
        {"algorithm": "fedcg", "k": 4, "fedcg-rounds": 5, "clients-per-round": 0.5},
        {
            "algorithm": "fedcg-plus",
            "k": 3,
            "fedcg-rounds": 4,
            "matroid": "partition",
            "partition-capacity": 1,
            "fedcg-local-steps": 2,
        },
        {"algorithm": "fed-discrete-greedy", "k": 4, "dgreedy-kappa": 4.0},
    ],
    ids=[
        "fedsm-alg1",
        "fedsm-alg2",
        "fedsm-amplified",
        "fedsm-partition",
        "fedcg",
        "fedcg-plus-partition",
        "discrete-greedy",
    ],
)
def test_node_files_and_no_server_data_give_the_same_set(tmp_path, export, config) -> None:
    base = {**INSTANCE, **config, "seed": 3, "output-dir": str(tmp_path)}
    reference = _run({**base, "run-name": "full"})
    deployed = {
        **base,
        "run-name": "none",
        "server-data": "none",
        "element-groups": str(export / "element-groups.csv"),
    }
    summary = _run(deployed, node_config=_data_path(export))
    assert summary["selected"] == reference["selected"]
    assert summary["objective"] == pytest.approx(reference["objective"], rel=1e-12)
    assert summary["greedy-objective"] is None and summary["greedy-reference"] == "off"
    assert summary["server-data"] == "none"
    config_json = json.loads((Path(summary["run-folder"]) / "config.json").read_text())
    assert config_json["instance"]["n-users"] == 60
    load_runner(config["algorithm"]).summary_line(summary)  # prints without a ratio


def test_a_tampered_file_is_refused_naming_it(tmp_path, export) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("manifest.json", "node-0.parquet", "node-1.parquet", "node-2.parquet"):
        (bad / name).write_bytes((export / name).read_bytes())
    frame = pd.read_parquet(bad / "node-1.parquet")
    frame.loc[0, "value"] += 1.0
    frame.to_parquet(bad / "node-1.parquet", index=False)
    load_node_rows(bad / "node-0.parquet")  # the others still load
    with pytest.raises(NodeDataError, match=r"node-1\.parquet: sha256 .* does not match"):
        load_node_rows(bad / "node-1.parquet")
    run_config = {
        **INSTANCE, "k": 3, "server-data": "none", "discovery-timeout": 1.0,
        "output-dir": str(tmp_path),
    }  # fmt: skip
    with pytest.raises(DiscoveryError, match=r"node-1\.parquet"):
        _run(run_config, node_config=_data_path(bad))


def test_a_node_file_must_fit_the_node_and_the_run(export) -> None:
    runner = load_runner("fedsm")
    cfg = AppConfig.from_run_config({**INSTANCE})

    def context(node_config: dict) -> Context:
        return Context(1, 1, node_config, RecordDict(), {})

    path = str(export / "node-2.parquet")
    client = runner.make_client(cfg, context({"data-path": path}))
    assert client.get_properties({})["first-user"] == cohort_range(60, 2, NODES)[0]
    with pytest.raises(NodeDataError, match="partition-id=2 num-partitions=3"):
        runner.make_client(cfg, context({"data-path": path, "partition-id": 1,
                                         "num-partitions": 3}))  # fmt: skip
    other = AppConfig.from_run_config({"dataset": "synthetic-dblp"})
    with pytest.raises(NodeDataError, match="synthetic-facility-location"):
        runner.make_client(other, context({"data-path": path}))
    with pytest.raises(NodeDataError, match="not found"):
        runner.make_client(cfg, context({"data-path": str(export / "node-9.parquet")}))


def test_server_data_none_needs_groups_for_a_partition_matroid_and_a_submodular_family() -> None:
    from flower_app.server_data import remote_matroid

    cfg = AppConfig.from_run_config({"server-data": "none", "matroid": "partition"})
    with pytest.raises(ConfigError, match="element-groups"):
        remote_matroid(cfg, 30)
    with pytest.raises(ConfigError, match="server-data"):
        AppConfig.from_run_config(
            {"algorithm": "maxfl", "dataset": "fmnist", "server-data": "none"}
        )


def test_export_dataset_names_what_it_exports_for_an_unknown_dataset(tmp_path) -> None:
    with pytest.raises(ValueError, match="submodular datasets.*MaxFL's.*FedSubAvg's"):
        export_dataset("no-such-dataset", 2, str(tmp_path))
    with pytest.raises(ConfigError, match="central-sgd"):
        AppConfig.from_run_config(
            {"algorithm": "central-sgd", "dataset": "synthetic-movielens-rating",
             "server-data": "none"}
        )  # fmt: skip


#: a small MaxFL run on the EMNIST stand-in (the shared one, shorter local work, α = 0.3)
MAXFL = {
    **{k: v for k, v in SMALL.items() if k not in ("maxfl-mandatory-rounds", "seed")},
    "maxfl-local-steps": 2,
    "maxfl-solo-steps": 3,
    "maxfl-alpha": 0.3,
}


def test_maxfl_nodes_that_hold_only_their_npz_train_the_same_model(tmp_path) -> None:
    out = tmp_path / "export"
    args = ["--dataset", "synthetic-emnist", "--num-users", "6", "--num-partitions", "3"]
    assert main([*args, "--out", str(out), "--run-config", "maxfl-alpha=0.3"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["n-seen"], manifest["n-unseen"], manifest["n-users"]) == (6, 6, 12)
    assert [f["num-users"] for f in manifest["files"]] == [4, 4, 4]
    base = {**MAXFL, "output-dir": str(tmp_path)}
    reference = _run({**base, "run-name": "full"})
    summary = _run({**base, "run-name": "files"}, node_config=_data_path(out, "npz"))
    assert summary["model-digest"] == reference["model-digest"]
    assert summary["final"] == reference["final"]
    with pytest.raises(NodeDataError, match="maxfl-alpha=0.5"):  # another split than the export's
        runner = load_runner("maxfl")
        cfg = AppConfig.from_run_config({**MAXFL, "maxfl-alpha": 0.5})
        runner.make_client(cfg, Context(1, 1, _data_path(out, "npz")(0), RecordDict(), {}))


@pytest.mark.flwr
@pytest.mark.slow  # ~3 min on 2 cores: every message starts a ClientApp process
def test_real_supernodes_that_hold_only_their_file(tmp_path, export) -> None:
    """A SuperLink and 3 SuperNodes started with data-path only; the server reads no data."""
    from conftest import Deployment

    config = {**INSTANCE, "k": 4, "seed": 3, "clients-per-round": 0.5}
    direct = _run({**config, "output-dir": str(tmp_path), "run-name": "grid"})
    (tmp_path / "deployment").mkdir()
    dep = Deployment(
        tmp_path / "deployment",
        NODES,
        node_config=lambda p: f'data-path="{export / f"node-{p}.parquet"}"',
    )
    try:
        run = dep.run({**config, "server-data": "none", "round-timeout": 120.0})
    finally:
        dep.stop()
    assert run.status == "finished:completed", run.output
    assert run.summary["selected"] == direct["selected"]
    assert run.summary["objective"] == pytest.approx(direct["objective"], rel=1e-12)
    assert run.summary["greedy-reference"] == "off"


def test_a_node_reads_its_parquet_once_then_its_binary_cache(tmp_path, export, monkeypatch) -> None:
    """Flower starts a ClientApp process per message: the second process must load the node's
    rows from the binary cache, without pyarrow, identical to the checked parquet read; a
    changed file is read (and checked) again."""
    monkeypatch.setenv("FLOWER_APP_CACHE", str(tmp_path / "cache"))
    node = tmp_path / "nodes"
    node.mkdir()
    for f in export.iterdir():
        (node / f.name).write_bytes(f.read_bytes())
    probe = (
        "import sys, numpy as np; from flower_app.node_data import load_node_rows; "
        f"r = load_node_rows({str(node / 'node-1.parquet')!r}); v = r.objective.values; "
        "print(int('pyarrow' in sys.modules), r.first_user, v.nnz, repr(float(v.sum())))"
    )

    def fresh_process() -> list[str]:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True, env={**os.environ})  # fmt: skip
        return out.stdout.split()

    first, second = fresh_process(), fresh_process()
    assert first[0] == "1" and second[0] == "0"  # parquet read once, then the cache
    assert first[1:] == second[1:]
    direct = load_node_rows(node / "node-1.parquet")
    assert second[1:] == [str(direct.first_user), str(direct.objective.values.nnz),
                          repr(float(direct.objective.values.sum()))]  # fmt: skip
    assert len(list((tmp_path / "cache" / "node-data").glob("*.npz"))) == 1
    # a changed file gets a new key: read and checked again (here: refused, tampered)
    path = node / "node-1.parquet"
    path.write_bytes(path.read_bytes()[:-8] + b"tampered")
    with pytest.raises(subprocess.CalledProcessError) as err:
        fresh_process()
    assert "sha256" in err.value.stderr or "node-1.parquet" in err.value.stderr


#: a small FedSubAvg run on the synthetic MovieLens rating stand-in
FSA = {
    "dataset": "synthetic-movielens-rating",
    "num-users": 60,
    "num-elements": 40,
    "clients-per-round": 10,
    "fsa-rounds": 5,
    "seed": 4,
}


@pytest.mark.parametrize("algorithm", ["fedsubavg", "fedadam-sub"])
def test_fedsubavg_nodes_with_their_own_files_and_no_server_data(tmp_path, algorithm) -> None:
    """Each node loads only its npz (its users' samples as model rows); the server reads no
    data; the federated train loss, test loss and accuracy are the pooled ones."""
    out = tmp_path / "export"
    args = ["--dataset", FSA["dataset"], "--num-users", "60", "--num-elements", "40"]
    assert main([*args, "--num-partitions", str(NODES), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["family"] == "fedsubavg" and manifest["n-test-unattributed"] == 0
    base = {**FSA, "algorithm": algorithm, "output-dir": str(tmp_path)}
    reference = _run({**base, "run-name": "full"})
    summary = _run(
        {**base, "run-name": "none", "server-data": "none"}, node_config=_data_path(out, "npz")
    )
    assert summary["server-data"] == "none"
    for key in ("initial-train-loss", "train-loss", "test-loss", "test-accuracy"):
        assert summary[key] == pytest.approx(reference[key], rel=1e-12), key
    assert summary["train-loss-by-round"] == pytest.approx(reference["train-loss-by-round"],
                                                           rel=1e-12)  # fmt: skip
    assert summary["feature-heat-dispersion"] == reference["feature-heat-dispersion"]
    assert summary["bytes-up"] == reference["bytes-up"]
    # a node file of another task is refused by name
    runner = load_runner("fedsubavg")
    other = AppConfig.from_run_config({**FSA, "algorithm": "fedsubavg", "data-seed": 1})
    with pytest.raises(NodeDataError, match="data-seed=1"):
        runner.make_client(other, Context(1, 1, _data_path(out, "npz")(0), RecordDict(), {}))
