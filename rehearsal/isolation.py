"""Separate "devices" on one Linux machine: network namespaces and cgroup limits.

The edge-device rehearsal (:mod:`rehearsal.rehearsal`) gives the SuperLink and every
SuperNode a device of its own:

* a **network namespace** each (``ip netns``), linked by veth pairs to a bridge in the
  SuperLink's namespace, with its own address in a private /24 (by default
  ``10.231.<x>.0/24``, ``x`` from this process's id); a SuperNode reaches the SuperLink only
  over that link, and its ClientApps reach it over the namespace's own loopback, so every
  node can use Flower's default ports;
* a **cgroup** each with a memory limit and a CPU quota (cgroup v2 ``memory.max`` /
  ``cpu.max``, or the v1 ``memory`` and ``cpu`` controllers where the machine mounts those),
  holding the SuperNode and everything it starts (superexec, ClientApps).

Every namespace and cgroup is named ``fa-<pid>-r<n>-...``: ``<pid>`` is the process that
made it, ``r<n>`` the ``n``-th set of devices that process made (:func:`new_tag`), so two
rehearsals in one process (a notebook, ``pytest -n 0``) have names of their own; and
:meth:`Devices.close` removes exactly those (killing, by PID, any process still left in one
of its cgroups). A process is started on a device by joining the cgroup first and then the
namespace (``ip netns exec`` mounts a sysfs of the namespace, without the cgroup hierarchy:
joining the cgroup from inside it fails with "No such file or directory"), and
:meth:`Host.check` makes sure it got there: a process outside its device's cgroup or
namespace is an error, never a run without limits. Both need root; :func:`probe` says what
is available and why not, and the rehearsal then falls back to loopback and/or no limits.

A process that dies without closing (SIGKILL, a test run stopped from outside) leaves its
namespaces, their veth links and addresses, and its cgroups behind. :func:`remove_stale`
removes every ``fa-<pid>-...`` namespace and cgroup whose ``<pid>`` is no longer a running
process (a zombie counts as gone): it kills, by PID, whatever is still inside such a cgroup
or namespace, then removes the cgroup directory and deletes the namespace (``ip netns
delete``; its veth ends, and so its links and addresses, go with it). Objects whose
``<pid>`` is alive are never touched: they belong to a running rehearsal, perhaps another
checkout's. It runs when a :class:`Devices` is made (before it makes its own objects) and
in the test run's watchdog (``tests/support/process_sweep.py``) once it has stopped the run's
processes. The PID is read in this machine's PID namespace; a PID that a new process has
taken keeps its stale objects until that process has ended too (never the other way round).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from flower_app import procfs

__all__ = [
    "Cgroup",
    "Devices",
    "Host",
    "IsolationError",
    "Stale",
    "Support",
    "new_tag",
    "owner_pid",
    "parse_memory",
    "probe",
    "remove_stale",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: CPU quota period (µs) for cgroup ``cpu.max`` / ``cpu.cfs_period_us``
CPU_PERIOD_US = 100_000
#: the name of every namespace and cgroup made here: ``fa-<pid of its maker>-<label>``
#: (a :class:`Devices`' label starts with its ``r<n>``, :func:`new_tag`)
OWNED_NAME = re.compile(r"fa-([1-9][0-9]{0,9})-[A-Za-z0-9_.-]+")
#: where ``ip netns`` keeps its named namespaces (a bind mount of each namespace's nsfs file)
NETNS_DIRS = (Path("/run/netns"), Path("/var/run/netns"))
_SEQUENCE = itertools.count(1)
_SEQUENCE_LOCK = threading.Lock()


def new_tag(kind: str = "r") -> str:
    """Return a name stem no namespace or cgroup of this machine uses: ``fa-<pid>-<kind><n>``.

    ``<n>`` counts up per process (and skips a stem an earlier process of the same PID left
    behind), so every :class:`Devices` (and every :func:`probe`) of one process has names
    of its own, and :func:`owner_pid` still names the process that made them.
    """
    while True:
        with _SEQUENCE_LOCK:
            tag = f"fa-{os.getpid()}-{kind}{next(_SEQUENCE)}"
        names = _namespace_names() + [
            p.name for top, _ in _cgroup_hierarchies(CGROUP_ROOT)
            for p in _owned_cgroups(top, STALE_SEARCH_DEPTH)
        ]  # fmt: skip
        if not any(n == tag or n.startswith(f"{tag}-") for n in names):
            return tag
#: how deep :func:`remove_stale` looks below a cgroup hierarchy's root (v1 puts a device's
#: cgroup under its maker's own cgroup, e.g. ``memory/<service>/<session>/fa-<pid>-node0``)
STALE_SEARCH_DEPTH = 6


class IsolationError(RuntimeError):
    """A namespace or cgroup could not be made (the message says what and why)."""


def parse_memory(text: str | int) -> int:
    """Return bytes for ``"512M"``, ``"1G"``, ``"768MiB"``, ``"1048576"`` (or an int).

    Raises
    ------
    ValueError
        For anything else (the text is quoted).
    """
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"memory {text!r}: expected e.g. 512M, 1G or a number of bytes")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(float(match.group(1)) * scale[match.group(2).upper()])


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise IsolationError(f"{shlex.join(cmd)} failed: {(proc.stderr or proc.stdout).strip()}")


# ----------------------------------------------------------------------------- cgroups
def _own_v1_path(controller: str) -> str:
    """Return this process's cgroup path in the v1 hierarchy holding ``controller``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return "/"


