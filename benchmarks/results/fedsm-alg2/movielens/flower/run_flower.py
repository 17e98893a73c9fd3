"""FedSM Alg. 2 on MovieLens-1M over Flower's simulation engine (8 SuperNodes), seed 0.

Uses the test suite's FlowerCLI (private FLWR_HOME and SuperLink ports, stopped at the end).
Run from the repository root:
``python benchmarks/results/fedsm-alg2/movielens/flower/run_flower.py``.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "tests"))
from conftest import FlowerCLI  # noqa: E402

work = Path(tempfile.mkdtemp(prefix="fedsm-alg2-flower-"))
(work / "home").mkdir()
cli = FlowerCLI(work / "home", work / "runs")
cli.env["FLOWER_APP_DATA"] = "/work/data"
cfg = {
    "dataset": "movielens",
    "data-dir": "/work/data",
    "k": 200,
    "clients-per-round": 1.0,
    "elements-per-client": 200,
    "fedsm-mode": "alg2",
    "fedsm-epsilon": 0.405,
    "fedsm-tau": 0.006,
    "fedsm-levels": -1,
    "seed": 0,
    "run-name": "alg2-ml-flower-s0",
}
t0 = time.time()
try:
    run = cli.run(cfg, num_supernodes=8, timeout=3600)
    print(run.status, f"{time.time() - t0:.1f} s")
    keys = ("communication-rounds", "set-size", "objective", "ratio-to-greedy", "bytes-up")
    print(json.dumps({k: run.summary[k] for k in (*keys, "bytes-down", "wall-time")}))
finally:
    cli.stop()
