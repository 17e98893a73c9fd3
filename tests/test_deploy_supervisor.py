"""The supervisor reaps a dead process at once and stops what it left, by PID, within seconds.

Real processes, no Flower: a "node" that starts a child watching its parent the way Flower's
superexec does (``os.kill(parent, 0)`` every 0.2 s), and a grandchild (a "ClientApp"). A
zombie passes that check: unreaped, the SIGKILLed node's child lives on (the rehearsal's
superexec lived 12.8 min that way and served the node's restarted SuperNode too).
Supervised, the node is reaped the moment it dies and its child and grandchild are killed
by PID: found by the marker in their environment, or, on a device, in its cgroup even
without the marker.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from flower_app import procfs
from rehearsal.isolation import Devices, probe
from rehearsal.processes import start_process
from rehearsal.supervisor import Supervisor

#: a node: its child checks the node's PID as Flower's --parent-pid does (every argv[3]
#: seconds; Flower: 0.2) and exits when it is gone; the grandchild sleeps. argv[1]: where to
#: write the two PIDs; argv[2]: "clean" starts the grandchild with an empty environment (no
#: marker)
NODE = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import os, subprocess, sys, time
parent = os.getppid()
env = {} if sys.argv[2] == "clean" else None
grand = subprocess.Popen(["sleep", "300"], env=env)
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {grand.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(float(sys.argv[3]))
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        grand.kill()
        sys.exit(0)
''', *sys.argv[1:4]])
time.sleep(300)
"""


def _start(tmp_path: Path, name: str, clean: bool = False, host=None, check: float = 60.0):
    """Start a node; its child checks for it every ``check`` s (long: the supervisor, not
    the child's own check, must be what stops it)."""
    pids = tmp_path / f"{name}.pids"
    cmd = [sys.executable, "-c", NODE, str(pids), "clean" if clean else "-", str(check)]
    proc = start_process(name, cmd, tmp_path, dict(os.environ), host=host,
                         marker=f"test/{name}/1")  # fmt: skip
    deadline = time.monotonic() + 60
    while not pids.exists():
        assert proc.alive() and time.monotonic() < deadline, proc.output()
        time.sleep(0.05)
    child, grand = map(int, pids.read_text().split())
    return proc, child, grand


def test_an_unreaped_dead_node_keeps_its_child_alive(tmp_path: Path) -> None:
    """The failure the supervisor exists for: the parent check takes a zombie for alive."""
    proc, child, grand = _start(tmp_path, "unsupervised", check=0.2)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        time.sleep(1.5)  # 7 of the child's checks
        assert procfs.state(proc.pid) == "Z"  # dead, not reaped
        assert procfs.alive(child) and procfs.alive(grand)  # the zombie passed the check
        proc.popen.wait()  # reaped: now the check fails
        deadline = time.monotonic() + 10
        while procfs.alive(child) or procfs.alive(grand):
            assert time.monotonic() < deadline, "the child did not follow its reaped parent"
            time.sleep(0.05)
    finally:
        for pid in (child, grand):
            if procfs.alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_supervised_node_is_reaped_at_once_and_what_it_left_is_stopped(tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = Supervisor(said.append)
    proc, child, grand = _start(tmp_path, "node")
    supervisor.watch(proc)
    os.kill(proc.pid, signal.SIGKILL)  # not through the supervisor, nor reaped by the test
    start = time.monotonic()
    death = supervisor.wait(proc, timeout=10)
    assert time.monotonic() - start < 5
    assert not Path(f"/proc/{proc.pid}").exists()  # reaped: no zombie
    assert not procfs.alive(child) and not procfs.alive(grand)
    assert death.cause == "killed by SIGKILL" and not death.expected
    assert set(death.left) == {child, grand}  # by the marker
    assert death.left[grand] == "sleep"
    assert said == [f"supervisor: {death.describe()}"] and "stopped what it left" in said[0]
    # an asked-for stop is recorded, and not announced when nothing was left
    quiet, child, grand = _start(tmp_path, "stopped")
    supervisor.watch(quiet)
    quiet.stop()
    death = supervisor.wait(quiet, timeout=30)
    assert death.expected and death.cause == "killed by SIGTERM"
    assert supervisor.deaths[-1] is death
    deadline = time.monotonic() + 10
    while procfs.alive(child) or procfs.alive(grand):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_on_a_device_everything_in_its_cgroup_is_stopped_marker_or_not(tmp_path: Path) -> None:
    support = probe()
    if not support.cgroups:
        assert support.why_not
        return
    devices = Devices(namespaces=False)
    try:
        host = devices.device(0, 256 << 20, 0.5)
        supervisor = Supervisor(lambda _: None)
        proc, child, grand = _start(tmp_path, "device", clean=True, host=host)
        assert host.cgroup is not None and {proc.pid, child, grand} <= set(host.cgroup.pids())
        assert b"FLOWER_APP_DEPLOY_PROCESS=test/device/1" not in (procfs.environ(grand) or [])
        supervisor.watch(proc, host.cgroup)
        os.kill(proc.pid, signal.SIGKILL)
        death = supervisor.wait(proc, timeout=10)
        assert set(death.left) == {child, grand}
        assert host.cgroup.pids() == []
    finally:
        devices.close()
