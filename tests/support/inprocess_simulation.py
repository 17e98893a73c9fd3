"""Run this Flower app in the calling process, on a Ray cluster that stays up between runs.

A ``flwr run`` pays, per run: the ``flwr`` CLI (building and sending the FAB), the
SuperLink's ``flwr-simulation`` process (importing Flower, this package and torch), a new
Ray instance (GCS, raylet, agents) and its shutdown, then ``flwr ls`` for the status: about
30 s of start-up on the 2-core machine before the first round. :class:`InProcessSimulation`
keeps what is the same from run to run and does only the run itself: it calls the
function ``flwr-simulation`` calls (``flwr.simulation.run_simulation._run_simulation``,
with the same arguments ``flwr/simulation/app.py`` passes: the app's components from
``pyproject.toml``, the run config fused from the app's defaults and the overrides as
``flwr run --run-config`` parses them, the ServerApp's Context) on Flower's Ray backend,
attached to an existing Ray cluster (``init_args.address``). The ServerApp runs in a thread
of this process; the ClientApps run in Ray actors as in any simulation; messages go through
Flower's in-memory link state and grid as in ``flwr-simulation``.

What this does not exercise is the ``flwr run`` command itself (FAB build, SuperLink,
status): :class:`flower_app.simulation.LocalSimulation` does, and the tests that check it
use that. ``_run_simulation`` is Flower's internal API (flwr 1.42, the pinned version); a
Flower upgrade that changes it makes every test using this fail at once, not silently.
"""

from __future__ import annotations

import io
import logging
import secrets
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.common.config import get_fused_config_from_dir, get_project_config, parse_config_args
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.simulation.run_simulation import _run_simulation
from flwr.supercore.constant import NOOP_FEDERATION_ID
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.supercore.telemetry import EventType

from flower_app.simulation import PROJECT, FlwrRun, toml_value

__all__ = ["InProcessSimulation"]

#: ``--federation-config`` keys accepted, and where they go in the backend config
_CLIENT_RESOURCES = {
    "client-resources-num-cpus": "num_cpus",
    "client-resources-num-gpus": "num_gpus",
}


