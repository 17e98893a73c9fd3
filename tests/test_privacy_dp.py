"""Shuffle-model differential privacy of FedSM's sums (Appendix C) and client-level Gaussian
DP of MaxFL and FedSubAvg: calibration, estimator, and the same run on every engine (with and
without secure aggregation).

The engine-equality tests run in the research mode ``dp-reproducible-noise`` (noise keyed by
the seed, so both engines draw the same): by default the noise comes from each node's OS
entropy and no two runs agree (tests/test_dp_against_server.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from flwr.app import ArrayRecord
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun, cohort_report
from flower_app.algorithms.fedsm.shuffle_dp import (
    ShuffleDP,
    bits_for,
    calibrate_flip,
    compose,
    debias_counts,
    hockey_stick,
    local_epsilon,
    query_delta,
    randomize_counts,
)
from flower_app.clients.adapter import numpy_client_app
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.submodular import SubmodularClient
from flower_app.privacy import SecureAggregation
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from flower_app.strategies.cohort.fedsubavg import FedSubAvgCohorts
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import MaxRowObjective
from tests.support.local_grid import LocalGrid
from tests.test_secure_aggregation import N_USERS, M, _ratings


def _exact_delta(n: int, k: int, p: float, eps: float, a: int) -> float:
    """δ(ε) of the count when the other clients hold ``a`` one-bits (no bound)."""
    m = (n - 1) * k
    others = np.convolve(stats.binom.pmf(np.arange(a + 1), a, 1 - p / 2),
                         stats.binom.pmf(np.arange(m - a + 1), m - a, p / 2))  # fmt: skip
    high = np.convolve(others, stats.binom.pmf(np.arange(k + 1), k, 1 - p / 2))
    low = np.convolve(others, stats.binom.pmf(np.arange(k + 1), k, p / 2))
    return max(hockey_stick(high, low, eps), hockey_stick(low, high, eps))


@settings(max_examples=12, deadline=None)
@given(st.integers(2, 80), st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0]),
       st.sampled_from([1e-5, 1e-6]))  # fmt: skip
def test_calibrated_flip_is_private_against_the_exact_worst_cases(n, eps, delta) -> None:
    k = bits_for(eps, n)
    p = calibrate_flip(n, k, eps, delta)
    assert query_delta(n, k, p, eps) <= delta
    m = (n - 1) * k
    for a in (0, m // 3, m // 2, m):  # whatever the other clients hold
        assert _exact_delta(n, k, p, eps, a) <= delta
    if p > 0.01:  # and clearly less noise would not be private (the bound is not vacuous)
        assert _exact_delta(n, k, p * 0.5, eps, 0) > delta


def test_more_privacy_needs_more_flips() -> None:
    flips = [calibrate_flip(60, 8, eps, 1e-6) for eps in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert flips == sorted(flips, reverse=True) and 0 < flips[-1] < flips[0] <= 1


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(0, 5), min_size=3, max_size=40), st.integers(1, 40),
       st.floats(0.05, 0.95))  # fmt: skip
def test_the_debiased_count_is_an_unbiased_estimate_of_the_sum(values, k, p) -> None:
    """Mean over 4,000 independent runs within 5 standard errors of Σ values."""
    x = np.asarray(values)
    rng = np.random.default_rng(len(values) * 1000 + k)
    runs = 4000
    counts = randomize_counts(np.tile(x, (runs, 1)), 5.0, k, np.full(x.size, p), rng).sum(axis=1)
    est = debias_counts(counts, np.full(runs, x.size), 5.0, k, np.full(runs, p))
    se = est.std(ddof=1) / np.sqrt(runs)
    assert abs(est.mean() - x.sum()) <= 5 * se + 1e-9


def test_composition_reports_basic_and_advanced_bounds() -> None:
    out = compose(0.1, 1e-7, 400, slack=1e-6)
    assert out["dp-epsilon-basic"] == pytest.approx(40.0)
    assert out["dp-delta-basic"] == pytest.approx(4e-5)
    assert out["dp-epsilon-advanced"] < 40.0 and out["dp-delta-advanced"] == pytest.approx(4.1e-5)
    big = compose(8.0, 1e-6, 10)  # advanced is worse than basic for large ε': basic kept
    assert big["dp-epsilon-advanced"] == big["dp-epsilon-basic"] == 80.0
    with pytest.raises(ValueError, match="epsilon"):
        ShuffleDP(0.0)


# ---------------------------------------------------------------------------- FedSM
K_SET = 4


def _params(eps: float, reproducible: bool = False) -> FedSMParams:
    return FedSMParams("alg1", 0.6, 0.6, dp_epsilon=eps, dp_delta=1e-6,
                       dp_reproducible=reproducible)  # fmt: skip


def _direct(eps: float, ratings: np.ndarray) -> tuple[list[int], list[dict]]:
    """The direct engine in the research mode (noise keyed by the seed)."""
    run = FedSMRun(N_USERS, UniformMatroid(M, K_SET), K_SET, _params(eps, True), 5.0, seed=11)
    obj = MaxRowObjective(sp.csr_matrix(ratings))
    rows = []
    while not run.done:
        plan = run.plan()
        total, _ = cohort_report(obj, plan.users, plan.users, plan, 11, reproducible_noise=True)
        rows.append(run.update(total, plan.users.size))
    return run.selected, rows


def _reproducible_cohort_app(ratings: np.ndarray):
    """Cohort nodes whose own configuration asks for the research mode."""

    def factory(context):
        p, parts = context.node_config["partition-id"], context.node_config["num-partitions"]
        first, count = cohort_range(N_USERS, p, parts)
        rows = MaxRowObjective(sp.csr_matrix(ratings[first : first + count]))
        return SubmodularClient(rows, first, N_USERS, p, parts, reproducible_noise=True)

    return numpy_client_app(factory)


@pytest.mark.parametrize("secure", [False, True])
def test_dp_fedsm_on_flower_nodes_selects_what_the_direct_engine_does(secure) -> None:
    ratings = _ratings()
    direct, rows = _direct(2.0, ratings)
    strategy = FedSMCohorts(
        N_USERS, UniformMatroid(M, K_SET), K_SET, _params(2.0, True), seed=11, lam=5.0,
        secure_aggregation=SecureAggregation() if secure else None,
    )  # fmt: skip
    app = _reproducible_cohort_app(ratings)
    strategy.start(LocalGrid(5, {}, app=app), ArrayRecord(), K_SET, timeout=2)
    assert strategy.run.selected == direct
    got = [r for r in strategy.history if r["server-round"] >= 1]
    for a, b in zip(got, rows, strict=True):
        assert a["estimate"] == pytest.approx(b["estimate"], rel=1e-12)
        assert a["dp-bits"] == b["dp-bits"] >= 1 and 0 < a["dp-flip-mean"] < 1
        assert a["dp-epsilon-outsider"] == b["dp-epsilon-outsider"] > 0  # shuffle bound
        assert a["dp-reproducible-noise"] == 1 and a["dp-secure-sum"] == int(secure)
        # if the other users are honest: the shuffle bound when the server sees only
        # totals, else the local one (the direct run assumes replies in the clear)
        local = b["dp-epsilon-honest-peers"]
        assert local > b["dp-epsilon-outsider"]
        assert a["dp-epsilon-honest-peers"] == (a["dp-epsilon-outsider"] if secure else local)
        # against the server, what the nodes verify: the local randomiser summed over each
        # user's values; the nodes' own ledgers report the same figure
        assert a["dp-epsilon"] == pytest.approx(b["dp-epsilon"], rel=1e-12)
        assert a["dp-epsilon-nodes"] == pytest.approx(b["dp-epsilon"], rel=1e-12)
        assert b["dp-epsilon"] >= local
    assert local_epsilon(got[0]["dp-bits"], got[0]["dp-flip-mean"]) > 0


def test_dp_noise_changes_the_estimates_and_more_epsilon_changes_them_less() -> None:
    ratings = _ratings()
    plain_run = FedSMRun(N_USERS, UniformMatroid(M, K_SET), K_SET, _params(0.0), 5.0, seed=11)
    obj = MaxRowObjective(sp.csr_matrix(ratings))
    plan = plain_run.plan()
    truth, _ = cohort_report(obj, plan.users, plan.users, plan, 11)
    errors = []
    for eps in (0.5, 8.0):
        run = FedSMRun(N_USERS, UniformMatroid(M, K_SET), K_SET, _params(eps), 5.0, seed=11)
        dplan = run.plan()
        counts, _ = cohort_report(obj, dplan.users, dplan.users, dplan, 11)
        assert np.array_equal(counts, np.rint(counts))  # counts of ones: integers
        est = debias_counts(counts, run._dp_reporters, 5.0, dplan.dp_bits, dplan.dp_flip)
        errors.append(np.abs(est - truth).mean())
    assert errors[1] < errors[0]


def test_dp_is_refused_where_it_is_not_implemented() -> None:
    from flower_app.config import AppConfig, ConfigError

    with pytest.raises(ConfigError, match="alg1"):  # the declared rule, when cfg is made
        AppConfig.from_run_config({"fedsm-mode": "alg2", "fedsm-dp-epsilon": 1.0})
    with pytest.raises(ValueError, match="rng='per-user'"):
        FedSMRun(10, UniformMatroid(5, 2), 2, FedSMParams(rng="batched", dp_epsilon=1.0), 1.0)


# ---------------------------------------------------------------------------- MaxFL
MAXFL_DP = {
    "algorithm": "maxfl", "dataset": "synthetic-emnist", "num-users": 6,
    "clients-per-round": 4, "maxfl-rounds": 3, "maxfl-eval-every": 3,
    "maxfl-participation": "all", "maxfl-solo-steps": 20, "maxfl-local-steps": 5, "seed": 4,
    "secure-aggregation": True, "maxfl-dp-noise": 0.8, "maxfl-dp-clip": 0.5,
    "dp-reproducible-noise": True,
}  # fmt: skip


@pytest.mark.parametrize("algorithm", ["maxfl", "fedavg"])
def test_dp_maxfl_on_flower_nodes_matches_the_direct_engine(tmp_path, algorithm) -> None:
    """Distributed noise (research mode: keyed by the seed, so both engines draw it alike):
    the Flower run under secure aggregation reaches the direct engine's model within the
    fixed-point error, with the same ε per round (against the server and outsiders), no
    training loss released, and a model that the noise moved away from the non-private
    one; rows and summary.json say the noise gives no privacy against the server."""
    import json

    from direct import run_direct
    from flower_app.config import AppConfig
    from flower_app.runners import maxfl as runner

    def cfg(name: str, **extra) -> AppConfig:
        out = {"output-dir": str(tmp_path), "run-name": name}
        return AppConfig.from_run_config({**MAXFL_DP, "algorithm": algorithm, **extra, **out})

    def rows(name: str) -> list[dict]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["server-round"] >= 1]

    run_direct(cfg("direct"))
    runner.server_run(LocalGrid(3, {**MAXFL_DP, "algorithm": algorithm}), cfg("flower"))
    run_direct(cfg("plain", **{"maxfl-dp-noise": 0.0, "secure-aggregation": False}))
    model = {n: np.load(tmp_path / n / "model.npz") for n in ("direct", "flower", "plain")}
    for key in model["direct"].files:
        np.testing.assert_allclose(model["flower"][key], model["direct"][key], rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    moved = max(np.abs(model["direct"][k] - model["plain"][k]).max() for k in model["plain"].files)
    assert moved > 1e-3
    for key in ("dp-epsilon", "dp-epsilon-outsider", "dp-rounds-worst-client"):
        values = [r[key] for r in rows("direct")]
        assert values == pytest.approx([r[key] for r in rows("flower")], rel=1e-12)
        assert values == sorted(values) and values[0] > 0  # composed over rounds
    assert all(r["dp-epsilon-outsider"] <= r["dp-epsilon"] for r in rows("flower"))
    assert all(r.get("train-loss") is None for r in rows("flower"))  # not released
    assert all(r["dp-reproducible-noise"] == 1 for r in rows("flower"))
    summary = json.loads((tmp_path / "flower" / "summary.json").read_text())
    assert summary["privacy"]["reproducible-noise"] is True
    assert "NO privacy against the server" in summary["privacy"]["privacy-against-server"]


def test_gaussian_accounting_and_refusals() -> None:
    from flower_app.algorithms.common.gaussian_dp import GaussianDP, gaussian_epsilon
    from flower_app.config import AppConfig, ConfigError
    from flower_app.runners.maxfl import settings

    # more noise, fewer rounds or a smaller sample: less ε
    base = gaussian_epsilon(1.0, 10, 100, 50, 1e-5)
    assert gaussian_epsilon(2.0, 10, 100, 50, 1e-5) < base
    assert gaussian_epsilon(1.0, 10, 100, 10, 1e-5) < base
    assert gaussian_epsilon(1.0, 5, 100, 50, 1e-5) < base
    with pytest.raises(ValueError, match="noise_multiplier"):
        GaussianDP(0.0)
    for bad, match in [({"secure-aggregation": False}, "secure-aggregation = true"),
                       ({"maxfl-participation": "flexible"}, "participation = 'all'"),
                       ({"algorithm": "qffl"}, "implemented for maxfl, fedavg")]:  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            settings(AppConfig.from_run_config({**MAXFL_DP, **bad}))


# ---------------------------------------------------------------------------- FedSubAvg
def test_dp_fedsubavg_on_flower_nodes_matches_the_direct_engine() -> None:
    """Clipped submodel updates, noise on the whole heat support: the Flower run (secure
    aggregation, 3 nodes) reaches the direct engine's x within the fixed-point error, the
    server's union is the support (no client's rows), and ε grows with the rounds."""
    from direct.fedsubavg import run_direct_rounds
    from flower_app.config import AppConfig
    from flower_app.runners.fedsubavg import load_task, run_spec

    run_config = {"algorithm": "fedsubavg", "dataset": "synthetic-movielens-rating",
                  "num-users": 45, "num-elements": 40, "clients-per-round": 8, "fsa-rounds": 4,
                  "seed": 5, "secure-aggregation": True, "fsa-dp-noise": 0.5,
                  "fsa-dp-clip": 0.5, "dp-reproducible-noise": True}  # fmt: skip
    cfg = AppConfig.from_run_config(run_config)
    task, spec = load_task(cfg), run_spec(cfg)
    x, history, heat = run_direct_rounds(task, spec)
    strategy = FedSubAvgCohorts(
        "fedsubavg", task.n_clients, task.n_params, 8, seed=5, dp=spec.dp,
        secure_aggregation=SecureAggregation(),
    )  # fmt: skip
    strategy.start(LocalGrid(3, cfg.to_dict()), num_rounds=4)
    np.testing.assert_allclose(strategy.x, x, rtol=0, atol=1e-5)
    plain_x, _, _ = run_direct_rounds(task, run_spec(AppConfig.from_run_config(
        {**run_config, "fsa-dp-noise": 0.0, "secure-aggregation": False,
         "dp-reproducible-noise": False})))  # fmt: skip
    assert np.abs(plain_x - x).max() > 1e-3  # the noise moved the model
    support = int((heat.clients > 0).sum())
    rows = [r for r in strategy.history if r["server-round"] >= 1]
    for fl, di in zip(rows, history, strict=True):
        assert fl["union-rows"] == di["union-rows"] == support
        assert fl["dp-epsilon"] == pytest.approx(di["dp-epsilon"], rel=1e-12)
        assert fl["dp-epsilon-outsider"] == pytest.approx(di["dp-epsilon-outsider"], rel=1e-12)
        assert fl["dp-clients-in-sum"] == di["dp-clients-in-sum"] == 8
    eps = [r["dp-epsilon"] for r in rows]
    assert eps == sorted(eps) and eps[0] > 0


def test_the_privacy_sweep_writes_its_table_and_figure(tmp_path) -> None:
    """run_sim.py privacy fedsm-dp on a small instance: CSV rows, the table, the PNG."""
    import csv

    from reproductions.privacy import main

    assert main(["fedsm-dp", "--dataset", "synthetic-facility-location", "--k", "2",
                 "--epsilons", "1", "--seeds", "0", "--out", str(tmp_path)]) == 0  # fmt: skip
    rows = list(csv.DictReader((tmp_path / "dp.csv").read_text().splitlines()))
    assert [r["epsilon"] for r in rows] == ["none", "1.0"]
    assert float(rows[1]["dp-epsilon-basic"]) > 0 and float(rows[0]["ratio-to-greedy"]) > 0
    assert "| 1 | 1 |" in (tmp_path / "dp.md").read_text()
    assert (tmp_path / "dp.png").stat().st_size > 10_000
