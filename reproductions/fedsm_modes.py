"""Reproductions of FedSM Algorithm 2 and of the amplification (Algorithm 3).

Subcommands (``run_sim.py fedsm-modes``)::

    python run_sim.py fedsm-modes alg2-curve --dataset movielens --data-dir /work/data \\
        --k 200 --settings 1.0:200 --seeds 0 1 2 --out benchmarks/results/fedsm-alg2
    python run_sim.py fedsm-modes amplification --dataset movielens \\
        --data-dir /work/data --k 20 --clients 0.01 --elements 0.1 --eta 0.1 --seeds 0 1 2 \\
        --out benchmarks/results/fedsm-amplification/movielens
    python run_sim.py fedsm-modes report --out benchmarks/results/fedsm-alg2

``alg2-curve`` runs Algorithm 2 (``fedsm-mode = alg2``) for every K:d setting, variant and
seed, and writes ``curve.csv`` (one row per communication round: |S|, F(S), centralized
greedy's F after as many elements as rounds, communication), ``runs.csv`` (one row per run:
rounds, |S|, ratio to greedy at the same |S| and at k, whether the curve lies above greedy's
for the first 100 rounds), ``by-k.csv`` (F after each of the first j elements added),
``alg2-objective.png`` (objective against communication rounds, the paper's Figures 3 left
and 7), ``alg2-size.png`` (|S| against rounds, Figures 3 right, 8 and 9) and
``alg2-by-k.png`` (objective against k, ratio to greedy). ``amplification`` runs, on the
same instance and seeds, plain Algorithm 1 with the per-round budget (K, d), plain
Algorithm 1 with the amplification's *total* budget (K/η users per round, and d/η elements
per user), and Algorithm 3 with Algorithm 1 inside (1/η steps, pipage and greedy
rounding), and writes ``amplification.csv`` and
``amplification.md``. ``report`` redoes the figures and tables from the CSVs.

Every run goes through :func:`direct.run_direct` (the direct engine, the same
math the Flower strategy runs; ``tests/test_fedsm_modes_flower.py`` checks both engines agree)
and keeps its run folder under ``<out>/runs/``. Each run appends its rows as it finishes; a
second call into the same ``--out`` runs only the (variant, setting, seed) or (method, seed)
not yet in ``runs.csv`` / ``amplification.csv`` (:mod:`reproductions.sweep`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flower_app.results import read_rows
from flower_app.settings import help_text
from reproductions.sweep import (
    Run,
    Sweep,
    add_dataset,
    add_seeds,
    add_sizes,
    append_csv,
    csv_keys,
    data_overrides,
    figure,
    label_slug,
    markdown_table,
    run_command,
    runnable_datasets,
)

__all__ = ["ALG2_VARIANTS", "DATASETS_RUN", "build_parser", "main"]

#: Algorithm 2 variants: name -> run_config (see flower_app/runners/fedsm.py)
ALG2_VARIANTS: dict[str, dict[str, Any]] = {
    "j from 1, no level cap": {"fedsm-j-from": 1, "fedsm-levels": -1},
    "j from 1, paper's levels": {"fedsm-j-from": 1, "fedsm-levels": 0},
    "j from 0, no level cap": {"fedsm-j-from": 0, "fedsm-levels": -1},
    "j from 0, paper's levels": {"fedsm-j-from": 0, "fedsm-levels": 0},
}

CURVE_COLUMNS = [
    "dataset", "variant", "setting", "clients-per-round", "elements-per-client", "seed",
    "round", "set-size", "objective", "greedy-same-rounds", "greedy-same-size", "tau",
    "j-star", "pool-before", "pool-after", "user-values", "values-up", "bytes-up",
    "values-down", "bytes-down",
]  # fmt: skip
RUN_COLUMNS = [
    "dataset", "variant", "setting", "clients-per-round", "elements-per-client", "seed", "k",
    "rounds", "set-size", "objective", "greedy-same-size", "ratio-same-size", "greedy-k",
    "ratio-k", "rounds-to-k", "above-greedy-first-100", "first-round-below-greedy",
    "user-values", "bytes-up", "bytes-down", "wall-time", "run-folder",
]  # fmt: skip
BY_K_COLUMNS = [
    "dataset", "variant", "setting", "clients-per-round", "elements-per-client", "seed", "j",
    "objective", "greedy",
]  # fmt: skip
AMP_COLUMNS = [
    "dataset", "method", "k", "clients-per-round", "elements-per-client", "eta", "seed",
    "objective", "fractional-objective", "greedy", "ratio", "rounds", "user-values",
    "bytes-up", "wall-time", "run-folder",
]  # fmt: skip


def _count(text: str) -> int | float:
    """Parse a K or d spec: "0.1" is a fraction, "200" a count."""
    return float(text) if "." in text else int(text)


def _base(args: argparse.Namespace) -> dict[str, Any]:
    base: dict[str, Any] = {"dataset": args.dataset, "k": args.k, **data_overrides(args)}
    # the paper's algorithms: Algorithm 1's estimate as it is, not the app's default clamp
    base["fedsm-history-clamp"] = "off"
    if args.matroid != "uniform":
        base["matroid"] = args.matroid
        base["partition-capacity"] = args.partition_capacity
    return base


# ----------------------------------------------------------------------------- Algorithm 2
def alg2_curve(args: argparse.Namespace) -> None:
    """Run Algorithm 2 for every setting, variant and seed; write the CSVs and figures."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sweep = Sweep(out)
    done = csv_keys(out / "runs.csv", ("variant", "setting", "seed"))
    grid = []
    for variant in args.variants:
        for setting in args.settings:
            clients, pairs = (_count(x) for x in setting.split(":"))
            for seed in args.seeds:
                if (variant, setting, str(seed)) in done:
                    continue
                config = {
                    **_base(args),
                    **ALG2_VARIANTS[variant],
                    "fedsm-mode": "alg2",
                    "fedsm-epsilon": args.epsilon,
                    "fedsm-tau": args.tau,
                    "clients-per-round": clients,
                    "elements-per-client": pairs,
                    "seed": seed,
                }
                ident = {"dataset": args.dataset, "variant": variant, "setting": setting,
                         "clients-per-round": clients, "elements-per-client": pairs,
                         "seed": seed}  # fmt: skip
                name = f"alg2-{label_slug(variant)}-K{clients}-d{pairs}-s{seed}"
                grid.append(Run(name, config, ident))
    for run, summary in sweep.execute(grid):
        ident = run.labels
        curve, row = _alg2_rows(summary, read_rows(summary["run-folder"]))
        append_csv(out / "curve.csv", CURVE_COLUMNS, [{**ident, **r} for r in curve])
        by_k = [
            {**ident, "j": j + 1, "objective": o, "greedy": g}
            for j, (o, g) in enumerate(
                zip(summary["objective-by-k"], summary["greedy-by-k"], strict=False)
            )
        ]
        append_csv(out / "by-k.csv", BY_K_COLUMNS, by_k)
        row.update(ident, **{"wall-time": summary["run-wall-time"]})
        append_csv(out / "runs.csv", RUN_COLUMNS, [row])
        print(
            f"{ident['variant']} K:d={ident['setting']} seed {ident['seed']}: "
            f"{row['rounds']} rounds, |S|={row['set-size']}, ratio "
            f"{row['ratio-same-size']:.4f} (vs greedy at k: {row['ratio-k']:.4f}), above "
            f"greedy first 100: {row['above-greedy-first-100']}",
            flush=True,
        )
    report_alg2(out)


