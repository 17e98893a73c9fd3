"""FedSM over Flower's simulation engine beside the direct engine: wall time and peak memory.

Any algorithm of the submodular families runs the same way (``--algorithm fedcg --set
fedcg-rounds=20``); FedSM Algorithm 1 is the default. For each SuperNode count this script
runs one experiment with ``flwr run . --stream``
against a local SuperLink that it starts itself (isolated ``FLWR_HOME``, free ports), samples
the memory of every process of that run, checks the run's status with ``flwr ls``, reads the
run folder, and stops the SuperLink. Then, in the same invocation, it runs the same
configuration on the direct engine (:func:`direct.run_direct`) in a fresh
Python subprocess and records its wall time and peak RSS. Results go to ``results.json`` and
``results.csv`` in ``--out``.

Memory of a Flower run
    Every 0.5 s a thread scans ``/proc`` and sums VmRSS (and PSS from ``smaps_rollup``) over
    the processes that belong to the run: (a) the ``flwr`` CLI and all its descendants,
    (b) the SuperLink started for this run (found by its port in the command line) and all
    its descendants (``flower-superexec`` -> ``flwr-simulation`` -> Ray's ``gcs_server``,
    ``raylet``, workers/actors, ...), and (c) any process that started after the benchmark
    began and whose environment carries this run's unique ``FLWR_HOME`` (every process of
    the run inherits it, including Ray processes that were reparented to PID 1). Ray
    processes (``ray::*`` titles, ``.../ray/...`` scripts, raylet, gcs_server) that started
    after the benchmark began but do not carry the marker are listed separately
    (``other-ray-processes-not-counted``) and *not* added: on a shared machine they belong
    to somebody else. The peak is the largest
    sampled sum, so short spikes between samples can be missed; the RSS sum counts shared
    pages (Python libraries, Ray's object store) once per process, PSS divides them.

Memory of a direct run
    ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of the subprocess that ran it (its exact
    peak RSS, imports and data loading included).

Run it niced on a shared machine, e.g.::

    nice -n 10 /work/venv/bin/python benchmarks/fedsm_flower_vs_direct.py \\
        --dataset movielens --data-dir /work/data --supernodes 2 16 6040
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower_app import procfs
from flower_app.results import read_rows, read_run
from flower_app.simulation import LocalSimulation, superlink_pids, toml_value

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "fedsm-flower-vs-direct"
PAGE = os.sysconf("SC_PAGE_SIZE")
#: a Ray process: ``ray::<title>``, a binary/script under ``.../ray/...``, raylet, gcs_server
RAY_CMD = re.compile(r"(^|\s)ray::|/ray/|raylet|gcs_server")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- /proc helpers
def _boot_time() -> float:
    """Return the system boot time in seconds since the epoch."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


BOOT = _boot_time()


@dataclass(frozen=True)
class ProcInfo:
    """A snapshot of one process."""

    pid: int
    ppid: int
    start: float  # seconds since the epoch
    rss: int  # bytes
    cmdline: str


def _read_proc(pid: int) -> ProcInfo | None:
    """Read ppid, start time, RSS and command line of ``pid`` (None if it vanished)."""
    fields, raw = procfs.stat_fields(pid), procfs.cmdline(pid)
    if fields is None or raw is None:
        return None
    try:
        ppid = int(fields[1])
        start = BOOT + int(fields[19]) / CLK_TCK
        rss = int(fields[21]) * PAGE
    except (ValueError, IndexError):
        return None
    cmd = raw.replace(b"\0", b" ").decode(errors="replace")
    return ProcInfo(pid, ppid, start, rss, cmd.strip())


def _snapshot() -> dict[int, ProcInfo]:
    """Return every readable process but this one."""
    infos = (_read_proc(pid) for pid in procfs.pids())
    return {info.pid: info for info in infos if info is not None}


def _environ_has(pid: int, marker: bytes) -> bool | None:
    """Return whether the environment of ``pid`` contains ``marker`` (None if unreadable)."""
    env = procfs.environ(pid)
    return None if env is None else marker in env


def _pss(pid: int) -> int:
    """Return the proportional set size of ``pid`` in bytes (0 if unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _descendants(procs: dict[int, ProcInfo], roots: set[int]) -> set[int]:
    """Return ``roots`` (those alive) and all their descendants."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out, stack = set(), [r for r in roots if r in procs]
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.add(pid)
            stack.extend(children.get(pid, []))
    return out


