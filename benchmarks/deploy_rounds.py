"""Deployment rounds against Flower's own floor, on the edge-device rehearsal, in one run.

Flower sets the floor of a deployment round: a SuperNode sleeps a fixed 3 s after a pull that
found no message, its superexec polls for a task every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``
(1 s), every message starts a fresh ClientApp process, and the SuperNode checks for its
reply every 0.5 s. The anchor is therefore Flower's own app on the same federation: a numpy
FedAvg in the shape of Flower's quickstart-numpy example (``benchmarks/fedavg_anchor``; a
round = train on every node, then evaluate on every node, as ``FedAvg()`` does by default).

One rehearsal (``rehearsal.rehearsal``: TLS, node authentication, a database,
``--nodes`` SuperNodes each in its own network namespace with its own exported file and the
cgroup limits of :data:`~rehearsal.rehearsal.EDGE_DEVICE`) runs, interleaved, per
superexec poll interval and repetition:

* nodes holding their MovieLens-1M file: anchor (k rounds), FedSM (Alg. 1, k = 10,
  ``server-data='none'``), anchor again;
* nodes holding their Fashion-MNIST file: anchor (R rounds), MaxFL (R rounds), anchor again.

Recorded per run: every round's time (the families' ``round-time`` of ``metrics.jsonl``; the
anchor's from its own timer), the median of rounds 2.. (round 1 pays for FAB installs and
cold caches), and per node the peak of its whole process tree's RSS (SuperNode + superexec
+ ClientApps, polled every 50 ms by :class:`~rehearsal.PeakRSS`; shared pages
counted per process) and of its cgroup's memory charge (shared pages once, page cache
included). Per family: ``ratio-to-fedavg`` = its median round ÷ the median round of the
anchor runs beside it (same nodes, same settings, minutes apart), also per exchange (a
FedSM round is one exchange, the anchor's two), and the node tree's difference to the
anchor's. Results: ``--out`` (JSON) and a table on stdout.

Example (the numbers in docs/deployment.md)::

    FLOWER_APP_DATA=/work/devdata python benchmarks/deploy_rounds.py \
        --out docs/benchmarks/deploy-rounds.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import flwr

from flower_app.export import main as export_main
from flower_app.results import read_rows
from flower_app.simulation import toml_value
from rehearsal import PeakRSS
from rehearsal.processes import BIN
from rehearsal.rehearsal import EDGE_DEVICE, EdgeDevice, Rehearsal

ANCHOR = Path(__file__).resolve().parent / "fedavg_anchor"

FEDSM = {
    "algorithm": "fedsm",
    "dataset": "movielens",
    "k": 10,
    "clients-per-round": 0.1,
    "elements-per-client": 0.1,
    "seed": 0,
    "server-data": "none",
    "round-timeout": 600.0,
}
MAXFL = {
    "algorithm": "maxfl",
    "dataset": "fmnist",
    "clients-per-round": 5,
    "maxfl-rounds": 4,
    "maxfl-eval-every": 4,
    "seed": 0,
    "round-timeout": 900.0,
}


def _median_later(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def _measure(reh: Rehearsal, fn) -> tuple[list[dict], dict[str, Any]]:
    """Run ``fn()`` (returns rows) while watching every node's tree; return rows and memory."""
    fed = reh.federation
    reh.reset_peaks()
    roots = {f"node-{i}": fed.nodes[i].pid for i in range(reh.nodes)}
    with PeakRSS(roots) as rss:
        rows = fn()
    trees = rss.report()
    cgroups = reh.cgroup_report()
    memory = {
        "tree-mib-max": max(t["tree-mib"] for t in trees.values()),
        "supernode-mib": max(t["supernode-mib"] for t in trees.values()),
        "superexec-mib": max(t["superexec-mib"] for t in trees.values()),
        "clientapp-mib": max(t["clientapp-mib"] for t in trees.values()),
        "clientapps-at-once": max(t["clientapps-at-once"] for t in trees.values()),
        "cgroup-peak-mib-max": max((c["cgroup-peak-mib"] for c in cgroups.values()), default=None),
        "oom-kills": sum(c["oom-kills"] for c in cgroups.values()),
        "per-node": trees,
    }
    return rows, memory