def _alg2_rows(summary: dict, rows: list[dict]) -> tuple[list[dict], dict]:
    greedy = summary["greedy-by-k"]
    k = summary["k"]
    curve = []
    for row in rows:
        t, size = int(row["server-round"]), int(row["set-size"])
        curve.append(
            {
                "round": t,
                "set-size": size,
                "objective": row["objective"],
                "greedy-same-rounds": greedy[min(t, k) - 1],
                "greedy-same-size": greedy[size - 1] if size else 0.0,
                **{c: row.get(c) for c in CURVE_COLUMNS[11:]},
            }
        )
    first_100 = [c for c in curve if c["round"] <= 100]
    below = [c["round"] for c in first_100 if c["objective"] < c["greedy-same-rounds"]]
    size = summary["set-size"]
    reach = [c["round"] for c in curve if c["set-size"] >= k]
    run = {
        "k": k,
        "rounds": summary["communication-rounds"],
        "set-size": size,
        "objective": summary["objective"],
        "greedy-same-size": greedy[size - 1] if size else 0.0,
        "ratio-same-size": summary["objective"] / greedy[size - 1] if size else 0.0,
        "greedy-k": greedy[-1],
        "ratio-k": summary["objective"] / greedy[-1],
        "rounds-to-k": reach[0] if reach else "",
        "above-greedy-first-100": not below,
        "first-round-below-greedy": below[0] if below else "",
        "user-values": summary["user-values"],
        "bytes-up": summary["bytes-up"],
        "bytes-down": summary["bytes-down"],
        "run-folder": summary["run-folder"],
    }
    return curve, run


