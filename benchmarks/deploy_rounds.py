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
* nodes holding their Fashion-MNIST file: anchor (R rounds), MaxFL (R rounds), anchor again;
* the same files, against a second anchor with torch in every ClientApp: Flower's
  quickstart-pytorch FedAvg on MaxFL's MLP (``benchmarks/fedavg_anchor_torch``: the same model,
  mini-batch, learning rate and about as many SGD steps a round as MaxFL's sampled clients;
  its docstring says what cannot match), then MaxFL, then that anchor again (``--parts
  maxfl-torch`` runs only this part).

Recorded per run: every round's time (the families' ``round-time`` of ``metrics.jsonl``; the
anchor's from its own timer), the median of rounds 2.. (round 1 pays for FAB installs and
cold caches), and per node the peak of its whole process tree's RSS (SuperNode + superexec
+ ClientApps, polled every 50 ms by :class:`~rehearsal.PeakRSS`; shared pages
counted per process) and of its cgroup's memory charge (shared pages once, page cache
included). Per family: ``ratio-to-fedavg`` = its median round ÷ the median round of the
anchor runs beside it (same nodes, same settings, minutes apart), also per exchange (a
FedSM round is one exchange, the anchor's two), and the node tree's difference to the
anchor's. Beside the PyTorch anchor (the ``pytorch-fedavg`` section of the JSON), also the
load average before and after every run, and MaxFL's ``ratio-to-pytorch-fedavg`` per round
(median of rounds 2..), per exchange (MaxFL's rounds 2.. without evaluation are one train
exchange; the anchor's train phase) and per whole run (the operator's ``flwr run``, start to
finish), with what a MaxFL run spends beyond the anchor itemised: before round 1 (discovery,
the handler probe and round 0, where every client trains its solo model for ρ_k and is
evaluated), the rounds, its evaluation, and the rest; per node, the ClientApp processes and
CPU-seconds; and the import time of each app's ClientApp modules in fresh interpreters on a
node (its cgroup's CPU limit). Results: ``--out`` (JSON; an existing file keeps the part
this run did not measure) and a table on stdout.

Example (the numbers in docs/deployment.md)::

    FLOWER_APP_DATA=/work/devdata python benchmarks/deploy_rounds.py \
        --out docs/benchmarks/deploy-rounds.json
    FLOWER_APP_DATA=/work/devdata python benchmarks/deploy_rounds.py --parts maxfl-torch \
        --poll-intervals 1 --reps 3 --out docs/benchmarks/deploy-rounds.json
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
ANCHOR_TORCH = Path(__file__).resolve().parent / "fedavg_anchor_torch"
#: what ``--parts`` can run: each family between two anchor runs
PARTS = ("fedsm", "maxfl", "maxfl-torch")

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


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


#: timed in a fresh interpreter on a node (its namespace and cgroup): what each ClientApp
#: process imports before its first handler runs
IMPORTS = {
    "flwr": "import flwr.app, flwr.clientapp",
    "numpy-anchor": f"sys.path.insert(0, {str(ANCHOR)!r}); import fedavg_anchor.client_app",
    "torch-anchor": f"sys.path.insert(0, {str(ANCHOR_TORCH)!r}); "
    "import fedavg_anchor_torch.client_app",
    "maxfl": "import flower_app.client_app; from flower_app.registry import load_runner; "
    "load_runner('maxfl')",
}
_PROBE = (
    "import json, sys, time\n"
    "t0 = time.perf_counter(); c0 = time.process_time()\n"
    "{code}\n"
    "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')]\n"
    "print(json.dumps([time.perf_counter() - t0, time.process_time() - c0,"
    " int(hwm[0].split()[1]) / 1024 if hwm else -1]))\n"
)


def _import_costs(reh: Rehearsal, reps: int = 3) -> dict[str, dict[str, float]]:
    """Time each :data:`IMPORTS` entry in ``reps`` fresh interpreters on node 0; medians."""
    host = reh.federation.hosts[0]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out: dict[str, dict[str, float]] = {}
    for name, code in IMPORTS.items():
        got = []
        for _ in range(reps):
            t0 = time.perf_counter()
            proc = subprocess.run(host.command([str(BIN / "python"), "-c",
                                                _PROBE.format(code=code)]),
                                  env=env, capture_output=True, text=True, timeout=600,
                                  start_new_session=True)  # fmt: skip
            total = time.perf_counter() - t0
            if proc.returncode != 0:
                raise RuntimeError(f"import probe {name} failed:\n{proc.stderr[-2000:]}")
            wall, cpu, rss = json.loads(proc.stdout.strip().splitlines()[-1])
            got.append((wall, cpu, rss, total))
        out[name] = {
            "import-s": round(statistics.median(g[0] for g in got), 3),
            "import-cpu-s": round(statistics.median(g[1] for g in got), 3),
            "peak-rss-mib": round(statistics.median(g[2] for g in got), 1),
            "process-s": round(statistics.median(g[3] for g in got), 3),
        }
    return out


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


def _anchor(
    reh: Rehearsal, rounds: int, out: Path, app: Path = ANCHOR, extra: dict | None = None
) -> list[dict]:
    """Run a FedAvg anchor app with ``rounds`` rounds; return its per-round timings."""
    fed = reh.federation
    config = {"num-server-rounds": rounds, "min-nodes": reh.nodes, "out-file": str(out),
              **(extra or {})}  # fmt: skip
    cmd = [*fed.cli.prefix, str(BIN / "flwr"), "run", ".", fed.connection, "--stream",
           "--run-config", " ".join(f"{k}={toml_value(v)}" for k, v in config.items())]  # fmt: skip
    proc = subprocess.run(cmd, cwd=app, env=fed.cli.env, capture_output=True, text=True,
                          timeout=3600)  # fmt: skip
    match = re.search(r"Successfully started run (\d+)", proc.stdout + proc.stderr)
    status = fed.runs().get(match.group(1)) if match else None
    if status != "finished:completed" or not out.exists():
        raise RuntimeError(f"anchor run failed ({status}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(out.read_text())


def _family(reh: Rehearsal, config: dict, name: str) -> list[dict]:
    """Run a family; return every row of its ``metrics.jsonl`` (round 0 included)."""
    run = reh.federation.run({**config, "run-name": name}, timeout=3600)
    if run.status != "finished:completed":
        raise RuntimeError(f"{name}: {run.status} {run.details}\n{run.output[-3000:]}")
    return list(read_rows(run.folder))


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


def _ways(part: str) -> tuple[str, str, str, tuple[str, ...]]:
    """Return (family, dataset, file extension, the interleaved ways) of a ``--parts`` entry."""
    if part == "fedsm":
        return "fedsm", "movielens", "parquet", ("fedavg-before", "fedsm", "fedavg-after")
    if part == "maxfl":
        return "maxfl", "fmnist", "npz", ("fedavg-before", "maxfl", "fedavg-after")
    return "maxfl", "fmnist", "npz", ("torch-before", "maxfl", "torch-after")


def torch_anchor_config(
    nodes: int, fraction_train: float = 0.5, maxfl: dict[str, Any] = MAXFL
) -> dict[str, Any]:
    """Return the PyTorch anchor's run_config for ``nodes`` nodes beside ``maxfl``.

    FedAvg trains ``fraction_train`` of the nodes (Flower's quickstart-pytorch: 0.5), each
    ⌈K·τ / trained nodes⌉ SGD steps, so the federation trains about as many mini-batches a
    round as MaxFL's K sampled clients of τ steps each (MaxFL's defaults: τ = 10, b = 64,
    η_l = 0.05, dropout 0.2; :mod:`flower_app.settings.declarations`).
    """
    from flower_app.settings.declarations import SETTINGS

    default = {name: s.default for name, s in SETTINGS.items()}
    tau = int(maxfl.get("maxfl-local-steps", default["maxfl-local-steps"]))
    k = int(maxfl["clients-per-round"])
    trained = max(1, int(nodes * fraction_train))  # as FedAvg samples them
    return {
        "fraction-train": float(fraction_train),
        "local-steps": -(-k * tau // trained),
        "batch-size": int(maxfl.get("maxfl-batch-size", default["maxfl-batch-size"])),
        "lr": float(maxfl.get("maxfl-lr", default["maxfl-lr"])),
        "dropout": float(maxfl.get("maxfl-dropout", default["maxfl-dropout"])),
        "seed": int(maxfl["seed"]),
    }


def _entry(way: str, part: str, interval: float, rep: int, rows: list[dict],
           memory: dict[str, Any], whole: float, loads: list[list[float]]) -> dict[str, Any]:
    """Return one run's record (``rows``: its per-round rows, round 0 included if any)."""
    rounds = [r for r in rows if r.get("server-round", 0) >= 1]
    times = [float(r["round-time"]) for r in rounds]
    entry: dict[str, Any] = {
        "way": way,
        "beside": part,
        "poll-interval": interval,
        "rep": rep,
        "round-times": [round(t, 3) for t in times],
        "median-round": round(_median_later(times), 3),
        "memory": memory,
    }
    if "train-time" in rounds[0]:
        entry["median-train-exchange"] = round(
            _median_later([float(r["train-time"]) for r in rounds]), 3
        )
    if part != "maxfl-torch":
        return entry
    entry["whole-run-s"] = round(whole, 3)
    entry["server-wall-s"] = round(float(rows[-1]["wall-time"]), 3)
    entry["load-before-after"] = loads
    if way == "pytorch-fedavg":
        entry["train-times"] = [round(float(r["train-time"]), 3) for r in rounds]
        entry["evaluate-times"] = [round(float(r["evaluate-time"]), 3) for r in rounds]
        entry["clientapp"] = {
            key: round(statistics.median(float(r[key]) for r in rounds[1:] or rounds), 3)
            for key in ("train-startup-s-max", "train-load-s-max", "train-work-s-max",
                        "train-cpu-s-max", "evaluate-startup-s-max", "evaluate-load-s-max",
                        "evaluate-work-s-max", "evaluate-cpu-s-max")
            if key in rounds[0]
        }  # fmt: skip
    else:
        row0 = next((r for r in rows if r.get("server-round") == 0), {})
        entry["round-0-s"] = round(float(row0.get("wall-time", 0.0)), 3)
        entry["evaluated-rounds"] = [int(r["server-round"]) for r in rounds if "seen-acc" in r]
    entry["clientapps-per-node"] = max(t["clientapps"] for t in memory["per-node"].values())
    entry["cpu-s-per-node"] = round(
        max(t["cpu-seconds"] for t in memory["per-node"].values()), 2
    )
    return entry


def _fraction(run: dict[str, Any]) -> float:
    return float(run.get("anchor-fraction-train", 1.0))


def torch_summary(runs: list[dict[str, Any]], interval: float, fraction: float) -> dict[str, Any]:
    """Return MaxFL's ``ratio-to-pytorch-fedavg`` per round, exchange and whole run.

    Over the runs at poll interval ``interval`` beside the anchor training ``fraction`` of
    the nodes.
    """
    mine = [r for r in runs if r["poll-interval"] == interval and r["beside"] == "maxfl-torch"
            and _fraction(r) == fraction]  # fmt: skip
    fam = [r for r in mine if r["way"] == "maxfl"]
    anchor = [r for r in mine if r["way"] == "pytorch-fedavg"]
    med = statistics.median

    def later(r: dict, key: str) -> list[float]:
        return r[key][1:] if len(r[key]) > 1 else r[key]

    f_round = med(x for r in fam for x in later(r, "round-times"))
    a_round = med(x for r in anchor for x in later(r, "round-times"))
    # MaxFL's rounds before its mandatory rounds end and without evaluation: one exchange
    f_train = med(t for r in fam for i, t in enumerate(r["round-times"], 1)
                  if i > 1 and i not in r["evaluated-rounds"])  # fmt: skip
    a_train = med(x for r in anchor for x in later(r, "train-times"))
    f_eval_round = med(t for r in fam for i, t in enumerate(r["round-times"], 1)
                       if i in r["evaluated-rounds"])  # fmt: skip
    f_eval = f_eval_round - f_train
    a_eval = med(x for r in anchor for x in later(r, "evaluate-times"))
    f_whole = med(r["whole-run-s"] for r in fam)
    a_whole = med(r["whole-run-s"] for r in anchor)
    f_server = med(r["server-wall-s"] for r in fam)
    a_server = med(r["server-wall-s"] for r in anchor)
    round0 = med(r["round-0-s"] for r in fam)
    n_rounds = len(fam[0]["round-times"])
    a_rounds_total = med(sum(r["round-times"]) for r in anchor)
    f_rounds_total = med(sum(r["round-times"]) for r in fam)
    return {
        "maxfl-median-round": round(f_round, 3),
        "pytorch-fedavg-median-round": round(a_round, 3),
        "ratio-to-pytorch-fedavg": round(f_round / a_round, 3),
        "maxfl-median-train-exchange": round(f_train, 3),
        "pytorch-fedavg-median-train-exchange": round(a_train, 3),
        "ratio-to-pytorch-fedavg-exchange": round(f_train / a_train, 3),
        "maxfl-evaluation-exchange": round(f_eval, 3),
        "pytorch-fedavg-median-evaluate-exchange": round(a_eval, 3),
        "ratio-to-pytorch-fedavg-evaluate-exchange": round(f_eval / a_eval, 3),
        "maxfl-whole-run": round(f_whole, 3),
        "pytorch-fedavg-whole-run": round(a_whole, 3),
        "ratio-to-pytorch-fedavg-whole-run": round(f_whole / a_whole, 3),
        "ratio-to-pytorch-fedavg-server-wall": round(f_server / a_server, 3),
        "beyond-pytorch-fedavg": {
            "what": f"median seconds of a whole run ({n_rounds} rounds) that MaxFL spends "
            "beyond the PyTorch anchor, by item",
            "whole-run": round(f_whole - a_whole, 3),
            "before-round-1 (discovery, handler probe, round 0: solo training + evaluation)":
                round(round0, 3),
            "rounds 1..T (MaxFL minus anchor)": round(f_rounds_total - a_rounds_total, 3),
            "of which evaluation (MaxFL's one evaluation exchange minus the anchor's "
            f"{n_rounds})": round(f_eval - n_rounds * a_eval, 3),
            "rest (ServerApp start, run folder, FAB)": round(
                (f_whole - a_whole) - round0 - (f_rounds_total - a_rounds_total), 3
            ),
        },  # fmt: skip
        "per-rep": [_rep_ratios(f, [r for r in anchor if r["rep"] == f["rep"]]) for f in fam],
        "maxfl-clientapps-per-node": max(r["clientapps-per-node"] for r in fam),
        "pytorch-fedavg-clientapps-per-node": max(r["clientapps-per-node"] for r in anchor),
        "maxfl-cpu-s-per-node": med(r["cpu-s-per-node"] for r in fam),
        "pytorch-fedavg-cpu-s-per-node": med(r["cpu-s-per-node"] for r in anchor),
        "maxfl-node-tree-mib": round(max(r["memory"]["tree-mib-max"] for r in fam), 1),
        "pytorch-fedavg-node-tree-mib": round(max(r["memory"]["tree-mib-max"] for r in anchor), 1),
        "load-average": [min(x for r in mine for ld in r["load-before-after"] for x in ld),
                         max(x for r in mine for ld in r["load-before-after"] for x in ld)],
        "repetitions": len(fam),
    }  # fmt: skip


def _rep_ratios(fam: dict[str, Any], anchors: list[dict[str, Any]]) -> dict[str, Any]:
    """Return one repetition's ratios: MaxFL ÷ the mean of the two anchor runs beside it."""
    a_round = statistics.mean(r["median-round"] for r in anchors)
    a_whole = statistics.mean(r["whole-run-s"] for r in anchors)
    return {
        "rep": fam["rep"],
        "round": round(fam["median-round"] / a_round, 3),
        "whole-run": round(fam["whole-run-s"] / a_whole, 3),
        "maxfl-round-0-s": fam["round-0-s"],
        "load": [min(x for r in [fam, *anchors] for ld in r["load-before-after"] for x in ld),
                 max(x for r in [fam, *anchors] for ld in r["load-before-after"] for x in ld)],
    }  # fmt: skip


def markdown_torch(section: dict[str, Any]) -> str:
    """Return the PyTorch anchor's table of docs/deployment.md for ``section``."""
    lines = [
        "| MaxFL (poll interval, anchor) | round | PyTorch FedAvg round | **ratio** | "
        "train exchange (anchor) | **ratio** | whole run (anchor) | **ratio** | load average |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, s in section["summary"].items():
        poll, fraction = key.split("/poll-")[1].split("/fraction-train-")
        lo, hi = s["load-average"]
        lines.append(
            f"| {poll} s, anchor trains {float(fraction):.0%} of the nodes "
            f"({s['repetitions']} reps) | "
            f"{s['maxfl-median-round']:.1f} s | "
            f"{s['pytorch-fedavg-median-round']:.1f} s | **{s['ratio-to-pytorch-fedavg']:.2f}** | "
            f"{s['maxfl-median-train-exchange']:.1f} s "
            f"({s['pytorch-fedavg-median-train-exchange']:.1f} s) | "
            f"**{s['ratio-to-pytorch-fedavg-exchange']:.2f}** | {s['maxfl-whole-run']:.0f} s "
            f"({s['pytorch-fedavg-whole-run']:.0f} s) | "
            f"**{s['ratio-to-pytorch-fedavg-whole-run']:.2f}** | {lo:.1f}–{hi:.1f} |"
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
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS),
        help="what to run, each between two anchor runs: fedsm and maxfl beside the numpy "
        "anchor, maxfl-torch = MaxFL beside the PyTorch anchor (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--torch-fraction-train", type=float, default=0.5,
        help="fraction of the nodes the PyTorch anchor trains each round (0.5, as Flower's "
        "quickstart-pytorch; MaxFL here trains the 2 of 4 nodes that hold seen clients)",
    )  # fmt: skip
    parser.add_argument("--memory", default=f"{EDGE_DEVICE.memory >> 20}M")
    parser.add_argument("--cpus", type=float, default=EDGE_DEVICE.cpus)
    parser.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    parser.add_argument(
        "--out", type=Path,
        help="JSON results; an existing file keeps what this run did not measure (the "
        "numpy-anchor entries or the 'pytorch-fedavg' section)",
    )  # fmt: skip
    parser.add_argument(
        "--add-reps", action="store_true",
        help="keep --out's PyTorch-anchor runs of the settings measured now and add these "
        "as further repetitions (default: replace them)",
    )  # fmt: skip
    parser.add_argument(
        "--resummarise", action="store_true",
        help="measure nothing: recompute the 'pytorch-fedavg' summaries of --out from its runs",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.resummarise:
        if args.out is None or not args.out.exists():
            parser.error("--resummarise needs an existing --out")
        base = json.loads(args.out.read_text())
        section = base["pytorch-fedavg"]
        settings = sorted({(r["poll-interval"], _fraction(r)) for r in section["runs"]},
                          reverse=True)  # fmt: skip
        section["summary"] = {
            f"maxfl/poll-{i:g}/fraction-train-{f:g}": torch_summary(section["runs"], i, f)
            for i, f in settings
        }
        args.out.write_text(json.dumps(base, indent=2) + "\n")
        print(markdown_torch(section))
        return 0
    datasets = sorted({_ways(p)[1] for p in args.parts})
    if "movielens" in datasets and not (Path(args.data_dir) / "ml-1m" / "ratings.dat").is_file():
        parser.error("--data-dir (or FLOWER_APP_DATA) must hold ml-1m/ and fashion-mnist/")
    from rehearsal.isolation import parse_memory

    device = EdgeDevice(EDGE_DEVICE.name, parse_memory(args.memory), args.cpus)
    work = args.work or Path(tempfile.mkdtemp(prefix="deploy-rounds-"))
    exports = {}
    for dataset in datasets:
        folder = work / f"export-{dataset}"
        argv_ = ["--dataset", dataset, "--data-dir", args.data_dir,
                 "--num-partitions", str(args.nodes), "--out", str(folder)]  # fmt: skip
        if export_main(argv_) != 0:
            return 1
        exports[dataset] = folder
    data = {"fedsm": {**FEDSM, "data-dir": args.data_dir},
            "maxfl": {**MAXFL, "data-dir": args.data_dir}}  # fmt: skip
    rounds = {"fedsm": data["fedsm"]["k"], "maxfl": data["maxfl"]["maxfl-rounds"]}
    torch_cfg = torch_anchor_config(args.nodes, args.torch_fraction_train)
    runs: list[dict[str, Any]] = []
    imports: list[dict[str, Any]] = []
    started = time.time()
    with Rehearsal(work / "rehearsal", args.nodes, device) as reh:
        reh.start(nodes=False)
        for interval in args.poll_intervals:
            env = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(interval)}
            for rep in range(args.reps):
                for part in args.parts:
                    family, dataset, ext, ways = _ways(part)
                    if reh.data != (exports[dataset], ext):  # restarts the nodes anyway
                        reh.federation.node_env = dict(env)
                        reh.provision(exports[dataset], ext)
                    else:
                        reh.set_node_env(env)
                    tag = f"{part}-poll{interval:g}-rep{rep}"
                    if part == "maxfl-torch":
                        print(f"[{time.time() - started:7.0f} s] {tag}: imports", flush=True)
                        load = _load()
                        imports.append({"poll-interval": interval, "rep": rep,
                                        "anchor-fraction-train": args.torch_fraction_train,
                                        "load": [load, _load()],
                                        "imports": _import_costs(reh)})  # fmt: skip
                        imports[-1]["load"][1] = _load()
                    for way in ways:
                        print(f"[{time.time() - started:7.0f} s] {tag}: {way}", flush=True)
                        if way == family:
                            fn = lambda c=data[family], t=tag: _family(reh, c, t)  # noqa: E731
                        elif way.startswith("torch"):
                            out = work / f"anchor-{tag}-{way}.json"
                            fn = lambda o=out, n=rounds[family]: _anchor(  # noqa: E731
                                reh, n, o, ANCHOR_TORCH, torch_cfg)
                        else:
                            out = work / f"anchor-{tag}-{way}.json"
                            fn = lambda o=out, n=rounds[family]: _anchor(reh, n, o)  # noqa: E731
                        load = _load()
                        t0 = time.perf_counter()
                        rows, memory = _measure(reh, fn)
                        whole = time.perf_counter() - t0
                        name = {"fedavg": "fedavg", "torch": "pytorch-fedavg"}.get(
                            way.split("-")[0], family)
                        entry = _entry(name, part, interval, rep, rows, memory, whole,
                                       [load, _load()])  # fmt: skip
                        if part == "maxfl-torch":
                            entry["anchor-fraction-train"] = args.torch_fraction_train
                        runs.append(entry)
                        (work / "runs-so-far.json").write_text(
                            json.dumps({"runs": runs, "imports": imports}, indent=1))
                        print(f"    median round {entry['median-round']:.2f} s, whole run "
                              f"{whole:.0f} s, node tree {memory['tree-mib-max']:.0f} MiB, "
                              f"cgroup peak {memory['cgroup-peak-mib-max'] or 0:.0f} MiB, "
                              f"load {load}", flush=True)  # fmt: skip
        notes = list(reh.fallbacks)
        namespaced, limited = reh.namespaced, reh.limited
    base: dict[str, Any] = {}
    if args.out is not None and args.out.exists():
        base = json.loads(args.out.read_text())
    numpy_parts = [p for p in args.parts if p != "maxfl-torch"]
    if numpy_parts:
        summary: dict[str, Any] = {}
        for interval in args.poll_intervals:
            for family in numpy_parts:
                summary[f"{family}/poll-{interval:g}"] = _numpy_summary(runs, interval, family)
        base.pop("notes", None)  # written by hand about the entries replaced here
        base.update({
            "what": "median round (rounds 2..) and per-node memory, FedSM and MaxFL beside "
            "Flower's quickstart-numpy FedAvg on the same edge-device rehearsal, interleaved",
            **_setting(args, device, namespaced, limited, notes),
            "configs": {**data, "fedavg": "benchmarks/fedavg_anchor (num-server-rounds = the "
                        "family's rounds, FedAvg defaults: train + evaluate on every node)"},
            "summary": summary,
            "runs": [r for r in runs if r["beside"] != "maxfl-torch"],
            "wall-time-s": round(time.time() - started, 1),
        })  # fmt: skip
        print(markdown(base))
    if "maxfl-torch" in args.parts:
        # an earlier section's runs in other settings stay (and keep their summaries)
        kept = base.get("pytorch-fedavg", {})
        now = {(i, args.torch_fraction_train) for i in args.poll_intervals}
        t_runs = [r for r in kept.get("runs", []) if (r["poll-interval"], _fraction(r)) not in now
                  or args.add_reps]  # fmt: skip
        t_imports = [i for i in kept.get("imports", [])
                     if (i["poll-interval"], _fraction(i)) not in now or args.add_reps]
        offset = 1 + max((r["rep"] for r in t_runs if (r["poll-interval"], _fraction(r)) in now),
                         default=-1)  # fmt: skip
        mine = [r for r in runs if r["beside"] == "maxfl-torch"]
        for r in [*mine, *imports]:
            r["rep"] += offset
        t_runs += mine
        t_imports += imports
        settings = sorted({(r["poll-interval"], _fraction(r)) for r in t_runs}, reverse=True)
        section = {
            "what": "MaxFL beside Flower's quickstart-pytorch FedAvg on MaxFL's MLP and the "
            "same Fashion-MNIST node files (benchmarks/fedavg_anchor_torch), interleaved "
            "(anchor, MaxFL, anchor) on the same edge-device rehearsal; round = median of "
            "rounds 2..; exchange = MaxFL's rounds 2.. without evaluation (one train "
            "exchange) vs the anchor's train phase; whole run = the `flwr run` on the "
            "operator's side, start to finish",
            **_setting(args, device, namespaced, limited, notes, torch=True),
            "configs": {"maxfl": data["maxfl"], "pytorch-fedavg": {
                "app": "benchmarks/fedavg_anchor_torch", "num-server-rounds":
                rounds["maxfl"], **{k: v for k, v in torch_cfg.items()
                                    if k not in ("fraction-train", "local-steps")},
                "local-steps": "ceil(K * tau / trained nodes) = "
                + ", ".join(f"{torch_anchor_config(args.nodes, f)['local-steps']} at "
                            f"fraction-train {f:g}" for f in sorted({f for _, f in settings}))}},
            "summary": {f"maxfl/poll-{i:g}/fraction-train-{f:g}": torch_summary(t_runs, i, f)
                        for i, f in settings},  # fmt: skip
            "imports": t_imports,
            "runs": t_runs,
            "wall-time-s": round(time.time() - started, 1),
        }
        base["pytorch-fedavg"] = section
        print(markdown_torch(section))
    if args.out is not None:
        args.out.write_text(json.dumps(base, indent=2) + "\n")
    print(f"\nflwr {flwr.__version__}, {args.nodes} nodes, {device.describe()}")
    return 0


def _setting(
    args: argparse.Namespace, device: EdgeDevice, namespaced: bool, limited: bool,
    notes: list, torch: bool = False,
) -> dict[str, Any]:
    """What a section of the results was measured on: versions, machine, nodes, limits."""
    versions = {"flwr-version": flwr.__version__}
    if torch:
        versions["torch-version"] = _torch_version()
    return {
        **versions,
        "python": platform.python_version(),
        "machine": f"{os.cpu_count()} CPUs, shared with other work",
        "nodes": args.nodes,
        "edge-device": {"name": device.name, "memory-mib": device.memory >> 20,
                        "cpus": device.cpus},
        "namespaced": namespaced,
        "cgroup-limits": limited,
        "fallbacks": notes,
    }  # fmt: skip


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _numpy_summary(runs: list[dict[str, Any]], interval: float, family: str) -> dict[str, Any]:
    """Return a family's ratios to the numpy anchor run beside it."""
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
    return {
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


if __name__ == "__main__":
    sys.exit(main())
