"""The hot paths of the reproduction re-runs: today's code against the code it replaced.

``tests/test_reproduction_pins.py`` re-runs the recorded MovieLens-1M tables (FedSM Algorithms
1 and 2, FedCG's discrete greedy, FedSubAvg); most of its CPU went to the functions below, now
faster with the same results. Each is timed here (CPU seconds, ``time.process_time``, best of
``--repeats``) against a reference that is the replaced code, copied below, in the same run,
and their results are compared bit for bit (``numpy.array_equal`` / equal floats):

``user-values``
    :meth:`MaxRowObjective.user_values` (f_i(S) of every user; FedSM's oracle F(S) each round,
    the users' f_i(S)) for the centralized greedy's S of size 30 and 200, all users and a 1 %
    cohort. Reference: the mask over each user's row (O(nnz of the rows), rows copied).
``user-rng``
    :func:`~flower_app.algorithms.common.streams.user_rng` (one generator per user and round:
    FedSM's draws, FedCG's coins): creating 20,000 streams; their first draws compared.
    Reference:
    ``numpy.random.default_rng([seed, round, user])``.
``first-uniforms``
    :func:`~flower_app.algorithms.common.streams.first_uniforms` (FedCG's discrete-greedy
    coins: every user's first ``random()``), all 6,040 users. Reference: one
    ``user_rng(...).random()`` per user.
``evaluator``
    FedSubAvg's per-round evaluation (train loss on 10,000 samples, test loss and accuracy).
    Reference: ``log_loss`` and ``accuracy`` with the old row-major ``logits``.
``matroid-mask``
    :meth:`UniformMatroid.feasible_mask` of a 200-element list (Algorithm 2's feasibility
    table). Reference: the element-by-element ``int()`` conversion.

Needs MovieLens-1M (``FLOWER_APP_DATA``); writes ``docs/benchmarks/pins-hot-paths.json`` and
``.md``. The machine is shared: run it niced (``nice -n 10 python
benchmarks/pins_hot_paths.py``, about a minute); the ratios are of two CPU times measured in
the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from flower_app.algorithms.common.streams import first_uniforms, user_rng
from flower_app.algorithms.fedsubavg.core import Evaluator
from flower_app.config import AppConfig
from flower_app.datasets.movielens import facility_location_matrix, load_movielens_1m
from flower_app.runners.fedsubavg import load_task
from flower_app.submodular.greedy import greedy
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import FacilityLocation, MaxRowObjective

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "benchmarks" / "pins-hot-paths.json"


# ----------------------------------------------------------------- the replaced code
def reference_user_values(obj: MaxRowObjective, selected: list[int], users: Any) -> np.ndarray:
    """``MaxRowObjective.user_values`` as it was (row masks, rows copied)."""
    rows = obj.values if users is None else obj.values[np.asarray(users, dtype=np.int64)]
    mask = np.zeros(obj.n_elements, dtype=bool)
    mask[np.asarray(list(selected), dtype=np.int64)] = True
    data = np.where(mask[rows.indices], rows.data, 0.0)
    out = np.zeros(rows.shape[0])
    nnz_rows = np.flatnonzero(np.diff(rows.indptr))
    if nnz_rows.size:
        out[nnz_rows] = np.maximum.reduceat(data, rows.indptr[nnz_rows])
    return out


def reference_logits(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``sparse_logreg.logits`` as it was (an (n, 6) gather, columns added)."""
    w = x[rows]
    z = w[:, 0].copy()
    for c in range(1, w.shape[1]):
        z += w[:, c]
    return z


def reference_evaluate(ev: Evaluator, x: np.ndarray) -> dict[str, float]:
    """``Evaluator.__call__`` as it was (row-major rows, test logits twice)."""
    # the old Evaluator kept (n, 6) C-ordered int64 rows
    eval_rows = np.ascontiguousarray(ev.eval_columns.T)
    test_rows = np.ascontiguousarray(ev.test_columns.T)
    z = reference_logits(x, eval_rows)
    out = {"train-loss": float(np.mean(np.logaddexp(0.0, z) - ev.eval_y * z))}
    if ev.test_y.size:
        z = reference_logits(x, test_rows)
        out["test-loss"] = float(np.mean(np.logaddexp(0.0, z) - ev.test_y * z))
        out["test-accuracy"] = float(
            np.mean((reference_logits(x, test_rows) > 0) == (ev.test_y > 0.5))
        )
    return out


def reference_feasible_mask(matroid: UniformMatroid, selected: list[int]) -> np.ndarray:
    """``UniformMatroid.feasible_mask`` as it was (``int()`` per element)."""
    arr = np.fromiter((int(e) for e in selected), dtype=np.int64)
    mask = np.zeros(matroid.n_elements, dtype=bool)
    if arr.size < matroid.k:
        mask[:] = True
        mask[arr] = False
    return mask


