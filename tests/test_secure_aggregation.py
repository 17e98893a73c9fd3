"""Secure aggregation (SecAgg+ on Flower's primitives): the server sees only sums.

Property tests of the encoding (exact integer sums, bounded fixed-point error, masks that
cancel), then the protocol on an in-process grid with the real ClientApp (the package's
NumPyClient app with its mod, and a user's own Message-API ClientApp with the mod added):
every message the server receives is inspected for a node's reply in the clear, the sum
equals the plain run's exactly (integer marginal gains), the selected set is the same for
the same seed, and nodes that drop out during the protocol leave the right sum.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import scipy.sparse as sp
from flwr.app import ArrayRecord, Context, Error, Message
from flwr.clientapp import ClientApp
from hypothesis import given, settings
from hypothesis import strategies as st

from flower_app.algorithms.fedsm.modes import FedSMParams
from flower_app.clients.adapter import numpy_client_app
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.fedsm import fedsm_reply
from flower_app.clients.submodular import SubmodularClient
from flower_app.privacy import SecureAggregation, secure_aggregation_mod
from flower_app.privacy.fixed_point import decode_sum, encode_reply, layout_of, mask_stream
from flower_app.strategies import (
    FedCGStrategy,
    FedDiscreteGreedyStrategy,
    FedSMStrategy,
    FedSubAvgStrategy,
)
from flower_app.strategies.cohort.discrete_greedy import DiscreteGreedyCohorts
from flower_app.strategies.cohort.fedcg import FedCGCohorts
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from flower_app.strategies.cohort.fedsubavg import FedSubAvgCohorts
from flower_app.strategies.errors import AllRepliesRejectedError
from flower_app.submodular.matroids import UniformMatroid
from flower_app.submodular.objectives import MaxRowObjective
from tests.support.local_grid import LocalGrid

N_USERS, M, K, NODES = 40, 15, 4, 5


# ---------------------------------------------------------------------------- encoding
@given(st.lists(st.lists(st.integers(-(2**40), 2**40), min_size=3, max_size=3),
                min_size=1, max_size=12))  # fmt: skip
def test_integer_entries_sum_exactly(rows: list[list[int]]) -> None:
    from flwr.app import Array, RecordDict

    n = len(rows)
    total = np.zeros(3, np.uint64)
    for row in rows:
        content = RecordDict({"arrays": ArrayRecord({"v": Array(np.array(row, np.int64))})})
        total += encode_reply(layout_of(content), 24, n)
    entries = [e for e, _ in layout_of(content)]
    out = decode_sum(total, entries, 24, {})
    assert out.array_records["arrays"]["v"].numpy().tolist() == np.sum(rows, axis=0).tolist()


@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=30),
       st.integers(8, 30))  # fmt: skip
def test_real_entries_sum_within_the_stated_quantisation_error(xs: list[float], f: int) -> None:
    from flwr.app import MetricRecord, RecordDict

    total = np.zeros(1, np.uint64)
    entries = None
    for x in xs:
        content = RecordDict({"metrics": MetricRecord({"loss": float(x)})})
        layout = layout_of(content)
        entries = [e for e, _ in layout]
        total += encode_reply(layout, f, len(xs))
    got = decode_sum(total, entries, f, {}).metric_records["metrics"]["loss"]
    assert abs(got - sum(xs)) <= len(xs) * 2.0 ** -(f + 1) + 1e-9 * abs(sum(xs))


@given(st.binary(min_size=1, max_size=64), st.binary(min_size=1, max_size=64))
def test_masks_are_keyed_and_cancel_in_pairs(a: bytes, b: bytes) -> None:
    x = np.arange(20, dtype=np.uint64)
    ma, mb = mask_stream(a, 20), mask_stream(b, 20)
    assert np.array_equal((x + ma) - ma, x)  # wraps modulo 2^64
    assert np.array_equal(mask_stream(a, 20), ma)
    if a != b:
        assert not np.array_equal(ma, mb)


def test_a_value_too_large_to_sum_is_refused_with_its_name() -> None:
    from flwr.app import Array, RecordDict

    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.array([1e12]))})})
    with pytest.raises(ValueError, match="'arrays/w'.*lower secagg-frac-bits"):
        encode_reply(layout_of(content), 24, 1000)
    bad = RecordDict({"arrays": ArrayRecord({"w": Array(np.array([np.nan]))})})
    with pytest.raises(ValueError, match="non-finite"):
        encode_reply(layout_of(bad), 24, 2)


def test_settings_plan_shares_and_threshold() -> None:
    assert SecureAggregation().plan(10) == (9, 5)  # 2⌈log2 10⌉ + 1
    assert SecureAggregation().plan(100) == (15, 8)
    assert SecureAggregation().plan(5) == (5, 3)
    # the threshold is a strict majority of the neighbourhood, also at even sizes
    assert SecureAggregation(num_shares=1.0).plan(10) == (10, 6)
    assert SecureAggregation().plan(4) == (4, 3)
    assert SecureAggregation().plan(6) == (6, 4)
    assert SecureAggregation().plan(3) == (3, 2)
    assert SecureAggregation(num_shares=0.3).plan(100) == (31, 16)
    assert SecureAggregation(num_shares=4, reconstruction_threshold=3).plan(100) == (5, 3)
    assert SecureAggregation(reconstruction_threshold=1.0).plan(10) == (9, 9)
    with pytest.raises(ValueError, match="strict majority, at least 5"):
        SecureAggregation(reconstruction_threshold=4).plan(10)
    with pytest.raises(ValueError, match="strict majority"):
        SecureAggregation(reconstruction_threshold=0.4)
    with pytest.raises(ValueError, match="needs >= 3 nodes"):
        SecureAggregation(min_nodes=2)
    with pytest.raises(ValueError, match="frac_bits"):
        SecureAggregation(frac_bits=60)
    with pytest.raises(ValueError, match="fraction must be in"):
        SecureAggregation(num_shares=1.5)


# ---------------------------------------------------------------------------- protocol
def _ratings(seed: int = 5) -> np.ndarray:
    """Integer ratings 0..5 (most 0): marginal gains are integers, sums exact."""
    rng = np.random.default_rng(seed)
    r = rng.integers(1, 6, size=(N_USERS, M)).astype(np.float64)
    r[rng.random((N_USERS, M)) < 0.6] = 0.0
    return r


def _cohort_app(ratings: np.ndarray) -> ClientApp:
    def factory(context: Context) -> SubmodularClient:
        p, parts = context.node_config["partition-id"], context.node_config["num-partitions"]
        first, count = cohort_range(N_USERS, p, parts)
        rows = MaxRowObjective(sp.csr_matrix(ratings[first : first + count]))
        return SubmodularClient(rows, first, N_USERS, p, parts)

    return numpy_client_app(factory)


class Recorder(FedSMCohorts):
    """FedSM that keeps what it decoded (per node in the clear, the sum under SecAgg)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(N_USERS, UniformMatroid(M, K), K, FedSMParams("alg1", 0.6, 0.6),
                         seed=11, **kwargs)  # fmt: skip
        self.decoded: list[dict[int, np.ndarray]] = []

    def decode_train_reply(self, src, reply):
        out = super().decode_train_reply(src, reply)
        if not self.decoded or self._round_seen != self.run_round():
            self.decoded.append({})
            self._round_seen = self.run_round()
        self.decoded[-1][src] = out[0]
        return out

    def run_round(self) -> int:
        return len(self.run.selected)

    _round_seen = -1


