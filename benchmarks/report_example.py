"""Regenerate docs/figures/report-example/: `flower-app report` on FedSM + FedCG + a resumed run.

Three small runs on the embedded synthetic facility-location instance (2,000 users, 500
elements): FedSM Algorithm 1 and FedCG on the direct engine, and FedSM under `flwr run`
(Flower's simulation engine, a private local SuperLink) whose SuperLink and ServerApp are
SIGKILLed once round 3 is written, then resumed with `resume=true` on a fresh SuperLink.
The report (report.md, quality.png, bytes.png, participants.png) goes to
docs/figures/report-example/; the run folders to a temporary folder (or --runs).

    python benchmarks/report_example.py            # about two minutes
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path

from direct import run_direct
from flower_app.cli.report import write_report
from flower_app.config import AppConfig
from flower_app.results import read_rows
from flower_app.simulation import LocalSimulation, superlink_pids
from rehearsal.processes import kill_tree

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures" / "report-example"
K = 20
RUNS = {
    "fedsm-direct": {"algorithm": "fedsm", "k": K, "seed": 0},
    "fedcg-direct": {"algorithm": "fedcg", "k": K, "fedcg-rounds": 20, "seed": 0},
}
RESUMED = {"algorithm": "fedsm", "k": K, "seed": 1, "run-name": "fedsm-flower-resumed"}


def _rounds(folder: Path) -> int:
    return max((int(r["server-round"]) for r in read_rows(folder) if "server-round" in r),
               default=0)  # fmt: skip


def _kill_superlink(sim: LocalSimulation) -> None:
    """SIGKILL the SuperLink this object started and every process under it."""
    for root in superlink_pids(sim.http_port):
        kill_tree(root)


def resumed_run(work: Path, after: int = 3) -> Path:
    """Run RESUMED with flwr run, kill its SuperLink after round ``after``, resume it."""
    runs = work / "runs"
    folder = runs / RESUMED["run-name"]
    first = LocalSimulation(work / "home-1", runs)

    def run_first() -> None:
        with contextlib.suppress(Exception):  # killed on purpose
            first.run(RESUMED, timeout=600)

    worker = threading.Thread(target=run_first, daemon=True)
    worker.start()
    deadline = time.monotonic() + 600
    while _rounds(folder) < after:
        if time.monotonic() > deadline or not worker.is_alive():
            raise RuntimeError(f"round {after} was never written to {folder}")
        time.sleep(0.05)
    _kill_superlink(first)
    worker.join(timeout=120)
    first.stop()
    print(f"killed after round {_rounds(folder)} of {K}", flush=True)
    second = LocalSimulation(work / "home-2", runs)
    try:
        run = second.run({**RESUMED, "resume": True}, timeout=600)
    finally:
        second.stop()
    if run.status != "finished:completed":
        raise RuntimeError(f"resumed run ended {run.status}: {run.details}\n{run.output[-3000:]}")
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="", help="keep the run folders here (default: temp)")
    parser.add_argument("--out", default=str(OUT), help=f"report folder (default: {OUT})")
    args = parser.parse_args()
    work = Path(args.runs) if args.runs else Path(tempfile.mkdtemp(prefix="report-example-"))
    folders = []
    for name, cfg in RUNS.items():
        run_direct(AppConfig.from_run_config(
            {**cfg, "output-dir": str(work / "runs"), "run-name": name}
        ))  # fmt: skip
        folders.append(work / "runs" / name)
    folders.append(resumed_run(work))
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    report = write_report(folders, out)
    print(report.read_text())
    if not args.runs:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