class _Capture(logging.Handler):
    """Collects the ``flwr`` logger's INFO+ records as Flower's console prints them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.buffer = io.StringIO()
        self.setFormatter(logging.Formatter("%(levelname)-8s:      %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.buffer.write(self.format(record) + "\n")


class InProcessSimulation:
    """Runs of this app on Flower's simulation engine, in this process, on a Ray cluster.

    Parameters
    ----------
    output_dir : pathlib.Path
        Where run folders go (``output-dir`` of every run).
    ray_address : str
        GCS address (``host:port``) of the Ray cluster the ClientApps run on (e.g.
        :class:`tests.support.ray_cluster.LoopbackRayCluster`); its CPUs decide how many
        actors a run uses (one per ``client-resources-num-cpus``).
    project : pathlib.Path, optional
        The Flower app (default: this project); its ``pyproject.toml`` gives the
        components and the run config defaults.

    Notes
    -----
    :meth:`run` has the signature of :meth:`flower_app.simulation.LocalSimulation.run` and
    returns the same :class:`~flower_app.simulation.FlwrRun`: ``status`` is
    ``finished:completed`` or ``finished:failed`` (``details`` as ``flwr-simulation`` words
    them), ``output`` holds the ``flwr`` logger's records of the run (the ServerApp's log
    lines, as ``flwr run --stream`` shows them).
    """

    def __init__(self, output_dir: Path, ray_address: str, project: Path = PROJECT) -> None:
        self.output_dir, self.ray_address, self.project = output_dir, ray_address, project
        components = get_project_config(project)["tool"]["flwr"]["app"]["components"]
        self.server_app_attr = components["serverapp"]
        self.client_app_attr = components["clientapp"]
        self._lock = threading.Lock()

    def run(
        self,
        run_config: dict[str, Any],
        num_supernodes: int | None = 2,
        connection: str | None = None,
        timeout: float = 3600.0,
        federation_config: dict[str, Any] | None = None,
    ) -> FlwrRun:
        """Run the app once and return its outcome.

        Parameters
        ----------
        run_config : dict
            Run config overrides; ``output-dir`` defaults to the object's, ``run-name`` to
            a fresh name.
        num_supernodes : int
            Simulated SuperNodes.
        connection : None
            Only the simulation is supported here (a deployment needs ``LocalSimulation``).
        timeout : float, optional
            Seconds allowed for the run.
        federation_config : dict, optional
            ``client-resources-num-cpus`` / ``client-resources-num-gpus`` (default 1 / 0).

        Returns
        -------
        FlwrRun
            Log output, status and run folder.

        Raises
        ------
        ValueError
            For a deployment (``connection`` or ``num_supernodes=None``) or an unsupported
            ``federation_config`` key.
        TimeoutError
            If the run did not end within ``timeout``.
        """
        if connection is not None or num_supernodes is None:
            raise ValueError(
                "InProcessSimulation runs simulations only: use LocalSimulation for a "
                "deployment connection"
            )
        resources = {"num_cpus": 1, "num_gpus": 0.0}
        for key, value in (federation_config or {}).items():
            if key not in _CLIENT_RESOURCES:
                raise ValueError(
                    f"federation_config key {key!r} is not supported in-process (the Ray "
                    f"cluster is shared); supported: {sorted(_CLIENT_RESOURCES)}"
                )
            resources[_CLIENT_RESOURCES[key]] = value
        name = run_config.get("run-name") or f"run-{time.monotonic_ns()}"
        cfg = {"output-dir": str(self.output_dir), **run_config, "run-name": name}
        # typed exactly as `flwr run --run-config "k=v ..."` types them (TOML)
        overrides = parse_config_args([" ".join(f"{k}={toml_value(v)}" for k, v in cfg.items())])
        folder = Path(cfg["output-dir"]) / name
        with self._lock:  # one run at a time: Flower's TaskIdentity is process-global
            return self._run(overrides, num_supernodes, resources, timeout, folder)

    def _run(
        self,
        overrides: dict[str, Any],
        num_supernodes: int,
        resources: dict[str, Any],
        timeout: float,
        folder: Path,
    ) -> FlwrRun:
        run_id = secrets.randbits(63)
        run = replace(
            Run.create_empty(run_id=run_id),
            override_config=overrides,
            primary_task_id=1,
            federation_id=NOOP_FEDERATION_ID,
        )
        context = Context(
            run_id=run_id,
            node_id=0,
            node_config={},
            state=RecordDict(),
            run_config=get_fused_config_from_dir(self.project, overrides),
        )
        backend_config = {
            "client_resources": resources,
            "init_args": {
                "address": self.ray_address,
                "logging_level": "WARNING",
                "log_to_driver": True,
            },
        }
        outcome: dict[str, BaseException | None] = {}

        def target() -> None:
            # flwr-simulation sets the process's task identity from the task it pulls; put
            # back what the caller had (None when unset) afterwards
            saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
            TaskIdentity.task_id, TaskIdentity.run_id = 1, run_id
            TaskIdentity.node_id = SUPERLINK_NODE_ID
            try:
                _run_simulation(
                    num_supernodes=num_supernodes,
                    exit_event=EventType.FLWR_SIMULATION_RUN_LEAVE,
                    server_app_attr=self.server_app_attr,
                    client_app_attr=self.client_app_attr,
                    backend_name="ray",
                    backend_config=backend_config,
                    app_dir=str(self.project),
                    run=run,
                    server_app_context=context,
                    is_app=True,
                )
                outcome["error"] = None
            except BaseException as err:  # noqa: BLE001 - reported as the run's status
                outcome["error"] = err
            finally:
                TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved

        capture = _Capture()
        logger = logging.getLogger("flwr")
        logger.addHandler(capture)
        try:
            # in a thread of its own so that `timeout` holds (Flower joins its threads)
            thread = threading.Thread(target=target, name=f"simulation-{run_id}", daemon=True)
            thread.start()
            thread.join(timeout)
        finally:
            logger.removeHandler(capture)
        output = capture.buffer.getvalue()
        if thread.is_alive():
            raise TimeoutError(f"in-process run did not end within {timeout:.0f} s:\n{output}")
        error = outcome["error"]
        if error is None:
            return FlwrRun(output, "finished:completed", "", folder)
        tb = "".join(traceback.format_exception(error))
        details = f"Simulation failed with exception: {error}"
        return FlwrRun(output + tb, "finished:failed", details, folder)
