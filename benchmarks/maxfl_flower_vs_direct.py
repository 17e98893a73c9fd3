"""MaxFL through Flower's simulation engine beside the direct engine: time per round.

For K = 5 and K = 50 sampled clients per round, runs the same MaxFL configuration (Fashion-
MNIST, 100 seen + 100 unseen clients, one client per SuperNode, every sampled client takes
part, evaluation only at rounds 0 and T) with ``flwr run . --stream`` (a SuperLink of its own,
via ``LocalFlower`` of ``fedsm_flower_vs_direct.py``) and on the direct engine in this
process, and records the mean time of rounds 2..T−1 (round 1 carries Ray's start-up, round T
the evaluation), the ratio, and whether both engines ended with the same model. Results go to
``results.json`` / ``results.md`` in ``--out``. Run it niced on a shared machine::

    nice -n 10 python benchmarks/maxfl_flower_vs_direct.py --data-dir /work/data
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from direct import run_direct
from flower_app.config import AppConfig
from flower_app.results import read_rows

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "fvd", ROOT / "benchmarks" / "fedsm_flower_vs_direct.py"
)
fvd = importlib.util.module_from_spec(_spec)
sys.modules["fvd"] = fvd  # its dataclasses look their module up
_spec.loader.exec_module(fvd)


def _round_times(rows: list[dict]) -> list[float]:
    t = [r["round-time"] for r in rows if r.get("server-round", 0) >= 2 and "seen-acc" not in r]
    return t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="")
    p.add_argument("--clients", nargs="+", type=int, default=[5, 50])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "maxfl" / "flower-vs-direct"
    )
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for k in args.clients:
        run_config = {
            "algorithm": "maxfl",
            "dataset": "fmnist",
            "data-dir": args.data_dir,
            "num-users": 100,
            "clients-per-round": k,
            "maxfl-rounds": args.rounds,
            "maxfl-eval-every": 10_000,
            "maxfl-participation": "all",
            "seed": 0,
        }
        tmp = Path(tempfile.mkdtemp(prefix="maxfl-bench-"))
        flower = fvd.LocalFlower(tmp / "home", tmp / "runs")
        try:
            t0 = time.perf_counter()
            run = flower.run(
                {**run_config, "output-dir": str(tmp / "runs"), "run-name": f"flower-K{k}"},
                supernodes=200,
                timeout=3600,
                interval=0.5,
                log_path=args.out / f"flower-K{k}.log",
            )
            flower_wall = time.perf_counter() - t0
        finally:
            flower.stop()
        rows_f = read_rows(run.folder)
        summary_f = json.loads((run.folder / "summary.json").read_text())
        t0 = time.perf_counter()
        cfg = AppConfig.from_run_config(
            {**run_config, "output-dir": str(tmp / "runs"), "run-name": f"direct-K{k}"}
        )
        summary_d = run_direct(cfg)
        direct_wall = time.perf_counter() - t0
        rows_d = read_rows(tmp / "runs" / f"direct-K{k}")
        # the same direct run with the request's clients trained together (stacked MLPs)
        t0 = time.perf_counter()
        cfg_b = AppConfig.from_run_config(
            {**run_config, "maxfl-batched-clients": True, "output-dir": str(tmp / "runs"),
             "run-name": f"direct-batched-K{k}"}
        )  # fmt: skip
        summary_b = run_direct(cfg_b)
        batched_wall = time.perf_counter() - t0
        rows_b = read_rows(tmp / "runs" / f"direct-batched-K{k}")
        tf, td = statistics.mean(_round_times(rows_f)), statistics.mean(_round_times(rows_d))
        tb = statistics.mean(_round_times(rows_b))
        results.append(
            {
                "clients-per-round": k,
                "supernodes": 200,
                "status": run.status,
                "flower-round-s": tf,
                "direct-round-s": td,
                "ratio": tf / td,
                "direct-batched-round-s": tb,
                "ratio-batched": tf / tb,
                "direct-batched-wall-s": batched_wall,
                "batched-final-seen-loss-rel-diff": abs(
                    summary_b["final"]["seen-loss"] / summary_d["final"]["seen-loss"] - 1
                ),
                "flower-round0-s": rows_f[0]["wall-time"],
                "direct-round0-s": rows_d[0]["wall-time"],
                "flower-wall-s": flower_wall,
                "direct-wall-s": direct_wall,
                "flower-peak-rss-mb": run.peak_rss / 2**20,
                "same-model": summary_f["model-digest"] == summary_d["model-digest"],
            }
        )
        print(json.dumps(results[-1]), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    lines = [
        "| K | Flower s/round | direct s/round | ratio | direct batched s/round | ratio "
        "| Flower wall s | direct wall s | same model |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['clients-per-round']} | {r['flower-round-s']:.3f} | {r['direct-round-s']:.3f} | "
            f"{r['ratio']:.1f} | {r['direct-batched-round-s']:.3f} | {r['ratio-batched']:.1f} "
            f"| {r['flower-wall-s']:.1f} | {r['direct-wall-s']:.1f} | {r['same-model']} |"
        )
    (args.out / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
