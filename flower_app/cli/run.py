"""``flower-app run`` (checked first, its own SuperLink, an honest exit code) and ``stop``.

``run`` checks the run_config, the data and the instance in-process (:func:`plan_run`:
seconds, nothing started), decides where the results go (in the caller's environment, never
overwriting a run folder), warns about what Flower would walk or refuse in the app folder
(:mod:`flower_app.cli.app_folder`), gives this ``FLWR_HOME`` its own local SuperLink ports
(:func:`local_ports`), wraps ``flwr run`` and folds a failure into one line with the path of
the full log; ``stop`` stops exactly the local SuperLink of one ``FLWR_HOME``;
:func:`superlinks_report` names every SuperLink using its database.

Flower facts this module works around (flwr 1.42):

- ``flwr run --stream`` exits 0 when the run fails; the run's real outcome is its status in
  ``flwr ls`` (``finished:completed``, ``finished:failed``, ``finished:stopped``) with the
  error in ``status-details``.
- The first ``flwr run`` (or ``flwr ls``) against the ``local`` SuperLink starts a
  ``flower-superlink`` daemon and leaves it running. Its command line names its database
  ``$FLWR_HOME/local-superlink/state.db``, which identifies the daemon of one ``FLWR_HOME``
  without touching any other SuperLink on the machine.
- The ServerApp and ClientApps run from Flower's installed copy of the app
  (``$FLWR_HOME/apps/<publisher>.<name>.<version>.<hash>/``), so tracebacks name files there.
- ``flwr run`` gives the local SuperLink it starts 15 s to answer; on a busy machine it
  needs more (two ``flower-app run`` at once on a loaded 2-core machine both failed with
  "Failed to start local SuperLink within 15s"). So :func:`start_local_superlink` starts it
  first, with Flower's own command, and waits up to 300 s; ``flwr run`` then finds it
  running and uses it.
- ``flwr run`` finds its local SuperLink by port, not by ``FLWR_HOME``: whatever answers on
  ``127.0.0.1:39091`` (``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``, control API
  ``FLWR_LOCAL_CONTROL_API_PORT``, default 39093) is used, whichever home started it.
- ``flwr run`` refuses an unknown run_config key only with ``[code: 15] Invalid run
  configuration`` and checks nothing else before it has started a SuperLink, built and
  sent the app: a bad value fails in the ServerApp, after the simulation started.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower_app import procfs
from flower_app.files import atomic_write_text
from flower_app.quiet import Collapser, is_noise

__all__ = [
    "PORT_ENV",
    "RunPlan",
    "flwr_home",
    "free_ports",
    "local_nodes",
    "local_ports",
    "local_superlink_pids",
    "plan_run",
    "preflight",
    "run_app",
    "start_local_superlink",
    "stop_local_superlink",
    "superlink_pids",
    "superlinks_report",
]

#: flwr and flower-superlink of this interpreter's environment
BIN = Path(sys.executable).parent
_STARTED = re.compile(r"Successfully started run (\d+)")
#: Flower's installed copy of an app (no quote or space: a traceback quotes the path)
_APP_COPY = re.compile(r"([^\s\"']*?/apps/[^/\s\"']+\.[^/\s\"']+\.[^/\s\"']+\.[0-9a-f]{6,}/)")
#: Flower's environment variables of the local SuperLink's ports -> key in PORTS_FILE
PORT_ENV = {
    "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "http-api-port",
    "FLWR_LOCAL_CONTROL_API_PORT": "control-api-port",
}
#: where a FLWR_HOME keeps its local SuperLink's ports (chosen once)
PORTS_FILE = "flower-app-ports.json"
#: where flower-app run writes each run's full log, in FLWR_HOME
LOG_DIR = "flower-app-logs"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct TCP ports that are free on ``host`` right now.

    All are bound at once before any is released: ports chosen one at a time can repeat (the
    kernel may hand out a just-released port again; a Ray head once got the same port for
    two of its components and refused to start).
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]


def flwr_home() -> Path:
    """Return Flower's home folder: ``$FLWR_HOME`` or ``~/.flwr`` (as ``flwr`` does)."""
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr").expanduser().resolve()


