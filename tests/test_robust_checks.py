"""Checks on dishonest reports: overflow-checked sums, range and draw checks, claim budgets."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from direct.fedsm import run_rounds
from flower_app.algorithms.fedcg.discrete_greedy import (
    FIXED_POINT_SCALE,
    DiscreteGreedyServer,
    discrete_report_sum,
)
from flower_app.algorithms.fedsm.core import user_report_sum
from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun
from flower_app.algorithms.fedsm.sampling import user_draw
from flower_app.algorithms.robust.budget import ClaimBudget
from flower_app.algorithms.robust.guard import UserGuard
from flower_app.algorithms.robust.history import (
    CLAMPS,
    NOISE_AWARE_MARGIN,
    GainHistory,
    clamp_margin,
)
from flower_app.algorithms.robust.reports import ReportTally, coin_refusals, refusal_reason
from flower_app.algorithms.robust.sums import (
    ReportOverflowError,
    checked_int_add,
    checked_int_sum,
)
from flower_app.datasets.synthetic import synthetic_facility_location
from flower_app.submodular.greedy import greedy
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import FacilityLocation

INT64_MAX = np.iinfo(np.int64).max


def test_a_report_that_wraps_the_sum_is_refused_by_name() -> None:
    """2^63 − 1 added to a positive sum would turn it negative: refused, sum unchanged."""
    total = np.array([5, 0, 7], dtype=np.int64)
    evil = np.array([INT64_MAX, 0, 0], dtype=np.int64)
    with pytest.raises(ReportOverflowError, match="element 0"):
        checked_int_add(total, evil)
    np.testing.assert_array_equal(total, [5, 0, 7])
    # the same value alone fits: only the wrap is refused
    np.testing.assert_array_equal(checked_int_add(np.zeros(3, np.int64), evil), evil)
    with pytest.raises(ReportOverflowError):
        checked_int_sum([evil, np.array([1, 0, 0])], 3)
    with pytest.raises(ReportOverflowError, match="above 2"):
        checked_int_add(np.zeros(1, np.int64), np.array([2**63], dtype=np.uint64))
    with pytest.raises(ValueError, match="integer"):
        checked_int_add(np.zeros(1, np.int64), np.array([1.0]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=2, max_size=6))
def test_checked_sum_is_exact_or_refuses(values) -> None:
    """Either the int64 sum equals the exact integer sum, or it is refused."""
    vectors = [np.array([v], dtype=np.int64) for v in values]
    running = 0
    try:
        total = checked_int_sum(vectors, 1)
    except ReportOverflowError:
        partial = np.cumsum(np.array(values, dtype=object))
        assert any(p < -(2**63) or p > 2**63 - 1 for p in partial)
        return
    for v in values:
        running += v
    assert int(total[0]) == running


def test_refusal_reasons() -> None:
    """Range (negative, non-finite, above the bound), draw, malformed; honest passes."""
    ids = np.array([1, 4, 6])
    assert refusal_reason(ids, np.array([1.0, 5.0, 0.0]), 5.0) is None
    assert refusal_reason(ids, np.array([1.0, 5.5, 0.0]), 5.0) == "range"
    assert refusal_reason(ids, np.array([1.0, -1.0, 0.0]), 5.0) == "range"
    assert refusal_reason(ids, np.array([np.nan, 1.0, 0.0]), 5.0) == "range"
    assert refusal_reason(ids, np.array([1.0, 1e140, 0.0]), 5.0) == "range"
    assert refusal_reason(ids, np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 2.0])) == "range"
    draw = np.array([1, 4, 9])
    assert refusal_reason(ids, np.array([1.0, 2.0, 0.0]), 5.0, draw) is None  # 0 outside: ok
    assert refusal_reason(ids, np.array([1.0, 2.0, 3.0]), 5.0, draw) == "draw"
    assert refusal_reason(np.array([1, 1]), np.array([1.0, 1.0]), 5.0) == "malformed"


def test_tally_row_counts_every_reason() -> None:
    tally = ReportTally()
    tally.refuse("range")
    tally.refuse("overflow", 2)
    tally.clip(3)
    tally.clip(0)
    row = tally.row()
    assert row["reports-refused"] == 3
    assert row["refused-range"] == 1 and row["refused-overflow"] == 2
    assert row["reports-clipped"] == 1 and row["values-clipped"] == 3
    with pytest.raises(ValueError, match="unknown"):
        tally.refuse("mood")


def test_budget_clips_a_liar_once_spent() -> None:
    """A user who claimed λ on a selected element can claim nothing more."""
    budget = ClaimBudget(3, 5.0)
    claims, n = budget.clip(np.array([0, 0, 1]), np.array([5.0, 5.0, 2.0]))
    assert n == 0
    budget.charge(np.array([0, 1]), np.array([5.0, 2.0]))
    claims, n = budget.clip(np.array([0, 1, 2]), np.array([5.0, 5.0, 5.0]))
    np.testing.assert_allclose(claims, [0.0, 3.0, 5.0], atol=1e-8)
    assert n == 2
    assert budget.exhausted() == 1
    with pytest.raises(ValueError, match="positive"):
        ClaimBudget(2, 0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_honest_fedsm_users_pass_every_check(seed) -> None:
    """FedSM Alg. 1 on facility location: every honest report passes range, draw and the
    budget across the run (Σ_t f_i(e_t | S_{t−1}) = f_i(S) ≤ max rating): nothing refused
    or clipped, whatever rounds a user is sampled in."""
    rm = synthetic_facility_location(120, 40, seed=seed)
    obj = FacilityLocation(rm.values)
    lam = obj.max_singleton
    k, d = 12, 10
    budget = ClaimBudget(obj.n_users, lam)
    rng = np.random.default_rng(seed)
    selected: list[int] = []
    tally = ReportTally()
    for t in range(1, k + 1):
        users = np.sort(rng.choice(obj.n_users, 60, replace=False))  # half: users return
        pool = np.setdiff1d(np.arange(obj.n_elements), selected)
        total = np.zeros(obj.n_elements)
        reports = []
        for u in users:
            vec = user_report_sum(obj, np.array([u]), selected, d, seed, t)
            draw = np.sort(pool[user_draw(int(u), pool.size, d, seed, t)])
            ids = np.flatnonzero(vec)
            reason = refusal_reason(ids, vec[ids], lam, draw)
            if reason is not None:
                tally.refuse(reason)
            vals, n_clip = budget.clip(np.full(ids.size, u), vec[ids])
            tally.clip(n_clip)
            total[ids] += vals
            reports.append((u, ids, vals))
        e = int(np.argmax(np.where(np.isin(np.arange(obj.n_elements), selected), -1, total)))
        for u, ids, vals in reports:
            hit = vals[ids == e]
            if hit.size:
                budget.charge(np.array([u]), hit)
        selected.append(e)
    assert tally.row()["reports-refused"] == 0
    assert tally.row()["values-clipped"] == 0
    # the ledger never books more than what a user holds from S
    held = obj.user_values(selected)
    assert np.all(budget.spent <= held + 1e-9)


def test_honest_greedy_claims_telescope_to_the_users_value() -> None:
    """Claims of every user on greedy's elements sum to f_i(S) exactly (the budget's basis)."""
    rm = synthetic_facility_location(80, 30, seed=3)
    obj = FacilityLocation(rm.values)
    res = greedy(obj, UniformMatroid(obj.n_elements, 8), 8)
    spent = np.zeros(obj.n_users)
    current = np.zeros(obj.n_users)
    for e in res.selected:
        after = obj.update_current(current, e)
        spent += after - current
        current = after
    np.testing.assert_allclose(spent, obj.user_values(res.selected), rtol=0, atol=1e-12)
    assert spent.max() <= obj.max_singleton


def _discrete_server(report_bound: float | None) -> DiscreteGreedyServer:
    server = DiscreteGreedyServer(50, UniformMatroid(6, 2), 2, 1.0, report_bound=report_bound)
    server.set_histogram(np.array([10.0, 8.0, 1.0, 1.0, 0.5, 0.0]))
    return server


@pytest.mark.parametrize("report_bound", [None, 5.0])
def test_discrete_greedy_refuses_a_wrapping_node_by_name(report_bound) -> None:
    """One node sends 2^63 − 1 on the best element: refused as an overflow (whether or not
    the range is checked), counted in the round's record; the honest node's sum decides."""
    server = _discrete_server(report_bound=report_bound)
    honest = (np.array([9, 7, 1, 0, 0, 0], dtype=np.int64) * int(FIXED_POINT_SCALE), 12)
    evil = (np.array([INT64_MAX, 0, 0, 0, 0, 0], dtype=np.int64), 1)
    total, participants, tally = server.accept([honest, evil])
    assert tally.refused["overflow"] == 1 and participants == 12
    record = server.select(total, participants)
    assert record.element == 0
    assert record.checks["refused-overflow"] == 1 and record.checks["reports-refused"] == 1


def test_discrete_greedy_refuses_a_node_above_its_participants_bound() -> None:
    """With the declared range, a node may send at most participants·max(λ, O_e/κ) on e."""
    server = _discrete_server(report_bound=5.0)
    scale = int(FIXED_POINT_SCALE)
    # O_5 = 0: B_5 = λ = 5 per participant; 2 participants may send 10, not 10.1
    ok = (np.array([0, 0, 0, 0, 0, 10 * scale], dtype=np.int64), 2)
    too_much = (np.array([0, 0, 0, 0, 0, 10 * scale + scale // 10], dtype=np.int64), 2)
    _, participants, tally = server.accept([ok, too_much])
    assert participants == 2 and tally.refused["range"] == 1
    # on a popular element the bound is O_e/κ per participant (10 here)
    _, _, tally = server.accept([(np.array([20 * scale, 0, 0, 0, 0, 0], np.int64), 2)])
    assert tally.refused_total == 0


def test_fedsm_total_is_clipped_to_what_its_users_could_send() -> None:
    """A summed report above report_bound per user (or anything on S) is clipped, counted."""
    rm = synthetic_facility_location(60, 20, seed=1)
    obj = FacilityLocation(rm.values)
    run = FedSMRun(obj.n_users, UniformMatroid(20, 3), 3, FedSMParams(clients_per_round=10,
                   elements_per_client=5), obj.max_singleton, seed=0, report_bound=5.0)  # fmt: skip
    plan = run.plan()
    total = np.zeros(20)
    total[7] = 1e100  # one dishonest sum
    row = run.update(total, plan.users.size)
    assert row["values-clipped"] == 1 and row["reports-clipped"] == 1
    plan = run.plan()
    total = np.zeros(20)
    total[row["element"]] = 3.0  # on S: nothing an honest user reports
    total[3] = 1.0
    row = run.update(total, plan.users.size)
    assert row["values-clipped"] == 1 and row["element"] == 3


def test_user_guard_refuses_clips_and_books_claims() -> None:
    """Out of range or outside the draw: refused whole; past the budget: clipped; the
    claims on the selected element are booked once it is known; the tally resets per round."""
    guard = UserGuard(4, 5.0)
    draw = np.array([2, 3, 5])
    assert guard.check(0, np.array([2, 3]), np.array([5.0, 1.0]), draw) is not None
    assert guard.check(1, np.array([7]), np.array([1.0]), draw) is None  # not in its draw
    assert guard.check(2, np.array([2]), np.array([9.0]), draw) is None  # above λ
    row = guard.settle(2)
    assert row["refused-draw"] == 1 and row["refused-range"] == 1 and row["values-clipped"] == 0
    np.testing.assert_allclose(guard.budget.spent, [5.0, 0, 0, 0])
    # user 0 spent its budget on element 2: its next claim is clipped to (almost) nothing
    vals = guard.check(0, np.array([3, 5]), np.array([4.0, 4.0]), draw)
    assert vals is not None and vals.max() < 1e-6
    row = guard.settle(3)
    assert row["values-clipped"] == 2 and row["reports-clipped"] == 1
    assert row["reports-refused"] == 0


def test_coins_of_the_discrete_greedy_are_recomputed() -> None:
    """Every user discrete_report_sum lets take part passes the coin check; the others fail."""
    rm = synthetic_facility_location(300, 30, seed=4)
    obj = FacilityLocation(rm.values)
    kappa_i = np.linspace(0.05, 1.0, obj.n_users)
    ids = np.arange(obj.n_users)
    for t in (1, 2, 3):
        refused = coin_refusals(9, t, ids, kappa_i)
        # the users whose reports are summed are exactly those with a coin
        part = np.flatnonzero(~refused)
        _, count = discrete_report_sum(obj, [], UniformMatroid(30, 3), kappa_i, 9, t, ids)
        assert count == part.size
        assert not refused[kappa_i >= 1.0].any()
        assert 0 < part.size < obj.n_users
    assert coin_refusals(9, 1, np.array([3]), np.array([0.0]))[0]


def promoted_instance(n_bad: int = 3, seed: int = 0) -> tuple[FacilityLocation, set[int]]:
    """600 honest users rating each of 40 elements with probability 0.1 (1..5), ten more
    elements no honest user rates, and ``n_bad`` dishonest users whose committed profiles are
    λ = 5 on those ten: ``(the committed profiles, the promoted elements)``."""
    rng = np.random.default_rng(seed)
    honest = np.where(rng.random((600, 40)) < 0.1, rng.integers(1, 6, (600, 40)), 0)
    rows = np.zeros((600 + n_bad, 50))
    rows[:600, :40] = honest
    rows[600:, 40:] = 5.0
    return FacilityLocation(sp.csr_matrix(rows)), set(range(40, 50))

def test_history_clamp_pulls_a_spike_down_to_the_mean_so_far() -> None:
    """Round 1 passes as it is; an estimate above the mean of the element's estimates so far
    (this round's included) is held to that mean; one at or below it is left; only the
    candidates are counted."""
    hist = GainHistory(3)
    held, lowered = hist.clamp(np.array([1.0, 0.2, 0.0]))
    np.testing.assert_array_equal(held, [1.0, 0.2, 0.0])
    assert lowered == 0
    held, lowered = hist.clamp(np.array([0.5, 1.4, 0.6]), np.array([True, True, False]))
    np.testing.assert_allclose(held, [0.5, 0.8, 0.3])  # element 1: (0.2 + 1.4) / 2
    assert lowered == 1  # element 2 was lowered too, but it is no candidate
    assert hist.rounds == 2
    with pytest.raises(ValueError, match="finite vector of length 3"):
        hist.clamp(np.array([np.nan, 0.0, 0.0]))
    with pytest.raises(ValueError, match="n_elements"):
        GainHistory(0)


def test_noise_aware_clamp_passes_honest_noise_and_holds_a_spike() -> None:
    """Element 0's estimates scatter around a steady gain: the mean clamp cuts its last one
    down to the mean, the noise-aware bound (mean + 3 standard errors) leaves it. Element 1's
    history is small with one spike: both clamps hold the spike, the noise-aware one to
    mean + 3 · (sample standard deviation / √t)."""
    rounds = np.array([[1.0, 0.0], [1.2, 0.08], [0.9, 0.0], [1.1, 0.0], [1.25, 0.33]])
    noise_aware, mean = GainHistory(2, NOISE_AWARE_MARGIN), GainHistory(2)
    for estimate in rounds:
        held_n, lowered_n = noise_aware.clamp(estimate)
        held_m, _ = mean.clamp(estimate)
    t = rounds.shape[0]
    bound = rounds.mean(axis=0) + 3.0 * rounds.std(axis=0, ddof=1) / np.sqrt(t)
    np.testing.assert_allclose(noise_aware.bound(), bound)
    assert held_n[0] == 1.25 and held_m[0] == pytest.approx(rounds[:, 0].mean())
    assert held_n[1] == pytest.approx(bound[1]) and bound[1] < 0.33
    assert held_m[1] == pytest.approx(rounds[:, 1].mean())
    assert lowered_n == 1
    with pytest.raises(ValueError, match="margin"):
        GainHistory(2, -1.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=3, max_size=3),
        min_size=1, max_size=8,
    ),
    st.floats(0.0, 5.0),
    st.floats(0.0, 5.0),
)  # fmt: skip
def test_history_clamps_never_raise_an_estimate_and_loosen_with_the_margin(
    history: list[list[float]], c1: float, c2: float
) -> None:
    """Whatever the estimates: no clamp raises one; the held value lies between the mean
    clamp's and the estimate; a larger margin never holds lower; c = 0 is the mean clamp."""
    low, high = sorted((c1, c2))
    hists = [GainHistory(3), GainHistory(3, low), GainHistory(3, high)]
    total = np.zeros(3)
    for t, row in enumerate(history, start=1):
        estimate = np.array(row)
        total += estimate
        held_mean, held_low, held_high = (h.clamp(estimate)[0] for h in hists)
        np.testing.assert_array_equal(held_mean, np.minimum(estimate, total / t))
        assert np.all(held_high <= estimate) and np.all(held_low <= held_high + 1e-12)
        assert np.all(held_mean <= held_low + 1e-12)


def test_history_clamps_by_name() -> None:
    assert CLAMPS == {"off": None, "noise-aware": NOISE_AWARE_MARGIN, "mean": 0.0}
    assert clamp_margin(True) == 0.0 and clamp_margin(False) is None  # old checkpoints
    assert FedSMParams().history_clamp == "noise-aware"  # the default: on
    with pytest.raises(ValueError, match="history clamp 'median'"):
        clamp_margin("median")


def test_a_history_from_before_the_noise_aware_bound_restores_as_the_mean_clamp() -> None:
    """A checkpoint written before the noise-aware bound holds only ``total`` and
    ``rounds``; restored as the checkpoint format restores an object (no ``__init__``, the
    stored attributes set), it clamps to the mean, as the run it came from did."""
    whole = GainHistory(3)
    rounds = [np.array([1.0, 2.0, 0.0]), np.array([3.0, 0.0, 1.0]), np.array([9.0, 1.0, 1.0])]
    whole.clamp(rounds[0])
    restored = object.__new__(GainHistory)
    vars(restored).update({"total": whole.total.copy(), "rounds": whole.rounds})
    for estimate in rounds[1:]:
        np.testing.assert_array_equal(restored.clamp(estimate)[0], whole.clamp(estimate)[0])
    assert restored.margin == 0.0 and "squares" not in vars(restored)


@pytest.mark.parametrize("clamp", ["noise-aware", "mean"])
def test_history_clamp_keeps_committed_promoters_out_where_the_estimate_lets_them_in(
    clamp: str,
) -> None:
    """Three dishonest users commit λ on ten elements no honest user values (0.5 % of the
    users; their true gain is below every round's honest best, so greedy never takes one).
    Algorithm 1's one-round estimate lets one in by the noise of its sample (seed 4); with
    either history clamp none enters S for any of the seeds, and each round's row counts the
    estimates it lowered (the noise-aware bound lowers fewer)."""
    committed, useless = promoted_instance()
    m, k = committed.n_elements, 8
    assert not set(greedy(committed, UniformMatroid(m, k), k).selected) & useless

    def direct(seed: int, clamp: str) -> tuple[list[int], list[dict]]:
        params = FedSMParams("alg1", 0.1, 0.1, history_clamp=clamp)
        run = FedSMRun(committed.n_users, UniformMatroid(m, k), k, params, 5.0, seed=seed)
        rows: list[dict] = []
        return run_rounds(committed, run, on_round=rows.append), rows

    assert set(direct(4, "off")[0]) & useless  # the attack works without the clamp
    for seed in range(6):
        selected, rows = direct(seed, clamp)
        assert not set(selected) & useless
        assert [r["estimates-clamped"] for r in rows][0] == 0  # round 1: nothing to hold to
        assert sum(r["estimates-clamped"] for r in rows) > 0
    if clamp == "noise-aware":
        lowered = sum(r["estimates-clamped"] for r in direct(0, clamp)[1])
        assert lowered < sum(r["estimates-clamped"] for r in direct(0, "mean")[1])
    plain_rows = direct(0, "off")[1]
    assert "estimates-clamped" not in plain_rows[0]


def test_history_clamp_is_algorithm_1s() -> None:
    """The other modes ignore the (default) clamp: Algorithm 2 chooses the same S with it as
    with ``"off"``; an unknown name is refused."""
    committed, _ = promoted_instance()
    m, k = committed.n_elements, 4

    def alg2(clamp: str) -> list[int]:
        params = FedSMParams("alg2", 0.5, 0.5, history_clamp=clamp)
        return run_rounds(committed, FedSMRun(committed.n_users, UniformMatroid(m, k), k,
                                              params, 5.0, seed=1))  # fmt: skip

    assert alg2("noise-aware") == alg2("off")
    with pytest.raises(ValueError, match="history clamp"):
        FedSMRun(10, UniformMatroid(8, 4), 4, FedSMParams("alg1", history_clamp="on"), 1.0)


def test_run_config_history_clamp_reaches_the_direct_engine_and_metrics(tmp_path) -> None:
    """The default run_config clamps (noise-aware): each round's row of metrics.jsonl counts
    the lowered estimates, fewer than ``"mean"`` lowers; ``"off"`` rows have no count;
    ``"mean"`` is refused with another fedsm-mode, where the default is accepted."""
    import json
    from pathlib import Path

    from direct import run_direct as run_experiment
    from flower_app.config import AppConfig, ConfigError

    base = {
        "dataset": "synthetic-facility-location", "num-users": 200, "num-elements": 60,
        "k": 5, "clients-per-round": 0.25, "elements-per-client": 0.2, "seed": 1,
        "output-dir": str(tmp_path),
    }  # fmt: skip

    def rows(clamp: str | None) -> list[dict]:
        config = base if clamp is None else {**base, "fedsm-history-clamp": clamp}
        summary = run_experiment(AppConfig.from_run_config({**config, "run-name": str(clamp)}))
        lines = (Path(summary["run-folder"]) / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r.get("server-round", 0) > 0]

    default, mean, off = rows(None), rows("mean"), rows("off")
    assert len(default) == 5 and default[0]["estimates-clamped"] == 0
    lowered = sum(r["estimates-clamped"] for r in default)
    assert 0 < lowered < sum(r["estimates-clamped"] for r in mean)
    assert all("estimates-clamped" not in r for r in off)
    with pytest.raises(ConfigError, match="fedsm-history-clamp"):
        AppConfig.from_run_config({**base, "fedsm-history-clamp": "mean", "fedsm-mode": "alg2"})
    AppConfig.from_run_config({**base, "fedsm-mode": "alg2"})