def _cohort_strategy(**kwargs) -> Recorder:
    return Recorder(**kwargs)


class Wiretap(LocalGrid):
    """LocalGrid that keeps every reply the server receives; may drop or break one."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.received: list[Message] = []
        self.fail: dict[tuple[int, str], str] = {}  # (node, stage) -> "error" | "lost"

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            stage = None
            if "secagg" in msg.content.config_records:
                stage = msg.content.config_records["secagg"]["stage"]
            how = self.fail.get((int(msg.metadata.dst_node_id), stage))
            mid = super().push_messages([msg])[0]
            if how == "lost":
                self._replies.pop(mid)
            elif how == "error":
                self._replies[mid] = Message(Error(code=0, reason="node crashed"), reply_to=msg)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        got = super().pull_messages(message_ids)
        self.received.extend(got)
        return got


def _run(strategy: FedSMCohorts, grid: LocalGrid) -> list[int]:
    strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=K, timeout=0.5)
    return list(strategy.run.selected)


def _plain_and_secure(fail: dict | None = None, **settings):
    ratings = _ratings()
    plain_grid = Wiretap(NODES, {}, app=_cohort_app(ratings))
    plain = _cohort_strategy()
    s_plain = _run(plain, plain_grid)
    grid = Wiretap(NODES, {}, app=_cohort_app(ratings))
    grid.fail = dict(fail or {})
    secure = _cohort_strategy(secure_aggregation=SecureAggregation(**settings))
    s_secure = _run(secure, grid)
    return plain, s_plain, plain_grid, secure, s_secure, grid


def _payload_bytes(msg: Message) -> bytes:
    out = b""
    if msg.has_error():
        return out
    for rec in msg.content.array_records.values():
        for key in rec:
            out += rec[key].numpy().tobytes()
    return out


def test_secure_fedsm_selects_the_same_set_from_exactly_the_same_sums() -> None:
    plain, s_plain, _, secure, s_secure, grid = _plain_and_secure()
    assert s_secure == s_plain and len(s_plain) == K
    assert len(secure.decoded) == len(plain.decoded) == K
    for by_node, summed in zip(plain.decoded, secure.decoded, strict=True):
        assert list(summed) == [-1]  # one sender: the sum
        assert np.array_equal(summed[-1], np.sum(list(by_node.values()), axis=0))  # exact
    rows = [r for r in secure.history if r["server-round"] >= 1]
    assert all(r["secagg-nodes"] == NODES and r["bad-replies"] == 0 for r in rows)
    assert all(r["secagg-sessions"] == 1 and r["secagg-unmask-rejected"] == 0 for r in rows)
    # keys are set up once, in the first round; every round: collect, and unmask from the
    # three nodes that give every seed (5 of 5 neighbours, threshold 3: their own seeds,
    # three shares of each other one)
    assert all(r["secagg-unmask-nodes"] == 3 for r in rows)
    assert rows[0]["secagg-messages"] == 2 * (NODES + NODES + 3)  # setup, collect, unmask
    assert all(r["secagg-messages"] == 2 * (NODES + 3) for r in rows[1:])
    assert all(r["bytes-up"] == r["secagg-bytes-up"] > 0 for r in rows)


def test_no_message_the_server_receives_holds_a_nodes_reply_in_the_clear() -> None:
    plain, _, plain_grid, secure, _, grid = _plain_and_secure()
    reports = [r for by_node in plain.decoded for r in by_node.values() if r.any()]
    assert reports
    # every reply of the rounds (discovery's cohort sizes are not replies to sum)
    train_replies = [m for m in grid.received if m.metadata.message_type == "train"]
    assert len(train_replies) == NODES + K * (NODES + 3)  # setup once; collect, unmask
    for msg in train_replies:
        # nothing but the masked vector travels as an array, and it is uint64
        for name, rec in msg.content.array_records.items():
            assert name == "secagg-vector"
            assert [rec[k].numpy().dtype for k in rec] == [np.dtype(np.uint64)]
        # a node's (dense or sparse) report values are not in any payload
        blob = _payload_bytes(msg)
        for report in reports:
            assert report.tobytes() not in blob
            nz = report[report != 0]
            assert nz.tobytes() not in blob
        # metrics: only the public ones, in the clear
        for rec in msg.content.config_records.values():
            assert set(rec) <= {"pk", "trust", "destinations", "ciphertexts", "commitment",
                                "layout", "nodes", "shares", "seed", "num-elements"}  # fmt: skip
    # while the plain run's replies hold the reports themselves
    assert any(
        r.tobytes() in _payload_bytes(m) or r[r != 0].tobytes() in _payload_bytes(m)
        for m in plain_grid.received
        for r in reports
    )


@pytest.mark.parametrize("stage", ["collect", "unmask"])
@pytest.mark.parametrize("how", ["error", "lost"])
def test_a_node_dropping_out_mid_protocol_still_gives_the_right_sum(stage, how) -> None:
    victim = 1002
    fail = {(victim, stage): how}
    plain, _, _, secure, _, grid = _plain_and_secure(fail)
    rows = [r for r in secure.history if r["server-round"] >= 1]
    for t, (by_node, summed, row) in enumerate(
        zip(plain.decoded, secure.decoded, rows, strict=True)
    ):
        if stage == "collect":  # its vector never came: the session is rerun without it
            expected = sum(v for n, v in by_node.items() if n != victim)
            assert row["secagg-nodes"] == NODES - 1 and row["secagg-sessions"] == 2
            assert [f["node-id"] for f in row["failed-nodes"]] == [victim]
            assert row["users-missing"] == row["failed-nodes"][0]["users"] > 0
            assert row["users"] + row["users-missing"] == 24
            # masks left in would show as huge values; the sum is small non-negative ints
            assert summed[-1].min() >= 0 and summed[-1].max() <= 5 * 24
            assert np.array_equal(summed[-1], np.rint(summed[-1]))
            if t == 0:  # later rounds: S differs from the plain run's (users missing)
                assert np.array_equal(summed[-1], expected)
        else:  # its vector came; its private mask is rebuilt from the others' shares
            expected = sum(by_node.values())
            assert row["secagg-nodes"] == NODES and "failed-nodes" not in row
            assert row["secagg-unmask-rejected"] == 1 and row["secagg-sessions"] == 1
            assert np.array_equal(summed[-1], expected)
    if stage == "unmask":
        assert secure.run.selected == plain.run.selected


def test_too_many_dropouts_fail_the_round_loudly() -> None:
    ratings = _ratings()
    # every share needed (threshold 4 of 4): a node lost while unmasking leaves its
    # neighbours' seeds one share short
    grid = Wiretap(4, {}, app=_cohort_app(ratings))
    grid.fail = {(1001, "unmask"): "lost"}
    strategy = _cohort_strategy(secure_aggregation=SecureAggregation(reconstruction_threshold=4))
    with pytest.raises(AllRepliesRejectedError, match="than the threshold 4"):
        _run(strategy, grid)
    # a dropout in collect reruns the session without the node: 2 left, fewer than 3
    grid = Wiretap(3, {}, app=_cohort_app(ratings))
    grid.fail = {(1000, "collect"): "error"}
    strategy = _cohort_strategy(secure_aggregation=SecureAggregation())
    with pytest.raises(AllRepliesRejectedError, match="2 nodes left after dropouts, fewer than 3"):
        _run(strategy, grid)


def test_plain_mode_with_a_users_own_clientapp_and_the_mod() -> None:
    """One node per user, a Message-API ClientApp written as Flower users write them."""
    ratings = _ratings()

    def app(mods: list) -> ClientApp:
        client = ClientApp(mods=mods)

        @client.train()
        def train(msg: Message, context: Context) -> Message:
            scores = ratings[int(context.node_config["partition-id"])]
            return fedsm_reply(msg, context, scores)

        return client

    def node_config(i: int) -> dict:
        return {"partition-id": i, "num-partitions": 12}

    def strategy(**kw) -> FedSMStrategy:
        return FedSMStrategy(k=3, clients_per_round=0.5, elements_per_client=0.5, seed=2,
                             min_available_nodes=12, **kw)  # fmt: skip

    plain = strategy()
    plain.start(LocalGrid(12, {}, app=app([]), node_config=node_config), ArrayRecord(), 3)
    secure = strategy(secure_aggregation=SecureAggregation(num_shares=3))
    grid = Wiretap(12, {}, app=app([secure_aggregation_mod]), node_config=node_config)
    secure.start(grid, ArrayRecord(), 3)
    assert secure.run.selected == plain.run.selected
    row = secure.history[-1]
    assert row["secagg-nodes"] == 6 and row["users"] == 6
    # without the mod, the nodes cannot take part: a clear error naming the mod
    missing = strategy(secure_aggregation=SecureAggregation())
    with pytest.raises(AllRepliesRejectedError, match="secure_aggregation_mod"):
        missing.start(LocalGrid(12, {}, app=app([]), node_config=node_config), ArrayRecord(), 3)


@settings(max_examples=60, deadline=None)
@given(
    st.sets(st.integers(1, 2**63 - 1), min_size=3, max_size=40),
    st.integers(3, 41),
    st.randoms(use_true_random=False),
)
def test_neighbour_rings_are_a_connected_symmetric_function_of_the_nodes(
    nodes: set[int], size: int, shuffle: random.Random
) -> None:
    """Every node recomputes the ring from the announced nodes alone (in any order); each
    neighbourhood has the announced size, holds the node, is symmetric, and the ring is
    connected: the only set closed under neighbourhoods is every node."""
    from flower_app.privacy.topology import ring_neighbours

    order = sorted(nodes)
    n = len(order)
    k = n if size >= n else size | 1  # every node, or an odd size below n
    if k >= n:
        k = n
    ring = ring_neighbours(order, k)
    shuffle.shuffle(order)
    assert ring == ring_neighbours(order, k)
    for u, around in ring.items():
        assert u in around and len(around) == k and around == sorted(around)
        assert all(u in ring[v] for v in around)
    reached, frontier = {order[0]}, [order[0]]
    while frontier:
        for v in ring[frontier.pop()]:
            if v not in reached:
                reached.add(v)
                frontier.append(v)
    assert reached == nodes
    for bad in {2, n + 1} | ({k + 1} if k + 1 < n else set()):
        with pytest.raises(ValueError, match="neighbourhood size|at least 3"):
            ring_neighbours(order, bad)


def test_strategies_whose_aggregate_is_not_a_sum_refuse_secure_aggregation() -> None:
    with pytest.raises(ValueError, match="needs secure_aggregation"):
        FedSubAvgCohorts("fedsubavg", 10, 5, 2, dp=object())  # client-level DP: SecAgg only
    with pytest.raises(TypeError, match="unexpected keyword"):
        FedSubAvgStrategy(dp=object())  # the public strategy: no client-level DP
    with pytest.raises(TypeError, match="SecureAggregation"):
        FedSMStrategy(secure_aggregation=True)


# ---------------------------------------------------------------------------- flwr run
@pytest.mark.flwr
@pytest.mark.long
def test_flwr_run_with_secure_aggregation_selects_the_plain_set(flower_cli, tmp_path) -> None:
    """Flower's simulation engine (Ray), 6 SuperNodes: the same S as the plain run, with the
    protocol's cost in every round's row and the settings in config.json."""
    import json

    from direct import run_direct
    from flower_app.config import AppConfig

    small = {"num-users": 60, "num-elements": 40, "k": 4, "clients-per-round": 0.5,
             "elements-per-client": 0.5, "seed": 5}  # fmt: skip
    run = flower_cli.run({**small, "secure-aggregation": True, "secagg-num-shares": 3},
                         num_supernodes=6)  # fmt: skip
    assert run.status == "finished:completed", run.output
    config = json.loads((run.folder / "config.json").read_text())
    assert config["secure-aggregation"] is True and config["secagg-num-shares"] == 3
    rows = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for t, row in enumerate(rows):
        assert row["secagg-nodes"] == 6 and row["bad-replies"] == 0
        # keys once per run (6 setups in round 1); each round collect (6) and unmask (k = 3,
        # t = 2: a node not asked needs both its ring neighbours asked, so at least 3)
        unmask = row["secagg-unmask-nodes"]
        assert 3 <= unmask <= 6
        assert row["secagg-messages"] == 2 * ((6 if t == 0 else 0) + 6 + unmask)
        assert row["secagg-bytes-up"] == row["bytes-up"] > 0
    cfg = AppConfig.from_run_config({**small, "output-dir": str(tmp_path), "run-name": "d"})
    assert run.summary["selected"] == run_direct(cfg)["selected"]


def test_secure_aggregation_is_refused_for_families_without_it() -> None:
    from flower_app.config import AppConfig, ConfigError

    with pytest.raises(ConfigError, match="'secure-aggregation' = true is implemented for"):
        AppConfig.from_run_config({"algorithm": "central-sgd", "secure-aggregation": True,
                                   "dataset": "synthetic-movielens-rating"})  # fmt: skip
    assert AppConfig.from_run_config({"secure-aggregation": True}).secure == SecureAggregation()
    assert AppConfig.from_run_config({}).secure is None
    # a threshold below the strict majority the nodes demand: refused before Flower starts
    with pytest.raises(ConfigError, match="secagg.*strict majority"):
        AppConfig.from_run_config({"secure-aggregation": True,
                                   "secagg-reconstruction-threshold": 0.3})  # fmt: skip


# ---------------------------------------------------------------------------- MaxFL
MAXFL_SMALL = {
    "algorithm": "maxfl", "dataset": "synthetic-emnist", "num-users": 6,
    "clients-per-round": 4, "maxfl-rounds": 3, "maxfl-eval-every": 1,
    "maxfl-mandatory-rounds": 3, "maxfl-solo-steps": 20, "maxfl-local-steps": 5, "seed": 4,
}  # fmt: skip


@pytest.mark.parametrize("algorithm", ["maxfl", "qffl", "scaffold"])
def test_maxfl_family_under_secure_aggregation_matches_the_plain_model(tmp_path, algorithm):
    """The model after 3 rounds equals the direct engine's within the fixed-point error
    (float sums: 2^-25 per value and node, f = 24), the row sums agree, and no reply
    carries a client's q_k, loss or update in the clear."""
    import json

    from direct import run_direct
    from flower_app.config import AppConfig
    from flower_app.runners import maxfl as runner

    def cfg(name: str, **extra) -> AppConfig:
        out = {"output-dir": str(tmp_path), "run-name": name}
        return AppConfig.from_run_config({**MAXFL_SMALL, "algorithm": algorithm, **extra, **out})

    def rows_of(name: str) -> list[dict]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x) for x in lines]

    direct = run_direct(cfg("direct"))
    grid = Wiretap(3, {**MAXFL_SMALL, "algorithm": algorithm})
    secure = runner.server_run(grid, cfg("secure", **{"secure-aggregation": True}))
    assert secure["model-digest"] != direct["model-digest"]  # fixed point: not bit-equal
    a, b = np.load(tmp_path / "direct" / "model.npz"), np.load(tmp_path / "secure" / "model.npz")
    for key in a.files:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-5)
    rows, plain = rows_of("secure"), rows_of("direct")
    for r, p in zip(rows[1:], plain[1:], strict=True):
        assert r["secagg-nodes"] >= 2 and r["bad-replies"] == 0 and r["users"] == p["users"]
        assert r["q-mean"] == pytest.approx(p["q-mean"], abs=1e-6)
        assert r["train-loss"] == pytest.approx(p["train-loss"], rel=1e-6)
    for msg in grid.received:
        if msg.metadata.message_type == "train" and not msg.has_error():
            assert set(msg.content.array_records) <= {"secagg-vector"}
            assert not msg.content.metric_records


