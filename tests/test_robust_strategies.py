"""The strategies refuse and count what no honest user or node sends (in-process grid)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from test_fedsm_dropin import M, N, _objective, user_app
from test_robust_checks import promoted_instance

from direct.fedsm import run_rounds
from flower_app import checkpoint
from flower_app.algorithms.fedcg.discrete_greedy import DiscreteGreedyServer
from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun
from flower_app.algorithms.robust.history import NOISE_AWARE_MARGIN
from flower_app.clients.adapter import numpy_client_app
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.continuous import ContinuousClient
from flower_app.clients.fedsm import fedsm_reply
from flower_app.clients.submodular import SubmodularClient
from flower_app.strategies.cohort.discrete_greedy import DiscreteGreedyCohorts
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from flower_app.strategies.fedsm import FedSMStrategy
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import MaxRowObjective
from tests.support.local_grid import LocalGrid

INT64_MAX = np.iinfo(np.int64).max


def _liar_app(obj: MaxRowObjective, lie: str) -> ClientApp:
    """Node 0 answers setup honestly, then in every round sends ``lie``; the rest are honest."""
    app = ClientApp()

    @app.train()
    def train(msg, context):
        config = msg.content.config_records["config"]
        if int(context.node_config["partition-id"]) != 0 or config.get("stage") != "round":
            return _honest(msg, context, obj)
        reply = _honest(msg, context, obj)
        selected = set(msg.content.array_records["arrays"]["selected"].numpy().tolist())
        outside = [e for e in range(M) if e not in selected]
        values = np.zeros(M)
        if lie == "range":
            values[outside[0]] = 1e3
        else:  # λ on every element outside S: most are not in its draw
            values[outside] = obj.max_singleton
        out = ArrayRecord({"values": Array(values)})
        return Message(
            RecordDict({"arrays": out, "metrics": reply.content.metric_records["metrics"]}),
            reply_to=msg,
        )

    return app


def _honest(msg, context, obj: MaxRowObjective) -> Message:
    user = int(context.node_config["partition-id"])
    row = obj.values[user]
    scores = dict(zip(row.indices.tolist(), row.data.tolist(), strict=True))
    return fedsm_reply(msg, context, scores, n_elements=M)


@pytest.mark.parametrize("lie", ["range", "draw"])
def test_plain_fedsm_refuses_a_report_no_honest_user_sends(lie) -> None:
    """A node whose report exceeds λ, or lies off its own draw, is refused every round and
    counted by reason; the run ends as the run in which that node sent nothing."""
    obj = _objective()
    params = FedSMParams("alg1", 1.0, 0.2)  # every user every round: node 0 always asked
    liar = FedSMStrategy(k=4, seed=3, min_available_nodes=N, params=params)
    result = liar.start(LocalGrid(N, {}, app=_liar_app(obj, lie)))
    rows = [r for r in liar.history if r.get("server-round", 0) > 0]
    assert len(rows) == 4
    for row in rows:
        assert row[f"refused-{lie}"] == 1 and row["reports-refused"] == 1
        assert row["bad-replies"] == 1 and row["users"] == N - 1
    assert liar.report_bound == pytest.approx(obj.max_singleton)

    def silent(msg, context):  # node 0 sends nothing in the rounds
        config = msg.content.config_records["config"]
        if int(context.node_config["partition-id"]) == 0 and config.get("stage") == "round":
            raise RuntimeError("no reply")
        return _honest(msg, context, obj)

    app = ClientApp()
    app.train()(silent)
    quiet = FedSMStrategy(k=4, seed=3, min_available_nodes=N, params=params)
    expected = quiet.start(LocalGrid(N, {}, app=app))
    assert (
        result.arrays["selected"].numpy().tolist() == expected.arrays["selected"].numpy().tolist()
    )


def test_cohort_discrete_greedy_refuses_a_wrapping_node_by_name() -> None:
    """One node sends 2^63 − 1 on every element every round: added after the honest nodes'
    reports it would wrap the sum, so it is refused as an overflow, counted in every round's
    row, and the other nodes' sum decides."""
    obj = _objective(seed=7)
    n, k, parts = obj.n_users, 3, 3
    matroid = UniformMatroid(M, k)

    def factory(context):
        p = int(context.node_config["partition-id"])
        first, count = cohort_range(n, p, parts)
        rows = MaxRowObjective(obj.values[first : first + count])
        client = ContinuousClient(rows, first, n, p, parts, matroid, state=context.state)
        if p != parts - 1:  # the last node replies after the others: its report would wrap
            return client
        fit = client.fit

        def evil_fit(parameters, config):
            arrays, count_, metrics = fit(parameters, config)
            if config.get("kind", "") == "discrete":
                arrays = [np.full(M, INT64_MAX, dtype=np.int64)]
            return arrays, count_, metrics

        client.fit = evil_fit
        return client

    server = DiscreteGreedyServer(n, matroid, k, 5.0, seed=2, report_bound=obj.max_singleton)
    strategy = DiscreteGreedyCohorts(server)
    strategy.start(LocalGrid(parts, {}, app=numpy_client_app(factory)), num_rounds=k)
    rows = [r for r in strategy.history if "element" in r]
    assert len(rows) == k
    assert all(r["refused-overflow"] == 1 and r["reports-refused"] == 1 for r in rows)
    assert len(set(server.selected)) == k


