"""FedSubAvg on the torch tasks (Sent140, Amazon) over Flower: the app's runner for them.

:func:`run_torch_strategy` runs the public
:class:`~flower_app.strategies.fedsubavg.FedSubAvgStrategy` or a baseline (named arrays, one
client per node; the rows go to ``on_round`` once the run is over) with the same settings
the direct engine (the repository's ``direct/fedsubavg_torch.py``) takes, and evaluates the
full model centrally after each round (``evaluate_fn``) with the same task method, so both
return the same rows for the same seed. The nodes run the app's
ClientApp, which routes the messages to
:class:`~flower_app.clients.torch_tasks.TorchTaskClient` (one client per node:
``partition-id`` = client, ``num-partitions`` = N). :mod:`flower_app.runners.fedsubavg`
hands the ``sent140``/``amazon`` datasets (and their stand-ins) to :func:`server_run` and
:func:`make_client` here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.fedsubavg.core import resolve_clients_per_round
from flower_app.algorithms.fedsubavg.torch_engine import (
    TorchLocalConfig,
    TorchRunSpec,
    initial_state,
    load_values,
    run_torch_central,
)
from flower_app.algorithms.fedsubavg.torch_tasks import (
    METRIC_KEYS,
    TorchSubmodelTask,
    load_torch_task,
)
from flower_app.clients.torch_tasks import TorchTaskClient
from flower_app.config import AppConfig
from flower_app.results import RunWriter
from flower_app.runners.fedsubavg import resolved_config, spec_fields
from flower_app.settings.rules import Instance, raise_size_problems
from flower_app.strategies.fedsubavg import STRATEGIES

__all__ = [
    "make_client",
    "run_torch_strategy",
    "server_run",
    "submodel_bytes",
    "torch_spec",
]


def run_torch_strategy(
    grid: Grid,
    task: TorchSubmodelTask,
    spec: TorchRunSpec,
    timeout: float = 600.0,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``spec`` on ``task`` over ``grid``; return rows like the direct engine's.

    Raises
    ------
    ValueError
        For ``central-sgd`` (not federated: :func:`run_torch_central`) or FedProx without μ.
    """
    if spec.algorithm == "central-sgd":
        raise ValueError("central-sgd sends no messages: run it with run_torch_central")
    if spec.algorithm == "fedprox-sub" and spec.local.proximal_mu == 0:
        raise ValueError("fedprox-sub needs local.proximal_mu > 0 (the paper's 0.01)")
    k = resolve_clients_per_round(spec.clients_per_round, task.n_clients)
    own: dict[str, Any] = {
        "fedprox-sub": {"proximal_mu": spec.local.proximal_mu},
        "fedadam-sub": {"adam": spec.adam},
    }.get(spec.algorithm, {})
    strategy = STRATEGIES[spec.algorithm](
        task.sparse_keys,
        fraction_train=k / task.n_clients,
        min_train_nodes=k,
        min_available_nodes=task.n_clients,
        fraction_evaluate=0.0,  # the task is evaluated on the server (evaluate_fn below)
        weighting=spec.weighting,
        seed=spec.seed,
        **own,
    )
    model = task.make_model()

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round % spec.eval_every and server_round != spec.rounds:
            return None
        load_values(model, {k: arrays[k].numpy() for k in arrays}, {})
        return MetricRecord({k: float(v) for k, v in task.evaluate(model).items()})

    initial = initial_state(task, spec.seed)
    config = {**spec.local.to_config(), "seed": spec.seed}
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord({k: Array(v) for k, v in initial.items()}),
        train_config=ConfigRecord(config),
        num_rounds=spec.rounds,
        timeout=timeout,
        evaluate_fn=evaluate,
    )
    rows = [_kept(row) for row in strategy.history]
    if on_round is not None:  # the public strategies take no row callback: after the run
        for row in rows:
            on_round(row)
    return rows


_KEEP = ("server-round", "local-train-loss", "clients", "bytes-down", "bytes-up", "round-time",
         "bad-replies", *METRIC_KEYS)  # fmt: skip


def _kept(row: dict[str, Any]) -> dict[str, Any]:
    """Return a strategy history row with the keys the direct engine reports."""
    return {k: v for k, v in row.items() if k in _KEEP}


# ---------------------------------------------------------------------- the app's runner
def _cached_task(cfg: AppConfig) -> TorchSubmodelTask:
    return _load(cfg.dataset, cfg.data_dir, cfg.data_seed, cfg.num_users, cfg.num_elements,
                 cfg.get("fsa-embedding-init"))  # fmt: skip


@lru_cache(maxsize=2)
def _load(
    dataset: str, data_dir: str, seed: int, users: int, elements: int, embedding_init: str
) -> TorchSubmodelTask:
    return load_torch_task(dataset, data_dir, seed, users, elements, embedding_init)


