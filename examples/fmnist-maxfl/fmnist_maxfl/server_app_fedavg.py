"""ServerApp: train the model with a federated strategy, test it on held-out images."""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fmnist_maxfl.task import Net, load_test, test

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` rounds and report the test accuracy after each."""
    cfg = context.run_config
    fraction_train = float(cfg["fraction-train"])
    testloader = load_test(cfg)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(model, testloader, "cpu")
        return MetricRecord({"test-loss": loss, "test-accuracy": accuracy})

    strategy = FedAvg(fraction_train=fraction_train)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({"lr": float(cfg["lr"])}),
        num_rounds=int(cfg["num-server-rounds"]),
        evaluate_fn=evaluate_fn,
    )
    accuracy = {t: float(m["test-accuracy"]) for t, m in result.evaluate_metrics_serverapp.items()}
    final = accuracy[max(accuracy)]
    print(f"{type(strategy).__name__}: test accuracy by round {accuracy}; final {final:.4f}")
    if cfg["output-dir"]:
        folder = Path(str(cfg["output-dir"])) / str(cfg["run-name"] or "fmnist")
        folder.mkdir(parents=True, exist_ok=True)
        summary = {"strategy": type(strategy).__name__, "accuracy": accuracy, "final": final}
        (folder / "summary.json").write_text(json.dumps(summary, indent=1))