def report_alg2(out: Path) -> None:
    """Write ``alg2-objective.png``, ``alg2-size.png``, ``alg2-by-k.png`` and ``alg2.md``."""
    import pandas as pd

    curve, runs = pd.read_csv(out / "curve.csv"), pd.read_csv(out / "runs.csv")
    k = int(runs["k"].iloc[0])
    dataset = runs["dataset"].iloc[0]
    means = {  # (variant, setting) -> objective and |S| by round, mean over seeds
        f"Alg. 2 {variant}, K:d={setting}": sub.groupby("round")[["objective", "set-size"]].mean()
        for (variant, setting), sub in curve.groupby(["variant", "setting"], sort=False)
    }
    greedy = curve.groupby("round")["greedy-same-rounds"].first()
    greedy = greedy.reindex(range(1, k + 1)).interpolate()
    with figure(out / "alg2-objective.png", 1, 2, figsize=(12, 4.5), dpi=130) as (_, axes):
        for label, mean in means.items():
            for ax in axes:
                ax.plot(mean.index, mean["objective"], label=label, lw=1.2)
        for ax, last in zip(axes, (40, int(curve["round"].max())), strict=True):
            ax.plot(greedy.index[:last], greedy.values[:last], "k--", label="greedy")
            ax.set_xlim(0, last + 1)
            top = float(curve["objective"].max())
            ax.set_ylim(top - (1.2 if last == 40 else 0.4), top + 0.03)
            ax.set_xlabel("communication rounds (greedy: one element per round)")
            ax.set_ylabel("F(S)")
            ax.grid(alpha=0.3)
        axes[0].set_title(f"{dataset}, r = {k}: first 40 rounds (mean over seeds)")
        axes[1].set_title("full runs")
        axes[1].legend(fontsize=7, loc="lower right")
    with figure(out / "alg2-size.png", figsize=(7, 4.5), dpi=130) as (_, ax):
        for label, mean in means.items():
            ax.plot(mean.index, mean["set-size"], label=label)
        ax.axhline(k, color="grey", lw=0.8)
        ax.set_xlabel("communication rounds")
        ax.set_ylabel("|S|")
        ax.set_title(f"FedSM Alg. 2 on {dataset}: growth of S (mean over seeds)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    if (out / "by-k.csv").exists():
        _by_k_figure(pd.read_csv(out / "by-k.csv"), out / "alg2-by-k.png")
    agg = (
        runs.groupby(["variant", "setting"], sort=False)
        .agg(
            seeds=("seed", "count"),
            rounds=("rounds", "mean"),
            size=("set-size", "mean"),
            ratio_size=("ratio-same-size", "mean"),
            ratio_k=("ratio-k", "mean"),
            above=("above-greedy-first-100", "mean"),
            first_below=("first-round-below-greedy", "min"),
            mb_up=("bytes-up", "mean"),
        )
        .reset_index()
    )
    header = ["variant", "K:d", "seeds", "rounds", "final \\|S\\|",
              "F / greedy at same \\|S\\|", "F / greedy at k",
              "runs above greedy for rounds 1-100", "first round below greedy",
              "MB up"]  # fmt: skip
    lines = markdown_table(header, (
        [r["variant"], r["setting"], r["seeds"], f"{r['rounds']:.1f}", f"{r['size']:.1f}",
         f"{r['ratio_size']:.4f}", f"{r['ratio_k']:.4f}", f"{r['above']:.0%}",
         r["first_below"], f"{r['mb_up'] / 1e6:.1f}"]
        for _, r in agg.iterrows()
    ))  # fmt: skip
    (out / "alg2.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _by_k_figure(frame: Any, path: Path) -> None:
    """Plot F(S_j) / greedy F(S_j) against j, S_j the first j elements Alg. 2 added."""
    frame = frame.assign(ratio=frame["objective"] / frame["greedy"])
    with figure(path, figsize=(7, 4.5), dpi=130) as (_, ax):
        for (variant, setting), sub in frame.groupby(["variant", "setting"], sort=False):
            seeds = sub["seed"].nunique()
            counts = sub.groupby("j")["ratio"].count()
            mean = sub.groupby("j")["ratio"].mean()[counts == seeds]  # j reached by every seed
            ax.plot(mean.index, mean.values, label=f"{variant}, K:d={setting}", lw=1.2)
        ax.axhline(1.0, color="k", ls="--", lw=0.8)
        ax.set_xlabel("j: first j elements added (order of addition)")
        ax.set_ylabel("F(S_j) / greedy F(S_j)")
        ax.set_title("FedSM Alg. 2: objective against k (mean over seeds)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)


# ----------------------------------------------------------------------------- amplification
def amplification(args: argparse.Namespace) -> None:
    """Run Alg. 1 (two budgets) and Alg. 3 on the same instance and seeds; write the table."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sweep = Sweep(out)
    done = csv_keys(out / "amplification.csv", ("method", "seed"))
    steps = round(1.0 / args.eta)
    n_clients, d = _count(args.clients), _count(args.elements)

    def scaled(spec: int | float, by: int) -> int | float:
        return min(1.0, spec * by) if isinstance(spec, float) else spec * by

    methods: dict[str, dict[str, Any]] = {
        "Alg. 1 (K, d)": {"clients-per-round": n_clients, "elements-per-client": d},
        "Alg. 1 (K/η, d) - equal total budget": {
            "clients-per-round": scaled(n_clients, steps),
            "elements-per-client": d,
        },
        "Alg. 1 (K, d/η) - equal total budget": {
            "clients-per-round": n_clients,
            "elements-per-client": scaled(d, steps),
        },
    }
    for rounding in args.roundings:
        methods[f"Alg. 3 (Alg. 1 inside, K, d, η), {rounding} rounding"] = {
            "clients-per-round": n_clients,
            "elements-per-client": d,
            "fedsm-mode": "amplified",
            "fedsm-inner": "alg1",
            "fedsm-eta": args.eta,
            "fedsm-surrogate": args.surrogate,
            "fedsm-rounding": rounding,
        }
    grid = [
        Run(f"amp-{label_slug(method)}-s{seed}", {**_base(args), **override, "seed": seed},
            {"method": method, "override": override})  # fmt: skip
        for seed in args.seeds
        for method, override in methods.items()
        if (method, str(seed)) not in done
    ]
    for run, s in sweep.execute(grid):
        method, override = run.labels["method"], run.labels["override"]
        row = {
            "dataset": args.dataset,
            "method": method,
            "k": args.k,
            "clients-per-round": override["clients-per-round"],
            "elements-per-client": override["elements-per-client"],
            "eta": args.eta if "fedsm-mode" in override else "",
            "seed": run.config["seed"],
            "objective": s["objective"],
            "fractional-objective": s.get("fractional-objective", ""),
            "greedy": s["greedy-objective"],
            "ratio": s["ratio-to-greedy"],
            "rounds": s["communication-rounds"],
            "user-values": s["user-values"],
            "bytes-up": s["bytes-up"],
            "wall-time": s["run-wall-time"],
            "run-folder": s["run-folder"],
        }
        append_csv(out / "amplification.csv", AMP_COLUMNS, [row])
        print(f"{method} seed {row['seed']}: ratio {row['ratio']:.4f}", flush=True)
    report_amplification(out)


def report_amplification(out: Path) -> None:
    """Write ``amplification.md`` and ``amplification.png`` from ``amplification.csv``."""
    import pandas as pd

    frame = pd.read_csv(out / "amplification.csv")
    agg = (
        frame.groupby("method", sort=False)
        .agg(
            seeds=("seed", "count"),
            objective=("objective", "mean"),
            std=("objective", "std"),
            fractional=("fractional-objective", "mean"),
            ratio=("ratio", "mean"),
            rounds=("rounds", "mean"),
            values=("user-values", "mean"),
        )
        .reset_index()
    )
    header = ["method", "seeds", "F(S) mean ± std", "G(x) (Alg. 3, before rounding)",
              "F / greedy", "rounds", "values sent by users"]  # fmt: skip
    cells = []
    for _, r in agg.iterrows():
        frac = "" if pd.isna(r["fractional"]) else f"{r['fractional']:.5g}"
        std = 0.0 if pd.isna(r["std"]) else r["std"]
        cells.append([r["method"], r["seeds"], f"{r['objective']:.5g} ± {std:.2g}", frac,
                      f"{r['ratio']:.4f}", f"{r['rounds']:.0f}", f"{r['values']:.3g}"])  # fmt: skip
    lines = markdown_table(header, cells)
    (out / "amplification.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    with figure(out / "amplification.png", figsize=(8, 3.8), dpi=130) as (_, ax):
        spread = frame.groupby("method", sort=False)["ratio"].std()
        ax.barh(agg["method"], agg["ratio"], xerr=spread)
        lo = max(0.0, float(agg["ratio"].min()) - 0.05)
        ax.set_xlim(lo, 1.0 + 0.01)
        ax.set_xlabel("F(S) / centralized greedy (mean over seeds)")
        ax.set_title(
            f"Amplification vs Alg. 1 on {frame['dataset'].iloc[0]}, k={frame['k'].iloc[0]}"
        )
        ax.invert_yaxis()


# ----------------------------------------------------------------------------- CLI
#: datasets these reproductions run: FedSM's, but not your own files (no --data-file here)
DATASETS_RUN = runnable_datasets("fedsm")


def _common(p: argparse.ArgumentParser) -> None:
    add_dataset(p, DATASETS_RUN, "movielens")
    p.add_argument("--k", type=int, required=True, help="r: the cardinality of S (k)")
    add_seeds(p)
    add_sizes(p)
    p.add_argument(
        "--matroid", default="uniform", choices=["uniform", "partition"], help=help_text("matroid")
    )
    p.add_argument(
        "--partition-capacity", type=int, default=2, help=help_text("partition-capacity")
    )
    p.add_argument("--out", required=True, help="results folder (run folders in <out>/runs/)")


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of ``run_sim.py fedsm-modes`` (alg2-curve, amplification, report)."""
    parser = argparse.ArgumentParser(
        prog="run_sim.py fedsm-modes",
        description="Reproductions of FedSM Algorithm 2 (objective and |S| against "
        "communication rounds) and of the amplification (Algorithm 3) against Algorithm 1 "
        "at equal budget, on the direct engine.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p2 = sub.add_parser(
        "alg2-curve",
        help="Algorithm 2: objective and |S| against rounds (curve.csv, runs.csv, PNGs)",
        description="Run Algorithm 2 (fedsm-mode = alg2) for every K:d setting, variant and "
        "seed; write curve.csv, runs.csv, by-k.csv and alg2-*.png into --out.",
    )
    _common(p2)
    p2.add_argument(
        "--settings", nargs="+", default=["1.0:200"],
        help="K:d pairs (K users per round as a fraction with a dot or a count; d pairs "
        "per user), e.g. 1.0:200 0.5:100 (default: 1.0:200)",
    )  # fmt: skip
    p2.add_argument(
        "--variants", nargs="+", default=[next(iter(ALG2_VARIANTS))],
        choices=list(ALG2_VARIANTS), metavar="VARIANT",
        help="readings of the paper's levels (quote each): "
        + "; ".join(f"'{v}'" for v in ALG2_VARIANTS) + f" (default: '{next(iter(ALG2_VARIANTS))}')",
    )  # fmt: skip
    p2.add_argument("--epsilon", type=float, default=0.405, help=help_text("fedsm-epsilon"))
    p2.add_argument(
        "--tau", type=float, default=0.006,
        help=help_text("fedsm-tau") + " (default here: 0.006, the authors')",
    )  # fmt: skip
    pa = sub.add_parser(
        "amplification",
        help="Algorithm 3 against Algorithm 1 at equal budget (amplification.csv, .md, .png)",
        description="On the same instance and seeds, run Algorithm 1 with the per-round "
        "budget (K, d), Algorithm 1 with the amplification's total budget (K/eta, d/eta) and "
        "Algorithm 3 with Algorithm 1 inside (1/eta steps, each --roundings); write "
        "amplification.csv and amplification.md into --out.",
    )
    _common(pa)
    pa.add_argument(
        "--clients", default="0.01",
        help="K: users per round (fraction with a dot, else a count; default 0.01)",
    )  # fmt: skip
    pa.add_argument("--elements", default="0.1",
                    help="d: elements per user (fraction of m with a dot, else a count; "
                    "default 0.1)")  # fmt: skip
    pa.add_argument("--eta", type=float, default=0.1, help=help_text("fedsm-eta"))
    pa.add_argument("--surrogate", default="exact", choices=["exact", "sampled"],
                    help=help_text("fedsm-surrogate"))  # fmt: skip
    pa.add_argument("--roundings", nargs="+", default=["pipage", "greedy"],
                    choices=["pipage", "greedy"],
                    help=help_text("fedsm-rounding") + " (default: both)")  # fmt: skip
    pr = sub.add_parser(
        "report",
        help="redo the tables and figures from the CSVs in --out",
        description="Rewrite the Algorithm 2 and amplification tables and figures from "
        "runs.csv / amplification.csv in --out, without running anything.",
    )
    pr.add_argument("--out", required=True, help="results folder of an earlier run")
    return parser


def _command(args: argparse.Namespace) -> None:
    if args.command == "alg2-curve":
        alg2_curve(args)
    elif args.command == "amplification":
        amplification(args)
    else:
        out = Path(args.out)
        if (out / "runs.csv").exists():
            report_alg2(out)
        if (out / "amplification.csv").exists():
            report_amplification(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand (see the module docstring); return the exit status."""
    return run_command(build_parser(), _command, argv)


if __name__ == "__main__":
    raise SystemExit(main())
