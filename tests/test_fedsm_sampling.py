"""``fedsm-rng = "batched"``: the keyed generator, the support-proportional draw and its law.

* the vectorised Philox4x64-10 is numpy's ``Philox``, bit for bit;
* a user's draw depends only on (seed, round, user): the same sums whatever the split of
  users over cohorts, and the same S on the direct engine, cohort mode and plain mode;
* the support-proportional draw has the law of the dense draw: a chi-square test of the
  joint law of one user's reported vector against an enumeration of every d-subset
  (Algorithms 1 and 2), which a wrong sampler with the same mean fails;
* properties (hypothesis): the report is zero outside the users' supports, equals their
  gains where drawn, and the server's scale is the same under both schemes.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2
from test_fedsm_dropin import _direct, _objective, user_app

from flower_app.algorithms.fedsm.alg2 import PlainPairGains, pair_report_sum
from flower_app.algorithms.fedsm.core import sampled_entry_sum
from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun, cohort_report
from flower_app.algorithms.fedsm.sampling import (
    dense_draw,
    hypergeometric,
    keyed_uniforms,
    philox4x64,
)
from flower_app.clients.adapter import numpy_client_app
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.submodular import SubmodularClient
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from flower_app.strategies.fedsm import FedSMStrategy
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import FacilityLocation, MaxCoverage, MaxRowObjective
from tests.support.local_grid import LocalGrid

#: significance level of the chi-square tests (fixed seeds: each test is deterministic)
ALPHA = 1e-3


def test_vectorised_philox_is_numpys_philox_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        key = [int(x) for x in rng.integers(0, 2**63, 2, dtype=np.uint64)]
        ctr = [int(x) for x in rng.integers(1, 2**63, 4, dtype=np.uint64)]
        ours = philox4x64(tuple(np.array([c], dtype=np.uint64) for c in ctr), (key[0], key[1]))
        numpy_ctr = [ctr[0] - 1, *ctr[1:]]  # numpy increments the counter, then encrypts
        ref = np.random.Philox(key=key, counter=numpy_ctr).random_raw(4)
        assert [int(w[0]) for w in ours] == [int(x) for x in ref]


def test_a_users_numbers_do_not_depend_on_the_batch() -> None:
    ids = np.array([5, 17, 2**40, 3])
    together = keyed_uniforms(7, 3, ids, np.arange(4), 2)
    alone = [keyed_uniforms(7, 3, np.array([u]), np.array([i]), 2)[0] for i, u in enumerate(ids)]
    assert together.tolist() == alone
    assert keyed_uniforms(7, 4, ids, np.arange(4), 2).tolist() != together.tolist()
    assert keyed_uniforms(8, 3, ids, np.arange(4), 2).tolist() != together.tolist()


def test_hypergeometric_inversion_matches_the_pmf_and_its_range() -> None:
    n, d, s = 40, 12, 9
    u = keyed_uniforms(1, 1, np.arange(60_000), 0, 1)
    h = hypergeometric(u, np.full(u.size, s), n, d)
    counts = np.bincount(h, minlength=s + 1)
    from scipy.stats import hypergeom

    expected = hypergeom(n, s, d).pmf(np.arange(s + 1)) * u.size
    seen = expected > 5
    stat = float((((counts - expected) ** 2)[seen] / expected[seen]).sum())
    assert chi2.sf(stat, seen.sum() - 1) > ALPHA
    # the support larger than the non-drawn part forces a minimum: h >= d - (n - s)
    h2 = hypergeometric(u[:1000], np.full(1000, 35), n, d)
    assert h2.min() >= d - (n - 35) and h2.max() <= d


def _chi_square(observed: Counter, exact: dict) -> float:
    """p-value of the observed outcomes against the exact law (cells pooled below 5)."""
    total = sum(observed.values())
    assert set(observed) <= set(exact), "an outcome the dense draw cannot produce"
    cells = sorted(exact, key=lambda o: exact[o])
    obs, exp, acc_o, acc_e = [], [], 0, 0.0
    for o in cells:
        acc_o += observed.get(o, 0)
        acc_e += exact[o] * total
        if acc_e >= 5:
            obs.append(acc_o)
            exp.append(acc_e)
            acc_o, acc_e = 0, 0.0
    if acc_e:
        obs[-1] += acc_o
        exp[-1] += acc_e
    o, e = np.array(obs, float), np.array(exp)
    return float(chi2.sf(((o - e) ** 2 / e).sum(), o.size - 1))


# one user, m = 8 elements, S = {1}: positive gains on 4 of the 7 elements of E \\ S
SELECTED = np.array([1], dtype=np.int64)
ROW_ALG1 = np.array([[0.0, 0.1, 0.3, 0.0, 0.5, 0.7, 0.0, 0.2]])


def _alg1_setup():
    obj = FacilityLocation(sp.csr_matrix(ROW_ALG1))
    cur = obj.user_values(SELECTED.tolist(), np.array([0]))
    upos, elem, gain = obj.positive_gain_entries(cur, np.array([0]))
    pool = np.setdiff1d(np.arange(8), SELECTED)
    dense_gain = np.zeros(8)
    dense_gain[elem] = gain
    return upos, elem, gain, pool, dense_gain


def _alg1_law(pool: np.ndarray, dense_gain: np.ndarray, d: int) -> dict:
    law: Counter = Counter()
    subsets = list(itertools.combinations(pool.tolist(), d))
    for sub in subsets:
        vec = np.zeros(8)
        vec[list(sub)] = dense_gain[list(sub)]
        law[tuple(vec)] += 1.0 / len(subsets)
    return dict(law)


def _alg1_draws(rng: str, users: int, d: int) -> Counter:
    upos, elem, gain, pool, _ = _alg1_setup()
    out: Counter = Counter()
    for user in range(users):
        total, hits = sampled_entry_sum(upos, elem, gain, np.array([user]), pool, d, 11, 2, 8, rng)
        assert hits == np.count_nonzero(total)
        out[tuple(total)] += 1
    return out


@pytest.mark.parametrize("rng", ["batched", "per-user"])
def test_alg1_reported_vector_has_the_dense_draws_law(rng) -> None:
    _, _, _, pool, dense_gain = _alg1_setup()
    assert np.count_nonzero(dense_gain) == 4 and pool.size == 7
    law = _alg1_law(pool, dense_gain, 3)
    assert len(law) == 15  # every subset of the 4-element support, minus "all 4"
    assert _chi_square(_alg1_draws(rng, 6000, 3), law) > ALPHA


def test_the_chi_square_test_rejects_a_sampler_with_the_right_mean_but_wrong_law() -> None:
    """Binomial(s, d/N) intersection sizes: unbiased, but not a d-subset's law."""
    upos, elem, gain, pool, dense_gain = _alg1_setup()
    law = _alg1_law(pool, dense_gain, 3)
    out: Counter = Counter()
    for user in range(6000):
        coins = keyed_uniforms(11, 2, np.array([user]), elem, 2) < 3 / pool.size
        vec = np.zeros(8)
        vec[elem[coins]] = gain[coins]
        out[tuple(vec)] += 1
    assert set(out) - set(law)  # it even reports all 4 support elements at once
    wrong = Counter({o: c for o, c in out.items() if o in law})
    assert _chi_square(wrong, law) < ALPHA


