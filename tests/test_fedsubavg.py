"""FedSubAvg math: features, task, local SGD, feature heat, server steps, unbiasedness."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from direct.fedsubavg import run_direct_rounds
from flower_app.algorithms.fedsubavg.core import (
    AdamConfig,
    CentralSGD,
    ClientSampler,
    FeatureHeat,
    LocalConfig,
    RoundUpdate,
    RunSpec,
    ScaffoldApprox,
    SubmodelAveraging,
    batch_schedule,
    client_bytes,
    client_round,
    count_heat,
    full_heat,
    gather_submodels,
    local_deltas,
    make_server_update,
    merge_updates,
    resolve_clients_per_round,
)
from flower_app.datasets.movielens_rating import (
    build_rating_task,
    load_rating_task,
    synthetic_movielens_tables,
)
from flower_app.models.sparse_logreg import OneHotLayout, local_sgd, log_loss


@pytest.fixture(scope="module")
def task():
    return load_rating_task("synthetic-movielens-rating", "", 3, 60, 50)


# ----------------------------------------------------------------------------- model + data
def test_layout_rows_are_distinct_and_in_their_blocks() -> None:
    layout = OneHotLayout(7)
    assert layout.n_params == 10 + 70
    rows = layout.rows([0, 1, 1], [0, 6, 3], [0, 6, 2])
    assert rows.shape == (3, 6)
    assert all(len(set(r)) == 6 for r in rows.tolist())
    blocks = list(layout.blocks().values())
    for col, block in enumerate(blocks):
        assert all(block.start <= r < block.stop for r in rows[:, col])
    assert blocks[-1].stop == layout.n_params
    with pytest.raises(ValueError, match="movie index"):
        layout.rows([0], [0], [7])


def test_labels_split_and_submodels() -> None:
    ratings = pd.DataFrame(
        {
            "user_id": [1, 1, 1, 2, 2, 3, 3, 3, 3, 3],
            "movie_id": [10, 20, 30, 10, 40, 10, 20, 30, 40, 50],
            "rating": [5, 4, 3, 1, 2, 4, 5, 2, 3, 4],
        }
    )
    users = pd.DataFrame({"user_id": [1, 2, 3], "gender": ["F", "M", "M"], "age": [1, 25, 56]})
    t = build_rating_task(ratings, users, "tiny", test_fraction=0.0)
    assert t.n_clients == 3 and t.layout.n_movies == 5 and t.n_train == 10
    assert t.train_y.tolist() == [1, 1, 0, 0, 0, 1, 1, 0, 0, 1]
    # every sample's local positions point at its rows inside its client's submodel
    for c in range(3):
        lo, hi = t.train_ptr[c], t.train_ptr[c + 1]
        sub = t.submodel(c)
        assert np.array_equal(sub[t.train_pos[lo:hi]], t.train_rows[lo:hi])
        assert np.array_equal(sub, np.unique(t.train_rows[lo:hi]))
    with pytest.raises(ValueError, match="gender"):
        build_rating_task(ratings, users.assign(gender=["F", "X", "M"]), "bad")


def test_split_is_80_20_and_train_loss_sample_is_fixed(task) -> None:
    n = task.n_train + task.test_y.size
    assert task.test_y.size == round(0.2 * n)
    assert task.eval_idx.size == min(10_000, task.n_train)
    again = load_rating_task.__wrapped__("synthetic-movielens-rating", "", 3, 60, 50)
    assert np.array_equal(again.eval_idx, task.eval_idx)
    assert np.array_equal(again.train_rows, task.train_rows)


def test_synthetic_tables_are_calibrated() -> None:
    ratings, users = synthetic_movielens_tables(400, 300, seed=1)
    per_user = ratings.groupby("user_id").size()
    assert per_user.min() >= 20
    assert 0.6 < (users["gender"] == "M").mean() < 0.8
    assert 0.5 < (ratings["rating"] >= 4).mean() < 0.65


# ----------------------------------------------------------------------------- local SGD
def test_one_sgd_step_follows_the_gradient_of_the_batch_loss(task) -> None:
    rng = np.random.default_rng(0)
    c = 5
    rows, ptr = gather_submodels(task, np.array([c]))
    w0 = rng.normal(0, 0.3, size=rows.size)
    lo = int(task.train_ptr[c])
    batch = np.array([[[0, 3, 1, 4, 2]]]) + lo
    positions = np.zeros((task.n_train, 6), dtype=np.int64)
    positions[lo : task.train_ptr[c + 1]] = task.train_pos[lo : task.train_ptr[c + 1]]
    w = w0.copy()
    local_sgd(w, positions, task.train_y, batch, lr=0.5)
    s = batch.ravel()

    def loss(v: np.ndarray) -> float:
        return log_loss(v, positions[s], task.train_y[s])

    eps = 1e-6
    grad = np.array(
        [(loss(w0 + eps * e) - loss(w0 - eps * e)) / (2 * eps) for e in np.eye(rows.size)]
    )
    np.testing.assert_allclose(w, w0 - 0.5 * grad, atol=1e-8)


def test_vectorised_clients_equal_clients_trained_alone(task) -> None:
    clients = np.array([2, 7, 8, 30, 59])
    local = LocalConfig(iters=6, batch=4, lr=0.2, proximal_mu=0.05)
    rows, ptr = gather_submodels(task, clients)
    values = np.random.default_rng(1).normal(size=rows.size)
    together = local_deltas(task, clients, values, ptr, local, seed=3, server_round=4)
    for j, c in enumerate(clients):
        own = slice(ptr[j], ptr[j + 1])
        alone = local_deltas(
            task, np.array([c]), values[own], np.array([0, ptr[j + 1] - ptr[j]]), local, 3, 4
        )
        assert np.array_equal(together[own], alone)  # bit-identical


def test_batches_cycle_through_the_data_and_are_seeded() -> None:
    b = batch_schedule(np.random.default_rng(5), 7, 3, 5)
    flat = b.ravel()
    assert sorted(flat[:7].tolist()) == list(range(7))
    again = batch_schedule(np.random.default_rng(5), 7, 3, 5)
    assert np.array_equal(b, again)
    assert batch_schedule(np.random.default_rng(5), 2, 2, 5).shape == (2, 5)


def test_central_sgd_uses_batches_of_k_times_b(task) -> None:
    sgd = CentralSGD(task, batch=250, iters=10, lr=0.1, seed=0)
    x = np.zeros(task.n_params)
    before = log_loss(x, task.train_rows.astype(np.int64), task.train_y)
    for t in range(1, 6):
        sgd.round(x, t)
    assert log_loss(x, task.train_rows.astype(np.int64), task.train_y) < before


# ----------------------------------------------------------------------------- heat
def test_feature_heat_counts_clients_and_samples(task) -> None:
    heat = full_heat(task)
    brute = np.zeros(task.n_params, dtype=np.int64)
    brute_w = np.zeros(task.n_params, dtype=np.int64)
    n_i = task.samples_per_client()
    for c in range(task.n_clients):
        brute[task.submodel(c)] += 1
        brute_w[task.submodel(c)] += n_i[c]
    assert np.array_equal(heat.clients, brute) and np.array_equal(heat.samples, brute_w)
    assert heat.clients[0] == task.n_clients  # the bias is in every submodel
    # nodes' partial reports add up to the same heat
    parts = FeatureHeat.zeros(task.n_params)
    for group in np.array_split(np.arange(task.n_clients), 4):
        parts.add(*count_heat(task, group), group.size, int(n_i[group].sum()))
    assert np.array_equal(parts.clients, heat.clients)
    touched = brute > 0
    coef = heat.coefficients("clients")
    np.testing.assert_allclose(coef[touched], task.n_clients / brute[touched])
    assert np.all(coef[~touched] == 1.0)
    assert heat.dispersion() == brute.max() / brute[touched].min()
    with pytest.raises(ValueError, match="outside"):
        parts.add(np.array([task.n_params]), np.array([1]), np.array([1]), 1, 1)


# ----------------------------------------------------------------------------- server steps
def _dense_world(n: int, m: int, seed: int):
    """Clients with random submodels (hot and cold rows) and fixed updates Δ_i."""
    rng = np.random.default_rng(seed)
    p_row = np.geomspace(0.9, 2.0 / n, m)  # heat from ~0.9 N down to ~2
    member = rng.random((n, m)) < p_row
    member[np.arange(n), rng.integers(0, m, n)] = True
    member[rng.integers(0, n, m), np.arange(m)] = True  # every row held by someone
    deltas = np.where(member, rng.normal(0.5, 1.0, (n, m)), 0.0)
    heat = FeatureHeat.zeros(m)
    for i in range(n):
        rows = np.flatnonzero(member[i])
        heat.add(rows, np.ones(rows.size, int), np.ones(rows.size, int), 1, 1)
    parts = [RoundUpdate(np.flatnonzero(member[i]), deltas[i, member[i]], 1, 1.0) for i in range(n)]
    return member, deltas, heat, parts


def test_with_every_client_holding_every_feature_fedsubavg_is_fedavg() -> None:
    n, m = 12, 9
    rng = np.random.default_rng(0)
    heat = FeatureHeat.zeros(m)
    for _ in range(n):
        heat.add(np.arange(m), np.ones(m, int), np.full(m, 7), 1, 7)
    update = RoundUpdate(np.arange(m), rng.normal(size=m), 4, 4.0)
    for weighting in ("clients", "samples"):
        x_sub, x_avg = np.ones(m), np.ones(m)
        SubmodelAveraging(heat, weighting).step(x_sub, update, 1)
        SubmodelAveraging(None, weighting).step(x_avg, update, 1)
        assert np.array_equal(x_sub, x_avg)


def test_with_every_client_holding_every_feature_the_runs_are_equal() -> None:
    """End to end: all users share gender and age and rate every movie (no test split)."""
    ratings, users = synthetic_movielens_tables(10, 6, seed=2)
    users = users.assign(gender="M", age=25)
    grid = pd.MultiIndex.from_product([range(1, 11), range(1, 7)], names=["user_id", "movie_id"])
    full = ratings.set_index(["user_id", "movie_id"]).reindex(grid).fillna(4).reset_index()
    t = build_rating_task(full, users, "all-features", test_fraction=0.0)
    assert np.all(t.submodel_sizes() == t.submodel_sizes()[0])
    for weighting in ("clients", "samples"):
        runs = [
            run_direct_rounds(t, RunSpec(alg, 4, 3, seed=1, weighting=weighting))[0]
            for alg in ("fedsubavg", "fedavg-sub")
        ]
        np.testing.assert_allclose(runs[0], runs[1], rtol=1e-12, atol=1e-15)
        assert np.abs(runs[0]).max() > 0


def test_fedsubavg_aggregation_is_unbiased_and_fedavg_is_not() -> None:
    """Section 3.2: E[ΔX_m] = (1/n_m) Σ_{i: m∈S(i)} Δx_{i,m}, over random samples of K."""
    n, m, k, rounds = 40, 12, 5, 6000
    member, deltas, heat, parts = _dense_world(n, m, seed=1)
    target = deltas.sum(axis=0) / member.sum(axis=0)
    sampler = ClientSampler(n, k, seed=7)
    sub, avg = SubmodelAveraging(heat, "clients"), SubmodelAveraging(None, "clients")
    got_sub, got_avg = np.zeros((rounds, m)), np.zeros((rounds, m))
    for r in range(rounds):
        update = merge_updates([parts[i] for i in sampler.sample()])
        sub.step(got_sub[r], update, r + 1)
        avg.step(got_avg[r], update, r + 1)
    mean, se = got_sub.mean(axis=0), got_sub.std(axis=0, ddof=1) / np.sqrt(rounds)
    z = (mean - target) / se
    assert np.all(np.abs(z) < 4.0), z  # 12 rows, each |z| < 4: false alarm rate ~1e-3
    # FedAvg's expected update is (n_m / N) times smaller: cold rows far off target
    np.testing.assert_allclose(
        got_avg.mean(axis=0), target * member.sum(axis=0) / n, atol=5 * se.max()
    )
    cold = (member.sum(axis=0) < n / 4) & (np.abs(target) > 20 * se)
    assert cold.sum() >= 2
    assert np.all(np.abs(got_avg.mean(axis=0) - target)[cold] > 8 * se[cold])


def test_weighted_form_is_close_to_the_weighted_mean_of_the_holders() -> None:
    """App. D.4: the ratio estimator is unbiased up to O(1/K); here within 5%."""
    n, m, k, rounds = 40, 6, 20, 3000
    member, deltas, _, _ = _dense_world(n, m, seed=2)
    w = np.random.default_rng(3).integers(5, 50, size=n).astype(float)
    heat = FeatureHeat.zeros(m)
    for i in range(n):
        rows = np.flatnonzero(member[i])
        heat.add(rows, np.ones(rows.size, int), np.full(rows.size, int(w[i])), 1, int(w[i]))
    parts = [
        RoundUpdate(np.flatnonzero(member[i]), w[i] * deltas[i, member[i]], 1, w[i])
        for i in range(n)
    ]
    target = (w[:, None] * deltas).sum(axis=0) / (w[:, None] * member).sum(axis=0)
    sampler, step = ClientSampler(n, k, seed=3), SubmodelAveraging(heat, "samples")
    total = np.zeros(m)
    for r in range(rounds):
        x = np.zeros(m)
        step.step(x, merge_updates([parts[i] for i in sampler.sample()]), r + 1)
        total += x
    np.testing.assert_allclose(total / rounds, target, rtol=0.05, atol=0.02)


def test_scaffold_approximation_blends_old_and_new_updates() -> None:
    step = ScaffoldApprox(3, n_clients=10)
    x = np.zeros(3)
    u1 = RoundUpdate(np.array([0, 2]), np.array([2.0, 4.0]), 2, 2.0)
    step.step(x, u1, 1)
    np.testing.assert_allclose(step.g, [0.2 * 1.0, 0.0, 0.2 * 2.0])
    step.step(x, RoundUpdate.empty(), 2)  # nobody answered: G decays by (N-0)/N = 1
    np.testing.assert_allclose(x, 2 * np.array([0.2, 0.0, 0.4]))
    u3 = RoundUpdate(np.array([1]), np.array([5.0]), 5, 5.0)
    step.step(x, u3, 3)
    np.testing.assert_allclose(step.g, [0.1, 0.5, 0.2])


def test_adam_state_and_make_server_update() -> None:
    heat = FeatureHeat.zeros(4)
    heat.add(np.arange(4), np.ones(4, int), np.ones(4, int), 1, 1)
    assert isinstance(make_server_update("fedsubavg", 4, 1, heat), SubmodelAveraging)
    adam = make_server_update("fedadam-sub", 4, 1, adam=AdamConfig(eta=1.0))
    x = np.zeros(4)
    adam.step(x, RoundUpdate(np.array([1]), np.array([0.3]), 1, 1.0), 1)
    assert x[1] > 0 and x[0] == 0
    with pytest.raises(ValueError, match="feature heat"):
        make_server_update("fedsubavg", 4, 1)
    with pytest.raises(ValueError, match="no server step"):
        make_server_update("central-sgd", 4, 1)


def test_node_sums_add_up_to_the_round_sum(task) -> None:
    users = np.array([1, 4, 9, 11, 33, 40, 41])
    rows, ptr = gather_submodels(task, users)
    x = np.random.default_rng(2).normal(size=task.n_params)
    local = LocalConfig()
    whole = client_round(task, users, x[rows], ptr, local, 0, 1, "samples")
    parts = []
    for group in (users[:3], users[3:]):
        r, p = gather_submodels(task, group)
        parts.append(client_round(task, group, x[r], p, local, 0, 1, "samples"))
    merged = merge_updates(parts)
    assert np.array_equal(merged.rows, whole.rows)
    np.testing.assert_allclose(merged.sums, whole.sums, rtol=1e-12, atol=1e-15)
    assert merged.weight == whole.weight == task.samples_per_client()[users].sum()


def test_bytes_scale_with_the_submodel() -> None:
    b = client_bytes(np.array([10, 400]))
    assert b["down"].tolist() == [120, 4800] and b["up"].tolist() == [160, 6400]


def test_k_above_n_fails_before_round_1(task) -> None:
    with pytest.raises(ValueError, match="exceeds the 60 clients"):
        resolve_clients_per_round(61, task.n_clients)
    with pytest.raises(ValueError, match="exceeds"):
        run_direct_rounds(task, RunSpec("fedsubavg", 3, 100))
    assert resolve_clients_per_round(0.5, 60) == 30


def test_direct_engine_is_seeded_and_fedsubavg_learns(task) -> None:
    a = run_direct_rounds(task, RunSpec("fedsubavg", 15, 10, seed=4))
    b = run_direct_rounds(task, RunSpec("fedsubavg", 15, 10, seed=4))
    c = run_direct_rounds(task, RunSpec("fedsubavg", 15, 10, seed=5))
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], c[0])
    losses = [r["train-loss"] for r in a[1]]
    assert losses[-1] < np.log(2)
    row = a[1][0]
    assert row["bytes-down-client-max"] <= 12 * task.submodel_sizes().max()
    assert row["bytes-down-client-mean"] < 8 * task.n_params  # less than a full model


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 300), st.floats(-1e6, 1e6, allow_nan=False)), max_size=400)
)
def test_sum_by_row_is_the_sorted_sum_to_the_bit(entries) -> None:
    """The bincount-by-row sums equal np.unique + bincount bit for bit (same addition order)."""
    from flower_app.algorithms.fedsubavg.core import sum_by_row

    rows = np.array([r for r, _ in entries], dtype=np.int64)
    weights = np.array([w for _, w in entries], dtype=np.float64)
    uniq, sums = sum_by_row(rows, weights)
    ref_rows, inv = np.unique(rows, return_inverse=True)
    ref = np.bincount(inv, weights=weights, minlength=ref_rows.size)
    assert uniq.dtype == np.int64 and np.array_equal(uniq, ref_rows)
    assert sums.tobytes() == ref.tobytes()
