"""Start and stop a SuperLink and SuperNodes with TLS and SuperNode authentication.

The commands built here are the ones ``docs/deployment.md`` tells a person to type; the
``deploy`` tests run exactly these. Every process is started in its own session (process
group) and stopped by that group's id only, never by name.

Flower 1.41 facts used here (from ``flower-superlink --help``, ``flower-supernode --help``
and the installed source):

* one HTTPS port (``--host``/``--port``) serves the Fleet, Control and Runtime APIs of a
  SuperLink; ``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile`` turn TLS on;
* ``--enable-supernode-auth`` (needs TLS) makes the SuperLink accept only SuperNodes whose
  public key was registered with ``flwr supernode register KEY.pub <connection>`` (the old
  ``--auth-list-public-keys`` CSV is refused by this version); registrations live in the
  ``--database``;
* a SuperNode signs its requests with ``--auth-supernode-private-key`` (OpenSSH EC key; the
  public key is derived from it, ``--auth-supernode-public-key`` is deprecated) and checks
  the SuperLink against ``--root-certificates``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from flower_app import procfs
from flower_app.deploy.connection import connection_toml
from flower_app.deploy.credentials import Certificates, NodeKey
from rehearsal.isolation import Host, IsolationError

if TYPE_CHECKING:
    from rehearsal.supervisor import Death

__all__ = [
    "MARKER_VAR",
    "ManagedProcess",
    "PeakRSS",
    "flwr_env",
    "free_port",
    "kill_tree",
    "process_tree",
    "register_node",
    "start_process",
    "superlink_command",
    "supernode_command",
    "wait_for_listen",
    "wait_for_port",
    "listening",
    "write_connection",
]

#: flower-superlink, flower-supernode and flwr of this interpreter's environment
BIN = Path(sys.executable).parent
#: environment variable that marks a started process and everything it starts (Flower's
#: superexec, ClientApps and ServerApps inherit it): ``<tag>/<name>/<incarnation>``, how
#: :mod:`rehearsal.supervisor` finds what a dead process left behind
MARKER_VAR = "FLOWER_APP_DEPLOY_PROCESS"
#: seconds a process may take to get from its wrapper (cgroup, namespace) to its command
PLACEMENT_TIMEOUT = 60.0


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def flwr_env(home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return an environment for Flower processes with a private ``FLWR_HOME``.

    Parameters
    ----------
    home : pathlib.Path
        ``FLWR_HOME`` (created).
    base : mapping, optional
        Environment to start from (default: this process's).

    Returns
    -------
    dict
        The environment, with telemetry, update checks and runtime installs off.
    """
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if base is None else base)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
    )
    return env


def superlink_command(
    certificates: Certificates | None,
    database: Path | None,
    port: int = 9092,
    host: str = "127.0.0.1",
    node_auth: bool = True,
) -> list[str]:
    """Return the ``flower-superlink`` command line.

    Parameters
    ----------
    certificates : Certificates or None
        TLS files (:func:`~flower_app.deploy.credentials.make_certificates`); None runs
        ``--insecure`` (then ``node_auth`` must be False).
    database : pathlib.Path or None
        SQLite file for the SuperLink's state (runs, registered nodes); None keeps it in
        memory (lost on restart).
    port : int, optional
        The SuperLink's HTTPS port (Fleet, Control and Runtime APIs).
    host : str, optional
        Address to listen on; ``0.0.0.0`` to accept SuperNodes from other machines.
    node_auth : bool, optional
        ``--enable-supernode-auth``: only registered SuperNode keys are accepted.

    Returns
    -------
    list of str
        The command.

    Raises
    ------
    ValueError
        If node authentication is asked for without TLS.
    """
    cmd = [str(BIN / "flower-superlink")]
    if certificates is None:
        if node_auth:
            raise ValueError("SuperNode authentication needs TLS certificates")
        cmd.append("--insecure")
    else:
        cmd += [
            "--ssl-ca-certfile",
            str(certificates.ca_cert),
            "--ssl-certfile",
            str(certificates.server_cert),
            "--ssl-keyfile",
            str(certificates.server_key),
        ]
    if node_auth:
        cmd.append("--enable-supernode-auth")
    if database is not None:
        cmd += ["--database", str(database)]
    cmd += ["--host", host, "--port", str(port), "--disable-runtime-dependency-installation"]
    return cmd


