"""FedSubAvg and its baselines on torch models (Sent140 LSTM, Amazon DIN): local training, rounds.

Both engines run :class:`~flower_app.strategies.fedsubavg.FedSubAvgStrategy`'s plain-mode
rounds (one client per node, its submodel = the declared rows of each sparse table + the
dense arrays, :mod:`flower_app.algorithms.fedsubavg.named`):

1. the counting query: each client declares its rows and n_c (:func:`named_heat`);
2. each round the server samples K clients uniformly without replacement
   (``random.Random(seed)``, over clients ordered by partition id), sends each its submodel,
   the client runs :func:`local_train` and returns its rows; the server sums c·(x_c − x)
   by row in client order (:func:`~flower_app.algorithms.fedsubavg.core.merge_updates`) and
   applies the algorithm's step (:func:`~flower_app.algorithms.fedsubavg.core.make_server_update`);
3. the full model is evaluated centrally after every round (:meth:`TorchSubmodelTask.evaluate`).

:func:`~flower_app.runners.fedsubavg_torch.run_torch_strategy` drives the real strategy over
a Flower ``Grid`` whose nodes run :func:`flower_app.clients.torch_tasks.torch_task_client_app`;
the direct engine (the repository's ``direct/fedsubavg_torch.py``) does it in one process
with the pieces here. They agree exactly for the same seed (tested): same clients, same
batches (``user_rng(seed, t, c)``), same float order. CentralSGD sends no messages: both
engines run :func:`run_torch_central`.

Local training (:func:`local_train`) is plain SGD, I iterations of batch B sampled as
:func:`~flower_app.algorithms.fedsubavg.core.batch_schedule` does (the MovieLens task's stream),
with the options the authors' Amazon code uses: learning rate γ·decay^(t−1) and global-norm
gradient clipping (their 0.999 and 5). FedProx adds μ(x − x¹) to the gradient. Torch runs on
one thread inside :func:`local_train` so results do not depend on the thread count (Ray's
actors run on one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from flower_app.algorithms.common.streams import user_rng
from flower_app.algorithms.common.threads import single_thread
from flower_app.algorithms.fedsubavg.core import (
    CENTRAL_STREAM,
    AdamConfig,
    batch_schedule,
    resolve_clients_per_round,
)
from flower_app.algorithms.fedsubavg.named import NamedLayout
from flower_app.algorithms.fedsubavg.torch_tasks import TorchSubmodelTask

__all__ = [
    "TORCH_ALGORITHMS",
    "TorchLocalConfig",
    "TorchRunRows",
    "TorchRunSpec",
    "initial_state",
    "load_values",
    "local_train",
    "model_values",
    "run_torch_central",
]

#: algorithms of the torch tasks (CentralSGD runs on the server alone: run_torch_central)
TORCH_ALGORITHMS = ("fedsubavg", "fedavg-sub", "fedprox-sub", "fedadam-sub", "scaffold-sub",
                    "central-sgd")  # fmt: skip


@dataclass(frozen=True)
class TorchLocalConfig:
    """A client's local training on a torch task.

    Attributes
    ----------
    iters : int
        Local SGD iterations I (10, App. D.3).
    batch : int
        Batch size B (Sent140: 5; Amazon: 4).
    lr : float
        Learning rate γ (Table 4).
    lr_decay : float
        γ_t = γ · lr_decay^(t−1) (1: none; the authors' Amazon code: 0.999).
    clip_norm : float
        Global gradient-norm clipping (0: none; the authors' Amazon code: 5).
    proximal_mu : float
        FedProx's μ (0: none).
    """

    iters: int = 10
    batch: int = 5
    lr: float = 0.1
    lr_decay: float = 1.0
    clip_norm: float = 0.0
    proximal_mu: float = 0.0

    def to_config(self) -> dict[str, int | float]:
        """Return the ``train`` message's config entries (kebab-case)."""
        return {"local-iters": self.iters, "batch-size": self.batch, "lr": float(self.lr),
                "lr-decay": float(self.lr_decay), "clip-norm": float(self.clip_norm)}  # fmt: skip

    @classmethod
    def from_config(cls, config: Any) -> TorchLocalConfig:
        """Read the entries :meth:`to_config` wrote (+ Flower's ``proximal-mu``)."""
        return cls(
            iters=int(config["local-iters"]),
            batch=int(config["batch-size"]),
            lr=float(config["lr"]),
            lr_decay=float(config.get("lr-decay", 1.0)),
            clip_norm=float(config.get("clip-norm", 0.0)),
            proximal_mu=float(config.get("proximal-mu", 0.0)),
        )


def initial_state(task: TorchSubmodelTask, seed: int) -> dict[str, np.ndarray]:
    """Return the initial model's named arrays (torch seeded with ``seed``)."""
    torch.manual_seed(int(seed))
    model = task.make_model()
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_values(model: nn.Module, values: dict[str, np.ndarray], rows: dict[str, np.ndarray]):
    """Write a submodel into ``model``: the given rows of sparse tables, dense arrays whole."""
    state = model.state_dict()
    with torch.no_grad():
        for key, value in values.items():
            src = torch.from_numpy(np.array(value)).to(state[key].dtype)
            if key in rows:
                state[key][torch.from_numpy(rows[key])] = src
            else:
                state[key].copy_(src.reshape(state[key].shape))


def model_values(model: nn.Module, rows: dict[str, np.ndarray], keys: list[str]):
    """Return the submodel's values after training: ``rows`` of sparse tables, dense whole."""
    state = model.state_dict()
    out = {}
    for key in keys:
        value = state[key].detach().cpu().numpy()
        out[key] = np.array(value[rows[key]] if key in rows else value, order="C")
    return out


def local_train(
    task: TorchSubmodelTask,
    model: nn.Module,
    client: int,
    local: TorchLocalConfig,
    seed: int,
    server_round: int,
) -> float:
    """Run client ``client``'s I local SGD steps on ``model`` (in place); return the mean loss.

    Batches come from ``user_rng(seed, server_round, client)`` as in the MovieLens task.
    """
    n = task.n_train(client)
    batches = batch_schedule(user_rng(seed, server_round, client), n, local.iters, local.batch)
    batches += int(task.train_ptr[client])
    model.train()
    with single_thread():
        losses = _sgd_steps(task, model, batches, local, server_round, local.proximal_mu)
    return float(np.mean(losses)) if losses else 0.0


def _sgd_steps(
    task: TorchSubmodelTask,
    model: nn.Module,
    batches: np.ndarray,
    local: TorchLocalConfig,
    server_round: int,
    proximal_mu: float,
) -> list[float]:
    """One SGD step per batch on ``model`` in place; return the batches' losses.

    Learning rate γ·decay^(t−1); FedProx's μ(x − x¹) added to the gradient when
    ``proximal_mu`` > 0; the gradient clipped to global norm ``local.clip_norm`` when > 0.
    Clients' local training and CentralSGD both step this way.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params] if proximal_mu > 0 else []
    lr = local.lr * local.lr_decay ** (server_round - 1)
    losses = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss = task.batch_loss(model, batch)
        loss.backward()
        with torch.no_grad():
            for p, p0 in zip(params, start, strict=False):
                if p.grad is not None:
                    p.grad.add_(p - p0, alpha=proximal_mu)
            if local.clip_norm > 0:
                nn.utils.clip_grad_norm_(params, local.clip_norm)
            for p in params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
        losses.append(float(loss.detach()))
    return losses


@dataclass(frozen=True)
class TorchRunSpec:
    """What one torch-task run does.

    Attributes
    ----------
    algorithm : str
        One of :data:`TORCH_ALGORITHMS`.
    rounds : int
        Communication rounds R.
    clients_per_round : int or float
        K (count or fraction of N): Sent140 50, Amazon 100 in the paper.
    seed : int
        Seed of the model's initialisation, the client sample and the batches.
    local : TorchLocalConfig
        Local training (CentralSGD: I and γ, batch K·B).
    weighting : str
        ``"clients"`` or ``"samples"`` (App. D.4: the paper's experiments weight by n_c).
    adam : AdamConfig
        FedAdam's server hyperparameters (Table 5).
    eval_every : int
        Evaluate the full model every this many rounds (and after the last).
    """

    algorithm: str
    rounds: int
    clients_per_round: int | float
    seed: int = 0
    local: TorchLocalConfig = field(default_factory=TorchLocalConfig)
    weighting: str = "samples"
    adam: AdamConfig = field(default_factory=AdamConfig)
    eval_every: int = 1

    def __post_init__(self) -> None:
        if self.algorithm not in TORCH_ALGORITHMS:
            raise ValueError(f"algorithm {self.algorithm!r}: choose one of {TORCH_ALGORITHMS}")
        if self.rounds < 1 or self.eval_every < 1:
            raise ValueError("rounds and eval_every must be at least 1")


class TorchRunRows:
    """A torch-task run's rows and the model the server evaluates them on.

    Made at round 0: the initial model (:func:`initial_state`, torch then seeded with
    ``spec.seed`` for the evaluation model) is evaluated as row 0.

    Parameters
    ----------
    task : TorchSubmodelTask
        The data and model.
    spec : TorchRunSpec
        The run (its seed).
    on_round : callable, optional
        Receives each evaluated row.
    """

    def __init__(
        self,
        task: TorchSubmodelTask,
        spec: TorchRunSpec,
        on_round: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        named = initial_state(task, spec.seed)
        torch.manual_seed(int(spec.seed))
        self.task, self.eval_every, self.rounds = task, spec.eval_every, spec.rounds
        self.on_round = on_round
        self.model = task.make_model()
        self.layout = NamedLayout.from_arrays(named, task.sparse_keys)
        self.x0 = self.layout.flatten(named)
        self.history: list[dict[str, Any]] = []
        self.add(0, self.x0, {"server-round": 0})

    def add(self, server_round: int, x: np.ndarray, row: dict[str, Any]) -> None:
        """Record round ``server_round``'s row; evaluate ``x`` into it on evaluated rounds.

        Rounds 0, every ``eval_every``-th and the last are evaluated (the task's metrics)
        and passed to ``on_round``; the others are only recorded.
        """
        if server_round % self.eval_every and server_round != self.rounds:
            self.history.append(row)
            return
        load_values(self.model, self.layout.unflatten(x), {})
        row.update(self.task.evaluate(self.model))
        self.history.append(row)
        if self.on_round is not None:
            self.on_round(row)


def _central_round(task, model, spec: TorchRunSpec, k: int, server_round: int) -> float:
    """CentralSGD: I steps of batch K·B from the pooled training set (Section 5.1)."""
    rng = user_rng(spec.seed, server_round, CENTRAL_STREAM)
    local = spec.local
    batches = batch_schedule(rng, task.n_train_total, local.iters, k * local.batch)
    return float(np.mean(_sgd_steps(task, model, batches, local, server_round, 0.0)))


def run_torch_central(
    task: TorchSubmodelTask,
    spec: TorchRunSpec,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run CentralSGD on a torch task (no clients, no messages: the ServerApp runs it alone).

    One row per round: ``server-round``, ``local-train-loss`` (the mean loss of the round's
    steps), ``round-time`` and, on evaluated rounds, the task's metrics; row 0 evaluates the
    initial model (:class:`TorchRunRows`).
    """
    k = resolve_clients_per_round(spec.clients_per_round, task.n_clients)
    rows = TorchRunRows(task, spec, on_round)
    keys = list(rows.layout.keys)
    for t in range(1, spec.rounds + 1):
        start = time.perf_counter()
        loss = _central_round(task, rows.model, spec, k, t)
        x = rows.layout.flatten(model_values(rows.model, {}, keys))
        rows.add(t, x, {"server-round": t, "local-train-loss": loss,
                        "round-time": time.perf_counter() - start})  # fmt: skip
    return rows.history