def _anchor(reh: Rehearsal, rounds: int, out: Path) -> list[dict]:
    """Run the FedAvg anchor with ``rounds`` rounds; return its per-round timings."""
    fed = reh.federation
    config = {"num-server-rounds": rounds, "min-nodes": reh.nodes, "out-file": str(out)}
    cmd = [*fed.cli.prefix, str(BIN / "flwr"), "run", ".", fed.connection, "--stream",
           "--run-config", " ".join(f"{k}={toml_value(v)}" for k, v in config.items())]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ANCHOR, env=fed.cli.env, capture_output=True, text=True,
                          timeout=3600)  # fmt: skip
    match = re.search(r"Successfully started run (\d+)", proc.stdout + proc.stderr)
    status = fed.runs().get(match.group(1)) if match else None
    if status != "finished:completed" or not out.exists():
        raise RuntimeError(f"anchor run failed ({status}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(out.read_text())


def _family(reh: Rehearsal, config: dict, name: str) -> list[dict]:
    run = reh.federation.run({**config, "run-name": name}, timeout=3600)
    if run.status != "finished:completed":
        raise RuntimeError(f"{name}: {run.status} {run.details}\n{run.output[-3000:]}")
    return [r for r in read_rows(run.folder) if r.get("server-round", 0) >= 1]


def markdown(result: dict[str, Any]) -> str:
    """Return the table of docs/deployment.md ("Rounds at Flower's floor") for ``result``."""
    lines = [
        "| family (poll interval) | median round | FedAvg anchor round | ratio-to-fedavg | "
        "÷ anchor's train exchange | node tree | FedAvg node tree | Δ tree | cgroup peak "
        "(FedAvg) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, s in result["summary"].items():
        family, poll = key.split("/poll-")
        lines.append(
            f"| {'FedSM' if family == 'fedsm' else 'MaxFL'} ({poll} s) | "
            f"{s['family-median-round']:.1f} s | {s['fedavg-median-round']:.1f} s | "
            f"**{s['ratio-to-fedavg']:.2f}** | {s['ratio-to-fedavg-exchange']:.2f} | "
            f"{s['family-node-tree-mib']:.0f} MiB | {s['fedavg-node-tree-mib']:.0f} MiB | "
            f"{s['node-tree-minus-fedavg-mib']:+.0f} MiB | {s['family-cgroup-peak-mib']:.0f} "
            f"({s['fedavg-cgroup-peak-mib']:.0f}) MiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; write ``--out``; print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("FLOWER_APP_DATA", ""))
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--reps", type=int, default=1, help="repetitions per setting (1)")
    parser.add_argument(
        "--poll-intervals", type=float, nargs="+", default=[1.0, 0.1],
        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL values to measure (1.0 = Flower's default)",
    )  # fmt: skip
    parser.add_argument("--memory", default=f"{EDGE_DEVICE.memory >> 20}M")
    parser.add_argument("--cpus", type=float, default=EDGE_DEVICE.cpus)
    parser.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="JSON results")
    args = parser.parse_args(argv)
    if not (Path(args.data_dir) / "ml-1m" / "ratings.dat").is_file():
        parser.error("--data-dir (or FLOWER_APP_DATA) must hold ml-1m/ and fashion-mnist/")
    from rehearsal.isolation import parse_memory

    device = EdgeDevice(EDGE_DEVICE.name, parse_memory(args.memory), args.cpus)
    work = args.work or Path(tempfile.mkdtemp(prefix="deploy-rounds-"))
    exports = {}
    for dataset in ("movielens", "fmnist"):
        folder = work / f"export-{dataset}"
        argv_ = ["--dataset", dataset, "--data-dir", args.data_dir,
                 "--num-partitions", str(args.nodes), "--out", str(folder)]  # fmt: skip
        if export_main(argv_) != 0:
            return 1
        exports[dataset] = folder
    data = {"fedsm": {**FEDSM, "data-dir": args.data_dir},
            "maxfl": {**MAXFL, "data-dir": args.data_dir}}  # fmt: skip
    rounds = {"fedsm": data["fedsm"]["k"], "maxfl": data["maxfl"]["maxfl-rounds"]}
    runs: list[dict[str, Any]] = []
    started = time.time()
    with Rehearsal(work / "rehearsal", args.nodes, device) as reh:
        reh.start(nodes=False)
        for interval in args.poll_intervals:
            env = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(interval)}
            for rep in range(args.reps):
                for family, dataset, ext in (("fedsm", "movielens", "parquet"),
                                             ("maxfl", "fmnist", "npz")):  # fmt: skip
                    if reh.data != (exports[dataset], ext):  # restarts the nodes anyway
                        reh.federation.node_env = dict(env)
                        reh.provision(exports[dataset], ext)
                    else:
                        reh.set_node_env(env)
                    tag = f"{family}-poll{interval:g}-rep{rep}"
                    for way in ("fedavg-before", family, "fedavg-after"):
                        print(f"[{time.time() - started:7.0f} s] {tag}: {way}", flush=True)
                        if way == family:
                            fn = lambda c=data[family], t=tag: _family(reh, c, t)  # noqa: E731
                        else:
                            out = work / f"anchor-{tag}-{way}.json"
                            fn = lambda o=out, n=rounds[family]: _anchor(reh, n, o)  # noqa: E731
                        rows, memory = _measure(reh, fn)
                        times = [float(r["round-time"]) for r in rows]
                        entry = {
                            "way": "fedavg" if way.startswith("fedavg") else family,
                            "beside": family,
                            "poll-interval": interval,
                            "rep": rep,
                            "round-times": [round(t, 3) for t in times],
                            "median-round": round(_median_later(times), 3),
                            "memory": memory,
                        }
                        if "train-time" in rows[0]:
                            entry["median-train-exchange"] = round(
                                _median_later([float(r["train-time"]) for r in rows]), 3
                            )
                        runs.append(entry)
                        print(f"    median round {entry['median-round']:.2f} s, node tree "
                              f"{memory['tree-mib-max']:.0f} MiB, cgroup peak "
                              f"{memory['cgroup-peak-mib-max'] or 0:.0f} MiB", flush=True)
        notes = list(reh.fallbacks)
        namespaced, limited = reh.namespaced, reh.limited
    summary: dict[str, Any] = {}
    for interval in args.poll_intervals:
        for family in ("fedsm", "maxfl"):
            mine = [r for r in runs if r["poll-interval"] == interval and r["beside"] == family]
            fam = [r for r in mine if r["way"] == family]
            anchor = [r for r in mine if r["way"] == "fedavg"]
            f_round = statistics.median(x for r in fam for x in r["round-times"][1:])
            a_round = statistics.median(x for r in anchor for x in r["round-times"][1:])
            a_train = statistics.median(r["median-train-exchange"] for r in anchor)
            f_tree = max(r["memory"]["tree-mib-max"] for r in fam)
            a_tree = max(r["memory"]["tree-mib-max"] for r in anchor)
            f_cg = max(r["memory"]["cgroup-peak-mib-max"] or 0 for r in fam)
            a_cg = max(r["memory"]["cgroup-peak-mib-max"] or 0 for r in anchor)
            summary[f"{family}/poll-{interval:g}"] = {
                "family-median-round": round(f_round, 3),
                "fedavg-median-round": round(a_round, 3),
                "ratio-to-fedavg": round(f_round / a_round, 3),
                "fedavg-median-train-exchange": round(a_train, 3),
                "ratio-to-fedavg-exchange": round(f_round / a_train, 3),
                "family-node-tree-mib": round(f_tree, 1),
                "fedavg-node-tree-mib": round(a_tree, 1),
                "node-tree-minus-fedavg-mib": round(f_tree - a_tree, 1),
                "family-cgroup-peak-mib": round(f_cg, 1),
                "fedavg-cgroup-peak-mib": round(a_cg, 1),
            }
    result = {
        "what": "median round (rounds 2..) and per-node memory, FedSM and MaxFL beside Flower's "
        "quickstart-numpy FedAvg on the same edge-device rehearsal, interleaved",
        "flwr-version": flwr.__version__,
        "python": platform.python_version(),
        "machine": f"{os.cpu_count()} CPUs, shared with other work",
        "nodes": args.nodes,
        "edge-device": {"name": device.name, "memory-mib": device.memory >> 20,
                        "cpus": device.cpus},  # fmt: skip
        "namespaced": namespaced,
        "cgroup-limits": limited,
        "fallbacks": notes,
        "configs": {**data, "fedavg": "benchmarks/fedavg_anchor (num-server-rounds = the "
                    "family's rounds, FedAvg defaults: train + evaluate on every node)"},
        "summary": summary,
        "runs": runs,
        "wall-time-s": round(time.time() - started, 1),
    }
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\nflwr {flwr.__version__}, {args.nodes} nodes, {device.describe()}")
    print(f"{'family / poll':<18}{'round s':>9}{'FedAvg s':>10}{'ratio':>7}{'÷exch':>7}"
          f"{'tree MiB':>10}{'FedAvg':>8}{'Δ MiB':>7}")  # fmt: skip
    for key, s in summary.items():
        print(f"{key:<18}{s['family-median-round']:>9.2f}{s['fedavg-median-round']:>10.2f}"
              f"{s['ratio-to-fedavg']:>7.2f}{s['ratio-to-fedavg-exchange']:>7.2f}"
              f"{s['family-node-tree-mib']:>10.0f}{s['fedavg-node-tree-mib']:>8.0f}"
              f"{s['node-tree-minus-fedavg-mib']:>7.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