def test_report_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="report_bound"):
        FedSMStrategy(k=2, report_bound=0.0)


def _direct_rows(obj: MaxRowObjective, k: int, params: FedSMParams, seed: int):
    run = FedSMRun(obj.n_users, UniformMatroid(obj.n_elements, k), k, params, 5.0, seed=seed)
    rows: list[dict] = []
    return run_rounds(obj, run, on_round=rows.append), rows


@pytest.mark.parametrize("name", ["noise-aware", "mean"])
def test_cohort_fedsm_with_the_history_clamp_keeps_committed_promoters_out(name: str) -> None:
    """The dishonest users of ``promoted_instance`` sit on the last of three nodes, which
    computes their reports from their committed profiles: without the clamp one promoted
    element enters S (seed 4), with either clamp (the default noise-aware one, the mean)
    none does, and the strategy chooses the direct engine's S with the same per-round count
    of lowered estimates."""
    committed, useless = promoted_instance()
    n, m, k, seed = committed.n_users, committed.n_elements, 8, 4
    clamp = FedSMParams("alg1", 0.1, 0.1, history_clamp=name)
    selected, rows = _direct_rows(committed, k, clamp, seed)
    assert not set(selected) & useless
    off = FedSMParams("alg1", 0.1, 0.1, history_clamp="off")
    assert set(_direct_rows(committed, k, off, seed)[0]) & useless

    def factory(context):
        p, parts = context.node_config["partition-id"], context.node_config["num-partitions"]
        first, count = cohort_range(n, p, parts)
        rows_ = MaxRowObjective(committed.values[first : first + count])
        return SubmodularClient(rows_, first, n, p, parts)

    cohort = FedSMCohorts(n, UniformMatroid(m, k), k, clamp, seed=seed, lam=5.0)
    result = cohort.start(LocalGrid(3, {}, app=numpy_client_app(factory)), num_rounds=k)
    assert result.arrays["selected"].numpy().tolist() == selected
    got = [r["estimates-clamped"] for r in cohort.history if "element" in r]
    assert got == [r["estimates-clamped"] for r in rows] and sum(got) > 0


@pytest.mark.parametrize("name", ["noise-aware", "mean"])
def test_plain_fedsm_with_the_history_clamp_gives_the_direct_engines_set(name: str) -> None:
    """One node per user; users 0 and 1 are dishonest and report λ from a committed profile on
    the three elements the honest users value least. The strategy's rounds hold the
    estimates as the direct engine does (either clamp): same S, same counts in every row."""
    obj = _objective()
    values = obj.values.toarray()
    useless = np.argsort(values.sum(axis=0), kind="stable")[:3]
    values[:2] = 0.0
    values[:2, useless] = obj.max_singleton
    committed = MaxRowObjective(sp.csr_matrix(values))
    k, seed = 6, 3
    params = FedSMParams("alg1", 0.25, 0.2, history_clamp=name)
    run = FedSMRun(N, UniformMatroid(M, k), k, params, obj.max_singleton, seed=seed)
    rows: list[dict] = []
    selected = run_rounds(committed, run, on_round=rows.append)
    strategy = FedSMStrategy(k=k, seed=seed, min_available_nodes=N, params=params)
    result = strategy.start(LocalGrid(N, {}, app=user_app(committed)))
    assert result.arrays["selected"].numpy().tolist() == selected
    got = [r["estimates-clamped"] for r in strategy.history if r.get("server-round", 0) > 0]
    assert got == [r["estimates-clamped"] for r in rows] and sum(got) > 0


def test_a_clamped_fedsm_run_resumes_from_its_checkpoint_to_the_same_set() -> None:
    """The history the clamp keeps (sums and sums of squares, the default noise-aware
    bound's) is part of the checkpoint: a run resumed after round 3 (through the
    checkpoint's bytes) holds the same estimates and chooses the same S as the
    uninterrupted run."""
    committed, _ = promoted_instance()
    n, m, k, seed = committed.n_users, committed.n_elements, 8, 4
    params = FedSMParams("alg1", 0.1, 0.1)  # the default clamp: noise-aware

    def factory(context):
        p, parts = context.node_config["partition-id"], context.node_config["num-partitions"]
        first, count = cohort_range(n, p, parts)
        return SubmodularClient(
            MaxRowObjective(committed.values[first : first + count]), first, n, p, parts
        )

    def grid() -> LocalGrid:
        return LocalGrid(3, {}, app=numpy_client_app(factory))

    saved: list[bytes] = []

    def keep(payload) -> None:
        saved.append(checkpoint.dumps(payload))

    whole = FedSMCohorts(n, UniformMatroid(m, k), k, params, seed=seed, lam=5.0, checkpoint_fn=keep)
    whole.start(grid(), num_rounds=k)
    payload = checkpoint.loads(saved[2])
    held = payload["state"].inner.history
    assert held.rounds == 3 and held.margin == NOISE_AWARE_MARGIN and held.squares.any()
    resumed = FedSMCohorts(n, UniformMatroid(m, k), k, params, seed=seed, lam=5.0)
    resumed.resume_from(payload)
    resumed.start(grid(), num_rounds=k)
    assert resumed.run.selected == whole.run.selected
    counts = [r["estimates-clamped"] for r in whole.history if "element" in r]
    assert [r["estimates-clamped"] for r in resumed.history if "element" in r] == counts
