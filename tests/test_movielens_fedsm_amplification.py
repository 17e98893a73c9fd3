"""Amplification (FedSM Alg. 3) against Alg. 1 at equal budget on MovieLens-1M (realdata, slow).

k = 20, K = 1 % of users, d = 10 % of movies, η = 0.1 (10 steps of Alg. 1 on the exact
surrogate), seeds 0-2; Alg. 1 gets the same total budget as 10·K users per round. See
docs/reproductions/fedsm-amplification.md.
"""

from __future__ import annotations

import numpy as np
import pytest

from direct import run_direct
from flower_app.config import AppConfig

pytestmark = [pytest.mark.realdata, pytest.mark.slow]

BASE = {"dataset": "movielens", "k": 20, "elements-per-client": 0.1}


def _ratios(tmp_path, override: dict) -> float:
    ratios = []
    for seed in (0, 1, 2):
        config = {**BASE, **override, "seed": seed, "output-dir": str(tmp_path)}
        ratios.append(run_direct(AppConfig.from_run_config(config))["ratio-to-greedy"])
    return float(np.mean(ratios))


def test_amplification_with_greedy_rounding_beats_alg1_at_equal_budget(tmp_path) -> None:
    amplified = {
        "clients-per-round": 0.01,
        "fedsm-mode": "amplified",
        "fedsm-eta": 0.1,
        "fedsm-rounding": "greedy",
    }
    alg1_equal_budget = _ratios(tmp_path, {"clients-per-round": 0.1})
    assert _ratios(tmp_path, amplified) >= alg1_equal_budget  # measured 0.988 vs 0.976
    # with pipage rounding it does not (measured 0.953): see the README
    pipage = _ratios(tmp_path, {**amplified, "fedsm-rounding": "pipage"})
    assert pipage < alg1_equal_budget
