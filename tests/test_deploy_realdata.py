"""A real deployment on loopback with real data: each SuperNode holds only its exported file.

Certificates and node keys are made, a SuperLink starts with TLS, node authentication and a
database, and 4 SuperNodes each get ``data-path`` = their own file of
``python -m flower_app.export`` (MovieLens-1M parquet rows; Fashion-MNIST npz arrays; the
MovieLens rating task's npz samples). The server reads no client data for FedSM and FedSubAvg
(``server-data='none'``). Every run must give what the direct engine gives for the same seed
(which the simulation tests show equals Flower's simulation): the same set S for FedSM on
MovieLens-1M (k = 10), the same model digest for MaxFL on Fashion-MNIST, the same losses for
FedSubAvg on the MovieLens rating task. Needs FLOWER_APP_DATA with ml-1m/ and fashion-mnist/
(CI has both); markers ``deploy`` and ``realdata``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flower_app.config import AppConfig
from flower_app.deploy import SecureFederation
from flower_app.experiment import run_direct
from flower_app.export import main as export_main

pytestmark = [pytest.mark.deploy, pytest.mark.realdata]

NODES = 4


def _data_root() -> Path:
    root = Path(os.environ.get("FLOWER_APP_DATA", ""))
    if not os.environ.get("FLOWER_APP_DATA") or not (root / "ml-1m" / "ratings.dat").is_file():
        pytest.fail("set FLOWER_APP_DATA to a folder holding ml-1m/ and fashion-mnist/")
    return root


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = _data_root()
    out = tmp_path_factory.mktemp("export")
    folders = {"movielens": out / "ml1m", "fmnist": out / "fmnist",
               "movielens-rating": out / "ml1m-rating"}  # fmt: skip
    for dataset, folder in folders.items():
        args = ["--dataset", dataset, "--data-dir", str(root), "--num-partitions", str(NODES)]
        assert export_main([*args, "--out", str(folder)]) == 0
    return folders


@pytest.fixture
def deploy(tmp_path: Path) -> Iterator[Callable[[Path, str], SecureFederation]]:
    """Start a secure federation whose node i holds only ``folder/node-i.ext``."""
    started: list[SecureFederation] = []

    def start(folder: Path, ext: str) -> SecureFederation:
        fed = SecureFederation(tmp_path / "federation", NODES)
        started.append(fed)
        fed.start(node_config=lambda i: {"data-path": str(folder / f"node-{i}.{ext}")})
        rows = fed.wait_online(timeout=180)  # raises with the logs of a node not online
        assert sum(str(r.get("status", "")).lower() == "online" for r in rows) == NODES
        return fed

    try:
        yield start
    finally:
        for fed in started:
            fed.stop()


def test_fedsm_movielens_on_nodes_with_their_own_files(deploy, exported, tmp_path) -> None:
    federation = deploy(exported["movielens"], "parquet")
    root = _data_root()
    config = {
        "algorithm": "fedsm",
        "dataset": "movielens",
        "data-dir": str(root),
        "k": 10,
        "clients-per-round": 0.1,
        "elements-per-client": 0.1,
        "seed": 5,
        "round-timeout": 120.0,
    }
    run = federation.run(
        {**config, "run-name": "ml1m-nodes", "server-data": "none"}, timeout=1200
    )
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    direct = run_direct(
        AppConfig.from_run_config({**config, "output-dir": str(tmp_path), "run-name": "direct"})
    )
    summary = run.summary
    assert summary["selected"] == direct["selected"]
    assert summary["objective"] == pytest.approx(direct["objective"], rel=1e-12)
    assert summary["server-data"] == "none" and summary["greedy-objective"] is None
    rows = [json.loads(x) for x in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert not any(r.get("failed-nodes") for r in rows)
    print("deployment round times (s):", [round(r["round-time"], 2) for r in rows])


def test_maxfl_fmnist_on_nodes_with_their_own_files(deploy, exported, tmp_path) -> None:
    federation = deploy(exported["fmnist"], "npz")
    root = _data_root()
    config = {
        "algorithm": "maxfl",
        "dataset": "fmnist",
        "data-dir": str(root),
        "clients-per-round": 5,
        "maxfl-rounds": 2,
        "maxfl-eval-every": 1,
        "seed": 1,
        "round-timeout": 300.0,
    }
    run = federation.run({**config, "run-name": "fmnist-nodes"}, timeout=1800)
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    direct = run_direct(
        AppConfig.from_run_config({**config, "output-dir": str(tmp_path), "run-name": "direct"})
    )
    summary = run.summary
    assert summary["model-digest"] == direct["model-digest"]
    assert summary["final"] == pytest.approx(direct["final"])


def test_fedsubavg_movielens_rating_on_nodes_with_their_own_files(
    deploy, exported, tmp_path
) -> None:
    federation = deploy(exported["movielens-rating"], "npz")
    root = _data_root()
    config = {
        "algorithm": "fedsubavg",
        "dataset": "movielens-rating",
        "data-dir": str(root),
        "clients-per-round": 50,
        "fsa-rounds": 3,
        "seed": 2,
        "round-timeout": 300.0,
    }
    run = federation.run({**config, "run-name": "rating-nodes", "server-data": "none"},
                         timeout=1800)  # fmt: skip
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    direct = run_direct(
        AppConfig.from_run_config({**config, "output-dir": str(tmp_path), "run-name": "direct"})
    )
    summary = run.summary
    for key in ("train-loss", "test-loss", "test-accuracy"):
        assert summary[key] == pytest.approx(direct[key], rel=1e-12), key
    assert summary["feature-heat-dispersion"] == direct["feature-heat-dispersion"]