def _v1_dir(controller: str, root: Path) -> Path | None:
    """Return the mount of a v1 controller (``cpu`` may be mounted as ``cpu,cpuacct``)."""
    for candidate in (controller, f"{controller},cpuacct", f"cpuacct,{controller}"):
        path = root / candidate
        if path.is_dir() and (path / "cgroup.procs").exists():
            return path
    return None


@dataclass
class Cgroup:
    """One limited cgroup: a memory limit and a CPU quota for a process and its children.

    Use :meth:`create`; :meth:`enter_shell` is the shell snippet that moves the shell
    running it (and so what it ``exec``\\ s) into the cgroup.

    Attributes
    ----------
    name : str
        ``fa-<pid>-<label>``.
    dirs : list of pathlib.Path
        The cgroup directories (one for v2; the memory and cpu ones for v1).
    version : int
        1 or 2.
    memory, cpus : int, float
        The limits (bytes; cores).
    """

    name: str
    dirs: list[Path]
    version: int
    memory: int
    cpus: float

    @classmethod
    def create(cls, name: str, memory: int, cpus: float, root: Path = CGROUP_ROOT) -> Cgroup:
        """Make the cgroup ``name`` with ``memory`` bytes and ``cpus`` cores.

        cgroup v2 (``root/cgroup.controllers`` lists memory and cpu): ``root/name`` with
        ``memory.max``, ``memory.swap.max = 0`` and ``cpu.max``. cgroup v1: ``name`` under
        this process's own memory and cpu cgroups, with ``memory.limit_in_bytes`` (and
        ``memory.memsw.limit_in_bytes`` where swap accounting exists) and
        ``cpu.cfs_quota_us``.

        Raises
        ------
        IsolationError
            If neither is usable here (the reason is in the message).
        """
        controllers = root / "cgroup.controllers"
        if controllers.exists() and {"memory", "cpu"} <= set(controllers.read_text().split()):
            path = root / name
            cgroup = cls(name, [path], 2, memory, cpus)
            try:
                enabled = (root / "cgroup.subtree_control").read_text().split()
                missing = [c for c in ("memory", "cpu") if c not in enabled]
                if missing:
                    (root / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))
                path.mkdir()
                cgroup.apply()
            except OSError as err:
                with contextlib.suppress(OSError):
                    path.rmdir()
                raise IsolationError(f"cgroup v2 {path}: {err}") from err
            return cgroup
        mem_root, cpu_root = _v1_dir("memory", root), _v1_dir("cpu", root)
        if mem_root is None or cpu_root is None:
            raise IsolationError(
                f"no cgroup v2 with memory and cpu controllers at {root} and no v1 memory and "
                "cpu hierarchies: memory and CPU limits are not available here"
            )
        mem = mem_root / _own_v1_path("memory").lstrip("/") / name
        cpu = cpu_root / _own_v1_path("cpu").lstrip("/") / name
        made: list[Path] = []
        cgroup = cls(name, [mem, cpu], 1, memory, cpus)
        try:
            for path in (mem, cpu):
                path.mkdir()
                made.append(path)
            cgroup.apply()
        except OSError as err:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise IsolationError(f"cgroup v1 {mem} / {cpu}: {err}") from err
        return cgroup

    def apply(self) -> None:
        """Write the memory limit and CPU quota (again) into the cgroup's directories.

        Raises
        ------
        OSError
            If the kernel refuses a value (or a directory is gone).
        """
        quota = max(1000, int(round(self.cpus * CPU_PERIOD_US)))
        if self.version == 2:
            path = self.dirs[0]
            (path / "memory.max").write_text(str(self.memory))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
            (path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            return
        mem, cpu = self.dirs
        (mem / "memory.limit_in_bytes").write_text(str(self.memory))
        with contextlib.suppress(OSError):
            (mem / "memory.memsw.limit_in_bytes").write_text(str(self.memory))
        (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(quota))

    def limits(self) -> tuple[int, float]:
        """Return the memory limit (bytes) and CPU quota (cores) the kernel holds now."""
        if self.version == 2:
            memory = int((self.dirs[0] / "memory.max").read_text().split()[0])
            quota, period = (self.dirs[0] / "cpu.max").read_text().split()[:2]
        else:
            memory = int((self.dirs[0] / "memory.limit_in_bytes").read_text())
            quota = (self.dirs[1] / "cpu.cfs_quota_us").read_text().strip()
            period = (self.dirs[1] / "cpu.cfs_period_us").read_text().strip()
        return memory, int(quota) / int(period)

    def exists(self) -> bool:
        """Return whether every directory of the cgroup is there."""
        return all(d.is_dir() for d in self.dirs)

    def restore(self) -> bool:
        """Make the cgroup's missing directories again and re-apply its limits.

        Returns
        -------
        bool
            True if a directory had to be made again.

        Raises
        ------
        IsolationError
            If it cannot be made or limited.
        """
        made = False
        try:
            for d in self.dirs:
                if not d.is_dir():
                    d.mkdir()
                    made = True
            self.apply()
        except OSError as err:
            raise IsolationError(f"cgroup {self.name}: cannot restore it: {err}") from err
        return made

    def holds(self, pid: int) -> bool:
        """Return whether process ``pid`` is in the cgroup (in every one of its directories)."""
        for d in self.dirs:
            try:
                if str(pid) not in (d / "cgroup.procs").read_text().split():
                    return False
            except OSError:
                return False
        return True

    @classmethod
    def find(cls, name: str, root: Path = CGROUP_ROOT) -> Cgroup | None:
        """Return the existing cgroup ``name`` (as :meth:`create` made it), limits read back.

        None if it is not there (v2: ``root/name``; v1: a directory of that name in both
        the memory and the cpu hierarchies, up to :data:`STALE_SEARCH_DEPTH` levels down).
        """
        hierarchies = _cgroup_hierarchies(root)
        version = hierarchies[0][1] if hierarchies else 2
        dirs = [p for top, _ in hierarchies for p in _owned_cgroups(top, STALE_SEARCH_DEPTH)
                if p.name == name]  # fmt: skip
        if version == 1:  # the memory directory first, as create() orders them
            dirs.sort(key=lambda d: not (d / "memory.limit_in_bytes").exists())
            if len(dirs) == 1 and (dirs[0] / "cpu.cfs_quota_us").exists():
                dirs = dirs * 2  # memory and cpu mounted together
        if not dirs or len(dirs) != (1 if version == 2 else 2):
            return None
        found = cls(name, dirs, version, 0, 0.0)
        try:
            found.memory, found.cpus = found.limits()
        except (OSError, ValueError):
            return None
        return found

    def enter_shell(self) -> str:
        """Return ``echo $$ > .../cgroup.procs`` for every directory of the cgroup."""
        return " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self.dirs)

    def pids(self) -> list[int]:
        """Return the processes in the cgroup now."""
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        return sorted(found)

    def _memory_file(self, v1: str, v2: str) -> Path:
        return self.dirs[0] / (v2 if self.version == 2 else v1)

    def usage(self) -> int:
        """Return the memory charged to the cgroup now (bytes, page cache included)."""
        path = self._memory_file("memory.usage_in_bytes", "memory.current")
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().split()[0])
        return 0

    def peak(self) -> int:
        """Return the cgroup's peak memory charge so far (bytes, page cache included)."""
        path = self._memory_file("memory.max_usage_in_bytes", "memory.peak")
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().split()[0])
        return 0

    def set_cpus(self, cpus: float) -> None:
        """Change the CPU quota (cores) of the running cgroup (and what :meth:`apply` writes)."""
        quota = max(1000, int(round(cpus * CPU_PERIOD_US)))
        if self.version == 2:
            (self.dirs[0] / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        else:
            (self.dirs[1] / "cpu.cfs_quota_us").write_text(str(quota))
        self.cpus = cpus

    def reset_peak(self) -> None:
        """Start :meth:`peak` over from the current usage (where the kernel allows it)."""
        path = self._memory_file("memory.max_usage_in_bytes", "memory.peak")
        with contextlib.suppress(OSError):
            path.write_text("0")

    def oom_kills(self) -> int:
        """Return how many processes the kernel killed for exceeding the memory limit."""
        path = self._memory_file("memory.oom_control", "memory.events")
        with contextlib.suppress(OSError, ValueError):
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self, timeout: float = 20.0) -> list[int]:
        """SIGKILL every process left in the cgroup (by PID), then remove it.

        Returns
        -------
        list of int
            The PIDs that were signalled (empty when the cgroup was empty).
        """
        deadline = time.monotonic() + timeout
        killed: set[int] = set()
        while True:
            left = self.pids()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            try:
                for d in self.dirs:
                    if d.exists():
                        d.rmdir()
                return sorted(killed)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


