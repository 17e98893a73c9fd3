"""Utility against privacy: FedSM under shuffle-model DP, for a grid of ε′ and seeds.

Subcommand::

    python run_sim.py privacy fedsm-dp --dataset movielens --data-dir /work/data \\
        --epsilons 0.5 1 2 4 8 --seeds 0 1 2 --out benchmarks/results/privacy/fedsm-dp

For every seed it runs FedSM Algorithm 1 without DP and with ``fedsm-dp-epsilon`` = each
ε′ (per sum query; δ′ = ``--delta``), on the direct engine (the same math as the Flower
strategy: ``tests/test_privacy_dp.py``) with ``secure-aggregation = true`` (the setting
the shuffle bound needs), and writes ``dp.csv`` (one row per run: ratio to greedy, F(S),
bits per value, mean flip probability, queries answered by the busiest client, the run's
ε against the server with secure aggregation (basic and advanced composition), against a
server that sees the replies in the clear (local randomiser) and against outsiders),
``dp.md`` (means and standard deviations over seeds beside the non-private ratio) and
``dp.png`` (ratio to greedy against ε′). Run folders go to ``<out>/runs/``.

Every subcommand takes ``--reproducible-noise`` (the research mode ``dp-reproducible-noise``:
noise keyed by the seed, so a sweep repeats bit for bit, and the recorded tables of
docs/privacy.md were produced this way; it gives no privacy against the server, and the
tables say so).

``fedsubavg-dp`` does the same for the FedSubAvg family (``fsa-dp-noise``; weighting by
clients) and writes ``fedsubavg-dp.*``: final train loss and test accuracy against σ.

``maxfl-dp`` runs MaxFL (or ``--algorithm fedavg``) with participation of all sampled
clients, once without DP and once per noise multiplier σ (``maxfl-dp-noise``, clipping
``--clip``), and writes ``maxfl-dp.csv`` / ``.md`` / ``.png``: final seen and unseen accuracy
and GM-Appeal against σ, with the run's ε at δ = ``--delta`` against the server (the worst
client over the rounds it took part in, no amplification) and against outsiders
(amplified by sampling), both by Google's ``dp_accounting`` (RDP).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flower_app.results import read_rows
from reproductions.sweep import (
    Run,
    Sweep,
    add_dataset,
    add_seeds,
    figure,
    group_by,
    markdown_table,
    run_command,
    runnable_datasets,
    write_csv,
)

__all__ = ["DATASETS_RUN", "build_parser", "main"]

COLUMNS = [
    "dataset", "epsilon", "delta", "seed", "k", "clients-per-round", "elements-per-client",
    "objective", "greedy-objective", "ratio-to-greedy", "dp-bits-mean", "dp-flip-mean",
    "dp-queries", "dp-epsilon-basic", "dp-delta-basic", "dp-epsilon-advanced",
    "dp-delta-advanced", "dp-epsilon-local", "dp-epsilon-outsider", "dp-delta-outsider",
    "reproducible-noise", "run-folder",
]  # fmt: skip


def _fedsm_row(config: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """Return the dp.csv row of one run: its utility and the privacy its last round reports."""
    folder = Path(summary["run-folder"])
    rows = [r for r in read_rows(folder) if r.get("server-round", 0) >= 1]
    last = rows[-1] if rows else {}
    eps = float(config.get("fedsm-dp-epsilon", 0.0))
    return {
        "dataset": config["dataset"],
        "epsilon": eps if eps else "none",
        "delta": config.get("fedsm-dp-delta", "") if eps else "",
        "seed": config["seed"],
        "k": config["k"],
        "clients-per-round": config["clients-per-round"],
        "elements-per-client": config["elements-per-client"],
        "objective": summary["objective"],
        "greedy-objective": summary.get("greedy-objective"),
        "ratio-to-greedy": summary.get("ratio-to-greedy"),
        "dp-bits-mean": statistics.mean(r["dp-bits"] for r in rows) if eps else "",
        "dp-flip-mean": statistics.mean(r["dp-flip-mean"] for r in rows) if eps else "",
        **{key: last.get(key, "") for key in COLUMNS if key.startswith("dp-") and key in last},
        "reproducible-noise": bool(config.get("dp-reproducible-noise", False)) if eps else "",
        "run-folder": str(folder),
    }


def fedsm_dp(args: argparse.Namespace) -> None:
    """Run the ε′ × seed grid and write dp.csv, dp.md and dp.png into ``--out``."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = {
        "algorithm": "fedsm", "dataset": args.dataset, "data-dir": args.data_dir, "k": args.k,
        "clients-per-round": args.clients, "elements-per-client": args.elements,
        "dp-reproducible-noise": bool(args.reproducible_noise),
        "fedsm-history-clamp": "off",  # the paper's Algorithm 1 (the app's default clamps)
    }  # fmt: skip
    grid = []
    for seed in args.seeds:
        for eps in [0.0, *args.epsilons]:
            config = {**base, "seed": seed}
            if eps:
                config.update({"fedsm-dp-epsilon": float(eps), "fedsm-dp-delta": args.delta,
                               "secure-aggregation": True})  # fmt: skip
            grid.append(Run(f"eps{eps:g}-seed{seed}", config, {"eps": eps}))
    rows = []
    for run, summary in Sweep(out).execute(grid):
        row = _fedsm_row(run.config, summary)
        rows.append(row)
        print(f"seed={row['seed']} eps'={run.labels['eps']:g}: ratio to greedy "
              f"{row['ratio-to-greedy']:.4f}", flush=True)  # fmt: skip
    write_csv(out / "dp.csv", rows, COLUMNS)
    (out / "dp.md").write_text(report(rows, args.delta, args.reproducible_noise))
    plot(rows, out / "dp.png")
    print((out / "dp.md").read_text())


