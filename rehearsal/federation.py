"""A whole secure federation on one machine: SuperLink + SuperNodes with TLS and node auth.

:class:`SecureFederation` makes the certificates and node keys, starts ``flower-superlink``
with TLS, SuperNode authentication and a persistent database, registers the nodes' public
keys, starts the SuperNodes and runs the app with ``flwr run . <connection>``. On loopback
by default; given :class:`~rehearsal.isolation.Devices`, the SuperLink and every
SuperNode run on a device of their own (network namespace, cgroup limits), with the ports
``docs/deployment.md`` uses (9092, 9094): that is the edge-device rehearsal
(:mod:`rehearsal.rehearsal`).

Every process it starts is supervised (:mod:`rehearsal.supervisor`): reaped the
moment it ends, whatever it left (a SuperNode's superexec and ClientApps, a SuperLink's
superexec and ServerApp) stopped within seconds. The failure drills are methods:
:meth:`SecureFederation.kill_node` / :meth:`~SecureFederation.restart_node` and
:meth:`~SecureFederation.kill_superlink` / :meth:`~SecureFederation.restart_superlink`
restart a process where it ran (its device's namespace and cgroup limits, key, node id,
environment and node_config). By default every SuperNode also gets an identity for secure
aggregation and the federation's trusted identities in its node_config (endorsed keys,
``docs/privacy.md``); ``endorsed=False`` leaves the nodes trusting keys on first use.
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

from flower_app.deploy.credentials import (
    Certificates,
    IdentityKey,
    NodeKey,
    make_certificates,
    make_identity_keys,
    make_node_keys,
    write_trusted_keys,
)
from flower_app.privacy.ledger import LEDGER_FILE
from flower_app.privacy.secagg_client import IDENTITY_KEY, TRUSTED_KEYS
from flower_app.simulation import FlwrRun, LocalSimulation
from rehearsal.isolation import Devices, Host, new_tag
from rehearsal.processes import (
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
from rehearsal.supervisor import Death, Supervisor, stop_marked

__all__ = ["SecureFederation"]

#: the SuperLink's port and a SuperNode's ClientApp API port in docs/deployment.md (used
#: as they are when every process has a network namespace of its own)
GUIDE_PORT, GUIDE_CLIENTAPPIO_PORT = 9092, 9094


#: seconds between two ``flwr supernode ls`` while waiting for a node's status: each is a
#: ``flwr`` process (~2.5 CPU-s of imports on a 2-core machine), and Flower itself only
#: notices a dead node after a heartbeat period of 30 s
LS_POLL = 2.0
#: seconds after a SuperNode died without leaving (SIGKILL, a crash) by which its SuperLink
#: must list it offline: Flower 1.42 counts a node online until HEARTBEAT_PATIENCE (2) x
#: its heartbeat interval (30 s) after its last heartbeat, and refuses the same key until
#: then (exit 305, "Failed to activate SuperNode"); plus 1 s for the two clocks' reads
OFFLINE_AFTER = 2 * 30.0 + 1.0
#: seconds between two starts of a SuperNode that was refused (systemd's RestartSec=5)
RESTART_SEC = 5.0
#: what a SuperNode logs once the SuperLink accepted it (``flwr/supernode``)
ACTIVATED = "SuperNode ID:"
REFUSED = "Failed to activate SuperNode"


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
        :func:`~rehearsal.processes.start_process`): start them from the main thread.
    endorsed : bool, optional
        Give every SuperNode an identity key and the federation's trusted identities
        (node_config ``secagg-identity-key``, ``secagg-trusted-keys``): secure aggregation
        then accepts only run keys endorsed by a trusted identity (default True). False:
        the nodes trust keys on first use, safe only if the server relayed keys honestly
        when the nodes first met (a restarted or new node is a first meeting again).
    say : callable, optional
        Where the supervisor says what ended (default: stderr).
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
        endorsed: bool = True,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.root, self.num_nodes, self.connection = root, num_nodes, connection
        self.die_with_parent = die_with_parent
        self.devices, self.memory, self.cpus = devices, memory, cpus
        self.node_env = dict(node_env or {})
        #: the name stem of this federation's process markers (its devices' tag if any)
        self.tag = devices.tag if devices is not None else new_tag("fed")
        self.supervisor = Supervisor(say)
        self._incarnations = 0
        self.link: Host = devices.link if devices is not None else Host(host, label="superlink")
        self.namespaced = self.link.namespaced
        self.host = self.link.address if self.namespaced else host
        self.listen = "0.0.0.0" if self.namespaced else host
        self.port = GUIDE_PORT if self.namespaced else free_port(host)
        self.address = f"{self.host}:{self.port}"
        self.logs = root / "logs"
        self.certificates: Certificates = make_certificates(root / "certs", [self.host])
        self.keys: list[NodeKey] = make_node_keys(root / "keys", num_nodes)
        #: each node's identity for secure aggregation (None: keys trusted on first use)
        self.identities: list[IdentityKey] | None = None
        #: the federation's trusted identities, a copy on every node in practice
        self.trusted_keys: Path | None = None
        if endorsed:
            self.identities = make_identity_keys(root / "identities", num_nodes)
            self.trusted_keys = write_trusted_keys(
                root / "identities" / "federation.pem", [k.public_key for k in self.identities]
            )
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
    def _start(self, name: str, cmd: list[str], env: dict[str, str], host: Host,
               cwd: Path | None = None) -> ManagedProcess:  # fmt: skip
        """Start and supervise a process on ``host`` (marked ``<tag>/<name>/<n>``)."""
        self._incarnations += 1
        proc = start_process(
            name, cmd, self.logs, env, cwd=cwd, host=host, die_with_parent=self.die_with_parent,
            marker=f"{self.tag}/{name}/{self._incarnations}",
        )  # fmt: skip
        self.supervisor.watch(proc, host.cgroup)
        return proc

    def _ended(self, proc: ManagedProcess | None, timeout: float = 60.0) -> Death | None:
        """Wait until a previous process has ended and its leftovers are stopped."""
        if proc is None:
            return None
        if proc.alive():
            raise RuntimeError(f"{proc.name} (pid {proc.pid}) is still running")
        return self.supervisor.wait(proc, timeout)

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
        self._ended(self.superlink)
        if self.devices is not None:
            self.devices.restore(self.link)
        cmd = superlink_command(self.certificates, self.database, self.port, self.listen)
        self.superlink = self._start(
            "superlink", cmd, flwr_env(self.root / "superlink-home"), self.link,
            cwd=self.database.parent,  # the ServerApp's cwd: a relative output-dir lands here
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

    def kill_superlink(self, timeout: float = 60.0) -> Death:
        """SIGKILL the SuperLink process alone (a crash of machine A's software).

        The supervisor reaps it and stops what it left, its superexec and the ServerApp of
        a run in flight, within seconds; the returned :class:`Death` lists them.
        """
        if self.superlink is None or not self.superlink.alive():
            raise RuntimeError("the SuperLink is not running")
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.superlink.pid, signal.SIGKILL)
        return self.supervisor.wait(self.superlink, timeout)

    def restart_superlink(self, timeout: float = 180.0) -> ManagedProcess:
        """Start the SuperLink again where it ran, on its database; wait for the nodes.

        A running SuperLink is stopped first (SIGTERM). Its namespace must still exist
        (:meth:`~rehearsal.isolation.Devices.restore`). The running SuperNodes
        reconnect by themselves (same node ids, from the database): this returns once the
        SuperLink lists every one of them online.
        """
        if self.superlink is not None and self.superlink.alive():
            self.superlink.stop()
        self.start_superlink(timeout)
        running = [i for i, proc in self.nodes.items() if i >= 0 and proc.alive()]
        self.wait_nodes(running, "online", timeout)
        return self.superlink

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
            self._ended(self.nodes.get(index))  # never two SuperNodes with one key
            self.node_configs[index] = dict(node_config)
            host, folder = self.host_of(index), self.node_dir(index)
            if self.devices is not None:
                self.devices.restore(host)
        else:
            extra = 100 + sum(1 for i in self.hosts if i >= 100)
            host, folder = self.host_of(extra), self.node_dir(extra)
        config: dict[str, int | float | str] = {
            "partition-id": index,
            "num-partitions": self.num_nodes,
            **self.secagg_config(index),
            # the node's privacy ledger on its own disk: one budget across every run
            LEDGER_FILE: str((folder / "privacy-ledger.json").resolve()),
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
        proc = self._start(name, cmd, env, host)
        self.nodes[index if key is None else -1 - len(self.nodes)] = proc
        return proc

    def secagg_config(self, index: int) -> dict[str, str]:
        """Node ``index``'s node_config for endorsed secure-aggregation keys ({} for TOFU)."""
        if self.identities is None or self.trusted_keys is None or index >= len(self.identities):
            return {}
        # absolute: the node's ClientApps read them, from whatever their working folder is
        return {IDENTITY_KEY: str(self.identities[index].private_key.resolve()),
                TRUSTED_KEYS: str(self.trusted_keys.resolve())}  # fmt: skip

    def stop_node(self, index: int, graceful: bool = True) -> int | None:
        """Stop SuperNode ``index`` and return its exit code.

        ``graceful``: SIGTERM to its process group (the SuperNode deactivates itself at the
        SuperLink, so the same key can come back at once); else SIGKILL (a crash).
        """
        proc = self.nodes[index]
        return proc.stop() if graceful else proc.kill()

    def kill_node(self, index: int, timeout: float = 60.0) -> Death:
        """SIGKILL SuperNode ``index``'s process alone (as the OOM killer or ``kill -9``).

        The supervisor reaps it and stops its superexec and ClientApps within seconds; the
        returned :class:`Death` lists them.
        """
        proc = self.nodes[index]
        if not proc.alive():
            raise RuntimeError(f"SuperNode {index} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        return self.supervisor.wait(proc, timeout)

    def restart_node(self, index: int, timeout: float = 240.0) -> ManagedProcess:
        """Start SuperNode ``index`` again where it ran; return once the SuperLink took it.

        Its device is checked and rebuilt where needed (namespace, cgroup, limits:
        :meth:`~rehearsal.isolation.Devices.restore`), and it gets the same key (so
        the same node id), environment and node_config. A running node is stopped first
        (SIGTERM). After a death that did not deactivate the node (SIGKILL, a crash) the
        SuperLink refuses the key until it lists the old session offline, at most
        :data:`OFFLINE_AFTER` s after the death: the restart waits until then, and starts
        it again every :data:`RESTART_SEC` s while it is refused (what ``Restart=always``
        does). Accepted means its log says ``SuperNode ID:`` (no ``flwr`` process needed).

        Raises
        ------
        RuntimeError
            If it is not accepted within ``timeout`` s, or exits for another reason (the
            message holds its log's end).
        IsolationError
            If it cannot be started inside its namespace and cgroup.
        """
        deadline = time.monotonic() + timeout
        old = self.nodes.get(index)
        if old is not None and old.alive():
            old.stop()
        death = self._ended(old)
        if death is not None and not death.left_cleanly:
            wait = death.noticed + OFFLINE_AFTER - time.time()
            if wait > 0:
                self.supervisor.say(
                    f"supervisor: restarting SuperNode {index} in {wait:.0f} s, once the "
                    f"SuperLink lists its old session offline ({death.cause}: heartbeats stop)"
                )
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
        while True:
            proc = self.start_node(index, **self.node_configs.get(index, {}))
            while proc.alive() and ACTIVATED not in proc.output():
                if time.monotonic() > deadline:
                    raise RuntimeError(self._not_online(index, f"not accepted in {timeout:g} s"))
                time.sleep(0.2)
            if proc.alive():
                return proc
            self.supervisor.wait(proc)
            if REFUSED not in proc.output():
                raise RuntimeError(self._not_online(index, f"exited ({proc.death.cause})"))
            if time.monotonic() + RESTART_SEC > deadline:
                raise RuntimeError(self._not_online(index, f"still refused after {timeout:g} s"))
            time.sleep(RESTART_SEC)

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
        self.wait_nodes([index], status, timeout)

    def wait_nodes(self, indices: list[int], status: str, timeout: float = 180.0) -> None:
        """Wait until the SuperLink lists every node of ``indices`` with ``status``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                rows = {int(r["node-id"]): str(r["status"]).lower() for r in self.supernodes()}
            except RuntimeError:  # the SuperLink is not answering yet
                rows = {}
            wrong = {i: rows.get(self.node_ids[i]) for i in indices
                     if rows.get(self.node_ids[i]) != status}  # fmt: skip
            if not wrong:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes {wrong} (index: status) are not {status}")
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
        """Stop every SuperNode, then the SuperLink (each by its own process group).

        The current ones, restarted or not (earlier ones have ended and were cleaned up);
        then every process still carrying one of this federation's markers is killed by PID.
        """
        procs = [*self.nodes.values(), *([self.superlink] if self.superlink else [])]
        for proc in procs:
            proc.stop()
        for proc in procs:
            with contextlib.suppress(TimeoutError):
                self.supervisor.wait(proc, 30.0)
        left, _ = stop_marked(f"{self.tag}/", prefix=True)
        if left:
            self.supervisor.say(f"supervisor: stopped what was left: {left}")
