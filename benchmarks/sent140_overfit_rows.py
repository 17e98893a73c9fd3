"""Which embedding rows carry FedSubAvg's overfitting on the planted Sent140 stand-in?

Runs one algorithm of the planted-embedding Sent140 sweep on the direct engine with the
sweep's keys (``synthetic-sent140``, data seed 0, K = 50, the paper's hyperparameters,
data-size weighting, ``fsa-embedding-init = "planted"``), so its losses are those of the
sweep's run of the same seed, and keeps the model at the ``--snapshots`` rounds. For each
snapshot it groups the tokens by their heat (how many clients' training tweets hold them)
and measures, per heat group:

- ``drift``: the mean distance of the group's embedding rows from their initial (planted)
  values;
- ``train-loss`` / ``test-loss``: cross-entropy on the tweets whose coldest token is in the
  group (all training tweets; the whole test split), so the train-test gap can be read by
  group;
- ``reset``: train and test loss of the whole split after the group's rows are put back to
  their initial values (the rest of the model unchanged): a group whose reset lowers the test
  loss and raises the train loss carries fitting that does not generalise.

Writes ``--out`` (JSON) and prints the tables. One thread; a 300-round run takes 25-35
minutes here::

    python benchmarks/sent140_overfit_rows.py --algorithm fedsubavg --seed 1 \\
        --out docs/benchmarks/sent140-overfit-rows.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional

from direct.fedsubavg_torch import run_torch_direct
from flower_app.algorithms.fedsubavg.torch_tasks import Sent140Task, load_torch_task
from flower_app.config import AppConfig
from flower_app.runners.fedsubavg_torch import torch_spec
from reproductions.fedsubavg import setup_of

DATASET = "synthetic-sent140"
#: heat groups [lo, hi): clients whose training tweets hold the token (0 = test only)
EDGES = (0, 1, 5, 10, 15, 20, 30, 100, 10**9)


def _keys(algorithm: str, seed: int, rounds: int) -> dict[str, Any]:
    """The sweep's run_config keys for one planted-embedding run (see sweeps/fedsubavg.py)."""
    return {
        "algorithm": algorithm, "dataset": DATASET, "clients-per-round": 50, "seed": seed,
        "fsa-rounds": rounds, "fsa-weighting": "samples", "fsa-eval-every": 10,
        "fsa-embedding-init": "planted", **setup_of(DATASET).run_keys(algorithm),
    }  # fmt: skip


