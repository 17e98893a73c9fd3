"""FedCG with and without the zero-gradient filler (``fedcg-fill-base``): time and objective.

On a coverage instance shaped like a shopping-trip set system (items bought together per
trip; the ``synthetic-dblp`` generator at 48,482 users × 57,910 elements, ~2.5 elements per
user;
k = 10, T = 20 rounds, 10 % of the users per round, seed 0) runs FedCG on the direct engine
(the runner's own server construction) with ``fedcg-fill-base`` true and false, and
records the time of the T rounds, the support of the final x (its fractional coordinates),
the time of greedy, pipage and swap rounding of that x, and F(S)/greedy for greedy and
pipage rounding and F̂(x)/greedy. Results go to ``fill_base.csv`` / ``fill_base.md`` in
``--out`` (git-ignored)::

    nice -n 10 .venv/bin/python benchmarks/fedcg_fill_base.py
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from direct.fedcg import run_fedcg_direct
from flower_app.algorithms.fedcg.continuous import round_point
from flower_app.config import AppConfig
from flower_app.problems import build_matroid, load_problem
from flower_app.runners.fedcg import fedcg_server
from flower_app.submodular.greedy import lazy_greedy
from flower_app.submodular.multilinear import multilinear_value

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn):  # noqa: ANN001, ANN202 - tiny helper
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(args: argparse.Namespace, fill: bool) -> dict:
    """One FedCG run; returns its row."""
    cfg = AppConfig.from_run_config(
        {
            "algorithm": "fedcg",
            "dataset": "synthetic-dblp",
            "num-users": args.users,
            "num-elements": args.elements,
            "k": args.k,
            "fedcg-rounds": args.rounds,
            "clients-per-round": args.clients,
            "seed": args.seed,
            "fedcg-fill-base": fill,
        }
    )
    problem = load_problem(cfg)
    matroid = build_matroid(cfg, problem)
    obj = problem.objective
    greedy_value = lazy_greedy(obj, matroid).values[-1]  # F = mean over users
    server = fedcg_server(cfg, problem, matroid)
    t_rounds, selected = _timed(lambda: run_fedcg_direct(obj, server))  # greedy rounding
    x = server.x
    frac = int(np.count_nonzero((x > 1e-9) & (x < 1 - 1e-9)))
    rng = np.random.default_rng([args.seed, 1])
    t_greedy, greedy_set = _timed(lambda: round_point(x, matroid, "greedy", rng))
    t_pipage, pipage_set = _timed(lambda: round_point(x, matroid, "pipage", rng))
    t_swap, swap_set = _timed(lambda: round_point(x, matroid, "swap", rng))
    assert greedy_set == selected
    return {
        "fill-base": fill,
        "rounds-s": t_rounds,
        "fractional": frac,
        "x-mass": float(x.sum()),
        "greedy-rounding-s": t_greedy,
        "pipage-s": t_pipage,
        "pipage-reference-s (extrapolated)": 16.9 * (frac / 8000) ** 2,
        "swap-s": t_swap,
        "F(S)/greedy": obj.mean_value(selected) / greedy_value,
        "pipage/greedy": obj.mean_value(pipage_set) / greedy_value,
        "swap/greedy": obj.mean_value(swap_set) / greedy_value,
        "F^(x)/greedy": multilinear_value(obj, x) / obj.n_users / greedy_value,
    }


def main() -> None:
    """Run both settings and write the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--users", type=int, default=48_482)
    p.add_argument("--elements", type=int, default=57_910)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rounding")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for fill in (True, False):
        rows.append(measure(args, fill))
        print(rows[-1], flush=True)
    with (args.out / "fill_base.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    cols = list(rows[0])

    def fmt(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v).lower()

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    (args.out / "fill_base.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
