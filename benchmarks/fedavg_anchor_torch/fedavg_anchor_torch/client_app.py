"""ClientApp of the quickstart-pytorch shape on MaxFL's MLP and the node's Fashion-MNIST file.

``train``: load the received weights into :class:`flower_app.models.mlp.MLP` (MaxFL's model),
run ``local-steps`` mini-batch SGD steps of ``batch-size`` (lr ``lr``, dropout on) on the
node's training rows, reply the weights. ``evaluate``: loss and accuracy on the node's test
rows. Like the quickstart, every message loads the data (here: the node's ``node-<p>.npz``
from ``python -m flower_app.export``, node_config ``data-path``) and builds the model afresh.

Besides the quickstart's metrics every reply carries where its ClientApp process spent its
time: ``startup-s`` (process start to the handler: Python, flwr, torch and this module
imported), ``load-s`` (the node file read and standardised), ``work-s`` (training or
evaluation) and ``cpu-s`` (the process's CPU seconds up to the reply).
"""

import os
import time

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.nn import functional as F  # noqa: N812

from flower_app.models.mlp import MLP

app = ClientApp()


def _process_age() -> float:
    """Seconds since this process started (/proc; -1 where unavailable)."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return -1.0


def _load(context: Context, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the node's ``split`` rows (train or test), standardised as MaxFL does."""
    with np.load(str(context.node_config["data-path"]), allow_pickle=False) as z:
        rows = z[f"{split}-index"]
        x = (z["images"][rows].astype(np.float32) / 255.0 - float(z["mean"])) / float(z["std"])
        y = z["labels"][rows].astype(np.int64)
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)


def _model(msg: Message, context: Context) -> MLP:
    model = MLP(dropout=float(context.run_config["dropout"]))
    model.set_weights(msg.content["arrays"].to_numpy_ndarrays())
    return model


def _times(startup: float, t_load: float, t_work: float, t_end: float) -> dict[str, float]:
    return {"startup-s": startup, "load-s": t_work - t_load, "work-s": t_end - t_work,
            "cpu-s": time.process_time()}  # fmt: skip


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model ``local-steps`` SGD steps on the node's training rows."""
    startup, t_load = _process_age(), time.perf_counter()
    torch.set_num_threads(1)  # as MaxFL's local steps (flower_app single_thread)
    x, y = _load(context, "train")
    t_work = time.perf_counter()
    model = _model(msg, context)
    model.train()
    cfg = context.run_config
    seed = int(cfg["seed"]) * 1_000_003 + int(msg.content["config"].get("server-round", 0))
    rng = np.random.default_rng([seed, int(context.node_config.get("partition-id", 0))])
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]))
    batch, losses = min(int(cfg["batch-size"]), len(y)), []
    for _ in range(int(cfg["local-steps"])):
        idx = torch.from_numpy(rng.choice(len(y), size=batch, replace=False))
        opt.zero_grad()
        loss = F.cross_entropy(model(x[idx], generator=gen), y[idx])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    metrics = {"train-loss": float(np.mean(losses)), "num-examples": len(y),
               **_times(startup, t_load, t_work, time.perf_counter())}  # fmt: skip
    content = RecordDict({"arrays": ArrayRecord(model.get_weights()),
                          "metrics": MetricRecord(metrics)})  # fmt: skip
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Return the received model's loss and accuracy on the node's test rows."""
    startup, t_load = _process_age(), time.perf_counter()
    torch.set_num_threads(1)
    x, y = _load(context, "test")
    t_work = time.perf_counter()
    model = _model(msg, context)
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = float(F.cross_entropy(logits, y))
        acc = float((logits.argmax(1) == y).float().mean())
    metrics = {"eval-loss": loss, "eval-acc": acc, "num-examples": len(y),
               **_times(startup, t_load, t_work, time.perf_counter())}  # fmt: skip
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
