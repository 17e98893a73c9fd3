"""Edge-device rehearsal: a secure federation whose SuperNodes are separate small devices.

``python -m rehearsal start --nodes 4 --memory 1G --cpus 0.5 --export movielens``
starts what ``docs/deployment.md`` describes, on one Linux machine, with every SuperNode a
device of its own:

* a SuperLink with TLS, SuperNode authentication and a database (the guide's
  ``flower-superlink`` line, port 9092), in a network namespace of its own;
* N SuperNodes, each registered by its public key and started with the guide's
  ``flower-supernode`` line, each in its own network namespace with its own address (a veth
  pair to a bridge in the SuperLink's namespace), its own folder holding only its exported
  data file (``node-<i>/data``: the file and the export's manifest), and a cgroup with the
  memory and CPU of an :class:`EdgeDevice`;
* the operator's ``flwr`` CLI, in the SuperLink's namespace (machine A of the guide).

By default every SuperNode also gets an identity key for secure aggregation and the
federation's trusted identities (endorsed keys: ``docs/privacy.md``); ``endorsed=False``
(``start --tofu``) leaves them trusting keys on first use.

It prints the ``flwr run`` line, and on exit (also SIGTERM or Ctrl-C) stops every process it
started by its process group and removes its namespaces and cgroups. It supervises what it
starts (:mod:`rehearsal.supervisor`): a SuperNode or SuperLink that dies is reaped at
once and what it left (superexec, ClientApps, ServerApp) is stopped within seconds, with a
line saying so. The failure drills (:meth:`Rehearsal.kill_node`,
:meth:`Rehearsal.restart_node`, :meth:`Rehearsal.kill_superlink`,
:meth:`Rehearsal.restart_superlink`; ``python -m rehearsal drill`` for a running
``start``) restart a process where it ran. Where namespaces or cgroups cannot be made
(not root, no ``ip``, no memory/cpu cgroup controllers) it says so and falls back to
loopback and/or no limits. The ``deploy`` tests run on it.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flwr

from flower_app import procfs
from flower_app.simulation import PROJECT, toml_value
from rehearsal.federation import SecureFederation
from rehearsal.isolation import Devices, probe
from rehearsal.processes import ManagedProcess, process_tree
from rehearsal.supervisor import Death, program

__all__ = ["EDGE_DEVICE", "EdgeDevice", "Rehearsal"]


@dataclass(frozen=True)
class EdgeDevice:
    """The memory and CPU an edge device gives a SuperNode (and its ClientApps).

    Attributes
    ----------
    name : str
        What it stands for.
    memory : int
        Bytes (the cgroup's hard limit: the kernel kills a process of the node beyond it).
    cpus : float
        Cores of this machine (the cgroup's CPU quota).
    """

    name: str
    memory: int
    cpus: float

    def describe(self) -> str:
        """Return e.g. ``'<name>: 1024 MiB, 0.5 CPU'``."""
        return f"{self.name}: {self.memory >> 20} MiB, {self.cpus:g} CPU"


#: the device the deploy tests rehearse: 1 GiB of memory (a MaxFL node with torch needs
#: ~0.75 GiB at its busiest, a FedSM node ~0.45 GiB: docs/deployment.md) and half a core of
#: this machine (a slow single-board CPU; four such nodes fill 2 cores)
EDGE_DEVICE = EdgeDevice("a 1 GiB single-board computer (Raspberry Pi 3 class)", 1 << 30, 0.5)


class Rehearsal:
    """A :class:`~rehearsal.federation.SecureFederation` on separate devices.

    Parameters
    ----------
    root : pathlib.Path
        Working folder (created).
    nodes : int
        SuperNodes.
    device : EdgeDevice or None, optional
        Each SuperNode's limits; None: no limits.
    isolate : bool, optional
        Network namespaces (when available); False: loopback.
    node_env : dict, optional
        Extra environment of the SuperNodes (e.g. ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``).
    say : callable, optional
        Where notes go (default: print to stderr).
    die_with_parent : bool, optional
        Processes get SIGTERM when the thread that started them ends (default True: a
        killed test session or command leaves nothing running; start and restart nodes
        from the main thread).
    endorsed : bool, optional
        Every SuperNode gets an identity and the trusted identities for secure aggregation
        (default); False: keys trusted on first use (:class:`SecureFederation`).
    """

    def __init__(
        self,
        root: Path,
        nodes: int,
        device: EdgeDevice | None = EDGE_DEVICE,
        isolate: bool = True,
        node_env: dict[str, str] | None = None,
        say: Any = None,
        die_with_parent: bool = True,
        endorsed: bool = True,
    ) -> None:
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        root.mkdir(parents=True, exist_ok=True)
        support = probe()
        self.namespaced = isolate and support.namespaces
        self.limited = device is not None and support.cgroups
        self.device = device if self.limited else None
        #: why the rehearsal is less than asked for (empty when it is all there)
        self.fallbacks: list[str] = []
        if isolate and not support.namespaces:
            self.fallbacks.append("falling back to loopback (no network namespaces)")
        if device is not None and not support.cgroups:
            self.fallbacks.append("no memory or CPU limits (no usable cgroups)")
        if self.fallbacks:
            self.fallbacks += support.why_not
        for note in self.fallbacks:
            self.say(f"rehearsal: {note}")
        self.devices = (
            Devices(namespaces=self.namespaced) if (self.namespaced or self.limited) else None
        )
        if self.devices is not None and self.devices.stale:  # left by exited processes
            self.say(f"rehearsal: stale namespaces/cgroups: {self.devices.stale}")
        try:
            self.federation = SecureFederation(
                root,
                nodes,
                connection="rehearsal",
                devices=self.devices,
                memory=None if self.device is None else self.device.memory,
                cpus=None if self.device is None else self.device.cpus,
                node_env=node_env,
                die_with_parent=die_with_parent,
                endorsed=endorsed,
                say=self.say,
            )
        except BaseException:
            self.close_devices()
            raise
        self.data: tuple[Path, str] | None = None

    @property
    def nodes(self) -> int:
        """Number of SuperNodes."""
        return self.federation.num_nodes

    def start(
        self, data: tuple[Path, str] | None = None, timeout: float = 180.0, nodes: bool = True
    ) -> Rehearsal:
        """Start the SuperLink and register and start every SuperNode; wait until online.

        ``data = (export folder, extension)``: node i holds ``node-i.<ext>`` of the export
        (see :meth:`provision`). ``nodes=False``: register the keys only (the first
        :meth:`provision` starts the nodes).
        """
        fed = self.federation
        try:
            fed.start_superlink(timeout)
            with ThreadPoolExecutor(max_workers=self.nodes) as pool:  # one `flwr` CLI each
                ids = list(pool.map(lambda key: fed.register(key, timeout), fed.keys))
            fed.node_ids = dict(enumerate(ids))
            if data is not None:
                self.provision(*data, timeout=timeout)
            elif nodes:
                for i in range(self.nodes):
                    fed.start_node(i)
                fed.wait_online(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def node_data(self, index: int) -> Path:
        """Node ``index``'s data folder (its exported file and the manifest, nothing else)."""
        return self.federation.node_dir(index) / "data"

    def provision(self, folder: Path, ext: str, timeout: float = 180.0) -> None:
        """Give node i only ``folder/node-i.<ext>`` (+ ``manifest.json``) and (re)start it.

        A running node is stopped with SIGTERM (it deactivates itself, so its key is
        accepted again at once) and started with ``data-path`` = its own copy. A no-op if
        the nodes already hold this export.
        """
        fed = self.federation
        if self.data == (Path(folder), ext) and all(
            fed.nodes.get(i) is not None and fed.nodes[i].alive() for i in range(self.nodes)
        ):
            return
        for i in range(self.nodes):
            if i in fed.nodes and fed.nodes[i].alive():
                fed.stop_node(i)
        for i in range(self.nodes):
            data = self.node_data(i)
            shutil.rmtree(data, ignore_errors=True)
            data.mkdir(parents=True)
            shutil.copy2(Path(folder) / f"node-{i}.{ext}", data / f"node-{i}.{ext}")
            shutil.copy2(Path(folder) / "manifest.json", data / "manifest.json")
            fed.start_node(i, **{"data-path": str(data / f"node-{i}.{ext}")})
        self.data = (Path(folder), ext)
        fed.wait_online(timeout)

    def set_node_env(self, env: dict[str, str], timeout: float = 180.0) -> None:
        """Restart every running SuperNode with ``env`` added to its environment.

        E.g. ``{"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}``: the SuperNode's superexec
        reads it at start. A no-op when the nodes already run with ``env``.
        """
        fed = self.federation
        if fed.node_env == env:
            return
        fed.node_env = dict(env)
        running = [i for i in range(self.nodes) if i in fed.nodes and fed.nodes[i].alive()]
        for i in running:
            fed.stop_node(i)
        for i in running:
            fed.start_node(i, **fed.node_configs.get(i, {}))
        if running:
            fed.wait_online(timeout)

    # ------------------------------------------------------------------ failure drills
    def kill_node(self, index: int) -> Death:
        """SIGKILL SuperNode ``index``'s process alone (the OOM killer, ``kill -9``).

        Returns once the supervisor has reaped it and stopped what it left (its superexec,
        a ClientApp in flight): the :class:`~rehearsal.supervisor.Death` lists them.
        """
        return self.federation.kill_node(index)

    def restart_node(self, index: int, timeout: float = 240.0) -> ManagedProcess:
        """Start SuperNode ``index`` again on its device; return once the SuperLink took it.

        Same namespace and address, cgroup and limits (rebuilt where missing), key and node
        id, environment, data and node_config
        (:meth:`~rehearsal.federation.SecureFederation.restart_node`: after a
        SIGKILL this waits until the SuperLink has listed the dead session offline, ≤ 61 s
        after the death).
        """
        return self.federation.restart_node(index, timeout)

    def kill_superlink(self) -> Death:
        """SIGKILL the SuperLink's process alone; return once what it left is stopped.

        Its superexec and a run's ServerApp: listed in the returned Death.
        """
        return self.federation.kill_superlink()

    def restart_superlink(self, timeout: float = 180.0) -> ManagedProcess:
        """Start the SuperLink again in its namespace on its database.

        Returns once every running SuperNode is online again (they reconnect by themselves,
        under the same node ids).
        """
        return self.federation.restart_superlink(timeout)

    @property
    def deaths(self) -> list[Death]:
        """Every process end the supervisor saw, in order."""
        return list(self.federation.supervisor.deaths)

    def node_processes(self, index: int) -> dict[int, str]:
        """Return SuperNode ``index``'s live processes now (PID -> program).

        Its cgroup's processes (when limited), else its SuperNode's process tree.
        """
        fed = self.federation
        host = fed.host_of(index)
        if host.cgroup is not None:
            pids = host.cgroup.pids()
        else:
            proc = fed.nodes.get(index)
            pids = process_tree(proc.pid) if proc is not None and proc.alive() else []
        return {pid: program(pid) for pid in pids if procfs.alive(pid)}

    def reset_peaks(self) -> None:
        """Start the nodes' cgroup peak memory over (before a measured run)."""
        for host in self.federation.hosts.values():
            if host.cgroup is not None:
                host.cgroup.reset_peak()

    def run_line(self, run_config: dict[str, Any] | None = None) -> str:
        """Return the operator's ``flwr run`` command line for this federation."""
        fed = self.federation
        cmd = [*fed.cli.prefix, "env", f"FLWR_HOME={fed.cli.home}", "flwr", "run", str(PROJECT),
               fed.connection, "--stream"]  # fmt: skip
        line = shlex.join(cmd)
        if run_config:  # flwr's own quoting: "key=1 name='text'"
            line += ' --run-config "' + " ".join(
                f"{k}={toml_value(v)}" for k, v in run_config.items()
            ) + '"'
        return line

    def describe(self) -> list[str]:
        """Return what was started, a line each (printed by the command line)."""
        fed = self.federation
        link = f"pid {fed.superlink.pid}" if fed.superlink is not None else "not started"
        lines = [
            f"flwr {flwr.__version__}; SuperLink (TLS, node authentication, database; {link}) "
            f"at {fed.address}"
            + (f" in network namespace {fed.link.namespace}" if fed.namespaced else ""),
        ]
        for i in range(self.nodes):
            host = fed.host_of(i)
            where = (
                f"namespace {host.prefix[-1]}, {host.address}" if host.namespaced else "loopback"
            )
            limit = "no limits" if host.cgroup is None else (
                f"cgroup {host.cgroup.name} (v{host.cgroup.version}): "
                f"{host.cgroup.memory >> 20} MiB, {host.cgroup.cpus:g} CPU"
            )  # fmt: skip
            proc = fed.nodes.get(i)
            pid = f"pid {proc.pid}" if proc is not None else "not started"
            lines.append(
                f"SuperNode {i} (node id {fed.node_ids.get(i)}, {pid}): {where}; {limit}; "
                f"folder {fed.node_dir(i)}"
            )
        if self.device is not None:
            lines.append(f"edge device: {self.device.describe()}")
        trust = (
            f"endorsed keys (identities in {fed.trusted_keys.parent}, trusted list "
            f"{fed.trusted_keys.name})" if fed.trusted_keys is not None
            else "keys trusted on first use (TOFU)"
        )  # fmt: skip
        lines.append(f"secure aggregation: {trust}")
        return lines

    def cgroup_report(self) -> dict[str, dict[str, float]]:
        """Return each node's cgroup peak memory (MiB, page cache included) and OOM kills."""
        out: dict[str, dict[str, float]] = {}
        for i, host in sorted(self.federation.hosts.items()):
            if host.cgroup is not None and i < self.nodes:
                out[f"supernode-{i}"] = {
                    "cgroup-peak-mib": host.cgroup.peak() / 2**20,
                    "oom-kills": host.cgroup.oom_kills(),
                }
        return out

    def stop(self) -> None:
        """Stop every process started here (by process group); remove namespaces, cgroups."""
        try:
            self.federation.stop()
        finally:
            self.close_devices()

    def close_devices(self) -> None:
        """Remove the namespaces and cgroups (killing, by PID, what is left in a cgroup)."""
        if self.devices is not None:
            self.devices.close()
            self.devices = None

    def __enter__(self) -> Rehearsal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