def test_mwfed_refuses_secure_aggregation() -> None:
    from flower_app.config import AppConfig, ConfigError

    with pytest.raises(ConfigError, match="except mwfed"):
        AppConfig.from_run_config({**MAXFL_SMALL, "algorithm": "mwfed",
                                   "secure-aggregation": True})  # fmt: skip


# ---------------------------------------------------------------------------- FedCG
@pytest.mark.parametrize("mode", ["cohort", "plain"])
def test_fedcg_under_secure_aggregation_reaches_the_plain_x(mode) -> None:
    """FedCG's x after 2 rounds: the plain run's within the fixed-point error (the
    directions' sums are reals), with the same rounded set; no report in the clear."""
    from flower_app.algorithms.fedcg.continuous import FedCGServer, LocalSteps
    from flower_app.clients.fedcg import ScoreTable, add_fedcg_handlers
    from tests.test_hostile_replies import (
        N_COHORT,
        N_PLAIN,
        _cohort_factory,
        _cohort_nodes,
        _facility,
        _pid,
    )  # fmt: skip
    from tests.test_hostile_replies import M as HM

    def strategy(**kw) -> FedCGStrategy | FedCGCohorts:
        if mode == "cohort":
            server = FedCGServer(N_COHORT, UniformMatroid(HM, 2), 2, 0.0, LocalSteps(), 0.5,
                                 seed=0)  # fmt: skip
            return FedCGCohorts(server, **kw)
        return FedCGStrategy(k=2, seed=7, fraction_train=0.7, min_train_nodes=3, **kw)

    def grid(mods: bool) -> Wiretap:
        if mode == "cohort":
            app = numpy_client_app(_cohort_factory(_facility(N_COHORT), True))
            return Wiretap(3, {}, app=app, node_config=_cohort_nodes)
        rows = _facility(N_PLAIN).values.toarray()
        app = add_fedcg_handlers(
            ClientApp(mods=[secure_aggregation_mod] if mods else []),
            lambda context: ScoreTable(rows[int(context.node_config["partition-id"])]),
        )
        return Wiretap(N_PLAIN, {}, app=app, node_config=_pid)

    plain = strategy()
    plain.start(grid(False), ArrayRecord(), 2, timeout=2)
    secure = strategy(secure_aggregation=SecureAggregation())
    wiretap = grid(True)
    secure.start(wiretap, ArrayRecord(), 2, timeout=2)
    np.testing.assert_allclose(secure.server.x, plain.server.x, rtol=0, atol=1e-6)
    assert secure.history[-1]["secagg-nodes"] >= 2
    assert secure.history[-1]["bad-replies"] == 0
    for msg in wiretap.received:
        if msg.metadata.message_type.startswith("train") and not msg.has_error():
            assert set(msg.content.array_records) <= {"secagg-vector"}