# ----------------------------------------------------------------- timing
def cpu_best(fn: Callable[[], Any], repeats: int, inner: int = 1) -> tuple[float, Any]:
    """Best CPU time (seconds per call) over ``repeats`` runs of ``inner`` calls; the result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(inner):
            out = fn()
        best = min(best, (time.process_time() - t0) / inner)
    return best, out


def case(
    name: str,
    new: Callable[[], Any],
    ref: Callable[[], Any],
    repeats: int,
    inner: int = 1,
    same: Callable[[Any, Any], bool] = np.array_equal,
) -> dict[str, Any]:
    """Time ``new`` and ``ref``; check their results are identical."""
    ref_s, ref_out = cpu_best(ref, repeats, inner)
    new_s, new_out = cpu_best(new, repeats, inner)
    identical = bool(same(new_out, ref_out))
    row = {
        "case": name,
        "reference-cpu-s": ref_s,
        "new-cpu-s": new_s,
        "speed-up": ref_s / new_s,
        "identical": identical,
    }
    print(
        f"{name}: {ref_s * 1e3:.2f} ms -> {new_s * 1e3:.2f} ms "
        f"(x{ref_s / new_s:.2f}), identical={identical}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    """Run every case and write the JSON and Markdown files."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    ratings = facility_location_matrix(load_movielens_1m(download=False))
    obj = FacilityLocation(ratings.values)
    sets = greedy(obj, UniformMatroid(obj.n_elements, 200), 200).selected
    cohort = np.random.default_rng(0).choice(obj.n_users, obj.n_users // 100, replace=False)
    rows: list[dict[str, Any]] = []
    for size in (30, 200):
        sel = list(sets[:size])
        for who, users in (("all users", None), ("1 % cohort", np.sort(cohort))):
            rows.append(
                case(
                    f"user-values, S of size {size}, {who}",
                    lambda s=sel, u=users: obj.user_values(s, u),
                    lambda s=sel, u=users: reference_user_values(obj, s, u),
                    args.repeats,
                    inner=20,
                )
            )

    def draws(gens: list[np.random.Generator]) -> list[float]:
        return [g.random() for g in gens]

    rows.append(
        case(
            "user-rng, 20,000 streams created",
            lambda: [user_rng(3, 7, u) for u in range(20_000)],
            lambda: [np.random.default_rng([3, 7, u]) for u in range(20_000)],
            args.repeats,
            same=lambda a, b: draws(a) == draws(b),
        )
    )
    ids = np.arange(obj.n_users)
    rows.append(
        case(
            "first_uniforms (FedCG's coins), 6,040 users",
            lambda: first_uniforms(3, 7, ids),
            lambda: np.array([user_rng(3, 7, int(u)).random() for u in ids]),
            args.repeats,
        )
    )
    cfg = AppConfig.from_run_config(
        {
            "algorithm": "fedsubavg",
            "dataset": "movielens-rating",
            "data-seed": 0,
            "num-users": 0,
            "num-elements": 0,
        }
    )
    ev = Evaluator(load_task(cfg))
    x = np.random.default_rng(1).normal(0.0, 0.1, int(ev.test_columns.max()) + 1)
    rows.append(
        case(
            "fedsubavg evaluator, one round",
            lambda: ev(x),
            lambda: reference_evaluate(ev, x),
            args.repeats,
            inner=5,
            same=lambda a, b: a == b,
        )
    )
    matroid = UniformMatroid(obj.n_elements, 400)
    sel = [int(e) for e in sets]
    rows.append(
        case(
            "uniform matroid feasible_mask, S of size 200",
            lambda: matroid.feasible_mask(sel),
            lambda: reference_feasible_mask(matroid, sel),
            args.repeats,
            inner=200,
        )
    )
    result = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpus": os.cpu_count(),
            "load-before": load_before,
            "load-after": os.getloadavg()[0],
            "note": "shared machine; CPU time (process_time), best of repeats",
        },
        "instance": f"MovieLens-1M facility location {obj.n_users} x {obj.n_elements}, "
        f"{obj.values.nnz} ratings; S = the centralized greedy's first 30/200",
        "cases": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    lines = [
        "# Hot paths of the reproduction re-runs: today's code / replaced code",
        "",
        f"{result['instance']}. CPU time per call (best of {args.repeats}), both measured "
        "in the same run; `identical`: results bit for bit equal.",
        "",
        "| case | replaced (ms) | today (ms) | speed-up | identical |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['reference-cpu-s'] * 1e3:.2f} | "
            f"{r['new-cpu-s'] * 1e3:.2f} | {r['speed-up']:.2f} | {r['identical']} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