def _losses(task: Sent140Task, model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-tweet cross-entropy of ``model`` (the task's own chunked prediction)."""
    logits = task._predict(model, x)
    return functional.cross_entropy(logits, torch.from_numpy(y), reduction="none").numpy()


def coldest_group(x: np.ndarray, group_of: np.ndarray) -> np.ndarray:
    """Heat group of each tweet's coldest token (padding ignored; -1 for an empty tweet)."""
    g = np.where(x > 0, group_of[x], np.iinfo(np.int64).max)
    cold = g.min(axis=1)
    return np.where(cold == np.iinfo(np.int64).max, -1, cold)


def analyse(
    task: Sent140Task, state: dict[str, torch.Tensor], init_rows: torch.Tensor, heat: np.ndarray
) -> dict[str, Any]:
    """The per-group numbers of one snapshot (see the module docstring)."""
    model = task.make_model()
    model.load_state_dict(state)
    model.eval()
    data = task.data
    group_of = np.searchsorted(EDGES, heat, side="right") - 1
    rows = model.embedding.weight.detach()
    drift = (rows - init_rows).norm(dim=1).numpy()
    train_l = _losses(task, model, data.train_x, data.train_y)
    test_l = _losses(task, model, data.test_x, data.test_y)
    train_g, test_g = coldest_group(data.train_x, group_of), coldest_group(data.test_x, group_of)
    planted = np.zeros(len(heat)) if data.planted is None else np.abs(data.planted)
    groups = []
    for g, (lo, hi) in enumerate(zip(EDGES[:-1], EDGES[1:], strict=True)):
        tokens = np.flatnonzero((group_of == g) & (np.arange(len(heat)) > 0))
        if tokens.size == 0:
            continue
        with torch.no_grad():
            saved = model.embedding.weight[tokens].clone()
            model.embedding.weight[tokens] = init_rows[tokens]
        reset_train = float(_losses(task, model, data.train_x, data.train_y).mean())
        reset_test = float(_losses(task, model, data.test_x, data.test_y).mean())
        with torch.no_grad():
            model.embedding.weight[tokens] = saved
        tr, te = train_g == g, test_g == g
        groups.append({
            "heat": f"{lo}-{hi - 1}" if hi < 10**9 else f"{lo}+",
            "tokens": int(tokens.size),
            "mean-abs-planted-weight": float(planted[tokens].mean()),
            "drift": float(drift[tokens].mean()),
            "train-tweets": int(tr.sum()), "test-tweets": int(te.sum()),
            "train-loss": float(train_l[tr].mean()) if tr.any() else None,
            "test-loss": float(test_l[te].mean()) if te.any() else None,
            "reset-train-loss": reset_train, "reset-test-loss": reset_test,
        })  # fmt: skip
    return {"train-loss": float(train_l.mean()), "test-loss": float(test_l.mean()),
            "groups": groups}  # fmt: skip


def main() -> None:
    """Run, analyse the snapshots and write ``--out``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", default="fedsubavg")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--snapshots", type=int, nargs="+", default=[150, 300])
    p.add_argument("--out", default="docs/benchmarks/sent140-overfit-rows.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = AppConfig.from_run_config(_keys(args.algorithm, args.seed, args.rounds))
    spec = torch_spec(cfg)
    task = load_torch_task(DATASET, data_seed=0, embedding_init="planted")
    assert isinstance(task, Sent140Task)
    heat = task.data.heat  # clients whose training tweets hold each token
    snaps: dict[int, dict[str, torch.Tensor]] = {}
    last: dict[str, Any] = {}
    evaluate = task.evaluate

    def keep(model: torch.nn.Module) -> dict[str, float]:  # the model evaluated this round
        last["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return evaluate(model)

    def on_round(row: dict[str, Any]) -> None:
        t = int(row["server-round"])
        if t == 0 or t in args.snapshots:
            snaps[t] = last["state"]
        print(f"round {t}: train loss {row['train-loss']:.5f}, test loss "
              f"{row['test-loss']:.5f}", flush=True)  # fmt: skip

    task.evaluate = keep  # type: ignore[method-assign]
    start = time.perf_counter()
    history = run_torch_direct(task, spec, on_round=on_round)
    init_rows = snaps[0]["embedding.weight"]
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "run": {**_keys(args.algorithm, args.seed, args.rounds), "data-seed": 0},
        "seconds": time.perf_counter() - start,
        "heat-edges": list(EDGES),
        "history": [{k: r[k] for k in ("server-round", "train-loss", "test-loss")}
                    for r in history if "train-loss" in r],
        "snapshots": {},
    }  # fmt: skip
    for t in sorted(s for s in snaps if s > 0):
        result["snapshots"][str(t)] = part = analyse(task, snaps[t], init_rows, heat)
        print(f"\nround {t}: train {part['train-loss']:.4f} test {part['test-loss']:.4f}")
        print("heat      tokens |w|   drift  train-tw test-tw train  test   reset:train test")
        for g in part["groups"]:
            tr = "  –   " if g["train-loss"] is None else f"{g['train-loss']:.3f}"
            te = "  –   " if g["test-loss"] is None else f"{g['test-loss']:.3f}"
            print(f"{g['heat']:>8} {g['tokens']:>7} {g['mean-abs-planted-weight']:.2f} "
                  f"{g['drift']:6.2f} {g['train-tweets']:>8} {g['test-tweets']:>7} {tr}  {te}"
                  f"  {g['reset-train-loss']:.3f} {g['reset-test-loss']:.3f}")  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
