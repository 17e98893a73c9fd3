"""Secure aggregation against a malicious server: the harness plays the server.

It drives the real node side (``secure_aggregation_mod`` in a real ClientApp, called in
process with real Contexts and Messages), follows the protocol where it must to get
material, and lies where an attack needs it: dropout claims told to some nodes and not to
others, oversized neighbour lists, unsafe thresholds, repeated and reordered stages,
requests for key material, inconsistent sessions, swapped keys, replayed shares. Every
attack must end with the lied-to nodes refusing; then the harness tries to recover a node's
reply from everything it obtained (masked vectors, revealed shares, several sessions) and
must fail. The recovery routine is itself shown to work when its material suffices (the
documented limit: all of a node's neighbours colluding).

Then the server's side: unmask replies that are duplicated, of the wrong kind, malformed or
lying are left out and the round goes on; integers outside the encoding's range are refused
by name; a session with a dropout is rerun from the nodes' kept replies; per-session secrets
are fresh; cohort rounds whose users sit on one node finish.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from flower_app.algorithms.fedsm.modes import FedSMParams
from flower_app.privacy import SecureAggregation, secure_aggregation_mod, secure_sum
from flower_app.privacy.fixed_point import encode_reply, layout_of, mask_stream
from flower_app.privacy.secagg_client import (
    PAIRS_RECORD,
    SECAGG_RECORD,
    SecureAggregationRefusedError,
)
from flower_app.privacy.secagg_server import KeyBook
from flower_app.privacy.shares import combine_seed, seed_commitment
from flower_app.privacy.topology import ring_neighbours
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from tests.support.local_grid import LocalGrid

FRAC = 24
SIZES = [4, 5, 6, 8, 16]


def _true_reply(node: int) -> RecordDict:
    """Node ``node``'s reply: a real vector (multiples of 2^-FRAC: exact) and an int."""
    rng = np.random.default_rng(node)
    vector = rng.integers(-1000, 1000, 7) / 2**10
    return RecordDict(
        {
            "arrays": ArrayRecord({"v": Array(vector)}),
            "metrics": MetricRecord({"count": int(rng.integers(1, 50))}),
        }
    )


class Federation:
    """n nodes: a real ClientApp with the mod, one real Context each; calls in process."""

    def __init__(self, n: int, node_config: Any = None) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.nodes = list(range(5000, 5000 + n))
        self.calls: Counter[int] = Counter()
        self.app = ClientApp(mods=[secure_aggregation_mod])

        @self.app.train()
        def train(msg: Message, context: Context) -> Message:
            self.calls[int(context.node_id)] += 1
            return Message(_true_reply(int(context.node_id)), reply_to=msg)

        self.contexts = {
            nid: Context(run_id=1, node_id=nid, state=RecordDict(), run_config={},
                         node_config=node_config(i) if node_config else {})  # fmt: skip
            for i, nid in enumerate(self.nodes)
        }
        self.keys: dict[int, bytes] = {}
        self.setup_replies: dict[int, dict[str, Any]] = {}
        self.session = 100

    def call(
        self, node: int, stage: dict[str, Any], train: bool = False, question: int = 1
    ) -> RecordDict:
        """Send one stage to a node; return its reply content (a refusal raises).

        ``train``: the stage carries a train request, question number ``question`` (the
        same number is the same question, whatever the round).
        """
        content = RecordDict({SECAGG_RECORD: ConfigRecord(stage)})
        if train:
            content["config"] = ConfigRecord({"server-round": 1, "question": question})
        msg = Message(content, dst_node_id=node, message_type="train")
        return self.app(msg, self.contexts[node]).content

    def setup(self) -> None:
        for node in self.nodes:
            rec = dict(self.call(node, {"stage": "setup"})[SECAGG_RECORD])
            self.setup_replies[node] = rec
            self.keys[node] = bytes(rec["pk"])

    def encoded(self, node: int, n: int) -> np.ndarray:
        return encode_reply(layout_of(_true_reply(node)), FRAC, n)


def refused(fed: Federation, node: int, stage: dict[str, Any], match: str, **kw) -> None:
    with pytest.raises(SecureAggregationRefusedError, match=match):
        fed.call(node, stage, **kw)


@dataclass
class Session:
    """What the server obtained in one session."""

    session: int
    nodes: list[int]
    ring: dict[int, list[int]]
    threshold: int
    vectors: dict[int, np.ndarray] = field(default_factory=dict)
    inbox: dict[int, list[tuple[str, bytes]]] = field(default_factory=dict)
    commitments: dict[int, bytes] = field(default_factory=dict)
    revealed: dict[int, dict[int, bytes]] = field(default_factory=dict)
    own_seeds: dict[int, bytes] = field(default_factory=dict)
    refusals: dict[int, str] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)