def report(rows: list[dict[str, Any]], delta: float, reproducible: bool = False) -> str:
    """Return the Markdown table: mean ± sd over seeds per ε′.

    The run's ε (advanced composition, or basic where smaller) against the server with
    secure aggregation (shuffle bound; also what outsiders face), and against a server
    that sees the replies in the clear (local randomiser, δ = 0).
    """
    header = [f"ε′ per query (δ′ = {delta:g})", "seeds", "ratio to greedy", "bits per value",
              "flip p", "queries (busiest client)", "ε vs server, secure aggregation (basic)",
              "ε vs server, secure aggregation (advanced)", "ε vs server, replies in the clear",
              "ε vs outsiders"]  # fmt: skip
    body: list[list[Any]] = []
    for eps, group in group_by(rows, "epsilon").items():
        ratios = [float(r["ratio-to-greedy"]) for r in group]
        sd = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        utility = f"{statistics.mean(ratios):.4f} ± {sd:.4f}"
        if eps == "none":
            body.append(["no DP", len(group), utility, *["-"] * 7])
            continue
        mean = {k: statistics.mean(float(r[k]) for r in group)
                for k in ("dp-bits-mean", "dp-flip-mean", "dp-queries", "dp-epsilon-basic",
                          "dp-epsilon-advanced", "dp-epsilon-local",
                          "dp-epsilon-outsider")}  # fmt: skip
        body.append([f"{eps:g}", len(group), utility, f"{mean['dp-bits-mean']:.1f}",
                     f"{mean['dp-flip-mean']:.3f}", f"{mean['dp-queries']:.0f}",
                     f"{mean['dp-epsilon-basic']:,.0f}", f"{mean['dp-epsilon-advanced']:,.0f}",
                     f"{mean['dp-epsilon-local']:,.0f}",
                     f"{mean['dp-epsilon-outsider']:,.0f}"])  # fmt: skip
    lines = markdown_table(header, body)
    if reproducible:
        lines.append("")
        lines.append(NOTE_REPRODUCIBLE)
    return "\n".join(lines) + "\n"