# ---------------------------------------------------------------------------- FedSubAvg
@pytest.mark.parametrize("algorithm", ["fedsubavg", "fedadam-sub", "scaffold-sub"])
def test_fedsubavg_family_under_secure_aggregation_reaches_the_plain_model(algorithm) -> None:
    """Cohort mode: the heat is counted exactly by a secure sum, the model after 4 rounds is
    the direct engine's within the fixed-point error, and the server receives neither a
    node's update nor any user's index set (the full model goes down instead)."""
    from direct.fedsubavg import run_direct_rounds
    from flower_app.algorithms.fedsubavg.core import LocalConfig, RunSpec
    from flower_app.config import AppConfig
    from flower_app.runners.fedsubavg import load_task
    run_config = {"algorithm": algorithm, "dataset": "synthetic-movielens-rating",
                  "num-users": 45, "num-elements": 40, "clients-per-round": 8,
                  "fsa-rounds": 4, "seed": 5}  # fmt: skip
    cfg = AppConfig.from_run_config(run_config)
    task = load_task(cfg)
    strategy = FedSubAvgCohorts(algorithm, task.n_clients, task.n_params, 8, seed=5,
                                secure_aggregation=SecureAggregation())  # fmt: skip
    grid = Wiretap(3, cfg.to_dict())
    strategy.start(grid, num_rounds=4)
    x, history, heat = run_direct_rounds(task, RunSpec(algorithm, 4, 8, seed=5,
                                                       local=LocalConfig()))  # fmt: skip
    assert np.array_equal(strategy.heat.clients, heat.clients)  # integers: exact
    assert np.array_equal(strategy.heat.samples, heat.samples)
    np.testing.assert_allclose(strategy.x, x, rtol=0, atol=1e-5)
    assert np.abs(x).max() > 1e-3
    rows = [r for r in strategy.history if r["server-round"] >= 1]
    for fl, di in zip(rows, history, strict=True):
        assert fl["clients"] == di["clients"] == 8 and fl["bad-replies"] == 0
        assert fl["union-rows"] == di["union-rows"]  # the union is what the server learns
    for msg in grid.received:
        assert msg.metadata.message_type != "query.submodel"  # no index sets asked for
        if msg.metadata.message_type.startswith("train") and not msg.has_error():
            assert set(msg.content.array_records) <= {"secagg-vector"}
            assert "properties" not in msg.content.config_records