def local_superlink_pids(home: Path | None = None) -> list[int]:
    """Return the PIDs of ``flower-superlink`` daemons whose database is in ``home``."""
    marker = f"{home or flwr_home()}/local-superlink/"
    return sorted(
        pid
        for pid in procfs.pids()
        if _is_superlink(argv := procfs.argv(pid)) and any(a.startswith(marker) for a in argv)
    )


def _is_superlink(argv: list[str] | None) -> bool:
    """Return whether a command line is a ``flower-superlink`` process's."""
    return argv is not None and any(a.endswith("flower-superlink") for a in argv[:2])


def _superlink_ports(pid: int) -> dict[str, int]:
    """Return the ports a ``flower-superlink`` process was started with (``--port``, control)."""
    argv = procfs.argv(pid)
    if argv is None:
        return {}
    out = {}
    for flag, key in (("--port", "http-api-port"), ("--control-api-address", "control-api-port")):
        if flag in argv[:-1]:
            value = argv[argv.index(flag) + 1].rsplit(":", 1)[-1]
            if value.isdigit():
                out[key] = int(value)
    return out


def superlinks_report(home: Path | None = None) -> list[str]:
    """Return one line per SuperLink using ``home``'s database, and a warning if several.

    A plain ``flwr run`` looks for its local SuperLink on Flower's default ports, not on
    this home's (:func:`local_ports`): without ``eval "$(flower-app ports)"`` it starts a
    second SuperLink on the same ``$FLWR_HOME/local-superlink/state.db``. Both are found
    here by their command lines (:func:`local_superlink_pids`).
    """
    home = home or flwr_home()
    pids = local_superlink_pids(home)
    lines = []
    for pid in pids:
        ports = _superlink_ports(pid)
        http, control = (ports.get(k, "?") for k in ("http-api-port", "control-api-port"))
        lines.append(f"SuperLink PID {pid} uses {home / 'local-superlink'} (ports {http}, "
                     f"{control})")  # fmt: skip
    if len(pids) > 1:
        lines.append(
            f"warning: {len(pids)} SuperLinks share the database of {home}: a plain flwr run "
            "started one on Flower's default ports; stop them (flower-app stop stops all of "
            "this home's), then use eval \"$(flower-app ports)\" before a plain flwr run"
        )
    return lines


def superlink_pids(port: int) -> list[int]:
    """Return the PIDs of ``flower-superlink`` processes started with HTTP API ``port``."""
    return [
        pid
        for pid in procfs.pids()
        if _superlink_ports(pid).get("http-api-port") == port and _is_superlink(procfs.argv(pid))
    ]


