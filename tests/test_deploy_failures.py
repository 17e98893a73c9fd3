"""Failures on the edge-device rehearsal: nodes killed and restarted, the SuperLink killed.

The session's 2-node rehearsal (``rehearsal_pair``, ``tests/support/deployment.py``), each SuperNode
holding only its exported MovieLens-1M file, FedSM with ``server-data='none'`` through ``flwr
run``:

* SuperNode 0 is SIGKILLed (its process only, as the kernel's OOM killer or ``kill -9``
  would, and not reaped by the test) in round 3: the rehearsal's supervisor reaps it at
  once and stops its superexec (and a ClientApp in flight) within seconds, so nothing of
  the dead node is left; the restart drill (``restart_node``) brings it back on its device
  with exactly one superexec, its whole tree inside its cgroup's limits. Once it is back,
  SuperNode 1 gets SIGTERM in round 5 and is restarted the same way (at once: it
  deactivated itself). The run records each lost node once per round with its users, says
  ``degraded``, and uses both nodes again under the same key. With ``node-return-wait`` the
  round after a loss waits for the restarted node, so the last round is served by both
  whatever the machine's load.
* The SuperLink alone is SIGKILLed after round 3, while a node serves a message: the
  supervisor stops its superexec and the run's ServerApp within seconds (the ServerApp runs
  in a session of its own and outlived the SuperLink by 45 min before). The restart drill
  (``restart_superlink``) starts it again on its database: it has the same registrations,
  node ids and past runs, the nodes (still running) reconnect by themselves, ``flwr ls``
  lists the killed run as ``finished:failed`` (``running`` before the kill; while the
  SuperLink is down ``flwr ls`` cannot connect), and ``resume=true`` with
  ``server-data='none'`` finishes with the direct engine's S (the simulation's:
  ``test_movielens_fedsm.py``) with no node killed for memory; afterwards no node holds a
  ClientApp (the one left waiting for its message's content when the SuperLink died is
  gone). This run is also the rehearsal's FedSM-on-MovieLens-1M run.

Markers ``deploy`` and ``realdata`` (FLOWER_APP_DATA with ml-1m/).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from direct import run_direct
from flower_app.config import AppConfig
from rehearsal.processes import process_tree
from rehearsal.rehearsal import EDGE_DEVICE
from tests.support.deployment import BackgroundRun, data_root, rows

#: seconds within which nothing of a dead node may be left (the supervisor takes < 1 s idle)
GONE_WITHIN = 10.0

pytestmark = [pytest.mark.deploy, pytest.mark.realdata]

FEDSM = {
    "algorithm": "fedsm",
    "dataset": "movielens",
    "clients-per-round": 0.1,
    "elements-per-client": 0.1,
    "seed": 3,
    # Flower answers for a dead node within ~60 s (heartbeat 30 s x patience 2); a healthy
    # node on a loaded half core needs 10-30 s a round: docs/deployment.md "round-timeout"
    "round-timeout": 300.0,
    "min-reply-fraction": 0.5,
    "server-data": "none",
}


@pytest.fixture
def ml1m(rehearsal_pair, node_export):
    """The 2-node rehearsal's nodes each holding their MovieLens-1M file."""
    root = data_root()
    export = node_export("movielens", nodes=rehearsal_pair.nodes, **{"data-dir": root})
    rehearsal_pair.provision(export, "parquet")
    return rehearsal_pair


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout: float = 60.0) -> None:
    """Wait until none of ``pids`` runs (zombies count as gone)."""
    deadline = time.monotonic() + timeout
    while left := [p for p in pids if _running(p)]:
        assert time.monotonic() < deadline, f"still running after {timeout} s: {left}"
        time.sleep(0.1)


def _clientapps(pid: int) -> list[int]:
    """The flwr-clientapp processes running under SuperNode ``pid``."""
    out = []
    for p in process_tree(pid)[1:]:
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"flwr-clientapp" in argv and _running(p):
            out.append(p)
    return out


def _exactly_one_superexec_inside_limits(rehearsal, index: int) -> None:
    """The node runs once: one SuperNode and one superexec, its whole tree in its cgroup,
    whose limits are the device's."""
    fed = rehearsal.federation
    procs = rehearsal.node_processes(index)
    programs = sorted(procs.values())
    assert programs.count("flower-superexec") == 1, procs
    assert programs.count("flower-supernode") == 1, procs
    host = fed.host_of(index)
    if host.cgroup is not None:
        tree = {p for p in process_tree(fed.nodes[index].pid) if _running(p)}
        assert tree <= set(host.cgroup.pids()), (tree, host.cgroup.pids())
        assert host.cgroup.limits() == (EDGE_DEVICE.memory, EDGE_DEVICE.cpus)
    host.check(fed.nodes[index].pid)  # and in its namespace


