"""ServerApp: Flower's FedAvg with its defaults on a dummy model, timed per round.

A round is what ``FedAvg.start`` does per round: send train messages to every node, wait,
aggregate; send evaluate messages to every node, wait, aggregate. The timer subclass only
records ``time.perf_counter()`` at each phase; nothing else differs from Flower's FedAvg.
"""

import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


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
    num_rounds = int(context.run_config["num-server-rounds"])
    nodes = int(context.run_config["min-nodes"])
    strategy = TimedFedAvg(min_train_nodes=nodes, min_evaluate_nodes=nodes,
                           min_available_nodes=nodes)
    strategy.start(grid=grid, initial_arrays=ArrayRecord([np.ones((1, 1))]),
                   num_rounds=num_rounds)
    rounds = []
    for t, m in sorted(strategy.marks.items()):
        rounds.append({
            "server-round": t,
            "round-time": m["evaluate-end"] - m["train-start"],
            "train-time": m["train-end"] - m["train-start"],
            "evaluate-time": m["evaluate-end"] - m["evaluate-start"],
        })
    out = str(context.run_config.get("out-file", ""))
    if out:
        Path(out).write_text(json.dumps(rounds, indent=2))
