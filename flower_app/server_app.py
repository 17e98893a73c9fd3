"""ServerApp: run_config -> the algorithm's runner -> run over the grid -> run folder.

For the submodular families the server loads the instance too, for what the algorithms
themselves never use: a partition matroid's element groups, the true F(S) of each round (an
experiment oracle recorded in ``metrics.jsonl``) and the centralized-greedy reference; with
``server-data = "none"`` it reads no client data (``docs/node-local-data.md``).
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from logging import INFO

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from flower_app.config import AppConfig
from flower_app.quiet import quiet_flower_logs
from flower_app.registry import load_runner
from flower_app.results import run_session

__all__ = ["app"]

# Ray (Flower's simulation backend, started in this process after the ServerApp is loaded)
# warns on every run that it will stop overriding CUDA_VISIBLE_DEVICES for actors with
# num_gpus=0; opting in to that future behaviour now is what the warning asks for and is
# what a CPU-only ClientApp wants. A value set by the user wins.
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

quiet_flower_logs()  # e.g. the simulation's error per node without a handler, once

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the configured algorithm and write the run folder."""
    with run_session(_accepted_at(grid)):
        cfg = AppConfig.from_run_config(context.run_config)
        runner = load_runner(cfg.algorithm)
        summary = runner.server_run(grid, cfg)
    line = runner.summary_line(summary)
    log(INFO, line)


def _accepted_at(grid: Grid) -> float | None:
    """Return when the SuperLink accepted the run (Unix time), or None if Flower does not say.

    ``summary.json``'s ``run-wall-time`` counts from there: the simulation engine's start,
    the ServerApp's imports and the data loading are part of what a user waits for. A time
    in the future (clocks of two machines) is not used.
    """
    try:
        stamp = grid.run.pending_at
        accepted = datetime.fromisoformat(stamp).timestamp() if stamp else None
    except Exception:  # a grid without run details: count from now (timing only, never fatal)
        return None
    return accepted if accepted is not None and accepted <= time.time() else None
