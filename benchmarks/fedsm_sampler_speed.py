"""FedSM's direct engine per round: per-user streams against the batched sampler.

Two parts, written to one JSON file (default ``docs/benchmarks/fedsm-sampler.json``):

(a) ``dblp``: FedSM Algorithm 1 on the DBLP-size stand-in (``synthetic-dblp``: 704,738
    researchers × 2,675 venues, max coverage), k = 30, K = 10 %, d = 1 %, uniform matroid,
    with ``fedsm-rng = "per-user"`` (today's draws) and ``"batched"``, ``--seeds`` seeds
    each. Per round: the wall time of the whole round (server plan, the users' step, the
    server's update, the oracle's F(S)) and of the users' step alone. Quality: F(S) / F(greedy
    S) for every seed (the greedy reference is timed too).
(b) ``sparse``: a generated sparse set system, 50,000 users × 60,000 elements, 1..7
    elements per user (Zipf-like popularity), K = 10 %, d = 40 % of m: the users' step of
    the dense draw (``"per-user"``: d of the ~60,000 elements drawn per user) against the
    support-proportional draw (``"batched"``), on the same rounds (the same S, planned by
    the batched run: both schemes are run on each round's plan).

Every ratio is of two numbers measured in the same run on the same machine. The machine is
shared (2 cores, other jobs running): times are one run's, not a minimum over repeats; the
JSON records the load average before and after. Run it niced::

    nice -n 10 python benchmarks/fedsm_sampler_speed.py            # both parts, ~4 min
    python benchmarks/fedsm_sampler_speed.py --part sparse --dense-rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun, RoundPlan, cohort_report
from flower_app.datasets.synthetic import synthetic_dblp
from flower_app.submodular.greedy import greedy
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import MaxCoverage, MaxRowObjective

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "benchmarks" / "fedsm-sampler.json"


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_rounds(obj: MaxRowObjective, k: int, params: FedSMParams, seed: int) -> dict[str, Any]:
    """Run FedSM on the direct engine, timing every round and its users' step."""
    run = FedSMRun(obj.n_users, UniformMatroid(obj.n_elements, k), k, params, 0.0, seed=seed)
    rounds, users_step = [], []
    t_start = time.perf_counter()
    while not run.done:
        t0 = time.perf_counter()
        plan = run.plan()
        t1 = time.perf_counter()
        total, _ = cohort_report(obj, plan.users, plan.users, plan, seed)
        t2 = time.perf_counter()
        run.update(total, plan.users.size)
        run.progress_value(obj)  # the direct engine's oracle F(S), as run_direct computes it
        rounds.append(time.perf_counter() - t0)
        users_step.append(t2 - t1)
    return {
        "seed": seed,
        "selected": run.selected,
        "objective": obj.mean_value(run.selected),
        "wall-s": time.perf_counter() - t_start,
        "round-s-mean": float(np.mean(rounds)),
        "round-s-median": float(np.median(rounds)),
        "users-step-s-mean": float(np.mean(users_step)),
    }


def part_dblp(k: int, seeds: list[int], data_seed: int) -> dict[str, Any]:
    """Part (a): the DBLP-size stand-in, per-user against batched, with greedy's quality."""
    t0 = time.perf_counter()
    vs = synthetic_dblp(seed=data_seed)
    obj = MaxCoverage(vs.matrix, vs.name)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = greedy(obj, UniformMatroid(obj.n_elements, k), k)
    greedy_s = time.perf_counter() - t0
    f_greedy = ref.values[-1]
    out: dict[str, Any] = {
        "instance": f"{vs.name} (data seed {data_seed}): {obj.n_users} users x "
        f"{obj.n_elements} elements, {obj.values.nnz} memberships",
        "k": k,
        "clients-per-round": 0.1,
        "elements-per-client": 0.01,
        "load-s": load_s,
        "greedy-s": greedy_s,
        "greedy-objective": f_greedy,
        "schemes": {},
    }
    for scheme in ("per-user", "batched"):
        params = FedSMParams("alg1", 0.1, 0.01, rng=scheme)
        runs = [run_rounds(obj, k, params, s) for s in seeds]
        ratios = [r["objective"] / f_greedy for r in runs]
        out["schemes"][scheme] = {
            "runs": [{key: v for key, v in r.items() if key != "selected"} for r in runs],
            "ratio-to-greedy": ratios,
            "ratio-to-greedy-mean": float(np.mean(ratios)),
            "ratio-to-greedy-min-max": [float(min(ratios)), float(max(ratios))],
            "round-s-mean": float(np.mean([r["round-s-mean"] for r in runs])),
            "users-step-s-mean": float(np.mean([r["users-step-s-mean"] for r in runs])),
        }
        print(scheme, out["schemes"][scheme]["round-s-mean"], ratios, flush=True)
    pu, ba = out["schemes"]["per-user"], out["schemes"]["batched"]
    out["speed-up-per-round"] = pu["round-s-mean"] / ba["round-s-mean"]
    out["speed-up-users-step"] = pu["users-step-s-mean"] / ba["users-step-s-mean"]
    out["peak-rss-mb"] = _peak_mb()
    return out