# ---------------------------------------------------------------------------- discrete greedy
@pytest.mark.parametrize("mode", ["cohort", "plain"])
def test_discrete_greedy_under_secure_aggregation_selects_the_plain_set(mode) -> None:
    """Algs. 3-5 are sums throughout (histogram, Σ κ_i, fixed-point int64 reports): all
    three exchanges go through SecAgg+, the set is the plain run's exactly, and no reply the
    server receives holds a histogram or a report in the clear."""
    from flower_app.algorithms.fedcg.discrete_greedy import DiscreteGreedyServer
    from flower_app.clients.fedcg import ScoreTable, add_fedcg_handlers
    from tests.test_hostile_replies import (
        N_COHORT,
        N_PLAIN,
        _cohort_factory,
        _cohort_nodes,
        _facility,
        _pid,
    )
    from tests.test_hostile_replies import M as HM

    def strategy(**kw) -> FedDiscreteGreedyStrategy | DiscreteGreedyCohorts:
        if mode == "cohort":
            server = DiscreteGreedyServer(N_COHORT, UniformMatroid(HM, 3), 3, 5.0)
            return DiscreteGreedyCohorts(server, **kw)
        return FedDiscreteGreedyStrategy(k=3, kappa=3.0, seed=4, min_available_nodes=N_PLAIN, **kw)

    def grid(mods: bool) -> Wiretap:
        if mode == "cohort":
            app = numpy_client_app(_cohort_factory(_facility(N_COHORT), True))
            return Wiretap(3, {}, app=app, node_config=_cohort_nodes)
        rows = _facility(N_PLAIN).values.toarray()
        app = add_fedcg_handlers(
            ClientApp(mods=[secure_aggregation_mod] if mods else []),
            lambda context: ScoreTable(rows[int(context.node_config["partition-id"])]),
        )
        return Wiretap(N_PLAIN, {}, app=app, node_config=_pid)

    plain = strategy()
    plain_result = plain.start(grid(False), ArrayRecord(), 3, timeout=2)
    secure = strategy(secure_aggregation=SecureAggregation())
    wiretap = grid(True)
    secure_result = secure.start(wiretap, ArrayRecord(), 3, timeout=2)
    assert secure_result.arrays["selected"].numpy().tolist() == (
        plain_result.arrays["selected"].numpy().tolist()
    )
    assert secure.server.expected == pytest.approx(plain.server.expected, rel=1e-6)
    rows = [r for r in secure.history if r["server-round"] >= 1]
    assert all(r["secagg-nodes"] >= 2 and r["bad-replies"] == 0 for r in rows)
    for msg in wiretap.received:
        if msg.metadata.message_type.startswith("train") and not msg.has_error():
            assert set(msg.content.array_records) <= {"secagg-vector"}


