"""MaxFL math: q_k, the adaptive global learning rate, the update, the baselines' steps
(MW-Fed's multiplicative weights included) and the two-client mean-estimation toy of
Section 2.2 (Lemma 2.1, Theorem 2.1)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flower_app.algorithms.maxfl.appeal import AppealServer, TrainOutcome
from flower_app.algorithms.maxfl.baselines import (
    check_mw_eta,
    fedavg_update,
    mwfed_local_steps,
    mwfed_reweight,
    mwfed_shares,
    qffl_delta_h,
    qffl_update,
    scaffold_control_update,
)
from flower_app.algorithms.maxfl.core import (
    adaptive_server_lr,
    aggregation_weight,
    gm_appeal,
    maxfl_objective,
    maxfl_update,
    sigmoid,
)
from flower_app.algorithms.maxfl.participation import ParticipationSampler


def test_aggregation_weight_hand_computed() -> None:
    # gap 0: σ = 1/2, q = 1/4; gap ±ln 3: σ = 3/4 or 1/4, q = 3/16; gap 2: σ = 0.880797
    losses = np.array([1.0, 1.0 + math.log(3), 1.0 - math.log(3), 3.0])
    q = aggregation_weight(losses, 1.0)
    s2 = 1 / (1 + math.exp(-2))
    assert q == pytest.approx([0.25, 0.1875, 0.1875, s2 * (1 - s2)], abs=1e-12)
    assert q[3] == pytest.approx(0.104993585, abs=1e-9)
    assert sigmoid(np.array([-800.0, 800.0])) == pytest.approx([0.0, 1.0])  # no overflow
    assert aggregation_weight(1e6, 0.0) == pytest.approx(0.0)  # far above: ignored
    assert aggregation_weight(-1e6, 0.0) == pytest.approx(0.0)  # far below: ignored


def test_missing_or_bad_rho_fails_loudly() -> None:
    with pytest.raises(ValueError, match="ρ_k is missing"):
        aggregation_weight(1.0, None)
    with pytest.raises(ValueError, match="ρ_k must be finite"):
        aggregation_weight(1.0, float("nan"))
    with pytest.raises(ValueError, match="losses F_k"):
        aggregation_weight(float("inf"), 1.0)


def test_adaptive_learning_rate_and_eps_checks() -> None:
    assert adaptive_server_lr(0.5, 1.0, 0.5) == pytest.approx(1.0)
    assert adaptive_server_lr(0.0, 2.0, 0.25) == pytest.approx(8.0)
    for eps in (0.0, -1e-3, float("nan")):
        with pytest.raises(ValueError, match="ε > 0"):
            adaptive_server_lr(0.5, 1.0, eps)
    with pytest.raises(ValueError, match="ε > 0"):
        AppealServer("maxfl", [np.zeros(2, np.float32)], 2, eps=0.0)


def test_maxfl_update_hand_computed() -> None:
    # Δ1 = [1, 0] with q1 = 1/4, Δ2 = [0, 2] with q2 = 3/16: Σ qΔ = [1/4, 3/8], Σ q = 7/16;
    # ε = 1/16 -> step = 1 / (1/2) = 2 -> w = [1, 2] − 2·[1/4, 3/8] = [1/2, 5/4]
    w = [np.array([1.0, 2.0], np.float32)]
    qsum = 0.25 + 0.1875
    new = maxfl_update(w, [np.array([0.25, 0.375])], qsum, server_lr=1.0, eps=0.0625)
    assert new[0] == pytest.approx([0.5, 1.25])
    assert new[0].dtype == np.float32
    with pytest.raises(ValueError, match="shape"):
        maxfl_update(w, [np.zeros(3)], qsum, 1.0, 0.1)


@pytest.mark.parametrize(("gap", "server_lr", "eps"), [(0.0, 1.0, 1e-3), (2.5, 0.7, 0.05)])
def test_equal_gaps_give_a_fedavg_step(gap, server_lr, eps) -> None:
    """All clients with the same gap: FedAvg with server lr η_g·Kq/(Kq + ε)."""
    rng = np.random.default_rng(1)
    w = [rng.normal(size=(4, 3)), rng.normal(size=3)]
    k = 5
    deltas = [[rng.normal(size=a.shape) for a in w] for _ in range(k)]
    q = aggregation_weight(np.full(k, 1.0 + gap), 1.0)
    weighted = [sum(q[i] * deltas[i][j] for i in range(k)) for j in range(len(w))]
    plain = [sum(deltas[i][j] for i in range(k)) for j in range(len(w))]
    got = maxfl_update(w, weighted, float(q.sum()), server_lr, eps)
    kq = k * q[0]
    want = fedavg_update(w, plain, k, server_lr=server_lr * kq / (kq + eps))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_objective_and_gm_appeal() -> None:
    losses, rhos = np.array([0.5, 1.0, 2.0]), np.array([1.0, 1.0, 1.0])
    assert gm_appeal(losses, rhos) == pytest.approx(1 / 3)  # strict inequality: 1.0 < 1.0 is no
    assert maxfl_objective(losses, rhos) == pytest.approx(np.mean(sigmoid(losses - rhos)))
    assert gm_appeal(np.zeros(0), np.zeros(0)) == 0.0


def test_qffl_matches_flowers_compute_delta_and_h() -> None:
    from flwr.serverapp.strategy.qfedavg import compute_delta_and_h

    rng = np.random.default_rng(2)
    w = [rng.normal(size=(3, 2)), rng.normal(size=2)]
    local = [a - 0.1 * rng.normal(size=a.shape) for a in w]
    for q in (0.0, 1.0, 5.0):
        want_delta, want_h = compute_delta_and_h(
            [a.copy() for a in w], [a.copy() for a in local], q, 20.0, 0.7
        )
        delta, h = qffl_delta_h([a - b for a, b in zip(w, local, strict=True)], 0.7, q, 20.0)
        assert h == pytest.approx(want_h, rel=1e-12)
        for a, b in zip(delta, want_delta, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    new = qffl_update(w, delta, h)
    np.testing.assert_allclose(new[0], w[0] - delta[0] / h)
    with pytest.raises(ValueError, match="h_k"):
        qffl_update(w, delta, 0.0)


def test_fedavg_matches_flowers_aggregate_with_equal_weights() -> None:
    from flwr.app import ArrayRecord, MetricRecord, RecordDict
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

    rng = np.random.default_rng(3)
    w = [rng.normal(size=(3, 2)).astype(np.float32)]
    locals_ = [[(w[0] - rng.normal(size=(3, 2))).astype(np.float32)] for _ in range(4)]
    records = [
        RecordDict({"arrays": ArrayRecord(m), "metrics": MetricRecord({"num-examples": 1})})
        for m in locals_
    ]
    flower = aggregate_arrayrecords(records, "num-examples").to_numpy_ndarrays()
    deltas = sum(w[0].astype(np.float64) - m[0] for m in locals_)
    ours = fedavg_update(w, [deltas], 4)
    np.testing.assert_allclose(ours[0], flower[0], rtol=1e-5, atol=1e-6)


def test_scaffold_server_steps() -> None:
    c = [np.ones(2, np.float32)]
    new = scaffold_control_update(c, [np.array([2.0, 4.0])], n_total=4)
    assert new[0] == pytest.approx([0.5, 0.0])
    server = AppealServer("scaffold", [np.zeros(2, np.float32)], n_seen=4)
    assert server.payload()[1].shape == (2,) and len(server.shapes) == 2
    server.step(TrainOutcome([np.array([2.0, 2.0]), np.array([4.0, 0.0])], users=2))
    assert server.weights[0] == pytest.approx([-1.0, -1.0])
    assert server.control[0] == pytest.approx([-1.0, 0.0])


def test_mwfed_two_rounds_hand_computed() -> None:
    """λ = 1 at the start; unmet clients' λ × (1 + η); step = λ-weighted mean of Δw."""
    server = AppealServer("mwfed", [np.zeros(2, np.float32)], n_seen=4, mw_eta=0.5)
    # round 1: S = {0, 1, 2}, equal weights -> s = (1, 1, 1), τ_k = τ
    users = np.array([0, 1, 2])
    assert server.user_config(users) == {"mw-share": [1.0, 1.0, 1.0]}
    assert mwfed_local_steps(1.0, 10) == 10
    deltas = [np.array([3.0, 0.0]), np.array([0.0, 3.0]), np.array([3.0, 3.0])]
    out = server.step(TrainOutcome([sum(deltas)], 3, ids=[0, 1, 2], met=[False, True, False]))
    assert server.weights[0] == pytest.approx([-2.0, -2.0])  # w − (1/3)·[6, 6]
    assert server.mw_weights == pytest.approx([1.5, 1.0, 1.5, 1.0])  # 0 and 2 unmet
    assert out["server-step"] == pytest.approx(1 / 3) and out["mw-unmet"] == 2
    assert out["mw-share-max"] == 1.0 and out["mw-weight-max"] == 1.5
    # round 2: S = {0, 1, 3}, λ = (1.5, 1, 1) -> s = 3λ/3.5 = (9/7, 6/7, 6/7)
    cfg = server.user_config(np.array([0, 1, 3]))
    assert cfg["mw-share"] == pytest.approx([9 / 7, 6 / 7, 6 / 7])
    assert [mwfed_local_steps(s, 10) for s in cfg["mw-share"]] == [13, 9, 9]
    # client 3's reply was bad: V = {0, 1}; Σ s Δw = 9/7·[1, 0] + 6/7·[0, 1], Σ s = 15/7
    sums = [9 / 7 * np.array([1.0, 0.0]) + 6 / 7 * np.array([0.0, 1.0])]
    server.step(TrainOutcome(sums, 2, ids=[0, 1], met=[False, False], bad_replies=1))
    assert server.weights[0] == pytest.approx([-2.6, -2.4])  # w − (7/15)·[9/7, 6/7]
    assert server.mw_weights == pytest.approx([2.25, 1.5, 1.5, 1.0])  # 3 unchanged: no reply
    # the same rule as a plain function
    np.testing.assert_allclose(
        mwfed_reweight(np.array([1.0, 2.0]), np.array([True, False]), 0.1), [1.1, 2.0]
    )
    np.testing.assert_allclose(mwfed_shares(np.array([1.0, 3.0])), [0.5, 1.5])