def _port_free(port: int) -> bool:
    """Return whether nothing listens on ``port``.

    A socket of a stopped SuperLink left in TIME_WAIT does not count (SO_REUSEADDR, as the
    SuperLink itself binds).
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def local_ports(home: Path | None = None) -> tuple[dict[str, int], str]:
    """Return this ``FLWR_HOME``'s local SuperLink ports, chosen once and kept in it.

    The ports live in ``$FLWR_HOME/flower-app-ports.json``. They are (re)chosen among free
    ports when the file is missing, or when a SuperLink of another home (or any other
    program) holds them. A SuperLink of this home already running on other ports (one a
    plain ``flwr run`` started) is adopted, so that a home never has two.

    Parameters
    ----------
    home : pathlib.Path, optional
        The ``FLWR_HOME`` (default :func:`flwr_home`).

    Returns
    -------
    tuple of (dict, str)
        Key of :data:`PORT_ENV` -> port, and a note for the user ("" when nothing changed).
    """
    home = home or flwr_home()
    file = home / PORTS_FILE
    ports: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        kept = json.loads(file.read_text())
        ports = {k: int(v) for k, v in kept.items() if k in PORT_ENV.values()}
    note = ""
    mine = local_superlink_pids(home)
    running = _superlink_ports(mine[0]) if mine else {}
    if len(running) == 2 and running != ports:
        ports, note = running, f"adopted the running local SuperLink of {home} (PID {mine[0]})"
    elif len(ports) == 2:
        http = ports["http-api-port"]
        others = [p for p in superlink_pids(http) if p not in mine]
        busy = [v for v in ports.values() if not mine and not _port_free(v)]
        if others or busy:
            who = f"the SuperLink (PID {others[0]}) of another FLWR_HOME" if others else "a program"
            port = http if others else busy[0]
            ports, note = {}, f"port {port} is held by {who}: chose new ports"
    if len(ports) != 2:
        ports = dict(zip(("http-api-port", "control-api-port"), free_ports(2), strict=True))
        note = note or f"chose the local SuperLink ports of {home}"
    if note:
        home.mkdir(parents=True, exist_ok=True)
        atomic_write_text(file, json.dumps(ports, indent=1) + "\n")
    return ports, note


def start_local_superlink(
    home: Path, ports: dict[str, int], env: dict[str, str], timeout: float = 300.0
) -> subprocess.Popen | None:
    """Start ``home``'s local SuperLink as ``flwr run`` would, without its 15 s limit.

    The command is Flower's own for its managed local SuperLink (``flwr/cli/
    local_superlink.py``: simulation mode, subprocess isolation, the database
    ``$FLWR_HOME/local-superlink/state.db`` that :func:`local_superlink_pids` finds it by),
    on this home's ports, detached like Flower's (it outlives the command; ``flower-app
    stop`` stops it). Nothing is started when this home's SuperLink already runs.

    Parameters
    ----------
    home : pathlib.Path
        The ``FLWR_HOME``.
    ports : dict
        :func:`local_ports`' ports.
    env : dict
        The environment of ``flwr run``.
    timeout : float, optional
        Seconds allowed until its health endpoint answers.

    Returns
    -------
    subprocess.Popen or None
        The SuperLink started (its own session), or None if it was already running.

    Raises
    ------
    RuntimeError
        If it exits or does not answer within ``timeout`` (the message names its log).
    """
    if local_superlink_pids(home):
        return None
    folder = home / "local-superlink"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "superlink.log"
    cmd = [str(BIN / "flower-superlink"), "--insecure", "--simulation",
           "--isolation", "subprocess",
           "--control-api-address", f"127.0.0.1:{ports['control-api-port']}",
           "--host", "127.0.0.1", "--port", str(ports["http-api-port"]),
           "--log-file", str(log), "--log-rotation-interval-hours", "24",
           "--log-rotation-backup-count", "7", "--database", str(folder / "state.db")]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{ports['http-api-port']}/health"
    deadline = time.monotonic() + timeout
    while True:
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(url, timeout=5) as response,  # noqa: S310 (loopback)
        ):
            if 200 <= response.status < 300:
                return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            why = f"exited with code {proc.poll()}" if proc.returncode is not None else (
                f"did not answer within {timeout:.0f} s")  # fmt: skip
            raise RuntimeError(f"the local SuperLink {why}; see its log {log}")
        time.sleep(0.2)


def _is_local(superlink: str | None, home: Path) -> bool:
    """Return whether ``flwr run`` would use a local (simulation) SuperLink for ``superlink``."""
    try:
        config = tomllib.loads((home / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return superlink in (None, "local")  # flwr writes a default config with 'local'
    links = config.get("superlink", {})
    name = superlink or links.get("default", "local")
    entry = links.get(name, {})
    return isinstance(entry, dict) and entry.get("address") in (":local:", ":local-in-memory:")


def _env(ports: dict[str, int] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for key, value in (
        ("FLWR_TELEMETRY_ENABLED", "0"),
        ("FLWR_DISABLE_UPDATE_CHECK", "1"),
        ("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1"),
    ):
        env.setdefault(key, value)
    for name, key in PORT_ENV.items():
        if ports:
            env[name] = str(ports[key])
    return env


def _app_table(app_dir: Path) -> dict[str, Any]:
    """Return the app's ``[tool.flwr.app]``."""
    with open(app_dir / "pyproject.toml", "rb") as fh:
        return dict(tomllib.load(fh).get("tool", {}).get("flwr", {}).get("app", {}))


def _app_config(app_dir: Path) -> tuple[dict[str, Any], str]:
    """Return the app's ``[tool.flwr.app.config]`` and its ServerApp component."""
    tool = _app_table(app_dir)
    from flower_app.settings.overrides import _flatten

    return _flatten(tool.get("config", {})), str(tool.get("components", {}).get("serverapp", ""))


