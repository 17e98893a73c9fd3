"""examples/recsys-fedsubavg: a PyTorch recommender switched from FedAvg to FedSubAvg.

The example runs with ``flwr run`` on a private SuperLink (10 simulated nodes, synthetic
ratings); its README's claim that the switch is small is checked on the files themselves.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from flower_app.simulation import LocalSimulation

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "recsys-fedsubavg"
PKG = EXAMPLE / "recsys_fedsubavg"


def _changed_lines(old: str, new: str) -> int:
    a = (PKG / old).read_text().splitlines()
    b = (PKG / new).read_text().splitlines()
    return sum(
        1
        for line in difflib.unified_diff(a, b, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )


def test_switching_from_fedavg_changes_few_lines() -> None:
    assert _changed_lines("client_app_fedavg.py", "client_app.py") <= 20
    assert _changed_lines("server_app_fedavg.py", "server_app.py") <= 8


@pytest.mark.flwr
@pytest.mark.long
def test_recsys_example_runs_with_flwr_run_and_the_loss_goes_down(tmp_path) -> None:
    cli = LocalSimulation(tmp_path / "home", tmp_path / "runs", project=EXAMPLE)
    try:
        # every node trains: sampling half of them goes by Flower's random node ids, so the
        # runs (and whether 3 rounds lower the loss) would differ from run to run
        run = cli.run({"num-server-rounds": 3, "fraction-train": 1.0}, num_supernodes=10,
                      timeout=300)  # fmt: skip
    finally:
        cli.stop()
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    losses = json.loads((run.folder / "result.json").read_text())["eval-loss"]
    values = [losses[k] for k in sorted(losses, key=int)]
    assert len(values) == 3
    assert values[-1] < values[0]
    assert "synthetic-ratings: evaluation loss" in run.output
