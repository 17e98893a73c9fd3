"""ServerApp: run_config -> problem + strategy -> run over the grid -> run folder.

The server loads the instance too, for three things the algorithm itself never uses: the
matroid's element groups, the true F(S) of each round (an experiment oracle recorded in
``metrics.jsonl``) and the centralized-greedy reference of the summary.
"""

from __future__ import annotations

from logging import INFO

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from flower_app.config import AppConfig
from flower_app.experiment import finish_run, open_run, summary_line
from flower_app.strategies.fedsm import FedSMStrategy

__all__ = ["app"]

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the configured algorithm and write the run folder."""
    cfg = AppConfig.from_run_config(context.run_config)
    exp = open_run(cfg, "flower")
    log(INFO, "run folder: %s", exp.writer.folder)
    objective = exp.problem.objective
    strategy = FedSMStrategy(
        n_users=exp.problem.n_users,
        matroid=exp.matroid,
        k=cfg.k,
        clients_per_round=cfg.clients_per_round,
        elements_per_client=cfg.elements_per_client,
        seed=cfg.seed,
        evaluate_fn=objective.mean_value,
        on_round=exp.writer.log_round,
        round_timeout=cfg.round_timeout,
        discovery_timeout=cfg.discovery_timeout,
    )
    strategy.start(grid=grid)
    summary = finish_run(exp, list(strategy.server.selected), strategy.history)
    line = summary_line(summary)
    log(INFO, line)
    print(line, flush=True)