def supernode_command(
    superlink: str,
    root_certificates: Path | None,
    key: NodeKey | None,
    node_config: Mapping[str, int | float | str],
    clientappio_port: int = 9094,
) -> list[str]:
    """Return the ``flower-supernode`` command line.

    Parameters
    ----------
    superlink : str
        ``host:port`` of the SuperLink (the name must be in its certificate).
    root_certificates : pathlib.Path or None
        The CA certificate; None connects ``--insecure``.
    key : NodeKey or None
        The node's key pair (its public key registered at the SuperLink); None for a
        SuperLink without node authentication.
    node_config : mapping
        ``--node-config`` entries, e.g. ``{"partition-id": 0, "num-partitions": 4}``.
    clientappio_port : int, optional
        Local port of the node's ClientApp API (``--port``); distinct per node on one machine.

    Returns
    -------
    list of str
        The command.
    """
    cmd = [str(BIN / "flower-supernode"), "--superlink", superlink]
    if root_certificates is None:
        cmd.append("--insecure")
    else:
        cmd += ["--root-certificates", str(root_certificates)]
    if key is not None:
        cmd += ["--auth-supernode-private-key", str(key.private_key)]
    items = [f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}" for k, v in node_config.items()]
    cmd += ["--node-config", " ".join(items), "--port", str(clientappio_port)]
    return cmd


def write_connection(home: Path, name: str, address: str, root_certificates: Path | None) -> Path:
    """Write ``home/config.toml`` with one SuperLink connection, made the default.

    Parameters
    ----------
    home : pathlib.Path
        ``FLWR_HOME`` (created).
    name, address, root_certificates
        As in :func:`~flower_app.deploy.connection.connection_toml`.

    Returns
    -------
    pathlib.Path
        The file written (replaced if it existed).
    """
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    entry = connection_toml(name, address, root_certificates)
    path.write_text(f'[superlink]\ndefault = "{name}"\n\n{entry}')
    return path


