"""A whole secure federation on one machine: SuperLink + SuperNodes with TLS and node auth.

:class:`SecureFederation` makes the certificates and node keys, starts ``flower-superlink``
with TLS, SuperNode authentication and a persistent database, registers the nodes' public
keys, starts the SuperNodes and runs the app with ``flwr run . <connection>``. The ``deploy``
tests use it on loopback; ``docs/deployment.md`` gives the same commands for two machines.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flower_app.deploy.credentials import Certificates, NodeKey, make_certificates, make_node_keys
from flower_app.deploy.processes import (
    BIN,
    ManagedProcess,
    flwr_env,
    free_port,
    register_node,
    start_process,
    superlink_command,
    supernode_command,
    wait_for_port,
    write_connection,
)
from flower_app.simulation import FlwrRun, LocalSimulation

__all__ = ["SecureFederation"]


class SecureFederation:
    """A SuperLink with TLS, SuperNode authentication and ``--database``, plus SuperNodes.

    Parameters
    ----------
    root : pathlib.Path
        Working folder (certificates, keys, database, logs, ``FLWR_HOME``s, run folders).
    num_nodes : int
        SuperNodes to register and start (``partition-id=i num-partitions=num_nodes``).
    host : str, optional
        Address the SuperLink listens on and is reached at (in its certificate).
    connection : str, optional
        Name of the SuperLink connection in the CLI's ``config.toml``.
    """

    def __init__(
        self,
        root: Path,
        num_nodes: int,
        host: str = "127.0.0.1",
        connection: str = "secure",
    ) -> None:
        self.root, self.num_nodes, self.host, self.connection = root, num_nodes, host, connection
        self.port = free_port(host)
        self.address = f"{host}:{self.port}"
        self.logs = root / "logs"
        self.certificates: Certificates = make_certificates(root / "certs", [host, "localhost"])
        self.keys: list[NodeKey] = make_node_keys(root / "keys", num_nodes)
        self.database = root / "superlink" / "state.db"
        self.database.parent.mkdir(parents=True, exist_ok=True)
        self.cli = LocalSimulation(root / "home", root / "runs")
        for key in ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT"):
            self.cli.env.pop(key, None)
        write_connection(self.cli.home, connection, self.address, self.certificates.ca_cert)
        self.superlink: ManagedProcess | None = None
        self.nodes: dict[int, ManagedProcess] = {}
        self.node_configs: dict[int, dict[str, int | float | str]] = {}
        self.node_ids: dict[int, int] = {}

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
        """Start ``flower-superlink`` (TLS, node auth, database) and wait for its port."""
        cmd = superlink_command(self.certificates, self.database, self.port, self.host)
        self.superlink = start_process(
            "superlink", cmd, self.logs, flwr_env(self.root / "superlink-home")
        )
        wait_for_port(self.port, self.host, timeout)
        return self.superlink

    def register(self, key: NodeKey, timeout: float = 60.0) -> int:
        """Register a public key with ``flwr supernode register`` (retried until ready)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return register_node(key.public_key, self.connection, self.cli.env)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def start_node(
        self, index: int, key: NodeKey | None = None, **node_config: int | float | str
    ) -> ManagedProcess:
        """Start SuperNode ``index`` (``partition-id=index``) with ``key`` (default: its own).

        Extra keyword arguments are added to its ``--node-config``.
        """
        if key is None:
            self.node_configs[index] = dict(node_config)
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
            clientappio_port=free_port(),
        )
        name = f"supernode-{index}" if key is None else f"supernode-{index}-{key.private_key.name}"
        proc = start_process(name, cmd, self.logs, flwr_env(self.root / f"{name}-home"))
        self.nodes[index if key is None else -1 - len(self.nodes)] = proc
        return proc

    def wait_online(self, timeout: float = 60.0, restarts: int = 1) -> list[dict[str, Any]]:
        """Wait until every registered node is online; return ``flwr supernode ls`` rows.

        A SuperNode whose process exits before it comes online (e.g. its ClientApp port,
        free when chosen, was taken by another process meanwhile) is started again with a
        fresh port, at most ``restarts`` times per node.

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
            time.sleep(0.5)

    def _not_online(self, index: int, why: str) -> str:
        proc = self.nodes.get(index)
        tail = "\n".join(proc.output().splitlines()[-15:]) if proc is not None else ""
        return f"SuperNode {index} {why}; end of its log:\n{tail}"

    def supernodes(self) -> list[dict[str, Any]]:
        """Return the SuperLink's node list (``flwr supernode ls --format json``)."""
        proc = subprocess.run(
            [str(BIN / "flwr"), "supernode", "ls", self.connection, "--format", "json"],
            env=self.cli.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = proc.stdout
        with contextlib.suppress(ValueError):
            data = json.loads(out[out.index("{") :])
            return list(data.get("nodes", []))
        raise RuntimeError(f"flwr supernode ls failed:\n{out}\n{proc.stderr}")

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