# ----------------------------------------------------------------------------- hosts
@dataclass
class Host:
    """Where a process runs: an address, a command prefix (namespace) and a cgroup.

    Attributes
    ----------
    address : str
        The host's address as others reach it (``127.0.0.1`` on loopback).
    prefix : list of str
        Put before a command to run it there (``ip netns exec NS``; empty on loopback).
    cgroup : Cgroup or None
        Memory and CPU limits of the host's processes.
    label : str
        Name for logs and reports.
    """

    address: str = "127.0.0.1"
    prefix: list[str] = field(default_factory=list)
    cgroup: Cgroup | None = None
    label: str = "loopback"

    @property
    def namespaced(self) -> bool:
        """True when the host is a network namespace of its own."""
        return bool(self.prefix)

    @property
    def namespace(self) -> str | None:
        """The name of the host's network namespace (None on loopback)."""
        return self.prefix[-1] if self.prefix else None

    def check(self, pid: int) -> None:
        """Make sure process ``pid`` runs in this host's cgroup and network namespace.

        Raises
        ------
        IsolationError
            If it is outside either (the message says where it is instead).
        """
        if self.cgroup is not None and not self.cgroup.holds(pid):
            try:
                where = Path(f"/proc/{pid}/cgroup").read_text().strip().replace("\n", "; ")
            except OSError:
                where = "unknown (it has exited)"
            raise IsolationError(
                f"process {pid} is not in cgroup {self.cgroup.name} of {self.label} (its cgroups: "
                f"{where}): it would run without the device's memory and CPU limits"
            )
        if self.namespace is not None:
            try:
                theirs = os.stat(f"/proc/{pid}/ns/net")
                ours = _namespace_stat(self.namespace)
            except OSError as err:
                raise IsolationError(f"process {pid}: network namespace unknown ({err})") from err
            if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
                raise IsolationError(
                    f"process {pid} is not in network namespace {self.namespace} of {self.label}"
                )

    def command(self, cmd: list[str]) -> list[str]:
        """Return ``cmd`` wrapped to run on this host (in its namespace and cgroup).

        The wrapper is a shell that moves itself into the cgroup and then ``exec``\\ s the
        namespace prefix and the command, so the process keeps the shell's PID (the leader
        of the process group the caller made).
        """
        full = [*self.prefix, *cmd]
        if self.cgroup is None:
            return full
        return ["/bin/sh", "-c", f'{self.cgroup.enter_shell()} && exec "$@"', "sh", *full]


