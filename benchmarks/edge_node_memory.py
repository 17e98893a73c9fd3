"""Peak memory of an edge ClientApp holding one user's MovieLens-1M data, beside an all-data one.

A SuperNode runs each message in a fresh ClientApp process that imports the app, builds the
node's client (loading its data) and answers. This benchmark runs exactly that in fresh Python
processes, one after the other in this run, and reads each one's peak RSS (``VmHWM``):

``one-user``
    ``data-path`` = one user's file of ``python -m flower_app.export --dataset movielens
    --num-partitions 6040`` (one file per user): what a phone or a browser would hold.
``all-data``
    no ``data-path``, partition 0 of 1: the whole ratings file, as every node loaded before
    node-local files.

Each process builds the FedSM client from the ClientApp module (``flower_app.client_app.
make_client``) and answers the discovery query (``get_properties({"kind": "cohort"})``).
A real deployment adds the SuperNode process itself (≈ 145 MiB whatever its data, measured by
``benchmarks/deploy_rounds.py``) and the reply's small arrays. A FedSM deployment cannot be
started with one node of 6,040 partitions (discovery waits for every user), hence the
process-level measurement. Results: ``--out`` (JSON), printed.

Example (the numbers in docs/deployment.md)::

    python benchmarks/edge_node_memory.py --data-dir "$FLOWER_APP_DATA" \\
        --out docs/benchmarks/edge-node-memory.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flower_app.export import main as export_main

USERS = 6040  # MovieLens-1M

_CHILD = """
import json, sys, time
t0 = time.perf_counter()


def hwm_kib():  # VmHWM: this process image's peak (ru_maxrss would include the parent's)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])


from flwr.app import Context, RecordDict
from flower_app.client_app import make_client
run_config, node_config = json.loads(sys.argv[1]), json.loads(sys.argv[2])
client = make_client(Context(1, 1, node_config, RecordDict(), run_config))
props = client.get_properties({"kind": "cohort"})
print(json.dumps({
    "peak-rss-mib": hwm_kib() / 1024,
    "users": props["num-users"], "seconds": time.perf_counter() - t0,
}))
"""


def _clientapp(run_config: dict[str, Any], node_config: dict[str, Any]) -> dict[str, Any]:
    """Run a fresh process that does what a ClientApp process does for one message."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(run_config), json.dumps(node_config)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    """Measure both nodes and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="holds ml-1m/ (MovieLens-1M)")
    parser.add_argument("--out", type=Path, default=Path("edge-node-memory.json"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="edge-node-"))
    data_dir = str(Path(args.data_dir).resolve())
    t0 = time.perf_counter()
    export = root / "export"
    export_main(["--dataset", "movielens", "--data-dir", data_dir,
                 "--num-partitions", str(USERS), "--out", str(export)])  # fmt: skip
    export_s = time.perf_counter() - t0
    cfg = {"algorithm": "fedsm", "dataset": "movielens", "data-dir": data_dir}
    one_file = export / "node-0.parquet"
    results: dict[str, Any] = {
        "export-s": round(export_s, 1),
        "one-user-file-bytes": one_file.stat().st_size,
        "ratings-file-bytes": (Path(data_dir) / "ml-1m" / "ratings.dat").stat().st_size,
    }
    for label, node in (
        ("one-user", {"partition-id": 0, "num-partitions": USERS, "data-path": str(one_file)}),
        ("all-data", {"partition-id": 0, "num-partitions": 1}),
    ):
        runs = [_clientapp(cfg, node) for _ in range(3)]  # 3 fresh processes each
        results[label] = {
            "peak-rss-mib": [r["peak-rss-mib"] for r in runs],
            "seconds": [r["seconds"] for r in runs],
            "users": runs[0]["users"],
        }
        print(f"{label}: {json.dumps(results[label])}", flush=True)
    results["peak-rss-ratio"] = round(
        min(results["all-data"]["peak-rss-mib"]) / min(results["one-user"]["peak-rss-mib"]), 2
    )
    results["wall-time-s"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k not in ("one-user", "all-data")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