def test_alg2_reported_pair_vector_has_the_dense_draws_law() -> None:
    """One user; X = 5 elements, a = (a_1, a_2), pairs X × {1, 2}; d = 4 of 10 pairs."""
    row = np.array([[0.6, 0.0, 0.3, 0.8, 0.0, 0.5]])
    obj = FacilityLocation(sp.csr_matrix(row))
    selected, pool, seq = [1], np.array([0, 2, 3, 4, 5]), np.array([4, 2])
    r_prime, d, n_pairs = 2, 4, 10
    gains = PlainPairGains(obj, np.array([0]), selected, seq, j_from=1)
    all_pairs = np.arange(n_pairs)
    values = gains.evaluate(
        np.array([0]), np.zeros(n_pairs, int), pool[all_pairs // r_prime], all_pairs % r_prime
    )
    assert np.count_nonzero(values) == 7  # a law over many reported vectors
    law: Counter = Counter()
    subsets = list(itertools.combinations(range(n_pairs), d))
    for sub in subsets:
        vec = np.zeros(n_pairs)
        vec[list(sub)] = values[list(sub)]
        law[tuple(vec)] += 1.0 / len(subsets)
    observed: Counter = Counter()
    for user in range(5000):
        g = PlainPairGains(obj, np.array([0]), selected, seq, j_from=1)
        total, _ = pair_report_sum(
            g, np.array([0]), np.array([user]), pool, r_prime, d, 3, 5, "batched"
        )
        observed[tuple(total)] += 1
    assert _chi_square(observed, dict(law)) > ALPHA


def test_dense_keyed_draw_is_a_d_subset_and_uniform_per_candidate() -> None:
    picks = np.stack([dense_draw(u, 9, 4, 1, 1) for u in range(4000)])
    assert all(np.unique(row).size == 4 for row in picks) and picks.max() < 9
    counts = np.bincount(picks.ravel(), minlength=9)
    expected = 4000 * 4 / 9
    assert chi2.sf(((counts - expected) ** 2 / expected).sum(), 8) > ALPHA


def _instance(n: int, m: int, per_user: int, seed: int) -> MaxCoverage:
    rng = np.random.default_rng(seed)
    rows = [rng.choice(m, rng.integers(1, min(per_user, m) + 1), replace=False) for _ in range(n)]
    indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    mat = sp.csr_matrix((np.ones(indptr[-1]), np.concatenate(rows), indptr), shape=(n, m))
    return MaxCoverage(mat)


@pytest.mark.parametrize("mode", ["alg1", "alg2"])
def test_cohort_sums_do_not_depend_on_the_split_of_users(mode) -> None:
    obj = _instance(300, 80, 5, seed=2)
    params = FedSMParams(mode, 0.5, 0.3 if mode == "alg1" else 60, epsilon=0.3, rng="batched")
    run = FedSMRun(obj.n_users, UniformMatroid(80, 6), 6, params, obj.max_singleton, seed=5)
    plan = run.plan()
    whole, hits = cohort_report(obj, plan.users, plan.users, plan, 5)
    parts, part_hits = np.zeros_like(whole), 0
    for p in range(7):
        first, count = cohort_range(obj.n_users, p, 7)
        rows = MaxRowObjective(obj.values[first : first + count])
        mine = plan.users[(plan.users >= first) & (plan.users < first + count)]
        total, h = cohort_report(rows, mine - first, mine, plan, 5)
        parts += total
        part_hits += h
    assert hits > 0 and part_hits == hits
    np.testing.assert_array_equal(parts, whole)  # coverage gains are 0/1: exact sums


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 8),
    m=st.integers(3, 14),
    per_user=st.integers(1, 5),
    data_seed=st.integers(0, 10_000),
    seed=st.integers(0, 2**40),
    s_size=st.integers(0, 2),
    d_frac=st.floats(0.05, 1.0),
)
def test_batched_reports_are_gains_on_the_support_and_zero_outside(
    n, m, per_user, data_seed, seed, s_size, d_frac
) -> None:
    values = _instance(n, m, per_user, data_seed).values.multiply(
        np.random.default_rng(data_seed).uniform(0.1, 1.0, (n, m))
    )
    obj = FacilityLocation(sp.csr_matrix(values))
    selected = list(range(s_size))
    pool = np.setdiff1d(np.arange(m), selected)
    d = max(1, min(pool.size, round(d_frac * pool.size)))
    users = np.arange(n)
    cur = obj.user_values(selected, users)
    upos, elem, gain = obj.positive_gain_entries(cur, users)
    keep = np.isin(elem, pool)
    for user in range(n):
        mine = (upos == user) & keep
        total, hits = sampled_entry_sum(
            upos[upos == user] * 0,
            elem[upos == user],
            gain[upos == user],
            np.array([user]),
            pool,
            d,
            seed,
            1,
            m,
            "batched",
        )
        drawn = np.flatnonzero(total)
        assert set(drawn) <= set(elem[mine].tolist())  # zero outside the support
        np.testing.assert_array_equal(
            total[elem[mine]][total[elem[mine]] > 0], gain[mine][total[elem[mine]] > 0]
        )
        s = int(mine.sum())
        assert hits == drawn.size and max(0, d - (pool.size - s)) <= hits <= min(s, d)
    # the server's step sees the same K, d and scale under both schemes
    rows = []
    for rng in ("per-user", "batched"):
        params = FedSMParams("alg1", 1.0, d / m, rng=rng)
        run = FedSMRun(n, UniformMatroid(m, 1), 1, params, obj.max_singleton, seed=seed % 1000)
        plan = run.plan()
        total, _ = cohort_report(obj, plan.users, plan.users, plan, seed % 1000)
        row = run.update(total, plan.users.size)
        scale = row["estimate"] / total[row["element"]] if total[row["element"]] else None
        rows.append((plan.users.tolist(), plan.d, row["users"], scale))
    (u1, d1, k1, s1), (u2, d2, k2, s2) = rows
    assert (u1, d1, k1) == (u2, d2, k2)
    if s1 is not None and s2 is not None:
        assert s1 == pytest.approx(s2) == pytest.approx(m / (d1 * k1))