#: SuperNodes of a local simulation when nothing says otherwise (flwr 1.42:
#: flwr.supercore.constant.DEFAULT_SIMULATION_CONFIG.num_supernodes; a test checks it)
LOCAL_DEFAULT_NODES = 2


def local_nodes(
    superlink: str | None, federation_config: Sequence[str] | None, home: Path
) -> int | None:
    """Return the SuperNodes of a run on a local (simulation) SuperLink; None if not local.

    ``num-supernodes`` of the ``--federation-config`` options, else of the connection's
    ``options`` in ``$FLWR_HOME/config.toml``, else Flower's default
    (:data:`LOCAL_DEFAULT_NODES`). None also when the value is not an integer (Flower then
    names it).
    """
    if not _is_local(superlink, home):
        return None
    from flower_app.settings import ConfigError
    from flower_app.settings.overrides import read_overrides

    try:
        given = read_overrides(list(federation_config or []))
    except ConfigError:
        return None
    if "num-supernodes" not in given:
        try:
            config = tomllib.loads((home / "config.toml").read_text())
        except (OSError, tomllib.TOMLDecodeError):
            config = {}
        links = config.get("superlink", {})
        entry = links.get(superlink or links.get("default", "local"), {})
        options = entry.get("options", {}) if isinstance(entry, dict) else {}
        given = {"num-supernodes": options.get("num-supernodes", LOCAL_DEFAULT_NODES)}
    nodes = given["num-supernodes"]
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None


@dataclass
class RunPlan:
    """What ``flower-app run`` checked and decided before Flower starts.

    Attributes
    ----------
    problems : list of str
        One line each; any problem means the run is not started (exit 2).
    pinned : dict
        run_config keys ``flower-app run`` adds to the run (as the last ``--run-config``):
        ``output-dir`` and ``data-dir`` resolved in the caller's environment, ``run-name``
        chosen when none was given (local SuperLink only).
    folder : pathlib.Path or None
        The run folder (None on another SuperLink: the ServerApp's machine decides).
    where : str
        Where the results go, for the first line ("" for another Flower app).
    warnings : list of str
        What Flower would walk for long or refuse in the app folder (the run goes on).
    """

    problems: list[str] = field(default_factory=list)
    pinned: dict[str, str] = field(default_factory=dict)
    folder: Path | None = None
    where: str = ""
    warnings: list[str] = field(default_factory=list)


def _pin(merged: dict[str, Any], pinned: dict[str, str], key: str, value: str) -> None:
    merged[key] = pinned[key] = value