def test_mwfed_with_equal_weights_is_fedavg() -> None:
    rng = np.random.default_rng(5)
    w = [rng.normal(size=(3, 2)).astype(np.float32)]
    total = [rng.normal(size=(3, 2))]
    server = AppealServer("mwfed", w, n_seen=5)
    server.user_config(np.arange(4))
    server.step(TrainOutcome(total, 4, ids=[0, 1, 2, 3], met=[True] * 4))
    np.testing.assert_allclose(server.weights[0], fedavg_update(w, total, 4)[0], rtol=1e-6)
    assert server.mw_weights == pytest.approx(np.ones(5))  # everyone met: no change


@pytest.mark.parametrize("eta", [0.0, -0.1, float("nan"), float("inf")])
def test_mwfed_bad_eta_names_the_key(eta) -> None:
    with pytest.raises(ValueError, match="'maxfl-mw-eta'"):
        check_mw_eta(eta)
    with pytest.raises(ValueError, match="'maxfl-mw-eta'"):
        AppealServer("mwfed", [np.zeros(2, np.float32)], 2, mw_eta=eta)
    with pytest.raises(ValueError, match="finite and > 0"):
        mwfed_local_steps(0.0, 10)


def test_no_valid_reply_means_no_step() -> None:
    server = AppealServer("maxfl", [np.ones(2, np.float32)], 3)
    assert server.step(TrainOutcome(None, 0)) == {"server-step": 0.0}
    assert server.weights[0] == pytest.approx([1.0, 1.0])


