"""Find and stop every process a run started (by token, scratch folder or descent).

A test run (or any other owner) puts ``FLOWER_APP_PROCESS_TOKEN=<unique token>`` into its
own environment before it starts anything. Every process it starts inherits the variable:
SuperLinks, SuperNodes and their superexec/ClientApp children, ``flwr run``, Ray's GCS,
raylets and workers, xdist workers. The token alone does not find them all: Ray's agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and workers rename themselves with
``setproctitle``, which overwrites the memory that ``/proc/PID/cmdline`` *and*
``/proc/PID/environ`` are read from (the first part of the environment reads as NUL bytes);
the raylet passes them its environment in an order of its own, so whether the token is
among the overwritten entries changes from run to run. When their
raylet is stopped the agents do not exit; they are reparented to PID 1 (seen after a CI run
stopped with SIGTERM: two agents per Ray instance left, without the token). So a process
belongs to the run (:func:`run_processes`) when any of these holds:

1. **token**: its ``/proc/PID/environ`` holds ``TOKEN_VAR=token``;
2. **scratch**: its working directory or one of its open files lies under a folder of the
   run's scratch prefix (:func:`scratch_prefix`: ``/tmp/fa-ray-<last 8 hex digits of the
   token>-``). The run puts its Ray temp dirs there (the ``ray_head`` fixture's
   ``--temp-dir``, and ``RAY_TMPDIR`` for the Ray instances ``flwr run`` simulations start),
   and every Ray process keeps its log files in ``<temp dir>/session_*/logs`` open for its
   whole life, renamed or orphaned alike. Ray's command lines (``--session-dir`` ...) are
   not used: ``setproctitle`` overwrites them;
3. **descent**: its parent (or an ancestor) belongs to the run by 1 or 2, at the moment of
   looking.

Another checkout's processes carry another token, keep their files under another prefix (8
random hex digits apart) or ``/tmp/ray``, and descend from neither: none of the rules match
them (never a match on a program name).

:func:`sweep` stops the run's processes (SIGTERM, a grace period, then SIGKILL).
:func:`spawn_reaper` starts a small watchdog in a session of its own that waits for the
owner to exit, however it exits (normal end, failure, Ctrl-C, SIGTERM from ``timeout``, even
SIGKILL), then sweeps and writes what it found to a report file. Used by
``tests/conftest.py``.

After the sweep the watchdog also removes the network namespaces and cgroups that exited
processes left behind (:func:`rehearsal.isolation.remove_stale`): a rehearsal names
them ``fa-<pid>-...`` after the run's process that made them, which is dead by then, so a
run stopped from outside leaves none; objects named after a live process (another run's
rehearsal) stay.

Run as ``python tests/support/process_sweep.py --token T --after PID [--report FILE]`` (by
its path: the watchdog runs from ``/``, where the ``tests`` package is not importable; it
imports only the installed ``flower_app``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from flower_app import procfs

__all__ = [
    "TOKEN_VAR",
    "new_token",
    "processes_with_token",
    "run_processes",
    "scratch_prefix",
    "spawn_reaper",
    "sweep",
]

#: the environment variable that marks a run's processes
TOKEN_VAR = "FLOWER_APP_PROCESS_TOKEN"


def new_token() -> str:
    """Return a fresh token (unique to one run, never reused)."""
    return f"{os.getpid()}-{secrets.token_hex(8)}"


def processes_with_token(token: str, exclude: Iterable[int] = ()) -> list[int]:
    """Return the live (not zombie) PIDs whose environment holds ``TOKEN_VAR=token``.

    Parameters
    ----------
    token : str
        The run's token.
    exclude : iterable of int, optional
        PIDs to leave out (e.g. the caller and its ancestors).

    Returns
    -------
    list of int
        Matching PIDs, ascending.
    """
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for pid in procfs.pids(exclude):
        environ = procfs.environ(pid)  # None: gone, or not ours to read
        if environ is not None and needle in environ and procfs.alive(pid):
            found.append(pid)
    return sorted(found)


def scratch_prefix(token: str) -> str:
    """Return the path prefix of the run's scratch folders: ``/tmp/fa-ray-<token[-8:]>-``.

    The run creates its Ray temp dirs and other scratch folders as
    ``tempfile.mkdtemp(prefix=scratch_prefix(token)[5:], dir="/tmp")`` (short: Ray's socket
    paths live under them and must fit in 107 characters); :func:`run_processes` finds the
    processes that hold files open in them, and the watchdog deletes them.
    """
    return f"/tmp/fa-ray-{token[-8:]}-"


def _under(path: str | None, prefix: str) -> bool:
    return path is not None and path.startswith(prefix)


def run_processes(token: str, exclude: Iterable[int] = ()) -> list[int]:
    """Return the live PIDs that belong to the run of ``token`` (token, scratch or descent).

    The three rules are the module docstring's. The caller, ``exclude`` and the caller's
    ancestors are never returned (nor found through).

    Parameters
    ----------
    token : str
        The run's token.
    exclude : iterable of int, optional
        PIDs to leave out.

    Returns
    -------
    list of int
        Matching PIDs, ascending.
    """
    needle = f"{TOKEN_VAR}={token}".encode()
    prefix = scratch_prefix(token)
    skip = set(exclude)
    pid = os.getpid()
    while pid > 1:  # the caller's ancestors: never ours to stop
        skip.add(pid)
        fields = procfs.stat_fields(pid)
        pid = int(fields[1]) if fields else 0
    parent: dict[int, int] = {}
    found: set[int] = set()
    for pid in procfs.pids(skip):
        fields = procfs.stat_fields(pid)
        if fields is None or fields[0] == "Z":  # gone, or exited and unreaped
            continue
        parent[pid] = int(fields[1])
        environ = procfs.environ(pid) or ()
        if (
            needle in environ
            or _under(procfs.cwd(pid), prefix)
            or any(_under(path, prefix) for path in procfs.open_paths(pid) or ())
        ):
            found.add(pid)
    for pid in parent:  # descent: walk up to a found ancestor
        chain, up = [], pid
        while up in parent and up not in found:
            chain.append(up)
            up = parent[up]
        if up in found:
            found.update(chain)
    return sorted(found)


def _cmdline(pid: int) -> str:
    raw = procfs.cmdline(pid)
    if raw is None:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]


def sweep(token: str, grace: float = 20.0, exclude: Iterable[int] = ()) -> dict[int, str]:
    """Stop every process of the run of ``token``: SIGTERM, wait up to ``grace`` s, SIGKILL.

    The processes are :func:`run_processes`' (token, scratch or descent), looked for again
    after the grace period (a dying parent may have started one meanwhile).

    Parameters
    ----------
    token : str
        The run's token.
    grace : float, optional
        Seconds a process gets to exit after SIGTERM.
    exclude : iterable of int, optional
        PIDs never to signal (the caller and its ancestors are always left out).

    Returns
    -------
    dict
        ``{pid: command line}`` of the processes found alive (empty when nothing was left).
    """
    exclude = set(exclude)
    found = {pid: _cmdline(pid) for pid in run_processes(token, exclude)}
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(procfs.alive(pid) for pid in found) and time.monotonic() < deadline:
        time.sleep(0.2)
    # anything still there, or started meanwhile by a dying parent
    for _ in range(5):
        left = run_processes(token, exclude)
        if not left:
            break
        for pid in left:
            found.setdefault(pid, _cmdline(pid))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while any(procfs.alive(pid) for pid in left) and time.monotonic() < end:
            time.sleep(0.1)
    return found


def spawn_reaper(
    token: str, owner: int, report: Path | None = None, remove: Iterable[str] = ()
) -> subprocess.Popen:
    """Start a watchdog that sweeps ``token`` once process ``owner`` has exited.

    The watchdog runs in a session of its own (a ``timeout`` or Ctrl-C aimed at the owner's
    process group does not reach it), without the token in its environment and with ``/``
    as its working directory (no rule of :func:`run_processes` matches it once the owner,
    its parent, has exited).

    Parameters
    ----------
    token : str
        The run's token.
    owner : int
        PID to outlive (the test run's main process).
    report : pathlib.Path, optional
        File the watchdog writes the survivors it stopped to (one ``pid command`` a line).
    remove : iterable of str, optional
        Glob patterns (absolute) of the run's scratch folders to delete after the sweep
        (e.g. Ray heads' temp dirs, which a killed run cannot delete itself).

    Returns
    -------
    subprocess.Popen
        The watchdog.
    """
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--token", token, "--after", str(owner)]
    if report is not None:
        cmd += ["--report", str(report)]
    for pattern in remove:
        cmd += ["--remove", pattern]
    return subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
    )


def _wait_for_exit(pid: int) -> None:
    """Block until ``pid`` has exited (a zombie counts as exited)."""
    with contextlib.suppress(OSError):  # a pidfd: woken at exit, no polling
        fd = os.pidfd_open(pid)
        try:
            import select

            select.select([fd], [], [])
        finally:
            os.close(fd)
        return
    while procfs.alive(pid):
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the watchdog: wait for ``--after``, then sweep ``--token``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--token", required=True)
    parser.add_argument("--after", type=int, required=True, help="PID to wait for")
    parser.add_argument("--report", type=Path, help="write the survivors found here")
    parser.add_argument("--grace", type=float, default=20.0)
    parser.add_argument("--remove", action="append", default=[], help="glob to delete after")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the run
    _wait_for_exit(args.after)
    found = sweep(args.token, args.grace)
    for pattern in args.remove:
        for path in glob.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)
    # the run's namespaces and cgroups, named after its (now exited) processes; imported
    # here, once the run is over, so the waiting watchdog stays small
    from rehearsal.isolation import remove_stale

    remove_stale()
    if args.report is not None:
        args.report.write_text("".join(f"{pid} {cmd}\n" for pid, cmd in sorted(found.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
