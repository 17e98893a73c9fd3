"""FedSM Algorithm 1 sweeps over K, d and seeds, with tables and paper-style figures.

The ``fedsm-sweep`` and ``plot`` commands of ``run_sim.py`` (:mod:`reproductions.cli`).

``fedsm-sweep``
    Runs FedSM Algorithm 1 (Rafiey, Namani & Charalambides, 2025) for every (K, d, seed) of a
    grid and writes ``sweep.csv``, ``table.csv`` and the figures into ``--out``; the run
    folders (config.json, metrics.jsonl, summary.json) go to ``<out>/runs/``.
``plot``
    Re-makes ``table.csv`` and the figures from an existing ``sweep.csv``.

Engines: ``--engine direct`` (default) runs :func:`direct.run_direct` in-process;
``--engine flower`` runs each configuration with ``flwr run . --stream --run-config ...``
(Flower's simulation engine, against a private local SuperLink) and reads the same run folder.
Both give the same sets for the same seed.

One run per (K, d, seed) gives the whole objective-vs-k curve
-------------------------------------------------------------
Algorithm 1 adds one element per communication round, and all of its randomness is drawn
per round: the server's user sample comes from one ``numpy.random.Generator`` seeded by
``seed`` and used in round order, and user ``i``'s d-element draw in round ``t`` comes from its
own stream seeded by ``(seed, t, i)``. A run to ``k = 30`` therefore passes through exactly the
sets S_5, S_10, ... that separate runs to ``k = 5, 10, ...`` would return (nothing else in
a round depends on the final k: d is capped by |E \\ S| and the uniform matroid of rank k
allows every element outside S until k are chosen). So the sweep runs each
(K, d, seed) once to ``max(--k)`` and reads F(S_t) off the per-round log at every requested
``t``; the centralized greedy reference is read the same way off one lazy-greedy run, and the
random-selection baseline off one random run per seed.

Usage::

    python run_sim.py fedsm-sweep --dataset movielens --data-dir /work/data \\
        --k 5 10 15 20 25 30 --clients 0.01 0.1 0.3 0.5 --elements 0.1 0.2 0.4 0.6 \\
        --seeds 0 1 2 --out benchmarks/results/fedsm-alg1/movielens
    python run_sim.py plot benchmarks/results/fedsm-alg1/movielens/sweep.csv
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flower_app.config import MATROIDS, AppConfig, ConfigError
from flower_app.results import read_run
from flower_app.settings import help_text
from flower_app.simulation import LocalSimulation
from reproductions.sweep import (
    Run,
    Sweep,
    add_dataset,
    add_jobs,
    add_seeds,
    add_sizes,
    figure,
    markdown_table,
    runnable_datasets,
    slug,
)

__all__ = [
    "DATASETS_RUN",
    "SWEEP_COLUMNS",
    "add_parsers",
    "make_figures",
    "make_table",
    "markdown_ratio_table",
    "parse_count",
    "read_sweep",
    "rows_from_run_folder",
    "run_command",
    "spec_label",
]

#: columns of sweep.csv, in order (one row per dataset, K, d, seed, k)
SWEEP_COLUMNS = [
    "dataset",
    "engine",
    "matroid",
    "n-users",
    "n-elements",
    "clients-per-round",
    "elements-per-client",
    "K",
    "d",
    "seed",
    "k",
    "objective",
    "greedy-objective",
    "ratio",
    "random-objective",
    "user-values",
    "bytes-up",
    "wall-time",
    "run-wall-time",
    "run-folder",
]
#: K and d specs are kept as the strings given (an int is a count, a float a fraction)
_SPEC_COLUMNS = {"clients-per-round": str, "elements-per-client": str, "dataset": str}


# --------------------------------------------------------------------------- specs


def parse_count(text: str) -> int | float:
    """Parse a K or d value the way ``run_config`` reads it.

    Parameters
    ----------
    text : str
        ``"50"`` is an absolute count (int); ``"0.1"`` or ``"1.0"`` is a fraction (float).

    Returns
    -------
    int or float
        The count spec.

    Raises
    ------
    argparse.ArgumentTypeError
        If the text is neither.
    """
    try:
        if re.fullmatch(r"[+]?\d+", text.strip()):
            return int(text)
        return float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a fraction like 0.1 or an integer count like 50"
        ) from err


def spec_label(spec: str, symbol: str) -> str:
    """Return a legend label: ``"K = 1%"`` for a fraction, ``"K = 50"`` for a count."""
    value = parse_count(str(spec))
    if isinstance(value, float):
        return f"{symbol} = {100 * value:g}%"
    return f"{symbol} = {value}"


# --------------------------------------------------------------------------- one run


def rows_from_run_folder(
    folder: Path, ks: Sequence[int], out: Path | None = None
) -> list[dict[str, Any]]:
    """Turn one run folder into sweep rows, one per requested k.

    Parameters
    ----------
    folder : pathlib.Path
        Run folder holding ``config.json``, ``metrics.jsonl`` and ``summary.json``.
    ks : sequence of int
        The k values to report (each at most the run's number of rounds).
    out : pathlib.Path, optional
        Sweep folder; ``run-folder`` is written relative to it when given.

    Returns
    -------
    list of dict
        Rows with the :data:`SWEEP_COLUMNS` except ``random-objective`` (filled in by the
        sweep). ``user-values``, ``bytes-up`` and ``wall-time`` are cumulative up to round k.
    """
    run = read_run(folder)
    if run.summary is None:
        raise ValueError(f"{folder}: no summary.json (the run did not finish)")
    config, summary, metrics = run.config, run.summary, run.rows
    objective_by_k = summary["objective-by-k"]
    greedy_by_k = summary["greedy-by-k"]
    try:
        where = str(folder.relative_to(out)) if out is not None else str(folder)
    except ValueError:
        where = str(folder)
    rows = []
    for k in ks:
        if k > len(metrics) or k > len(greedy_by_k):
            raise ValueError(f"{folder}: k={k} asked but the run has {len(metrics)} rounds")
        objective = float(objective_by_k[k - 1])
        greedy_value = float(greedy_by_k[k - 1])
        rows.append(
            {
                "dataset": summary["dataset"],
                "engine": summary["engine"],
                "matroid": config["matroid"],
                "n-users": config["instance"]["n-users"],
                "n-elements": config["instance"]["n-elements"],
                "clients-per-round": str(config["clients-per-round"]),
                "elements-per-client": str(config["elements-per-client"]),
                "K": int(metrics[0]["users"]),
                "d": int(metrics[0]["d"]),
                "seed": int(summary["seed"]),
                "k": int(k),
                "objective": objective,
                "greedy-objective": greedy_value,
                "ratio": objective / greedy_value if greedy_value > 0 else math.nan,
                "user-values": int(sum(int(r["user-values"]) for r in metrics[:k])),
                "bytes-up": int(sum(int(r.get("bytes-up", 0)) for r in metrics[:k])),
                "wall-time": float(metrics[k - 1]["wall-time"]),
                "run-wall-time": float(summary["wall-time"]),
                "run-folder": where,
            }
        )
    return rows


class FlowerEngine:
    """Runs configurations with ``flwr run . --stream`` against a private local SuperLink.

    A thin wrapper of :class:`flower_app.simulation.LocalSimulation` (own ``FLWR_HOME`` and
    ports; :meth:`close` stops exactly that SuperLink). Its :meth:`run` is a worker of
    :meth:`reproductions.sweep.Sweep.execute` (one run at a time).

    Parameters
    ----------
    home : pathlib.Path
        Private ``FLWR_HOME``.
    num_supernodes : int
        Simulated SuperNodes (users are split over them).
    timeout : float
        Seconds allowed per ``flwr run``.
    """

    def __init__(self, home: Path, num_supernodes: int, timeout: float = 7200.0) -> None:
        self.sim = LocalSimulation(home, home / "runs")
        self.num_supernodes = num_supernodes
        self.timeout = timeout

    def run(self, run_config: dict[str, Any]) -> dict[str, Any]:
        """Run one configuration with ``flwr run``; return its summary (with ``run-folder``)."""
        run = self.sim.run(run_config, num_supernodes=self.num_supernodes, timeout=self.timeout)
        started = (run.folder / "config.json").is_file()
        summary = read_run(run.folder).summary if started else None
        if run.status != "finished:completed" or summary is None:
            raise RuntimeError(
                f"flwr run ended {run.status} ({run.details}) without a summary in "
                f"{run.folder}:\n" + run.output[-4000:]
            )
        return {**summary, "run-folder": str(run.folder)}

    def close(self) -> None:
        """Stop the SuperLink this engine's ``flwr run`` calls started."""
        self.sim.stop()


# --------------------------------------------------------------------------- the sweep


def _base_run_config(args: argparse.Namespace) -> dict[str, Any]:
    base: dict[str, Any] = {
        "algorithm": "fedsm",
        "dataset": args.dataset,
        "data-seed": args.data_seed,
        "k": max(args.k),
        "matroid": args.matroid,
        "partition-capacity": args.partition_capacity,
        "num-users": args.num_users,
        "num-elements": args.num_elements,
        # the paper's Algorithm 1: the estimate of Eq. (3) as it is, not the app's default clamp
        "fedsm-history-clamp": "off",
    }
    if args.data_dir:
        base["data-dir"] = str(Path(args.data_dir).expanduser().resolve())
    for key in ("data_file", "item_names"):  # your own data (docs/own-data.md)
        if getattr(args, key, ""):
            base[key.replace("_", "-")] = str(Path(getattr(args, key)).expanduser().resolve())
    if getattr(args, "data_columns", "user,item,value") != "user,item,value":
        base["data-columns"] = args.data_columns
    if getattr(args, "rng", "per-user") != "per-user":
        base["fedsm-rng"] = args.rng
    return base


def _grid(args: argparse.Namespace) -> list[Run]:
    base = _base_run_config(args)
    return [
        Run(
            f"{args.dataset}-K{slug(clients)}-d{slug(elements)}-seed{seed}",
            {**base, "clients-per-round": clients, "elements-per-client": elements,
             "seed": seed},
        )  # fmt: skip
        for clients in args.clients
        for elements in args.elements
        for seed in args.seeds
    ]


def _validate(grid: list[Run]) -> tuple[Any, Any]:
    """Check every configuration against the instance before any run; return problem, matroid."""
    from flower_app.algorithms.fedsm.core import FedSMServer
    from flower_app.problems import build_matroid, load_problem

    first = AppConfig.from_run_config(grid[0].config)
    problem = load_problem(first)
    matroid = build_matroid(first, problem)
    for run in grid:
        cfg = AppConfig.from_run_config(run.config)
        try:
            FedSMServer(
                problem.n_users,
                matroid,
                cfg.k,
                cfg.clients_per_round,
                cfg.elements_per_client,
                cfg.seed,
            )
        except ValueError as err:
            raise ConfigError(str(err)) from err
    return problem, matroid


def _random_baseline(problem: Any, matroid: Any, k: int, seeds: Iterable[int]) -> dict:
    """Return {(seed, t): F(random S_t)} for t = 1..k."""
    from flower_app.submodular.greedy import random_selection

    values = {}
    for seed in seeds:
        result = random_selection(problem.objective, matroid, k, seed=seed)
        for t, value in enumerate(result.values, start=1):
            values[(seed, t)] = float(value)
    return values


def write_sweep(rows: list[dict[str, Any]], path: Path) -> pd.DataFrame:
    """Write rows to ``sweep.csv`` (sorted by K, d, seed, k) and return them as a frame."""
    frame = pd.DataFrame(rows, columns=SWEEP_COLUMNS)
    frame = frame.sort_values(["K", "d", "seed", "k"], kind="stable").reset_index(drop=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return frame


def run_sweep(args: argparse.Namespace) -> pd.DataFrame:
    """Run the (K, d, seed) grid to max(k) and write sweep.csv, table.csv and the figures.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``fedsm-sweep`` arguments.

    Returns
    -------
    pandas.DataFrame
        The sweep rows (also in ``<out>/sweep.csv``).
    """
    from tqdm import tqdm

    out = Path(args.out).expanduser().resolve()
    sweep = Sweep(out)
    ks = sorted(set(args.k))
    grid = _grid(args)
    problem, matroid = _validate(grid)
    print(
        f"{args.dataset}: n = {problem.n_users} users, m = {problem.n_elements} elements; "
        f"{len(grid)} runs to k = {ks[-1]} on the {args.engine} engine -> {out}",
        flush=True,
    )
    randoms = _random_baseline(problem, matroid, ks[-1], args.seeds)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    engine = FlowerEngine(sweep.runs / ".flwr-home", args.num_supernodes) \
        if args.engine == "flower" else None  # fmt: skip
    worker = {"worker": engine.run} if engine is not None else {}
    try:
        with tqdm(total=len(grid), desc=f"fedsm {args.dataset}", unit="run") as bar:
            for _, summary in sweep.execute(grid, args.jobs if engine is None else 1, **worker):
                new_rows = rows_from_run_folder(Path(summary["run-folder"]), ks, out)
                for row in new_rows:
                    row["random-objective"] = randoms[(row["seed"], row["k"])]
                rows.extend(new_rows)
                last = new_rows[-1]
                bar.set_postfix_str(
                    f"K={last['clients-per-round']} d={last['elements-per-client']} "
                    f"seed={last['seed']} ratio@{last['k']}={last['ratio']:.4f}"
                )
                bar.update(1)
                write_sweep(rows, out / "sweep.csv")  # keep partial results if interrupted
    finally:
        if engine is not None:
            engine.close()
    frame = write_sweep(rows, out / "sweep.csv")
    elapsed = time.perf_counter() - started
    table = make_table(frame)
    table.to_csv(out / "table.csv", index=False)
    figures = make_figures(frame, out, args.fixed_clients, args.fixed_elements)
    print(markdown_ratio_table(table))
    print(f"\n{len(grid)} runs in {elapsed:.1f} s; wrote {out / 'sweep.csv'}, {out / 'table.csv'}")
    for fig in figures:
        print(f"figure: {fig}")
    return frame


# --------------------------------------------------------------------------- tables


def read_sweep(path: Path) -> pd.DataFrame:
    """Read a ``sweep.csv`` keeping the K and d specs as written (``"1"`` vs ``"1.0"``)."""
    frame = pd.read_csv(path, dtype=_SPEC_COLUMNS)
    missing = [c for c in SWEEP_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} is not a sweep.csv: missing columns {missing}")
    return frame


def make_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std (ddof=1) over seeds per (dataset, K, d, k).

    Parameters
    ----------
    frame : pandas.DataFrame
        Sweep rows.

    Returns
    -------
    pandas.DataFrame
        Columns dataset, clients-per-round, elements-per-client, K, d, k, seeds,
        objective-mean/-std, greedy-objective, ratio-mean/-std, random-objective-mean/-std,
        user-values, wall-time-mean.
    """
    keys = ["dataset", "clients-per-round", "elements-per-client", "K", "d", "k"]
    grouped = frame.groupby(keys, sort=False)
    table = grouped.agg(
        seeds=("seed", "nunique"),
        **{
            "objective-mean": ("objective", "mean"),
            "objective-std": ("objective", "std"),
            "greedy-objective": ("greedy-objective", "mean"),
            "ratio-mean": ("ratio", "mean"),
            "ratio-std": ("ratio", "std"),
            "random-objective-mean": ("random-objective", "mean"),
            "random-objective-std": ("random-objective", "std"),
            "user-values": ("user-values", "mean"),
            "wall-time-mean": ("wall-time", "mean"),
        },
    ).reset_index()
    return table.sort_values(["K", "d", "k"], kind="stable").reset_index(drop=True)


def markdown_ratio_table(table: pd.DataFrame) -> str:
    """Return markdown tables of the ratio F(S)/F(greedy), "mean ± std" over seeds.

    Parameters
    ----------
    table : pandas.DataFrame
        Output of :func:`make_table`.

    Returns
    -------
    str
        One table per K (k rows, one column per d), or a single table when the sweep has
        one K; each preceded by a bold K heading.
    """
    blocks = []
    for c_spec in _ordered_specs(table, "clients-per-round", "K"):
        sub = table[table["clients-per-round"] == c_spec]
        elements = _ordered_specs(sub, "elements-per-client", "d")
        seeds = int(sub["seeds"].max())
        cells = []
        for k in sorted(sub["k"].unique()):
            cells.append([str(k)])
            for e_spec in elements:
                row = sub[(sub["elements-per-client"] == e_spec) & (sub["k"] == k)]
                mean, std = float(row["ratio-mean"].iloc[0]), float(row["ratio-std"].iloc[0])
                cells[-1].append(f"{mean:.4f} ± {0.0 if math.isnan(std) else std:.4f}")
        heading = (
            f"**{spec_label(c_spec, 'K')}** (K = {int(sub['K'].iloc[0])} users per round; "
            f"ratio to centralized greedy, mean ± std over {seeds} seed(s))"
        )
        header = ["k"] + [spec_label(e, "d") for e in elements]
        blocks.append("\n".join([heading, "", *markdown_table(header, cells)]))
    return "\n\n".join(blocks)


# --------------------------------------------------------------------------- figures


def _ordered_specs(frame: pd.DataFrame, spec: str, count: str) -> list[str]:
    pairs = frame[[spec, count]].drop_duplicates().sort_values(count)
    return list(pairs[spec])


def _pick(specs: list[str], wanted: str | None, what: str) -> str:
    if wanted is None:
        return specs[0]
    for s in specs:
        if parse_count(s) == parse_count(str(wanted)) and type(parse_count(s)) is type(
            parse_count(str(wanted))
        ):
            return s
    raise ValueError(f"{what} {wanted!r} is not in the sweep; it has {', '.join(specs)}")


def _references(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Greedy F, random-selection mean F and its std per k (random depends on seed only)."""
    greedy = frame.groupby("k")["greedy-objective"].mean()
    per_seed = frame.drop_duplicates(["seed", "k"]).groupby("k")["random-objective"]
    return greedy, per_seed.mean(), per_seed.std().fillna(0.0)


def _curve(ax: Any, sub: pd.DataFrame, label: str, metric: str, style: dict) -> None:
    stats = sub.groupby("k")[metric].agg(["mean", "std"]).fillna(0.0)
    ax.errorbar(
        stats.index,
        stats["mean"],
        yerr=stats["std"],
        label=label,
        capsize=3,
        marker="o",
        markersize=3.5,
        linewidth=1.4,
        **style,
    )


def _reference_lines(ax: Any, frame: pd.DataFrame, ratio: bool) -> None:
    greedy, rnd, rnd_std = _references(frame)
    if ratio:  # random selection (ratio ~0.2-0.5) would squash the FedSM curves: left out
        ax.plot(
            greedy.index,
            np.ones(len(greedy)),
            color="black",
            linewidth=1.6,
            label="Centralized greedy",
        )
    else:
        ax.plot(
            greedy.index,
            greedy.values,
            color="black",
            linewidth=1.6,
            marker="s",
            markersize=3.5,
            label="Centralized greedy",
        )
        ax.errorbar(
            rnd.index,
            rnd.values,
            yerr=rnd_std.values,
            color="gray",
            linestyle="--",
            capsize=2,
            label="Random selection",
        )


def _trade_off_figure(
    frame: pd.DataFrame, path: Path, fixed_k: str, fixed_d: str, ratio: bool
) -> Path:
    from matplotlib import colormaps

    metric = "ratio" if ratio else "objective"
    clients = _ordered_specs(frame, "clients-per-round", "K")
    elements = _ordered_specs(frame, "elements-per-client", "d")
    panels = []
    if len(elements) > 1 or len(clients) == 1:
        panels.append(("d", frame[frame["clients-per-round"] == fixed_k], elements, fixed_k))
    if len(clients) > 1:
        panels.append(("K", frame[frame["elements-per-client"] == fixed_d], clients, fixed_d))
    colors = colormaps["viridis"]
    dataset = frame["dataset"].iloc[0]
    size = (6.2 * len(panels), 4.4)
    with figure(path, 1, len(panels), figsize=size, squeeze=False, dpi=130) as (fig, axes):
        _trade_off_panels(frame, axes[0], panels, metric, ratio, colors, dataset)
        seeds = frame["seed"].nunique()
        fig.suptitle(f"FedSM Algorithm 1, mean ± std over {seeds} seed(s)", fontsize=10)
    return path


def _trade_off_panels(
    frame: pd.DataFrame, axes: Any, panels: list, metric: str, ratio: bool, colors: Any,
    dataset: str,
) -> None:  # fmt: skip
    for ax, (vary, sub, values, fixed) in zip(axes, panels, strict=True):
        column = "elements-per-client" if vary == "d" else "clients-per-round"
        for i, value in enumerate(values):
            style = {"color": colors(0.1 + 0.8 * i / max(len(values) - 1, 1))}
            _curve(
                ax, sub[sub[column] == value], f"FedSM, {spec_label(value, vary)}", metric, style
            )
        _reference_lines(ax, frame, ratio)
        other = "K" if vary == "d" else "d"
        ax.set_title(f"{dataset}: varying {vary} at fixed {spec_label(fixed, other)}")
        ax.set_xticks(sorted(frame["k"].unique()))
        ax.set_xlabel("k (elements selected = communication rounds)")
        ax.set_ylabel("F(S) / F(greedy)" if ratio else "F(S)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def _grid_figure(frame: pd.DataFrame, path: Path) -> Path:
    clients = _ordered_specs(frame, "clients-per-round", "K")
    elements = _ordered_specs(frame, "elements-per-client", "d")
    size = (3.4 * len(elements), 2.8 * len(clients))
    with figure(path, len(clients), len(elements), figsize=size, squeeze=False, sharex=True,
                sharey=True, dpi=110) as (fig, axes):  # fmt: skip
        _grid_panels(frame, axes, clients, elements)
        fig.suptitle(
            f"{frame['dataset'].iloc[0]}: FedSM Algorithm 1 vs centralized greedy "
            f"(mean ± std over {frame['seed'].nunique()} seed(s))",
            fontsize=10,
        )
    return path


def _grid_panels(frame: pd.DataFrame, axes: Any, clients: list[str], elements: list[str]) -> None:
    for r, c_spec in enumerate(clients):
        for c, e_spec in enumerate(elements):
            ax = axes[r][c]
            sub = frame[
                (frame["clients-per-round"] == c_spec) & (frame["elements-per-client"] == e_spec)
            ]
            _curve(ax, sub, "FedSM Alg. 1", "objective", {"color": "tab:blue"})
            _reference_lines(ax, frame, ratio=False)
            ax.set_title(f"{spec_label(c_spec, 'K')}, {spec_label(e_spec, 'd')}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.set_xticks(sorted(frame["k"].unique()))
            if r == len(clients) - 1:
                ax.set_xlabel("k")
            if c == 0:
                ax.set_ylabel("F(S)")
    axes[0][0].legend(fontsize=7)


def make_figures(
    frame: pd.DataFrame,
    out: Path,
    fixed_clients: str | None = None,
    fixed_elements: str | None = None,
) -> list[Path]:
    """Draw the paper-style figures of a sweep into ``out``.

    Parameters
    ----------
    frame : pandas.DataFrame
        Sweep rows of one dataset.
    out : pathlib.Path
        Folder for the PNGs.
    fixed_clients, fixed_elements : str, optional
        K held fixed while d varies, and d held fixed while K varies (as written in the
        sweep, e.g. ``"0.01"``); default: the smallest of each, as in the paper's
        Figures 1 and 2 (K = 1%, d = 10% on MovieLens; K = 1%, d = 1% on DBLP).

    Returns
    -------
    list of pathlib.Path
        ``objective_vs_k.png`` (Figures 1-2 style, with the centralized greedy and
        random-selection lines), ``ratio_vs_k.png`` (the same as F(S)/F(greedy), without
        the random line so the gaps stay visible) and ``grid.png`` (rows K, columns d, like
        Appendix D Figure 5).
    """
    datasets = frame["dataset"].unique()
    if len(datasets) != 1:
        raise ValueError(f"a sweep.csv should hold one dataset, this one has {list(datasets)}")
    frame = frame.astype({"clients-per-round": str, "elements-per-client": str})
    clients = _ordered_specs(frame, "clients-per-round", "K")
    elements = _ordered_specs(frame, "elements-per-client", "d")
    fixed_k = _pick(clients, fixed_clients, "--fixed-clients")
    fixed_d = _pick(elements, fixed_elements, "--fixed-elements")
    out.mkdir(parents=True, exist_ok=True)
    return [
        _trade_off_figure(frame, out / "objective_vs_k.png", fixed_k, fixed_d, ratio=False),
        _trade_off_figure(frame, out / "ratio_vs_k.png", fixed_k, fixed_d, ratio=True),
        _grid_figure(frame, out / "grid.png"),
    ]


def run_plot(args: argparse.Namespace) -> list[Path]:
    """Re-make table.csv and the figures from an existing sweep.csv."""
    path = Path(args.sweep).expanduser()
    if path.is_dir():
        path = path / "sweep.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no sweep.csv at {path}")
    frame = read_sweep(path)
    out = Path(args.out).expanduser() if args.out else path.parent
    out.mkdir(parents=True, exist_ok=True)
    table = make_table(frame)
    table.to_csv(out / "table.csv", index=False)
    figures = make_figures(frame, out, args.fixed_clients, args.fixed_elements)
    print(markdown_ratio_table(table))
    for fig in figures:
        print(f"figure: {fig}")
    return figures


# --------------------------------------------------------------------------- CLI

#: datasets ``fedsm-sweep`` runs: every dataset FedSM accepts (your own files by --data-file)
DATASETS_RUN = runnable_datasets("fedsm", data_file=True)


def _add_figure_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fixed-clients",
        metavar="K",
        default=None,
        help="K held fixed in the 'varying d' panel, as written in the grid (default: the "
        "smallest K, like the paper's K = 1%%)",
    )
    p.add_argument(
        "--fixed-elements",
        metavar="D",
        default=None,
        help="d held fixed in the 'varying K' panel (default: the smallest d)",
    )


def add_parsers(sub: Any) -> None:
    """Add the ``fedsm-sweep`` and ``plot`` subcommands to ``run_sim.py``'s parser.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of :func:`reproductions.cli.build_parser`.
    """
    sweep = sub.add_parser(
        "fedsm-sweep",
        help="FedSM Algorithm 1 over a K x d x seed grid: sweep.csv, table.csv, figures",
        description="Run FedSM Algorithm 1 for every (K, d, seed), each once to max(--k), and "
        "write <out>/sweep.csv (one row per K, d, seed, k), <out>/table.csv (mean and "
        "std over seeds), objective_vs_k.png, ratio_vs_k.png and grid.png; run folders go "
        "to <out>/runs/.",
        epilog="K and d: a float in (0, 1] is a fraction (of the n users, of the m elements; "
        "floor, at least 1), an integer is an absolute count. One run per (K, d, seed) to "
        "max(--k) gives every k (Algorithm 1 draws its randomness round by round).",
    )
    # options named after a run_config key take its help from flower_app.settings
    add_dataset(sweep, DATASETS_RUN)
    sweep.add_argument("--data-file", default="", help=help_text("data-file"))
    sweep.add_argument("--data-columns", default="user,item,value", help=help_text("data-columns"))
    sweep.add_argument("--item-names", default="", help=help_text("item-names"))
    sweep.add_argument("--data-seed", type=int, default=0, help=help_text("data-seed"))
    add_sizes(sweep)
    sweep.add_argument(
        "--k",
        type=int,
        nargs="+",
        required=True,
        metavar="K_SIZE",
        help="set sizes to report, e.g. 5 10 15 20 25 30",
    )
    sweep.add_argument(
        "--clients",
        type=parse_count,
        nargs="+",
        required=True,
        metavar="K",
        help="K values: users sampled per round (fraction or count)",
    )
    sweep.add_argument(
        "--elements",
        type=parse_count,
        nargs="+",
        required=True,
        metavar="D",
        help="d values: elements each user evaluates (fraction of m or count)",
    )
    add_seeds(sweep)
    sweep.add_argument("--out", required=True, help="output folder")
    sweep.add_argument(
        "--engine",
        choices=["direct", "flower"],
        default="direct",
        help="direct: in-process (default); flower: `flwr run . --stream` per "
        "run with a private local SuperLink (slow: Ray)",
    )
    add_jobs(sweep, "parallel processes for the direct engine")
    sweep.add_argument(
        "--num-supernodes", type=int, default=10, help="SuperNodes for --engine flower (default 10)"
    )
    sweep.add_argument(
        "--matroid", choices=list(MATROIDS), default="uniform", help=help_text("matroid")
    )
    sweep.add_argument(
        "--partition-capacity", type=int, default=2, help=help_text("partition-capacity")
    )
    sweep.add_argument(
        "--rng", choices=["per-user", "batched"], default="per-user", help=help_text("fedsm-rng")
    )
    _add_figure_options(sweep)

    plot = sub.add_parser(
        "plot",
        help="re-make table.csv and the figures of a fedsm-sweep from its sweep.csv",
        description="Read a sweep.csv (or a folder holding one) and re-write table.csv, "
        "objective_vs_k.png, ratio_vs_k.png and grid.png next to it (or into --out).",
    )
    plot.add_argument("sweep", help="sweep.csv, or the folder that holds it")
    plot.add_argument("--out", default=None, help="output folder (default: the CSV's folder)")
    _add_figure_options(plot)


def run_command(args: argparse.Namespace) -> None:
    """Run a parsed ``fedsm-sweep`` or ``plot`` command (``args.command``).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of :func:`reproductions.cli.build_parser`.
    """
    if args.command == "fedsm-sweep":
        run_sweep(args)
    else:
        run_plot(args)