def collect_stage(fed: Federation, s: Session, node: int, **override: Any) -> dict[str, Any]:
    around = s.ring[node]
    stage = {
        "stage": "collect", "session": s.session, "round": 1,
        "announced": [str(v) for v in s.nodes], "neighbours": [str(v) for v in around],
        "keys": [fed.keys[v] for v in around], "shares": len(around),
        "threshold": s.threshold, "frac-bits": FRAC, "public": [],
    }  # fmt: skip
    stage.update(override)
    return stage


def collect(fed: Federation, nodes: list[int], plan: tuple[int, int] | None = None,
            seed: int = 0, session: int | None = None, question: int = 1) -> Session:  # fmt: skip
    """Run an honest collect of question ``question`` for ``nodes``; return what the server
    holds (``seed`` is unused: the ring is a function of the nodes)."""
    k, t = plan or SecureAggregation().plan(len(nodes))
    fed.session = fed.session + 1 if session is None else session
    s = Session(fed.session, list(nodes), ring_neighbours(nodes, k), t)
    s.inbox = {n: [] for n in nodes}
    for node in nodes:
        reply = fed.call(node, collect_stage(fed, s, node), train=True, question=question)
        rec = reply[SECAGG_RECORD]
        s.vectors[node] = reply["secagg-vector"]["masked"].numpy().copy()
        s.commitments[node] = bytes(rec["commitment"])
        for dst, ct in zip(rec["destinations"], rec["ciphertexts"], strict=True):
            s.inbox[int(dst)].append((str(node), bytes(ct)))
    return s


def unmask_stage(s: Session, holder: int, drop: tuple[int, ...] = (), **extra) -> dict:
    pairs = [(src, ct) for src, ct in s.inbox[holder] if int(src) not in drop]
    return {"stage": "unmask", "session": s.session, "sources": [p[0] for p in pairs],
            "ciphertexts": [p[1] for p in pairs], **extra}  # fmt: skip


def unmask(fed: Federation, s: Session, holder: int, drop: tuple[int, ...] = (), **extra) -> bool:
    """Ask ``holder`` for its shares (claiming ``drop`` dropped); True if it answered."""
    try:
        rec = fed.call(holder, unmask_stage(s, holder, drop, **extra))[SECAGG_RECORD]
    except SecureAggregationRefusedError as err:
        s.refusals[holder] = str(err)
        return False
    for owner, share in zip(rec["nodes"], rec["shares"], strict=True):
        s.revealed.setdefault(int(owner), {})[holder] = bytes(share)
    s.own_seeds[holder] = bytes(rec["seed"])
    return True


def seeds_of(s: Session) -> dict[int, bytes]:
    """Every seed the server was given or can rebuild from the shares (memoised)."""
    key = sum(len(v) for v in s.revealed.values())
    if s.cache.get("key") == key:
        return s.cache["seeds"]
    out = {
        node: seed
        for node, seed in s.own_seeds.items()
        if seed_commitment(seed, node, s.session) == s.commitments.get(node)
    }
    for owner, shares in s.revealed.items():
        if owner in out:
            continue
        for subset in itertools.combinations(sorted(shares), s.threshold):
            seed = combine_seed([shares[h] for h in subset])
            if seed_commitment(seed, owner, s.session) == s.commitments.get(owner):
                out[owner] = seed
                break
    s.cache.update(key=key, seeds=out)
    return out


def recover(fed: Federation, sessions: list[Session], target: int,
            pair_keys: dict[tuple[int, int], bytes] | None = None) -> bool:  # fmt: skip
    """Try every way the harness knows to get ``target``'s encoded reply; True if found.

    Per session: the target's vector minus every mask the server can compute (its self
    mask if its seed was rebuilt, pairwise masks whose key it holds, e.g. from colluders),
    the sum over all nodes whose seeds were rebuilt; across sessions: the differences of
    those sums and of the target's own vectors.
    """
    pair_keys = pair_keys or {}
    candidates: list[np.ndarray] = []
    sums: list[np.ndarray] = []
    for s in sessions:
        seeds = seeds_of(s)
        n = len(s.nodes)
        truth = fed.encoded(target, n)
        clean: dict[int, np.ndarray] = {}
        for node, y in s.vectors.items():
            c = y.copy()
            if node in seeds:
                c -= mask_stream(seeds[node], c.size, label=b"self|%d" % s.session)
            clean[node] = c
        if target in clean:
            c = clean[target].copy()
            for other in s.ring[target]:
                key = pair_keys.get((target, other))
                if other != target and key is not None:
                    pm = mask_stream(key, c.size, label=b"pair|%d" % s.session)
                    c = c - pm if target > other else c + pm
            candidates += [c, clean[target]]
        if seeds and all(node in seeds for node in s.vectors):
            sums.append(sum(clean.values(), np.zeros_like(truth)))
        candidates += sums[-1:]
    for a, b in itertools.combinations(sums, 2):
        candidates += [a - b, b - a]
    mine = [s.vectors[target] for s in sessions if target in s.vectors]
    for a, b in itertools.combinations(mine, 2):
        candidates += [a - b, b - a]
    truths = {len(s.nodes): fed.encoded(target, len(s.nodes)) for s in sessions}
    return any(
        c.shape == t.shape and np.array_equal(c, t) for c in candidates for t in truths.values()
    )