def _namespace_stat(name: str) -> os.stat_result:
    """Return the ``stat`` of named namespace ``name`` (``ip netns``' bind mount of it)."""
    for folder in NETNS_DIRS:
        with contextlib.suppress(OSError):
            return os.stat(folder / name)
    raise FileNotFoundError(f"no network namespace {name} in {', '.join(map(str, NETNS_DIRS))}")


# ----------------------------------------------------------------------------- probe
@dataclass(frozen=True)
class Support:
    """What this machine offers the rehearsal.

    Attributes
    ----------
    namespaces : bool
        Network namespaces and veth pairs can be made.
    cgroups : bool
        Memory and CPU limits can be set.
    why_not : list of str
        A sentence per missing piece.
    """

    namespaces: bool
    cgroups: bool
    why_not: list[str]


def probe(tag: str | None = None) -> Support:
    """Try a throwaway namespace, veth pair and cgroup; say what works.

    Parameters
    ----------
    tag : str, optional
        Name stem (default ``fa-<pid>-probe<n>``, :func:`new_tag`).
    """
    tag = tag or new_tag("probe")
    why: list[str] = []
    namespaces = False
    if os.geteuid() != 0:
        why.append(f"network namespaces need root (running as uid {os.geteuid()})")
    else:
        try:
            _run(["ip", "netns", "add", tag])
            try:
                _run(["ip", "-n", tag, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
                namespaces = True
            finally:
                _run(["ip", "netns", "del", tag])
        except (IsolationError, FileNotFoundError, subprocess.TimeoutExpired) as err:
            why.append(f"network namespaces unavailable: {err}")
    cgroups = False
    try:
        Cgroup.create(tag, 64 << 20, 0.5).remove()
        cgroups = True
    except (IsolationError, OSError) as err:
        why.append(f"cgroup limits unavailable: {err}")
    return Support(namespaces, cgroups, why)


# ----------------------------------------------------------------------------- stale objects
def owner_pid(name: str) -> int | None:
    """Return ``<pid>`` of a name ``fa-<pid>-<label>`` made here; None for any other name."""
    match = OWNED_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass
class Stale:
    """What :func:`remove_stale` removed.

    Attributes
    ----------
    namespaces : list of str
        The namespaces deleted.
    cgroups : list of pathlib.Path
        The cgroup directories removed.
    killed : list of int
        PIDs that were still inside them (sent SIGKILL).
    errors : list of str
        What could not be removed, and why.
    """

    namespaces: list[str] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.cgroups or self.killed or self.errors)

    def __str__(self) -> str:
        parts = []
        if self.namespaces:
            parts.append(f"namespaces {', '.join(self.namespaces)}")
        if self.cgroups:
            parts.append(f"cgroups {', '.join(map(str, self.cgroups))}")
        if self.killed:
            parts.append(f"processes left in them (killed) {', '.join(map(str, self.killed))}")
        text = "removed " + "; ".join(parts) if parts else "nothing removed"
        return text + (f"; could not remove: {'; '.join(self.errors)}" if self.errors else "")


def _namespace_names() -> list[str]:
    """Return the names ``ip netns list`` shows (none without ``ip``)."""
    try:
        proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _namespace_pids(name: str) -> list[int]:
    """Return the processes in namespace ``name`` (``ip netns pids``)."""
    try:
        proc = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                              timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _cgroup_hierarchies(root: Path) -> list[tuple[Path, int]]:
    """Return ``(directory, version)`` of every hierarchy :meth:`Cgroup.create` may use."""
    if (root / "cgroup.controllers").exists():
        return [(root, 2)]
    found: dict[Path, tuple[Path, int]] = {}
    for controller in ("memory", "cpu"):
        path = _v1_dir(controller, root)
        if path is not None:
            found.setdefault(path.resolve(), (path, 1))
    return list(found.values())


def _owned_cgroups(top: Path, depth: int) -> list[Path]:
    """Return the directories named ``fa-<pid>-...`` under ``top``, ``depth`` levels down."""
    try:
        entries = list(os.scandir(top))
    except OSError:
        return []
    found: list[Path] = []
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
        except OSError:
            continue
        if owner_pid(entry.name) is not None:
            found.append(Path(entry.path))
        elif depth > 1:
            found += _owned_cgroups(Path(entry.path), depth - 1)
    return found


def remove_stale(root: Path = CGROUP_ROOT, timeout: float = 10.0) -> Stale:
    """Remove every namespace and cgroup ``fa-<pid>-...`` whose ``<pid>`` has exited.

    A process that made namespaces and cgroups (:class:`Devices`, :func:`probe`) and died
    without removing them (SIGKILL, a test run stopped from outside) leaves them behind, with
    their veth links, addresses and perhaps processes. Their ``<pid>`` is no longer a running
    process (a zombie counts as exited). For each such cgroup (cgroup v2 under ``root``; v1
    anywhere in the memory and cpu hierarchies, up to :data:`STALE_SEARCH_DEPTH` levels down,
    since v1 puts it under its maker's own cgroup), every process still inside is sent
    SIGKILL by PID and the directory removed; each such namespace has the processes still
    inside it killed the same way and is deleted (``ip netns delete``; its veth ends, and so
    its links and addresses, go with it). Objects whose ``<pid>`` is alive are never touched,
    nor any other name. Needs root (only root makes them); as another user it does nothing.

    Parameters
    ----------
    root : pathlib.Path, optional
        Where the cgroup hierarchies are mounted.
    timeout : float, optional
        Seconds a cgroup may take to empty after its processes were killed.

    Returns
    -------
    Stale
        What was removed and what could not be (nothing is raised).
    """
    stale = Stale()
    if os.geteuid() != 0:
        return stale
    for top, version in _cgroup_hierarchies(root):
        for path in _owned_cgroups(top, STALE_SEARCH_DEPTH):
            pid = owner_pid(path.name)
            if pid is None or procfs.alive(pid):
                continue
            try:
                stale.killed += Cgroup(path.name, [path], version, 0, 0.0).remove(timeout)
                stale.cgroups.append(path)
            except OSError as err:
                if path.exists():  # else another sweeper (a test run's watchdog) removed it
                    stale.errors.append(f"cgroup {path}: {err}")
    for name in _namespace_names():
        pid = owner_pid(name)
        if pid is None or procfs.alive(pid):
            continue
        for left in _namespace_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(left, signal.SIGKILL)
                stale.killed.append(left)
        try:
            _run(["ip", "netns", "delete", name])
            stale.namespaces.append(name)
        except (IsolationError, OSError, subprocess.TimeoutExpired) as err:
            if name in _namespace_names():  # else someone else removed it meanwhile
                stale.errors.append(f"namespace {name}: {err}")
    stale.killed = sorted(set(stale.killed))
    return stale


# ----------------------------------------------------------------------------- devices
class Devices:
    """A SuperLink namespace with a bridge, and one namespace (and cgroup) per device.

    Parameters
    ----------
    tag : str, optional
        Name stem of every namespace and cgroup (default ``fa-<pid>-r<n>``: of its own for
        every :class:`Devices` of the process, :func:`new_tag`).
    subnet : str, optional
        The first three octets of the private /24 (default ``10.231.<20 + pid % 200>``).
        The SuperLink is ``.1``, device ``i`` is ``.(10 + i)``. The network lives inside
        the namespaces only (the bridge is in the SuperLink's), so two :class:`Devices`
        may use the same subnet.
    namespaces : bool, optional
        False: every host is loopback (only cgroups, if any, are made).

    Attributes
    ----------
    stale : Stale
        What :func:`remove_stale` removed (objects of exited processes) before this made
        its own.
    """

    def __init__(
        self, tag: str | None = None, subnet: str | None = None, namespaces: bool = True
    ) -> None:
        self.stale = remove_stale()
        pid = os.getpid()
        self.tag = tag or new_tag()
        self.subnet = subnet or f"10.231.{20 + pid % 200}"
        self.namespaces = namespaces
        self._netns: list[str] = []
        self._cgroups: list[Cgroup] = []
        self.link: Host = Host(label="superlink")
        if namespaces:
            ns = f"{self.tag}-link"
            self._add_ns(ns)
            _run(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.subnet}.1/24", "dev", "br0"])
            _run(["ip", "-n", ns, "link", "set", "br0", "up"])
            self.link = Host(f"{self.subnet}.1", ["ip", "netns", "exec", ns], None, "superlink")

    def _add_ns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._netns.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def device(self, index: int, memory: int | None, cpus: float | None) -> Host:
        """Make device ``index``: its namespace, linked to the SuperLink's, and its cgroup.

        ``memory``/``cpus`` None: no cgroup.
        """
        label = f"node{index}"
        cgroup = None
        if memory is not None and cpus is not None:
            cgroup = Cgroup.create(f"{self.tag}-{label}", memory, cpus)
            self._cgroups.append(cgroup)
        if not self.namespaces:
            return Host("127.0.0.1", [], cgroup, label)
        address = self._wire(index)
        return Host(address, ["ip", "netns", "exec", f"{self.tag}-{label}"], cgroup, label)

    def _wire(self, index: int) -> str:
        """Make device ``index``'s namespace and its veth link to the bridge; return its address."""
        ns, link = f"{self.tag}-node{index}", f"{self.tag}-link"
        self._add_ns(ns)
        veth = f"veth{index}"
        _run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", veth,
              "netns", link])  # fmt: skip
        _run(["ip", "-n", link, "link", "set", veth, "master", "br0"])
        _run(["ip", "-n", link, "link", "set", veth, "up"])
        address = f"{self.subnet}.{10 + index}"
        _run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        return address

    def restore(self, host: Host) -> list[str]:
        """Make what is missing of ``host``'s device again, before a process restarts there.

        Its cgroup is made again if its directory is gone and its limits are written again
        (a restarted node gets the device's memory and CPU, whatever changed them); a node's
        network namespace that is gone is made again with its link and address (a stale
        veth end in the SuperLink's namespace is removed first).

        Returns
        -------
        list of str
            What had to be made again (empty when everything was there).

        Raises
        ------
        IsolationError
            If something cannot be made, or the SuperLink's namespace is gone (every node's
            link hangs on its bridge: start a new rehearsal).
        """
        rebuilt: list[str] = []
        if host.cgroup is not None:
            if host.cgroup.restore():
                rebuilt.append(f"cgroup {host.cgroup.name}")
            if host.cgroup not in self._cgroups:
                self._cgroups.append(host.cgroup)
        ns = host.namespace
        if ns is None or ns in _namespace_names():
            return rebuilt
        if host is self.link or not host.label.startswith("node"):
            raise IsolationError(
                f"network namespace {ns} ({host.label}) is gone: every node's link hangs on it; "
                "stop this rehearsal and start a new one"
            )
        index = int(host.label[4:])
        if ns in self._netns:
            self._netns.remove(ns)
        link = f"{self.tag}-link"
        with contextlib.suppress(IsolationError):  # its peer went with the namespace, or not
            _run(["ip", "-n", link, "link", "del", f"veth{index}"])
        self._wire(index)
        rebuilt.append(f"network namespace {ns}")
        return rebuilt

    def cgroups(self) -> list[Cgroup]:
        """Return the cgroups made so far."""
        return list(self._cgroups)

    def close(self) -> None:
        """Remove every cgroup (killing what is left in it) and namespace made here."""
        errors = []
        for cgroup in self._cgroups:
            try:
                cgroup.remove()
            except OSError as err:
                errors.append(f"cgroup {cgroup.name}: {err}")
        self._cgroups.clear()
        for ns in reversed(self._netns):
            with contextlib.suppress(IsolationError):
                _run(["ip", "netns", "del", ns])  # its veth ends go with it
        self._netns.clear()
        if errors:
            raise IsolationError("; ".join(errors))
