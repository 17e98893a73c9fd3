"""A whole secure federation on one machine: SuperLink + SuperNodes with TLS and node auth.

:class:`SecureFederation` makes the certificates and node keys, starts ``flower-superlink``
with TLS, SuperNode authentication and a persistent database, registers the nodes' public
keys, starts the SuperNodes and runs the app with ``flwr run . <connection>``. On loopback
by default; given :class:`~flower_app.deploy.isolation.Devices`, the SuperLink and every
SuperNode run on a device of their own (network namespace, cgroup limits), with the ports
``docs/deployment.md`` uses (9092, 9094): that is the edge-device rehearsal
(:mod:`flower_app.deploy.rehearsal`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flower_app.deploy.credentials import Certificates, NodeKey, make_certificates, make_node_keys
from flower_app.deploy.isolation import Devices, Host
from flower_app.deploy.processes import (
    BIN,
    ManagedProcess,
    connected_to,
    flwr_env,
    free_port,
    process_tree,
    register_node,
    start_process,
    superlink_command,
    supernode_command,
    wait_for_listen,
    write_connection,
)
from flower_app.simulation import FlwrRun, LocalSimulation

__all__ = ["SecureFederation"]

#: the SuperLink's port and a SuperNode's ClientApp API port in docs/deployment.md (used
#: as they are when every process has a network namespace of its own)
GUIDE_PORT, GUIDE_CLIENTAPPIO_PORT = 9092, 9094


#: seconds between two ``flwr supernode ls`` while waiting for a node's status: each is a
#: ``flwr`` process (~2.5 CPU-s of imports on a 2-core machine), and Flower itself only
#: notices a dead node after a heartbeat period of 30 s
LS_POLL = 2.0

class SecureFederation:
    """A SuperLink with TLS, SuperNode authentication and ``--database``, plus SuperNodes.

    Parameters
    ----------
    root : pathlib.Path
        Working folder (certificates, keys, database, logs, ``FLWR_HOME``s, run folders);
        node ``i`` keeps its files in ``root/nodes/node-i`` (``home``, ``cache``, ``data``).
    num_nodes : int
        SuperNodes to register and start (``partition-id=i num-partitions=num_nodes``).
    host : str, optional
        Address the SuperLink listens on and is reached at (in its certificate); ignored
        with namespaced ``devices`` (the SuperLink's namespace address, port 9092).
    connection : str, optional
        Name of the SuperLink connection in the CLI's ``config.toml``.
    devices : Devices, optional
        Put the SuperLink and each SuperNode on a device of its own (the caller closes it).
    memory, cpus : int, float, optional
        Each SuperNode device's cgroup limits (bytes, cores); None: no limits.
    node_env : mapping, optional
        Extra environment of every SuperNode (and so of its superexec and ClientApps), e.g.
        ``{"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}``.
    die_with_parent : bool, optional
        Every process started here gets SIGTERM if the thread that started it ends (see
        :func:`~flower_app.deploy.processes.start_process`): start them from the main thread.
    """

    def __init__(
        self,
        root: Path,
        num_nodes: int,
        host: str = "127.0.0.1",
        connection: str = "secure",
        devices: Devices | None = None,
        memory: int | None = None,
        cpus: float | None = None,
        node_env: Mapping[str, str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.root, self.num_nodes, self.connection = root, num_nodes, connection
        self.die_with_parent = die_with_parent
        self.devices, self.memory, self.cpus = devices, memory, cpus
        self.node_env = dict(node_env or {})
        self.link: Host = devices.link if devices is not None else Host(host, label="superlink")
        self.namespaced = self.link.namespaced
        self.host = self.link.address if self.namespaced else host
        self.listen = "0.0.0.0" if self.namespaced else host
        self.port = GUIDE_PORT if self.namespaced else free_port(host)
        self.address = f"{self.host}:{self.port}"
        self.logs = root / "logs"
        self.certificates: Certificates = make_certificates(root / "certs", [self.host])
        self.keys: list[NodeKey] = make_node_keys(root / "keys", num_nodes)
        self.database = root / "superlink" / "state.db"
        self.database.parent.mkdir(parents=True, exist_ok=True)
        self.cli = LocalSimulation(root / "home", root / "runs")
        self.cli.prefix = list(self.link.prefix)
        for key in ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT"):
            self.cli.env.pop(key, None)
        write_connection(self.cli.home, connection, self.address, self.certificates.ca_cert)
        self.superlink: ManagedProcess | None = None
        self.nodes: dict[int, ManagedProcess] = {}
        self.node_configs: dict[int, dict[str, int | float | str]] = {}
        self.node_ids: dict[int, int] = {}
        self.hosts: dict[int, Host] = {}

    # ------------------------------------------------------------------ devices
    def node_dir(self, index: int) -> Path:
        """Node ``index``'s own folder (``home``, ``cache``, ``data``)."""
        path = self.root / "nodes" / f"node-{index}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def host_of(self, index: int) -> Host:
        """Node ``index``'s device (made on first use)."""
        if index not in self.hosts:
            if self.devices is None:
                self.hosts[index] = Host(label=f"node{index}")
            else:
                self.hosts[index] = self.devices.device(index, self.memory, self.cpus)
        return self.hosts[index]

    # ------------------------------------------------------------------ processes
    def start(
        self,
        timeout: float = 60.0,
        node_config: Callable[[int], dict[str, int | float | str]] | None = None,
    ) -> SecureFederation:
        """Start the SuperLink, register every node key, start every SuperNode.

        ``node_config(i)`` adds keys to node ``i``'s ``--node-config`` (e.g. its
        ``data-path``).
        """
        self.start_superlink(timeout)
        with ThreadPoolExecutor(max_workers=self.num_nodes) as pool:  # one `flwr` CLI each
            ids = list(pool.map(lambda key: self.register(key, timeout), self.keys))
        self.node_ids = dict(enumerate(ids))
        for i in range(self.num_nodes):
            self.start_node(i, **(node_config(i) if node_config is not None else {}))
        return self

    def start_superlink(self, timeout: float = 60.0) -> ManagedProcess:
        """Start ``flower-superlink`` (TLS, node auth, database); wait until it can run apps.

        Ready means: it listens on its port, and the ``flower-superexec`` it starts (which
        launches every ServerApp) is connected to it. A superexec that cannot connect (e.g.
        a server certificate without ``127.0.0.1``) would leave every ``flwr run`` waiting
        forever; here it fails within ``timeout`` with the SuperLink's log.
        """
        cmd = superlink_command(self.certificates, self.database, self.port, self.listen)
        self.superlink = start_process(
            "superlink", cmd, self.logs, flwr_env(self.root / "superlink-home"),
            cwd=self.database.parent,  # the ServerApp's cwd: a relative output-dir lands here
            host=self.link, die_with_parent=self.die_with_parent,
        )  # fmt: skip
        wait_for_listen(self.superlink, self.port, timeout)
        deadline = time.monotonic() + timeout
        while not any(
            connected_to(pid, self.port) for pid in process_tree(self.superlink.pid)[1:]
        ):
            if not self.superlink.alive() or time.monotonic() > deadline:
                tail = "\n".join(self.superlink.output().splitlines()[-25:])
                raise RuntimeError(
                    f"the SuperLink's superexec did not connect to port {self.port} within "
                    f"{timeout:g} s (no ServerApp could start); end of its log:\n{tail}"
                )
            time.sleep(0.1)
        return self.superlink

    def kill_superlink(self) -> list[int]:
        """SIGKILL the SuperLink and the ServerApp it runs (a crash of machine A's software).

        Its process group gets SIGKILL, then every process of its tree as seen just before
        (by PID: a process that left the group dies too). Returns the PIDs killed.
        """
        if self.superlink is None:
            return []
        tree = process_tree(self.superlink.pid)
        self.superlink.kill()
        for pid in tree[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return tree

    def register(self, key: NodeKey, timeout: float = 60.0) -> int:
        """Register a public key with ``flwr supernode register`` (retried until ready)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return register_node(key.public_key, self.connection, self.cli.env, self.cli.prefix)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def start_node(
        self, index: int, key: NodeKey | None = None, **node_config: int | float | str
    ) -> ManagedProcess:
        """Start SuperNode ``index`` (``partition-id=index``) with ``key`` (default: its own).

        Extra keyword arguments are added to its ``--node-config``. A node with another
        ``key`` (e.g. an unregistered one) gets a device of its own.
        """
        if key is None:
            self.node_configs[index] = dict(node_config)
            host, folder = self.host_of(index), self.node_dir(index)
        else:
            extra = 100 + sum(1 for i in self.hosts if i >= 100)
            host, folder = self.host_of(extra), self.node_dir(extra)
        config: dict[str, int | float | str] = {
            "partition-id": index,
            "num-partitions": self.num_nodes,
            **node_config,
        }
        cmd = supernode_command(
            self.address,
            self.certificates.ca_cert,
            self.keys[index] if key is None else key,
            config,
            clientappio_port=GUIDE_CLIENTAPPIO_PORT if host.namespaced else free_port(),
        )
        name = f"supernode-{index}" if key is None else f"supernode-{index}-{key.private_key.name}"
        env = flwr_env(folder / "home")
        env["FLOWER_APP_CACHE"] = str(folder / "cache")
        env.update(self.node_env)
        proc = start_process(
            name, cmd, self.logs, env, host=host, die_with_parent=self.die_with_parent
        )
        self.nodes[index if key is None else -1 - len(self.nodes)] = proc
        return proc

    def stop_node(self, index: int, graceful: bool = True) -> int | None:
        """Stop SuperNode ``index`` and return its exit code.

        ``graceful``: SIGTERM to its process group (the SuperNode deactivates itself at the
        SuperLink, so the same key can come back at once); else SIGKILL (a crash).
        """
        proc = self.nodes[index]
        return proc.stop() if graceful else proc.kill()

    def wait_online(self, timeout: float = 60.0, restarts: int = 1) -> list[dict[str, Any]]:
        """Wait until every registered node is online; return ``flwr supernode ls`` rows.

        A SuperNode whose process exits before it comes online (e.g. its ClientApp port,
        free when chosen, was taken by another process meanwhile, or the SuperLink still
        counts its previous session as online) is started again, at most ``restarts``
        times per node.

        Raises
        ------
        RuntimeError
            If a node is still not online after ``timeout`` s, or keeps exiting; the
            message holds the end of each such node's log.
        """
        deadline = time.monotonic() + timeout
        left = dict.fromkeys(self.nodes, restarts)
        while True:
            rows = self.supernodes()
            online = [r for r in rows if str(r.get("status", "")).lower() == "online"]
            if len(online) >= len(self.node_ids):
                return rows
            dead = [i for i, proc in self.nodes.items() if i >= 0 and not proc.alive()]
            for index in dead:
                if left.get(index, 0) <= 0:
                    raise RuntimeError(self._not_online(index, "keeps exiting"))
                left[index] -= 1
                node_config = self.node_configs.get(index, {})
                self.start_node(index, **node_config)
            if time.monotonic() > deadline:
                ids = {int(r.get("node-id", -1)) for r in online}
                missing = [i for i, nid in self.node_ids.items() if nid not in ids]
                raise RuntimeError(
                    "\n".join(
                        self._not_online(i, f"not online after {timeout:g} s") for i in missing
                    )
                    or f"nodes not online: {rows}"
                )
            time.sleep(LS_POLL)

    def wait_status(self, index: int, status: str, timeout: float = 180.0) -> None:
        """Wait until the SuperLink lists node ``index`` with ``status`` (e.g. offline)."""
        deadline = time.monotonic() + timeout
        node_id = self.node_ids[index]
        while True:
            rows = {int(r["node-id"]): str(r["status"]).lower() for r in self.supernodes()}
            if rows.get(node_id) == status:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {index} ({node_id}) is {rows.get(node_id)}, not {status}")
            time.sleep(LS_POLL)

    def _not_online(self, index: int, why: str) -> str:
        proc = self.nodes.get(index)
        tail = "\n".join(proc.output().splitlines()[-15:]) if proc is not None else ""
        return f"SuperNode {index} {why}; end of its log:\n{tail}"

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """Run ``flwr ARGS`` as the operator (in the SuperLink's namespace, with its home)."""
        return subprocess.run(
            [*self.cli.prefix, str(BIN / "flwr"), *args],
            env=self.cli.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def supernodes(self) -> list[dict[str, Any]]:
        """Return the SuperLink's node list (``flwr supernode ls --format json``)."""
        proc = self.flwr("supernode", "ls", self.connection, "--format", "json")
        out = proc.stdout
        with contextlib.suppress(ValueError):
            data = json.loads(out[out.index("{") :])
            return list(data.get("nodes", []))
        raise RuntimeError(f"flwr supernode ls failed:\n{out}\n{proc.stderr}")

    def runs(self) -> dict[str, str]:
        """Return ``{run-id: status}`` of every run the SuperLink knows (``flwr ls``)."""
        proc = self.flwr("ls", self.connection, "--format", "json")
        data = json.loads(proc.stdout[proc.stdout.index("{") :])
        return {str(r["run-id"]): str(r["status"]) for r in data.get("runs", [])}

    def run(self, run_config: dict[str, Any], timeout: float = 600.0) -> FlwrRun:
        """Run the app with ``flwr run . <connection>``; status checked with ``flwr ls``."""
        return self.cli.run(
            run_config, num_supernodes=None, connection=self.connection, timeout=timeout
        )

    def stop(self) -> None:
        """Stop every SuperNode, then the SuperLink (each by its own process group)."""
        for proc in self.nodes.values():
            proc.stop()
        if self.superlink is not None:
            self.superlink.stop()
