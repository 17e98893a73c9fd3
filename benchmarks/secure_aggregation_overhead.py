"""What secure aggregation costs: rounds, bytes and time per round, with and without it.

FedSM on MovieLens-1M (Algorithm 1, k rounds) and MaxFL on Fashion-MNIST (a few rounds)
run with ``flwr run`` on Flower's simulation engine (Ray) with 10 and 100 SuperNodes, each
plain and with ``secure-aggregation = true``, alternating ``--repeats`` times in one
invocation (plain, secure, plain, secure, ...: a machine whose load drifts affects both
alike). From each run's ``metrics.jsonl``: rounds, bytes up and down per round (every stage
of the protocol included), messages per round, round time (median over the rounds of all
repeats), SecAgg's key setup (first round only: keys are agreed once per run) and unmask
times, sessions per round (more than 1 after a dropout); the FedSM runs' selected sets and
the MaxFL runs' final accuracy are compared (equal sets: the integer marginal gains are
summed exactly).

Example (the numbers in docs/privacy.md)::

    python benchmarks/secure_aggregation_overhead.py --data-dir "$FLOWER_APP_DATA" \\
        --out docs/benchmarks/secure-aggregation-overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flower_app.results import read_rows
from flower_app.simulation import LocalSimulation

#: a run that fails (Flower's local SuperLink or Ray not starting in time on a loaded
#: machine) is run again, at most this many times; ``retries`` in the results says so
MAX_RETRIES = 2

JOBS: dict[str, dict[str, Any]] = {
    "fedsm-movielens-1m": {"algorithm": "fedsm", "dataset": "movielens", "k": 10},
    "maxfl-fmnist": {
        "algorithm": "maxfl", "dataset": "fmnist", "maxfl-rounds": 5, "maxfl-eval-every": 5,
        "maxfl-mandatory-rounds": 5,
    },
}  # fmt: skip


def _rows(folder: Path) -> list[dict[str, Any]]:
    return [r for r in read_rows(folder) if r.get("server-round", 0) >= 1]


def _measure(
    sim: LocalSimulation, job: str, nodes: int, secure: bool, data_dir: str, repeat: int = 0
) -> dict:
    name = f"{job}-{nodes}-{secure}-{repeat}"
    cfg = {**JOBS[job], "data-dir": data_dir, "seed": 1, "run-name": name}
    if secure:
        cfg["secure-aggregation"] = True
    retries = 0
    while True:
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        try:
            run = sim.run(cfg, num_supernodes=nodes)
            failure = "" if run.status == "finished:completed" else run.output[-3000:]
        except RuntimeError as err:  # e.g. the local SuperLink did not start within 15 s
            failure = str(err)[-3000:]
        wall = time.perf_counter() - started
        load_after = os.getloadavg()[0]
        if not failure:
            break
        if retries == MAX_RETRIES:
            raise RuntimeError(f"{job} nodes={nodes} secure={secure} failed:\n{failure}")
        retries += 1  # a start-up failure on a loaded machine: try again, and record it
        print(f"{job} nodes={nodes} secure={secure}: run failed, retry {retries}:\n"
              f"{failure[-600:]}", file=sys.stderr, flush=True)  # fmt: skip
        cfg["run-name"] = f"{name}-retry{retries}"
    rows = _rows(run.folder)
    summary = run.summary

    def per_round(key: str) -> float:
        return statistics.mean(float(r.get(key, 0)) for r in rows)

    # under secure aggregation the collect messages carry the round's own request, so the
    # protocol's count already holds what the strategy counts as bytes-down
    down = per_round("secagg-bytes-down") if secure else per_round("bytes-down")
    return {
        "job": job,
        "nodes": nodes,
        "secure-aggregation": secure,
        "rounds": len(rows),
        "bytes-up-per-round": per_round("bytes-up"),
        "bytes-down-per-round": down,
        "messages-per-round": per_round("secagg-messages") if secure else 2 * per_round("nodes"),
        "round-times": [float(r["round-time"]) for r in rows],
        "round-time-median": statistics.median(float(r["round-time"]) for r in rows),
        "secagg-setup-time-first-round": float(rows[0].get("secagg-setup-time", 0.0)),
        "secagg-collect-time-median": (
            statistics.median(float(r["secagg-collect-time"]) for r in rows) if secure else 0.0
        ),
        "secagg-sessions-per-round": per_round("secagg-sessions") if secure else 0.0,
        "secagg-unmask-nodes-per-round": per_round("secagg-unmask-nodes") if secure else 0.0,
        "secagg-unmask-time-median": (
            statistics.median(float(r["secagg-unmask-time"]) for r in rows) if secure else 0.0
        ),
        "run-wall-time": wall,
        "retries": retries,
        "load-average-1min": [load_before, load_after],  # the machine is shared: context
        "selected": summary.get("selected"),
        "ratio-to-greedy": summary.get("ratio-to-greedy"),
        "final": summary.get("final"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the grid of jobs and write ``--out`` (JSON) and the Markdown table beside it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-only", action="store_true",
                        help="re-make the table (and comparisons) from an existing --out JSON")
    parser.add_argument("--data-dir", default="", help="holds ml-1m/ and fashion-mnist/")
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--repeats", type=int, default=3,
                        help="plain/secure pairs per job and size, alternating (default 3)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    results = []
    if args.table_only:
        results = json.loads(args.out.read_text())["results"]
        args.jobs = list(dict.fromkeys(r["job"] for r in results))
        args.nodes = list(dict.fromkeys(r["nodes"] for r in results))
    with tempfile.TemporaryDirectory() as tmp:
        sim = LocalSimulation(Path(tmp) / "home", Path(tmp) / "runs")
        try:
            _run_all(sim, args, results)
        finally:
            sim.stop()  # the local SuperLink `flwr run` started outlives it
    _compare(args, results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results}, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(_table(results))
    print(_table(results))
    return 0


def _run_all(sim: LocalSimulation, args: argparse.Namespace, results: list[dict]) -> None:
    """Run every job and size, plain and secure alternating ``--repeats`` times."""
    for job in [] if args.table_only else args.jobs:
        for nodes in args.nodes:
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for repeat in range(args.repeats):
                for secure in (False, True):
                    res = _measure(sim, job, nodes, secure, args.data_dir, repeat)
                    runs[secure].append(res)
                    shown = {k: v for k, v in res.items() if k not in ("final", "round-times")}
                    print(json.dumps(shown), flush=True)
            results += [_pool(runs[False]), _pool(runs[True])]


def _compare(args: argparse.Namespace, results: list[dict]) -> None:
    """Put each secure run's comparison with its plain run into the secure entry."""
    for job in args.jobs:
        for nodes in args.nodes:
            plain, secure = (r for r in results if r["job"] == job and r["nodes"] == nodes)
            secure["same-selected-as-plain"] = (
                all(sel == plain["selected"] for sel in secure.get("selected-per-repeat",
                                                                   [secure["selected"]]))
                if plain["selected"] else None
            )  # fmt: skip
            if plain.get("final") and secure.get("final"):
                secure["seen-acc"] = secure["final"].get("seen-acc")
                secure["plain-seen-acc"] = plain["final"].get("seen-acc")
            secure["round-time-ratio"] = secure["round-time-median"] / plain["round-time-median"]
            secure["bytes-up-ratio"] = secure["bytes-up-per-round"] / plain["bytes-up-per-round"]