def test_killed_and_terminated_nodes_are_recorded_and_used_again(ml1m) -> None:
    fed = ml1m.federation
    # node-return-wait: a round waits (up to 600 s) for the nodes that went offline to be
    # back before it is sent, so both restarted nodes serve the last round whatever the
    # load, and k = 6 suffices (it was 12 rounds sized for the load, the run not waiting:
    # under CI with two CPU-bound loops the killed node needed ~5 rounds to be listed
    # offline, restarted and back). min-reply-fraction 0.25: a round may lose both nodes
    config = {**FEDSM, "data-dir": str(data_root()), "k": 6, "run-name": "node-failures",
              "min-reply-fraction": 0.25, "node-return-wait": 600.0}  # fmt: skip
    run = BackgroundRun(fed, config)
    # SIGKILL of the SuperNode process alone, from outside (the test does not reap it):
    # the supervisor must, and must stop its superexec (and ClientApp) within seconds
    run.wait_for_round(2)
    dead = fed.nodes[0]
    tree = process_tree(dead.pid)
    os.kill(dead.pid, signal.SIGKILL)
    killed = time.monotonic()
    _wait_gone(tree, timeout=GONE_WITHIN)
    assert dead.ended.wait(GONE_WITHIN) and dead.death is not None
    assert time.monotonic() - killed < GONE_WITHIN
    assert not Path(f"/proc/{dead.pid}").exists()  # reaped: no zombie for Flower to trust
    assert ml1m.node_processes(0) == {}  # nothing of the dead node in its cgroup
    assert "flower-superexec" in dead.death.left.values(), dead.death.describe()
    assert dead.death.cause == "killed by SIGKILL" and not dead.death.expected
    # the SuperLink refuses the same key until it lists the dead session offline: the
    # round that loses the node ends with Flower's "Node Unavailable" for it, sent once it
    # does (~40-60 s: heartbeats); the restart drill waits for that and restarts it on its
    # device: the node runs once, inside its limits
    run.wait_for_loss(fed.node_ids[0], timeout=300)
    ml1m.restart_node(0)
    _exactly_one_superexec_inside_limits(ml1m, 0)
    # SIGTERM of the SuperNode process alone: it deactivates itself; back at once
    run.wait_for_round(4)
    stopped = fed.nodes[1]
    tree = process_tree(stopped.pid)
    os.kill(stopped.pid, signal.SIGTERM)
    _wait_gone(tree, timeout=60)
    ml1m.restart_node(1)
    assert stopped.death is not None and stopped.death.left_cleanly
    _exactly_one_superexec_inside_limits(ml1m, 1)
    back = max(r["server-round"] for r in rows(run.folder))
    result = run.result()
    assert result.status == "finished:completed", result.output[-3000:] + result.details
    done = [r for r in rows(run.folder) if r["server-round"] >= 1]
    assert len(done) == config["k"]
    lost = {r["server-round"]: r for r in done if r.get("failed-nodes")}
    victims = {fed.node_ids[0], fed.node_ids[1]}  # both nodes, each in its turn
    assert lost and min(lost) >= 3  # nothing lost before the first kill
    for r in lost.values():  # each lost node once per round, with its users
        ids = [f["node-id"] for f in r["failed-nodes"]]
        assert len(ids) == len(set(ids)) and set(ids) <= victims
        assert r["users-missing"] == sum(f["users"] for f in r["failed-nodes"]) > 0
    # both serve again: the rounds after their restart (the next round waited for them)
    assert done[-1]["server-round"] not in lost and back < config["k"]
    failures = result.summary["failures"]
    assert result.summary["degraded"] is True
    assert set(failures["nodes-failed"]) == victims
    assert failures["rounds-degraded"] == sorted(lost)
    print("rounds lost:", {t: [f["reason"][:50] for f in r["failed-nodes"]]
                           for t, r in lost.items()})  # fmt: skip


