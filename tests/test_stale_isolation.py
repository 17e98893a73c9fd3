"""Namespaces and cgroups an exited process left behind are removed; a live process's stay.

A rehearsal names its network namespaces and cgroups ``fa-<pid>-r<n>-...`` after the process
that made them (``r<n>``: its n-th rehearsal, so that two in one process differ); one killed
without closing leaves them. Real objects (``ip netns``, the machine's
cgroup hierarchy), no mocks: one set named after a process that has exited (with a process
of ours still inside its cgroup and namespace, and a veth link to the other set), one named
after a process that runs; each of the three sweepers (:func:`remove_stale` itself, a new
:class:`Devices`, the test run's watchdog) must remove the first and leave the second.

Needs root and ``ip``; where :func:`rehearsal.isolation.probe` says namespaces or
cgroups are unavailable, that part is not made and the probe must have said why (as the
deploy tests do with the rehearsal's fallbacks).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from flower_app import procfs
from rehearsal.isolation import Cgroup, Devices, Host, Support, probe, remove_stale
from tests.support import process_sweep


@pytest.fixture(scope="module")
def support() -> Support:
    """What this machine offers (the rehearsal's own probe)."""
    return probe()


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, f"ip {' '.join(args)}: {proc.stderr}"
    return proc.stdout


class Made:
    """A namespace and a cgroup ``fa-<pid>-r1-stale``, named as a rehearsal's (each where the
    probe says it can be)."""

    def __init__(self, pid: int, support: Support) -> None:
        self.name = f"fa-{pid}-r1-stale"
        self.namespace: str | None = None
        self.cgroup: Cgroup | None = None
        if support.namespaces:
            _ip("netns", "add", self.name)
            self.namespace = self.name
        if support.cgroups:
            self.cgroup = Cgroup.create(self.name, 64 << 20, 0.5)

    def host(self) -> Host:
        """Where a process runs inside both."""
        prefix = ["ip", "netns", "exec", self.namespace] if self.namespace else []
        return Host("127.0.0.1", prefix, self.cgroup, self.name)

    def present(self) -> dict[str, bool]:
        """Whether each object exists now."""
        out = {}
        if self.namespace is not None:
            out[f"namespace {self.namespace}"] = self.namespace in _namespaces()
        for d in self.cgroup.dirs if self.cgroup is not None else []:
            out[f"cgroup {d}"] = d.is_dir()
        return out

    def remove(self) -> None:
        """Remove whatever is still there (only our own test processes can be inside)."""
        if self.cgroup is not None and any(d.exists() for d in self.cgroup.dirs):
            self.cgroup.remove()
        if self.namespace is not None and self.namespace in _namespaces():
            subprocess.run(["ip", "netns", "delete", self.namespace], timeout=30)


def _ours(errors: list[str], dead: int) -> list[str]:
    """The errors about this test's objects (others' may be anything)."""
    return [e for e in errors if f"fa-{dead}-" in e]


def _by_remove_stale(dead: int) -> None:
    stale = remove_stale()
    assert not _ours(stale.errors, dead), stale


def _by_new_devices(dead: int) -> None:
    devices = Devices(namespaces=False)  # makes nothing of its own until device() is called
    try:
        assert not _ours(devices.stale.errors, dead), devices.stale
    finally:
        devices.close()


def _by_watchdog(dead: int) -> None:
    """The test run's watchdog, its owner being the exited process (returns at once)."""
    cmd = [sys.executable, process_sweep.__file__, "--token", process_sweep.new_token(),
           "--after", str(dead)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def live() -> Iterator[subprocess.Popen]:
    """A process of ours that runs for the whole test (stopped at its end)."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    "sweeper", [_by_remove_stale, _by_new_devices, _by_watchdog], ids=["remove_stale", "devices",
                                                                         "watchdog"]
)  # fmt: skip
def test_objects_of_an_exited_process_are_removed_and_a_live_ones_stay(
    support: Support, live: subprocess.Popen, sweeper: Callable[[int], None]
) -> None:
    if not (support.namespaces or support.cgroups):
        assert support.why_not  # the probe said why (root, ip, cgroup controllers)
        assert not remove_stale()  # and nothing is removed where nothing can be made
        return
    # the objects' owner exits only just before the sweep: until then no other sweeper (a
    # concurrent test run's watchdog, a rehearsal's Devices) may take them for stale
    owner = subprocess.Popen(["sleep", "300"])
    dead = owner.pid
    old, new = None, None
    inside: subprocess.Popen | None = None
    try:
        old = Made(dead, support)
        new = Made(live.pid, support)
        if old.namespace and new.namespace:  # a veth link between them, as a rehearsal's
            _ip("link", "add", "eth0", "netns", old.namespace, "type", "veth", "peer", "name",
                "vstale", "netns", new.namespace)  # fmt: skip
        # a process left inside the exited one's namespace and cgroup (a SuperNode's, say)
        inside = subprocess.Popen(old.host().command(["sleep", "300"]))
        deadline = time.monotonic() + 60
        while (procfs.argv(inside.pid) or [""])[0] != "sleep":  # in both, at its command
            assert inside.poll() is None and time.monotonic() < deadline, "did not start"
            time.sleep(0.02)
        if old.cgroup is not None:
            assert inside.pid in old.cgroup.pids()

        owner.kill()
        owner.wait()
        assert not procfs.alive(dead) and procfs.alive(live.pid)
        sweeper(dead)

        assert not any(old.present().values()), old.present()
        assert all(new.present().values()), new.present()
        assert inside.wait(timeout=30) == -signal.SIGKILL  # killed by PID, not left running
        if old.namespace and new.namespace:  # the link (and its addresses) went too
            assert "vstale" not in _ip("-n", new.namespace, "link", "show")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if inside is not None and inside.poll() is None:
            inside.kill()
            inside.wait()
        for made in (old, new):
            if made is not None:
                with contextlib.suppress(OSError):
                    made.remove()
