"""Run ``flwr run . --stream`` programmatically against a private local SuperLink.

``flwr run`` starts a local SuperLink daemon on first use and leaves it running, shared by
every later ``flwr run`` on the machine (DESIGN: "Flower facts that bite").
:class:`LocalSimulation` gives it its own ``FLWR_HOME`` and free ports, so it never touches
another SuperLink, checks each run's real status with ``flwr ls`` (``flwr run --stream`` exits
0 even when the ServerApp fails), and stops exactly the SuperLink it started.
Used by the tests, ``run_sim.py --engine flower`` and the benchmarks.
"""

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FlwrRun", "LocalSimulation", "toml_value"]

#: the project root (where pyproject.toml lives)
PROJECT = Path(__file__).resolve().parents[1]
#: flwr and flower-superlink of this interpreter's environment
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def toml_value(value: Any) -> str:
    """Render a run_config value for ``--run-config`` (TOML-typed)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value + "'"
    return repr(value)


def superlink_pids(port: int) -> list[int]:
    """Return the PIDs of ``flower-superlink`` processes listening on ``port``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any("flower-superlink" in a for a in argv) and str(port) in argv:
            pids.append(int(proc.name))
    return pids


@dataclass
class FlwrRun:
    """Outcome of one ``flwr run``.

    Attributes
    ----------
    output : str
        What the CLI printed (stdout and stderr).
    status : str
        The run's status from ``flwr ls`` (``finished:completed``, ``finished:failed``, ...).
    details : str
        ``status-details`` (the ServerApp's exception on failure).
    folder : pathlib.Path
        The run folder (``output-dir / run-name``).
    """

    output: str
    status: str
    details: str
    folder: Path

    @property
    def summary(self) -> dict:
        """The run's ``summary.json``."""
        return json.loads((self.folder / "summary.json").read_text())


class LocalSimulation:
    """``flwr run`` with an isolated ``FLWR_HOME`` and SuperLink ports.

    Parameters
    ----------
    home : pathlib.Path
        Private ``FLWR_HOME`` (created).
    output_dir : pathlib.Path
        Where run folders go (``output-dir`` of every run).
    project : pathlib.Path, optional
        The Flower app to run (default: this project).
    ray_address : str, optional
        Attach the simulation to this existing Ray cluster (``host:port`` of a
        ``ray start --head``, or ``ray://host:10001``), passed as ``RAY_ADDRESS`` to the
        SuperLink this object starts (docs/ray-cluster.md). Default: each run starts its
        own single-machine Ray instance.
    """

    def __init__(
        self,
        home: Path,
        output_dir: Path,
        project: Path = PROJECT,
        ray_address: str | None = None,
    ) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home, self.output_dir, self.project = home, output_dir, project
        self.http_port = _free_port()
        self.control_port = _free_port()
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
        if ray_address is not None:
            self.env["RAY_ADDRESS"] = ray_address
        #: put before every ``flwr`` command (e.g. ``ip netns exec NS`` to run the CLI in
        #: the network namespace of a rehearsal's SuperLink, flower_app.deploy.rehearsal)
        self.prefix: list[str] = []

    def run(
        self,
        run_config: dict[str, Any],
        num_supernodes: int | None = 2,
        connection: str | None = None,
        timeout: float = 3600.0,
        federation_config: dict[str, Any] | None = None,
    ) -> FlwrRun:
        """Run the app once and return its outcome (status checked with ``flwr ls``).

        Parameters
        ----------
        run_config : dict
            ``--run-config`` overrides; ``output-dir`` defaults to the object's,
            ``run-name`` to a fresh name.
        num_supernodes : int or None, optional
            Simulated SuperNodes (with ``client-resources-num-cpus=1``); None for a
            deployment connection that has its own SuperNodes.
        connection : str, optional
            Name of a SuperLink connection in ``FLWR_HOME/config.toml`` (default: local).
        timeout : float, optional
            Seconds allowed for the command.
        federation_config : dict, optional
            Extra or overriding ``--federation-config`` keys (e.g.
            ``{"client-resources-num-cpus": 2}``); only with ``num_supernodes``.

        Returns
        -------
        FlwrRun
            CLI output, status and run folder.

        Raises
        ------
        RuntimeError
            If ``flwr run`` did not even start a run.
        """
        name = run_config.get("run-name") or f"run-{time.monotonic_ns()}"
        cfg = {"output-dir": str(self.output_dir), **run_config, "run-name": name}
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in cfg.items())
        cmd = [*self.prefix, str(BIN / "flwr"), "run", "."]
        cmd += [connection] if connection else []
        cmd += ["--stream", "--run-config", overrides]
        if num_supernodes is not None:
            fed = {
                "num-supernodes": num_supernodes,
                "client-resources-num-cpus": 1,
                **(federation_config or {}),
            }
            cmd += ["--federation-config", " ".join(f"{k}={toml_value(v)}" for k, v in fed.items())]
        proc = subprocess.run(
            cmd, cwd=self.project, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        output = proc.stdout + proc.stderr
        match = re.search(r"Successfully started run (\d+)", output)
        if not match:
            raise RuntimeError(f"flwr run did not start a run:\n{output[-4000:]}")
        status, details = self.status(int(match.group(1)))
        return FlwrRun(output, status, details, Path(cfg["output-dir"]) / name)

    def status(self, run_id: int) -> tuple[str, str]:
        """Return ``(status, status-details)`` of a run from ``flwr ls --format json``."""
        proc = subprocess.run(
            [*self.prefix, str(BIN / "flwr"), "ls", "--format", "json"],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        data = json.loads(proc.stdout[proc.stdout.index("{") :])
        for run in data.get("runs", []):
            if int(run.get("run-id", -1)) == run_id:
                return str(run.get("status")), str(run.get("status-details", ""))
        raise RuntimeError(f"run {run_id} not listed by flwr ls:\n{proc.stdout}")

    def stop(self) -> None:
        """Stop the local SuperLink this object's runs started (matched by its port)."""
        for pid in superlink_pids(self.http_port):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
