"""FedSM Algorithm 1 on the real MovieLens-1M (marker ``realdata``; CI runs it)."""

from __future__ import annotations

import numpy as np
import pytest

from direct import run_direct
from flower_app.config import AppConfig

pytestmark = pytest.mark.realdata

KS = [5, 10, 15, 20, 25, 30]


def _ratios(tmp_path, clients: float, elements: float, seed: int) -> np.ndarray:
    cfg = AppConfig.from_run_config(
        {
            "dataset": "movielens",
            "k": 30,
            "clients-per-round": clients,
            "elements-per-client": elements,
            "seed": seed,
            "output-dir": str(tmp_path),
            "run-name": f"K{clients}-d{elements}-s{seed}",
        }
    )
    summary = run_direct(cfg)
    assert summary["dataset"] == "movielens-1m"
    ours, greedy = np.array(summary["objective-by-k"]), np.array(summary["greedy-by-k"])
    return ours[np.array(KS) - 1] / greedy[np.array(KS) - 1]


def test_instance_is_movielens_1m(tmp_path) -> None:
    cfg = AppConfig.from_run_config({"dataset": "movielens", "k": 5, "output-dir": str(tmp_path)})
    summary = run_direct(cfg)
    config = (tmp_path / summary["run-folder"].split("/")[-1] / "config.json").read_text()
    assert '"n-users": 6040' in config and '"n-elements": 3706' in config


def test_alg1_with_10pct_users_and_10pct_elements_reaches_94pct(tmp_path) -> None:
    """Issue claim: K = 10 %, d = 10 %, mean of 3 seeds: >= 94 % of greedy for k = 5..30."""
    mean = np.mean([_ratios(tmp_path, 0.1, 0.1, seed) for seed in (0, 1, 2)], axis=0)
    assert np.all(mean >= 0.94), dict(zip(KS, mean.round(4), strict=True))


def test_alg1_with_10pct_users_and_40pct_elements(tmp_path) -> None:
    """Issue claim: K = 10 %, d = 40 %: >= 98 % of greedy for every k = 5..30.

    It holds from k = 15 on; at k = 5 and 10 we measure 97.6 % and 97.7 % (mean of seeds
    0-2; 97.7 % and 97.8 % over seeds 0-5), so the claim does not reproduce there by about
    0.3 points (see docs/reproductions/fedsm-alg1.md). The test pins what we
    measured: >= 97 % everywhere, >= 98 % for k >= 15.
    """
    mean = np.mean([_ratios(tmp_path, 0.1, 0.4, seed) for seed in (0, 1, 2)], axis=0)
    shown = dict(zip(KS, mean.round(4), strict=True))
    assert np.all(mean >= 0.97), shown
    assert np.all(mean[2:] >= 0.98), shown


def test_full_information_is_centralized_greedy(tmp_path) -> None:
    cfg = AppConfig.from_run_config(
        {
            "dataset": "movielens",
            "k": 10,
            "clients-per-round": 1.0,
            "elements-per-client": 1.0,
            "output-dir": str(tmp_path),
        }
    )
    summary = run_direct(cfg)
    assert summary["selected"] == summary["greedy-selected"]
