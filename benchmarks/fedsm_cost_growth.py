"""How FedSM's direct engine grows with the number of users: round time and peak memory.

FedSM Algorithm 1 (K = 10 %, d = 1 %, k = ``--rounds``) on ``synthetic-dblp`` stand-ins of
1,000, 6,040, 70,000 and 704,738 researchers (2,675 venues, the stand-in's calibration), with
``fedsm-rng = "per-user"`` and ``"batched"``. Every (size, scheme) runs in a fresh Python
subprocess, so its peak RSS (``ru_maxrss``: imports, the instance and the run) is its own.
Writes ``docs/benchmarks/fedsm-growth.json``, a Markdown table ``fedsm-growth.md`` and a
log-log plot ``fedsm-growth.png`` beside it. Flower rows are not measured here (see
``benchmarks/fedsm_flower_vs_direct.py``). Shared machine: one run, times not repeated::

    nice -n 10 python benchmarks/fedsm_cost_growth.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
SIZES = (1_000, 6_040, 70_000, 704_738)
SCHEMES = ("per-user", "batched")

_CHILD = """
import json, resource, time, sys
import numpy as np
from flower_app.algorithms.fedsm_modes import FedSMParams, FedSMRun, cohort_report
from flower_app.datasets.synthetic import synthetic_dblp
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import MaxCoverage

n, scheme, k = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
obj = MaxCoverage(synthetic_dblp(n_researchers=n).matrix)
load_s = time.perf_counter() - t0
rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
params = FedSMParams("alg1", 0.1, 0.01, rng=scheme)
run = FedSMRun(obj.n_users, UniformMatroid(obj.n_elements, k), k, params, 0.0, seed=0)
times, users_step = [], []
while not run.done:
    a = time.perf_counter()
    plan = run.plan()
    b = time.perf_counter()
    total, _ = cohort_report(obj, plan.users, plan.users, plan, 0)
    c = time.perf_counter()
    run.update(total, plan.users.size)
    run.progress_value(obj)
    times.append(time.perf_counter() - a)
    users_step.append(c - b)
print(json.dumps({
    "users": n, "scheme": scheme, "rounds": k, "load-s": load_s,
    "round-s-mean": float(np.mean(times)), "users-step-s-mean": float(np.mean(users_step)),
    "sampled-users-per-round": int(plan.users.size),
    "peak-rss-mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "rss-after-load-mb": rss_loaded,
    "objective": obj.mean_value(run.selected),
}))
"""


def measure(n: int, scheme: str, rounds: int) -> dict[str, Any]:
    """Run one (size, scheme) in a fresh subprocess; return its JSON line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(n), scheme, str(rounds)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table: one line per size, both schemes side by side."""
    by = {(r["users"], r["scheme"]): r for r in rows}
    lines = [
        "| users | sampled / round | per-user: round (s) | batched: round (s) | ratio | "
        "per-user: peak RSS (MB) | batched: peak RSS (MB) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r["users"] for r in rows}):
        pu, ba = by[(n, "per-user")], by[(n, "batched")]
        lines.append(
            f"| {n:,} | {pu['sampled-users-per-round']:,} | {pu['round-s-mean']:.3f} | "
            f"{ba['round-s-mean']:.3f} | {pu['round-s-mean'] / ba['round-s-mean']:.1f}x | "
            f"{pu['peak-rss-mb']:.0f} | {ba['peak-rss-mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Log-log plot of round time and peak RSS against users."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for scheme, marker in zip(SCHEMES, "os", strict=True):
        pts = sorted((r["users"], r) for r in rows if r["scheme"] == scheme)
        xs = [n for n, _ in pts]
        ax1.loglog(xs, [r["round-s-mean"] for _, r in pts], marker=marker, label=scheme)
        ax2.loglog(xs, [r["peak-rss-mb"] for _, r in pts], marker=marker, label=scheme)
    ax1.set(xlabel="users n", ylabel="seconds per round", title="round time (K = 10 %)")
    ax2.set(xlabel="users n", ylabel="peak RSS (MB)", title="peak memory (process)")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("FedSM Alg. 1, direct engine, synthetic-dblp stand-ins (2,675 venues)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    """Measure every (size, scheme), write JSON, table and plot."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    rows = []
    for n in args.sizes:
        for scheme in SCHEMES:
            rows.append(measure(n, scheme, args.rounds))
            print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "note": "shared machine (2 cores, other jobs running); one run, times not repeated",
        "loadavg-before-after": [load0, os.getloadavg()[0]],
        "rows": rows,
    }
    (args.out / "fedsm-growth.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "fedsm-growth.md").write_text(table(rows))
    plot(rows, args.out / "fedsm-growth.png")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
