"""Find and stop every process a run started, by a token in its environment.

A test run (or any other owner) puts ``FLOWER_APP_PROCESS_TOKEN=<unique token>`` into its
own environment before it starts anything. Every process it starts inherits the variable:
SuperLinks, SuperNodes and their superexec/ClientApp children, ``flwr run``, Ray's GCS,
raylets and workers (Ray passes the raylet's environment to its workers), xdist workers.
Processes started by anyone else do not carry that token, so stopping "every process
whose ``/proc/PID/environ`` holds the token" stops exactly ours, never another
checkout's SuperLink or Ray (never a match on a program name).

:func:`sweep` does that (SIGTERM, a grace period, then SIGKILL). :func:`spawn_reaper` starts
a small watchdog in a session of its own that waits for the owner to exit, however it
exits (normal end, failure, Ctrl-C, SIGTERM from ``timeout``, even SIGKILL), then sweeps
and writes what it found to a report file. Used by ``tests/conftest.py``.

After the sweep the watchdog also removes the network namespaces and cgroups that exited
processes left behind (:func:`flower_app.deploy.isolation.remove_stale`): a rehearsal names
them ``fa-<pid>-...`` after the run's process that made them, which is dead by then, so a
run stopped from outside leaves none; objects named after a live process (another run's
rehearsal) stay.

Run as ``python -m flower_app.process_sweep --token T --after PID [--report FILE]``.
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

__all__ = ["TOKEN_VAR", "new_token", "processes_with_token", "spawn_reaper", "sweep"]

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


def _cmdline(pid: int) -> str:
    raw = procfs.cmdline(pid)
    if raw is None:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]


def sweep(token: str, grace: float = 20.0, exclude: Iterable[int] = ()) -> dict[int, str]:
    """Stop every process carrying ``token``: SIGTERM, wait up to ``grace`` s, SIGKILL.

    Parameters
    ----------
    token : str
        The run's token.
    grace : float, optional
        Seconds a process gets to exit after SIGTERM.
    exclude : iterable of int, optional
        PIDs never to signal (the caller is always left out).

    Returns
    -------
    dict
        ``{pid: command line}`` of the processes found alive (empty when nothing was left).
    """
    exclude = set(exclude)
    found = {pid: _cmdline(pid) for pid in processes_with_token(token, exclude)}
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while processes_with_token(token, exclude) and time.monotonic() < deadline:
        time.sleep(0.2)
    # anything still there, or started meanwhile by a dying parent
    for _ in range(5):
        left = processes_with_token(token, exclude)
        if not left:
            break
        for pid in left:
            found.setdefault(pid, _cmdline(pid))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while processes_with_token(token, exclude) and time.monotonic() < end:
            time.sleep(0.1)
    return found


def spawn_reaper(
    token: str, owner: int, report: Path | None = None, remove: Iterable[str] = ()
) -> subprocess.Popen:
    """Start a watchdog that sweeps ``token`` once process ``owner`` has exited.

    The watchdog runs in a session of its own (a ``timeout`` or Ctrl-C aimed at the owner's
    process group does not reach it) and without the token in its environment.

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
    cmd = [sys.executable, "-m", __name__, "--token", token, "--after", str(owner)]
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
    from flower_app.deploy.isolation import remove_stale

    remove_stale()
    if args.report is not None:
        args.report.write_text("".join(f"{pid} {cmd}\n" for pid, cmd in sorted(found.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
