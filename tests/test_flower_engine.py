"""Flower's simulation engine (Ray): run folder, status, engine agreement; `flwr run .` for
real where the command itself is what is checked."""

from __future__ import annotations

import json

import pytest

from direct import run_direct
from flower_app.config import AppConfig

pytestmark = pytest.mark.flwr

SMALL = {
    "num-users": 40,
    "num-elements": 60,
    "k": 5,
    "clients-per-round": 0.25,
    "elements-per-client": 0.2,
    "seed": 7,
}


def _direct(tmp_path, run_config: dict) -> dict:
    cfg = AppConfig.from_run_config(
        {**run_config, "output-dir": str(tmp_path), "run-name": "direct"}
    )
    return run_direct(cfg)


@pytest.mark.long
def test_flwr_run_on_20_supernodes_writes_run_folder(flwr_cli, tmp_path) -> None:
    """The real `flwr run . --stream` (own SuperLink, FAB, `flwr ls`): what the command prints
    (one summary line, no warning a user cannot act on) is what is checked, so it cannot run
    in-process."""
    run = flwr_cli.run({"k": 6, "seed": 3}, num_supernodes=20)
    assert run.status == "finished:completed", run.output
    config = json.loads((run.folder / "config.json").read_text())
    assert config["engine"] == "flower" and config["k"] == 6
    rows = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["server-round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r["bytes-up"] > 0 and r["bytes-down"] > 0 and r["bad-replies"] == 0 for r in rows)
    objectives = [r["objective"] for r in rows]
    assert objectives == sorted(objectives)  # monotone F along the run
    summary = run.summary
    assert "ratio" in run.output and summary["run-folder"] in run.output
    # one summary line; no warning the user cannot act on (Ray's accelerator FutureWarning,
    # each Ray actor's "Manually terminating ClientAppActor")
    assert run.output.count(summary["run-folder"]) == 2  # "run folder: ..." + the summary
    assert "FutureWarning" not in run.output and "Manually terminating" not in run.output
    assert "fedsubavg" not in config and "fsa-lr" not in config and "maxfl-rounds" not in config
    direct = _direct(tmp_path, {"k": 6, "seed": 3})
    assert summary["selected"] == direct["selected"]
    assert summary["objective"] == pytest.approx(direct["objective"])


@pytest.mark.parametrize(
    "num_supernodes",
    [2, pytest.param(16, marks=pytest.mark.long), pytest.param(40, marks=pytest.mark.long)],
)
def test_same_set_whatever_the_split_of_users_over_nodes(
    flower_cli, tmp_path, num_supernodes
) -> None:
    run = flower_cli.run(SMALL, num_supernodes=num_supernodes)
    assert run.status == "finished:completed", run.output
    assert run.summary["selected"] == _direct(tmp_path, SMALL)["selected"]
    rows = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert max(r["nodes"] for r in rows) <= min(num_supernodes, 10)  # only nodes with sampled users


@pytest.mark.long
def test_invalid_config_fails_the_run_before_any_round(flwr_cli) -> None:
    """The real `flwr run . --stream`: a bad --run-config value must reach the user as a
    failed run (status from `flwr ls`) with the reason, which only the command shows.

    ``long`` (CI): a real SuperLink, ``flwr-simulation`` and Ray for one refusal, ~30 s of
    the default suite's 4 minutes; the default suite checks the refusal itself
    (``test_config.py``) and ``flower-app run``'s preflight (``test_cli_preflight.py``)."""
    run = flwr_cli.run({"k": 999}, num_supernodes=2)
    assert run.status == "finished:failed"
    assert "'k' = 999 exceeds the 500 elements" in run.output + run.details
    assert not (run.folder / "metrics.jsonl").exists()


@pytest.mark.long
def test_real_superlink_and_supernodes_on_loopback(deployment, tmp_path) -> None:
    """Deployment mode: a SuperLink and 2 SuperNode processes; same S as the direct engine."""
    config = {**SMALL, "k": 3}
    run = deployment.run(config)
    assert run.status == "finished:completed", run.output
    assert run.summary["selected"] == _direct(tmp_path, config)["selected"]
    rows = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["bad-replies"] == 0 for r in rows)