def test_sampler_flexible_pool() -> None:
    s = ParticipationSampler(10, 3, flexible=True, mandatory_rounds=2, seed=0)
    assert not s.needs_pool(2) and s.needs_pool(3)
    first = s.sample()
    assert first.size == 3 and np.all(np.diff(first) > 0)
    assert s.sample(np.array([7])).tolist() == [7]  # fewer than K opt in: all of them
    assert s.sample(np.zeros(0, np.int64)).size == 0  # nobody opts in: no training
    with pytest.raises(ValueError, match="seen"):
        s.sample(np.array([10]))
    again = ParticipationSampler(10, 3, flexible=True, mandatory_rounds=2, seed=0)
    assert again.sample().tolist() == first.tolist()
    assert not ParticipationSampler(10, 3, flexible=False).needs_pool(100)


# ------------------------------------------------------------------ Section 2.2: the toy
def _toy_maxfl(theta_hat1, theta_hat2, iters=3000, local_lr=0.1, eps=1e-3, w0=0.0):
    """Algorithm 1 with both clients, τ = 1 exact gradient step, from w = 0.

    F_k(w) = (w − θ̂_k)² + (θ̂_k − θ_k)² and ρ_k = (θ̂_k − θ_k)², so F_k(w) − ρ_k = (w − θ̂_k)²
    (vectorised over trials; one step is checked against ``maxfl_update`` below).
    """
    w = np.full_like(theta_hat1, w0)
    for _ in range(iters):
        q1 = aggregation_weight((w - theta_hat1) ** 2, 0.0)
        q2 = aggregation_weight((w - theta_hat2) ** 2, 0.0)
        d1, d2 = local_lr * 2 * (w - theta_hat1), local_lr * 2 * (w - theta_hat2)
        w = w - (q1 * d1 + q2 * d2) / (q1 + q2 + eps)
    return w


