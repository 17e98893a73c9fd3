"""Run ``flwr run . --stream`` programmatically against a private local SuperLink.

``flwr run`` starts a local SuperLink daemon on first use and leaves it running, shared by
every later ``flwr run`` on the machine (with the ``FLWR_HOME`` and ports of the first).
:class:`LocalSimulation` gives it its own ``FLWR_HOME`` and free ports, so it never touches
another SuperLink, checks each run's real status with ``flwr ls`` (``flwr run --stream`` exits
0 even when the ServerApp fails), and stops exactly the SuperLink it started.

It starts that SuperLink itself (the command ``flwr run`` would use) and waits for its health
endpoint with a generous deadline: ``flwr run`` then finds it running and never starts one
of its own, whose start-up Flower gives a fixed 15 s (``LOCAL_SUPERLINK_STARTUP_TIMEOUT``),
too short on a busy machine. Used by the tests, ``run_sim.py --engine flower`` and the
benchmarks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flower_app import procfs
from flower_app.cli.run import BIN, free_ports, start_local_superlink, superlink_pids

__all__ = ["FlwrRun", "LocalSimulation", "free_ports", "superlink_pids", "toml_value"]

_log = logging.getLogger(__name__)

#: the project root (where pyproject.toml lives)
PROJECT = Path(__file__).resolve().parents[1]


def toml_value(value: Any) -> str:
    """Render a run_config value for ``--run-config`` (TOML-typed)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value + "'"
    return repr(value)


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
        self.http_port, self.control_port = free_ports(2)
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
        self.superlink: subprocess.Popen | None = None
        #: put before every ``flwr`` command (e.g. ``ip netns exec NS`` to run the CLI in
        #: the network namespace of a rehearsal's SuperLink: the repository's rehearsal/)
        self.prefix: list[str] = []

    @property
    def superlink_log(self) -> Path:
        """The log file of the SuperLink :meth:`start` starts."""
        return self.home / "local-superlink" / "superlink.log"

    def start(self, timeout: float = 300.0) -> None:
        """Start this object's local SuperLink (if not running) and wait until it answers.

        The command is the one ``flwr run`` uses for its managed local SuperLink, as
        ``flower-app run`` starts it (:func:`flower_app.cli.run.start_local_superlink`), on
        this object's ports and ``FLWR_HOME``, in a session of its own (stopped by
        :meth:`stop` by its process group).

        Parameters
        ----------
        timeout : float, optional
            Seconds allowed until its health endpoint answers (generous: a busy machine
            may need a minute; Flower itself allows 15 s).

        Raises
        ------
        RuntimeError
            If the SuperLink exits or does not answer within ``timeout`` (with its log).
        """
        if self.superlink is not None and self.superlink.poll() is None:
            return
        started = time.monotonic()
        ports = {"http-api-port": self.http_port, "control-api-port": self.control_port}
        try:
            self.superlink = start_local_superlink(self.home, ports, self.env, timeout)
        except RuntimeError as err:
            self.stop()
            tail = self.superlink_log.read_text(errors="replace")[-3000:] if (
                self.superlink_log.exists()
            ) else ""
            raise RuntimeError(f"port {self.http_port}: {err}:\n{tail}") from None
        waited = time.monotonic() - started
        if waited > 15:
            _log.warning("local SuperLink on port %d took %.0f s to start", self.http_port, waited)

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
            If ``flwr run`` did not even start a run, or if the local SuperLink this object
            started exited while the run went (killed, crashed: the run's outcome is unknown,
            and a ``flwr ls`` would start a fresh SuperLink that lists it as running).
        """
        if connection is None and "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT" in self.env:
            self.start()  # the local SuperLink `flwr run` would start, without its 15 s limit
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
        run_id = int(match.group(1))
        if connection is None and self.superlink is not None and self.superlink.poll() is not None:
            tail = self.superlink_log.read_text(errors="replace")[-2000:] if (
                self.superlink_log.exists()
            ) else ""
            raise RuntimeError(
                f"the local SuperLink on port {self.http_port} exited (code "
                f"{self.superlink.returncode}) during run {run_id}: its outcome is unknown "
                f"(this app's runs continue with resume=true). End of the SuperLink's log:\n"
                f"{tail}\n"
                f"End of flwr run's output:\n{output[-2000:]}"
            )
        status, details = self.status(run_id)
        # the stream can end just before the run's status flips to finished; a stream cut
        # short (flwr exits non-zero, e.g. the SuperLink went away) is not waited on: a
        # restarted SuperLink lists the lost run as running
        deadline = time.monotonic() + 120.0
        while (
            proc.returncode == 0
            and not status.startswith("finished")
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
            status, details = self.status(run_id)
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
        if "{" not in proc.stdout:
            raise RuntimeError(f"flwr ls failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        data = json.loads(proc.stdout[proc.stdout.index("{") :])
        if data.get("success") is False:  # e.g. the SuperLink is unavailable
            raise RuntimeError(f"flwr ls failed: {data.get('error-message', proc.stdout)}")
        for run in data.get("runs", []):
            if int(run.get("run-id", -1)) == run_id:
                return str(run.get("status")), str(run.get("status-details", ""))
        raise RuntimeError(f"run {run_id} not listed by flwr ls:\n{proc.stdout}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the local SuperLink of this object and everything under it.

        SIGTERM to the session :meth:`start` made (the SuperLink, its superexec and the
        ``flwr-simulation`` processes it launched), and to a SuperLink on this object's port
        that ``flwr run`` started itself; then SIGKILL, after ``timeout`` seconds, to whatever
        of them (or of the processes whose environment names this ``FLWR_HOME``: Ray's, which
        run in sessions of their own) is still there.
        """
        groups = []
        if self.superlink is not None:
            groups.append(self.superlink.pid)
        groups += [pid for pid in superlink_pids(self.http_port) if pid not in groups]
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self._own_pids(groups) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self._own_pids(groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self.superlink is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.superlink.wait(timeout=10)
            self.superlink = None

    def _own_pids(self, groups: list[int]) -> list[int]:
        """Live PIDs in process ``groups`` or with this ``FLWR_HOME`` in their environment."""
        marker = f"FLWR_HOME={self.home}".encode()
        found = []
        for pid in procfs.pids():
            fields, environ = procfs.stat_fields(pid), procfs.environ(pid)
            if fields is None or environ is None or fields[0] == "Z":
                continue
            if int(fields[2]) in groups or marker in environ:  # fields[2]: process group
                found.append(pid)
        return found