# ---------------------------------------------------------------------------- the harness
def test_an_honest_session_sums_exactly_and_the_recovery_needs_the_pair_keys() -> None:
    """The baseline every attack is measured against: an honest run unmasks the sum
    exactly, yet no single reply; the recovery routine finds the reply as soon as it holds
    the target's pairwise keys (all its neighbours colluding: the documented limit)."""
    fed = Federation(5)
    fed.setup()
    s = collect(fed, fed.nodes)
    for holder in fed.nodes:
        assert unmask(fed, s, holder)
    seeds = seeds_of(s)
    assert set(seeds) == set(fed.nodes)
    total = sum(
        (s.vectors[n] - mask_stream(seeds[n], 8, label=b"self|%d" % s.session) for n in fed.nodes),
        np.zeros(8, np.uint64),
    )
    assert np.array_equal(total, sum(fed.encoded(n, 5) for n in fed.nodes))
    target = fed.nodes[0]
    assert not recover(fed, [s], target)
    colluders = {}
    for other in s.ring[target]:
        if other != target:  # a colluding neighbour hands over its pairwise key
            pairs = fed.contexts[other].state[PAIRS_RECORD]
            colluders[(target, other)] = bytes(pairs[str(target)])
    assert recover(fed, [s], target, colluders)
    one_short = dict(list(colluders.items())[:-1])  # one honest neighbour is enough
    assert not recover(fed, [s], target, one_short)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("claim", ["missing-share", "dead-list"])
