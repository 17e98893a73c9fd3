"""Deployment with TLS, SuperNode authentication and a persistent database on loopback.

Certificates and node keys from :mod:`flower_app.deploy`, ``flower-superlink --ssl-*
--enable-supernode-auth --database``, keys registered with ``flwr supernode register``,
3 ``flower-supernode --root-certificates --auth-supernode-private-key`` processes, and the
app's FedSM job through ``flwr run . secure`` (a ``config.toml`` connection with
``root-certificates``). Deselected by default; ``-m deploy`` or FLOWER_APP_REALDATA=1 (CI).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from flower_app.config import AppConfig
from flower_app.deploy import PeakRSS, SecureFederation, make_node_keys
from flower_app.deploy.processes import BIN
from flower_app.experiment import run_direct

pytestmark = pytest.mark.deploy

NUM_NODES = 3
#: the default FedSM job (algorithm, dataset, matroid, rounding from pyproject) on a small
#: instance: deployment rounds cost seconds each (a fresh ClientApp process per message)
FEDSM = {
    "algorithm": "fedsm",
    "num-users": 40,
    "num-elements": 60,
    "k": 2,
    "clients-per-round": 0.25,
    "elements-per-client": 0.2,
    "seed": 7,
}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureFederation]:
    fed = SecureFederation(tmp_path_factory.mktemp("secure"), NUM_NODES)
    try:
        yield fed.start()
    finally:
        fed.stop()


def test_tls_node_auth_database_run_matches_direct(secure, tmp_path) -> None:
    roots = {f"supernode-{i}": secure.nodes[i].pid for i in range(NUM_NODES)}
    with PeakRSS(roots) as rss:
        run = secure.run(FEDSM, timeout=240)
    assert run.status == "finished:completed", run.output + run.details
    direct = run_direct(
        AppConfig.from_run_config({**FEDSM, "output-dir": str(tmp_path), "run-name": "direct"})
    )
    assert run.summary["selected"] == direct["selected"]
    assert run.summary["objective"] == pytest.approx(direct["objective"])
    metrics = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == FEDSM["k"] and all(r["bad-replies"] == 0 for r in metrics)
    online = {int(r["node-id"]) for r in secure.supernodes() if r["status"] == "online"}
    assert online == set(secure.node_ids.values())  # every registered node, nothing else
    assert max(r["nodes"] for r in metrics) == NUM_NODES
    assert secure.database.stat().st_size > 0  # state persisted on disk, not in memory
    peak = rss.report()
    (secure.root / "peak-rss.json").write_text(json.dumps(peak, indent=2))
    print("peak RSS (MiB):", json.dumps(peak))
    assert all(p["supernode-mib"] > 0 and p["clientapp-mib"] > 0 for p in peak.values())


def test_secure_aggregation_on_tls_supernodes_matches_direct(secure, tmp_path) -> None:
    """SecAgg+ over real SuperNodes (each message a fresh ClientApp process: the protocol's
    state — keys for the run, the session between collect and unmask — lives in the node's
    Context): the plain run's set, every node in every sum, keys set up once, and the
    protocol's cost recorded per round."""
    run = secure.run({**FEDSM, "secure-aggregation": True}, timeout=400)
    assert run.status == "finished:completed", run.output + run.details
    direct = run_direct(
        AppConfig.from_run_config({**FEDSM, "output-dir": str(tmp_path), "run-name": "direct"})
    )
    assert run.summary["selected"] == direct["selected"]
    metrics = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == FEDSM["k"]
    for t, row in enumerate(metrics):
        assert row["bad-replies"] == 0 and row["secagg-nodes"] == row["nodes"] >= 3
        assert row["secagg-sessions"] == 1 and row["secagg-bytes-up"] > 0
        setup = row["nodes"] if t == 0 else 0  # keys once per run
        assert row["secagg-messages"] == 2 * (setup + row["nodes"] + row["secagg-unmask-nodes"])


def test_supernode_with_unregistered_key_is_refused(secure) -> None:
    stranger = make_node_keys(secure.root / "stranger", 1, prefix="unregistered")[0]
    proc = secure.start_node(0, key=stranger)
    try:
        deadline = time.monotonic() + 60
        while proc.alive() and "Failed to activate" not in proc.output():
            assert time.monotonic() < deadline, proc.output()
            time.sleep(0.5)
        log = proc.output()
        assert "Failed to activate SuperNode" in log, log
        listed = {int(r["node-id"]) for r in secure.supernodes()}
        assert listed == set(secure.node_ids.values())  # only the registered keys
    finally:
        proc.stop()


def _runs(secure) -> dict[str, str]:
    proc = subprocess.run(
        [str(BIN / "flwr"), "ls", secure.connection, "--format", "json"],
        env=secure.cli.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    data = json.loads(proc.stdout[proc.stdout.index("{") :])
    return {str(r["run-id"]): str(r["status"]) for r in data.get("runs", [])}


def test_superlink_restart_with_database_keeps_nodes_and_runs(secure) -> None:
    """Restart the SuperLink on its database: same registrations, node ids and past runs."""
    runs = _runs(secure)
    secure.superlink.stop()
    secure.start_superlink()
    rows = secure.wait_online(timeout=60, restarts=0)  # no node may need starting again
    online = {int(r["node-id"]) for r in rows if r["status"] == "online"}
    assert online == set(secure.node_ids.values()), rows  # the same ids, reconnected
    assert all(secure.nodes[i].alive() for i in range(NUM_NODES))  # nodes survived it
    assert _runs(secure) == runs
