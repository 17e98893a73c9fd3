"""docs/deployment.md is true for the installed Flower: every command in it is run or checked.

Each command of the guide's ``bash`` blocks is one of:

* run **as written** here (certificates, node keys, identities and the trusted list,
  ``flwr config ls`` and the connection appended to ``~/.flwr/config.toml`` in a fresh home;
  the rehearsal command, its failure drills, and SIGTERM);
* run **as written against the rehearsal's SuperLink** (``flwr supernode register/ls/
  unregister``, ``flwr run . edge``, ``flwr ls edge``: a connection named ``edge`` points to
  it; only ``NODE_ID`` is filled in);
* or the ``flower-superlink`` / ``flower-supernode`` lines, which must equal, argument for
  argument, what :func:`~rehearsal.processes.superlink_command` and
  :func:`~rehearsal.processes.supernode_command` build for the guide's paths: the
  exact commands every rehearsal starts (``tests/test_deploy.py`` and the others run them).

A command the guide gains without being covered here fails
:func:`test_every_guide_command_is_covered`. The resume line is run (with the rehearsal's
run folder) by ``tests/test_deploy_failures.py``; the export line (with the test data's
folder) by the ``node_export`` fixture; the systemd unit is not run (no systemd here).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flower_app import procfs
from flower_app.deploy.connection import connection_toml
from flower_app.deploy.credentials import Certificates, NodeKey, read_public_keys
from flower_app.privacy.secagg_client import IDENTITY_KEY, TRUSTED_KEYS
from flower_app.simulation import PROJECT
from rehearsal.isolation import Cgroup
from rehearsal.processes import superlink_command, supernode_command
from rehearsal.rehearsal import EDGE_DEVICE
from rehearsal.supervisor import marked, program

GUIDE = PROJECT / "docs" / "deployment.md"
BIN = Path(sys.executable).parent

#: how each kind of guide command is covered (prefix -> test)
COVERED = {
    "python -m flower_app.deploy certs": "run as written",
    "python -m flower_app.deploy node-keys": "run as written",
    "python -m flower_app.deploy connection": "run as written",
    "python -m flower_app.deploy identity-keys": "run as written",
    "python -m flower_app.deploy trusted-keys": "run as written",
    "python -m rehearsal start": "run as written (SIGTERM)",
    "python -m rehearsal drill": "run as written on the start command",
    "flwr config ls": "run as written",
    "mkdir -p": "not run (it would create /var/lib/flower on the test machine)",
    "flower-superlink": "= superlink_command()",
    "flower-supernode": "= supernode_command()",
    "flwr supernode register": "run on the rehearsal",
    "flwr supernode ls": "run on the rehearsal",
    "flwr supernode unregister": "run on the rehearsal",
    "flwr run . edge --stream --run-config \"k=3": "run on the rehearsal",
    "flwr ls edge": "run on the rehearsal",
    "flwr run . edge --run-config": "resume: tests/test_deploy_failures.py",
    "python -m flower_app.export": "node_export fixture",
    "systemctl": "not run (no systemd here)",
    "journalctl": "not run (no systemd here)",
    "FLOWER_APP_REALDATA=1 pytest": "this suite",
}


def guide_commands() -> list[str]:
    """Every command of the guide's ``bash`` blocks (continuations joined, comments off)."""
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S):
        line = ""
        for raw in block.splitlines():
            text = raw.split("  # ")[0].rstrip() if not raw.lstrip().startswith("#") else ""
            if not text and not line:
                continue
            line += text.strip() + " " if text.endswith("\\") else text.strip()
            if line.endswith("\\ "):
                line = line[:-2] + " "
                continue
            if line:
                out.append(line.strip())
            line = ""
    return out


def _one(prefix: str) -> str:
    found = [c for c in guide_commands() if c.startswith(prefix)]
    assert len(found) == 1, f"{prefix!r}: {found}"
    return found[0]


def test_every_guide_command_is_covered() -> None:
    commands = guide_commands()
    assert len(commands) >= 15
    uncovered = [c for c in commands if not any(c.startswith(p) for p in COVERED)]
    assert not uncovered, f"commands of docs/deployment.md no test runs: {uncovered}"