def _pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the repeats of one configuration: round times pooled, the rest averaged."""
    out = dict(runs[-1])
    times = [t for r in runs for t in r["round-times"]]
    out.update(
        {
            "repeats": len(runs),
            "round-times": times,
            "round-time-median": statistics.median(times),
            "round-time-median-per-repeat": [r["round-time-median"] for r in runs],
            "same-result-across-repeats": all(
                r["selected"] == runs[0]["selected"] and r["final"] == runs[0]["final"]
                for r in runs
            ) if not runs[0]["secure-aggregation"] else None,
        }
    )
    for key in ("bytes-up-per-round", "bytes-down-per-round", "messages-per-round",
                "secagg-unmask-time-median", "secagg-setup-time-first-round",
                "secagg-collect-time-median",
                "secagg-sessions-per-round", "secagg-unmask-nodes-per-round", "run-wall-time",
                "retries"):
        out[key] = statistics.mean(float(r[key]) for r in runs)
    out["load-average-1min"] = [r["load-average-1min"] for r in runs]
    if runs[0]["secure-aggregation"]:
        out["selected-per-repeat"] = [r["selected"] for r in runs]
    return out


def _table(results: list[dict[str, Any]]) -> str:
    head = (
        "| job | nodes | SecAgg | rounds | bytes up / round | bytes down / round | "
        "messages / round | round time (median) | SecAgg keys (round 1) / unmask | time × | "
        "same result | load avg (1 min) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in results:
        same: Any = r.get("same-selected-as-plain")
        if r.get("seen-acc") is not None:
            same = f"seen acc {r['seen-acc']:.4f} (plain {r['plain-seen-acc']:.4f})"
        lines.append(
            f"| {r['job']} | {r['nodes']} | {'yes' if r['secure-aggregation'] else 'no'} | "
            f"{r['rounds']} | {r['bytes-up-per-round']:,.0f} | {r['bytes-down-per-round']:,.0f} | "
            f"{r['messages-per-round']:.0f} | {r['round-time-median']:.2f} s | "
            + (
                f"{r['secagg-setup-time-first-round']:.2f} s / "
                f"{r['secagg-unmask-time-median']:.2f} s | "
                f"{r['round-time-ratio']:.2f} | {'-' if same is None else same} |"
                if r["secure-aggregation"]
                else "- | 1.0 | - |"
            )
            + f" {_load_range(r)} |"
        )
    return head + "\n".join(lines) + "\n"


def _load_range(result: dict[str, Any]) -> str:
    """The 1-minute load average over a configuration's runs (at start and end), min-max."""
    loads = [x for pair in result.get("load-average-1min", []) for x in pair]
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"


if __name__ == "__main__":
    sys.exit(main())