# ---------------------------------------------------------------------------- run_config
@pytest.mark.parametrize(
    "run_config",
    [
        {"algorithm": "fedsm", "num-users": 40, "num-elements": 30, "k": 2},
        {"algorithm": "fedcg", "num-users": 40, "num-elements": 30, "k": 2, "fedcg-rounds": 2},
        {"algorithm": "fed-discrete-greedy", "num-users": 40, "num-elements": 30, "k": 2},
        {**MAXFL_SMALL, "maxfl-rounds": 2},
        {"algorithm": "fedsubavg", "dataset": "synthetic-movielens-rating", "num-users": 30,
         "num-elements": 20, "clients-per-round": 6, "fsa-rounds": 2},
    ],
    ids=lambda c: c["algorithm"],
)  # fmt: skip
def test_every_runner_honours_secure_aggregation_in_run_config(tmp_path, run_config) -> None:
    """``secure-aggregation = true`` reaches every family's strategy (no silent clear run)."""
    import json

    from flower_app.config import AppConfig
    from flower_app.registry import load_runner

    full = {**run_config, "secure-aggregation": True, "output-dir": str(tmp_path),
            "run-name": "r", "seed": 3}  # fmt: skip
    cfg = AppConfig.from_run_config(full)
    load_runner(cfg.algorithm).server_run(LocalGrid(3, full), cfg)
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if r.get("server-round", 0) >= 1]
    assert rows and all(r["secagg-nodes"] >= 2 for r in rows)
    assert json.loads((tmp_path / "r" / "config.json").read_text())["secure-aggregation"]


