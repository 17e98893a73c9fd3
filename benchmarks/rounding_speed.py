"""Time pipage and swap rounding against the first (quadratic) implementation.

For n fractional coordinates (default 2,000, 4,000, 8,000, 57,910 — the ground set of a
FedCG run on a shopping-trip set system, items bought together per trip — and 100,000),
draws x uniformly, scales it to a base of the uniform matroid U(n, n/4) (every coordinate
fractional, as FedCG's zero-gradient filler leaves x) and of a partition matroid (blocks of
100 elements, capacity 25), and times:

* ``pipage_rounding`` (``method="fast"``, the default) and ``method="reference"`` (the
  first implementation; only up to ``--reference-max`` coordinates, 8,000 by default), and
  checks that both return the same set for the same seed;
* ``swap_rounding`` (new; there is no earlier implementation);
* ``greedy_rounding`` and the first greedy rounding (one independence check per element),
  also up to ``--reference-max``.

Each time is the best of ``--repeat`` runs (1 for the reference). Results go to
``results.csv`` / ``results.md`` in ``--out`` (git-ignored). Run it niced on a shared
machine::

    nice -n 10 .venv/bin/python benchmarks/rounding_speed.py
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid
from flower_app.submodular.rounding import (
    complete_by_scan,
    greedy_rounding,
    pipage_rounding,
    swap_rounding,
)

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = [
    "matroid",
    "n",
    "rank",
    "pipage-fast-s",
    "pipage-reference-s",
    "speed-up",
    "same-set",
    "swap-s",
    "greedy-s",
    "greedy-reference-s",
]


def _best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _instance(kind: str, n: int, seed: int) -> tuple[Matroid, np.ndarray]:
    x = np.random.default_rng(seed).uniform(0.05, 1.0, n)
    if kind == "uniform":
        matroid: Matroid = UniformMatroid(n, n // 4)
        x *= (n // 4) / x.sum()
    else:
        groups = np.arange(n) // 100
        caps = np.maximum(np.bincount(groups) // 4, 1)  # 25 (a last short block: a quarter)
        matroid = PartitionMatroid(groups, caps)
        x *= (caps / np.bincount(groups, weights=x))[groups]
    assert x.min() > 0 and x.max() < 1, "every coordinate must be fractional"
    return matroid, x


def measure(kind: str, n: int, repeat: int, reference_max: int, seed: int) -> dict:
    """One row of the table: times in seconds, '' where not run."""
    matroid, x = _instance(kind, n, seed)
    t_fast, fast = _best(lambda: pipage_rounding(x, matroid, np.random.default_rng(seed)), repeat)
    t_swap, swap = _best(lambda: swap_rounding(x, matroid, np.random.default_rng(seed)), repeat)
    t_greedy, greedy = _best(lambda: greedy_rounding(x, matroid), repeat)
    assert len(fast) == len(swap) == len(greedy) == matroid.rank
    row = {
        "matroid": kind,
        "n": n,
        "rank": matroid.rank,
        "pipage-fast-s": t_fast,
        "pipage-reference-s": "",
        "speed-up": "",
        "same-set": "",
        "swap-s": t_swap,
        "greedy-s": t_greedy,
        "greedy-reference-s": "",
    }
    if n <= reference_max:
        t_ref, ref = _best(
            lambda: pipage_rounding(x, matroid, np.random.default_rng(seed), method="reference"), 1
        )
        t_old_greedy, old_greedy = _best(lambda: complete_by_scan([], x, matroid), 1)
        assert old_greedy == greedy
        row.update(
            {
                "pipage-reference-s": t_ref,
                "speed-up": t_ref / t_fast,
                "same-set": ref == fast,
                "greedy-reference-s": t_old_greedy,
            }
        )
    return row


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value) if value != "" else "–"


def main() -> None:
    """Run the grid and write results.csv / results.md."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[2000, 4000, 8000, 57910, 100_000])
    p.add_argument("--matroids", nargs="+", default=["uniform", "partition"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--reference-max", type=int, default=8000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rounding")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in args.matroids:
        for n in args.sizes:
            row = measure(kind, n, args.repeat, args.reference_max, args.seed)
            rows.append(row)
            print(", ".join(f"{k}={_fmt(v)}" for k, v in row.items()), flush=True)
    with (args.out / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        "| matroid | n fractional | rank | pipage s | pipage (reference) s | speed-up | same set "
        "| swap s | greedy s | greedy (first) s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
    (args.out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
