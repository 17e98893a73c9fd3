"""A rehearsal's devices: names of their own, no process outside its cgroup, rebuilt at restart.

Real objects (``ip netns``, the machine's cgroup hierarchy) and real processes, no Flower
(a second each). Needs root and ``ip``; where :func:`~rehearsal.isolation.probe`
says namespaces or cgroups are unavailable, the part that needs them is not run and the
probe must have said why.

* Two :class:`~rehearsal.isolation.Devices` in one process (two rehearsals in a
  notebook, ``pytest -m deploy -n 0``) get names of their own, each still traceable to the
  process for the stale sweep (their names were ``fa-<pid>-...`` alone: the second failed
  with "File exists").
* A process that did not get into its device's cgroup is an error, never a run without
  limits: started by hand inside ``ip netns exec`` (which mounts a sysfs without the cgroup
  hierarchy, so the join fails with "No such file or directory" and a ``;`` goes on), it is
  caught by :meth:`~rehearsal.isolation.Host.check`; and
  :func:`~rehearsal.processes.start_process` refuses to leave one running.
* :meth:`~rehearsal.isolation.Devices.restore` makes a removed cgroup and a deleted
  node namespace again, with the device's limits and address.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from flower_app import procfs
from rehearsal.isolation import (
    Devices,
    IsolationError,
    Support,
    new_tag,
    owner_pid,
    probe,
)
from rehearsal.processes import start_process

MIB = 1 << 20


@pytest.fixture(scope="module")
def support() -> Support:
    """What this machine offers (the rehearsal's own probe)."""
    return probe()


@pytest.fixture
def devices(support: Support) -> Iterator[Devices | None]:
    """A SuperLink namespace (when namespaces work) and nothing else yet; None (and the
    probe said why) where neither namespaces nor cgroups can be made."""
    if not (support.namespaces or support.cgroups):
        assert support.why_not
        yield None
        return
    made = Devices(namespaces=support.namespaces)
    try:
        yield made
    finally:
        made.close()


def _wait_argv0(pid: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while (procfs.argv(pid) or [""])[0] != what:
        assert proc.poll() is None and time.monotonic() < deadline, "did not start"
        time.sleep(0.01)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def test_two_sets_of_devices_in_one_process_have_names_of_their_own(support: Support) -> None:
    if not (support.namespaces or support.cgroups):
        assert support.why_not
        return
    first = Devices(namespaces=support.namespaces)
    try:
        second = Devices(namespaces=support.namespaces)  # was: "File exists"
        try:
            hosts = [d.device(0, 64 * MIB, 0.5) if support.cgroups else d.device(0, None, None)
                     for d in (first, second)]  # fmt: skip
            assert first.tag != second.tag
            for made, host in zip((first, second), hosts, strict=True):
                names = [n for n in (host.namespace, host.cgroup and host.cgroup.name) if n]
                assert names and all(n.startswith(f"{made.tag}-") for n in names), names
                assert all(owner_pid(n) == os.getpid() for n in names)  # the sweep's key
            if support.namespaces:
                assert {first.link.namespace, second.link.namespace} <= _namespaces()
        finally:
            second.close()
    finally:
        first.close()
    assert new_tag() != new_tag()


def test_a_process_outside_its_cgroup_is_caught_and_never_left_running(
    support: Support, devices: Devices, tmp_path
) -> None:
    if devices is None or not support.cgroups:
        return
    host = devices.device(0, 64 * MIB, 0.5)
    cgroup = host.cgroup
    assert cgroup is not None
    # what an operator typed to restart a node by hand: join the cgroup inside the namespace
    # (no cgroup hierarchy there), then start the node anyway (`;`): it runs unlimited
    join = "; ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in cgroup.dirs)
    by_hand = subprocess.Popen(
        [*host.prefix, "sh", "-c", f"{join}; exec sleep 300"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_argv0(by_hand.pid, by_hand, "sleep")
        assert not cgroup.holds(by_hand.pid)
        with pytest.raises(IsolationError, match="without the device's memory and CPU limits"):
            host.check(by_hand.pid)
    finally:
        by_hand.kill()
        by_hand.wait()
    # start_process: a cgroup it cannot join (removed under it) is an error, nothing runs
    cgroup.remove()
    with pytest.raises(IsolationError, match="did not start on node0"):
        start_process("sleeper", ["sleep", "300"], tmp_path, dict(os.environ), host=host)
    assert not [p for p in procfs.pids() if (procfs.argv(p) or [])[:2] == ["sleep", "300"]
                and cgroup.holds(p)]  # fmt: skip
    # restored: the same cgroup again, with the device's limits, and the process inside
    assert devices.restore(host) == [f"cgroup {cgroup.name}"]
    assert cgroup.limits() == (64 * MIB, 0.5)
    proc = start_process("sleeper", ["sleep", "300"], tmp_path, dict(os.environ), host=host)
    try:
        assert cgroup.holds(proc.pid)
        host.check(proc.pid)
    finally:
        proc.stop()


def test_a_deleted_node_namespace_is_made_again_with_its_address(
    support: Support, devices: Devices
) -> None:
    if devices is None or not support.namespaces:
        return
    host = devices.device(1, None, None)
    assert host.namespace in _namespaces()
    subprocess.run(["ip", "netns", "delete", host.namespace], check=True, timeout=30)
    assert devices.restore(host) == [f"network namespace {host.namespace}"]
    shown = subprocess.run([*host.prefix, "ip", "-4", "addr", "show", "eth0"],
                           capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    assert f"{host.address}/24" in shown
    assert "LOWER_UP" in shown  # its link has a carrier: the peer end is up
    peer = subprocess.run(["ip", "-n", devices.link.namespace, "link", "show", "veth1"],
                          capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    assert "master br0" in peer and "LOWER_UP" in peer  # on the SuperLink's bridge again
    assert devices.restore(host) == []  # all there: nothing to make
