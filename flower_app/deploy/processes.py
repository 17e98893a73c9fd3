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
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flower_app.deploy.credentials import Certificates, NodeKey

__all__ = [
    "ManagedProcess",
    "PeakRSS",
    "connection_toml",
    "flwr_env",
    "free_port",
    "kill_tree",
    "register_node",
    "start_process",
    "superlink_command",
    "supernode_command",
    "wait_for_port",
    "write_connection",
]

#: flower-superlink, flower-supernode and flwr of this interpreter's environment
BIN = Path(sys.executable).parent


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


def connection_toml(name: str, address: str, root_certificates: Path | None) -> str:
    """Return a ``[superlink.NAME]`` entry for ``$FLWR_HOME/config.toml``.

    Parameters
    ----------
    name : str
        Connection name (``flwr run . NAME``, ``flwr ls NAME``).
    address : str
        ``host:port`` of the SuperLink.
    root_certificates : pathlib.Path or None
        The CA certificate (absolute path); None for ``insecure = true``.

    Returns
    -------
    str
        TOML text.
    """
    lines = [f"[superlink.{name}]", f'address = "{address}"']
    if root_certificates is None:
        lines.append("insecure = true")
    else:
        lines.append(f'root-certificates = "{Path(root_certificates).resolve()}"')
    return "\n".join(lines) + "\n"


def write_connection(home: Path, name: str, address: str, root_certificates: Path | None) -> Path:
    """Write ``home/config.toml`` with one SuperLink connection, made the default.

    Parameters
    ----------
    home : pathlib.Path
        ``FLWR_HOME`` (created).
    name, address, root_certificates
        As in :func:`connection_toml`.

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


def register_node(public_key: Path, connection: str, env: Mapping[str, str]) -> int:
    """Register a SuperNode's public key at a SuperLink (``flwr supernode register``).

    Parameters
    ----------
    public_key : pathlib.Path
        The node's OpenSSH public key.
    connection : str
        SuperLink connection name in ``$FLWR_HOME/config.toml`` (``env["FLWR_HOME"]``).
    env : mapping
        Environment for ``flwr`` (see :func:`flwr_env`).

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
        [str(BIN / "flwr"), "supernode", "register", str(public_key), connection]
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
        Its combined stdout/stderr.
    """

    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        """Process id (= its process group id)."""
        return self.popen.pid

    def alive(self) -> bool:
        """Return True while the process runs."""
        return self.popen.poll() is None

    def output(self) -> str:
        """Return what the process has logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> int | None:
        """Kill the process group at once (SIGKILL: a crash or power loss); return the code."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> int | None:
        """Stop the process group (SIGTERM, then SIGKILL after ``timeout``); return the code."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                return self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                continue
        return self.popen.poll()


def start_process(
    name: str, cmd: list[str], log_dir: Path, env: Mapping[str, str], cwd: Path | None = None
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

    Returns
    -------
    ManagedProcess
        The started process.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("w") as fh:
        popen = subprocess.Popen(
            cmd,
            env=dict(env),
            cwd=cwd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ManagedProcess(name, popen, log)


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


def _vm_hwm_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


@dataclass
class PeakRSS:
    """Poll the peak resident memory (VmHWM) of process trees (Linux ``/proc``).

    A SuperNode starts a ClientApp process per message; a thread polls each root process
    and its descendants every ``interval`` seconds and keeps the largest VmHWM seen per
    process, so short-lived ClientApps are caught (their last growth before exit may be
    missed by up to one interval). It also adds up the CPU time (user + system) each process
    used, as last seen (a ClientApp's final tenths of a second may be missed).

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
                todo, seen = _children(pid), set()
                while todo:
                    child = todo.pop()
                    if child in seen:
                        continue
                    seen.add(child)
                    todo += _children(child)
                    self.child_kib[label] = max(self.child_kib.get(label, 0), _vm_hwm_kib(child))
                    seconds = max(self.cpu.get(child, ("", 0.0))[1], _cpu_seconds(child))
                    self.cpu[child] = (label, seconds)
            self._stop.wait(self.interval)

    def report(self) -> dict[str, dict[str, float]]:
        """Return ``{label: {"supernode-mib", "clientapp-mib", "cpu-seconds"}}``.

        ``supernode-mib`` is the SuperNode process's peak RSS, ``clientapp-mib`` the largest
        peak RSS of any of its descendants (ClientApp processes), ``cpu-seconds`` the CPU
        time of the SuperNode and all its descendants together.
        """
        return {
            label: {
                "supernode-mib": self.root_kib.get(label, 0) / 1024,
                "clientapp-mib": self.child_kib.get(label, 0) / 1024,
                "cpu-seconds": sum(s for lab, s in self.cpu.values() if lab == label),
            }
            for label in self.roots
        }


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it at once: a crash, as a power loss would be.

    The tree is read from ``/proc`` (Linux) before the first signal; processes that already
    exited are skipped.
    """
    victims, todo = [], [int(pid)]
    while todo:
        current = todo.pop()
        victims.append(current)
        todo += _children(current)
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
