import json, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main/tests")
from conftest import FlowerCLI
home = Path("/tmp/flwr_ml/home"); home.mkdir(exist_ok=True)
cli = FlowerCLI(home, Path("/tmp/flwr_ml/runs"))
cli.env["FLOWER_APP_DATA"] = "/work/data"
cfg = {"dataset": "movielens", "data-dir": "/work/data", "k": 200, "clients-per-round": 1.0,
       "elements-per-client": 200, "fedsm-mode": "alg2", "fedsm-epsilon": 0.405,
       "fedsm-tau": 0.006, "fedsm-levels": -1, "seed": 0, "run-name": "alg2-ml-flower-s0"}
t0 = time.time()
try:
    run = cli.run(cfg, num_supernodes=8, timeout=3600)
    print(run.status, time.time() - t0)
    s = run.summary
    print(json.dumps({k: s[k] for k in ("communication-rounds", "set-size", "objective", "ratio-to-greedy", "bytes-up", "bytes-down", "wall-time")}))
finally:
    cli.stop()
