"""Reproductions of FedCG / FedCG+ / federated discrete greedy (Rafiey, ICML 2024).

Two subcommands (``run_sim.py fedcg``)::

    python run_sim.py fedcg run --preset movielens --data-dir /work/data \\
        --out benchmarks/results/fedcg --jobs 2
    python run_sim.py fedcg report --out benchmarks/results/fedcg

``run`` executes every (variant, k, seed) of a preset on the direct engine (the same code
the Flower strategy calls; a test checks both engines agree), keeps each run folder under
``<out>/runs/`` and appends one row per run to ``<out>/runs.csv`` as soon as it finishes;
rows already there are skipped, so an interrupted sweep resumes (:mod:`reproductions.sweep`).
``report`` writes ``<out>/table-<dataset>.csv`` (means and standard deviations over seeds),
``<out>/<dataset>.md`` (the same as a Markdown table) and ``<out>/<dataset>.png`` (objective
against k).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower_app.settings import help_text
from reproductions.sweep import (
    Run,
    Sweep,
    add_jobs,
    add_sizes,
    append_csv,
    csv_keys,
    data_overrides,
    figure,
    label_slug,
    markdown_table,
    run_command,
)

__all__ = ["PRESETS", "Variant", "build_parser", "main"]

COLUMNS = [
    "dataset", "variant", "algorithm", "k", "seed", "rounds", "local-steps", "gradient",
    "clients-per-round", "kappa", "objective", "greedy", "ratio", "multilinear-ratio",
    "pipage-ratio", "greedy-rounding-ratio", "mean-participants", "expected-participants",
    "n-users", "ids-sent", "wall-time",
]  # fmt: skip


@dataclass(frozen=True)
class Variant:
    """One algorithm setting of a sweep.

    Attributes
    ----------
    name : str
        Label in tables and plots.
    config : dict
        run_config overrides.
    seeds : tuple of int
        Seeds to run.
    """

    name: str
    config: dict[str, Any]
    seeds: tuple[int, ...] = (0, 1, 2)


@dataclass(frozen=True)
class Preset:
    """A dataset, its k grid and its variants.

    Attributes
    ----------
    dataset : str
        ``dataset`` run_config value.
    ks : tuple of int
        Cardinalities.
    variants : list of Variant
        Settings to run.
    base : dict
        run_config entries shared by every run.
    """

    dataset: str
    ks: tuple[int, ...]
    variants: list[Variant] = field(default_factory=list)
    base: dict[str, Any] = field(default_factory=dict)


_FULL = {"clients-per-round": 1.0}
PRESETS: dict[str, Preset] = {
    "movielens": Preset(
        "movielens",
        (3, 5, 10, 15, 20, 25),
        [
            Variant("FedCG T=100", {"algorithm": "fedcg", "fedcg-rounds": 100, **_FULL}),
            Variant(
                "FedCG+ tau=5 (20 rounds)",
                {
                    "algorithm": "fedcg-plus",
                    "fedcg-rounds": 20,
                    "fedcg-local-steps": 5,
                    "fedcg-gradient": "sampled",
                    "fedcg-gradient-samples": 10,
                    **_FULL,
                },
            ),  # fmt: skip
            Variant(
                "FedCG+ tau=1 (100 rounds)",
                {
                    "algorithm": "fedcg-plus",
                    "fedcg-rounds": 100,
                    "fedcg-local-steps": 1,
                    "fedcg-gradient": "sampled",
                    "fedcg-gradient-samples": 10,
                    **_FULL,
                },
                (0,),
            ),  # fmt: skip
            Variant(
                "FedCG+ tau=10 (10 rounds)",
                {
                    "algorithm": "fedcg-plus",
                    "fedcg-rounds": 10,
                    "fedcg-local-steps": 10,
                    "fedcg-gradient": "sampled",
                    "fedcg-gradient-samples": 10,
                    **_FULL,
                },
                (0,),
            ),  # fmt: skip
            *(
                Variant(
                    f"discrete greedy kappa={kappa:g}",
                    {"algorithm": "fed-discrete-greedy", "dgreedy-kappa": kappa},
                )
                for kappa in (1.0, 10.0, 50.0)
            ),
        ],
        {"dataset": "movielens"},
    ),
    "synthetic-dblp": Preset(
        "synthetic-dblp",
        (20,),
        [
            Variant(
                "FedCG T=40, 10% clients",
                {
                    "algorithm": "fedcg",
                    "fedcg-rounds": 40,
                    "clients-per-round": 0.1,
                    "fedcg-gradient": "sampled",
                    "fedcg-gradient-samples": 10,
                },
            ),  # fmt: skip
            Variant(
                "FedCG T=40, 10% clients, exact gradients",
                {"algorithm": "fedcg", "fedcg-rounds": 40, "clients-per-round": 0.1},
            ),
            Variant(  # the other argmax vertex: no zero-gradient filler in v_i
                "FedCG T=40, 10% clients, exact, no base fill",
                {
                    "algorithm": "fedcg",
                    "fedcg-rounds": 40,
                    "clients-per-round": 0.1,
                    "fedcg-fill-base": False,
                },
            ),
            Variant(
                "FedCG+ tau=5 (8 rounds), 10% clients",
                {
                    "algorithm": "fedcg-plus",
                    "fedcg-rounds": 8,
                    "fedcg-local-steps": 5,
                    "fedcg-gradient": "sampled",
                    "fedcg-gradient-samples": 10,
                    "clients-per-round": 0.1,
                },
            ),  # fmt: skip
            *(
                Variant(
                    f"discrete greedy kappa={kappa:g}",
                    {"algorithm": "fed-discrete-greedy", "dgreedy-kappa": kappa},
                )
                for kappa in (10.0, 100.0)
            ),
        ],
        {"dataset": "synthetic-dblp"},
    ),
}


def _row(preset: Preset, variant: Variant, k: int, seed: int, s: dict[str, Any]) -> dict:
    greedy = s["greedy-objective"]

    def ratio(value: float | None) -> float | str:
        return value / greedy if value is not None and greedy > 0 else ""

    cfg = {**preset.base, **variant.config}
    return {
        "dataset": s["dataset"],
        "variant": variant.name,
        "algorithm": cfg["algorithm"],
        "k": k,
        "seed": seed,
        "rounds": s["rounds"],
        "local-steps": s.get("local-steps", ""),
        "gradient": cfg.get("fedcg-gradient", "exact") if "fedcg" in cfg["algorithm"] else "",
        "clients-per-round": cfg.get("clients-per-round", ""),
        "kappa": s.get("kappa", ""),
        "objective": s["objective"],
        "greedy": greedy,
        "ratio": s["ratio-to-greedy"],
        "multilinear-ratio": ratio(s.get("multilinear")),
        "pipage-ratio": ratio(s.get("objective-pipage")),
        "greedy-rounding-ratio": ratio(s.get("objective-greedy-rounding")),
        "mean-participants": s.get("mean-participants", ""),
        "expected-participants": s.get("expected-participants", ""),
        "n-users": "",
        "ids-sent": s.get("user-values", ""),
        "wall-time": s["wall-time"],
    }


def run(args: argparse.Namespace) -> None:
    """Run the preset's grid (skipping rows already in runs.csv) and append the rows."""
    preset = PRESETS[args.preset]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "runs.csv"
    base = {**preset.base, **data_overrides(args)}
    label = preset.dataset
    done = csv_keys(path, ("dataset", "variant", "k", "seed"))
    only = set(args.variants.split("|")) if args.variants else None
    ks = tuple(int(k) for k in args.ks.split(",")) if args.ks else preset.ks
    seeds = {int(x) for x in args.seeds.split(",")} if args.seeds else None
    grid = []
    for variant in preset.variants:
        if only is not None and variant.name not in only:
            continue
        for k in ks:
            for seed in variant.seeds:
                if seeds is not None and seed not in seeds:
                    continue
                if (label, variant.name, str(k), str(seed)) in done:
                    continue
                cfg = {**base, **variant.config, "k": k, "seed": seed}
                if cfg["algorithm"] in ("fedcg", "fedcg-plus"):
                    cfg["fedcg-report-pipage"] = True  # the recorded pipage/greedy column
                name = f"{label}-{label_slug(variant.name)}-k{k}-seed{seed}"
                grid.append(Run(name, cfg, {"variant": variant, "k": k, "seed": seed}))
    print(f"{len(grid)} runs to do ({len(done)} already in {path})", flush=True)
    t0 = time.perf_counter()
    for i, (job, summary) in enumerate(Sweep(out).execute(grid, args.jobs), 1):
        variant, k, seed = job.labels["variant"], job.labels["k"], job.labels["seed"]
        row = _row(preset, variant, k, seed, summary)
        row["dataset"] = label
        append_csv(path, COLUMNS, [row])
        print(
            f"[{i}/{len(grid)} {time.perf_counter() - t0:.0f}s] {variant.name} k={k} "
            f"seed={seed}: ratio {row['ratio']:.4f}",
            flush=True,
        )


