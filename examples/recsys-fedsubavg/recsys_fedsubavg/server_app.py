"""recsys-fedsubavg: the ServerApp (trains the recommender, writes the losses)."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from flower_app.strategies import FedSubAvgStrategy
from recsys_fedsubavg.task import SPARSE_KEYS, dataset, make_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train the recommender over the nodes and write the evaluation losses."""
    cfg = context.run_config
    torch.manual_seed(int(cfg["seed"]))
    model = make_model(cfg)
    arrays = ArrayRecord(model.state_dict())

    strategy = FedSubAvgStrategy(
        SPARSE_KEYS, fraction_train=cfg["fraction-train"], fraction_evaluate=1.0, seed=cfg["seed"]
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": cfg["lr"]}),
        num_rounds=cfg["num-server-rounds"],
    )

    losses = {t: m["eval_loss"] for t, m in sorted(result.evaluate_metrics_clientapp.items())}
    print(f"{dataset(cfg).name}: evaluation loss (MSE) by round {losses}")
    if cfg["output-dir"]:
        out = Path(cfg["output-dir"]) / cfg["run-name"]
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps({"eval-loss": losses}))
        torch.save(result.arrays.to_torch_state_dict(), out / "final_model.pt")