def sparse_system(n: int, m: int, max_per_user: int, seed: int) -> MaxCoverage:
    """Users with 1..``max_per_user`` distinct elements, element popularity ∝ 1/(rank + 10)."""
    rng = np.random.default_rng([seed, 60])
    sizes = rng.integers(1, max_per_user + 1, n)
    p = 1.0 / (np.arange(m) + 10.0)
    elems = rng.choice(m, size=int(sizes.sum()), p=p / p.sum())
    rows = np.repeat(np.arange(n), sizes)
    mat = sp.csr_matrix((np.ones(rows.size), (rows, elems)), shape=(n, m))
    mat.sum_duplicates()
    mat.data[:] = 1.0  # duplicates collapse: ≤ max_per_user distinct elements per user
    return MaxCoverage(mat, f"sparse-set-system-{n}x{m}")


def part_sparse(
    n: int, m: int, max_per_user: int, d_frac: float, rounds: int, dense_rounds: int
) -> dict[str, Any]:
    """Part (b): the users' step, dense per-user draw against the support-proportional one."""
    obj = sparse_system(n, m, max_per_user, seed=0)
    params = FedSMParams("alg1", 0.1, d_frac, rng="batched")
    run = FedSMRun(n, UniformMatroid(m, rounds), rounds, params, 0.0, seed=0)
    rows = []
    while not run.done:
        plan = run.plan()
        t0 = time.perf_counter()
        total, hits = cohort_report(obj, plan.users, plan.users, plan, 0)
        sparse_s = time.perf_counter() - t0
        row: dict[str, Any] = {"round": plan.server_round, "support-s": sparse_s, "hits": hits}
        if plan.server_round <= dense_rounds:
            dense_plan = RoundPlan(**{**plan.__dict__, "rng": "per-user"})
            t0 = time.perf_counter()
            _, dense_hits = cohort_report(obj, plan.users, plan.users, dense_plan, 0)
            row["dense-s"] = time.perf_counter() - t0
            row["dense-hits"] = dense_hits
        rows.append(row)
        run.update(total, plan.users.size)
        print(row, flush=True)
    support = np.mean([r["support-s"] for r in rows])
    dense = np.mean([r["dense-s"] for r in rows if "dense-s" in r])
    per_user = np.diff(obj.values.indptr)
    return {
        "instance": f"{obj.name}: {n} users x {m} elements, 1..{max_per_user} per user "
        f"(mean {per_user.mean():.2f}), {obj.values.nnz} memberships",
        "clients-per-round": 0.1,
        "elements-per-client": d_frac,
        "d": int(plan.d),
        "rows": rows,
        "dense-users-step-s-mean": float(dense),
        "support-users-step-s-mean": float(support),
        "speed-up-users-step": float(dense / support),
        "peak-rss-mb": _peak_mb(),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["dblp", "sparse", "both"], default="both")
    ap.add_argument("--k", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--batched-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--sparse-rounds", type=int, default=10)
    ap.add_argument("--dense-rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    result: dict[str, Any] = {}
    if args.out.exists():
        result = json.loads(args.out.read_text())
    result["machine"] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "note": "shared machine (2 cores, other jobs running); one run, times not repeated",
    }
    if args.part in ("dblp", "both"):
        load0, t0 = os.getloadavg()[0], time.perf_counter()
        result["dblp"] = part_dblp(args.k, args.seeds, data_seed=0)
        if args.batched_seeds != args.seeds:
            obj = MaxCoverage(synthetic_dblp(seed=0).matrix)
            params = FedSMParams("alg1", 0.1, 0.01, rng="batched")
            more = [run_rounds(obj, args.k, params, s) for s in args.batched_seeds]
            f_greedy = result["dblp"]["greedy-objective"]
            result["dblp"]["batched-more-seeds"] = {
                "seeds": args.batched_seeds,
                "ratio-to-greedy": [r["objective"] / f_greedy for r in more],
                "round-s-mean": float(np.mean([r["round-s-mean"] for r in more])),
            }
        result["dblp"]["loadavg-before-after"] = [load0, os.getloadavg()[0]]
        result["dblp"]["benchmark-wall-s"] = time.perf_counter() - t0
    if args.part in ("sparse", "both"):
        load0, t0 = os.getloadavg()[0], time.perf_counter()
        result["sparse"] = part_sparse(
            50_000, 60_000, 7, 0.4, args.sparse_rounds, args.dense_rounds
        )
        result["sparse"]["loadavg-before-after"] = [load0, os.getloadavg()[0]]
        result["sparse"]["benchmark-wall-s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