def _short(cmdline: str) -> str:
    """Return a short name for a process: Ray's title, or the script/binary it runs."""
    args = cmdline.split()
    if not args:
        return "?"
    if args[0].startswith("ray::"):
        return args[0]
    for a in args[:3]:
        base = Path(a).name
        if base not in {"python", "python3", "-u"} and not base.startswith("python3."):
            return base
    return Path(args[0]).name


class MemorySampler(threading.Thread):
    """Sample the summed RSS/PSS of one Flower run's processes every ``interval`` seconds."""

    def __init__(self, cli_pid: int, port: int, marker: bytes, since: float, interval: float):
        super().__init__(daemon=True)
        self.cli_pid, self.port, self.marker = cli_pid, port, marker
        self.since, self.interval = since, interval
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self.samples = 0
        self.seen: dict[int, str] = {}
        self.at_peak: list[list[Any]] = []
        self.other_ray: dict[int, str] = {}
        self._marked: dict[int, bool] = {}
        self._halt = threading.Event()

    def _members(self, procs: dict[int, ProcInfo]) -> set[int]:
        roots = {self.cli_pid}
        for p in procs.values():
            if "flower-superlink" in p.cmdline and str(self.port) in p.cmdline.split():
                roots.add(p.pid)
        members = _descendants(procs, roots)
        for p in procs.values():
            if p.pid in members or p.start < self.since - 1.0:
                continue
            key = p.pid
            if key not in self._marked:
                self._marked[key] = bool(_environ_has(p.pid, self.marker))
            if self._marked[key]:
                members.add(p.pid)
            elif RAY_CMD.search(p.cmdline):
                self.other_ray[p.pid] = p.cmdline[:160]
        return members

    def sample(self) -> None:
        """Take one sample."""
        procs = _snapshot()
        members = self._members(procs)
        rss = sum(procs[p].rss for p in members)
        pss = sum(_pss(p) for p in members)
        for p in members:
            self.seen.setdefault(p, procs[p].cmdline[:160])
        self.samples += 1
        if rss > self.peak_rss:
            self.peak_rss, self.peak_procs = rss, len(members)
            self.at_peak = sorted(
                ([_mib(procs[p].rss), _short(procs[p].cmdline)] for p in members),
                reverse=True,
            )
        self.peak_pss = max(self.peak_pss, pss)

    def run(self) -> None:
        """Sample until stopped."""
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        """Stop sampling (after one last sample) and wait for the thread."""
        self._halt.set()
        self.join()
        self.sample()


# ---------------------------------------------------------------------------- flower runs
@dataclass
class FlowerRun:
    """Outcome of one ``flwr run``."""

    supernodes: int
    command: list[str]
    run_id: int | None
    status: str
    details: str
    wall_time: float
    exit_code: int
    peak_rss: int
    peak_pss: int
    peak_procs: int
    samples: int
    processes: dict[int, str]
    at_peak: list[list[Any]]
    other_ray: dict[int, str]
    folder: Path
    log_tail: str
    superlink_log_tail: str
    summary: dict[str, Any] | None = None
    rounds: list[dict[str, Any]] = field(default_factory=list)


