"""A multi-raylet Ray cluster on loopback, for running Flower's simulation on a Ray cluster.

Flower 1.42's simulation runtime calls ``ray.init(runtime_env=..., **init_args)`` without
an ``address`` (``flwr/server/superlink/fleet/vce/backend/raybackend.py:
RayBackend.init_ray``), and Ray then reads the ``RAY_ADDRESS`` environment variable. So a
SuperLink started with ``RAY_ADDRESS=<head>:<port>`` in its environment runs every simulation
on that existing cluster (``LocalSimulation(..., ray_address=...)``); docs/ray-cluster.md
has the commands.

:class:`LoopbackRayCluster` starts a head and extra raylets on one machine, each node with its
own ``--temp-dir`` and loopback IP (``127.0.0.2``, ``127.0.0.3``, ...: Ray rewrites a literal
``127.0.0.1`` to the machine's outward IP), each ``ray start --block`` in its own session so
that :meth:`LoopbackRayCluster.stop` ends exactly the processes it started (never ``ray stop``,
which stops every Ray instance on the machine). Used by ``tests/test_ray_cluster.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from flower_app import procfs
from flower_app.simulation import BIN, free_ports

__all__ = ["LoopbackRayCluster"]

_log = logging.getLogger(__name__)

#: how ``ray start`` says that a port it was given is taken; it is then started again with
#: other ports (at most :data:`_PORT_ATTEMPTS` times)
_PORT_CLASH = re.compile(
    r"[^\n]*(?:port number \d+ that is used|address already in use"
    r"|port \d+ is (?:already )?in use)[^\n]*",
    re.IGNORECASE,
)
_PORT_ATTEMPTS = 3

#: ``ray.init`` from a throw-away driver; prints the cluster's nodes and actors as JSON
_QUERY = """
import json, sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
from ray._private import state
nodes = {n["NodeID"]: n for n in ray.nodes()}
actors = [
    {
        "class": a["ActorClassName"],
        "state": a["State"],
        "job": a["JobID"],
        "node-ip": nodes.get(a["Address"]["NodeID"], {}).get("NodeManagerAddress"),
    }
    for a in state.actors().values()
]
out = {
    "nodes": [
        {"ip": n["NodeManagerAddress"], "alive": n["Alive"], "cpus": n["Resources"].get("CPU", 0)}
        for n in nodes.values()
    ],
    "actors": actors,
}
ray.shutdown()
print("@@" + json.dumps(out))
"""


class LoopbackRayCluster:
    """A Ray head and ``num_nodes - 1`` more raylets on 127.0.0.x, stopped by PID.

    Parameters
    ----------
    root : pathlib.Path
        Private directory for the nodes' temp dirs and logs (keep it short: Ray's socket
        paths live under it and must fit in 107 characters).
    num_nodes : int, optional
        Raylets including the head.
    num_cpus : int, optional
        CPUs each raylet offers (``ray start --num-cpus``).
    object_store_mib : int, optional
        Object store of each raylet, MiB.

    Examples
    --------
    >>> with LoopbackRayCluster(Path("/tmp/rc")) as cluster:  # doctest: +SKIP
    ...     sim = LocalSimulation(home, runs, ray_address=cluster.address)
    ...     run = sim.run({"seed": 7}, num_supernodes=4)
    """

    def __init__(
        self, root: Path, num_nodes: int = 2, num_cpus: int = 1, object_store_mib: int = 128
    ) -> None:
        if num_nodes < 1 or num_nodes > 200:
            raise ValueError(f"num_nodes must be in 1..200, got {num_nodes}")
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.num_nodes, self.num_cpus = root, num_nodes, num_cpus
        self.object_store_bytes = object_store_mib * 1024 * 1024
        self.ips = [f"127.0.0.{2 + i}" for i in range(num_nodes)]
        self._choose_ports()
        self.procs: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        }
        self.env.pop("RAY_ADDRESS", None)

    def _choose_ports(self) -> None:
        """Choose the GCS, Ray Client, dashboard and raylet agent ports (distinct, free now)."""
        self.port, self.client_port, self.dashboard_port, *self.agent_ports = free_ports(
            3 + self.num_nodes
        )

    @property
    def address(self) -> str:
        """GCS address of the head (``host:port``), the value for ``RAY_ADDRESS``."""
        return f"{self.ips[0]}:{self.port}"

    @property
    def client_address(self) -> str:
        """Ray Client address of the head (``ray://host:port``), for drivers off the cluster."""
        return f"ray://{self.ips[0]}:{self.client_port}"

    def _ray_start(self, index: int, args: list[str]) -> None:
        node_dir = self.root / f"node{index}"
        node_dir.mkdir(exist_ok=True)
        cmd = [
            str(BIN / "ray"),
            "start",
            "--block",
            "--disable-usage-stats",
            *args,
            "--node-ip-address",
            self.ips[index],
            "--num-cpus",
            str(self.num_cpus),
            "--num-gpus",
            "0",
            "--object-store-memory",
            str(self.object_store_bytes),
            "--temp-dir",
            str(node_dir / "tmp"),
            "--dashboard-agent-listen-port",
            str(self.agent_ports[index]),
        ]
        with (node_dir / "ray-start.log").open("w") as log:
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def start(self, timeout: float = 180.0) -> LoopbackRayCluster:
        """Start the head, then the other raylets, and wait until all are alive.

        Parameters
        ----------
        timeout : float, optional
            Seconds allowed for the whole cluster to come up.

        Returns
        -------
        LoopbackRayCluster
            ``self``.

        Raises
        ------
        RuntimeError
            If a ``ray start`` exits or the nodes do not all join in time.
        """
        deadline = time.monotonic() + timeout
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self._ray_start(
                0,
                [
                    "--head",
                    "--port",
                    str(self.port),
                    "--ray-client-server-port",
                    str(self.client_port),
                    "--include-dashboard",
                    "false",
                    "--dashboard-port",
                    str(self.dashboard_port),
                ],
            )
            try:
                self._wait_log(0, deadline)
                break
            except RuntimeError as err:
                # a port free when chosen, taken by another program before Ray bound it
                if attempt == _PORT_ATTEMPTS or not _PORT_CLASH.search(str(err)):
                    raise
                failed = self.procs.pop()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(failed.pid, signal.SIGKILL)  # what that start left behind
                failed.wait(timeout=30)
                _log.warning("ray start: %s; again with other ports", _PORT_CLASH.search(
                    str(err)).group(0))  # fmt: skip
                self._choose_ports()
        if self.num_nodes == 1:  # `ray start` logs "Ray runtime started" once the head is up
            return self
        for i in range(1, self.num_nodes):
            self._ray_start(i, ["--address", self.address])
        for i in range(1, self.num_nodes):
            self._wait_log(i, deadline)
        while True:
            alive = [n for n in self.query()["nodes"] if n["alive"]]
            if len(alive) >= self.num_nodes:
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(alive)}/{self.num_nodes} raylets joined")
            time.sleep(1.0)

    def _wait_log(self, index: int, deadline: float) -> None:
        log = self.root / f"node{index}" / "ray-start.log"
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if self.procs[index].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start of node {index} failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def query(self, timeout: float = 120.0) -> dict[str, Any]:
        """Return the cluster's nodes and actors (also dead ones), from a throw-away driver.

        Parameters
        ----------
        timeout : float, optional
            Seconds allowed for the query.

        Returns
        -------
        dict
            ``{"nodes": [{"ip", "alive", "cpus"}], "actors": [{"class", "state", "job",
            "node-ip"}]}``.
        """
        proc = subprocess.run(
            [sys.executable, "-c", _QUERY, self.address],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        marker = proc.stdout.rfind("@@")
        if proc.returncode or marker < 0:
            raise RuntimeError(f"cluster query failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout[marker + 2 :])

    def actors_per_node(
        self, class_name: str = "ClientAppActor", snapshot: dict[str, Any] | None = None
    ) -> dict[str, int]:
        """Count the actors of ``class_name`` each raylet hosted (alive or dead), by node IP.

        Parameters
        ----------
        class_name : str, optional
            Actor class (Flower's simulation runs each virtual client in a ``ClientAppActor``).
        snapshot : dict, optional
            A :meth:`query` result to count in (default: a fresh query).

        Returns
        -------
        dict
            ``{node IP: number of actors}`` over this cluster's raylets.
        """
        counts = dict.fromkeys(self.ips, 0)
        for actor in (snapshot or self.query())["actors"]:
            if actor["class"] == class_name and actor["node-ip"] in counts:
                counts[actor["node-ip"]] += 1
        return counts

    def _own_pids(self) -> list[int]:
        """PIDs in this cluster's sessions or whose command line names its root."""
        sessions = {p.pid for p in self.procs}
        found = []
        for pid in procfs.pids():
            fields, argv = procfs.stat_fields(pid), procfs.argv(pid)
            if fields is None or argv is None or fields[0] == "Z":  # Z: exited, unreaped
                continue
            # fields: state ppid pgrp session ...
            if int(fields[3]) in sessions or any(f"{self.root}{os.sep}" in a for a in argv):
                found.append(pid)
        return found

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every process this cluster started: SIGTERM per session, then SIGKILL."""
        for proc in reversed(self.procs):  # raylets first, the head last
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        while self._own_pids() and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in self._own_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def __enter__(self) -> LoopbackRayCluster:
        """Start the cluster (stopping whatever started if that fails)."""
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the cluster."""
        self.stop()
