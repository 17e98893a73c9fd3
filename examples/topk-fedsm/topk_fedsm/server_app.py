"""ServerApp: pick k items with FedSM, then compare with centralized greedy."""

from __future__ import annotations

import json
from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from flower_app.strategies import FedSMStrategy
from flower_app.submodular.greedy import greedy
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import FacilityLocation
from topk_fedsm.task import all_scores

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run FedSM Algorithm 1 (k rounds, one item each) and report F(S) / F(greedy)."""
    cfg = context.run_config
    strategy = FedSMStrategy(
        k=int(cfg["k"]),
        clients_per_round=float(cfg["clients-per-round"]),
        elements_per_client=float(cfg["elements-per-client"]),
        seed=int(cfg["seed"]),
        min_available_nodes=int(cfg["min-nodes"]),
        federated_evaluation=True,
    )
    result = strategy.start(grid=grid)
    selected = result.arrays["selected"].numpy().tolist()
    objective = float(
        result.evaluate_metrics_clientapp[max(result.evaluate_metrics_clientapp)]["objective"]
    )

    # Comparison only: the data are synthetic, so the server can regenerate all clients'
    # scores and run centralized greedy (a real deployment could not).
    scores = FacilityLocation(
        all_scores(strategy.n_users, int(cfg["num-items"]), int(cfg["data-seed"]))
    )
    reference = greedy(scores, UniformMatroid(scores.n_elements, int(cfg["k"])))
    greedy_set, greedy_value = reference.selected, reference.value
    ratio = objective / greedy_value
    print(f"FedSM picked {selected}: F(S) = {objective:.4f}")
    print(f"greedy picks {greedy_set}: F = {greedy_value:.4f}; ratio FedSM / greedy = {ratio:.4f}")
    log(INFO, "objective ratio to greedy: %.4f", ratio)
    if cfg["output-dir"]:
        folder = Path(str(cfg["output-dir"])) / str(cfg["run-name"] or "topk-fedsm")
        folder.mkdir(parents=True, exist_ok=True)
        summary = {
            "selected": selected,
            "objective": objective,
            "greedy-selected": greedy_set,
            "greedy-objective": greedy_value,
            "ratio": ratio,
            "rounds": len(strategy.history),
        }
        (folder / "summary.json").write_text(json.dumps(summary, indent=1))
