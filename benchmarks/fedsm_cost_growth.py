"""How the direct engine grows with the number of users: round time and peak memory.

FedSM Algorithm 1 (K = 10 %, d = 1 %, k = ``--rounds``) with ``fedsm-rng = "per-user"`` and
``"batched"``, and FedCG (Algorithm 1, K = 10 % of the users per round, the sampled gradient
of Appendix C.3 with m = 10 sets, k = 10, ``--rounds`` rounds, greedy rounding) on
``synthetic-dblp`` stand-ins of 1,000, 6,040, 70,000 and 704,738 researchers (2,675 venues,
the stand-in's calibration). Every (size, scheme) runs in a fresh Python subprocess, so its
peak RSS (``ru_maxrss``: imports, the instance and the run) is its own. Writes
``docs/benchmarks/fedsm-growth.json``, a Markdown table ``fedsm-growth.md`` and a log-log plot
``fedsm-growth.png`` beside it; ``--schemes fedcg`` measures only FedCG and keeps the recorded
FedSM rows.

``--flower 2 16`` measures Flower's simulation instead: for every (size, scheme) one
``benchmarks/fedsm_flower_vs_direct.py`` invocation runs the same configuration on the direct
engine (``run_direct``) and with ``flwr run`` on 2 and 16 SuperNodes, ``--flower-rounds``
rounds each; the steady-state round time is the mean over rounds 2..k of each engine's own
round records, so the Flower ÷ direct ratios come from one invocation. Writes
``fedsm-growth-flower.{json,md,png}``. Shared machine: one run, times not repeated::

    nice -n 10 python benchmarks/fedsm_cost_growth.py
    nice -n 10 python benchmarks/fedsm_cost_growth.py --flower 2 16   # ~20 min
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
SIZES = (1_000, 6_040, 70_000, 704_738)
SCHEMES = ("per-user", "batched", "fedcg")
LABELS = {"per-user": "FedSM, per-user streams", "batched": "FedSM, batched draws",
          "fedcg": "FedCG (sampled gradient, m = 10)"}  # fmt: skip

_CHILD = """
import json, resource, time, sys
import numpy as np
from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun, cohort_report
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


_CHILD_FEDCG = """
import json, resource, time, sys
import numpy as np
from direct.fedcg import run_fedcg_direct
from flower_app.algorithms.fedcg.continuous import FedCGServer, LocalSteps
from flower_app.datasets.synthetic import synthetic_dblp
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import MaxCoverage

n, rounds = int(sys.argv[1]), int(sys.argv[3])
t0 = time.perf_counter()
obj = MaxCoverage(synthetic_dblp(n_researchers=n).matrix)
load_s = time.perf_counter() - t0
rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
server = FedCGServer(n, UniformMatroid(obj.n_elements, 10), rounds=rounds, eta=0.0,
                     local=LocalSteps(1, "sampled", 10), clients_per_round=0.1, seed=0,
                     rounding="greedy")
stamps, sampled = [time.perf_counter()], []
def on_round(record, x):
    stamps.append(time.perf_counter())
    sampled.append(record.users)
selected = run_fedcg_direct(obj, server, on_round)
print(json.dumps({
    "users": n, "scheme": "fedcg", "rounds": rounds, "load-s": load_s,
    "round-s-mean": float(np.mean(np.diff(stamps))),
    "sampled-users-per-round": int(round(float(np.mean(sampled)))),
    "peak-rss-mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "rss-after-load-mb": rss_loaded,
    "objective": obj.mean_value(list(selected)),
}))
"""