def plan_run(
    app: str | Path,
    run_config: Sequence[str] | None,
    superlink: str | None = None,
    federation_config: Sequence[str] | None = None,
    home: Path | None = None,
) -> RunPlan:
    """Check a ``flower-app run`` in-process, before anything of Flower starts.

    The app's ``[tool.flwr.app.config]`` merged with the ``--run-config`` options, as
    ``flwr run`` merges them: the options' syntax (:mod:`flower_app.settings.overrides`),
    unknown keys (with the closest known one), and, for this app, every value, the keys of
    another algorithm family, the dataset, keys that do not go together
    (:meth:`flower_app.config.AppConfig.problems`), the data files and the keys against the
    instance and the federation's size (:func:`flower_app.datasets.check.check_data`). On a
    local SuperLink also where the results go: ``output-dir`` and ``data-dir`` resolved in
    the caller's environment (``$FLOWER_APP_OUTPUT``, ``$FLOWER_APP_DATA``), never the
    SuperLink's; a given ``run-name`` whose folder holds a run is refused (never overwritten;
    ``resume = true`` continues it), none given gets a fresh one. For another Flower app only
    the syntax and the keys are checked.

    Returns
    -------
    RunPlan
        The problems, the keys to pin, the run folder and the app folder's warnings.
    """
    from flower_app.settings import ConfigError
    from flower_app.settings.overrides import read_overrides

    app_dir = Path(app).resolve()
    home = home or flwr_home()
    plan = RunPlan()
    try:
        table = _app_table(app_dir)
        defaults, serverapp = _app_config(app_dir)
    except (OSError, tomllib.TOMLDecodeError) as err:
        plan.problems = [f"{app_dir / 'pyproject.toml'}: not a Flower app's pyproject.toml ({err})"]
        return plan
    try:
        overrides = read_overrides(run_config)
    except ConfigError as err:
        plan.problems = err.problems
        return plan
    if not serverapp.startswith("flower_app."):
        import difflib

        for key in (k for k in overrides if k not in defaults):
            close = difflib.get_close_matches(key, defaults, 1)
            plan.problems.append(f"run_config key '{key}' is not in [tool.flwr.app.config] of "
                                 f"{app_dir}" + (f" (did you mean '{close[0]}'?)" if close
                                                 else ""))  # fmt: skip
        return plan
    from flower_app.config import AppConfig, fresh_run_name
    from flower_app.datasets.check import check_data
    from flower_app.datasets.paths import resolve_data_dir
    from flower_app.results import held_run

    merged = {**defaults, **overrides}
    local = _is_local(superlink, home)
    if local:  # the caller's environment decides, not the SuperLink's (started earlier)
        if merged.get("output-dir", "") == "":
            root = os.environ.get("FLOWER_APP_OUTPUT", "") or "~/flower_app_runs"
            _pin(merged, plan.pinned, "output-dir", str(Path(root).expanduser().resolve()))
        if merged.get("data-dir", "") == "":
            _pin(merged, plan.pinned, "data-dir", str(resolve_data_dir("")))
    plan.problems = AppConfig.problems(merged)
    if plan.problems:
        return plan
    cfg = AppConfig.from_run_config(merged)
    nodes = local_nodes(superlink, federation_config, home)
    plan.problems = check_data(cfg, nodes)[0]
    if not local:
        root_there = cfg.output_dir or "$FLOWER_APP_OUTPUT or ~/flower_app_runs"
        name = cfg.run_name or f"{cfg.algorithm}-{cfg.dataset}-seed{cfg.seed}-<time>"
        plan.where = (f"on the SuperLink's machine, in {root_there}/{name} as its ServerApp "
                      "resolves them")  # fmt: skip
    if plan.problems or not local:
        return plan
    root = cfg.output_root()
    if not cfg.run_name:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{cfg.algorithm}-{cfg.dataset}-seed{cfg.seed}-{stamp}"
        _pin(merged, plan.pinned, "run-name", fresh_run_name(root, name))
    plan.folder = root / str(merged["run-name"])
    plan.where = str(plan.folder)
    held = held_run(plan.folder)
    if cfg.resume and held is None:
        plan.problems.append(f"run_config 'resume' = true: run folder {plan.folder} holds no run "
                             "to resume (check 'run-name' and 'output-dir')")  # fmt: skip
    elif not cfg.resume and held is not None:
        plan.problems.append(
            f"run_config 'run-name' = {cfg.run_name!r}: run folder {plan.folder} already holds a "
            f"run ({held}); a run folder is never overwritten: choose another 'run-name', or "
            "resume = true to continue that run"
        )
    for key, value in plan.pinned.items():
        if "'" in value and '"' in value:
            plan.problems.append(f"run_config '{key}' = {value!r}: a path with both quote "
                                 "characters cannot be passed to flwr run")  # fmt: skip
    from flower_app.cli.app_folder import app_folder_warnings

    plan.warnings = app_folder_warnings(app_dir, table)
    return plan


def preflight(app: str | Path, run_config: Sequence[str] | None) -> list[str]:
    """Return the problems of :func:`plan_run` (default SuperLink), one line each."""
    return plan_run(app, run_config).problems


def _pairs(pinned: dict[str, str]) -> str:
    """Return ``pinned`` as one ``--run-config`` string (TOML strings, quoted for Flower)."""
    quote = {True: "'{}'", False: '"{}"'}
    return " ".join(f"{k}={quote[chr(39) not in v].format(v)}" for k, v in pinned.items())