BATCHED = {
    "alg1": FedSMParams("alg1", 0.25, 0.2, rng="batched"),
    "alg2": FedSMParams("alg2", 0.5, 40, epsilon=0.3, rng="batched"),
    "amplified": FedSMParams("amplified", 0.5, 0.3, eta=0.5, rng="batched"),
}


@pytest.mark.parametrize("mode", list(BATCHED))
def test_batched_direct_cohort_and_plain_mode_give_the_same_set(mode) -> None:
    obj = _objective(seed=6)
    n, m = obj.n_users, obj.n_elements
    k, params = 5, BATCHED[mode]
    direct = _direct(obj, k, params, seed=3)
    per_user = _direct(obj, k, FedSMParams(**{**params.__dict__, "rng": "per-user"}), seed=3)
    assert direct != per_user  # another scheme, other draws (same law)

    def factory(context):
        p, parts = context.node_config["partition-id"], context.node_config["num-partitions"]
        first, count = cohort_range(n, p, parts)
        return SubmodularClient(
            MaxRowObjective(obj.values[first : first + count]), first, n, p, parts
        )

    cohort = FedSMCohorts(n, UniformMatroid(m, k), k, params, seed=3, lam=obj.max_singleton)
    sel_cohort = cohort.start(LocalGrid(3, {}, app=numpy_client_app(factory)), num_rounds=k)
    plain = FedSMStrategy(k=k, seed=3, min_available_nodes=n, params=params)
    sel_plain = plain.start(LocalGrid(n, {}, app=user_app(obj)))
    assert sel_cohort.arrays["selected"].numpy().tolist() == direct
    assert sel_plain.arrays["selected"].numpy().tolist() == direct