def torch_spec(cfg: AppConfig) -> TorchRunSpec:
    """Return the run of a torch-task configuration (the ``fsa-*`` keys).

    Notes
    -----
    The options the torch tasks do not support yet (secure aggregation, DP, ``server-data =
    'none'``, resume) and the embedding's fit to the dataset are refused by the rules of
    :mod:`flower_app.settings.rules` when ``cfg`` is made.
    """
    local = TorchLocalConfig(
        iters=cfg.get("fsa-local-iters"),
        batch=cfg.get("fsa-batch-size"),
        lr=cfg.get("fsa-lr"),
        lr_decay=cfg.get("fsa-lr-decay"),
        clip_norm=cfg.get("fsa-clip-norm"),
        proximal_mu=cfg.get("fsa-proximal-mu") if cfg.algorithm == "fedprox-sub" else 0.0,
    )
    return TorchRunSpec(**spec_fields(cfg, local), eval_every=cfg.get("fsa-eval-every"))


def _open(cfg: AppConfig, engine: str) -> tuple[TorchRunSpec, TorchSubmodelTask, RunWriter, int]:
    spec = torch_spec(cfg)
    task = _cached_task(cfg)
    k, config = resolved_config(
        cfg, engine, spec.clients_per_round, {"name": task.name, **task.stats()}
    )
    return spec, task, RunWriter(cfg.run_folder(), config), k


def _finish(
    cfg: AppConfig, spec: TorchRunSpec, task: TorchSubmodelTask, writer: RunWriter, k: int,
    history: list[dict[str, Any]], engine: str, started: float,
) -> dict[str, Any]:  # fmt: skip
    evaluated = [r for r in history if "train-loss" in r]
    losses = [float(r["train-loss"]) for r in evaluated]
    last = evaluated[-1] if evaluated else {}
    layout_bytes = submodel_bytes(task, spec.seed)
    summary = {
        "algorithm": cfg.algorithm, "dataset": task.name, "engine": engine, "seed": cfg.seed,
        "clients-per-round": k, "rounds": max(int(r["server-round"]) for r in history),
        "weighting": spec.weighting,
        "initial-train-loss": losses[0] if losses else None,
        "train-loss": losses[-1] if losses else None,
        "min-train-loss": min(losses) if losses else None,
        **{key: last.get(key) for key in ("test-loss", "test-accuracy", "test-auc") if key in last},
        "train-loss-by-round": {int(r["server-round"]): float(r["train-loss"]) for r in evaluated},
        **({"test-auc-by-round": {int(r["server-round"]): float(r["test-auc"]) for r in evaluated}}
           if "test-auc" in last else {}),
        "bytes-up": sum(int(r.get("bytes-up", 0)) for r in history),
        "bytes-down": sum(int(r.get("bytes-down", 0)) for r in history),
        "feature-heat-dispersion": task.stats()["feature-heat-dispersion"],
        **layout_bytes,
        "wall-time": time.perf_counter() - started,
        "run-folder": str(writer.folder),
    }  # fmt: skip
    if "test-auc" in last:
        summary["best-test-auc"] = max(float(r["test-auc"]) for r in evaluated)
    writer.write_summary(summary)
    return summary


def submodel_bytes(task: TorchSubmodelTask, seed: int = 0) -> dict[str, float | int]:
    """Return the full model's bytes and the clients' mean / max submodel download bytes."""
    named = initial_state(task, seed)
    full = int(sum(v.nbytes for v in named.values()))
    dense = sum(v.nbytes for k, v in named.items() if k not in task.sparse_keys)
    per_row = {k: named[k].nbytes // max(named[k].shape[0], 1) for k in task.sparse_keys}
    sizes = np.array([dense + sum((per_row[k] + 8) * rows.size
                                  for k, rows in task.client_rows(c).items())
                      for c in range(task.n_clients)], dtype=np.float64)  # fmt: skip
    return {"full-model-bytes": full, "client-download-bytes-mean": float(sizes.mean()),
            "client-download-bytes-max": int(sizes.max())}  # fmt: skip


def server_run(grid: Grid, cfg: AppConfig) -> dict[str, Any]:
    """Run a torch task over the grid (plain mode: one client per node; N nodes needed)."""
    started = time.perf_counter()
    spec, task, writer, k = _open(cfg, "flower")
    log(INFO, "run folder: %s (%s: %d clients, one per node)", writer.folder, task.name,
        task.n_clients)  # fmt: skip
    if spec.algorithm == "central-sgd":
        log(INFO, "central-sgd runs on the pooled data inside the ServerApp (no messages)")
        history = run_torch_central(task, spec, writer.log_round)
    else:
        history = run_torch_strategy(grid, task, spec, cfg.round_timeout, writer.log_round)
    return _finish(cfg, spec, task, writer, k, history, "flower", started)


def make_client(cfg: AppConfig, context: Context) -> TorchTaskClient:
    """Return the node's client: client ``partition-id`` of the task (one client per node)."""
    pid = int(context.node_config.get("partition-id", 0))
    parts = int(context.node_config.get("num-partitions", 1))
    task = _cached_task(cfg)
    raise_size_problems(
        cfg, Instance(task.name, users=task.n_clients, nodes=parts, one_client_per_node=True)
    )
    return TorchTaskClient(task, pid)