@pytest.mark.parametrize(
    "run_config",
    [
        {"algorithm": "fedsm", "num-users": 40, "num-elements": 30, "k": 2},
        {"algorithm": "fedcg", "num-users": 40, "num-elements": 30, "k": 2, "fedcg-rounds": 2},
        {**MAXFL_SMALL, "maxfl-rounds": 2, "maxfl-solo-steps": 5, "maxfl-local-steps": 2},
        {"algorithm": "fedsubavg", "dataset": "synthetic-movielens-rating", "num-users": 30,
         "num-elements": 20, "fsa-rounds": 2},
    ],
    ids=lambda c: c["algorithm"],
)  # fmt: skip
def test_cohort_rounds_with_users_on_one_node_are_summed_with_idle_nodes(tmp_path, run_config):
    """One sampled user per round sits on one node: the other nodes join with no users
    (zero replies) so the round is a secure sum of 3 nodes instead of a refused one."""
    import json

    from flower_app.config import AppConfig
    from flower_app.registry import load_runner

    full = {**run_config, "clients-per-round": 1, "secure-aggregation": True,
            "output-dir": str(tmp_path), "run-name": "r", "seed": 3}  # fmt: skip
    cfg = AppConfig.from_run_config(full)
    load_runner(cfg.algorithm).server_run(LocalGrid(3, full), cfg)
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if r.get("server-round", 0) >= 1]
    assert rows and all(r["secagg-nodes"] == 3 and r["bad-replies"] == 0 for r in rows)
    assert all(r.get("users", r.get("clients")) == 1 for r in rows)
