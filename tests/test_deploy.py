"""The edge-device rehearsal: TLS, SuperNode authentication and a database, nodes as devices.

The session's rehearsal (``tests/support/deployment.py``): ``flower-superlink --ssl-*
--enable-supernode-auth --database``, keys registered with ``flwr supernode register``, 3
``flower-supernode --root-certificates --auth-supernode-private-key`` processes, each in its
own network namespace with its own address, its own folder holding only its exported file,
and the cgroup memory and CPU limits of an edge device; the app's FedSM job through ``flwr
run . rehearsal``. Deselected by default; ``-m deploy`` or FLOWER_APP_REALDATA=1 (CI).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from direct import run_direct
from flower_app import procfs
from flower_app.config import AppConfig
from flower_app.deploy import make_node_keys
from flower_app.deploy.credentials import read_public_keys
from flower_app.privacy.secagg_client import IDENTITY_KEY, TRUSTED_KEYS
from rehearsal import PeakRSS
from rehearsal.processes import process_tree

pytestmark = pytest.mark.deploy

#: the default FedSM job (the default synthetic instance: 2,000 users, 500 elements), 2
#: rounds: a deployment round costs seconds (a ClientApp process per message on half a core)
FEDSM = {
    "algorithm": "fedsm",
    "k": 2,
    "clients-per-round": 0.25,
    "elements-per-client": 0.2,
    "seed": 7,
}


@pytest.fixture
def synthetic(rehearsal, node_export):
    """The rehearsal's nodes each holding their file of the default synthetic instance (the
    one the guide's commands run on: ``test_deploy_guide.py`` shares the running nodes)."""
    rehearsal.provision(node_export("synthetic-facility-location"), "parquet")
    return rehearsal