def register_node(
    public_key: Path, connection: str, env: Mapping[str, str], prefix: Sequence[str] = ()
) -> int:
    """Register a SuperNode's public key at a SuperLink (``flwr supernode register``).

    Parameters
    ----------
    public_key : pathlib.Path
        The node's OpenSSH public key.
    connection : str
        SuperLink connection name in ``$FLWR_HOME/config.toml`` (``env["FLWR_HOME"]``).
    env : mapping
        Environment for ``flwr`` (see :func:`flwr_env`).
    prefix : sequence of str, optional
        Put before the command (e.g. ``ip netns exec NS``).

    Returns
    -------
    int
        The node id the SuperLink gave the key.

    Raises
    ------
    RuntimeError
        If the registration failed.
    """
    proc = subprocess.run(
        [*prefix, str(BIN / "flwr"), "supernode", "register", str(public_key), connection]
        + ["--format", "json"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    try:
        data = json.loads(out[out.index("{") :])
    except ValueError:
        data = {}
    if proc.returncode != 0 or not data.get("success"):
        raise RuntimeError(f"flwr supernode register failed:\n{out}\n{proc.stderr}")
    return int(data["node-id"])


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
    """Wait until something accepts TCP connections on ``host:port``.

    Raises
    ------
    TimeoutError
        If nothing listens within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s")


def listening(pid: int, port: int) -> bool:
    """Return whether a socket in ``pid``'s network namespace listens on TCP ``port``.

    Reads ``/proc/PID/net/tcp{,6}``, which show the sockets of the process's own network
    namespace: this works for a process in another namespace too (where a connection from
    here cannot reach it).
    """
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def connected_to(pid: int, port: int) -> bool:
    """Return whether process ``pid`` holds an established TCP connection to ``port``.

    Matches the socket inodes of ``/proc/PID/fd`` against ``/proc/PID/net/tcp{,6}``.
    """
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                remote = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and remote == port and fields[9] in inodes:
                    return True
    return False


def wait_for_listen(proc: ManagedProcess, port: int, timeout: float = 60.0) -> None:
    """Wait until ``proc``'s network namespace listens on ``port``.

    Raises
    ------
    RuntimeError
        If the process exits first, or nothing listens within ``timeout`` seconds (the
        message holds the end of its log).
    """
    deadline = time.monotonic() + timeout
    while not listening(proc.pid, port):
        if not proc.alive() or time.monotonic() > deadline:
            why = "exited" if not proc.alive() else f"does not listen on {port} after {timeout} s"
            tail = "\n".join(proc.output().splitlines()[-20:])
            raise RuntimeError(f"{proc.name} {why}; end of its log:\n{tail}")
        time.sleep(0.1)


@dataclass
class ManagedProcess:
    """A process started by :func:`start_process` (leader of its own process group).

    Attributes
    ----------
    name : str
        Label (log file stem).
    popen : subprocess.Popen
        The process.
    log : pathlib.Path
        Its combined stdout/stderr (appended to by every process of that name).
    offset : int
        Where this process's part of ``log`` starts.
    marker : str or None
        Its :data:`MARKER_VAR` value (inherited by what it starts).
    ended : threading.Event
        Set once a :class:`~rehearsal.supervisor.Supervisor` has reaped the process
        and stopped whatever it left behind.
    death : Death or None
        What the supervisor recorded when it ended.
    stopping : bool
        True once :meth:`stop` was called (its end is expected, not a failure).
    """

    name: str
    popen: subprocess.Popen
    log: Path
    offset: int = 0
    marker: str | None = None
    ended: threading.Event = field(default_factory=threading.Event)
    death: Death | None = None
    stopping: bool = False

    @property
    def pid(self) -> int:
        """Process id (= its process group id)."""
        return self.popen.pid

    def alive(self) -> bool:
        """Return True while the process runs."""
        return self.popen.poll() is None

    def output(self) -> str:
        """Return what this process has logged so far (not earlier ones of the same name)."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode(errors="replace")

    def _signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process group, unless its leader was reaped.

        A reaped leader's PID, and so the group's id, may be another process's by now.
        """
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def kill(self) -> int | None:
        """Kill the process group at once (SIGKILL: a crash or power loss); return the code."""
        self._signal_group(signal.SIGKILL)
        return self.popen.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> int | None:
        """Stop the process group (SIGTERM, then SIGKILL after ``timeout``); return the code."""
        self.stopping = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            self._signal_group(sig)
            try:
                return self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                continue
        return self.popen.poll()


def start_process(
    name: str,
    cmd: list[str],
    log_dir: Path,
    env: Mapping[str, str],
    cwd: Path | None = None,
    host: Host | None = None,
    die_with_parent: bool = False,
    marker: str | None = None,
) -> ManagedProcess:
    """Start ``cmd`` in a new session with its output in ``log_dir/name.log``.

    Parameters
    ----------
    name : str
        Label and log file stem.
    cmd : list of str
        The command.
    log_dir : pathlib.Path
        Folder for the log (created).
    env : mapping
        The environment.
    cwd : pathlib.Path, optional
        Working directory.
    host : Host, optional
        Run it there (its network namespace and cgroup, :mod:`rehearsal.isolation`);
        default: here.
    die_with_parent : bool, optional
        The process gets SIGTERM when the *thread* that started it ends (``setpriv
        --pdeathsig``, where installed): a test session or script killed outright does
        not leave it running (its own children follow it: Flower's ``--parent-pid``).
    marker : str, optional
        Put into its environment as :data:`MARKER_VAR` (what it starts inherits it).

    Returns
    -------
    ManagedProcess
        The started process (the process group's leader: stopping it stops the group).

    Raises
    ------
    IsolationError
        If the process did not get into ``host``'s cgroup and network namespace (it is
        killed first): a process never runs outside the device it was started on.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    target = cmd[0]
    if die_with_parent and (setpriv := shutil.which("setpriv")):
        cmd = [setpriv, "--pdeathsig", "TERM", *cmd]
    if host is not None:
        cmd = host.command(cmd)
    env = dict(env)
    if marker is not None:
        env[MARKER_VAR] = marker
    with log.open("a") as fh:
        offset = fh.tell()
        popen = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = ManagedProcess(name, popen, log, offset=offset, marker=marker)
    if host is not None and (host.cgroup is not None or host.namespaced):
        _check_placement(proc, host, target)
    return proc


def _check_placement(proc: ManagedProcess, host: Host, target: str) -> None:
    """Wait until ``proc`` runs ``target`` (past its wrappers), then check where it runs.

    Its cgroup and namespace (:meth:`~rehearsal.isolation.Host.check`): outside
    either, it is killed and :class:`IsolationError` raised.
    """
    deadline = time.monotonic() + PLACEMENT_TIMEOUT
    while True:
        argv = procfs.argv(proc.pid) or []
        if target in argv[:2]:  # a script runs as [interpreter, script, ...]
            break
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            if proc.popen.poll() is None:  # still in its wrapper
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.popen.wait(timeout=30)
            code = proc.popen.returncode
            why = "still in its wrapper" if code is None else f"exited with code {code}"
            cgroup = host.cgroup.name if host.cgroup is not None else "-"
            tail = "\n".join(proc.output().splitlines()[-10:])
            raise IsolationError(
                f"{proc.name} did not start on {host.label} (cgroup {cgroup}, namespace "
                f"{host.namespace or '-'}): {why} before running {target}; end of its log:\n{tail}"
            )
        time.sleep(0.01)
    try:
        host.check(proc.pid)
    except IsolationError:
        if proc.popen.poll() is not None:  # it has already exited: no process runs unlimited
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.popen.wait(timeout=30)
        raise


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids += [int(c) for c in (task / "children").read_text().split()]
    return kids


def _cpu_seconds(pid: int) -> float:
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def _status_kib(pid: int, key: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def _vm_hwm_kib(pid: int) -> int:
    return _status_kib(pid, "VmHWM:")


def _role(pid: int) -> str:
    """``superexec``, ``clientapp`` or ``other``, from the process's command line."""
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        text = b" ".join(argv[:2]).decode(errors="replace")
        if "flower-superexec" in text:
            return "superexec"
        if "flwr-clientapp" in text:
            return "clientapp"
    return "other"


def process_tree(pid: int) -> list[int]:
    """Return ``pid`` and all its descendants alive now (Linux ``/proc``)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        if current in out:
            continue
        out.append(current)
        todo += _children(current)
    return out


@dataclass
class PeakRSS:
    """Poll the resident memory of process trees (Linux ``/proc``).

    A SuperNode starts a ``flower-superexec`` child, which starts a ClientApp process per
    message; a thread polls each root process and its descendants every ``interval``
    seconds and keeps, per tree, the largest VmHWM of the root, of its superexec and of any
    ClientApp, the largest *sum* of the current RSS (VmRSS) of the whole tree (what the
    node holds at its busiest moment), and the largest number of ClientApps alive at once.
    Short-lived ClientApps are caught (their last growth before exit may be missed by up to
    one interval). It also adds up the CPU time (user + system) each process used, as last
    seen (a ClientApp's final tenths of a second may be missed).

    Parameters
    ----------
    roots : dict
        ``{label: pid}`` of the processes to watch.
    interval : float, optional
        Polling period in seconds.
    """

    roots: dict[str, int]
    interval: float = 0.05
    root_kib: dict[str, int] = field(default_factory=dict)
    child_kib: dict[str, int] = field(default_factory=dict)
    superexec_kib: dict[str, int] = field(default_factory=dict)
    tree_kib: dict[str, int] = field(default_factory=dict)
    clientapps_at_once: dict[str, int] = field(default_factory=dict)
    clientapps_seen: dict[str, set[int]] = field(default_factory=dict)
    cpu: dict[int, tuple[str, float]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PeakRSS:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            for label, pid in self.roots.items():
                self.root_kib[label] = max(self.root_kib.get(label, 0), _vm_hwm_kib(pid))
                self.cpu[pid] = (label, max(self.cpu.get(pid, ("", 0.0))[1], _cpu_seconds(pid)))
                tree = _status_kib(pid, "VmRSS:")
                apps = 0
                for child in process_tree(pid)[1:]:
                    role = _role(child)
                    hwm = _vm_hwm_kib(child)
                    tree += _status_kib(child, "VmRSS:")
                    if role == "superexec":
                        self.superexec_kib[label] = max(self.superexec_kib.get(label, 0), hwm)
                    else:
                        self.child_kib[label] = max(self.child_kib.get(label, 0), hwm)
                    if role == "clientapp":
                        apps += 1
                        self.clientapps_seen.setdefault(label, set()).add(child)
                    seconds = max(self.cpu.get(child, ("", 0.0))[1], _cpu_seconds(child))
                    self.cpu[child] = (label, seconds)
                self.tree_kib[label] = max(self.tree_kib.get(label, 0), tree)
                self.clientapps_at_once[label] = max(self.clientapps_at_once.get(label, 0), apps)
            self._stop.wait(self.interval)

    def report(self) -> dict[str, dict[str, float]]:
        """Return ``{label: {...}}`` per watched tree.

        ``supernode-mib`` is the SuperNode process's peak RSS, ``superexec-mib`` its
        superexec child's, ``clientapp-mib`` the largest peak RSS of any other descendant
        (ClientApp processes), ``tree-mib`` the largest total RSS of the whole tree at one
        poll, ``clientapps`` the ClientApp processes seen and ``clientapps-at-once`` the
        most alive together, ``cpu-seconds`` the CPU time of the tree.
        """
        return {
            label: {
                "supernode-mib": self.root_kib.get(label, 0) / 1024,
                "superexec-mib": self.superexec_kib.get(label, 0) / 1024,
                "clientapp-mib": self.child_kib.get(label, 0) / 1024,
                "tree-mib": self.tree_kib.get(label, 0) / 1024,
                "clientapps": len(self.clientapps_seen.get(label, ())),
                "clientapps-at-once": self.clientapps_at_once.get(label, 0),
                "cpu-seconds": sum(s for lab, s in self.cpu.values() if lab == label),
            }
            for label in self.roots
        }


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it at once: a crash, as a power loss would be.

    The tree is read from ``/proc`` (Linux) before the first signal; processes that already
    exited are skipped.
    """
    for victim in process_tree(int(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