def test_superlink_and_supernode_lines_are_what_the_rehearsal_starts() -> None:
    certs = Certificates(Path("certs/ca.crt"), Path("certs/ca.key"), Path("certs/server.pem"),
                         Path("certs/server.key"))  # fmt: skip
    ours = superlink_command(certs, Path("/var/lib/flower/superlink.db"), 9092, "0.0.0.0")
    assert shlex.split(_one("flower-superlink")) == ["flower-superlink", *ours[1:]]
    key = NodeKey(Path("keys/edge-01-0"), Path("keys/edge-01-0.pub"))
    config = {"partition-id": 0, "num-partitions": 4,
              "data-path": "/var/lib/flower/data/node-0.parquet",
              IDENTITY_KEY: "/var/lib/flower/identity/edge-01-0.key",
              TRUSTED_KEYS: "/var/lib/flower/federation.pem"}  # fmt: skip
    ours = supernode_command("superlink.example.org:9092", Path("certs/ca.crt"), key, config, 9094)
    assert shlex.split(_one("flower-supernode")) == ["flower-supernode", *ours[1:]]


def _shell(command: str, cwd: Path, env: dict, prefix: list[str] | None = None) -> str:
    proc = subprocess.run([*(prefix or []), "bash", "-c", command], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def _fresh_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")  # fmt: skip
    return env


def test_credentials_and_connection_commands_run_as_written(tmp_path) -> None:
    """On a fresh machine (no ~/.flwr): certificates, keys, the connection appended after
    ``flwr config ls`` made the config file (without it, ``>> ~/.flwr/config.toml`` fails:
    the folder does not exist yet)."""
    home = tmp_path / "home"
    home.mkdir()
    env = _fresh_env(home)
    _shell(_one("python -m flower_app.deploy certs"), tmp_path, env)
    _shell(_one("python -m flower_app.deploy node-keys"), tmp_path, env)
    assert (tmp_path / "certs" / "server.pem").exists()
    assert (tmp_path / "keys" / "edge-01-0.pub").exists()
    _shell(_one("python -m flower_app.deploy identity-keys"), tmp_path, env)
    _shell(_one("python -m flower_app.deploy trusted-keys"), tmp_path, env)
    assert read_public_keys(tmp_path / "federation.pem") == [
        (tmp_path / "identity" / "edge-01-0.pub").read_bytes()]  # fmt: skip
    append = _one("python -m flower_app.deploy connection")
    failed = subprocess.run(["bash", "-c", append], cwd=tmp_path, env=env, capture_output=True)
    assert failed.returncode != 0  # the guide's order matters: no ~/.flwr yet
    _shell(_one("flwr config ls"), tmp_path, env)
    _shell(append, tmp_path, env)
    listed = _shell("flwr config ls", tmp_path, env)
    assert "edge" in listed and "local" in listed


@pytest.mark.deploy
def test_operator_commands_run_as_written_on_the_rehearsal(rehearsal, node_export, tmp_path):
    fed = rehearsal.federation
    rehearsal.provision(node_export("synthetic-facility-location"), "parquet")  # the default
    config = fed.cli.home / "config.toml"
    if "[superlink.edge]" not in config.read_text():  # `edge` = the rehearsal's SuperLink
        config.write_text(config.read_text() + "\n" + connection_toml(
            "edge", fed.address, fed.certificates.ca_cert))  # fmt: skip
    env = {**fed.cli.env}
    _shell(_one("python -m flower_app.deploy node-keys"), tmp_path, env)
    out = _shell(_one("flwr supernode register"), tmp_path, env, fed.cli.prefix)
    node_id = re.search(r"(\d{6,})", out).group(1)
    listed = _shell(_one("flwr supernode ls"), tmp_path, env, fed.cli.prefix)
    assert node_id in listed
    _shell(_one("flwr supernode unregister").replace("NODE_ID", node_id), tmp_path, env,
           fed.cli.prefix)  # fmt: skip
    status = {str(r["node-id"]): r["status"] for r in fed.supernodes()}
    assert status.get(node_id, "unregistered") == "unregistered", status
    before = set(fed.runs())
    out = _shell(_one('flwr run . edge --stream --run-config "k=3'), PROJECT, env, fed.cli.prefix)
    run_id = re.search(r"Successfully started run (\d+)", out).group(1)
    assert run_id not in before
    _shell(_one("flwr ls edge"), PROJECT, env, fed.cli.prefix)  # a table (wraps its cells)
    assert fed.runs()[run_id] == "finished:completed"  # the same list, as JSON


def _drill(action: str, out: Path, cwd: Path) -> tuple[str, float]:
    """Run the guide's ``drill ACTION`` line as written, with the rehearsal's ``--out``."""
    line = _one(f"python -m rehearsal drill --out /tmp/rehearsal {action}")
    start = time.monotonic()
    text = _shell(line.replace("/tmp/rehearsal", str(out)), cwd, _fresh_env(cwd))
    return text, time.monotonic() - start


def _node_processes(cgroup: Cgroup) -> list[str]:
    """The programs running in a node's cgroup now (zombies left out)."""
    return sorted(program(p) for p in cgroup.pids() if procfs.alive(p))


@pytest.mark.deploy
def test_rehearse_command_runs_the_failure_drills_and_cleans_up_on_sigterm(tmp_path) -> None:
    """The guide's rehearsal command (2 nodes instead of 4, a small synthetic export) and its
    failure drills, as written (``--out`` this test's folder).

    It prints the Flower version and the ``flwr run`` line. ``drill ... kill-node 1``
    SIGKILLs SuperNode 1's process alone: within seconds nothing of the node is left (the
    SuperNode reaped, no zombie; its superexec stopped; its cgroup empty; no process with
    its marker). ``kill-superlink`` and ``restart-superlink`` bring the SuperLink back on its
    database with SuperNode 0 online again. ``restart-node 1`` brings node 1 back on its
    device, once the SuperLink has let the dead session go: exactly one SuperNode and one
    superexec in its cgroup, with the device's limits. SIGTERM then stops every process
    the rehearsal started, the restarted ones too, and removes its namespaces and cgroups.
    """
    line = _one("python -m rehearsal start")
    args = shlex.split(line)[3:]
    out = tmp_path / "rehearsal"
    args[args.index("--nodes") + 1] = "2"
    args[args.index("--out") + 1] = str(out)
    args[args.index("--export") + 1] = "synthetic-facility-location"
    args[args.index("--data-dir") + 1] = ""
    args += ["--export-options", "--num-users 40 --num-elements 60"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rehearsal", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    pids: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while not any("Ctrl-C" in x for x in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        text = "".join(lines)
        assert re.search(r"^flwr \d+\.\d+\.\d+; SuperLink", text, re.M), text
        assert "flwr run " in text and " --stream" in text
        assert "secure aggregation: endorsed keys" in text  # the default
        tag = re.search(r"namespace (fa-\d+-r\d+)-link", text)
        started = [int(p) for p in re.findall(r"pid (\d+)\)", text)]
        assert len(started) == 3  # the SuperLink and two SuperNodes
        pids |= set(started)
        node1 = started[2]
        cgroup = Cgroup.find(f"{tag.group(1)}-node1") if tag else None

        said, took = _drill("kill-node", out, tmp_path)
        assert took < 20, took  # the answer comes once the supervisor has cleaned up
        assert "killed by SIGKILL" in said and "flower-superexec" in said, said
        assert "SuperNode 1: no process left" in said, said
        assert not Path(f"/proc/{node1}").exists()  # reaped: not a zombie
        if tag is not None:
            assert not marked(f"{tag.group(1)}/supernode-1/", prefix=True)
        if cgroup is not None:
            assert _node_processes(cgroup) == []

        said, _ = _drill("kill-superlink", out, tmp_path)
        assert "superlink" in said and "flower-superexec" in said, said
        said, _ = _drill("restart-superlink", out, tmp_path)
        assert "online again: SuperNodes [0]" in said, said
        said, took = _drill("restart-node", out, tmp_path)
        assert "SuperNode 1 back" in said, said
        print(f"restart-node 1 took {took:.0f} s:", said)
        if cgroup is not None:  # the node runs once, inside its device's limits
            assert _node_processes(cgroup) == ["flower-superexec", "flower-supernode"]
            assert cgroup.limits() == (EDGE_DEVICE.memory, EDGE_DEVICE.cpus)
        said, _ = _drill("status", out, tmp_path)
        assert said.count("ended: ") == 2, said
        now = [ln for ln in said.splitlines() if not ln.startswith("ended: ")]  # what runs
        pids |= {int(p) for ln in now for p in re.findall(r"pid (\d+)\)", ln)}
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, rest
    assert len(pids) == 5  # the first three, the restarted SuperLink and SuperNode 1
    assert all(not procfs.alive(p) for p in pids), [p for p in pids if procfs.alive(p)]
    if tag is not None:  # namespaced: nothing of it is left
        assert not marked(f"{tag.group(1)}/", prefix=True)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert tag.group(1) not in left
        find = ["find", "/sys/fs/cgroup", "-maxdepth", "4", "-name", f"{tag.group(1)}-*"]
        cgroups = subprocess.run(find, capture_output=True, text=True).stdout
        assert not cgroups.strip()
