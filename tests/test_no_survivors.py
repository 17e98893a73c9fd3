"""Nothing a test run starts outlives it: a pytest run (two xdist workers) that has a Ray head,
a real `flwr run`'s SuperLink and an in-process Flower run going is stopped from outside with
SIGTERM to its process group (what `timeout` sends), and no process of it is left.

Survivors are looked for by the run's own token (``FLOWER_APP_PROCESS_TOKEN`` in
``/proc/PID/environ``), never by a program name: other checkouts' SuperLinks and Ray run on
this machine too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flower_app import process_sweep

TESTS = Path(__file__).resolve().parent

#: the inner run's test file: each test starts processes, says so, then waits to be stopped
INNER = '''
import threading
from pathlib import Path

import pytest

READY = Path({ready!r})


def _hold(name):
    (READY / name).write_text("up")
    threading.Event().wait()  # until the run is stopped from outside


def test_real_flwr_run_superlink(flwr_cli):
    flwr_cli.start()  # the local SuperLink (and its superexec) of a real `flwr run`
    _hold("superlink")


def test_in_process_run_on_the_ray_head(flower_cli, tmp_path):
    threading.Thread(
        target=flower_cli.run,
        args=({{"k": 3, "seed": 1, "output-dir": str(tmp_path)}},),
        kwargs={{"num_supernodes": 2}},
        daemon=True,
    ).start()
    _hold("ray")
'''


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:.0f} s")
        time.sleep(0.2)


def test_sigterm_to_a_test_run_leaves_no_process_behind(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    (tmp_path / "test_inner.py").write_text(INNER.format(ready=str(ready)))
    (tmp_path / "conftest.py").write_text(  # the project's fixtures and hooks, as they are
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "spec = importlib.util.spec_from_file_location("
        f"'project_conftest', {str(TESTS / 'conftest.py')!r})\n"
        "project = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(project)\n"
        "ray_head, flower_cli, flwr_cli = project.ray_head, project.flower_cli, project.flwr_cli\n"
        "pytest_configure = project.pytest_configure\n"
    )
    token = process_sweep.new_token()
    report = tmp_path / "swept.txt"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FLOWER_APP_PROCESS_OWNER", "PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST")
    }
    env.update({process_sweep.TOKEN_VAR: token, "FLOWER_APP_SWEEP_REPORT": str(report)})
    log = (tmp_path / "inner.log").open("w")
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "load", "-p", "no:cacheprovider",
         "-o", "addopts=", "-q", str(tmp_path / "test_inner.py")],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait(
            lambda: {p.name for p in ready.iterdir()} == {"superlink", "ray"}
            or inner.poll() is not None,
            600,
            "the inner run's processes up",
        )
        assert inner.poll() is None, (tmp_path / "inner.log").read_text()[-4000:]
        started = process_sweep.processes_with_token(token)
        commands = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                            for pid in started if Path(f"/proc/{pid}").exists())
        assert "flower-superlink" in commands and "raylet" in commands, commands

        os.killpg(inner.pid, signal.SIGTERM)  # as `timeout` does: the whole process group
        inner.wait(timeout=120)
        # the watchdog sweeps once pytest has exited; nothing with the token may remain
        _wait(lambda: not process_sweep.processes_with_token(token), 180, "no survivors")
        _wait(report.exists, 60, "the watchdog's report")
    finally:
        left = process_sweep.sweep(token, grace=5)
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()
        log.close()
    assert left == {}, left