def report(args: argparse.Namespace) -> None:
    """Write the per-dataset tables (CSV, Markdown) and plots from runs.csv."""
    import pandas as pd

    def fmt(value: float, digits: int = 4) -> str:
        return "" if pd.isna(value) else f"{value:.{digits}f}"

    out = Path(args.out)
    frame = pd.read_csv(out / "runs.csv")
    metrics = ["objective", "ratio", "multilinear-ratio", "pipage-ratio", "mean-participants"]
    for dataset, df in frame.groupby("dataset"):
        agg = (
            df.sort_values("k")
            .groupby(["variant", "k"], sort=False)
            .agg(
                seeds=("seed", "nunique"),
                rounds=("rounds", "first"),
                greedy=("greedy", "mean"),
                **{f"{m}-mean": (m, "mean") for m in metrics},
                **{f"{m}-std": (m, "std") for m in ("objective", "ratio")},
                wall_time=("wall-time", "mean"),
            )
            .reset_index()
        )
        agg.to_csv(out / f"table-{dataset}.csv", index=False)
        header = ["variant", "k", "seeds", "rounds", "greedy F", "F(S) mean ± sd",
                  "F(S)/greedy", "F̂(x)/greedy", "pipage/greedy", "participants/round"]  # fmt: skip
        lines = markdown_table(header, (
            [d["variant"], d["k"], d["seeds"], d["rounds"], f"{d['greedy']:.4f}",
             f"{d['objective-mean']:.4f}"
             + ("" if pd.isna(d["objective-std"]) else f" ± {d['objective-std']:.4f}"),
             fmt(d["ratio-mean"]), fmt(d["multilinear-ratio-mean"]),
             fmt(d["pipage-ratio-mean"]), fmt(d["mean-participants-mean"], 1)]
            for d in agg.to_dict("records")
        ))  # fmt: skip
        (out / f"{dataset}.md").write_text("\n".join(lines) + "\n")
        with figure(out / f"{dataset}.png", figsize=(7, 4.5), dpi=120) as (_, ax):
            greedy = agg.groupby("k")["greedy"].mean()
            ax.plot(greedy.index, greedy.values, "k--", marker="o", label="centralized greedy")
            for name, sub in agg.groupby("variant", sort=False):
                ax.errorbar(
                    sub["k"], sub["objective-mean"], yerr=sub["objective-std"].fillna(0),
                    marker=".", capsize=2, label=name,
                )  # fmt: skip
            ax.set_xlabel("k")
            ax.set_ylabel("F(S) = mean over users of max rating in S" if dataset == "movielens"
                          else "F(S) = fraction of users covered")  # fmt: skip
            ax.set_title(f"FedCG family on {dataset} (mean over seeds)")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        print(f"wrote {out / f'{dataset}.md'} and {out / f'{dataset}.png'}")


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of ``run_sim.py fedcg`` (subcommands ``run`` and ``report``)."""
    parser = argparse.ArgumentParser(
        prog="run_sim.py fedcg",
        description="Reproductions of FedCG, FedCG+ and the federated discrete greedy "
        "(Rafiey, ICML 2024) on the direct engine: each preset is a dataset with its k grid "
        "and its variants; runs.csv gets one row per run as it finishes.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_run = sub.add_parser(
        "run",
        help="run a preset's variants x k x seeds, appending to <out>/runs.csv",
        description="Run every (variant, k, seed) of a preset on the direct engine; rows "
        "already in <out>/runs.csv are skipped, so an interrupted sweep resumes.",
    )
    presets = "; ".join(
        f"{name}: {len(p.variants)} variants, k = {', '.join(map(str, p.ks))}"
        for name, p in sorted(PRESETS.items())
    )
    p_run.add_argument("--preset", choices=sorted(PRESETS), required=True,
                       help=f"dataset and grid ({presets})")  # fmt: skip
    p_run.add_argument("--out", default="benchmarks/results/fedcg",
                       help="results folder (default: benchmarks/results/fedcg)")  # fmt: skip
    p_run.add_argument(
        "--data-dir", default=os.environ.get("FLOWER_APP_DATA", ""),
        help=help_text("data-dir") + " (default here: $FLOWER_APP_DATA)",
    )  # fmt: skip
    add_jobs(p_run)
    p_run.add_argument("--ks", default="", help="comma-separated k (default: the preset's)")
    p_run.add_argument("--seeds", default="", help="comma-separated subset of the seeds")
    variants = sorted({v.name for p in PRESETS.values() for v in p.variants})
    p_run.add_argument("--variants", default="",
                       help="'|'-separated variant names (default: all of the preset's): "
                       + "; ".join(f"'{v}'" for v in variants).replace("%", "%%"))  # fmt: skip
    add_sizes(p_run)
    p_rep = sub.add_parser(
        "report",
        help="tables and figures from <out>/runs.csv",
        description="Write table-<dataset>.csv, <dataset>.md and <dataset>.png (objective "
        "against k) from <out>/runs.csv.",
    )
    p_rep.add_argument(
        "--out", default="benchmarks/results/fedcg",
        help="results folder holding runs.csv (default: benchmarks/results/fedcg)",
    )  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (``run`` or ``report``); returns the exit code.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success, 2 on bad input (:func:`reproductions.sweep.run_command`).
    """
    return run_command(build_parser(), lambda a: run(a) if a.command == "run" else report(a), argv)


if __name__ == "__main__":
    raise SystemExit(main())