class LocalFlower(LocalSimulation):
    """Runs ``flwr run . --stream`` against a SuperLink of its own, sampling its memory."""

    def __init__(self, home: Path, runs: Path) -> None:
        super().__init__(home, runs, project=ROOT)
        self.runs = runs
        self.marker = f"FLWR_HOME={home}".encode()

    def run(
        self,
        run_config: dict[str, Any],
        supernodes: int,
        timeout: float,
        interval: float,
        log_path: Path,
    ) -> FlowerRun:
        """Run one experiment and measure it; the SuperLink is stopped afterwards."""
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())
        cmd = [
            str(BIN / "flwr"),
            "run",
            ".",
            "--stream",
            "--run-config",
            overrides,
            "--federation-config",
            f"num-supernodes={supernodes} client-resources-num-cpus=1",
        ]
        since = time.time()
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True
            )
            sampler = MemorySampler(proc.pid, self.http_port, self.marker, since, interval)
            sampler.start()
            try:
                exit_code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                exit_code = proc.wait()
                log.write(f"\n[benchmark] flwr run killed after {timeout:.0f} s\n")
            wall = time.perf_counter() - t0
            sampler.stop()
        output = log_path.read_text(errors="replace")
        match = re.search(r"Successfully started run (\d+)", output)
        run_id = int(match.group(1)) if match else None
        status, details = self.status(run_id) if run_id is not None else ("not-started", "")
        self.stop()
        sl_log = self.home / "local-superlink" / "superlink.log"
        folder = self.runs / str(run_config["run-name"])
        result = FlowerRun(
            supernodes=supernodes,
            command=cmd,
            run_id=run_id,
            status=status,
            details=details,
            wall_time=wall,
            exit_code=exit_code,
            peak_rss=sampler.peak_rss,
            peak_pss=sampler.peak_pss,
            peak_procs=sampler.peak_procs,
            samples=sampler.samples,
            processes=sampler.seen,
            at_peak=sampler.at_peak,
            other_ray=sampler.other_ray,
            folder=folder,
            log_tail="\n".join(output.splitlines()[-40:]),
            superlink_log_tail="\n".join(
                sl_log.read_text(errors="replace").splitlines()[-40:] if sl_log.exists() else []
            ),
        )
        if (folder / "config.json").exists():  # the run started: read what it wrote
            run = read_run(folder)
            result.summary, result.rounds = run.summary, run.rows
        return result

    def status(self, run_id: int, attempts: int = 20) -> tuple[str, str]:
        """Return ``(status, status-details)`` of ``run_id`` from ``flwr ls --format json``."""
        status, details = "unknown", ""
        for _ in range(attempts):
            proc = subprocess.run(
                [str(BIN / "flwr"), "ls", "--format", "json"],
                cwd=ROOT,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            try:
                data = json.loads(proc.stdout[proc.stdout.index("{") :])
            except ValueError:
                details = proc.stdout + proc.stderr
                time.sleep(1.0)
                continue
            for run in data.get("runs", []):
                if int(run.get("run-id", -1)) == run_id:
                    status = str(run.get("status"))
                    details = str(run.get("status-details", ""))
            if status.startswith("finished"):
                break
            time.sleep(1.0)
        return status, details

    def stop(self) -> None:
        """Stop the SuperLink of this instance and any leftover process of its runs."""
        pids = superlink_pids(self.http_port)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and superlink_pids(self.http_port):
            time.sleep(0.2)
        for pid in superlink_pids(self.http_port):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # superexec / flwr-simulation / Ray processes carry this run's FLWR_HOME
        time.sleep(1.0)
        for p in _snapshot().values():
            if _environ_has(p.pid, self.marker):
                try:
                    os.kill(p.pid, signal.SIGKILL)
                    print(f"  killed leftover pid {p.pid}: {p.cmdline[:100]}", flush=True)
                except ProcessLookupError:
                    pass


# ---------------------------------------------------------------------------- direct runs
DIRECT_CODE = """
import json, resource, sys, time
t0 = time.perf_counter()
from flower_app.config import AppConfig
from direct import run_direct
cfg = AppConfig.from_run_config(json.loads(sys.argv[1]))
t1 = time.perf_counter()
summary = run_direct(cfg)
t2 = time.perf_counter()
print("BENCH-RESULT " + json.dumps({
    "import-time": t1 - t0,
    "run-time": t2 - t1,
    "maxrss-bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "summary": summary,
}))
"""


def run_direct_subprocess(run_config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run the direct engine in a fresh interpreter; return its timings, peak RSS, summary."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", DIRECT_CODE, json.dumps(run_config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - t0
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH-RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"direct run failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    out = json.loads(line[len("BENCH-RESULT ") :])
    out["wall-time"] = wall
    return out


# ---------------------------------------------------------------------------- reporting
def _round_stats(rounds: list[dict[str, Any]]) -> dict[str, float | None]:
    """Return mean round time of rounds 2..k and the discovery time before round 1."""
    times = [float(r["round-time"]) for r in rounds if int(r["server-round"]) >= 2]
    first = next((r for r in rounds if int(r["server-round"]) == 1), None)
    nodes = [int(r["nodes"]) for r in rounds if int(r["server-round"]) >= 2 and "nodes" in r]
    return {
        "nodes-per-round-mean": sum(nodes) / len(nodes) if nodes else None,
        "round-time-mean-2..k": sum(times) / len(times) if times else None,
        "round-1-time": float(first["round-time"]) if first else None,
        "discovery-time": (
            float(first["wall-time"]) - float(first["round-time"])
            if first and "round-time" in first
            else None
        ),
    }


def _direct_round_time(rounds: list[dict[str, Any]]) -> float | None:
    """Mean of the direct engine's per-round times, rounds 2..k (from wall-time diffs)."""
    walls = [float(r["wall-time"]) for r in rounds]
    diffs = [b - a for a, b in zip(walls, walls[1:], strict=False)]
    return sum(diffs) / len(diffs) if diffs else None


def _mib(n: int | float | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def machine() -> dict[str, Any]:
    """Describe the machine the benchmark ran on."""
    mem = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    try:
        from importlib.metadata import version

        versions = {p: version(p) for p in ("flwr", "ray", "numpy", "scipy")}
    except Exception:  # noqa: BLE001
        versions = {}
    return {
        "cpus": os.cpu_count(),
        "cpu-model": cpu,
        "memory-gib": round(mem / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "nice": os.nice(0),
        **versions,
    }


CSV_FIELDS = [
    "engine",
    "supernodes",
    "status",
    "selected",
    "same-as-direct",
    "objective",
    "ratio-to-greedy",
    "wall-time-s",
    "discovery-time-s",
    "round-1-time-s",
    "round-time-mean-2..k-s",
    "nodes-per-round",
    "peak-rss-mib",
    "peak-pss-mib",
    "wall-time-ratio-to-direct",
    "peak-rss-ratio-to-direct",
]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 if every Flower run completed and matched the direct run."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--algorithm",
        default="fedsm",
        help="any submodular family's algorithm: fedsm (default), fedcg, fedcg-plus, "
        "fed-discrete-greedy",
    )
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra run_config entries, e.g. fedcg-rounds=20 (values parsed as TOML)",
    )
    ap.add_argument("--dataset", default="movielens")
    ap.add_argument("--data-dir", default="/work/data")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--clients", type=float, default=0.1, help="K: fraction (<=1) or count")
    ap.add_argument("--elements", type=float, default=0.1, help="d: fraction (<=1) or count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--supernodes", type=int, nargs="+", default=[2, 16, 6040])
    ap.add_argument("--timeout", type=float, default=1800.0, help="round/discovery timeout (s)")
    ap.add_argument("--run-timeout", type=float, default=3 * 3600.0, help="per flwr run (s)")
    ap.add_argument("--interval", type=float, default=0.5, help="memory sampling period (s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--keep-runs", action="store_true", help="keep run folders and FLWR_HOMEs (temp dir)"
    )
    args = ap.parse_args(argv)

    def count(x: float) -> int | float:
        return int(x) if x > 1 else float(x)

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fedsm-bench-"))
    runs_dir = work / "runs"
    base = {
        "algorithm": args.algorithm,
        "dataset": args.dataset,
        "data-dir": str(Path(args.data_dir).resolve()) if args.data_dir else "",
        "seed": args.seed,
        "k": args.k,
        "clients-per-round": count(args.clients),
        "elements-per-client": count(args.elements),
        "output-dir": str(runs_dir),
        **({"fedsm-history-clamp": "off"} if args.algorithm == "fedsm" else {}),  # the paper's
        **_extra(args.set),
    }
    print(f"work dir: {work}", flush=True)

    # direct engine first: the reference every Flower run is compared with
    print("direct engine ...", flush=True)
    direct = run_direct_subprocess({**base, "run-name": "direct"}, timeout=args.run_timeout)
    dsum = direct["summary"]
    drounds = read_rows(runs_dir / "direct")
    print(
        f"  {direct['wall-time']:.2f} s, peak RSS {_mib(direct['maxrss-bytes'])} MiB, "
        f"S = {dsum['selected']}, ratio {dsum['ratio-to-greedy']:.4f}",
        flush=True,
    )
    rows: list[dict[str, Any]] = [
        {
            "engine": "direct",
            "supernodes": None,
            "status": "completed",
            "selected": dsum["selected"],
            "same-as-direct": True,
            "objective": dsum["objective"],
            "ratio-to-greedy": dsum["ratio-to-greedy"],
            "wall-time-s": direct["wall-time"],
            "discovery-time-s": None,
            "round-1-time-s": float(drounds[0]["wall-time"]) if drounds else None,
            "round-time-mean-2..k-s": _direct_round_time(drounds),
            "peak-rss-mib": _mib(direct["maxrss-bytes"]),
            "peak-pss-mib": None,
            "wall-time-ratio-to-direct": 1.0,
            "peak-rss-ratio-to-direct": 1.0,
            "direct-import-time-s": direct["import-time"],
            "direct-run-time-s": direct["run-time"],
            "summary-wall-time-s": dsum["wall-time"],
        }
    ]

    ok = True
    flower_details: list[dict[str, Any]] = []
    for n in args.supernodes:
        home = work / f"flwr-home-{n}"
        home.mkdir()
        runner = LocalFlower(home, runs_dir)
        name = f"flower-{n}"
        cfg = {
            **base,
            "run-name": name,
            "round-timeout": float(args.timeout),
        }
        if _accepts_key("discovery-timeout"):
            cfg["discovery-timeout"] = float(args.timeout)
        print(
            f"flwr run with {n} SuperNodes (SuperLink ports {runner.http_port}/"
            f"{runner.control_port}) ...",
            flush=True,
        )
        load_before = list(os.getloadavg())
        try:
            run = runner.run(cfg, n, args.run_timeout, args.interval, work / f"flwr-run-{n}.log")
        finally:
            runner.stop()
        stats = _round_stats(run.rounds)
        summary = run.summary or {}
        selected = summary.get("selected")
        same = selected == dsum["selected"] if selected is not None else None
        completed = run.status == "finished:completed"
        ok = ok and completed and bool(same)
        print(
            f"  status {run.status} {run.details}; wall {run.wall_time:.1f} s; "
            f"peak RSS {_mib(run.peak_rss)} MiB over {run.peak_procs} processes; "
            f"S = {selected} (same as direct: {same}); {stats}",
            flush=True,
        )
        rows.append(
            {
                "engine": "flower",
                "supernodes": n,
                "status": run.status,
                "selected": selected,
                "same-as-direct": same,
                "objective": summary.get("objective"),
                "ratio-to-greedy": summary.get("ratio-to-greedy"),
                "wall-time-s": run.wall_time,
                "discovery-time-s": stats["discovery-time"],
                "round-1-time-s": stats["round-1-time"],
                "round-time-mean-2..k-s": stats["round-time-mean-2..k"],
                "nodes-per-round": stats["nodes-per-round-mean"],
                "peak-rss-mib": _mib(run.peak_rss),
                "peak-pss-mib": _mib(run.peak_pss),
                "wall-time-ratio-to-direct": _ratio(run.wall_time, direct["wall-time"]),
                "peak-rss-ratio-to-direct": _ratio(run.peak_rss, direct["maxrss-bytes"]),
                "summary-wall-time-s": summary.get("wall-time"),
            }
        )
        flower_details.append(
            {
                "supernodes": n,
                "run-id": run.run_id,
                "command": run.command,
                "status": run.status,
                "status-details": run.details,
                "exit-code": run.exit_code,
                "memory-samples": run.samples,
                "processes-at-peak": run.peak_procs,
                "processes-measured": run.processes,
                "rss-mib-by-process-at-peak": run.at_peak,
                "loadavg-before": load_before,
                "loadavg-after": list(os.getloadavg()),
                "other-ray-processes-not-counted": run.other_ray,
                "rounds": run.rounds,
                "log-tail": run.log_tail if not completed else "",
                "superlink-log-tail": run.superlink_log_tail if not completed else "",
            }
        )
        _write(args.out, base, rows, flower_details, direct, drounds, argv)

    _write(args.out, base, rows, flower_details, direct, drounds, argv)
    if args.keep_runs or not ok:
        print(f"run folders, FLWR_HOMEs and flwr logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def _extra(items: list[str]) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` run_config entries (VALUE as a TOML value, else a string)."""
    import tomllib

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set takes KEY=VALUE, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = text
    return out


def _accepts_key(key: str) -> bool:
    """Return whether ``key`` exists in ``[tool.flwr.app.config]`` (flwr rejects others)."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return key in data["tool"]["flwr"]["app"]["config"]


def _write(
    out: Path,
    base: dict[str, Any],
    rows: list[dict[str, Any]],
    flower: list[dict[str, Any]],
    direct: dict[str, Any],
    drounds: list[dict[str, Any]],
    argv: list[str] | None,
) -> None:
    """Write results.json and results.csv (called after every run, so partial runs survive)."""
    cfg = {k: v for k, v in base.items() if k != "output-dir"}
    doc = {
        "benchmark": "fedsm-flower-vs-direct",
        "command": " ".join(
            ["python", "benchmarks/fedsm_flower_vs_direct.py", *(argv or sys.argv[1:])]
        ),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "config": cfg,
        "greedy": {
            "objective": direct["summary"]["greedy-objective"],
            "selected": direct["summary"]["greedy-selected"],
        },
        "rows": rows,
        "direct": {
            "wall-time-s": direct["wall-time"],
            "import-time-s": direct["import-time"],
            "run-time-s": direct["run-time"],
            "maxrss-bytes": direct["maxrss-bytes"],
            "rounds": drounds,
        },
        "flower": flower,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({**row, "selected": " ".join(map(str, row["selected"] or []))})


if __name__ == "__main__":
    sys.exit(main())
