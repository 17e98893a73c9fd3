"""ServerApp: Flower's FedAvg on MaxFL's MLP (quickstart-pytorch shape), timed per round.

A round is what ``FedAvg.start`` does per round: send train messages to the nodes
(``fraction-train`` of them; 1.0 = every node), wait, aggregate; send evaluate messages to
every node, wait, aggregate. The timer subclass only records ``time.perf_counter()`` at each
phase; the metric aggregation keeps, besides FedAvg's weighted means, the slowest node's
ClientApp times (``startup-s``, ``load-s``, ``work-s``, ``cpu-s``), which decide the round.
Nothing else differs from Flower's FedAvg. The initial model is MaxFL's
(:func:`flower_app.models.mlp.init_weights` with the run's ``seed``).

What matches a MaxFL round of ``benchmarks/deploy_rounds.py`` and what cannot:

* the model (784 → 64 → dropout 0.2 → 30 → 10, float32 weights as a list of arrays), the
  node files, the mini-batch (64), the learning rate (0.05), one torch thread, torch imported
  by every ClientApp process;
* the training work: MaxFL trains K = 5 sampled clients × τ = 10 steps = 50 steps a round
  on the nodes that serve them (its 100 seen clients live on 2 of the 4 nodes, so 2 nodes
  train); here ``fraction-train`` of the nodes train ``local-steps`` each: 0.5 (Flower's
  quickstart-pytorch default) × 4 nodes × 25 steps = 50, or every node × 13 steps = 52;
* not matched: MaxFL's algorithmic extras — ρ_k (each client's solo model, trained once per
  node on first contact: round 0), F_k(w) of the received model before training, the
  discovery and handler-probe exchanges before round 0, and its evaluation (every client's
  test *and* train loss, plus τ_tune = 5 tuning steps per client in the last round, only
  every ``maxfl-eval-every`` rounds). FedAvg evaluates every round (Flower's default), on
  the node's test rows once.
"""

import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from flower_app.models.mlp import init_weights

app = ServerApp()

TIMES = ("startup-s", "load-s", "work-s", "cpu-s")


def _with_slowest(records: list[RecordDict], weighting_key: str) -> MetricRecord:
    """FedAvg's weighted means plus the largest ClientApp time of each kind (``*-max``)."""
    out = aggregate_metricrecords(records, weighting_key)
    for key in TIMES:
        values = [float(m[key]) for r in records for m in r.metric_records.values() if key in m]
        if values:
            out[f"{key}-max"] = max(values)
    return out


class TimedFedAvg(FedAvg):
    """FedAvg that notes when each round's train and evaluate phases start and end."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.marks: dict[int, dict[str, float]] = {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.marks[server_round] = {"train-start": time.perf_counter()}
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        self.marks[server_round]["train-end"] = time.perf_counter()
        return super().aggregate_train(server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.marks[server_round]["evaluate-start"] = time.perf_counter()
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        self.marks[server_round]["evaluate-end"] = time.perf_counter()
        return super().aggregate_evaluate(server_round, replies)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Wait for the nodes, run FedAvg for ``num-server-rounds``, write the timings."""
    cfg = context.run_config
    num_rounds, nodes = int(cfg["num-server-rounds"]), int(cfg["min-nodes"])
    strategy = TimedFedAvg(
        fraction_train=float(cfg["fraction-train"]),
        min_train_nodes=max(1, round(nodes * float(cfg["fraction-train"]))),
        min_evaluate_nodes=nodes,
        min_available_nodes=nodes,
        train_metrics_aggr_fn=_with_slowest,
        evaluate_metrics_aggr_fn=_with_slowest,
    )
    started = time.perf_counter()
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(init_weights(int(cfg["seed"]))),
        num_rounds=num_rounds,
    )
    rounds = []
    for t, m in sorted(strategy.marks.items()):
        row = {
            "server-round": t,
            "round-time": m["evaluate-end"] - m["train-start"],
            "train-time": m["train-end"] - m["train-start"],
            "evaluate-time": m["evaluate-end"] - m["evaluate-start"],
            "wall-time": m["evaluate-end"] - started,
        }
        for phase, metrics in (("train", result.train_metrics_clientapp.get(t)),
                               ("evaluate", result.evaluate_metrics_clientapp.get(t))):  # fmt: skip
            for key, value in dict(metrics or {}).items():
                row[f"{phase}-{key}"] = float(np.asarray(value))
        rounds.append(row)
    out = str(cfg.get("out-file", ""))
    if out:
        Path(out).write_text(json.dumps(rounds, indent=2))
