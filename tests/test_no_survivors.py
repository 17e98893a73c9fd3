"""Nothing a test run starts outlives it: a pytest run (two xdist workers) that has a Ray head,
a real `flwr run`'s SuperLink and an in-process Flower run going is stopped from outside with
SIGTERM to its process group (what `timeout` sends), and no process of it is left.

Survivors are looked for by the rule the watchdog stops them by
(:func:`tests.support.process_sweep.run_processes`: the run's token in ``/proc/PID/environ``, a
working directory or open file under the run's scratch folders, or descent from such a
process), never by a program name: other checkouts' SuperLinks and Ray run on this machine
too. The token alone missed Ray's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``):
``setproctitle`` overwrites part of their environment, and they outlive their raylet.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from flower_app import procfs
from tests.support import process_sweep

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


#: the inner run's processes the test looks for among the run's (by the sweep's rule): the
#: real `flwr run`'s SuperLink, the Ray head's raylet and its agents
CHECKED = ("flower-superlink", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _commands(token: str) -> str:
    """The command lines of the run's processes now, joined."""
    return " ".join(
        " ".join(procfs.argv(pid) or []) for pid in process_sweep.run_processes(token)
    )


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:.0f} s")
        time.sleep(0.2)


# a pytest run of its own with a Ray head and a SuperLink (~20 s, most of a core): CI runs it
@pytest.mark.long
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
        # the Ray head's agents are the run's too, whether or not their environment still
        # shows the token (a SIGTERM'd CI run left them behind when only that was looked
        # at). Ray starts them after its head is up, so they may come seconds after the
        # inner test's marker (a CI run looked at once and missed `ray::DashboardAgent`):
        # wait, bounded, until every process checked for is there, then act
        commands = _commands(token)
        deadline = time.monotonic() + 300
        while not all(what in commands for what in CHECKED):
            assert inner.poll() is None, (tmp_path / "inner.log").read_text()[-4000:]
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
            commands = _commands(token)
        for what in CHECKED:
            assert what in commands, (what, commands)

        os.killpg(inner.pid, signal.SIGTERM)  # as `timeout` does: the whole process group
        inner.wait(timeout=120)
        # the watchdog sweeps once pytest has exited; nothing of the run may remain
        _wait(lambda: not process_sweep.run_processes(token), 180, "no survivors")
        _wait(report.exists, 60, "the watchdog's report")
    finally:
        left = process_sweep.sweep(token, grace=5)
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()
        log.close()
    assert left == {}, left


def _start(code: str, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd="/",
                            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


#: a process that forks, the parent exits (the child is an orphan, as Ray's agents are once
#: their raylet is gone), and the child holds a file open under argv[1] and writes its PID
ORPHAN = """
import os, sys, time
if os.fork():
    os._exit(0)
with open(os.path.join(sys.argv[1], "log"), "w") as log:
    (open(sys.argv[2] + ".tmp", "w").write(str(os.getpid())), os.replace(sys.argv[2] + ".tmp",
                                                                          sys.argv[2]))
    time.sleep(600)
"""
#: a process that starts a child with an empty environment (no token) and waits
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={}, cwd="/")
open(sys.argv[1] + ".tmp", "w").write(str(child.pid))
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def test_sweep_finds_the_runs_processes_without_its_token_and_no_others(tmp_path: Path) -> None:
    """The rules of :func:`process_sweep.run_processes` on real processes: an orphan without
    the token that holds a file open in the run's scratch folder, and a child started with an
    empty environment by a process with the token, are the run's and are stopped; the same
    kinds of process of another token's run are left alone."""
    ours, theirs = process_sweep.new_token(), process_sweep.new_token()
    clean = {k: v for k, v in os.environ.items() if k != process_sweep.TOKEN_VAR}
    procs, pids = [], {}
    folders = []
    try:
        for name, token in (("ours", ours), ("theirs", theirs)):
            scratch = tempfile.mkdtemp(prefix=Path(process_sweep.scratch_prefix(token)).name,
                                       dir="/tmp")  # fmt: skip
            folders.append(scratch)
            procs.append(_start(ORPHAN, clean, scratch, str(tmp_path / f"{name}-orphan")))
            procs.append(_start(PARENT, {**clean, process_sweep.TOKEN_VAR: token},
                                str(tmp_path / f"{name}-child")))  # fmt: skip
            pids[name] = {procs[-1].pid}
        for name in ("ours", "theirs"):
            for kind in ("orphan", "child"):
                path = tmp_path / f"{name}-{kind}"
                _wait(path.exists, 120, f"{name} {kind}")
                pids[name].add(int(path.read_text()))
        assert process_sweep.processes_with_token(ours) == [procs[1].pid]  # the token alone
        assert process_sweep.run_processes(ours) == sorted(pids["ours"])
        assert process_sweep.run_processes(theirs) == sorted(pids["theirs"])

        swept = process_sweep.sweep(ours, grace=30)
        assert sorted(swept) == sorted(pids["ours"])
        assert not any(procfs.alive(pid) for pid in pids["ours"])
        assert all(procfs.alive(pid) for pid in pids["theirs"])
    finally:
        for pid in pids.get("ours", set()) | pids.get("theirs", set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=30)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