def test_toy_vectorised_step_is_maxfl_update() -> None:
    h1, h2, w = 0.3, 2.9, 1.1
    q = aggregation_weight(np.array([(w - h1) ** 2, (w - h2) ** 2]), 0.0)
    d = [0.1 * 2 * (w - h1), 0.1 * 2 * (w - h2)]
    ref = maxfl_update([np.array([w])], [np.array([q[0] * d[0] + q[1] * d[1]])], q.sum(), 1.0, 1e-3)
    got = _toy_maxfl(np.array([h1]), np.array([h2]), iters=1, w0=w)
    assert got[0] == pytest.approx(ref[0][0], rel=1e-12)


def test_toy_mean_estimation_lemma_2_1_and_theorem_2_1() -> None:
    """Two clients, θ̂_k ~ N(θ_k, γ²) with γ = 1, θ_1 = 0, θ_2 = 2γ_G (Appendix A)."""
    rng = np.random.default_rng(0)
    n, gamma = 3000, 1.0
    for gamma_g in (0.0, 0.5, 1.0, 2.0, 3.0, 4.0):
        t1, t2 = 0.0, 2 * gamma_g
        h1, h2 = rng.normal(t1, gamma, n), rng.normal(t2, gamma, n)

        def appeal(w, t1=t1, t2=t2, h1=h1, h2=h2):
            return (((w - t1) ** 2 < (h1 - t1) ** 2) + ((w - t2) ** 2 < (h2 - t2) ** 2)) / 2

        fedavg, maxfl = (h1 + h2) / 2, _toy_maxfl(h1, h2)
        emp_gap = ((h2 - h1) / 2) ** 2
        small, large = emp_gap < 1, emp_gap > 2
        # small empirical heterogeneity: collaboration, the average of the local means
        if small.any():
            np.testing.assert_allclose(maxfl[small], fedavg[small], atol=1e-6)
        # large: separation, (close to) one client's local mean
        if large.any():
            near = np.minimum(np.abs(maxfl - h1), np.abs(maxfl - h2))[large]
            assert np.all(near < 0.01 * np.abs(h2 - h1)[large])
        e_fedavg, e_maxfl = appeal(fedavg).mean(), appeal(maxfl).mean()
        assert e_fedavg <= 2 * math.exp(-(gamma_g**2) / (5 * gamma**2)) + 0.02  # Lemma 2.1
        assert e_maxfl >= math.exp(-(gamma**-2)) / 16  # Theorem 2.1
        assert e_maxfl >= e_fedavg - 0.02  # at least FedAvg's (Monte Carlo slack)
        if gamma_g >= 3:
            assert e_maxfl > 5 * e_fedavg  # FedAvg's appeal has collapsed, MaxFL's has not


def test_every_algorithm_has_a_server_and_a_client_rule() -> None:
    from flower_app.algorithms.maxfl.learning import ALGORITHMS, LOCAL_RULES
    from flower_app.algorithms.maxfl.server_rules import RULES, MWFedRule, rule_for

    assert set(RULES) == set(ALGORITHMS)
    assert isinstance(rule_for("mwfed"), MWFedRule) and rule_for("scaffold").copies == 2
    assert rule_for("mwfed").share_key == "mw-share" and rule_for("maxfl").share_key is None
    assert set(LOCAL_RULES) == set(ALGORITHMS)
    assert LOCAL_RULES["maxfl"].needs_rho and not LOCAL_RULES["fedavg"].needs_rho
    with pytest.raises(ValueError, match="'sgd' is not one of"):
        rule_for("sgd")
