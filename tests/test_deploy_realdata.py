"""The edge-device rehearsal with real data: each SuperNode holds only its exported file.

The session's rehearsal (``tests/deployment.py``: TLS, node authentication, a database, 4
SuperNodes each in its own network namespace with 1 GiB and half a core) is given
``python -m flower_app.export``'s files — MovieLens-1M parquet rows, Fashion-MNIST npz
arrays, the MovieLens rating task's npz samples — one per node. The server reads no client
data for FedSM and FedSubAvg (``server-data='none'``; MaxFL's server never does). Every run
must give what the direct engine gives for the same seed, which the simulation tests show
equals Flower's simulation (``test_movielens_fedsm.py``, ``test_maxfl_engine.py``,
``test_fedsubavg_flwr.py``): the same set S for FedSM on MovieLens-1M (k = 10), the same model
digest for MaxFL on Fashion-MNIST, the same losses for FedSubAvg. No node may be killed for
memory (cgroup OOM kills = 0). Needs FLOWER_APP_DATA with ml-1m/ and fashion-mnist/ (CI has
both); markers ``deploy`` and ``realdata``.
"""

from __future__ import annotations

import json

import pytest

from flower_app.config import AppConfig
from flower_app.experiment import run_direct
from tests.deployment import data_root

pytestmark = [pytest.mark.deploy, pytest.mark.realdata]


def _direct(tmp_path, config: dict) -> dict:
    return run_direct(
        AppConfig.from_run_config({**config, "output-dir": str(tmp_path), "run-name": "direct"})
    )


def _no_oom(rehearsal) -> None:
    report = rehearsal.cgroup_report()
    assert all(r["oom-kills"] == 0 for r in report.values()), report
    print("cgroup peaks (MiB):", {k: round(v["cgroup-peak-mib"]) for k, v in report.items()})


#: FedSM Algorithm 1 on MovieLens-1M, k = 10 (also the failure and resume tests' job)
ML1M = {
    "algorithm": "fedsm",
    "dataset": "movielens",
    "k": 10,
    "clients-per-round": 0.1,
    "elements-per-client": 0.1,
    "seed": 5,
    "round-timeout": 300.0,
}


def test_fedsm_movielens_on_nodes_with_their_own_files(rehearsal, node_export, tmp_path):
    root = data_root()
    rehearsal.provision(node_export("movielens", **{"data-dir": root}), "parquet")
    config = {**ML1M, "data-dir": str(root)}
    run = rehearsal.federation.run(
        {**config, "run-name": "ml1m-nodes", "server-data": "none"}, timeout=1800
    )
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    direct = _direct(tmp_path, config)
    summary = run.summary
    assert summary["selected"] == direct["selected"]
    assert summary["objective"] == pytest.approx(direct["objective"], rel=1e-12)
    assert summary["server-data"] == "none" and summary["greedy-objective"] is None
    rows = [json.loads(x) for x in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert not any(r.get("failed-nodes") for r in rows)
    _no_oom(rehearsal)
    print("deployment round times (s):", [round(r["round-time"], 2) for r in rows])


MAXFL = {
    "algorithm": "maxfl",
    "dataset": "fmnist",
    "clients-per-round": 5,
    "maxfl-rounds": 2,
    "maxfl-eval-every": 1,
    "seed": 1,
    "round-timeout": 600.0,
}


def test_maxfl_fmnist_on_nodes_with_their_own_files(rehearsal, node_export, tmp_path) -> None:
    root = data_root()
    rehearsal.provision(node_export("fmnist", **{"data-dir": root}), "npz")
    config = {**MAXFL, "data-dir": str(root)}
    run = rehearsal.federation.run({**config, "run-name": "fmnist-nodes"}, timeout=3600)
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    direct = _direct(tmp_path, config)
    summary = run.summary
    assert summary["model-digest"] == direct["model-digest"]
    assert summary["final"] == pytest.approx(direct["final"])
    _no_oom(rehearsal)


def test_fedsubavg_movielens_rating_on_nodes_with_their_own_files(
    rehearsal, node_export, tmp_path
) -> None:
    root = data_root()
    rehearsal.provision(node_export("movielens-rating", **{"data-dir": root}), "npz")
    config = {
        "algorithm": "fedsubavg",
        "dataset": "movielens-rating",
        "data-dir": str(root),
        "clients-per-round": 50,
        "fsa-rounds": 3,
        "seed": 2,
        "round-timeout": 300.0,
    }
    run = rehearsal.federation.run(
        {**config, "run-name": "rating-nodes", "server-data": "none"}, timeout=3600
    )
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    direct = _direct(tmp_path, config)
    summary = run.summary
    for key in ("train-loss", "test-loss", "test-accuracy"):
        assert summary[key] == pytest.approx(direct[key], rel=1e-12), key
    assert summary["feature-heat-dispersion"] == direct["feature-heat-dispersion"]
    _no_oom(rehearsal)
