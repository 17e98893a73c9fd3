"""Seeded FedSM results recorded BEFORE the strategy moved onto the shared RoundStrategy loop.

The recorded reproductions (docs/reproductions/fedsm-*.md) need MovieLens-1M and minutes;
these small runs were computed with the old hand-written ``start()`` loop and must not
change: the default run of the app (direct engine), and cohort-mode runs over an
in-process grid of the package's own ClientApp (Algorithms 1 and 2). Plain mode with one
user per node must give the same set as the recorded cohort run.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.clientapp import ClientApp

from direct import run_direct
from flower_app.clients.fedsm import fedsm_reply
from flower_app.config import AppConfig
from flower_app.problems import load_problem
from flower_app.runners.fedsm import fedsm_params, server_run
from flower_app.strategies.fedsm import FedSMStrategy
from flower_app.submodular.objectives import MaxRowObjective
from tests.support.local_grid import LocalGrid

#: `flwr run .` with the default run_config (also what `flwr run .` prints: F(S) = 3.4075)
DEFAULT = ([430, 288, 14, 294, 194, 8, 481, 158, 179, 247], 3.4075)
SMALL = {"num-users": 60, "num-elements": 40, "k": 4, "seed": 5}
#: cohort mode, 4 nodes, recorded before the change
RECORDED = {
    "alg1": ([14, 15, 0, 34], 1.3),
    "alg2": ([21, 31, 38, 11], 0.3333333333333333),
}


def test_default_run_is_unchanged(tmp_path) -> None:
    cfg = AppConfig.from_run_config({"output-dir": str(tmp_path), "run-name": "default"})
    summary = run_direct(cfg)
    assert (summary["selected"], summary["objective"]) == (DEFAULT[0], pytest.approx(DEFAULT[1]))


@pytest.mark.parametrize("mode", list(RECORDED))
def test_cohort_mode_over_the_packages_client_app_is_unchanged(tmp_path, mode) -> None:
    rc = {**SMALL, "fedsm-mode": mode, "output-dir": str(tmp_path), "run-name": mode}
    summary = server_run(LocalGrid(4, rc), AppConfig.from_run_config(rc))
    selected, objective = RECORDED[mode]
    assert summary["selected"] == selected
    assert summary["objective"] == pytest.approx(objective)


@pytest.mark.parametrize("mode", list(RECORDED))
def test_plain_mode_with_one_user_per_node_gives_the_recorded_set(tmp_path, mode) -> None:
    rc = {**SMALL, "fedsm-mode": mode, "output-dir": str(tmp_path), "run-name": mode}
    cfg = AppConfig.from_run_config(rc)
    obj = load_problem(cfg).objective
    app = ClientApp()

    @app.train()
    def train(msg, context):
        user = int(context.node_config["partition-id"])
        return fedsm_reply(msg, context, MaxRowObjective(obj.values[user : user + 1]))

    strategy = FedSMStrategy(k=cfg.k, seed=cfg.seed, params=fedsm_params(cfg))
    result = strategy.start(LocalGrid(obj.n_users, {}, app=app))
    selected = result.arrays["selected"].numpy()
    assert selected.tolist() == RECORDED[mode][0]
    assert obj.mean_value(selected) == pytest.approx(RECORDED[mode][1])
    assert strategy.n_users == obj.n_users and np.isclose(strategy.lam, obj.max_singleton)
