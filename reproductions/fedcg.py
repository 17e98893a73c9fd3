"""Reproductions of FedCG / FedCG+ / federated discrete greedy (Rafiey, ICML 2024).

Two subcommands::

    python -m reproductions.fedcg run --preset movielens --data-dir /work/data \\
        --out benchmarks/results/fedcg --jobs 2
    python -m reproductions.fedcg report --out benchmarks/results/fedcg

``run`` executes every (variant, k, seed) of a preset on the direct engine (the same code
the Flower strategy calls; a test checks both engines agree) and appends one row per run to
``<out>/runs.csv`` as soon as it finishes; rows already there are skipped, so an
interrupted sweep resumes. ``report`` writes ``<out>/table-<dataset>.csv`` (means and
standard deviations over seeds), ``<out>/<dataset>.md`` (the same as a Markdown table) and
``<out>/<dataset>.png`` (objective against k).
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower_app.settings import help_text
from reproductions import data_overrides

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


def _run_one(run_config: dict[str, Any]) -> dict[str, Any]:
    """Worker: one direct-engine run; returns its summary."""
    from flower_app.config import AppConfig
    from flower_app.experiment import run_direct

    with tempfile.TemporaryDirectory() as tmp:
        cfg = AppConfig.from_run_config({**run_config, "output-dir": tmp, "run-name": "run"})
        return run_direct(cfg)


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


def _done(path: Path) -> set[tuple[str, str, int, int]]:
    if not path.exists():
        return set()
    with path.open() as fh:
        return {
            (r["dataset"], r["variant"], int(r["k"]), int(r["seed"])) for r in csv.DictReader(fh)
        }


def run(args: argparse.Namespace) -> None:
    """Run the preset's grid (skipping rows already in runs.csv) and append the rows."""
    preset = PRESETS[args.preset]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "runs.csv"
    base = {**preset.base, **data_overrides(args)}
    label = "synthetic-dblp" if preset.dataset == "synthetic-dblp" else preset.dataset
    done = _done(path)
    only = set(args.variants.split("|")) if args.variants else None
    ks = tuple(int(k) for k in args.ks.split(",")) if args.ks else preset.ks
    seeds = {int(x) for x in args.seeds.split(",")} if args.seeds else None
    jobs = []
    for variant in preset.variants:
        if only is not None and variant.name not in only:
            continue
        for k in ks:
            for seed in variant.seeds:
                if seeds is not None and seed not in seeds:
                    continue
                if (label, variant.name, k, seed) in done:
                    continue
                cfg = {**base, **variant.config, "k": k, "seed": seed}
                if cfg["algorithm"] in ("fedcg", "fedcg-plus"):
                    cfg["fedcg-report-pipage"] = True  # the recorded pipage/greedy column
                jobs.append((variant, k, seed, cfg))
    print(f"{len(jobs)} runs to do ({len(done)} already in {path})", flush=True)
    new = not path.exists()
    with path.open("a", newline="") as fh, ProcessPoolExecutor(args.jobs) as pool:
        writer = csv.DictWriter(fh, COLUMNS)
        if new:
            writer.writeheader()
        futures = {pool.submit(_run_one, cfg): (v, k, seed) for v, k, seed, cfg in jobs}
        t0 = time.perf_counter()
        for i, fut in enumerate(as_completed(futures), 1):
            variant, k, seed = futures[fut]
            summary = fut.result()
            row = _row(preset, variant, k, seed, summary)
            row["dataset"] = label
            writer.writerow(row)
            fh.flush()
            print(
                f"[{i}/{len(jobs)} {time.perf_counter() - t0:.0f}s] {variant.name} k={k} "
                f"seed={seed}: ratio {row['ratio']:.4f}",
                flush=True,
            )


def report(args: argparse.Namespace) -> None:
    """Write the per-dataset tables (CSV, Markdown) and plots from runs.csv."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

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
        lines = [
            "| variant | k | seeds | rounds | greedy F | F(S) mean ± sd | F(S)/greedy | "
            "F̂(x)/greedy | pipage/greedy | participants/round |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for d in agg.to_dict("records"):

            def fmt(value: float, digits: int = 4) -> str:
                return "" if pd.isna(value) else f"{value:.{digits}f}"

            sd = d["objective-std"]
            lines.append(
                f"| {d['variant']} | {d['k']} | {d['seeds']} | {d['rounds']} | "
                f"{d['greedy']:.4f} | {d['objective-mean']:.4f}"
                f"{'' if pd.isna(sd) else f' ± {sd:.4f}'} | {fmt(d['ratio-mean'])} | "
                f"{fmt(d['multilinear-ratio-mean'])} | {fmt(d['pipage-ratio-mean'])} | "
                f"{fmt(d['mean-participants-mean'], 1)} |"
            )
        (out / f"{dataset}.md").write_text("\n".join(lines) + "\n")
        fig, ax = plt.subplots(figsize=(7, 4.5))
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
        fig.tight_layout()
        fig.savefig(out / f"{dataset}.png", dpi=120)
        plt.close(fig)
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
    p_run.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    p_run.add_argument("--ks", default="", help="comma-separated k (default: the preset's)")
    p_run.add_argument("--seeds", default="", help="comma-separated subset of the seeds")
    variants = sorted({v.name for p in PRESETS.values() for v in p.variants})
    p_run.add_argument("--variants", default="",
                       help="'|'-separated variant names (default: all of the preset's): "
                       + "; ".join(f"'{v}'" for v in variants).replace("%", "%%"))  # fmt: skip
    p_run.add_argument("--num-users", type=int, default=0, help=help_text("num-users"))
    p_run.add_argument("--num-elements", type=int, default=0, help=help_text("num-elements"))
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
        0 on success.
    """
    args = build_parser().parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        report(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
