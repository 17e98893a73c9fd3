"""The torch tasks' stand-ins at the paper's sizes: Table 1 numbers, bytes per client, round cost.

For ``synthetic-sent140`` and ``synthetic-amazon`` (the paper's client counts, 3 data seeds)
this measures what Table 1 reports (clients, samples, samples per client, feature heat
dispersion n_max / n_min), the bytes a client downloads (its submodel: its embedding rows +
the dense layers, with row ids) against the full model, and the wall time of FedSubAvg
rounds on the direct engine at the paper's K (Sent140 50, Amazon 100; 2 rounds, seed 0),
which says what a Table 2 sweep (1,000 / 200 rounds × 6 algorithms × 3 seeds) costs here.

Example (the numbers in docs/reproductions/fedsubavg-torch.md)::

    python benchmarks/fedsubavg_torch_tasks.py --out docs/benchmarks/fedsubavg-torch-tasks.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from direct.fedsubavg_torch import run_torch_direct
from flower_app.algorithms.fedsubavg.torch_engine import (
    TorchLocalConfig,
    TorchRunSpec,
)
from flower_app.algorithms.fedsubavg.torch_tasks import load_torch_task
from flower_app.datasets import amazon, sent140
from flower_app.runners.fedsubavg_torch import submodel_bytes

PAPER = {"synthetic-sent140": sent140.PAPER_TABLE1, "synthetic-amazon": amazon.PAPER_TABLE1}
#: the paper's K and local settings (App. D.3, Table 4; the authors' Amazon decay and clip)
SETTINGS = {
    "synthetic-sent140": (50, TorchLocalConfig(iters=10, batch=5, lr=0.1)),
    "synthetic-amazon": (100, TorchLocalConfig(iters=10, batch=4, lr=0.05, lr_decay=0.999,
                                               clip_norm=5.0)),
}  # fmt: skip


def main() -> None:
    """Measure and write ``--out`` (JSON)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=2, help="FedSubAvg rounds timed (seed 0)")
    p.add_argument("--out", default="docs/benchmarks/fedsubavg-torch-tasks.json")
    args = p.parse_args()
    result: dict = {"machine": f"{platform.machine()}, {platform.python_version()}",
                    "datasets": {}}  # fmt: skip
    for dataset, paper in PAPER.items():
        rows = []
        for seed in args.seeds:
            t0 = time.perf_counter()
            task = load_torch_task(dataset, data_seed=seed)
            built = time.perf_counter() - t0
            rows.append({"data-seed": seed, **task.stats(), **submodel_bytes(task),
                         "build-seconds": built})  # fmt: skip
            print(dataset, rows[-1], flush=True)
        k, local = SETTINGS[dataset]
        task = load_torch_task(dataset, data_seed=0)
        spec = TorchRunSpec("fedsubavg", rounds=args.rounds, clients_per_round=k, seed=0,
                            local=local, weighting="samples", eval_every=args.rounds)  # fmt: skip
        history = run_torch_direct(task, spec)
        per_round = [r["round-time"] for r in history if "round-time" in r]
        t0 = time.perf_counter()
        model = task.make_model()
        task.evaluate(model)
        evaluation = time.perf_counter() - t0
        result["datasets"][dataset] = {
            "paper": paper, "seeds": rows, "K": k,
            "fedsubavg-seconds-per-round": sum(per_round) / len(per_round),
            "evaluation-seconds": evaluation,
        }  # fmt: skip
        print(dataset, result["datasets"][dataset]["fedsubavg-seconds-per-round"], "s/round",
              evaluation, "s/evaluation", flush=True)  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
