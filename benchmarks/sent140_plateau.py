"""Why the Sent140 stand-in's LSTM stays at ln 2: the initialisation or the optimiser?

CentralSGD's step (batch 250 of the pooled training tweets, the paper's SGD at learning rate
0.1) on ``synthetic-sent140`` with the paper's LSTM (:class:`SentimentLSTM`), from three
initialisations, against Adam (lr 1e-3) as a diagnosis only (not the paper's optimiser):

- ``torch``: PyTorch's defaults (embedding N(0, 1), LSTM U(±1/√100));
- ``keras-embedding``: embedding U(±0.05) (Keras' default), the rest PyTorch's;
- ``keras``: Keras' defaults for all (embedding U(±0.05), input weights Glorot-uniform,
  recurrent weights orthogonal, forget-gate bias 1);
- ``adam``: PyTorch's defaults, Adam at 1e-3;
- ``planted-embedding``: PyTorch's defaults, but the embedding's first coordinate holds each
  token's weight in the stand-in's planted sentiment model (``Sent140.planted``): the best a
  pre-trained embedding could give; SGD at 0.1.

``--weight-std S`` runs the variants on a stand-in with a stronger planted signal (token
weights N(0, S²) instead of N(0, 1.5²)); such variants are recorded as ``name@weight-std=S``.

Prints and updates ``docs/benchmarks/sent140-plateau.json`` (the variants run replace their
entries, the others are kept; train loss on the task's fixed 10,000-tweet sample, test
accuracy, every ``--every`` steps). One thread; about 2.5 minutes per 1,000 steps::

    python benchmarks/sent140_plateau.py --steps 1000
    python benchmarks/sent140_plateau.py --steps 3000 --variants planted-embedding
    python benchmarks/sent140_plateau.py --steps 1500 --variants torch --weight-std 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from flower_app.algorithms.fedsubavg.torch_tasks import Sent140Task
from flower_app.datasets.sent140 import synthetic_sent140

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "sent140-plateau.json"
VARIANTS = ("torch", "keras-embedding", "keras", "adam", "planted-embedding")


def _init(model: nn.Module, variant: str, planted: np.ndarray) -> None:
    """Apply ``variant``'s initialisation in place (``torch`` and ``adam`` keep PyTorch's)."""
    with torch.no_grad():
        if variant == "planted-embedding":
            model.embedding.weight[:, 0] = torch.as_tensor(planted, dtype=torch.float32)
        if variant in ("keras-embedding", "keras"):
            model.embedding.weight.uniform_(-0.05, 0.05)
            model.embedding.weight[0].zero_()  # padding
        if variant == "keras":
            hidden = model.lstm.hidden_size
            for name, p in model.lstm.named_parameters():
                if name.startswith("weight_ih"):
                    nn.init.xavier_uniform_(p)
                elif name.startswith("weight_hh"):
                    nn.init.orthogonal_(p)
                else:
                    p.zero_()
                    if name.startswith("bias_ih"):
                        p[hidden : 2 * hidden] = 1.0  # PyTorch's gate order: i, f, g, o


def run(
    variant: str, steps: int, every: int, seed: int, weight_std: float
) -> list[dict[str, float]]:
    """Train one variant; return the evaluated points."""
    task = Sent140Task(synthetic_sent140(seed=0, weight_std=weight_std), eval_seed=0)
    torch.manual_seed(seed)
    model = task.make_model()
    _init(model, variant, task.data.planted)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3) if variant == "adam" else None
    rng = np.random.default_rng(seed)
    points, start = [], time.perf_counter()
    for step in range(1, steps + 1):
        model.zero_grad(set_to_none=True)
        loss = task.batch_loss(model, rng.integers(0, task.n_train_total, 250))
        loss.backward()
        if opt is not None:
            opt.step()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-0.1)
        if step % every == 0:
            ev = task.evaluate(model)
            points.append({"step": step, "train-loss": ev["train-loss"],
                           "test-accuracy": ev["test-accuracy"]})  # fmt: skip
            print(f"{variant:16s} step {step:5d}  train loss {ev['train-loss']:.4f}  "
                  f"test acc {ev['test-accuracy']:.4f}  {time.perf_counter() - start:.0f} s",
                  flush=True)  # fmt: skip
    return points


def main(argv: list[str] | None = None) -> int:
    """Run every variant and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--weight-std", type=float, default=1.5,
                    help="s.d. of the planted token weights (the stand-in's: 1.5)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result = json.loads(args.out.read_text()) if args.out.exists() else {"variants": {}}
    result["note"] = "synthetic-sent140 (data seed 0), CentralSGD batch 250; stand-in, not Sent140"
    commands = result.setdefault("commands", {})
    command = " ".join(["python benchmarks/sent140_plateau.py", *(argv or sys.argv[1:])])
    suffix = "" if args.weight_std == 1.5 else f"@weight-std={args.weight_std:g}"
    for variant in args.variants:
        result["variants"][variant + suffix] = run(
            variant, args.steps, args.every, args.seed, args.weight_std
        )
        commands[variant + suffix] = command
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
