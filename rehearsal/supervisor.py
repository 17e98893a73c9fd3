"""Supervise what a deployment starts: every process reaped at once, what a dead one left stopped.

A SuperNode starts a ``flower-superexec``, which starts a ``flwr-clientapp`` per message; a
SuperLink starts one that starts a ``flwr-serverapp`` per run. Flower's own watch of the
parent (``--parent-pid``: ``os.kill(pid, 0)`` every 0.2 s) takes a zombie for alive: a
SIGKILLed SuperNode whose parent does not reap it stays a zombie, and its superexec lives
on (in the rehearsal it lived until teardown, 12.8 min, and started ClientApps for the
node's restarted SuperNode: two pollers on one node).

A :class:`Supervisor` watches every process given to it through a pidfd (the kernel wakes
it the moment the process exits; a thread per process, no polling), reaps it at once, and
stops, by PID with SIGKILL, every process the dead one left: those whose environment
carries its marker (:data:`~rehearsal.processes.MARKER_VAR`, which everything it
started inherits) and, for a device, whatever is still in its cgroup. It records a
:class:`Death`, sets the process's ``ended`` event (a restart waits for it, so it can never
hit the new process), and says what happened, unless the end was asked for
(:meth:`~rehearsal.processes.ManagedProcess.stop`) and nothing was left.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flower_app import procfs
from rehearsal.isolation import Cgroup
from rehearsal.processes import MARKER_VAR, ManagedProcess

__all__ = ["Death", "Supervisor", "marked", "program", "stop_marked"]

#: seconds the supervisor keeps killing a dead process's leftovers before it gives up
STOP_TIMEOUT = 15.0


@dataclass
class Death:
    """A supervised process that ended, and what it left behind.

    Attributes
    ----------
    name : str
        The process's label (``supernode-0``, ``superlink``).
    pid : int
        Its PID.
    returncode : int or None
        Its exit status (negative: the signal that killed it).
    noticed : float
        ``time.time()`` when the supervisor saw it end (within milliseconds of the end).
    expected : bool
        True when it was asked to stop.
    left : dict of int to str
        The processes it left running (PID -> program), stopped with SIGKILL.
    seconds : float
        From noticing the end to nothing of it left.
    errors : list of str
        What could not be stopped.
    """

    name: str
    pid: int
    returncode: int | None
    noticed: float
    expected: bool
    left: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def cause(self) -> str:
        """E.g. ``killed by SIGKILL``, ``exited with code 0``."""
        code = self.returncode
        if code is None:
            return "ended"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        return f"exited with code {code}"

    @property
    def left_cleanly(self) -> bool:
        """True for exit code 0 (a SuperNode that got SIGTERM deactivated itself first)."""
        return self.returncode == 0

    def describe(self) -> str:
        """One line: who ended how, and what was stopped after it."""
        text = f"{self.name} (pid {self.pid}) {self.cause}"
        if self.left:
            what = ", ".join(f"{name} (pid {pid})" for pid, name in sorted(self.left.items()))
            text += f"; stopped what it left within {self.seconds:.1f} s: {what}"
        else:
            text += "; nothing of it was left"
        if self.errors:
            text += f"; {'; '.join(self.errors)}"
        return text


def program(pid: int) -> str:
    """Return a process's program name (a Python script's own, e.g. ``flower-superexec``)."""
    argv = procfs.argv(pid) or [""]
    first = Path(argv[0]).name
    if first.startswith("python") and len(argv) > 1 and argv[1] and not argv[1].startswith("-"):
        return Path(argv[1]).name
    return first or f"pid {pid}"


def marked(marker: str, prefix: bool = False) -> list[int]:
    """Return the live PIDs whose environment has :data:`MARKER_VAR` ``= marker``.

    ``prefix``: every value that starts with ``marker`` (e.g. a whole rehearsal's tag).
    """
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for pid in procfs.pids():
        environ = procfs.environ(pid)  # None: gone, or not ours to read
        if environ is None:
            continue
        hit = any(e.startswith(needle) for e in environ) if prefix else needle in environ
        if hit and procfs.alive(pid):
            found.append(pid)
    return sorted(found)


def _leftovers(marker: str | None, cgroup: Cgroup | None, prefix: bool) -> list[int]:
    found = set(cgroup.pids()) if cgroup is not None else set()
    if marker:
        found |= set(marked(marker, prefix))
    found.discard(os.getpid())
    return sorted(p for p in found if procfs.alive(p))


def stop_marked(
    marker: str | None,
    cgroup: Cgroup | None = None,
    prefix: bool = False,
    timeout: float = STOP_TIMEOUT,
) -> tuple[dict[int, str], list[str]]:
    """SIGKILL, by PID, every process with ``marker`` (and every one in ``cgroup``).

    Returns
    -------
    tuple
        ``({pid: program}, errors)``: what was stopped, and what would not die within
        ``timeout`` seconds (a zombie counts as gone).
    """
    stopped: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while pids := _leftovers(marker, cgroup, prefix):
        for pid in pids:
            stopped.setdefault(pid, program(pid))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return stopped, [f"still running {timeout:g} s after SIGKILL: {pids}"]
        time.sleep(0.05)
    return stopped, []


class Supervisor:
    """Reap supervised processes the moment they end and stop what they left.

    Parameters
    ----------
    say : callable, optional
        Where it says what happened (default: stderr).
    """

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        #: every end seen, in order
        self.deaths: list[Death] = []
        self._lock = threading.Lock()

    def watch(self, proc: ManagedProcess, cgroup: Cgroup | None = None) -> None:
        """Supervise ``proc`` (call it right after starting it, before anything polls it).

        ``cgroup``: the device's cgroup, whose every process is the dead one's leftover.
        """
        fd = None
        if proc.popen.returncode is None:  # not reaped: its PID cannot have been reused
            with contextlib.suppress(AttributeError, OSError):
                fd = os.pidfd_open(proc.pid)
        threading.Thread(
            target=self._watch, args=(proc, cgroup, fd), name=f"supervise-{proc.name}",
            daemon=True,
        ).start()  # fmt: skip

    def _watch(self, proc: ManagedProcess, cgroup: Cgroup | None, fd: int | None) -> None:
        try:
            try:
                if fd is not None:  # readable once the process has exited
                    select.select([fd], [], [])
                proc.popen.wait()  # reaps it (at once after the pidfd woke us)
            finally:
                if fd is not None:
                    os.close(fd)
            noticed, start = time.time(), time.monotonic()
            left, errors = stop_marked(proc.marker, cgroup)
            death = Death(proc.name, proc.pid, proc.popen.returncode, noticed, proc.stopping,
                          left, time.monotonic() - start, errors)  # fmt: skip
            with self._lock:
                self.deaths.append(death)
            proc.death = death
            if not death.expected or death.left or death.errors:
                self.say(f"supervisor: {death.describe()}")
        finally:
            proc.ended.set()

    def wait(self, proc: ManagedProcess, timeout: float = 60.0) -> Death:
        """Wait until ``proc`` has ended and its leftovers are stopped; return its :class:`Death`.

        Raises
        ------
        TimeoutError
            If that takes longer than ``timeout`` seconds (e.g. it still runs).
        """
        if not proc.ended.wait(timeout) or proc.death is None:
            raise TimeoutError(f"{proc.name} (pid {proc.pid}) has not ended after {timeout:g} s")
        return proc.death
