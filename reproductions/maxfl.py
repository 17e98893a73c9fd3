"""MaxFL reproductions and sensitivity sweeps on the direct engine (``run_sim.py maxfl``).

``main(argv)`` runs every combination of ``--algorithms`` × ``--seeds`` × the ``--grid``
overrides for one ``--setting`` (the paper's Table 1, Table 2/3, Table 4 or a custom one),
writes one run folder per run under ``--out/runs/`` and then the report:

* ``sweep.csv``: the final metrics of every finished run;
* ``table.md``: mean ± std over seeds per algorithm and grid point (unfinished runs listed
  under it);
* ``curves.png`` (or ``curves-<grid point>.png``, one per grid point): seen and unseen
  GM-Appeal and test accuracy against rounds, one line per algorithm (mean over seeds,
  band = ± std), read from each run's ``metrics.jsonl`` (so unfinished runs show the
  rounds they finished);
* ``sweep.json``: the sweep's manifest (setting, grid keys, run names).

``--jobs N`` runs the grid in N processes (each run is independent and seeded, and the
report is written from the run folders, so the results are those of a serial sweep).
Runs whose folder already holds a ``summary.json`` are kept, not rerun: rerunning the same
command resumes an interrupted sweep (:mod:`reproductions.sweep`).
``--report`` (or ``report`` as the first argument) rebuilds the report from an existing
``--out`` without running anything, e.g. while a sweep is still running or after it was
interrupted (an unfinished run's last line cut mid-write is left out:
:func:`flower_app.results.read_rows`). Examples::

    python run_sim.py maxfl --setting table1 --algorithms maxfl fedavg mwfed \\
        --seeds 0 1 2 --grid maxfl-requirement=train,heldout --out benchmarks/results/maxfl/t1
    python run_sim.py maxfl report --out benchmarks/results/maxfl/t1
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flower_app.config import AppConfig
from flower_app.registry import algorithms_of
from flower_app.results import read_run
from flower_app.settings import help_text
from reproductions.sweep import (
    Run,
    Sweep,
    add_jobs,
    add_seeds,
    figure,
    group_by,
    markdown_table,
    run_command,
    slug,
    write_csv,
)

__all__ = [
    "SETTINGS",
    "RunRecord",
    "build_parser",
    "collect_runs",
    "main",
    "parse_grid",
    "plot_curves",
    "report",
    "table",
]

#: the paper's settings (Appendix D.1) as run_config overrides
SETTINGS: dict[str, dict[str, Any]] = {
    "table1": {  # Dirichlet α = 0.5, flexible participation after 10 of 200 rounds
        "dataset": "fmnist",
        "maxfl-partition": "dirichlet",
        "maxfl-alpha": 0.5,
        "maxfl-participation": "flexible",
        "clients-per-round": 5,
    },
    "table2": {  # 5 clusters of 2 labels, every selected client takes part (Tables 2, 3)
        "dataset": "fmnist",
        "maxfl-partition": "clusters",
        "maxfl-participation": "all",
        "clients-per-round": 5,
    },
    "table4": {  # Table 1's setting with 20 % Byzantine seen clients (Appendix D.2)
        "dataset": "fmnist",
        "maxfl-partition": "dirichlet",
        "maxfl-alpha": 0.5,
        "maxfl-participation": "flexible",
        "clients-per-round": 5,
        "maxfl-byzantine": 0.2,
    },
    "emnist": {
        "dataset": "synthetic-emnist",
        "maxfl-partition": "dirichlet",
        "maxfl-alpha": 0.05,
        "maxfl-participation": "flexible",
        "clients-per-round": 10,
    },
}

METRICS = (
    "seen-gm-appeal",
    "seen-acc",
    "seen-pref-acc",
    "seen-tuned-gm-appeal",
    "unseen-gm-appeal",
    "unseen-acc",
    "unseen-pref-acc",
    "unseen-tuned-gm-appeal",
)

#: the panels of the curves figure: (metric key in metrics.jsonl, title)
CURVES = (
    ("seen-gm-appeal", "seen GM-Appeal"),
    ("unseen-gm-appeal", "unseen GM-Appeal"),
    ("seen-acc", "seen test accuracy (%)"),
    ("unseen-acc", "unseen test accuracy (%)"),
    ("seen-pref-acc", "seen preferred-model accuracy (%)"),
    ("unseen-pref-acc", "unseen preferred-model accuracy (%)"),
)

#: config.json keys that never define a grid point (per-run bookkeeping)
_NOT_GRID = {"algorithm", "seed", "run-name", "output-dir", "data-dir", "engine", "settings"}


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_grid(items: Sequence[str]) -> list[dict[str, Any]]:
    """Turn ``["key=a,b", "k2=c"]`` into the list of override dicts of their product.

    Parameters
    ----------
    items : sequence of str
        ``key=v1,v2,...`` strings.

    Returns
    -------
    list of dict
        One dict per combination (``[{}]`` for no items).

    Raises
    ------
    ValueError
        If an item has no ``=`` or no value.
    """
    keys, values = [], []
    for item in items:
        key, sep, vals = item.partition("=")
        if not sep or not key or not vals:
            raise ValueError(f"grid item {item!r}: expected key=value[,value...]")
        keys.append(key)
        values.append([_value(v) for v in vals.split(",")])
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def _slug(overrides: dict[str, Any]) -> str:
    return slug("-".join(f"{k.removeprefix('maxfl-')}{v}" for k, v in overrides.items()))


def _name(algorithm: str, overrides: dict[str, Any], seed: int) -> str:
    return "-".join([algorithm] + ([_slug(overrides)] if overrides else []) + [f"seed{seed}"])


# ---------------------------------------------------------------------- running
def _plan(args: argparse.Namespace) -> tuple[list[Run], list[str]]:
    fixed: dict[str, Any] = {}
    for item in args.set:
        fixed.update(parse_grid([item])[0])
    grid = parse_grid(args.grid)
    grid_keys = list(grid[0])
    runs = [
        Run(
            _name(algorithm, overrides, seed),
            {**SETTINGS[args.setting], **fixed, **overrides, "algorithm": algorithm,
             "seed": seed, "data-dir": args.data_dir},
        )  # fmt: skip
        for overrides in grid
        for algorithm in args.algorithms
        for seed in args.seeds
    ]
    for run in runs:  # every config error before the first run
        AppConfig.from_run_config(run.config)
    return runs, grid_keys


def _merged_manifest(path: Path, new: dict[str, Any]) -> dict[str, Any]:
    """Return ``new`` joined with the manifest already at ``path`` (same setting and grid keys).

    Several invocations into one ``--out`` (e.g. each algorithm at its own tuned grid point)
    make one sweep: run names, algorithms and seeds accumulate. A different setting or
    different grid keys would mix incomparable runs in one table, so they are refused.
    """
    if not path.is_file():
        return new
    old = json.loads(path.read_text())
    for key in ("setting", "grid-keys", "set"):
        if old.get(key) != new[key]:
            raise ValueError(
                f"{path} holds a sweep with {key}={old.get(key)!r}, this one has "
                f"{key}={new[key]!r}: use another --out"
            )

    def union(a: list, b: list) -> list:
        return a + [x for x in b if x not in a]

    return {
        **new,
        "algorithms": union(old["algorithms"], new["algorithms"]),
        "seeds": union(old["seeds"], new["seeds"]),
        "runs": union(old["runs"], new["runs"]),
    }


def run_sweep(args: argparse.Namespace) -> None:
    """Run the planned runs (serially or in ``args.jobs`` processes) and write the manifest."""
    runs, grid_keys = _plan(args)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = _merged_manifest(
        args.out / "sweep.json",
        {
            "setting": args.setting,
            "algorithms": list(args.algorithms),
            "seeds": list(args.seeds),
            "grid-keys": grid_keys,
            "set": list(args.set),
            "runs": [r.name for r in runs],
        },
    )
    (args.out / "sweep.json").write_text(json.dumps(manifest, indent=2))
    sweep = Sweep(args.out)
    todo = [r for r in runs if not sweep.finished(r)]
    print(
        f"{len(todo)} runs to do ({len(runs) - len(todo)} finished before, kept), {args.jobs} "
        f"job(s); run folders in {args.out / 'runs'}",
        flush=True,
    )
    for i, (run, summary) in enumerate(sweep.execute(todo, args.jobs), 1):
        final = summary.get("final", {})
        shown = {m: final.get(m) for m in ("seen-gm-appeal", "seen-acc", "unseen-gm-appeal")}
        print(f"[{i}/{len(todo)}] {run.name}: {json.dumps(shown)}", flush=True)


# ---------------------------------------------------------------------- report
@dataclass
class RunRecord:
    """One run folder of a sweep, finished or not.

    Attributes
    ----------
    name : str
        Folder name.
    algorithm : str
        ``algorithm`` of its config.
    seed : int
        ``seed`` of its config.
    config : dict
        ``config.json``.
    rows : list of dict
        The readable lines of ``metrics.jsonl``.
    summary : dict or None
        ``summary.json`` (None: unfinished).
    overrides : dict
        The run's values of the sweep's grid keys.
    """

    name: str
    algorithm: str
    seed: int
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None
    overrides: dict[str, Any] = field(default_factory=dict)


def collect_runs(out: Path) -> tuple[list[RunRecord], list[str]]:
    """Read the run folders of the sweep in ``out`` and find its grid keys.

    With ``out/sweep.json`` (written by the sweep) the runs and grid keys are the
    manifest's; without it (a sweep of an older version) every folder under ``out/runs``
    with a ``config.json`` is read and the grid keys are the config keys whose values
    differ between runs.

    Parameters
    ----------
    out : pathlib.Path
        The sweep's ``--out`` folder.

    Returns
    -------
    tuple
        The runs (sorted by name; run folders not started yet are skipped) and the grid
        keys.

    Raises
    ------
    FileNotFoundError
        If ``out/runs`` holds no run folder.
    """
    runs_dir = Path(out) / "runs"
    manifest_path = Path(out) / "sweep.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    if manifest is not None:
        names = list(manifest["runs"])
    else:
        names = sorted(p.name for p in runs_dir.glob("*") if (p / "config.json").is_file())
    runs = []
    for name in names:
        folder = runs_dir / name
        if not (folder / "config.json").is_file():
            continue  # not started yet
        run = read_run(folder)
        runs.append(
            RunRecord(
                name=name,
                algorithm=str(run.config["algorithm"]),
                seed=int(run.config["seed"]),
                config=run.config,
                rows=run.rows,
                summary=run.summary,
            )
        )
    if not runs:
        raise FileNotFoundError(
            f"no run folder with a config.json under {runs_dir}: run the sweep first"
        )
    grid_keys = list(manifest["grid-keys"]) if manifest is not None else _infer_grid_keys(runs)
    for r in runs:
        r.overrides = {k: r.config.get(k) for k in grid_keys}
    return sorted(runs, key=lambda r: r.name), grid_keys


def _infer_grid_keys(runs: list[RunRecord]) -> list[str]:
    """Return the grid keys of a sweep without manifest.

    They are the config keys that differ between runs, or that every run's name spells
    (``<key without maxfl-><value>``, as :func:`_name` writes).
    """
    scalar = (str, int, float, bool)
    first = runs[0].config
    keys = [k for k, v in first.items() if k not in _NOT_GRID and isinstance(v, scalar)]

    def named(key: str, run: RunRecord) -> bool:
        return f"-{_slug({key: run.config.get(key)})}-" in f"-{run.name}-"

    return [
        k
        for k in keys
        if len({json.dumps(r.config.get(k)) for r in runs}) > 1 or all(named(k, r) for r in runs)
    ]


def _final_row(run: RunRecord, grid_keys: list[str]) -> dict[str, Any]:
    assert run.summary is not None
    row: dict[str, Any] = {"algorithm": run.algorithm, "seed": run.seed}
    row.update({k: run.overrides[k] for k in grid_keys})
    row.update({m: run.summary["final"].get(m) for m in METRICS})
    row["final-pool-size"] = run.summary.get("final-pool-size")
    return row


def table(rows: list[dict[str, Any]], group_keys: list[str]) -> str:
    """Return a markdown table: mean ± std over seeds of GM-Appeal and accuracies (%).

    Parameters
    ----------
    rows : list of dict
        Rows of ``sweep.csv``.
    group_keys : list of str
        Columns that define a table row (``seed`` and ``final-pool-size`` are ignored).

    Returns
    -------
    str
        The markdown table.
    """
    group_keys = [k for k in group_keys if k not in ("seed", "final-pool-size")]
    shown = list(METRICS)
    body = []
    for key, members in group_by(rows, group_keys).items():
        cells = [str(k) for k in key]
        for m in shown:
            vals = np.array([r[m] for r in members if r[m] is not None], dtype=float)
            scale = 100.0 if m.endswith("acc") else 1.0
            cells.append(
                f"{scale * vals.mean():.2f} ± {scale * vals.std():.2f}" if vals.size else ""
            )
        cells.append(str(len(members)))
        cells.append(",".join(str(r["final-pool-size"]) for r in members))
        body.append(cells)
    return "\n".join(markdown_table(group_keys + shown + ["seeds", "final pool"], body)) + "\n"


def _curve(runs: list[RunRecord], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std over ``runs`` of ``metric`` per evaluated round (runs that reached it)."""
    by_round: dict[int, list[float]] = {}
    for run in runs:
        for row in run.rows:
            if row.get(metric) is not None:
                by_round.setdefault(int(row["server-round"]), []).append(float(row[metric]))
    rounds = np.array(sorted(by_round), dtype=int)
    mean = np.array([np.mean(by_round[t]) for t in rounds])
    std = np.array([np.std(by_round[t]) for t in rounds])
    return rounds, mean, std


