"""FedSubAvg reproductions (Tables 2–3, Figures 3(a) and 4) on the direct engine.

``main(argv)`` runs every ``--algorithms`` × ``--clients`` (K) × ``--seeds`` ×
``--weightings`` combination for ``--rounds`` rounds (one run folder each under
``--out/runs/``; CentralSGD does not depend on the weighting and runs once per K and seed),
then writes into ``--out``:

``curves.csv``
    one row per (algorithm, weighting, K, seed, round): train loss on the fixed 10,000
    training samples, test loss, test accuracy.
``rounds.csv``
    rounds to reach the target train loss per run. The target of seed s is the minimum
    train loss of CentralSGD (K = ``--target-k``, seed s) over the horizon, as in the paper
    (Section 5.2); a run that never reaches it gets ``reached = 0`` and ``rounds = R``.
``table.md``
    the paper's Tables 2 and 3 (MovieLens rows) beside ours: mean over seeds of the rounds to
    target (``R+`` when a seed does not reach it), and FedSubAvg / FedAvg.
``fig3a_*.png``, ``fig4_*.png``
    train loss against rounds (mean over seeds; band = min..max over seeds).
``summary.json``
    the same numbers plus the feature heat dispersion and the bytes per client.

Example::

    python -m flower_app.sweeps.fedsubavg --dataset movielens-rating --data-dir /work/data \\
        --clients 50 10 30 --seeds 0 1 2 --rounds 200 --weightings clients samples \\
        --out benchmarks/results/fedsubavg
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flower_app.algorithms.fedsubavg import ALGORITHM_NAMES, WEIGHTINGS
from flower_app.config import AppConfig
from flower_app.runners.fedsubavg import direct_run
from flower_app.settings import help_text

__all__ = ["PAPER_TABLE2", "PAPER_TABLE3", "main", "rounds_to_target"]

#: MovieLens row of the paper's Table 2 (rounds to the target train loss 0.325, K = 50)
PAPER_TABLE2 = {
    "central-sgd": "180",
    "fedavg-sub": "170",
    "fedprox-sub": "170",
    "scaffold-sub": "180",
    "fedadam-sub": "170",
    "fedsubavg": "100",
}
#: MovieLens row of the paper's Table 3 (FedSubAvg's rounds to target by K)
PAPER_TABLE3 = {10: "100", 30: "110", 50: "100"}
LABELS = {
    "central-sgd": "CentralSGD",
    "fedavg-sub": "FedAvg",
    "fedprox-sub": "FedProx",
    "scaffold-sub": "Scaffold",
    "fedadam-sub": "FedAdam",
    "fedsubavg": "FedSubAvg",
}


def rounds_to_target(losses: Sequence[float], target: float) -> int | None:
    """Return the first round (1-based) whose loss is ≤ ``target``, or None.

    Parameters
    ----------
    losses : sequence of float
        Train loss after rounds 1, 2, ...
    target : float
        The target train loss.

    Returns
    -------
    int or None
        The round, or None if the loss never reaches the target.
    """
    hit = np.flatnonzero(np.asarray(losses) <= target + 1e-12)
    return int(hit[0]) + 1 if hit.size else None


def _run(args: argparse.Namespace, algorithm: str, k: int, seed: int, weighting: str) -> dict:
    name = f"{algorithm}-{weighting}-K{k}-seed{seed}"
    cfg = AppConfig.from_run_config(
        {
            "algorithm": algorithm,
            "dataset": args.dataset,
            "data-dir": args.data_dir,
            "data-seed": args.data_seed,
            "num-users": args.num_users,
            "num-elements": args.num_movies,
            "clients-per-round": k,
            "seed": seed,
            "fsa-rounds": args.rounds,
            "fsa-weighting": weighting,
            "output-dir": str(Path(args.out).resolve() / "runs"),
            "run-name": name,
        }
    )
    return direct_run(cfg, progress=args.progress)


def _fmt_rounds(values: list[int | None], horizon: int) -> str:
    if any(v is None for v in values):
        reached = [v for v in values if v is not None]
        return f"{horizon}+ ({len(reached)}/{len(values)} seeds)"
    return f"{np.mean(values):.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep and write the tables and figures (see the module docstring).

    Parameters
    ----------
    argv : sequence of str, optional
        Command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status 0.
    """
    p = argparse.ArgumentParser(prog="fedsubavg-sweep", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="movielens-rating")
    p.add_argument("--data-dir", default="")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--num-users", type=int, default=0, help=help_text("num-users"))
    p.add_argument("--num-movies", type=int, default=0, help="synthetic stand-in only")
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHM_NAMES))
    p.add_argument("--clients", nargs="+", type=int, default=[50], help="K values")
    p.add_argument(
        "--k-algorithms",
        nargs="+",
        default=["fedsubavg"],
        help="algorithms run at the K values other than --target-k (Table 3)",
    )
    p.add_argument("--target-k", type=int, default=50)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--weightings", nargs="+", default=["clients"], choices=WEIGHTINGS)
    p.add_argument("--out", default="benchmarks/results/fedsubavg")
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    runs: list[dict[str, Any]] = []
    for k in [args.target_k] + [k for k in args.clients if k != args.target_k]:
        algorithms = args.algorithms if k == args.target_k else args.k_algorithms
        if "central-sgd" not in algorithms and k == args.target_k:
            algorithms = ["central-sgd", *algorithms]
        for algorithm in algorithms:
            weightings = ["clients"] if algorithm == "central-sgd" else args.weightings
            for weighting in weightings:
                for seed in args.seeds:
                    s = _run(args, algorithm, k, seed, weighting)
                    runs.append(
                        {
                            "algorithm": algorithm,
                            "weighting": weighting,
                            "k": k,
                            "seed": seed,
                            "summary": s,
                        }
                    )
                    print(
                        f"{algorithm:13s} {weighting:8s} K={k:<4d} seed={seed} "
                        f"min loss {s['min-train-loss']:.5f}  {s['wall-time']:.1f} s",
                        flush=True,
                    )

    targets = {
        r["seed"]: r["summary"]["min-train-loss"]
        for r in runs
        if r["algorithm"] == "central-sgd" and r["k"] == args.target_k
    }
    _write_curves(out, runs)
    rows = _write_rounds(out, runs, targets, args.rounds)
    table = _table(rows, args)
    (out / "table.md").write_text(table, encoding="utf-8")
    _plots(out, runs, args)
    first = runs[0]["summary"]
    heat_keys = [
        k for k in first if "heat" in k or k.startswith(("client-", "full-model", "rows-"))
    ]
    summary = {
        "dataset": first["dataset"],
        "rounds": args.rounds,
        "seeds": args.seeds,
        "targets": {str(s): t for s, t in targets.items()},
        "rounds-to-target": rows,
        **{k: first[k] for k in heat_keys},
        "wall-time": time.perf_counter() - t0,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(table)
    return 0


def _write_curves(out: Path, runs: list[dict[str, Any]]) -> None:
    with (out / "curves.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "algorithm",
                "weighting",
                "k",
                "seed",
                "round",
                "train-loss",
                "test-loss",
                "test-accuracy",
            ]
        )
        for r in runs:
            metrics = Path(r["summary"]["run-folder"]) / "metrics.jsonl"
            for line in metrics.read_text().splitlines():
                m = json.loads(line)
                w.writerow(
                    [
                        r["algorithm"],
                        r["weighting"],
                        r["k"],
                        r["seed"],
                        m["server-round"],
                        m["train-loss"],
                        m.get("test-loss"),
                        m.get("test-accuracy"),
                    ]
                )


