"""FedSubAvg through Flower's simulation engine beside the direct engine: time per round.

For each SuperNode count, one FedSubAvg run (K = 50 users per round by default, the paper's
MovieLens setting) goes through ``flwr run . --stream`` against a private local SuperLink
(isolated ``FLWR_HOME``, free ports; stopped by PID afterwards), with the memory of the
run's processes sampled; then, in the same invocation, the same configuration runs on the
direct engine in a fresh interpreter. The process plumbing (``LocalFlower``,
``run_direct_subprocess``) is reused from ``benchmarks/fedsm_flower_vs_direct.py``.

A Flower round here is: one ``query`` per node with sampled users (their index sets S(i)),
one ``train`` per such node (their submodel rows), aggregation, and the server-side
evaluation on 10,000 training samples and the test set (also in the direct round). Round 1
is reported apart (it includes Ray's start-up); the mean is over rounds 2..R.

Run it niced on a shared machine::

    FLOWER_APP_DATA=/work/data nice -n 10 /work/venv/bin/python \\
        benchmarks/fedsubavg_flower_vs_direct.py --supernodes 2 50 --rounds 10
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flower_app.results import read_rows

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "fedsubavg" / "flower-vs-direct"


def _fedsm_bench():
    spec = importlib.util.spec_from_file_location(
        "fedsm_flower_vs_direct", ROOT / "benchmarks" / "fedsm_flower_vs_direct.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _mean_round(rows: list[dict[str, Any]]) -> float | None:
    times = [float(r["round-time"]) for r in rows if int(r["server-round"]) >= 2]
    return sum(times) / len(times) if times else None


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write ``results.json`` / ``results.csv``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="movielens-rating")
    p.add_argument("--data-dir", default="")
    p.add_argument("--algorithm", default="fedsubavg")
    p.add_argument("--clients-per-round", type=int, default=50)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--supernodes", type=int, nargs="+", default=[2, 50])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    bench = _fedsm_bench()
    args.out.mkdir(parents=True, exist_ok=True)
    base = {
        "algorithm": args.algorithm,
        "dataset": args.dataset,
        "data-dir": args.data_dir,
        "clients-per-round": args.clients_per_round,
        "fsa-rounds": args.rounds,
        "seed": args.seed,
    }
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fsa-bench-") as tmp:
        tmp_path = Path(tmp)
        direct_cfg = {**base, "output-dir": str(tmp_path / "runs"), "run-name": "direct"}
        direct = bench.run_direct_subprocess(direct_cfg, args.timeout)
        direct_rows = read_rows(tmp_path / "runs" / "direct")
        t_direct = _mean_round(direct_rows)
        print(f"direct: {t_direct * 1e3:.1f} ms/round, {direct['wall-time']:.1f} s", flush=True)
        for n in args.supernodes:
            home = tmp_path / f"home-{n}"
            home.mkdir()
            flower = bench.LocalFlower(home, tmp_path / "runs")
            cfg = {**base, "output-dir": str(tmp_path / "runs"), "run-name": f"flower-{n}"}
            t0 = time.perf_counter()
            run = flower.run(cfg, n, args.timeout, 0.5, args.out / f"flwr-{n}.log")
            wall = time.perf_counter() - t0
            t_flower = _mean_round(run.rounds)
            agree = None
            if run.summary is not None:
                agree = bool(
                    np.allclose(
                        run.summary["train-loss-by-round"],
                        direct["summary"]["train-loss-by-round"],
                        rtol=1e-9,
                    )
                )
            first = run.rounds[0] if run.rounds else {}
            row = {
                "algorithm": args.algorithm,
                "dataset": args.dataset,
                "clients-per-round": args.clients_per_round,
                "rounds": args.rounds,
                "supernodes": n,
                "status": run.status,
                "flower-round-s-mean-2..R": t_flower,
                "flower-round-1-s": first.get("round-time"),
                "flower-setup-s": (
                    first["wall-time"] - first["round-time"] if "wall-time" in first else None
                ),
                "flower-nodes-per-round": (
                    float(np.mean([r["nodes"] for r in run.rounds])) if run.rounds else None
                ),
                "flower-wall-s": wall,
                "flower-peak-rss-mib": None if run.peak_rss is None else run.peak_rss / 2**20,
                "direct-round-s-mean-2..R": t_direct,
                "direct-wall-s": direct["wall-time"],
                "direct-peak-rss-mib": direct["maxrss-bytes"] / 2**20,
                "ratio-flower-over-direct": (
                    t_flower / t_direct if t_flower is not None and t_direct else None
                ),
                "same-train-loss-rtol-1e-9": agree,
                "bytes-down-client-mean": first.get("bytes-down-client-mean"),
                "bytes-down-client-max": first.get("bytes-down-client-max"),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    machine = bench.machine()
    (args.out / "results.json").write_text(
        json.dumps({"machine": machine, "results": results}, indent=2), encoding="utf-8"
    )
    with (args.out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(results[0]))
        w.writeheader()
        w.writerows(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