def plot_curves(runs: list[RunRecord], path: Path, title: str) -> Path:
    """Write a 3×2 figure of GM-Appeal, accuracy and preferred-model accuracy per round.

    Parameters
    ----------
    runs : list of RunRecord
        The runs of one grid point (any algorithms and seeds).
    path : pathlib.Path
        The PNG to write.
    title : str
        Figure title.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    algorithms = sorted({r.algorithm for r in runs})
    legend = (0, 0.06, 1, 1)  # room for the figure's legend under the panels
    with figure(path, 3, 2, figsize=(10, 10), sharex=True, dpi=120, rect=legend) as (fig, axes):
        for ax, (metric, label) in zip(axes.flat, CURVES, strict=True):
            scale = 100.0 if metric.endswith("acc") else 1.0
            for algorithm in algorithms:
                members = [r for r in runs if r.algorithm == algorithm]
                rounds, mean, std = _curve(members, metric)
                if rounds.size == 0:
                    continue
                seeds = len({r.seed for r in members})
                (line,) = ax.plot(rounds, scale * mean, label=f"{algorithm} ({seeds} seeds)")
                ax.fill_between(
                    rounds,
                    scale * (mean - std),
                    scale * (mean + std),
                    color=line.get_color(),
                    alpha=0.2,
                )
            ax.set_title(label)
            ax.grid(alpha=0.3)
        for ax in axes[-1]:
            ax.set_xlabel("round")
        handles, labels = axes[0, 0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6))
        fig.suptitle(title)
    return path


def report(out: Path) -> dict[str, Any]:
    """Write ``sweep.csv``, ``table.md`` and the curve PNGs from the run folders in ``out``.

    Parameters
    ----------
    out : pathlib.Path
        The sweep's ``--out`` folder (finished, running or interrupted).

    Returns
    -------
    dict
        ``finished`` and ``unfinished`` run names, ``figures`` (paths written).
    """
    out = Path(out)
    runs, grid_keys = collect_runs(out)
    finished = [r for r in runs if r.summary is not None]
    unfinished = [r for r in runs if r.summary is None]
    rows = [_final_row(r, grid_keys) for r in finished]
    write_csv(out / "sweep.csv", rows, ["algorithm", "seed", *grid_keys, *METRICS,
                                        "final-pool-size"])  # fmt: skip
    text = table(rows, ["algorithm", *grid_keys]) if rows else "No finished run yet.\n"
    if unfinished:
        text += "\nUnfinished runs (curves only): " + ", ".join(
            f"{r.name} (round {r.rows[-1]['server-round'] if r.rows else '-'})" for r in unfinished
        )
        text += "\n"
    (out / "table.md").write_text(text)
    points: dict[str, list[RunRecord]] = {}
    for r in runs:
        points.setdefault(json.dumps([r.overrides[k] for k in grid_keys]), []).append(r)
    figures = []
    for members in points.values():
        overrides = members[0].overrides
        slug = _slug(overrides)
        name = f"curves-{slug}.png" if slug else "curves.png"
        title = ", ".join(f"{k}={v}" for k, v in overrides.items()) or out.name
        figures.append(plot_curves(members, out / name, title))
    return {
        "finished": [r.name for r in finished],
        "unfinished": [r.name for r in unfinished],
        "figures": [str(f) for f in figures],
    }


# ---------------------------------------------------------------------- command line
#: what each --setting is, for the help
SETTING_HELP = {
    "table1": "Fashion-MNIST, Dirichlet alpha = 0.5, flexible participation after 10 "
    "mandatory rounds, K = 5 (Table 1)",
    "table2": "Fashion-MNIST, 5 clusters x 2 labels, every sampled client takes part, K = 5 "
    "(Tables 2-3)",
    "table4": "table1 with 20%% Byzantine seen clients (Table 4)",
    "emnist": "EMNIST stand-in (synthetic-emnist), Dirichlet alpha = 0.05, flexible "
    "participation, K = 10",
}


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of ``run_sim.py maxfl``."""
    p = argparse.ArgumentParser(
        prog="run_sim.py maxfl",
        description="MaxFL and its baselines in one of the paper's settings, for every "
        "algorithm x seed x grid point, on the direct engine; then sweep.csv, table.md "
        "(mean and std over seeds) and curves PNGs in --out. Runs that already have a "
        "summary.json are kept, so the same command resumes an interrupted sweep. "
        "'run_sim.py maxfl report --out DIR' only rebuilds the report.",
    )
    p.add_argument(
        "--setting", choices=sorted(SETTINGS), default="table1",
        help="the paper's setting (run_config overrides): "
        + "; ".join(f"{k}: {v}" for k, v in SETTING_HELP.items()) + " (default: table1)",
    )  # fmt: skip
    algorithms = algorithms_of("maxfl")
    p.add_argument(
        "--algorithms", nargs="+", default=["maxfl", "fedavg"], choices=algorithms,
        metavar="ALGORITHM",
        help=f"algorithms to run: {', '.join(algorithms)} (default: maxfl fedavg)",
    )  # fmt: skip
    add_seeds(p)
    p.add_argument(
        "--grid", nargs="*", default=[], metavar="KEY=V1,V2",
        help="run_config keys to sweep, each over its comma-separated values (every "
        "combination is a grid point), e.g. maxfl-lr=0.01,0.05 maxfl-local-steps=10,50",
    )  # fmt: skip
    p.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE",
        help="run_config keys fixed for every run, over the setting's (e.g. "
        "maxfl-requirement=heldout, or dataset=fmnist)",
    )  # fmt: skip
    p.add_argument("--data-dir", default="", help=help_text("data-dir"))
    p.add_argument("--out", type=Path, required=True,
                   help="results folder (run folders in <out>/runs/)")  # fmt: skip
    add_jobs(p)
    p.add_argument(
        "--report",
        action="store_true",
        help="only rebuild sweep.csv, table.md and the PNGs from the run folders in --out",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a MaxFL sweep or rebuild its report; see the module docstring for the options.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default: ``sys.argv[1:]``); a leading ``report`` means ``--report``.

    Returns
    -------
    int
        Exit status (0 on success, 2 on bad input).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        argv = [*argv[1:], "--report"]
    return run_command(build_parser(), _command, argv)


def _command(args: argparse.Namespace) -> None:
    if not args.report:
        run_sweep(args)
    done = report(args.out)
    print(
        f"{len(done['finished'])} finished, {len(done['unfinished'])} unfinished runs; "
        f"wrote {args.out / 'sweep.csv'}, {args.out / 'table.md'} and "
        f"{len(done['figures'])} figure(s)",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