def _write_rounds(
    out: Path, runs: list[dict[str, Any]], targets: dict[int, float], horizon: int
) -> list[dict[str, Any]]:
    rows = []
    for r in runs:
        losses = r["summary"]["train-loss-by-round"]
        target = targets.get(r["seed"])
        hit = None if target is None else rounds_to_target(losses, target)
        rows.append(
            {
                "algorithm": r["algorithm"],
                "weighting": r["weighting"],
                "k": r["k"],
                "seed": r["seed"],
                "target": target,
                "reached": int(hit is not None),
                "rounds": hit if hit is not None else horizon,
                "min-train-loss": r["summary"]["min-train-loss"],
                "final-test-accuracy": r["summary"]["test-accuracy"],
            }
        )
    with (out / "rounds.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def _table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["algorithm"], r["weighting"], r["k"])].append(r)

    def cell(alg: str, weighting: str, k: int) -> tuple[str, float | None]:
        g = groups.get((alg, weighting, k)) or groups.get((alg, "clients", k))
        if not g:
            return "–", None
        vals = [x["rounds"] if x["reached"] else None for x in g]
        mean = None if None in vals else float(np.mean(vals))
        return _fmt_rounds(vals, args.rounds), mean

    lines = [
        f"Rounds to the target train loss (min of CentralSGD, K = {args.target_k}, per "
        f"seed), mean of seeds {args.seeds}, horizon {args.rounds} rounds.",
        "",
    ]
    order = ["central-sgd", "fedavg-sub", "fedprox-sub", "scaffold-sub", "fedadam-sub", "fedsubavg"]
    order = [a for a in order if any(r["algorithm"] == a for r in rows)]
    lines.append("| | " + " | ".join(LABELS[a] for a in order) + " | FedSubAvg / FedAvg |")
    lines.append("|---" * (len(order) + 2) + "|")
    lines.append(
        "| paper (MovieLens, Table 2) | " + " | ".join(PAPER_TABLE2[a] for a in order) + " | 0.59 |"
    )
    for weighting in args.weightings:
        cells = [cell(a, weighting, args.target_k) for a in order]
        sub, avg = (
            cell("fedsubavg", weighting, args.target_k)[1],
            cell("fedavg-sub", weighting, args.target_k)[1],
        )
        ratio = (
            f"{sub / avg:.2f}"
            if sub is not None and avg
            else (f"< {sub / args.rounds:.2f}" if sub is not None else "–")
        )
        lines.append(
            f"| ours, weighting={weighting} | " + " | ".join(c[0] for c in cells) + f" | {ratio} |"
        )
    ks = sorted({r["k"] for r in rows if r["algorithm"] == "fedsubavg"})
    if len(ks) > 1:
        lines += ["", "FedSubAvg's rounds to the same target by K (Table 3):", ""]
        lines.append("| K | " + " | ".join(str(k) for k in ks) + " |")
        lines.append("|---" * (len(ks) + 1) + "|")
        lines.append("| paper | " + " | ".join(PAPER_TABLE3.get(k, "–") for k in ks) + " |")
        for weighting in args.weightings:
            lines.append(
                f"| ours, weighting={weighting} | "
                + " | ".join(cell("fedsubavg", weighting, k)[0] for k in ks)
                + " |"
            )
    return "\n".join(lines) + "\n"


def _curves(runs: list[dict[str, Any]], alg: str, weighting: str, k: int) -> np.ndarray | None:
    c = [
        r["summary"]["train-loss-by-round"]
        for r in runs
        if r["algorithm"] == alg
        and r["k"] == k
        and (r["weighting"] == weighting or alg == "central-sgd")
    ]
    return np.array(c) if c else None


def _plots(out: Path, runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for weighting in args.weightings:
        fig, ax = plt.subplots(figsize=(6, 4))
        for alg in LABELS:
            c = _curves(runs, alg, weighting, args.target_k)
            if c is None:
                continue
            r = np.arange(1, c.shape[1] + 1)
            ax.plot(r, c.mean(axis=0), label=LABELS[alg])
            ax.fill_between(r, c.min(axis=0), c.max(axis=0), alpha=0.2)
        ax.set_xlabel("communication round")
        ax.set_ylabel("train loss (10,000 training samples)")
        ax.set_title(f"MovieLens-1M rating classification, K={args.target_k}, {weighting}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"fig3a_{weighting}_K{args.target_k}.png", dpi=120)
        plt.close(fig)
        ks = sorted({r["k"] for r in runs if r["algorithm"] == "fedsubavg"})
        if len(ks) > 1:
            fig, ax = plt.subplots(figsize=(6, 4))
            for k in ks:
                c = _curves(runs, "fedsubavg", weighting, k)
                if c is not None:
                    ax.plot(np.arange(1, c.shape[1] + 1), c.mean(axis=0), label=f"K={k}")
            ax.set_xlabel("communication round")
            ax.set_ylabel("train loss")
            ax.set_title(f"FedSubAvg by K ({weighting})")
            ax.legend()
            fig.tight_layout()
            fig.savefig(out / f"fig4_{weighting}.png", dpi=120)
            plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