#: the line under a table produced with ``--reproducible-noise``
NOTE_REPRODUCIBLE = (
    "Produced with dp-reproducible-noise = true (noise keyed by the seed, research mode): "
    "the utility is that of the same noise distribution, but these runs gave no privacy "
    "against the server."
)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Plot the ratio to greedy against ε′ (mean ± sd), the non-private ratio as a line."""
    groups = group_by(rows, "epsilon")
    eps = sorted(e for e in groups if e != "none")
    mean = [statistics.mean(float(r["ratio-to-greedy"]) for r in groups[e]) for e in eps]
    sd = [statistics.pstdev(float(r["ratio-to-greedy"]) for r in groups[e]) for e in eps]
    with figure(path, figsize=(5.5, 3.6), dpi=130) as (_, ax):
        ax.errorbar(eps, mean, yerr=sd, marker="o", capsize=3, label="FedSM Alg. 1, shuffle DP")
        if "none" in groups:
            plain = statistics.mean(float(r["ratio-to-greedy"]) for r in groups["none"])
            ax.axhline(plain, color="grey", linestyle="--", label=f"no DP ({plain:.3f})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ε′ per sum query (one element, one round)")
        ax.set_ylabel("F(S) / F(greedy)")
        ax.set_title(f"{rows[0]['dataset']}: utility against privacy")
        ax.legend(loc="lower right")
        ax.grid(alpha=0.3)


#: per family of the Gaussian-DP sweeps: key prefix, fixed run keys, where the final numbers
#: are read (summary key, or "final" for MaxFL's nested dict), the numbers, the output name
GAUSSIAN_SWEEPS: dict[str, dict[str, Any]] = {
    "maxfl": {
        "prefix": "maxfl", "output": "maxfl-dp", "nested": "final",
        "fixed": lambda rounds: {"maxfl-rounds": rounds, "maxfl-eval-every": rounds,
                                 "maxfl-participation": "all"},
        "keys": ["seen-acc", "seen-gm-appeal", "unseen-acc", "unseen-gm-appeal"],
        "plot": [("seen-acc", "final seen accuracy"), ("seen-gm-appeal", "final seen GM-Appeal")],
    },
    "fedsubavg": {
        "prefix": "fsa", "output": "fedsubavg-dp", "nested": None,
        "fixed": lambda rounds: {"fsa-rounds": rounds},
        "keys": ["train-loss", "min-train-loss", "test-accuracy"],
        "plot": [("train-loss", "final train loss"), ("test-accuracy", "test accuracy")],
    },
}  # fmt: skip


def gaussian_dp(args: argparse.Namespace, family: str) -> None:
    """Run the σ × seed grid of a learning family; write ``<output>.csv/.md/.png``."""
    spec = GAUSSIAN_SWEEPS[family]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = []
    for seed in args.seeds:
        for noise in [0.0, *args.noise]:
            config = {
                "algorithm": args.algorithm, "dataset": args.dataset, "data-dir": args.data_dir,
                **spec["fixed"](args.rounds), "seed": seed,
                "dp-reproducible-noise": bool(args.reproducible_noise),
            }  # fmt: skip
            if noise:
                prefix = spec["prefix"]
                config.update({"secure-aggregation": True, f"{prefix}-dp-noise": float(noise),
                               f"{prefix}-dp-clip": args.clip, f"{prefix}-dp-delta": args.delta})
            grid.append(Run(f"noise{noise:g}-seed{seed}", config, {"noise": noise}))
    rows = []
    for run, summary in Sweep(out).execute(grid):
        noise, seed = run.labels["noise"], run.config["seed"]
        folder = Path(summary["run-folder"])
        last = read_rows(folder)[-1]
        final = summary.get(spec["nested"], {}) if spec["nested"] else summary
        row = {
            "dataset": args.dataset, "algorithm": args.algorithm,
            "noise": noise if noise else "none", "clip": args.clip if noise else "",
            "seed": seed, "rounds": args.rounds,
            **{k: final.get(k) for k in spec["keys"]},
            "dp-epsilon": last.get("dp-epsilon", ""),
            "dp-epsilon-honest-peers": last.get("dp-epsilon-honest-peers", ""),
            "dp-epsilon-outsider": last.get("dp-epsilon-outsider", ""),
            "dp-rounds-worst-client": last.get("dp-rounds-worst-client", ""),
            "dp-delta": last.get("dp-delta", ""),
            "reproducible-noise": bool(args.reproducible_noise) if noise else "",
            "run-folder": str(folder),
        }  # fmt: skip
        rows.append(row)
        shown = ", ".join(f"{k} {row[k]:.4f}" for k in spec["keys"][:2])
        print(f"seed={seed} sigma={noise:g}: {shown}, eps {row['dp-epsilon']}", flush=True)
    name = spec["output"]
    write_csv(out / f"{name}.csv", rows)
    (out / f"{name}.md").write_text(_metric_table(rows, args, spec["keys"]))
    _metric_plot(rows, out / f"{name}.png", args, spec["plot"])
    print((out / f"{name}.md").read_text())


def _metric_table(rows: list[dict[str, Any]], args: argparse.Namespace, keys: list[str]) -> str:
    """Return a Markdown table of ``keys`` (mean ± sd over seeds) per σ, with the ε's.

    ε against the server as the nodes verify it (the worst client's own noise shares, no
    amplification), then the figure if every other client is honest (with the worst
    client's rounds), then against outsiders (amplified by sampling).
    """
    header = [f"σ (clip C = {args.clip:g})", "seeds",
              f"ε vs server at δ = {args.delta:g} (each client's own share)",
              "ε if the other clients are honest (worst client's rounds)", "ε vs outsiders",
              *keys]  # fmt: skip
    body = []
    for noise, group in group_by(rows, "noise").items():
        server, honest, outsider = "∞ (no DP)", "∞", "∞"
        if noise != "none":
            eps = statistics.mean(float(r["dp-epsilon"]) for r in group)
            server = f"{eps:,.1f}"
            if all(r.get("dp-epsilon-honest-peers") not in (None, "") for r in group):
                peers = statistics.mean(float(r["dp-epsilon-honest-peers"]) for r in group)
                worst = statistics.mean(float(r["dp-rounds-worst-client"]) for r in group)
                honest = f"{peers:,.1f} ({worst:.1f})"
            outsider = f"{statistics.mean(float(r['dp-epsilon-outsider']) for r in group):,.1f}"
        cells = []
        for key in keys:
            values = [float(r[key]) for r in group]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.4f} ± {sd:.4f}")
        name = "no DP" if noise == "none" else f"{noise:g}"
        body.append([name, len(group), server, honest, outsider, *cells])
    lines = markdown_table(header, body)
    if args.reproducible_noise:
        lines += ["", NOTE_REPRODUCIBLE]
    return "\n".join(lines) + "\n"


def _metric_plot(
    rows: list[dict[str, Any]], path: Path, args: argparse.Namespace,
    keys: list[tuple[str, str]],
) -> None:  # fmt: skip
    """Plot each key (mean ± sd) against σ, the non-private value as a dashed line."""
    groups = group_by(rows, "noise")
    sigmas = sorted(n for n in groups if n != "none")
    with figure(path, 1, len(keys), figsize=(5.2 * len(keys), 3.6), dpi=130) as (fig, axes):
        for ax, (key, label) in zip(np.atleast_1d(axes), keys, strict=True):
            mean = [statistics.mean(float(r[key]) for r in groups[n]) for n in sigmas]
            sd = [statistics.pstdev(float(r[key]) for r in groups[n]) for n in sigmas]
            ax.errorbar(sigmas, mean, yerr=sd, marker="o", capsize=3)
            if "none" in groups:
                plain = statistics.mean(float(r[key]) for r in groups["none"])
                ax.axhline(plain, color="grey", linestyle="--", label=f"no DP ({plain:.3f})")
                ax.legend(loc="best")
            ax.set_xscale("log")
            ax.set_xlabel(f"noise multiplier σ (clip C = {args.clip:g})")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        fig.suptitle(f"{args.algorithm} on {args.dataset}: utility against client-level DP")


#: the torch tasks (Sent140 LSTM, Amazon DIN) refuse fsa-dp-noise > 0 (runners.fedsubavg_torch)
TORCH_TASKS = ("sent140", "synthetic-sent140", "amazon", "synthetic-amazon")
#: --dataset choices of each subcommand (none has --data-file: not your own files)
DATASETS_RUN = {
    "fedsm-dp": runnable_datasets("fedsm"),
    "maxfl-dp": runnable_datasets("maxfl"),
    "fedsubavg-dp": runnable_datasets("fedsubavg", exclude=TORCH_TASKS),
}


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of ``run_sim.py privacy`` (fedsm-dp, maxfl-dp, fedsubavg-dp)."""
    from flower_app.settings import help_text

    def dataset(p: argparse.ArgumentParser, command: str, default: str) -> None:
        add_dataset(p, DATASETS_RUN[command], default)

    def common(p: argparse.ArgumentParser) -> None:
        add_seeds(p)
        p.add_argument("--out", required=True, help="results folder (run folders in <out>/runs/)")
        p.add_argument("--reproducible-noise", action="store_true",
                       help="research mode: DP noise keyed by the seed (no privacy against the "
                       "server; the recorded tables)")  # fmt: skip

    def gaussian(p: argparse.ArgumentParser, prefix: str) -> None:
        """Add the σ grid, clip and δ of a client-level Gaussian DP sweep (``<prefix>-dp-*``)."""
        p.add_argument("--noise", type=float, nargs="+", default=[0.01, 0.03, 0.1, 0.3, 1.0],
                       help="noise multipliers σ (default: 0.01 0.03 0.1 0.3 1)")  # fmt: skip
        p.add_argument("--clip", type=float, default=1.0, help=help_text(f"{prefix}-dp-clip"))
        p.add_argument("--delta", type=float, default=1e-5, help=help_text(f"{prefix}-dp-delta"))

    parser = argparse.ArgumentParser(
        prog="run_sim.py privacy",
        description="Utility against privacy on the direct engine: each command runs every "
        "seed without DP and at every privacy level, and writes a CSV, a Markdown table "
        "(mean and std over seeds, with the run's epsilon) and a PNG into --out. The "
        "mechanisms and their trust assumptions: docs/privacy.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    dp = sub.add_parser(
        "fedsm-dp", help="FedSM ratio to greedy against ε′ (shuffle-model DP): dp.csv/.md/.png",
        description="FedSM Algorithm 1 without DP and with fedsm-dp-epsilon = each ε′ (per "
        "sum query, δ′ = --delta): ratio to greedy, bits per value, composed (ε, δ).",
    )  # fmt: skip
    dataset(dp, "fedsm-dp", "movielens")
    dp.add_argument("--k", type=int, default=10, help="set size k (default: 10)")
    dp.add_argument("--clients", type=float, default=0.1,
                    help="K as a fraction of users (default: 0.1)")  # fmt: skip
    dp.add_argument("--elements", type=float, default=0.1,
                    help="d as a fraction of |E| (default: 0.1)")  # fmt: skip
    dp.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1, 2, 4, 8],
                    help="ε′ per sum query (default: 0.5 1 2 4 8)")  # fmt: skip
    dp.add_argument("--delta", type=float, default=1e-6, help=help_text("fedsm-dp-delta"))
    common(dp)
    mx = sub.add_parser(
        "maxfl-dp", help="MaxFL accuracy and GM-Appeal against σ: maxfl-dp.csv/.md/.png",
        description="MaxFL (or FedAvg) with every sampled client taking part, without DP and "
        "with client-level Gaussian DP at each noise multiplier σ (maxfl-dp-noise, clipping "
        "--clip): final seen and unseen accuracy and GM-Appeal, ε at δ = --delta.",
    )  # fmt: skip
    dataset(mx, "maxfl-dp", "fmnist")
    mx.add_argument("--algorithm", default="maxfl", choices=["maxfl", "fedavg"],
                    help="maxfl or fedavg (default: maxfl)")  # fmt: skip
    mx.add_argument("--rounds", type=int, default=30, help="rounds per run (default: 30)")
    gaussian(mx, "maxfl")
    common(mx)
    fs = sub.add_parser(
        "fedsubavg-dp", help="FedSubAvg train loss and accuracy against σ: "
        "fedsubavg-dp.csv/.md/.png",
        description="A FedSubAvg-family algorithm without DP and with client-level Gaussian "
        "DP at each σ (fsa-dp-noise; weighting by clients): final train loss and test "
        "accuracy. The LSTM and DIN tasks (Sent140, Amazon) do not support DP yet.",
    )  # fmt: skip
    dataset(fs, "fedsubavg-dp", "movielens-rating")
    fs.add_argument("--algorithm", default="fedsubavg",
                    choices=["fedsubavg", "fedavg-sub", "fedprox-sub", "fedadam-sub",
                             "scaffold-sub"],
                    help="the algorithm (default: fedsubavg)")  # fmt: skip
    fs.add_argument("--rounds", type=int, default=50, help="rounds per run (default: 50)")
    gaussian(fs, "fsa")
    common(fs)
    return parser


def _command(args: argparse.Namespace) -> None:
    if args.command == "fedsm-dp":
        fedsm_dp(args)
    else:
        gaussian_dp(args, "maxfl" if args.command == "maxfl-dp" else "fedsubavg")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the subcommand and run it; return the exit status (2 on bad input)."""
    return run_command(build_parser(), _command, argv)
