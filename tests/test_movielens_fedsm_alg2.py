"""FedSM Algorithm 2 on the real MovieLens-1M with the authors' parameters (marker ``realdata``).

r = 200, all clients (K = 100 %), at most d = 200 pairs per client, ε = 0.405, τ = 0.006, the
pseudo-code's j ∈ 1..r' and the authors' loop (no cap on threshold levels: until |S| = r).
See docs/reproductions/fedsm-alg2.md for the curves and the paper's statements.
"""

from __future__ import annotations

import numpy as np
import pytest

from direct import run_direct
from flower_app.config import AppConfig
from flower_app.results import read_rows

pytestmark = pytest.mark.realdata

AUTHORS = {
    "dataset": "movielens",
    "k": 200,
    "clients-per-round": 1.0,
    "elements-per-client": 200,
    "fedsm-mode": "alg2",
    "fedsm-epsilon": 0.405,
    "fedsm-tau": 0.006,
    "fedsm-levels": -1,
    "fedsm-j-from": 1,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[tuple[dict, list[dict]]]:
    out = tmp_path_factory.mktemp("alg2")
    result = []
    for seed in (0, 1, 2):
        cfg = AppConfig.from_run_config({**AUTHORS, "seed": seed, "output-dir": str(out)})
        summary = run_direct(cfg)
        result.append((summary, read_rows(summary["run-folder"])))
    return result


def test_reaches_200_elements_in_fewer_than_200_rounds(runs) -> None:
    for summary, rows in runs:
        assert summary["set-size"] == 200
        assert summary["communication-rounds"] == len(rows) < 200
        assert sum(r["elements-added"] for r in rows) == 200


def test_has_at_least_95_percent_of_greedy_at_200(runs) -> None:
    assert np.mean([s["ratio-to-greedy"] for s, _ in runs]) >= 0.95


def test_objective_against_rounds_versus_greedy(runs) -> None:
    """Issue claim: above greedy's curve for the first 100 rounds. Measured: it is not.

    Round 1 adds only the random a_1 and rounds 2-3 trail greedy; from round 4 to about 20
    Alg. 2 is above greedy (it adds blocks of elements); from about round 22 greedy, with
    one good element per round, is above. The test pins what we measured.
    """
    for summary, rows in runs:
        greedy = summary["greedy-by-k"]
        above = [r["objective"] >= greedy[r["server-round"] - 1] for r in rows[:100]]
        assert not any(above[:3])
        assert all(above[3:19])
        assert not all(above[:100])