@pytest.mark.parametrize("neighbourhood", ["default", "everyone"])
def test_inconsistent_dropout_claims_are_refused(n: int, claim: str, neighbourhood: str) -> None:
    """The inconsistent-dropout attack: tell X and threshold - 1 neighbours "X is active" and
    the other neighbours "X dropped out", with the default plan's neighbourhoods and with
    every node as neighbour (announced as such: an unannounced oversized list is refused
    earlier, see below). The lied-to neighbours refuse; no reply is recoverable."""
    fed = Federation(n)
    fed.setup()
    plan = (n, n // 2 + 1) if neighbourhood == "everyone" else None
    s = collect(fed, fed.nodes, plan=plan)
    assert all(len(around) == (n if plan else SecureAggregation().plan(n)[0])
               for around in s.ring.values())  # fmt: skip
    target = fed.nodes[n // 2]
    around = [v for v in s.ring[target] if v != target]
    honest = around[: s.threshold - 1]
    for holder in [target, *honest]:
        assert unmask(fed, s, holder)
    for holder in around[s.threshold - 1 :]:
        extra = {"dead": [str(target)]} if claim == "dead-list" else {}
        assert not unmask(fed, s, holder, drop=(target,), **extra)
        expected = "unexpected fields" if claim == "dead-list" else "no share from neighbour"
        assert expected in s.refusals[holder]
    # nothing the server holds gives any node's reply
    assert not any(recover(fed, [s], node) for node in fed.nodes)
    # the lied-to nodes burnt the session: even an honest request is refused now
    for holder in around[s.threshold - 1 :]:
        refused(fed, holder, unmask_stage(s, holder), "nothing collected|refused")


@pytest.mark.parametrize("n", SIZES)
def test_oversized_neighbour_lists_and_sizes_are_refused(n: int) -> None:
    """Every node as neighbour while the plan announces fewer, or announced as the size
    with the plan's threshold (no majority of n): refused before any vector is sent."""
    fed = Federation(n)
    fed.setup()
    k, t = SecureAggregation().plan(n)
    s = Session(fed.session + 1, fed.nodes, {v: fed.nodes for v in fed.nodes}, t)
    node = fed.nodes[0]
    everyone = [str(v) for v in fed.nodes]
    keys = [fed.keys[v] for v in fed.nodes]
    if k < n:
        stage = collect_stage(fed, s, node, neighbours=everyone, keys=keys, shares=k)
        refused(fed, node, stage, f"has {n} nodes, the announced neighbourhood size is {k}",
                train=True)  # fmt: skip
    if t <= n // 2:
        stage = collect_stage(fed, s, node, shares=n)
        refused(fed, node, stage, "strict majority", train=True)
    # a neighbour list with a node that was not announced, or listed twice
    stage = collect_stage(fed, s, node, announced=everyone[:-1])
    if str(fed.nodes[-1]) in stage["neighbours"]:
        refused(fed, node, stage, "not announced", train=True)
    twice = collect_stage(fed, s, node, neighbours=[str(node)] * n, shares=n)
    refused(fed, node, twice, "lists a node twice", train=True)
    assert fed.calls[node] == 0  # the handler never ran: nothing computed, nothing sent


@pytest.mark.parametrize("n", SIZES)
def test_unsafe_thresholds_are_refused(n: int) -> None:
    fed = Federation(n)
    fed.setup()
    k, t = SecureAggregation().plan(n)
    session = Session(fed.session + 1, fed.nodes, ring_neighbours(fed.nodes, k), t)
    node = fed.nodes[0]
    for bad in sorted({1, k // 2, k + 1}):
        if k // 2 < bad <= k:
            continue
        refused(fed, node, collect_stage(fed, session, node, threshold=bad), "threshold",
                train=True)  # fmt: skip
    assert fed.calls[node] == 0


def test_a_two_node_session_is_refused_by_nodes_and_server() -> None:
    fed = Federation(3)
    fed.setup()
    two = fed.nodes[:2]
    s = Session(fed.session + 1, two, {v: two for v in two}, 2)
    refused(fed, two[0], collect_stage(fed, s, two[0]), "at least 3", train=True)
    msgs = [Message(RecordDict(), dst_node_id=v, message_type="train") for v in two]
    out = secure_sum(lambda m: [], msgs, SecureAggregation(), 1)
    assert out.content is None and all("at least 3" in r for r in out.failed.values())


@pytest.mark.parametrize("n", SIZES)
def test_repeated_stages_are_refused_and_a_rerun_gets_fresh_masks(n: int) -> None:
    """A second collect of the same session is refused; a new session for the same request
    (a rerun) is answered under fresh masks, from the kept reply (the handler ran once), and
    the first session can no longer be unmasked. Neither session's material, nor both
    together, give the reply; a second unmask of a session is refused."""
    fed = Federation(n)
    fed.setup()
    s1 = collect(fed, fed.nodes)
    target = fed.nodes[0]
    refused(fed, target, collect_stage(fed, s1, target), "already took part", train=True)
    s2 = collect(fed, fed.nodes, seed=1)
    assert all(fed.calls[v] == 1 for v in fed.nodes)  # answered from the kept reply
    assert not np.array_equal(s1.vectors[target], s2.vectors[target])
    assert not unmask(fed, s1, target)  # session 1 is over
    assert "last session is" in s1.refusals[target]
    # a node asked to unmask an old session treats the server as lying: its current
    # session is burnt too; the others unmask session 2 and the round goes on
    assert not unmask(fed, s2, target)
    for holder in fed.nodes[1:]:
        assert unmask(fed, s2, holder)
        refused(fed, holder, unmask_stage(s2, holder), "unmasked once")
    assert set(seeds_of(s2)) == set(fed.nodes)
    assert not any(recover(fed, [s1, s2], node) for node in fed.nodes)


def test_stages_out_of_order_are_refused() -> None:
    fed = Federation(5)
    node = fed.nodes[0]
    s0 = Session(1, fed.nodes, {v: fed.nodes for v in fed.nodes}, 3)
    fed.keys = {v: b"" for v in fed.nodes}
    refused(fed, node, collect_stage(fed, s0, node), "no keys", train=True)  # before setup
    refused(fed, node, unmask_stage(Session(1, [], {}, 3, inbox={node: []}), node), "no keys")
    fed.setup()
    s = Session(fed.session + 1, fed.nodes, {v: fed.nodes for v in fed.nodes}, 3, inbox={})
    s.inbox[node] = []
    refused(fed, node, unmask_stage(s, node), "nothing collected")  # unmask before collect
    s = collect(fed, fed.nodes)
    old = Session(s.session - 1, fed.nodes, s.ring, s.threshold, inbox=s.inbox)
    refused(fed, node, collect_stage(fed, old, node), "already took part", train=True)
    assert unmask(fed, s, node)
    refused(fed, node, collect_stage(fed, s, node), "already took part", train=True)  # after
    other = fed.nodes[1]
    refused(fed, other, unmask_stage(old, other), "last session is")  # an older session
    refused(fed, other, unmask_stage(s, other), "refused")  # ... burnt its current one
    refused(fed, node, {"stage": "share-keys", "session": s.session + 1}, "unknown stage")
    assert fed.calls[node] == 1


def test_inconsistent_sessions_keys_and_replayed_shares_are_refused() -> None:
    """Neighbours told different announced sets (or parameters) refuse to unmask; a key
    swapped after first use is refused; a share relayed from another session is refused."""
    fed = Federation(5)
    fed.setup()
    nodes, target = fed.nodes, fed.nodes[0]
    k, t = SecureAggregation().plan(5)
    s = Session(fed.session + 1, nodes, ring_neighbours(nodes, k), t)
    fed.session = s.session
    s.inbox = {v: [] for v in nodes}
    for node in nodes:  # the target is told a different frac-bits than everyone else
        stage = collect_stage(fed, s, node, **({"frac-bits": 20} if node == target else {}))
        rec = fed.call(node, stage, train=True)[SECAGG_RECORD]
        for dst, ct in zip(rec["destinations"], rec["ciphertexts"], strict=True):
            s.inbox[int(dst)].append((str(node), bytes(ct)))
    for holder in nodes:
        assert not unmask(fed, s, holder)
        assert "another session" in s.refusals[holder]
    # a key swapped after first use
    swapped = dict(fed.keys)
    swapped[nodes[1]], swapped[nodes[2]] = fed.keys[nodes[2]], fed.keys[nodes[1]]
    s3 = Session(fed.session + 1, nodes, {v: nodes for v in nodes}, t)
    stage = collect_stage(fed, s3, target, keys=[swapped[v] for v in nodes])
    refused(fed, target, stage, "pinned on first use", train=True)
    # shares of an old session replayed into a new one
    s4 = collect(fed, nodes, question=2)
    s5 = collect(fed, nodes, question=2)  # a rerun of question 2 (same nodes)
    replay = unmask_stage(s5, target)
    replay["ciphertexts"] = [ct for _, ct in s4.inbox[target]]
    refused(fed, target, replay, "for session")
    assert not any(recover(fed, [s4, s5], node) for node in nodes)


# ---------------------------------------------------------------------------- server side
def _grid_app(calls: Counter | None = None, big: int | None = None) -> ClientApp:
    app = ClientApp(mods=[secure_aggregation_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        if calls is not None:
            calls[int(context.node_id)] += 1
        content = _true_reply(int(context.node_id))
        if big is not None:
            content["metrics"] = MetricRecord({"count": big})
        return Message(content, reply_to=msg)

    return app


def _round(grid: LocalGrid, book: KeyBook, settings: SecureAggregation | None = None, t=1):
    msgs = [
        Message(RecordDict({"config": ConfigRecord({"x": t})}), dst_node_id=v, message_type="train")
        for v in grid.node_ids
    ]
    return secure_sum(lambda m: grid.send_and_receive(m), msgs, settings or SecureAggregation(),
                      t, keys=book)  # fmt: skip


def _expected(nodes: list[int]) -> tuple[np.ndarray, int]:
    v = sum(_true_reply(n)["arrays"]["v"].numpy() for n in nodes)
    return v, sum(int(_true_reply(n)["metrics"]["count"]) for n in nodes)


def _tamper_unmask(victim: int, how: str):
    def tamper(msg: Message, reply: Message) -> Message:
        cfg = msg.content.config_records.get(SECAGG_RECORD)
        if int(msg.metadata.dst_node_id) != victim or cfg is None or cfg["stage"] != "unmask":
            return reply
        rec = dict(reply.content[SECAGG_RECORD])
        nodes, shares = list(rec["nodes"]), list(rec["shares"])
        if how == "duplicate":
            nodes, shares = nodes + nodes[:1], shares + shares[:1]
        elif how == "wrong-kind":
            nodes[0] = "123"
        elif how == "malformed":
            shares[0] = shares[0][:-1]
        elif how == "wrong-index":
            shares[0] = (int.from_bytes(shares[0][:2], "big") % 9 + 1).to_bytes(2, "big") + (
                shares[0][2:]
            )
        elif how == "lying-share":  # well-formed, wrong value: caught by the commitment
            shares = [s[:2] + bytes(b ^ 0xFF for b in s[2:]) for s in shares]
        elif how == "lying-seed":  # its own seed wrong: rebuilt from the others' shares
            rec["seed"] = bytes(16)
        elif how == "not-a-list":
            shares = b"x"
        rec["nodes"], rec["shares"] = nodes, shares
        return Message(RecordDict({SECAGG_RECORD: ConfigRecord(rec)}), reply_to=msg)

    return tamper


@pytest.mark.parametrize(
    "how",
    ["duplicate", "wrong-kind", "malformed", "wrong-index", "lying-share", "lying-seed",
     "not-a-list"],  # fmt: skip
)
def test_bad_unmask_replies_are_left_out_and_the_round_goes_on(how: str) -> None:
    """A bad reply is left out whole; a lying share is found (by the commitment) when the
    seed it is a share of has to be rebuilt: here node 1001 does not answer its unmask."""
    grid = LocalGrid(6, {}, app=_grid_app())
    book = KeyBook()
    victim, silent = 1000, 1001
    bad = _tamper_unmask(victim, how)

    def tamper(msg: Message, reply: Message) -> Message:
        cfg = msg.content.config_records.get(SECAGG_RECORD)
        if how == "lying-share" and int(msg.metadata.dst_node_id) == silent and cfg and (
            cfg["stage"] == "unmask"
        ):
            return Message(Error(code=0, reason="gone"), reply_to=msg)
        return bad(msg, reply)

    grid.tamper = tamper
    out = _round(grid, book)
    assert out.content is not None and out.survivors == grid.node_ids
    v, count = _expected(grid.node_ids)
    np.testing.assert_array_equal(out.content["arrays"]["v"].numpy(), v)  # exact
    assert out.content["metrics"]["count"] == count
    expected = {victim, silent} if how == "lying-share" else {victim}
    assert set(out.unmask_rejected) == expected and out.failed == {}
    assert "does not rebuild its committed seed" in out.unmask_rejected[victim] or (
        how != "lying-share"
    )
    # more nodes than the first four (own seeds of 4, four shares of the 2 others) asked
    assert out.cost["secagg-unmask-nodes"] > 4 and out.cost["secagg-sessions"] == 1


def test_too_few_valid_shares_fail_the_round() -> None:
    """Threshold 4 of 4: a node whose own seed is wrong has its whole reply left out, and
    its seed has only three shares left."""
    grid = LocalGrid(4, {}, app=_grid_app())
    grid.tamper = _tamper_unmask(1000, "lying-seed")
    out = _round(grid, KeyBook(), SecureAggregation(reconstruction_threshold=4))
    assert out.content is None and "than the threshold 4" in next(iter(out.failed.values()))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (np.array([2**63], dtype=np.uint64), "outside the signed 64-bit range"),
        (np.array([2**64 - 1, 3], dtype=np.uint64), "outside the signed 64-bit range"),
        (np.array([-(2**62)], dtype=np.int64), "too large to sum 3 clients"),
    ],
)
def test_integers_outside_the_encoding_are_refused_by_name(value, match) -> None:
    content = RecordDict({"arrays": ArrayRecord({"counts": Array(value)})})
    with pytest.raises(ValueError, match=f"'arrays/counts'.*{match}"):
        encode_reply(layout_of(content), FRAC, 3)
    big = RecordDict({"metrics": MetricRecord({"n": 2**63})})
    with pytest.raises(ValueError, match="'metrics/n'.*outside the signed 64-bit range"):
        encode_reply(layout_of(big), FRAC, 3)
    # at the bound, sums are exact (no wrap)
    bound = (2**63 - 1) // 3
    edge = RecordDict({"arrays": ArrayRecord({"c": Array(np.array([bound, -bound], np.int64))})})
    total = sum(encode_reply(layout_of(edge), FRAC, 3) for _ in range(3))
    assert total.view(np.int64).tolist() == [3 * bound, -3 * bound]


def test_a_node_replying_out_of_range_is_left_out_by_name_and_the_rest_summed() -> None:
    calls: Counter[int] = Counter()
    grid = LocalGrid(4, {}, app=_grid_app(calls))
    bad = grid.app

    def app(msg, context):
        if int(context.node_id) == 1003:
            return _grid_app(big=2**63).__call__(msg, context)
        return bad(msg, context)

    grid.app = app
    out = _round(grid, KeyBook())
    assert "outside the signed 64-bit range" in out.failed[1003]
    assert out.survivors == [1000, 1001, 1002] and out.cost["secagg-sessions"] == 2
    v, count = _expected([1000, 1001, 1002])
    np.testing.assert_array_equal(out.content["arrays"]["v"].numpy(), v)
    assert all(calls[n] == 1 for n in out.survivors)  # the rerun used the kept replies


def test_a_dropout_reruns_the_session_from_kept_replies_with_fresh_secrets() -> None:
    """A node lost in collect: the session is rerun without it; the survivors' handlers ran
    once; the first session's vectors stay masked (its seeds were never revealed), and the
    rerun's masks differ from the first session's."""
    calls: Counter[int] = Counter()
    grid = LocalGrid(5, {}, app=_grid_app(calls))
    seen: list[Message] = []
    pull = grid.pull_messages

    def wiretap(ids):
        got = pull(ids)
        seen.extend(got)
        return got

    grid.pull_messages = wiretap

    def lose(msg: Message, reply: Message) -> Message:
        collected = not reply.has_error() and "secagg-vector" in reply.content
        if int(msg.metadata.dst_node_id) == 1004 and collected:
            return Message(Error(code=0, reason="lost"), reply_to=msg)
        return reply

    grid.tamper = lose
    out = _round(grid, KeyBook())
    assert out.cost["secagg-sessions"] == 2 and out.survivors == [1000, 1001, 1002, 1003]
    v, count = _expected(out.survivors)
    np.testing.assert_array_equal(out.content["arrays"]["v"].numpy(), v)
    assert out.content["metrics"]["count"] == count
    assert all(calls[n] == 1 for n in out.survivors) and calls[1004] == 1
    vectors: dict[int, list[np.ndarray]] = {}
    unmask_replies = 0
    for msg in seen:
        if msg.has_error():
            continue
        if "secagg-vector" in msg.content:
            vectors.setdefault(msg.metadata.src_node_id, []).append(
                msg.content["secagg-vector"]["masked"].numpy()
            )
        unmask_replies += "shares" in msg.content[SECAGG_RECORD]
    # only the rerun was unmasked: no share of the first session's seeds was ever sent
    assert unmask_replies == out.cost["secagg-unmask-nodes"] > 0
    for node in out.survivors:
        first, second = vectors[node]
        assert not np.array_equal(first, second)  # fresh masks
        truth = encode_reply(layout_of(_true_reply(node)), FRAC, 5)
        assert not np.array_equal(first - second, np.zeros_like(first))
        assert not np.array_equal(first, truth) and not np.array_equal(second, truth)


def test_a_node_that_lost_its_state_is_left_out_for_the_run_with_a_reason() -> None:
    grid = LocalGrid(4, {}, app=_grid_app())
    book = KeyBook()
    assert _round(grid, book, t=1).survivors == grid.node_ids
    grid.contexts[1002].state = RecordDict()  # e.g. a SuperNode restarted mid-run
    out = _round(grid, book, t=2)
    assert out.survivors == [1000, 1001, 1003] and "lost its protocol state" in book.lost[1002]
    out = _round(grid, book, t=3)  # not asked again (its new key would clash with pins)
    assert out.survivors == [1000, 1001, 1003] and "lost its protocol state" in out.failed[1002]


def test_secrets_are_fresh_per_session_and_never_travel() -> None:
    """Per session: a new self-mask seed (no two commitments alike, no seed opens another
    session's vector), pairwise masks labelled by the session (a session's seeds and the
    other sessions' masks do not open it); private and pairwise keys never leave a node."""
    fed = Federation(4)
    fed.setup()
    sessions = []
    for question in range(3):  # three rounds: three questions
        s = collect(fed, fed.nodes, question=question)
        for holder in fed.nodes:
            assert unmask(fed, s, holder)
        sessions.append(s)
    commitments = [c for s in sessions for c in s.commitments.values()]
    assert len(set(commitments)) == len(commitments)
    seeds = [seeds_of(s) for s in sessions]
    assert len({seed for per in seeds for seed in per.values()}) == 12
    node = fed.nodes[0]
    for a, b in itertools.permutations(range(3), 2):  # session a's seed on session b
        y = sessions[b].vectors[node] - mask_stream(seeds[a][node], 8, label=b"self|%d"
                                                    % sessions[a].session)  # fmt: skip
        assert not np.array_equal(y, fed.encoded(node, 4))
    pairs = fed.contexts[node].state[PAIRS_RECORD]
    secret = {bytes(v) for v in pairs.values()}
    secret.add(bytes(fed.contexts[node].state["secagg-keys"]["sk"]))
    for s in sessions:
        for v in s.vectors.values():
            assert not any(k in v.tobytes() for k in secret)
        for shares in s.revealed.values():
            assert not any(k in sh for sh in shares.values() for k in secret)


def test_cohort_mode_with_both_sampled_users_on_one_node_finishes() -> None:
    """K = 2 users on one node: idle nodes join with zero replies, the secure run selects
    the plain run's set (it failed with AllRepliesRejectedError before)."""
    import scipy.sparse as sp

    from flower_app.clients.adapter import numpy_client_app
    from flower_app.clients.cohorts import cohort_range
    from flower_app.clients.submodular import SubmodularClient
    from flower_app.submodular.matroids import UniformMatroid
    from flower_app.submodular.objectives import MaxRowObjective

    users, m, k = 12, 8, 2
    ratings = np.random.default_rng(3).integers(0, 6, size=(users, m)).astype(np.float64)

    def factory(context: Context) -> SubmodularClient:
        p, parts = context.node_config["partition-id"], context.node_config["num-partitions"]
        first, count = cohort_range(users, p, parts)
        rows = MaxRowObjective(sp.csr_matrix(ratings[first : first + count]))
        return SubmodularClient(rows, first, users, p, parts)

    def run(secure: SecureAggregation | None, seed: int):
        strategy = FedSMCohorts(users, UniformMatroid(m, k), k, FedSMParams("alg1", 2, 1.0),
                                seed=seed, secure_aggregation=secure)  # fmt: skip
        strategy.start(LocalGrid(3, {}, app=numpy_client_app(factory)), ArrayRecord(), k)
        return strategy, [r for r in strategy.history if r["server-round"] >= 1]

    plain, plain_rows = run(None, 0)
    assert [r["nodes"] for r in plain_rows] == [2, 1]  # round 2: both users on one node
    secure, rows = run(SecureAggregation(), 0)
    assert secure.run.selected == plain.run.selected
    assert all(r["secagg-nodes"] == 3 and r["users"] == 2 for r in rows)


def test_keys_endorsed_by_trusted_identities_refuse_substituted_and_invented_nodes(
    tmp_path,
) -> None:
    """With ``secagg-identity-key`` and ``secagg-trusted-keys`` in the node_config (set by
    the nodes' operators), a run key must be signed by a trusted identity for this run and
    node id: a substituted key, an invented node, a genuine key moved to another node id,
    or a request without endorsements are refused; an honest session runs as before."""
    from flwr.supercore.primitives.asymmetric import (
        generate_key_pairs,
        private_key_to_bytes,
        public_key_to_bytes,
        sign_message,
    )

    from flower_app.privacy.secagg_client import (
        IDENTITY_KEY,
        TRUSTED_KEYS,
        endorsement_message,
    )

    n = 5
    bundle = b""
    for i in range(n):
        sk, pk = generate_key_pairs()
        (tmp_path / f"node{i}.key").write_bytes(private_key_to_bytes(sk))
        bundle += public_key_to_bytes(pk)
    (tmp_path / "trusted.pem").write_bytes(bundle)

    def node_config(i: int) -> dict:
        return {IDENTITY_KEY: str(tmp_path / f"node{i}.key"),
                TRUSTED_KEYS: str(tmp_path / "trusted.pem")}  # fmt: skip

    fed = Federation(n, node_config)
    fed.setup()
    ident = {v: (fed.setup_replies[v]["identity"], fed.setup_replies[v]["endorsement"])
             for v in fed.nodes}  # fmt: skip
    assert {fed.setup_replies[v]["trust"] for v in fed.nodes} == {"endorsed"}
    tofu = Federation(3)
    tofu.setup()
    assert {tofu.setup_replies[v]["trust"] for v in tofu.nodes} == {"first-use"}

    def endorsed(s: Session, node: int, keys=None, ids=None) -> dict[str, Any]:
        keys = keys or {v: fed.keys[v] for v in s.ring[node]}
        ids = ids or ident
        return collect_stage(fed, s, node, keys=[keys[v] for v in s.ring[node]],
                             identities=[ids[v][0] for v in s.ring[node]],
                             endorsements=[ids[v][1] for v in s.ring[node]])  # fmt: skip

    k, t = SecureAggregation().plan(n)
    s = Session(fed.session + 1, fed.nodes, ring_neighbours(fed.nodes, k), t)
    a, b, c = fed.nodes[:3]
    # a request without endorsements
    refused(fed, a, collect_stage(fed, s, a), "trusts only endorsed keys", train=True)
    # B's run key replaced by one the server made (B's identity and signature kept)
    _, fake = generate_key_pairs()
    keys = {v: fed.keys[v] for v in fed.nodes} | {b: public_key_to_bytes(fake)}
    refused(fed, a, endorsed(s, a, keys=keys), "not endorsed by the identity", train=True)
    # an invented node: the server's own key, endorsed by the server's own identity
    server_id, server_pk = generate_key_pairs()
    message = endorsement_message(1, b, public_key_to_bytes(fake))
    ids = dict(ident) | {b: (public_key_to_bytes(server_pk), sign_message(server_id, message))}
    refused(fed, a, endorsed(s, a, keys=keys, ids=ids), "identity this node trusts",
            train=True)  # fmt: skip
    # genuine keys and endorsements moved to other node ids (B's as C's and C's as B's)
    keys = {v: fed.keys[v] for v in fed.nodes} | {c: fed.keys[b], b: fed.keys[c]}
    ids = dict(ident) | {c: ident[b], b: ident[c]}
    refused(fed, a, endorsed(s, a, keys=keys, ids=ids), "not endorsed by the identity",
            train=True)  # fmt: skip
    assert fed.calls[a] == 0
    # the honest session
    fed.session = s.session
    s.inbox = {v: [] for v in fed.nodes}
    for node in fed.nodes:
        rec = fed.call(node, endorsed(s, node), train=True)
        s.vectors[node] = rec["secagg-vector"]["masked"].numpy().copy()
        s.commitments[node] = bytes(rec[SECAGG_RECORD]["commitment"])
        for dst, ct in zip(rec[SECAGG_RECORD]["destinations"],
                           rec[SECAGG_RECORD]["ciphertexts"], strict=True):  # fmt: skip
            s.inbox[int(dst)].append((str(node), bytes(ct)))
    for node in fed.nodes:
        assert unmask(fed, s, node)
    assert set(seeds_of(s)) == set(fed.nodes)


def test_a_private_metric_announced_as_public_is_refused(tmp_path) -> None:
    """A lying server cannot have a node send a metric in the clear by calling it public:
    only problem sizes (num-elements, n-elements) and what the node's operator allows."""
    from flower_app.privacy.secagg_client import PUBLIC_METRICS

    fed = Federation(4)
    fed.setup()
    k, t = SecureAggregation().plan(4)
    s = Session(fed.session + 1, fed.nodes, ring_neighbours(fed.nodes, k), t)
    node = fed.nodes[0]
    refused(fed, node, collect_stage(fed, s, node, public=["count"]), "asked in the clear",
            train=True)  # fmt: skip
    assert fed.calls[node] == 0
    allowed = Federation(4, lambda i: {PUBLIC_METRICS: "count"})
    allowed.setup()
    first = allowed.nodes[0]
    reply = allowed.call(first, collect_stage(allowed, s, first, public=["count"]), train=True)
    assert dict(reply["secagg-public"]) == {"count": _true_reply(first)["metrics"]["count"]}
