"""FedSubAvg reproductions (Tables 2–3, Figures 3 and 4) on the direct engine.

``main(argv)`` runs every ``--algorithms`` × ``--clients`` (K) × ``--seeds`` ×
``--weightings`` combination for ``--rounds`` rounds (one run folder each under
``--out/runs/``; CentralSGD does not depend on the weighting and runs once per K and seed),
then writes into ``--out``:

``curves.csv``
    one row per (algorithm, weighting, K, seed, evaluated round): train loss on the fixed
    10,000 training samples, test loss, test accuracy or test AUC.
``rounds.csv``
    rounds to reach the target per run. The target is the paper's (Section 5.2): the minimum
    train loss of CentralSGD (K = ``--target-k``, same seed) over the horizon for the
    MovieLens and Sent140 tasks, a test AUC of 0.6 for Amazon. A run that never reaches it
    gets ``reached = 0`` and ``rounds = R``. With ``--eval-every`` E > 1 a round count is the
    first evaluated round at the target (a multiple of E: an upper bound, off by < E).
``table.md``
    the paper's Tables 2 and 3 (the task's row) beside ours: mean over seeds of the rounds
    to target (``R+`` when a seed does not reach it), and FedSubAvg / FedAvg.
``fig3_*.png``, ``fig4_*.png``
    train loss (test AUC for Amazon) against rounds (mean over seeds; band = min..max).
``summary.json``
    the same numbers plus the feature heat dispersion and the bytes per client.

Each task runs with the paper's settings unless an option overrides them (:data:`SETUPS`):
K, the horizon, the learning rate of each algorithm (Table 4), FedAdam's (η_l, η, β₁, β₂)
(Table 5), batch size and local iterations (Appendix D.3), and for Amazon the authors' code's
learning-rate decay 0.999 per round and gradient clipping at norm 5 (the paper is silent on
both). A run folder that already holds a ``summary.json`` is read instead of run again, so a
sweep can be extended seed by seed (``--rerun`` runs everything again;
:mod:`reproductions.sweep`).

Example::

    python run_sim.py fedsubavg --dataset movielens-rating --data-dir /work/data \\
        --clients 50 10 30 --seeds 0 1 2 --rounds 200 --weightings clients samples \\
        --out benchmarks/results/fedsubavg
    python run_sim.py fedsubavg --dataset synthetic-amazon --seeds 0 \\
        --eval-every 5 --out benchmarks/results/fedsubavg/amazon-standin
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flower_app.algorithms.fedsubavg.core import ALGORITHM_NAMES, WEIGHTINGS
from flower_app.results import read_rows, read_run
from flower_app.settings import SETTINGS, help_text
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

__all__ = [
    "DATASETS_RUN",
    "SETUPS",
    "PaperSetup",
    "build_parser",
    "first_round_at",
    "main",
    "rounds_to_target",
    "setup_of",
]

LABELS = {
    "central-sgd": "CentralSGD",
    "fedavg-sub": "FedAvg",
    "fedprox-sub": "FedProx",
    "scaffold-sub": "Scaffold",
    "fedadam-sub": "FedAdam",
    "fedsubavg": "FedSubAvg",
}
ORDER = tuple(LABELS)


@dataclass(frozen=True)
class PaperSetup:
    """One task of the paper's Section 5: its settings and its published numbers.

    Attributes
    ----------
    title : str
        The task, for tables and figures.
    k : int
        The default K (clients per round).
    rounds : int
        The paper's horizon (Figure 3).
    target : str
        ``"train-loss"`` (CentralSGD's minimum; lower is better) or ``"test-auc"``.
    target_value : float or None
        A fixed target (Amazon's AUC 0.6), or None for CentralSGD's minimum.
    table2, table3 : dict
        The paper's Table 2 row (by algorithm) and Table 3 row (by K).
    ratio : str
        The paper's FedSubAvg / FedAvg ratio of rounds, as printed in our table.
    weighting : str
        The weighting the paper's experiments use (Appendix D.4: data size for the
        non-linear tasks; our MovieLens reproduction defaults to Algorithm 1's).
    keys : dict
        run_config keys of every run (``"*"``) and of one algorithm (by name).
    """

    title: str
    k: int
    rounds: int
    target: str
    target_value: float | None
    table2: dict[str, str]
    table3: dict[int, str]
    ratio: str
    weighting: str = "clients"
    keys: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def run_keys(self, algorithm: str) -> dict[str, Any]:
        """Return the run_config keys of ``algorithm`` in this task."""
        return {**self.keys.get("*", {}), **self.keys.get(algorithm, {})}


#: the paper's tasks (Tables 1–5, Appendix D.3), by dataset family
SETUPS: dict[str, PaperSetup] = {
    "movielens": PaperSetup(
        title="MovieLens-1M rating classification",
        k=50, rounds=200, target="train-loss", target_value=None,
        table2={"central-sgd": "180", "fedavg-sub": "170", "fedprox-sub": "170",
                "scaffold-sub": "180", "fedadam-sub": "170", "fedsubavg": "100"},
        table3={10: "100", 30: "110", 50: "100"}, ratio="0.59",
    ),
    "sent140": PaperSetup(
        title="Sent140 sentiment analysis (LSTM)",
        k=50, rounds=1000, target="train-loss", target_value=None,
        table2={"central-sgd": "980", "fedavg-sub": "1,000+", "fedprox-sub": "1,000+",
                "scaffold-sub": "1,000+", "fedadam-sub": "1,000+", "fedsubavg": "260"},
        table3={10: "420", 30: "270", 50: "260"}, ratio="< 0.26", weighting="samples",
        keys={"*": {"fsa-lr": 0.1, "fsa-batch-size": 5, "fsa-local-iters": 10},
              "fedadam-sub": {"fsa-lr": 1.0, "fsa-adam-eta": 1.0, "fsa-adam-beta1": 0.9,
                              "fsa-adam-beta2": 0.99}},
    ),
    "amazon": PaperSetup(
        title="Amazon CTR prediction (DIN)",
        k=100, rounds=200, target="test-auc", target_value=0.6,
        table2={"central-sgd": "20", "fedavg-sub": "200+", "fedprox-sub": "200+",
                "scaffold-sub": "200+", "fedadam-sub": "16", "fedsubavg": "53"},
        table3={20: "95", 60: "57", 100: "53"}, ratio="< 0.27", weighting="samples",
        keys={"*": {"fsa-lr": 0.1, "fsa-batch-size": 4, "fsa-local-iters": 10,
                    "fsa-lr-decay": 0.999, "fsa-clip-norm": 5.0},
              "central-sgd": {"fsa-lr": 0.05}, "fedsubavg": {"fsa-lr": 0.05},
              "fedadam-sub": {"fsa-lr": 0.1, "fsa-adam-eta": 0.001, "fsa-adam-beta1": 0.9,
                              "fsa-adam-beta2": 0.999}},
    ),
}  # fmt: skip


def setup_of(dataset: str) -> PaperSetup:
    """Return the paper's setup of ``dataset`` (its stand-in and own tables included)."""
    for family in ("sent140", "amazon"):
        if family in dataset:
            return SETUPS[family]
    return SETUPS["movielens"]


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


def first_round_at(
    by_round: Mapping[int, float], target: float, higher_is_better: bool = False
) -> int | None:
    """Return the first evaluated round (≥ 1) at the target, or None.

    Parameters
    ----------
    by_round : mapping of int to float
        A metric by evaluated round (round 0, the initial model, is ignored).
    target : float
        The target value.
    higher_is_better : bool, optional
        True for an AUC (reached when ≥ target), False for a loss (≤ target).

    Returns
    -------
    int or None
        The round, or None if the metric never reaches the target.
    """
    for t in sorted(r for r in by_round if r >= 1):
        v = by_round[t]
        if (v >= target - 1e-12) if higher_is_better else (v <= target + 1e-12):
            return t
    return None


def _series(summary: Mapping[str, Any], metric: str) -> dict[int, float]:
    """Return ``metric`` by round ≥ 1 from a run summary (a list from round 1, or a dict)."""
    values = summary.get(f"{metric}-by-round")
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return {int(t): float(v) for t, v in values.items() if int(t) >= 1}
    return {t: float(v) for t, v in enumerate(values, start=1)}


def _run(
    args: argparse.Namespace, setup: PaperSetup, algorithm: str, k: int, seed: int,
    weighting: str,
) -> Run:  # fmt: skip
    name = f"{algorithm}-{weighting}-K{k}-seed{seed}"
    if args.embedding_init != "random":  # a run folder per initialisation
        name += f"-{args.embedding_init}-embedding"
    keys = {
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
        **setup.run_keys(algorithm),
    }
    if args.eval_every != 1:
        keys["fsa-eval-every"] = args.eval_every
    if args.embedding_init != "random":
        keys["fsa-embedding-init"] = args.embedding_init
    labels = {"algorithm": algorithm, "weighting": weighting, "k": k, "seed": seed}
    return Run(name, keys, labels)


def _fmt_rounds(values: list[int | None], horizon: int) -> str:
    if any(v is None for v in values):
        reached = [v for v in values if v is not None]
        return f"{horizon}+ ({len(reached)}/{len(values)} seeds)"
    return f"{np.mean(values):.1f}"


#: datasets the sweep runs: FedSubAvg's, but not your own table (no --data-file here)
DATASETS_RUN = runnable_datasets("fedsubavg")


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of ``run_sim.py fedsubavg``."""
    p = argparse.ArgumentParser(
        prog="run_sim.py fedsubavg",
        description="FedSubAvg and the submodel baselines (CentralSGD, FedAvg, FedProx, "
        "FedAdam, SCAFFOLD) with the paper's settings, on the direct engine: every "
        "algorithm x K x seed x weighting, then curves.csv, rounds.csv (rounds to the "
        "target), table.md (Tables 2-3 beside the paper's), fig3/fig4 PNGs and "
        "summary.json in --out. Runs that already have a summary.json are read, not rerun.",
    )
    add_dataset(p, DATASETS_RUN, "movielens-rating")
    p.add_argument("--data-seed", type=int, default=0, help=help_text("data-seed"))
    p.add_argument("--num-users", type=int, default=0,
                   help="users (clients) of a synthetic stand-in (0 = its default)")  # fmt: skip
    p.add_argument("--num-movies", type=int, default=0,
                   help="movies of synthetic-movielens-rating (0 = its default)")  # fmt: skip
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHM_NAMES),
                   choices=ALGORITHM_NAMES, metavar="ALGORITHM",
                   help="algorithms run at --target-k: " + ", ".join(ALGORITHM_NAMES)
                   + " (default: all)")  # fmt: skip
    p.add_argument("--clients", nargs="+", type=int, default=None,
                   help="K values (default: the paper's K of the task)")  # fmt: skip
    p.add_argument(
        "--k-algorithms",
        nargs="+",
        default=["fedsubavg"],
        choices=ALGORITHM_NAMES,
        metavar="ALGORITHM",
        help="algorithms run at the K values other than --target-k (Table 3; default: "
        "fedsubavg)",
    )
    p.add_argument(
        "--target-k", type=int, default=None,
        help="K whose CentralSGD run sets the target loss (default: the paper's K)",
    )  # fmt: skip
    add_seeds(p)
    p.add_argument("--rounds", type=int, default=None, help="default: the paper's horizon")
    p.add_argument("--eval-every", type=int, default=1, help="evaluate every E rounds")
    p.add_argument("--embedding-init", default="random",
                   choices=SETTINGS["fsa-embedding-init"].choices,
                   help=help_text("fsa-embedding-init"))  # fmt: skip
    p.add_argument("--weightings", nargs="+", default=None, choices=WEIGHTINGS,
                   help="default: the paper's (samples for Sent140 and Amazon)")  # fmt: skip
    p.add_argument("--out", default="benchmarks/results/fedsubavg",
                   help="results folder (default: benchmarks/results/fedsubavg)")  # fmt: skip
    p.add_argument("--rerun", action="store_true", help="run again runs that have a summary")
    p.add_argument("--progress", action="store_true", help="a progress bar per run")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep and write the tables and figures (see the module docstring).

    Parameters
    ----------
    argv : sequence of str, optional
        Command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status (0, or 2 on bad input: :func:`reproductions.sweep.run_command`).
    """
    return run_command(build_parser(), _sweep, argv)


def _sweep(args: argparse.Namespace) -> None:
    setup = setup_of(args.dataset)
    if args.target_k is None:  # the paper's K, unless --clients leaves it out
        args.target_k = setup.k if not args.clients or setup.k in args.clients else args.clients[0]
    args.clients = args.clients or [args.target_k]
    args.rounds = args.rounds or setup.rounds
    args.weightings = args.weightings or [setup.weighting]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    grid: list[Run] = []
    for k in [args.target_k] + [k for k in args.clients if k != args.target_k]:
        algorithms = args.algorithms if k == args.target_k else args.k_algorithms
        if "central-sgd" not in algorithms and k == args.target_k and setup.target_value is None:
            algorithms = ["central-sgd", *algorithms]
        for algorithm in algorithms:
            weightings = [args.weightings[0]] if algorithm == "central-sgd" else args.weightings
            for weighting in weightings:
                grid += [_run(args, setup, algorithm, k, seed, weighting) for seed in args.seeds]
    sweep = Sweep(out)
    todo = grid if args.rerun else [r for r in grid if not sweep.finished(r)]
    summaries = {r.name: read_run(sweep.folder(r)).summary for r in grid if r not in todo}
    if summaries:
        print(f"{len(summaries)} finished runs read from {sweep.runs}", flush=True)
    for run, s in sweep.execute(todo, progress=args.progress):
        summaries[run.name] = s
        print(
            f"{run.labels['algorithm']:13s} {run.labels['weighting']:8s} "
            f"K={run.labels['k']:<4d} seed={run.labels['seed']} "
            f"min loss {s['min-train-loss']:.5f}  {s['wall-time']:.1f} s",
            flush=True,
        )
    runs = [{**r.labels, "summary": summaries[r.name]} for r in grid]

    if setup.target_value is None:
        targets = {  # CentralSGD's best train loss after a round (round 0 is the initial model)
            r["seed"]: min(_series(r["summary"], "train-loss").values())
            for r in runs
            if r["algorithm"] == "central-sgd" and r["k"] == args.target_k
        }
    else:
        targets = {seed: setup.target_value for seed in args.seeds}
    _write_curves(out, runs)
    rows = _write_rounds(out, runs, targets, args.rounds, setup)
    table = _table(rows, args, setup)
    (out / "table.md").write_text(table, encoding="utf-8")
    _plots(out, runs, args, setup)
    first = runs[0]["summary"]
    heat_keys = [
        k for k in first if "heat" in k or k.startswith(("client-", "full-model", "rows-"))
    ]
    summary = {
        "dataset": first["dataset"],
        "rounds": args.rounds,
        "eval-every": args.eval_every,
        "embedding-init": args.embedding_init,
        "seeds": args.seeds,
        "target-metric": setup.target,
        "targets": {str(s): t for s, t in targets.items()},
        "rounds-to-target": rows,
        **{k: first[k] for k in heat_keys},
        "wall-time": time.perf_counter() - t0,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(table)


def _write_curves(out: Path, runs: list[dict[str, Any]]) -> None:
    metrics = ("train-loss", "test-loss", "test-accuracy", "test-auc")
    rows = [
        {**{key: r[key] for key in ("algorithm", "weighting", "k", "seed")},
         "round": m["server-round"], **{key: m.get(key) for key in metrics}}
        for r in runs
        for m in read_rows(r["summary"]["run-folder"])
        if "train-loss" in m  # a round without an evaluation is left out
    ]  # fmt: skip
    write_csv(out / "curves.csv", rows, ["algorithm", "weighting", "k", "seed", "round", *metrics])


def _write_rounds(
    out: Path, runs: list[dict[str, Any]], targets: dict[int, float], horizon: int,
    setup: PaperSetup,
) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    higher = setup.target == "test-auc"
    for r in runs:
        series = _series(r["summary"], setup.target)
        target = targets.get(r["seed"])
        hit = None if target is None else first_round_at(series, target, higher)
        s = r["summary"]
        row = {
            "algorithm": r["algorithm"],
            "weighting": r["weighting"],
            "k": r["k"],
            "seed": r["seed"],
            "target": target,
            "reached": int(hit is not None),
            "rounds": hit if hit is not None else horizon,
            "min-train-loss": s["min-train-loss"],
            "final-test-accuracy": s.get("test-accuracy"),
        }
        if higher:
            row["final-test-auc"] = s.get("test-auc")
            row["best-test-auc"] = max(series.values()) if series else None
        rows.append(row)
    write_csv(out / "rounds.csv", rows)
    return rows


def _table(rows: list[dict[str, Any]], args: argparse.Namespace, setup: PaperSetup) -> str:
    groups = group_by(rows, ("algorithm", "weighting", "k"))

    def cell(alg: str, weighting: str, k: int) -> tuple[str, float | None]:
        g = groups.get((alg, weighting, k)) or groups.get((alg, args.weightings[0], k))
        if not g:
            return "–", None
        vals = [x["rounds"] if x["reached"] else None for x in g]
        mean = None if None in vals else float(np.mean(vals))
        return _fmt_rounds(vals, args.rounds), mean

    what = (f"the test AUC {setup.target_value}" if setup.target == "test-auc" else
            f"the target train loss (CentralSGD's min, K = {args.target_k}, per seed)")  # fmt: skip
    every = f", evaluated every {args.eval_every} rounds" if args.eval_every > 1 else ""
    init = "" if args.embedding_init == "random" else f", embedding {args.embedding_init}"
    lines = [
        f"{setup.title} ({args.dataset}): rounds to {what}, mean of seeds {args.seeds}, "
        f"horizon {args.rounds} rounds{every}{init}.",
        "",
    ]
    order = [a for a in ORDER if any(r["algorithm"] == a for r in rows)]
    body = [["paper (Table 2)", *(setup.table2[a] for a in order), setup.ratio]]
    for weighting in args.weightings:
        cells = [cell(a, weighting, args.target_k) for a in order]
        sub = cell("fedsubavg", weighting, args.target_k)[1]
        avg_text, avg = cell("fedavg-sub", weighting, args.target_k)
        if sub is None or avg_text == "–":  # FedSubAvg short of the target, or no FedAvg run
            ratio = "–"
        else:  # FedAvg's rounds, or past the horizon
            ratio = f"{sub / avg:.2f}" if avg else f"< {sub / args.rounds:.2f}"
        body.append([f"ours, weighting={weighting}", *(c[0] for c in cells), ratio])
    lines += markdown_table(["", *(LABELS[a] for a in order), "FedSubAvg / FedAvg"], body)
    ks = sorted({r["k"] for r in rows if r["algorithm"] == "fedsubavg"})
    if len(ks) > 1:
        lines += ["", "FedSubAvg's rounds to the same target by K (Table 3):", ""]
        body = [["paper", *(setup.table3.get(k, "–") for k in ks)]]
        body += [[f"ours, weighting={weighting}", *(cell("fedsubavg", weighting, k)[0] for k in ks)]
                 for weighting in args.weightings]  # fmt: skip
        lines += markdown_table(["K", *(str(k) for k in ks)], body)
    return "\n".join(lines) + "\n"


def _curves(
    runs: list[dict[str, Any]], alg: str, weighting: str, k: int, metric: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """Return (rounds, values by seed) of ``metric`` on the rounds every seed evaluated."""
    c = [
        _series(r["summary"], metric)
        for r in runs
        if r["algorithm"] == alg
        and r["k"] == k
        and (r["weighting"] == weighting or alg == "central-sgd")
    ]
    if not c or not all(c):
        return None
    rounds = sorted(set.intersection(*(set(x) for x in c)))
    return np.array(rounds), np.array([[x[t] for t in rounds] for x in c])


def _plots(
    out: Path, runs: list[dict[str, Any]], args: argparse.Namespace, setup: PaperSetup
) -> None:
    metric = setup.target
    ylabel = "test AUC" if metric == "test-auc" else "train loss (10,000 training samples)"
    name = {"train-loss": "fig3a" if setup is SETUPS["movielens"] else "fig3b",
            "test-auc": "fig3c"}[metric]  # fmt: skip
    ks = sorted({r["k"] for r in runs if r["algorithm"] == "fedsubavg"})
    for weighting in args.weightings:
        path = out / f"{name}_{weighting}_K{args.target_k}.png"
        with figure(path, figsize=(6, 4), dpi=120) as (_, ax):
            for i, alg in enumerate(LABELS):  # one colour per algorithm in every figure
                c = _curves(runs, alg, weighting, args.target_k, metric)
                if c is None:
                    continue
                r, v = c
                ax.plot(r, v.mean(axis=0), label=LABELS[alg], color=f"C{i}")
                ax.fill_between(r, v.min(axis=0), v.max(axis=0), alpha=0.2, color=f"C{i}")
            if setup.target_value is not None:
                ax.axhline(setup.target_value, color="grey", linestyle=":", linewidth=1)
            ax.set_xlabel("communication round")
            ax.set_ylabel(ylabel)
            init = "" if args.embedding_init == "random" else f", {args.embedding_init} embedding"
            ax.set_title(f"{setup.title}\n{args.dataset}{init}, K={args.target_k}, "
                         f"{weighting}, seeds {args.seeds}", fontsize=9)  # fmt: skip
            ax.legend()
        if len(ks) > 1:
            with figure(out / f"fig4_{weighting}.png", figsize=(6, 4), dpi=120) as (_, ax):
                for k in ks:
                    c = _curves(runs, "fedsubavg", weighting, k, metric)
                    if c is not None:
                        ax.plot(c[0], c[1].mean(axis=0), label=f"K={k}")
                ax.set_xlabel("communication round")
                ax.set_ylabel(ylabel)
                ax.set_title(f"FedSubAvg by K ({args.dataset}, {weighting})")
                ax.legend()


if __name__ == "__main__":
    raise SystemExit(main())
