"""Shared fixtures: a real `flwr run` against a local SuperLink this test session owns."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # flwr and flower-superlink of this interpreter's environment


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _superlink_pids(port: int) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [c.decode(errors="replace") for c in cmd]
        if any("flower-superlink" in c for c in text) and str(port) in text:
            pids.append(int(proc.name))
    return pids


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return "'" + value + "'"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


@dataclass
class FlwrRun:
    """Outcome of one `flwr run`: the CLI output, the run's status and its run folder."""

    output: str
    status: str
    details: str
    folder: Path

    @property
    def summary(self) -> dict:
        return json.loads((self.folder / "summary.json").read_text())


class FlowerCLI:
    """Runs `flwr run . --stream` with an isolated FLWR_HOME and SuperLink ports."""

    def __init__(self, home: Path, runs: Path) -> None:
        self.http_port = _free_port()
        self.control_port = _free_port()
        self.runs = runs
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(self.control_port),
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        }

    def run(
        self, run_config: dict, num_supernodes: int | None = 2, timeout: float = 600
    ) -> FlwrRun:
        name = run_config.get("run-name") or f"run-{time.monotonic_ns()}"
        cfg = {**run_config, "run-name": name, "output-dir": str(self.runs)}
        overrides = " ".join(f"{k}={_toml_value(v)}" for k, v in cfg.items())
        cmd = [
            str(BIN / "flwr"),
            "run",
            ".",
            "--stream",
            "--run-config",
            overrides,
        ]
        if num_supernodes is not None:  # simulation: the federation's size
            cmd += [
                "--federation-config",
                f"num-supernodes={num_supernodes} client-resources-num-cpus=1",
            ]
        proc = subprocess.run(
            cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        output = proc.stdout + proc.stderr
        match = re.search(r"Successfully started run (\d+)", output)
        assert match, f"flwr run did not start a run:\n{output}"
        status, details = self.status(int(match.group(1)))
        return FlwrRun(output, status, details, self.runs / name)

    def status(self, run_id: int) -> tuple[str, str]:
        proc = subprocess.run(
            [str(BIN / "flwr"), "ls", "--format", "json"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        data = json.loads(proc.stdout[proc.stdout.index("{") :])
        for run in data.get("runs", []):
            if int(run.get("run-id", -1)) == run_id:
                return str(run.get("status")), str(run.get("status-details", ""))
        raise AssertionError(f"run {run_id} not listed by flwr ls:\n{proc.stdout}")

    def stop(self) -> None:
        for pid in _superlink_pids(self.http_port):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


class Deployment:
    """A real SuperLink and SuperNodes (deployment mode, no simulation) on loopback."""

    def __init__(self, root: Path, num_nodes: int) -> None:
        self.root = root
        self.port = _free_port()
        self.procs: list[subprocess.Popen] = []
        home = root / "home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self.cli = FlowerCLI(home, root / "runs")
        self.cli.env.pop("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT")
        self._start(
            "superlink", [str(BIN / "flower-superlink"), "--insecure", "--port", str(self.port)]
        )
        for p in range(num_nodes):
            node_home = root / f"node-{p}"
            node_home.mkdir()
            self._start(
                f"supernode-{p}",
                [
                    str(BIN / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(_free_port()),
                    "--node-config",
                    f"partition-id={p} num-partitions={num_nodes}",
                ],
                FLWR_HOME=str(node_home),
            )

    def _start(self, name: str, cmd: list[str], **env: str) -> None:
        log = (self.root / f"{name}.log").open("w")
        self.procs.append(
            subprocess.Popen(
                cmd,
                env={**self.cli.env, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        time.sleep(1.0)

    def run(self, run_config: dict, timeout: float = 600) -> FlwrRun:
        return self.cli.run(run_config, num_supernodes=None, timeout=timeout)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    dep = Deployment(tmp_path_factory.mktemp("deployment"), num_nodes=3)
    try:
        yield dep
    finally:
        dep.stop()


@pytest.fixture(scope="session")
def flower_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerCLI]:
    cli = FlowerCLI(tmp_path_factory.mktemp("flwr-home"), tmp_path_factory.mktemp("runs"))
    try:
        yield cli
    finally:
        cli.stop()


def pytest_configure(config: pytest.Config) -> None:
    """With FLOWER_APP_REALDATA=1 (CI), also run the tests marked ``realdata``."""
    if os.environ.get("FLOWER_APP_REALDATA") == "1" and config.option.markexpr == (
        "not realdata and not slow"
    ):
        config.option.markexpr = "not slow"