@pytest.mark.flwr
@pytest.mark.long
def test_flwr_run_with_batched_draws_gives_the_direct_engines_set(flower_cli, tmp_path) -> None:
    """run_config ``fedsm-rng='batched'`` reaches the server and the nodes (one flwr run)."""
    from direct import run_direct
    from flower_app.config import AppConfig

    config = {
        "num-users": 40,
        "num-elements": 60,
        "k": 6,
        "clients-per-round": 0.5,
        "elements-per-client": 0.3,
        "seed": 4,
        "fedsm-rng": "batched",
    }
    run = flower_cli.run(config, num_supernodes=3)
    assert run.status == "finished:completed", run.output

    def direct(**extra):
        cfg = {**config, **extra, "output-dir": str(tmp_path), "run-name": str(len(extra))}
        return run_direct(AppConfig.from_run_config(cfg))["selected"]

    assert run.summary["selected"] == direct()
    assert run.summary["selected"] != direct(**{"fedsm-rng": "per-user"})


@pytest.mark.parametrize("mode", ["alg1", "alg2"])
def test_a_gains_callable_draws_densely_under_batched_and_runs_to_k(mode) -> None:
    """No support known: the keyed dense draw (same law), a full run, a valid set."""
    obj = _objective(seed=5)
    params = BATCHED[mode]
    strategy = FedSMStrategy(k=4, seed=2, min_available_nodes=obj.n_users, params=params)
    result = strategy.start(LocalGrid(obj.n_users, {}, app=user_app(obj, "candidates")))
    selected = result.arrays["selected"].numpy().tolist()
    assert len(selected) == 4 == len(set(selected))
    assert all(0 <= e < obj.n_elements for e in selected)
    assert all(r["bad-replies"] == 0 for r in strategy.history)


def test_run_sim_sweep_passes_rng_to_every_run(tmp_path) -> None:
    """``run_sim.py fedsm-sweep --rng batched``: the rows are the batched direct runs'."""
    from test_run_sim import run_sim

    from direct import run_direct
    from flower_app.config import AppConfig

    argv = [
        "fedsm-sweep", "--dataset", "synthetic-facility-location", "--num-users", "200",
        "--num-elements", "60", "--k", "4", "--clients", "0.25", "--elements", "0.2",
        "--seeds", "1", "--rng", "batched", "--out", str(tmp_path / "sweep"),
    ]  # fmt: skip
    assert run_sim.main(argv) == 0
    row = run_sim.read_sweep(tmp_path / "sweep" / "sweep.csv").iloc[-1]
    base = {
        "dataset": "synthetic-facility-location", "num-users": 200, "num-elements": 60,
        "k": 4, "clients-per-round": 0.25, "elements-per-client": 0.2, "seed": 1,
        "output-dir": str(tmp_path / "direct"),
    }  # fmt: skip
    batched = run_direct(AppConfig.from_run_config({**base, "fedsm-rng": "batched"}))
    per_user = run_direct(AppConfig.from_run_config({**base, "run-name": "p"}))
    assert row["objective"] == batched["objective"] != per_user["objective"]
