"""Runner of FedSubAvg and its baselines: ServerApp side and ClientApp side.

Algorithms (``algorithm`` run_config key): ``fedsubavg``, ``fedavg-sub``, ``fedprox-sub``,
``fedadam-sub``, ``scaffold-sub`` (federated, :mod:`flower_app.strategies.fedsubavg`) and
``central-sgd`` (the pooled-data reference; under Flower it runs inside the ServerApp and
sends no messages). Datasets: ``movielens-rating`` (real MovieLens-1M under ``data-dir``)
and ``synthetic-movielens-rating`` (``num-users`` users, ``num-elements`` movies; 0 = the
MovieLens-1M sizes).

Common keys used: ``seed``, ``data-seed`` (train/test split, train-loss sample, synthetic
tables), ``clients-per-round`` (K: an int count, e.g. 50 as in the paper, or a fraction of
N), ``num-users``, ``num-elements``, ``round-timeout``, ``discovery-timeout``.
Family keys (``fsa-*``: rounds R, local iterations I, batch B, learning rate γ, weighting,
FedProx μ, FedAdam η, β₁, β₂, τ) are declared in :mod:`flower_app.settings` (reference in
``docs/configuration.md``) and read validated with ``cfg.get``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.client import NumPyClient
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.common.dp_noise import warn_no_privacy
from flower_app.algorithms.common.gaussian_dp import GaussianDP, privacy_summary
from flower_app.algorithms.fedsubavg.core import (
    ALGORITHM_NAMES,
    VALUE_BYTES,
    AdamConfig,
    Evaluator,
    FeatureHeat,
    LocalConfig,
    RunSpec,
    client_bytes,
    resolve_clients_per_round,
    run_central_sgd,
)
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.submodel import SubmodelClient
from flower_app.config import AppConfig, ConfigError
from flower_app.datasets.movielens_rating import RatingTask, load_rating_task
from flower_app.experiment import (
    check_remote_resume,
    cohort_options,
    remote_checkpoint_fn,
    serve_rounds,
)
from flower_app.node_data import (
    RATING_SOURCE_KEYS,
    load_node_ratings,
    node_partition,
    source_of,
)
from flower_app.registry import FEDSUBAVG_TORCH_DATASETS as TORCH_DATASETS
from flower_app.results import RunWriter
from flower_app.server_data import probe_instance
from flower_app.settings.rules import Instance, raise_size_problems
from flower_app.strategies.cohort.fedsubavg import FedSubAvgCohorts
from flower_app.strategies.exchange import exchange, messages_to
from flower_app.strategies.records import to_metric_record
from flower_app.strategies.replies import float_metric, int_metric

__all__ = ["load_task", "make_client", "run_spec", "server_run", "summary_line"]


def load_task(cfg: AppConfig) -> RatingTask:
    """Return the configured rating task (cached per process)."""
    if cfg.dataset == "rating-table":
        from flower_app.datasets.own_ratings import load_rating_table

        return load_rating_table(cfg.data_file, cfg.data_columns, cfg.data_seed)
    return load_rating_task(
        cfg.dataset, cfg.data_dir, cfg.data_seed, cfg.num_users, cfg.num_elements
    )


def run_spec(cfg: AppConfig) -> RunSpec:
    """Return the family's keys (validated and typed by AppConfig) as a :class:`RunSpec`.

    Parameters
    ----------
    cfg : AppConfig
        The validated configuration.

    Returns
    -------
    RunSpec
        The run.
    """
    if cfg.algorithm not in ALGORITHM_NAMES:
        raise ConfigError(f"algorithm {cfg.algorithm!r} is not run by the fedsubavg runner")
    local = LocalConfig(
        iters=cfg.get("fsa-local-iters"),
        batch=cfg.get("fsa-batch-size"),
        lr=cfg.get("fsa-lr"),
        proximal_mu=cfg.get("fsa-proximal-mu") if cfg.algorithm == "fedprox-sub" else 0.0,
    )
    dp = None
    if cfg.get("fsa-dp-noise") > 0:
        dp = GaussianDP(cfg.get("fsa-dp-noise"), cfg.get("fsa-dp-clip"), cfg.get("fsa-dp-delta"),
                        reproducible=cfg.dp_reproducible_noise)  # fmt: skip
    return RunSpec(**spec_fields(cfg, local), dp=dp)


def adam_config(cfg: AppConfig) -> AdamConfig:
    """Return FedAdam's server settings (``fsa-adam-*``; the torch tasks' runner too)."""
    return AdamConfig(
        eta=cfg.get("fsa-adam-eta"),
        beta1=cfg.get("fsa-adam-beta1"),
        beta2=cfg.get("fsa-adam-beta2"),
        tau=cfg.get("fsa-adam-tau"),
    )


def spec_fields(cfg: AppConfig, local: Any) -> dict[str, Any]:
    """Return what a run spec holds on either engine (the torch tasks' runner too).

    ``algorithm``, ``rounds``, ``clients_per_round``, ``seed``, ``weighting``, ``adam``
    (:func:`adam_config`) from the configuration, and the given local training ``local``.
    """
    return {
        "algorithm": cfg.algorithm,
        "rounds": cfg.get("fsa-rounds"),
        "clients_per_round": cfg.clients_per_round,
        "seed": cfg.seed,
        "local": local,
        "weighting": cfg.get("fsa-weighting"),
        "adam": adam_config(cfg),
    }


def resolved_config(
    cfg: AppConfig, engine: str, clients_per_round: int | float, task: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """Return K resolved on the task's clients and the run's ``config.json`` (torch tasks too).

    ``task`` is config.json's description of the task: its ``name`` and its ``clients``
    (from the data, or as the nodes reported them), with whatever else it holds.

    Raises
    ------
    ConfigError
        If ``clients-per-round`` does not fit the task's number of clients.
    """
    raise_size_problems(cfg, Instance(task["name"], users=task["clients"]))
    try:
        k = resolve_clients_per_round(clients_per_round, task["clients"])
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return k, {**cfg.to_dict(), "engine": engine, "task": task, "clients-per-round-resolved": k}


@dataclass
class _Run:
    cfg: AppConfig
    spec: RunSpec
    k: int
    task: RatingTask
    writer: RunWriter
    engine: str
    started: float


def _open(cfg: AppConfig, engine: str) -> _Run:
    """Validate everything, load the task and open the run folder (nothing before that)."""
    spec = run_spec(cfg)
    task = load_task(cfg)
    k, config = resolved_config(
        cfg, engine, spec.clients_per_round, {"name": task.name, **task.stats()}
    )
    writer = RunWriter(cfg.run_folder(), config, resume=cfg.resume)
    if spec.dp is not None and spec.dp.reproducible:
        warn_no_privacy()
    return _Run(cfg, spec, k, task, writer, engine, time.perf_counter())


def _heat_summary(task: RatingTask | None, heat: FeatureHeat, n_params: int = 0) -> dict:
    """Heat and bytes numbers of the summary (without a task: heat only, from the nodes)."""
    n_params = task.n_params if task is not None else int(n_params)
    features = slice(1, n_params)  # everything but the bias (row 0)
    n = heat.clients[features]
    n = n[n > 0]
    heat_part = {
        # the paper's Table 1 metric: over features (gender .. age×movie), not the bias
        "feature-heat-dispersion": heat.dispersion(features),
        "feature-heat-max": int(n.max()) if n.size else 0,
        "feature-heat-min": int(n.min()) if n.size else 0,
        "parameter-heat-dispersion": heat.dispersion(),
        "rows-touched": int((heat.clients > 0).sum()),
        "heat-clients": heat.n_clients,
        "full-model-bytes": int(n_params * VALUE_BYTES),
    }
    if task is None:
        return heat_part
    assert task.layout.blocks()["bias"] == slice(0, 1)  # features = every row but row 0
    sizes = task.submodel_sizes()
    per_client = client_bytes(sizes)
    return {
        **heat_part,
        "client-download-bytes-mean": float(per_client["down"].mean()),
        "client-download-bytes-max": int(per_client["down"].max()),
        "client-submodel-rows-mean": float(sizes.mean()),
        "client-submodel-rows-max": int(sizes.max()),
    }


def _summary(
    cfg: AppConfig, spec: RunSpec, k: int, history: list[dict[str, Any]], rounds: int,
    initial_loss: float | None, head: dict[str, Any], tail: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Return summary.json of a run: ``head`` (dataset, engine), the rounds' numbers, ``tail``."""
    losses = [float(r["train-loss"]) for r in history if "train-loss" in r]
    last = history[-1] if history else {}
    return {
        "algorithm": cfg.algorithm,
        **head,
        "seed": cfg.seed,
        "clients-per-round": k,
        "rounds": rounds,
        "weighting": spec.weighting,
        "initial-train-loss": initial_loss,
        "train-loss": losses[-1] if losses else None,
        "min-train-loss": min(losses) if losses else None,
        "test-loss": last.get("test-loss"),
        "test-accuracy": last.get("test-accuracy"),
        "train-loss-by-round": losses,
        "bad-replies": sum(int(r.get("bad-replies", 0)) for r in history),
        "bytes-up": sum(int(r.get("bytes-up", 0)) for r in history),
        "bytes-down": sum(int(r.get("bytes-down", 0)) for r in history),
        **tail,
    }


def _finish(run: _Run, history: list[dict[str, Any]], heat: FeatureHeat, x0_loss: float) -> dict:
    head = {"dataset": run.task.name, "engine": run.engine}
    tail = {**_heat_summary(run.task, heat), "wall-time": time.perf_counter() - run.started,
            "run-folder": str(run.writer.folder)}  # fmt: skip
    summary = _summary(run.cfg, run.spec, run.k, history, len(history), x0_loss, head, tail)
    if run.spec.dp is not None:  # the last row holds the run's privacy so far
        last = next((r for r in reversed(history) if "dp-epsilon" in r), {})
        summary["privacy"] = privacy_summary(run.spec.dp, last)
    run.writer.write_summary(summary)
    return summary


#: the sums a node's ``kind = "metrics"`` evaluate reply carries (``SubmodelClient``)
METRIC_SUMS = ("eval-loss-sum", "eval-n", "test-loss-sum", "test-correct", "test-n")


def _decode_metric_sums(src: int, reply: Message) -> dict[str, float]:
    """Return a node's metric sums; reject non-finite, negative or impossible values."""
    metrics = reply.content.metric_records["metrics"]
    test_n = int_metric(metrics, "test-n", low=0)
    return {
        "eval-loss-sum": float_metric(metrics, "eval-loss-sum", low=0.0),
        "eval-n": float(int_metric(metrics, "eval-n", low=0)),
        "test-loss-sum": float_metric(metrics, "test-loss-sum", low=0.0),
        "test-correct": float(int_metric(metrics, "test-correct", low=0, high=test_n)),
        "test-n": float(test_n),
    }


def _federated_metrics(grid: Grid, node_ids: list[int], x: np.ndarray, timeout: float) -> dict:
    """Return train loss (pooled sample), test loss and accuracy as sums over the nodes.

    One ``evaluate`` exchange (:func:`~flower_app.strategies.exchange.exchange`): a reply
    that is an error, or whose sums are non-finite, negative or impossible (more correct
    test samples than test samples), is left out and counted in ``metrics-bad-replies``
    (as the strategy loop leaves out a bad train reply); the metrics are those of the
    nodes whose replies were accepted.

    Raises
    ------
    RuntimeError
        If no reply was accepted, or the accepted ones hold no train-loss sample.
    """
    content = RecordDict(
        {"arrays": ArrayRecord([np.asarray(x, dtype=np.float64)]),
         "config": ConfigRecord({"kind": "metrics"})}
    )  # fmt: skip
    messages = messages_to(node_ids, content, MessageType.EVALUATE, "metrics")
    checked = exchange(grid, messages, _decode_metric_sums, "federated evaluation", timeout)
    sums = dict.fromkeys(METRIC_SUMS, 0.0)
    for _, values in checked.accepted:
        for key in sums:
            sums[key] += values[key]
    if not checked.accepted or not sums["eval-n"]:
        raise RuntimeError(
            f"federated evaluation: {len(checked.accepted)} of {len(messages)} nodes' "
            f"replies accepted, no train-loss sample (first left out: {checked.first_error})"
        )
    out = {"train-loss": sums["eval-loss-sum"] / sums["eval-n"]}
    if sums["test-n"]:
        out["test-loss"] = sums["test-loss-sum"] / sums["test-n"]
        out["test-accuracy"] = sums["test-correct"] / sums["test-n"]
    if checked.left_out:
        out["metrics-bad-replies"] = checked.left_out
    return out


def _server_run_remote(grid: Grid, cfg: AppConfig) -> dict[str, Any]:
    """``server-data = "none"``: sizes from the nodes, metrics by federated evaluation."""
    started = time.perf_counter()
    spec = run_spec(cfg)
    problem = probe_instance(grid, cfg.dataset, cfg.discovery_timeout)
    task = {"name": cfg.dataset, "clients": problem.n_users, "params": problem.n_elements}
    k, config = resolved_config(cfg, "flower", spec.clients_per_round, task)
    writer = RunWriter(cfg.run_folder(), config, resume=cfg.resume)
    check_remote_resume(writer, problem)
    log(INFO, "run folder: %s (server-data = none)", writer.folder)
    if spec.dp is not None and spec.dp.reproducible:
        warn_no_privacy()
    initial: dict[str, float] = {}
    strategy = FedSubAvgCohorts(
        spec.algorithm, problem.n_users, problem.n_elements, k, seed=spec.seed,
        weighting=spec.weighting, local=spec.local, adam=spec.adam, dp=spec.dp,
        # resumable: the checkpoint holds x, the server step's state, the sampler, the
        # nodes' n and model size, and the round-0 federated metrics (a resumed run does
        # not redo them)
        **cohort_options(cfg, writer, remote_checkpoint_fn(
            writer, problem, lambda: {"initial-metrics": dict(initial)})),
    )  # fmt: skip

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        assert strategy.cohorts is not None
        nodes = [int(n) for n in strategy.cohorts.node_ids]
        x = arrays["x"].numpy() if "x" in arrays else np.zeros(problem.n_elements)
        values = _federated_metrics(grid, nodes, x, cfg.round_timeout)
        if server_round == 0:
            initial.update(values)
            return None
        return to_metric_record(values)

    if writer.checkpoint is not None:
        initial.update(writer.checkpoint.get("initial-metrics", {}))
    serve_rounds(strategy, grid, writer, cfg, spec.rounds, evaluate_fn=evaluate_fn)
    assert strategy.heat is not None
    history = strategy.history
    rounds = sum("train-loss" in r for r in history)
    head = {"dataset": cfg.dataset, "engine": "flower", "server-data": "none"}
    tail = {**_heat_summary(None, strategy.heat, problem.n_elements),
            "wall-time": time.perf_counter() - started,
            "run-folder": str(writer.folder)}  # fmt: skip
    summary = _summary(cfg, spec, k, history, rounds, initial.get("train-loss"), head, tail)
    if strategy.accountant is not None:
        summary["privacy"] = strategy.accountant.summary()
    writer.write_summary(summary)
    return summary


def _torch(cfg: AppConfig) -> Any:
    """Return the torch tasks' runner if ``cfg.dataset`` is one (Sent140, Amazon), else None."""
    if cfg.dataset not in TORCH_DATASETS:
        return None
    from flower_app.runners import fedsubavg_torch

    return fedsubavg_torch


def server_run(grid: Grid, cfg: AppConfig) -> dict[str, Any]:
    """Run the algorithm over the grid (CentralSGD: on the server) and write the run folder.

    With ``server-data = "none"`` the server reads no client data: n and the model size
    come from the nodes' discovery replies, and the train loss (on the pooled train-loss
    sample), test loss and test accuracy from the nodes' sums (federated evaluation after
    every round); the numbers are the pooled ones up to float rounding. The torch tasks
    (Sent140, Amazon) run in :mod:`flower_app.runners.fedsubavg_torch`.
    """
    if (runner := _torch(cfg)) is not None:
        return runner.server_run(grid, cfg)
    if cfg.server_data == "none":
        return _server_run_remote(grid, cfg)
    run = _open(cfg, "flower")
    log(INFO, "run folder: %s", run.writer.folder)
    evaluate = Evaluator(run.task)
    x0_loss = evaluate(np.zeros(run.task.n_params))["train-loss"]
    if run.spec.algorithm == "central-sgd":
        log(INFO, "central-sgd runs on the pooled data inside the ServerApp (no messages)")
        _, history, heat = run_central_sgd(run.task, run.spec, run.writer.log_round)
        return _finish(run, history, heat, x0_loss)
    strategy = FedSubAvgCohorts(
        run.spec.algorithm,
        run.task.n_clients,
        run.task.n_params,
        run.k,
        seed=run.spec.seed,
        weighting=run.spec.weighting,
        local=run.spec.local,
        adam=run.spec.adam,
        dp=run.spec.dp,
        **cohort_options(cfg, run.writer),
    )

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        # round 0 is the zero model, reported once as initial-train-loss
        if server_round == 0:
            return None
        return to_metric_record(evaluate(arrays["x"].numpy()))

    serve_rounds(strategy, grid, run.writer, cfg, run.spec.rounds, evaluate_fn=evaluate_fn)
    assert strategy.heat is not None
    return _finish(run, strategy.history, strategy.heat, x0_loss)


def make_client(cfg: AppConfig, context: Context) -> NumPyClient:
    """Return the node's SubmodelClient (its cohort of users).

    With ``data-path`` in the node_config the node loads only its own exported file
    (``python -m flower_app.export --dataset movielens-rating ...``), checked against the
    manifest and the run's task keys. The torch tasks: one client per node
    (:func:`flower_app.runners.fedsubavg_torch.make_client`).
    """
    if (runner := _torch(cfg)) is not None:
        return runner.make_client(cfg, context)
    pid, parts, path = node_partition(context.node_config)
    if path is None:
        return _client(cfg, pid, parts)
    task = load_node_ratings(path, source_of(cfg, RATING_SOURCE_KEYS))
    first, count = cohort_range(task.n_clients, pid, parts)
    return SubmodelClient(task, first, count, pid, parts,
                          reproducible_noise=cfg.dp_reproducible_noise)  # fmt: skip


@lru_cache(maxsize=64)
def _client(cfg: AppConfig, partition_id: int, num_partitions: int) -> SubmodelClient:
    task = load_task(cfg)
    first, count = cohort_range(task.n_clients, partition_id, num_partitions)
    return SubmodelClient(task, first, count, partition_id, num_partitions,
                          reproducible_noise=cfg.dp_reproducible_noise)  # fmt: skip


def summary_line(summary: dict) -> str:
    """Return the one-line result printed at the end of a run (the torch tasks' too)."""
    if "test-auc" in summary:  # Amazon's DIN
        metric = f"test AUC {summary['test-auc']:.4f} (best {summary['best-test-auc']:.4f})"
    elif summary.get("dataset") in TORCH_DATASETS:
        metric = f"test accuracy {summary.get('test-accuracy', float('nan')):.4f}"
    else:
        metric = (
            f"test accuracy {summary['test-accuracy']:.4f}, feature heat dispersion "
            f"{summary['feature-heat-dispersion']:.0f}, bad replies {summary['bad-replies']}"
        )
    return (
        f"{summary['algorithm']} on {summary['dataset']} (K={summary['clients-per-round']}, "
        f"{summary['rounds']} rounds, seed={summary['seed']}, {summary['engine']} engine): "
        f"train loss {summary['train-loss']:.5f} (min {summary['min-train-loss']:.5f}), "
        f"{metric}; results in {summary['run-folder']}"
    )