def _status(run_id: int, superlink: str | None, env: dict[str, str]) -> tuple[str, str]:
    cmd = [str(BIN / "flwr"), "ls", *([superlink] if superlink else [])]
    cmd += ["--run-id", str(run_id), "--format", "json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout
    try:
        data = json.loads(out[out.index("{") :])
    except ValueError:
        return "unknown", f"flwr ls failed: {(out + proc.stderr).strip()[-500:]}"
    for entry in data.get("runs", []):
        if int(entry.get("run-id", -1)) == run_id:
            return str(entry.get("status")), str(entry.get("status-details", ""))
    return "unknown", f"run {run_id} is not listed by flwr ls"


class _Console:
    """The streamed log: noise dropped, tracebacks kept for the log file only."""

    def __init__(self, app_dir: Path, log: Any, filter_noise: bool, full: bool) -> None:
        self.app_dir, self.log, self.filter_noise, self.full = app_dir, log, filter_noise, full
        self.trace: list[str] = []
        self.errors: list[tuple[str, str]] = []  # (exception line, where it was raised)
        self.collapse = Collapser()

    def _end_trace(self) -> None:
        frames = [t for t in self.trace if t.lstrip().startswith('File "')]
        where = ""
        if frames:
            m = re.match(r'\s*File "([^"]+)", line (\d+)', frames[-1])
            if m:
                path = m.group(1)
                with contextlib.suppress(ValueError):
                    path = str(Path(path).relative_to(self.app_dir))
                where = f"{path}:{m.group(2)}"
        last = self.trace[-1].strip() if self.trace else ""
        self.errors.append((last, where))
        self.trace = []

    def line(self, line: str) -> None:
        line = _APP_COPY.sub(f"{self.app_dir}/", line)
        self.log.write(line)
        text = line.rstrip("\n")
        if self.trace:
            if text.startswith((" ", "\t")) or text.startswith("Traceback"):
                self.trace.append(text)
                return
            if text == "" or text.startswith(("During handling", "The above exception")):
                self.trace.append(text)
                return
            self.trace.append(text)  # the exception line ends the block
            self._end_trace()
            if not self.full:
                return
        elif text.startswith("Traceback (most recent call last)"):
            self.trace = [text]
        if self.full or not self.trace:
            self.show(line)

    def show(self, line: str) -> None:
        if self.filter_noise and is_noise(line):
            return
        for out in self.collapse.feed(line):
            sys.stdout.write(out)
        sys.stdout.flush()

    def close(self) -> None:
        if self.trace:
            self._end_trace()
        for out in self.collapse.flush():
            sys.stdout.write(out)
        sys.stdout.flush()


def _with_pinned(run_configs: list[str], pinned: dict[str, str], home: Path) -> list[str]:
    """Return the ``--run-config`` options with ``pinned`` last (a later option wins).

    A ``.toml`` file cannot go with ``key=value`` options (Flower refuses the mix): its keys
    and ``pinned`` are written to one file in ``$FLWR_HOME/flower-app-logs/`` instead.
    """
    if not (len(run_configs) == 1 and run_configs[0].endswith(".toml")):
        return [*run_configs, _pairs(pinned)]
    from flower_app.settings.overrides import read_overrides
    from flower_app.settings.render import toml_value

    merged = {**read_overrides(run_configs), **pinned}
    folder = home / LOG_DIR
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"run-config-{os.getpid()}.toml"
    file.write_text("".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in merged.items()))
    return [str(file)]


