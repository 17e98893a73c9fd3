"""What Linux's ``/proc`` says about processes: the one place the package reads it.

The package finds and stops exactly the processes it started — a LocalSimulation's
SuperLink and its runs, ``flower-app stop``'s local SuperLink, and in the tests' harnesses
(``tests/support/``) the loopback Ray cluster and the watchdog's token-carrying processes —
never others by name. Each of those
selects processes by what these functions read (command line, environment, process group
or session, state). A process that exits or is not ours to read while we look is skipped:
every reader returns None then.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "alive",
    "argv",
    "cmdline",
    "cwd",
    "environ",
    "open_paths",
    "pids",
    "stat_fields",
    "state",
]

_PROC = Path("/proc")


def pids(exclude: Iterable[int] = ()) -> list[int]:
    """Return the PIDs listed in ``/proc`` (this process and ``exclude`` left out)."""
    skip = {os.getpid(), *exclude}
    return [int(e.name) for e in _PROC.iterdir() if e.name.isdigit() and int(e.name) not in skip]


def cmdline(pid: int) -> bytes | None:
    """Return ``/proc/PID/cmdline`` as read (arguments separated by NUL bytes)."""
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None


def argv(pid: int) -> list[str] | None:
    """Return the command line split at NUL bytes (a trailing empty string included)."""
    raw = cmdline(pid)
    return None if raw is None else raw.decode(errors="replace").split("\0")


def environ(pid: int) -> list[bytes] | None:
    """Return the ``NAME=value`` entries of the process's initial environment."""
    try:
        return (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None


def cwd(pid: int) -> str | None:
    """Return the process's working directory (``/proc/PID/cwd``)."""
    try:
        return os.readlink(_PROC / str(pid) / "cwd")
    except OSError:
        return None


def open_paths(pid: int) -> list[str] | None:
    """Return what the process's open file descriptors point to (``/proc/PID/fd/*``).

    Files and folders as absolute paths; pipes, sockets and other anonymous objects as the
    kernel names them (``pipe:[123]``, ``socket:[456]``). A descriptor closed while we read
    is left out.
    """
    try:
        fds = list(os.scandir(_PROC / str(pid) / "fd"))
    except OSError:
        return None
    out = []
    for fd in fds:
        try:
            out.append(os.readlink(fd.path))
        except OSError:
            continue
    return out


def stat_fields(pid: int) -> list[str] | None:
    """Return the fields of ``/proc/PID/stat`` after the command: state ppid pgrp session …."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def state(pid: int) -> str | None:
    """Return the state letter (``R``, ``S``, ``Z``, …), or None if the process is gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def alive(pid: int) -> bool:
    """Return whether the process exists and has not exited (a zombie has, unreaped)."""
    return state(pid) not in (None, "Z")
