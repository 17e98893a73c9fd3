"""``flower-app run`` (an honest exit code) and ``flower-app stop`` (one local SuperLink).

``run`` wraps ``flwr run``; ``stop`` stops exactly the local SuperLink of one ``FLWR_HOME``.

Flower facts this module works around (flwr 1.41/1.42):

- ``flwr run --stream`` exits 0 when the run fails; the run's real outcome is its status in
  ``flwr ls`` (``finished:completed``, ``finished:failed``, ``finished:stopped``) with the
  error in ``status-details``.
- The first ``flwr run`` (or ``flwr ls``) against the ``local`` SuperLink starts a
  ``flower-superlink`` daemon and leaves it running. Its command line names its database
  ``$FLWR_HOME/local-superlink/state.db``, which identifies the daemon of one ``FLWR_HOME``
  without touching any other SuperLink on the machine.
- The ServerApp and ClientApps run from Flower's installed copy of the app
  (``$FLWR_HOME/apps/<publisher>.<name>.<version>.<hash>/``), so tracebacks name files there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from flower_app.quiet import is_noise

__all__ = ["flwr_home", "local_superlink_pids", "run_app", "stop_local_superlink"]

#: flwr and flower-superlink of this interpreter's environment
BIN = Path(sys.executable).parent
_STARTED = re.compile(r"Successfully started run (\d+)")
_APP_COPY = re.compile(r"(\S*?/apps/[^/\s]+\.[^/\s]+\.[^/\s]+\.[0-9a-f]{6,}/)")


def flwr_home() -> Path:
    """Return Flower's home folder: ``$FLWR_HOME`` or ``~/.flwr`` (as ``flwr`` does)."""
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr").expanduser().resolve()


def local_superlink_pids(home: Path | None = None) -> list[int]:
    """Return the PIDs of ``flower-superlink`` daemons whose database is in ``home``."""
    marker = f"{home or flwr_home()}/local-superlink/"
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.endswith("flower-superlink") for a in argv[:2]) and any(
            a.startswith(marker) for a in argv
        ):
            pids.append(int(proc.name))
    return sorted(pids)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for key, value in (
        ("FLWR_TELEMETRY_ENABLED", "0"),
        ("FLWR_DISABLE_UPDATE_CHECK", "1"),
        ("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1"),
    ):
        env.setdefault(key, value)
    return env


def _status(run_id: int, superlink: str | None, env: dict[str, str]) -> tuple[str, str]:
    cmd = [str(BIN / "flwr"), "ls", *([superlink] if superlink else [])]
    cmd += ["--run-id", str(run_id), "--format", "json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout
    try:
        data = json.loads(out[out.index("{") :])
    except ValueError:
        return "unknown", f"flwr ls failed: {(out + proc.stderr).strip()[-500:]}"
    for entry in data.get("runs", []):
        if int(entry.get("run-id", -1)) == run_id:
            return str(entry.get("status")), str(entry.get("status-details", ""))
    return "unknown", f"run {run_id} is not listed by flwr ls"


def run_app(
    app: str = ".",
    superlink: str | None = None,
    run_config: str | None = None,
    federation_config: str | None = None,
    filter_noise: bool = True,
) -> int:
    """Run ``flwr run APP [SUPERLINK] --stream``, stream its log, return the run's exit code.

    Returns
    -------
    int
        0 if the run finished ``completed``; otherwise ``flwr run``'s own non-zero code, or
        1 (the status and its details are printed to stderr).
    """
    app_dir = Path(app).resolve()
    env = _env()
    cmd = [str(BIN / "flwr"), "run", str(app_dir), *([superlink] if superlink else []), "--stream"]
    if run_config:
        cmd += ["--run-config", run_config]
    if federation_config:
        cmd += ["--federation-config", federation_config]
    run_id: int | None = None
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            match = _STARTED.search(line)
            if match:
                run_id = int(match.group(1))
            if filter_noise and is_noise(line):
                continue
            sys.stdout.write(_APP_COPY.sub(f"{app_dir}/", line))
            sys.stdout.flush()
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        print("flower-app run: interrupted (the run may go on: flwr stop <run-id>)",
              file=sys.stderr)  # fmt: skip
        return 130
    if run_id is None:
        print(f"flower-app run: flwr run did not start a run (exit code {code})", file=sys.stderr)
        return code or 1
    status, details = _status(run_id, superlink, env)
    deadline = time.monotonic() + 120.0  # the stream can end just before the status flips
    while not status.startswith("finished") and time.monotonic() < deadline:
        time.sleep(0.5)
        status, details = _status(run_id, superlink, env)
    if status == "finished:completed":
        return 0
    print(f"flower-app run: run {run_id} ended {status}" + (f": {details}" if details else ""),
          file=sys.stderr)  # fmt: skip
    return code or 1


def stop_local_superlink(home: Path | None = None, timeout: float = 15.0) -> int:
    """Stop the local SuperLink daemon of ``home`` (default :func:`flwr_home`) by PID.

    SIGTERM, then SIGKILL after ``timeout`` seconds. Other SuperLinks on the machine (other
    ``FLWR_HOME``\\ s, deployments) are never signalled.

    Returns
    -------
    int
        0 (also when none was running; the message says so).
    """
    home = home or flwr_home()
    pids = local_superlink_pids(home)
    if not pids:
        print(f"flower-app stop: no local SuperLink of {home} is running")
        return 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pids):
        time.sleep(0.1)
    for pid in _alive(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    print(f"flower-app stop: stopped the local SuperLink of {home} (PID "
          f"{', '.join(map(str, pids))})")  # fmt: skip
    return 0


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":  # a zombie has exited (its parent has not reaped it yet)
            out.append(pid)
    return out
