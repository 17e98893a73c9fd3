"""The edge-device rehearsal with real data: each SuperNode holds only its exported file.

The session's 2-node rehearsal (``rehearsal_pair``, ``tests/support/deployment.py``: TLS, node
authentication, a database, SuperNodes each in its own network namespace with 1 GiB and half
a core) is given ``python -m flower_app.export``'s files — Fashion-MNIST npz arrays, the
MovieLens rating task's npz samples — one per node. The server reads no client data for
FedSubAvg (``server-data='none'``; MaxFL's server never does). Every run must give what the
direct engine gives for the same seed, which the simulation tests show equals Flower's
simulation (``test_maxfl_engine.py``, ``test_fedsubavg_flwr.py``): the same model digest for
MaxFL on Fashion-MNIST, the same losses for FedSubAvg. No node may be killed for memory
(cgroup OOM kills = 0). FedSM on the nodes' MovieLens-1M files (``server-data='none'``, the
direct engine's S, no OOM kill) is the resumed run of ``test_deploy_failures.py``. Needs
FLOWER_APP_DATA with ml-1m/ and fashion-mnist/ (CI has both); markers ``deploy`` and
``realdata``.
"""

from __future__ import annotations

import pytest

from direct import run_direct
from flower_app.config import AppConfig
from tests.support.deployment import data_root

pytestmark = [pytest.mark.deploy, pytest.mark.realdata]


def _direct(tmp_path, config: dict) -> dict:
    return run_direct(
        AppConfig.from_run_config({**config, "output-dir": str(tmp_path), "run-name": "direct"})
    )


def _no_oom(rehearsal) -> None:
    report = rehearsal.cgroup_report()
    assert all(r["oom-kills"] == 0 for r in report.values()), report
    print("cgroup peaks (MiB):", {k: round(v["cgroup-peak-mib"]) for k, v in report.items()})


MAXFL = {
    "algorithm": "maxfl",
    "dataset": "fmnist",
    "clients-per-round": 5,
    "maxfl-rounds": 2,
    "maxfl-eval-every": 2,  # rounds 0 and 2 (each evaluation: a torch ClientApp per node)
    "seed": 1,
    "round-timeout": 600.0,
}


def test_maxfl_fmnist_on_nodes_with_their_own_files(rehearsal_pair, node_export, tmp_path) -> None:
    root = data_root()
    export = node_export("fmnist", nodes=rehearsal_pair.nodes, **{"data-dir": root})
    rehearsal_pair.provision(export, "npz")
    config = {**MAXFL, "data-dir": str(root)}
    run = rehearsal_pair.federation.run({**config, "run-name": "fmnist-nodes"}, timeout=3600)
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    direct = _direct(tmp_path, config)
    summary = run.summary
    assert summary["model-digest"] == direct["model-digest"]
    assert summary["final"] == pytest.approx(direct["final"])
    _no_oom(rehearsal_pair)


def test_fedsubavg_movielens_rating_on_nodes_with_their_own_files(
    rehearsal_pair, node_export, tmp_path
) -> None:
    root = data_root()
    export = node_export("movielens-rating", nodes=rehearsal_pair.nodes, **{"data-dir": root})
    rehearsal_pair.provision(export, "npz")
    config = {
        "algorithm": "fedsubavg",
        "dataset": "movielens-rating",
        "data-dir": str(root),
        "clients-per-round": 50,
        "fsa-rounds": 2,  # the second round aggregates onto the first's x: enough to compare
        "seed": 2,
        "round-timeout": 300.0,
    }
    run = rehearsal_pair.federation.run(
        {**config, "run-name": "rating-nodes", "server-data": "none"}, timeout=3600
    )
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    direct = _direct(tmp_path, config)
    summary = run.summary
    for key in ("train-loss", "test-loss", "test-accuracy"):
        assert summary[key] == pytest.approx(direct[key], rel=1e-12), key
    assert summary["feature-heat-dispersion"] == direct["feature-heat-dispersion"]
    _no_oom(rehearsal_pair)