def test_superlink_and_serverapp_killed_then_resumed_to_the_same_set(ml1m, tmp_path) -> None:
    """Also what ``test_superlink_restart_with_database_keeps_nodes_and_runs`` and
    ``test_fedsm_movielens_on_nodes_with_their_own_files`` checked: the restarted SuperLink
    keeps registrations, node ids and runs; FedSM with ``server-data='none'`` on the nodes'
    own MovieLens-1M files ends with the direct engine's S, no node killed for memory."""
    fed = ml1m.federation
    config = {**FEDSM, "data-dir": str(data_root()), "k": 5, "run-name": "superlink-killed"}
    run = BackgroundRun(fed, config)
    run.wait_for_round(3)
    runs = fed.runs()  # the SuperLink's runs (this one running) before it is killed
    killed_run = [r for r, status in runs.items() if status == "running"]
    assert len(killed_run) == 1, runs
    deadline = time.monotonic() + 300  # kill it while a node serves a message (the worst case)
    while not any(_clientapps(fed.nodes[i].pid) for i in range(ml1m.nodes)):
        assert time.monotonic() < deadline and run.thread.is_alive(), "no message in flight"
        time.sleep(0.05)
    link = fed.superlink
    tree = process_tree(link.pid)
    death = ml1m.kill_superlink()  # SIGKILL of the SuperLink process alone
    # the supervisor stopped what it left: its superexec and the run's ServerApp (which
    # runs in a session of its own: the SuperLink's process group does not hold it)
    assert {"flower-superexec", "flwr-serverapp"} <= set(death.left.values()), death.describe()
    assert death.seconds < GONE_WITHIN
    _wait_gone(tree, timeout=GONE_WITHIN)
    assert not Path(f"/proc/{link.pid}").exists()  # reaped
    assert not (run.folder / "summary.json").exists()
    down = fed.flwr("ls", fed.connection, "--format", "json", timeout=120)
    assert '"success": false' in down.stdout and "unavailable" in down.stdout, down.stdout
    # what the nodes hold while the SuperLink is away: a ClientApp whose message content
    # never arrived waits (heartbeating) for it
    apps = {i: _clientapps(fed.nodes[i].pid) for i in range(ml1m.nodes)}
    print("ClientApps running while the SuperLink is down:", apps)
    ml1m.restart_superlink()  # returns once every running node is online again
    online = {int(r["node-id"]) for r in fed.supernodes() if r["status"] == "online"}
    assert online == set(fed.node_ids.values())  # the same ids, from its database
    assert all(fed.nodes[i].alive() for i in range(ml1m.nodes))  # the nodes survived it
    after, since = fed.runs(), time.time() - death.noticed
    assert set(runs) <= set(after)  # its database kept the runs
    # `flwr ls` lists the killed run `running` until the ServerApp's task token expires,
    # 2 x 30 s after its last heartbeat (heartbeats every 17.5-22.5 s: 37-60 s after the
    # kill), and `finished:failed` from then on (docs/deployment.md, node failures)
    status = after[killed_run[0]]
    print(f"flwr ls of the killed run {since:.0f} s after the kill: {status}")
    assert status == "running" if since < 37 else status == "finished:failed" if since > 61 else (
        status in ("running", "finished:failed"))  # fmt: skip
    run.thread.join(timeout=300)  # `flwr run` of the killed run returns (its run failed)
    assert not run.thread.is_alive(), "flwr run of the killed run did not return"
    assert run.run is None or run.run.status != "finished:completed"
    print("the killed run:", run.error or f"{run.run.status} {run.run.details}")
    resumed = fed.run({**config, "resume": True}, timeout=1800)
    assert resumed.status == "finished:completed", resumed.output[-3000:] + resumed.details
    summary = resumed.summary
    assert 2 <= summary["resumed-from-round"] < config["k"]
    assert summary["server-data"] == "none" and summary["greedy-objective"] is None
    assert [r["server-round"] for r in rows(run.folder) if r["server-round"] >= 1] == list(
        range(1, config["k"] + 1)
    )
    direct = run_direct(AppConfig.from_run_config(
        {**config, "server-data": "full", "output-dir": str(tmp_path), "run-name": "direct"}
    ))  # fmt: skip
    assert summary["selected"] == direct["selected"]
    assert summary["objective"] == pytest.approx(direct["objective"], rel=1e-12)
    # no duplicate or orphaned ClientApp is left on any node
    deadline = time.monotonic() + 60
    while left := {i: a for i in range(ml1m.nodes) if (a := _clientapps(fed.nodes[i].pid))}:
        assert time.monotonic() < deadline, f"ClientApps left after the run: {left}"
        time.sleep(0.5)
    time.sleep(max(0.0, death.noticed + 62 - time.time()))  # the resumed run took longer
    assert fed.runs()[killed_run[0]] == "finished:failed"
    report = ml1m.cgroup_report()
    assert all(r["oom-kills"] == 0 for r in report.values()), report
    print("resumed from round", summary["resumed-from-round"], json.dumps(report))
    print("round times (s):", [round(r.get("round-time", 0.0), 2) for r in rows(run.folder)])