def run_app(
    app: str = ".",
    superlink: str | None = None,
    run_config: str | Sequence[str] | None = None,
    federation_config: str | Sequence[str] | None = None,
    filter_noise: bool = True,
    full_log: bool = False,
) -> int:
    """Check, then run ``flwr run APP [SUPERLINK] --stream``; return the run's exit code.

    Parameters
    ----------
    app : str
        The Flower app's folder.
    superlink : str, optional
        A SuperLink connection of ``$FLWR_HOME/config.toml`` (default: its default, the
        local SuperLink, on this home's own ports: :func:`local_ports`).
    run_config, federation_config : str or sequence of str, optional
        As ``flwr run``'s options (each may be given several times).
    filter_noise : bool
        Drop :mod:`flower_app.quiet`'s messages and collapse repeated ones.
    full_log : bool
        Also show the tracebacks (always in the log file).

    Returns
    -------
    int
        2 if :func:`plan_run` found a problem (each printed on one line; nothing of Flower
        was started); 0 if the run finished ``completed``; otherwise ``flwr run``'s own
        non-zero code, or 1 (one line: the run's status, its cause and the log's path).
    """
    app_dir = Path(app).resolve()
    run_configs = [run_config] if isinstance(run_config, str) else list(run_config or [])
    fed_configs = (
        [federation_config] if isinstance(federation_config, str) else list(federation_config or [])
    )
    home = flwr_home()
    plan = plan_run(app_dir, run_configs, superlink, fed_configs, home)
    if plan.problems:
        for problem in plan.problems:
            print(f"flower-app run: {problem}", file=sys.stderr)
        return 2
    if plan.where:
        print(f"flower-app run: results {'in ' if plan.folder else ''}{plan.where}", flush=True)
    for warning in plan.warnings:
        print(f"flower-app run: warning: {warning}", file=sys.stderr, flush=True)
    if plan.pinned:
        run_configs = _with_pinned(run_configs, plan.pinned, home)
    ports = None
    if _is_local(superlink, home) and not all(os.environ.get(k) for k in PORT_ENV):
        ports, note = local_ports(home)
        if note:
            print(f"flower-app run: {note} ({', '.join(map(str, ports.values()))})")
    env = _env(ports)
    if ports is not None:  # Flower would give it 15 s, which a busy machine exceeds
        try:
            start_local_superlink(home, ports, env)
        except RuntimeError as err:
            print(f"flower-app run: {err}", file=sys.stderr)
            return 1
    if ports is not None and len(local_superlink_pids(home)) > 1:
        for line in superlinks_report(home):
            print(f"flower-app run: {line}", file=sys.stderr)
    cmd = [str(BIN / "flwr"), "run", str(app_dir), *([superlink] if superlink else []), "--stream"]
    for text in run_configs:
        cmd += ["--run-config", text]
    for text in fed_configs:
        cmd += ["--federation-config", text]
    logs = home / LOG_DIR
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    run_id: int | None = None
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        console = _Console(app_dir, log, filter_noise, full_log)
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                match = _STARTED.search(line)
                if match:
                    run_id = int(match.group(1))
                console.line(line)
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            console.close()
            print("flower-app run: interrupted (the run may go on: flwr stop <run-id>)",
                  file=sys.stderr)  # fmt: skip
            return 130
        console.close()
        if run_id is None:
            cause = console.errors[-1][0] if console.errors else f"exit code {code}"
            print(f"flower-app run: flwr run did not start a run: {cause} (full log: "
                  f"{log_path})", file=sys.stderr)  # fmt: skip
            return code or 1
        status, details = _status(run_id, superlink, env)
        deadline = time.monotonic() + 120.0  # the stream can end just before the status flips
        while not status.startswith("finished") and time.monotonic() < deadline:
            time.sleep(0.5)
            status, details = _status(run_id, superlink, env)
        log.write(f"status: {status}\ndetails: {details}\n")
    final = logs / f"run-{run_id}.log"
    with contextlib.suppress(OSError):
        os.replace(log_path, final)
        log_path = final
    if status == "finished:completed":
        return 0
    if console.errors:
        cause, where = console.errors[-1]
        cause += f" (raised at {where})" if where else ""
    else:
        cause = " ".join(details.split())[:300] or "no error message"
    print(f"flower-app run: run {run_id} {status}: {cause}; full log: {log_path}",
          file=sys.stderr)  # fmt: skip
    return code or 1


def stop_local_superlink(home: Path | None = None, timeout: float = 15.0) -> int:
    """Stop the local SuperLink daemon of ``home`` (default :func:`flwr_home`) by PID.

    SIGTERM, then SIGKILL after ``timeout`` seconds. Other SuperLinks on the machine (other
    ``FLWR_HOME``\\ s, deployments) are never signalled.

    Returns
    -------
    int
        0 (also when none was running; the message says so).
    """
    home = home or flwr_home()
    pids = local_superlink_pids(home)
    if not pids:
        print(f"flower-app stop: no local SuperLink of {home} is running")
        return 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pids):
        time.sleep(0.1)
    for pid in _alive(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    print(f"flower-app stop: stopped the local SuperLink of {home} (PID "
          f"{', '.join(map(str, pids))})")  # fmt: skip
    return 0


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if procfs.alive(pid)]
