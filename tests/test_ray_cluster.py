"""Flower's simulation attached to an existing Ray cluster: a head and a second raylet on loopback.

The SuperLink gets ``RAY_ADDRESS=<head>`` and Flower's Ray backend joins the cluster instead of
starting its own Ray (docs/ray-cluster.md). Both raylets host ``ClientAppActor``s and the result
is the direct engine's, hence a plain local run's (tests/test_flower_engine.py); the slow test
also compares with a local ``flwr run`` directly.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from direct import run_direct
from flower_app.config import AppConfig
from flower_app.simulation import FlwrRun, LocalSimulation
from tests.support.ray_cluster import LoopbackRayCluster

pytestmark = pytest.mark.flwr

CONFIG = {
    "num-users": 400,
    "num-elements": 120,
    "k": 6,
    "clients-per-round": 0.25,
    "elements-per-client": 0.2,
    "seed": 11,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LoopbackRayCluster]:
    # a short private root: Ray's socket paths under it must fit in 107 characters
    root = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    try:
        with LoopbackRayCluster(root, num_nodes=2, num_cpus=1) as cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def attached_run(cluster: LoopbackRayCluster, tmp_path_factory: pytest.TempPathFactory) -> FlwrRun:
    root = tmp_path_factory.mktemp("attached")
    sim = LocalSimulation(root / "home", root / "runs", ray_address=cluster.address)
    try:
        return sim.run(CONFIG, num_supernodes=4)
    finally:
        sim.stop()


@pytest.mark.long
def test_run_attached_to_a_two_raylet_cluster_uses_both_raylets(
    cluster: LoopbackRayCluster, attached_run: FlwrRun, tmp_path: Path
) -> None:
    assert attached_run.status == "finished:completed", attached_run.output
    snapshot = cluster.query()
    nodes = [n for n in snapshot["nodes"] if n["alive"]]
    assert sorted(n["ip"] for n in nodes) == cluster.ips
    assert sum(n["cpus"] for n in nodes) == 2
    # 2 cluster CPUs / client-resources-num-cpus=1 -> a pool of 2 actors, one per raylet
    assert cluster.actors_per_node(snapshot=snapshot) == dict.fromkeys(cluster.ips, 1)

    cfg = AppConfig.from_run_config({**CONFIG, "output-dir": str(tmp_path), "run-name": "d"})
    direct = run_direct(cfg)
    assert attached_run.summary["selected"] == direct["selected"]
    assert attached_run.summary["objective"] == pytest.approx(direct["objective"])


@pytest.mark.slow
def test_run_attached_to_a_cluster_equals_a_local_run(
    cluster: LoopbackRayCluster, attached_run: FlwrRun, flwr_cli: LocalSimulation
) -> None:
    """A real `flwr run` that starts its own Ray instance (what is compared with)."""
    local = flwr_cli.run(CONFIG, num_supernodes=4)
    assert local.status == "finished:completed", local.output
    assert attached_run.summary["selected"] == local.summary["selected"]
    assert attached_run.summary["objective"] == local.summary["objective"]
    # the local run started its own Ray instance: the cluster saw no new actors
    assert cluster.actors_per_node() == dict.fromkeys(cluster.ips, 1)