def measure(n: int, scheme: str, rounds: int) -> dict[str, Any]:
    """Run one (size, scheme) in a fresh subprocess; return its JSON line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    child = _CHILD_FEDCG if scheme == "fedcg" else _CHILD
    proc = subprocess.run(
        [sys.executable, "-c", child, str(n), scheme, str(rounds)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: run_config of each scheme for benchmarks/fedsm_flower_vs_direct.py (``--set`` entries)
FLOWER_SETS = {
    "per-user": ["fedsm-rng=per-user"],
    "batched": ["fedsm-rng=batched"],
    "fedcg": ["fedcg-local-steps=1", "fedcg-gradient=sampled", "fedcg-gradient-samples=10",
              "fedcg-rounding=greedy"],
}  # fmt: skip


def measure_flower(n: int, scheme: str, rounds: int, nodes: list[int]) -> list[dict[str, Any]]:
    """Direct engine and Flower with each node count, one invocation; one row per engine."""
    algorithm = "fedcg" if scheme == "fedcg" else "fedsm"
    sets = [f"num-users={n}", *FLOWER_SETS[scheme]]
    if scheme == "fedcg":
        sets.append(f"fedcg-rounds={rounds}")
    with tempfile.TemporaryDirectory(prefix="growth-flower-") as out:
        cmd = [
            sys.executable, str(ROOT / "benchmarks" / "fedsm_flower_vs_direct.py"),
            "--algorithm", algorithm, "--dataset", "synthetic-dblp", "--data-dir", "",
            "--k", str(10 if scheme == "fedcg" else rounds), "--clients", "0.1",
            "--elements", "0.01", "--supernodes", *map(str, nodes), "--out", out,
            "--set", *sets,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        results = Path(out) / "results.json"
        if not results.is_file():
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
        doc = json.loads(results.read_text())
    direct = next(r for r in doc["rows"] if r["engine"] == "direct")
    sampled = int(doc["direct"]["rounds"][0]["users"])
    out_rows = []
    for r in doc["rows"]:
        out_rows.append({
            "users": n, "scheme": scheme, "engine": r["engine"], "supernodes": r["supernodes"],
            "rounds": rounds, "status": r["status"], "same-as-direct": r["same-as-direct"],
            "sampled-users-per-round": sampled,
            "round-s-mean-2..k": r["round-time-mean-2..k-s"],
            "ratio-to-direct": r["round-time-mean-2..k-s"] / direct["round-time-mean-2..k-s"],
            "wall-time-s": r["wall-time-s"], "peak-rss-mib": r["peak-rss-mib"],
            "peak-pss-mib": r["peak-pss-mib"], "ratio-to-greedy": r["ratio-to-greedy"],
        })  # fmt: skip
    if proc.returncode != 0:
        print(f"  warning: {scheme} at {n:,} users: a Flower run failed or differed", flush=True)
    return out_rows


def flower_table(rows: list[dict[str, Any]], nodes: list[int]) -> str:
    """Markdown table: per (size, scheme), direct and Flower round times and peak memory."""
    head = (
        "| users | scheme | direct: round (s) |"
        + "".join(f" Flower {k}: round (s) | ÷ direct |" for k in nodes)
        + " direct: peak RSS (MiB) |"
        + "".join(f" Flower {k}: peak PSS (MiB) |" for k in nodes)
    )
    lines = [head, "|---:|---|" + "---:|" * (1 + 2 * len(nodes) + 1 + len(nodes))]
    by = {(r["users"], r["scheme"], r["supernodes"]): r for r in rows}
    for n in sorted({r["users"] for r in rows}):
        for scheme in SCHEMES:
            d = by.get((n, scheme, None))
            if d is None:
                continue
            cells = [f"{n:,}", LABELS[scheme], f"{d['round-s-mean-2..k']:.3f}"]
            for k in nodes:
                f = by.get((n, scheme, k))
                cells += ([f"{f['round-s-mean-2..k']:.3f}", f"{f['ratio-to-direct']:.1f}x"]
                          if f else ["–", "–"])  # fmt: skip
            cells.append(f"{d['peak-rss-mib']:.0f}")
            for k in nodes:
                f = by.get((n, scheme, k))
                cells.append(f"{f['peak-pss-mib']:.0f}" if f else "–")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def flower_plot(rows: list[dict[str, Any]], nodes: list[int], path: Path) -> None:
    """One log-log panel per scheme: round time against users, direct and Flower."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schemes = [s for s in SCHEMES if any(r["scheme"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(schemes), figsize=(4.2 * len(schemes), 3.6), squeeze=False)
    for ax, scheme in zip(axes[0], schemes, strict=True):
        for engine, marker in zip([None, *nodes], "os^v", strict=False):
            pts = sorted((r["users"], r["round-s-mean-2..k"]) for r in rows
                         if r["scheme"] == scheme and r["supernodes"] == engine)  # fmt: skip
            label = "direct" if engine is None else f"Flower, {engine} SuperNodes"
            ax.loglog(*zip(*pts, strict=True), marker=marker, label=label)
        ax.axhline(0.1, ls=":", color="grey", label="Flower's 0.1 s message poll")
        ax.set(xlabel="users n", ylabel="seconds per round (rounds 2..k)", title=LABELS[scheme])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Flower's simulation beside the direct engine, synthetic-dblp stand-ins")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table: one line per size, both schemes side by side."""
    by = {(r["users"], r["scheme"]): r for r in rows}
    lines = [
        "| users | sampled / round | FedSM per-user: round (s) | FedSM batched: round (s) | "
        "ratio | FedCG: round (s) | per-user: peak RSS (MB) | batched: peak RSS (MB) | "
        "FedCG: peak RSS (MB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(r: dict[str, Any] | None, key: str, fmt: str) -> str:
        return format(r[key], fmt) if r else "–"

    for n in sorted({r["users"] for r in rows}):
        pu, ba, cg = (by.get((n, s)) for s in SCHEMES)
        sampled = next(r for r in (pu, ba, cg) if r)["sampled-users-per-round"]
        ratio = f"{pu['round-s-mean'] / ba['round-s-mean']:.1f}x" if pu and ba else "–"
        lines.append(
            f"| {n:,} | {sampled:,} | {cell(pu, 'round-s-mean', '.3f')} | "
            f"{cell(ba, 'round-s-mean', '.3f')} | {ratio} | {cell(cg, 'round-s-mean', '.3f')} | "
            f"{cell(pu, 'peak-rss-mb', '.0f')} | {cell(ba, 'peak-rss-mb', '.0f')} | "
            f"{cell(cg, 'peak-rss-mb', '.0f')} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Log-log plot of round time and peak RSS against users."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for scheme, marker in zip(SCHEMES, "os^", strict=True):
        pts = sorted((r["users"], r) for r in rows if r["scheme"] == scheme)
        xs = [n for n, _ in pts]
        ax1.loglog(xs, [r["round-s-mean"] for _, r in pts], marker=marker, label=LABELS[scheme])
        ax2.loglog(xs, [r["peak-rss-mb"] for _, r in pts], marker=marker, label=LABELS[scheme])
    ax1.set(xlabel="users n", ylabel="seconds per round", title="round time (K = 10 %)")
    ax2.set(xlabel="users n", ylabel="peak RSS (MB)", title="peak memory (process)")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("FedSM Alg. 1 and FedCG, direct engine, synthetic-dblp stand-ins (2,675 venues)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    """Measure every (size, scheme), write JSON, table and plot."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--flower",
        type=int,
        nargs="+",
        metavar="SUPERNODES",
        help="measure Flower's simulation with these SuperNode counts instead",
    )
    ap.add_argument("--flower-rounds", type=int, default=10)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    if args.flower:
        return main_flower(args, load0)
    recorded = args.out / "fedsm-growth.json"
    rows = []
    if recorded.is_file():  # keep the recorded rows of the schemes not measured now
        rows = [r for r in json.loads(recorded.read_text())["rows"]
                if r["scheme"] not in args.schemes]  # fmt: skip
    for n in args.sizes:
        for scheme in args.schemes:
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


def main_flower(args: argparse.Namespace, load0: float) -> int:
    """Flower rows: every (size, scheme) with ``args.flower`` SuperNode counts."""
    rows: list[dict[str, Any]] = []
    for n in args.sizes:
        for scheme in args.schemes:
            print(f"{scheme} at {n:,} users ...", flush=True)
            rows += measure_flower(n, scheme, args.flower_rounds, args.flower)
            for r in rows[-1 - len(args.flower) :]:
                print(f"  {r['engine']} {r['supernodes']}: {r['round-s-mean-2..k']:.4f} s/round "
                      f"({r['ratio-to-direct']:.2f}x), same as direct: {r['same-as-direct']}",
                      flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "note": "shared machine (2 cores); one run, times not repeated; each (size, scheme) "
        "is one invocation of benchmarks/fedsm_flower_vs_direct.py",
        "command": "python benchmarks/fedsm_cost_growth.py " + " ".join(sys.argv[1:]),
        "loadavg-before-after": [load0, os.getloadavg()[0]],
        "rows": rows,
    }
    (args.out / "fedsm-growth-flower.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "fedsm-growth-flower.md").write_text(flower_table(rows, args.flower))
    flower_plot(rows, args.flower, args.out / "fedsm-growth-flower.png")
    print(flower_table(rows, args.flower))
    return 0 if all(r["same-as-direct"] and r["status"] in ("completed", "finished:completed")
                    for r in rows) else 1  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