def _running(pid: int) -> bool:
    """True for a process that exists and is not a zombie (an exited ClientApp that Flower's
    superexec has not reaped yet is listed by its parent but in no cgroup)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _direct(tmp_path, config: dict) -> dict:
    return run_direct(
        AppConfig.from_run_config({**config, "output-dir": str(tmp_path), "run-name": "direct"})
    )


def test_nodes_are_separate_limited_devices_and_secure_aggregation_matches_direct(
    synthetic, tmp_path
) -> None:
    """The rehearsal's nodes are separate limited devices, and FedSM with SecAgg+ over them
    (each message a fresh ClientApp process: the protocol's state — keys for the run, the
    session between collect and unmask — lives in the node's Context) selects the direct
    engine's set: every node in every sum, keys set up once (two rounds: the second must
    reuse round 1's keys from a fresh ClientApp process), the protocol's cost recorded per
    round, and each node's whole process tree inside its cgroup.

    With endorsed keys, the rehearsal's default: every SuperNode runs with its identity
    (``secagg-identity-key``) and the federation's trusted identities
    (``secagg-trusted-keys``) in its node_config. A node holding a trusted list refuses
    every collect request whose new neighbours' run keys are not signed by a trusted
    identity for this run and their node ids, and one that carries no endorsements at all
    (``flower_app/privacy/secagg_client.py``); a node whose identity key cannot be read
    refuses setup. So a completed SecAgg+ run on these nodes is one in which every run key
    was checked against the identities the operator distributed.

    One run checks both (they were two runs of the same job: 2 rounds each on the
    rehearsal). The plain job on the nodes is compared with the direct engine by the
    resumed run of ``test_deploy_failures.py`` and run by the guide's commands
    (``test_deploy_guide.py``)."""
    reh, fed = synthetic, synthetic.federation
    assert fed.identities is not None and fed.trusted_keys is not None  # endorsed: default
    trusted = read_public_keys(fed.trusted_keys)
    for i in range(reh.nodes):
        argv = " ".join(procfs.argv(fed.nodes[i].pid) or [])
        assert f'{IDENTITY_KEY}="{fed.identities[i].private_key.resolve()}"' in argv, argv
        assert f'{TRUSTED_KEYS}="{fed.trusted_keys.resolve()}"' in argv, argv
        assert fed.identities[i].public_key.read_bytes() in trusted
    assert len(set(trusted)) == reh.nodes
    hosts = [fed.host_of(i) for i in range(reh.nodes)]
    if reh.namespaced:  # else the rehearsal said why (root, ip) and fell back to loopback
        assert len({h.address for h in hosts} | {fed.host}) == reh.nodes + 1
        assert fed.address.startswith(fed.link.address)
    else:
        assert reh.fallbacks
    for i in range(reh.nodes):  # only its own file (and the export's manifest)
        assert sorted(p.name for p in reh.node_data(i).iterdir()) == [
            "manifest.json", f"node-{i}.parquet"]  # fmt: skip
    roots = {f"supernode-{i}": fed.nodes[i].pid for i in range(reh.nodes)}
    config = {**FEDSM, "server-data": "none", "secure-aggregation": True}
    with PeakRSS(roots) as rss:
        run = fed.run(config, timeout=900)
    assert run.status == "finished:completed", run.output + run.details
    direct = _direct(tmp_path, FEDSM)
    assert run.summary["selected"] == direct["selected"]
    assert run.summary["objective"] == pytest.approx(direct["objective"])
    metrics = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == FEDSM["k"]
    for t, row in enumerate(metrics):
        assert row["bad-replies"] == 0 and row["secagg-nodes"] == row["nodes"] >= 3
        assert row["secagg-nodes-endorsed"] == row["secagg-nodes"]  # no node trusted first use
        assert row["secagg-sessions"] == 1 and row["secagg-bytes-up"] > 0
        setup = row["nodes"] if t == 0 else 0  # keys once per run
        assert row["secagg-messages"] == 2 * (setup + row["nodes"] + row["secagg-unmask-nodes"])
    online = {int(r["node-id"]) for r in fed.supernodes() if r["status"] == "online"}
    assert online == set(fed.node_ids.values())  # every registered node, nothing else
    assert fed.database.stat().st_size > 0  # state persisted on disk, not in memory
    peak = rss.report()
    for i, host in enumerate(hosts):
        assert peak[f"supernode-{i}"]["clientapps"] >= 1
        if host.cgroup is not None:  # the node's whole tree is in its cgroup
            inside = set(host.cgroup.pids())
            tree = set(process_tree(fed.nodes[i].pid))
            assert not {p for p in tree - inside if _running(p)}
            assert host.cgroup.peak() <= host.cgroup.memory
    print("node trees (MiB):", json.dumps(peak), json.dumps(reh.cgroup_report()))
    print("round times (s):", [round(r["round-time"], 2) for r in metrics])


def test_supernode_with_unregistered_key_is_refused(synthetic) -> None:
    """A SuperNode whose key was never registered is refused and gets no node id.

    The SuperLink is shared: ``flwr supernode ls`` also lists what earlier tests left on it
    (``test_deploy_guide.py`` registers a key and unregisters it: that node stays listed,
    status ``unregistered``: Flower keeps an unregistered node's row). So the check is that
    the stranger adds no row and that no node is online but the registered ones."""
    fed = synthetic.federation
    before = {int(r["node-id"]): r["status"] for r in fed.supernodes()}
    assert set(fed.node_ids.values()) <= set(before), before
    stranger = make_node_keys(fed.root / "stranger", 1, prefix="unregistered")[0]
    proc = fed.start_node(0, key=stranger)  # on a device of its own
    try:
        deadline = time.monotonic() + 120
        while proc.alive() and "Failed to activate" not in proc.output():
            assert time.monotonic() < deadline, proc.output()
            time.sleep(0.5)
        log = proc.output()
        assert "Failed to activate SuperNode" in log, log
        rows = fed.supernodes()
        after = {int(r["node-id"]) for r in rows}
        assert after == set(before), rows  # no node id for the unregistered key
        online = {int(r["node-id"]) for r in rows if r["status"] == "online"}
        assert online <= set(fed.node_ids.values()), rows  # only registered keys online
    finally:
        proc.stop()
