"""Deployment round time and SuperNode memory on loopback, beside the simulation, in one run.

The same FedSM job (MovieLens-1M facility location by default, k rounds, cohort mode) runs
four ways, one after the other, on this machine:

``simulation``
    ``flwr run`` on Flower's simulation engine with ``--nodes`` virtual SuperNodes.
``insecure-all-data``
    a real ``flower-superlink --insecure`` and ``--nodes`` ``flower-supernode`` processes that
    each load the whole dataset and slice their cohort (no ``data-path``).
``insecure-node-files``
    the same, each node holding only its exported file (``python -m flower_app.export``;
    ``data-path`` in its node_config) and its binary cache.
``tls-auth-node-files``
    TLS, SuperNode authentication and a SuperLink database (:class:`SecureFederation`), node
    files as above: what a real deployment runs.

Recorded per way: each round's time from ``metrics.jsonl`` (``round-time``: messages out,
ClientApps started and run, replies in), its median, the first round apart (it pays for
discovery and cold caches), and for the deployments the peak RSS of one SuperNode and of
its largest ClientApp process (:class:`~flower_app.deploy.PeakRSS`). Every way gets the same
seed, and the selected sets are compared. Results: ``--out`` (JSON), printed as a table.

Example (the numbers in docs/deployment.md)::

    python benchmarks/deploy_rounds.py --data-dir "$FLOWER_APP_DATA" \
        --out docs/benchmarks/deploy-rounds.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flower_app.deploy import PeakRSS, SecureFederation
from flower_app.deploy.processes import (
    ManagedProcess,
    flwr_env,
    free_port,
    start_process,
    superlink_command,
    supernode_command,
    wait_for_port,
    write_connection,
)
from flower_app.export import main as export_main
from flower_app.simulation import FlwrRun, LocalSimulation


def _rounds(run: FlwrRun) -> list[float]:
    rows = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    return [float(r["round-time"]) for r in rows if r.get("server-round", 0) >= 1]


def _stats(times: list[float]) -> dict[str, Any]:
    later = times[1:] or times
    return {
        "round-times": [round(t, 3) for t in times],
        "first-round": round(times[0], 3),
        "median-later-rounds": round(statistics.median(later), 3),
        "mean-later-rounds": round(statistics.fmean(later), 3),
    }


def _peak(rss: PeakRSS) -> dict[str, float]:
    report = rss.report()
    return {
        "supernode-mib": max(p["supernode-mib"] for p in report.values()),
        "clientapp-mib": max(p["clientapp-mib"] for p in report.values()),
    }


def _insecure(root: Path, nodes: int, configs: list[dict[str, Any]], cfg: dict, label: str):
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs: list[ManagedProcess] = []
    try:
        procs.append(
            start_process(
                "superlink",
                superlink_command(None, None, port, node_auth=False),
                root / "logs",
                flwr_env(root / "superlink-home"),
            )
        )
        wait_for_port(port)
        for i in range(nodes):
            cmd = supernode_command(address, None, None, configs[i], clientappio_port=free_port())
            procs.append(
                start_process(f"supernode-{i}", cmd, root / "logs", flwr_env(root / f"n{i}"))
            )
        cli = LocalSimulation(root / "home", root / "runs")
        for key in ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT"):
            cli.env.pop(key, None)
        write_connection(cli.home, "loopback", address, None)
        roots = {f"supernode-{i}": procs[i + 1].pid for i in range(nodes)}
        with PeakRSS(roots) as rss:
            run = cli.run({**cfg, "run-name": label}, num_supernodes=None, connection="loopback")
        return run, _peak(rss)
    finally:
        for proc in reversed(procs):
            proc.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the four ways and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="holds ml-1m/ (MovieLens-1M)")
    parser.add_argument("--dataset", default="movielens")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("deploy-rounds.json"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="deploy-rounds-"))
    cfg = {
        "algorithm": "fedsm",
        "dataset": args.dataset,
        "data-dir": str(Path(args.data_dir).resolve()),
        "k": args.k,
        "seed": args.seed,
        "round-timeout": 120.0,
    }
    export = root / "export"
    export_main(["--dataset", args.dataset, "--data-dir", cfg["data-dir"],
                 "--num-partitions", str(args.nodes), "--out", str(export)])  # fmt: skip
    plain = [{"partition-id": i, "num-partitions": args.nodes} for i in range(args.nodes)]
    files = [{**c, "data-path": str(export / f"node-{i}.parquet")} for i, c in enumerate(plain)]
    results: dict[str, Any] = {"config": cfg, "nodes": args.nodes, "ways": {}}
    selected: dict[str, list[int]] = {}

    def record(label: str, run: FlwrRun, peak: dict[str, float] | None = None) -> None:
        if run.status != "finished:completed":
            raise RuntimeError(f"{label}: {run.status} {run.details}\n{run.output[-3000:]}")
        results["ways"][label] = {**_stats(_rounds(run)), **({"peak-rss": peak} if peak else {})}
        selected[label] = run.summary["selected"]
        print(f"{label}: {json.dumps(results['ways'][label])}", flush=True)

    t0 = time.perf_counter()
    sim = LocalSimulation(root / "sim-home", root / "runs")
    try:
        record("simulation", sim.run({**cfg, "run-name": "simulation"}, num_supernodes=args.nodes))
    finally:
        sim.stop()
    record("insecure-all-data", *_insecure(root / "a", args.nodes, plain, cfg, "all-data"))
    record("insecure-node-files", *_insecure(root / "b", args.nodes, files, cfg, "node-files"))
    fed = SecureFederation(root / "tls", args.nodes)
    fed.start()
    try:
        for i in range(args.nodes):  # restart each node with its own file
            fed.nodes[i].stop()
            fed.start_node(i, **{"data-path": files[i]["data-path"]})
        fed.wait_online()
        roots = {f"supernode-{i}": fed.nodes[i].pid for i in range(args.nodes)}
        with PeakRSS(roots) as rss:
            run = fed.run({**cfg, "run-name": "tls"})
        record("tls-auth-node-files", run, _peak(rss))
    finally:
        fed.stop()
    results["same-selected-set"] = len({tuple(s) for s in selected.values()}) == 1
    sim_median = results["ways"]["simulation"]["median-later-rounds"]
    results["ratio-to-simulation"] = {
        label: round(way["median-later-rounds"] / sim_median, 1)
        for label, way in results["ways"].items()
    }
    results["wall-time-s"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "ways"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
