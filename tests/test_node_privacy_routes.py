"""Each node keeps its own privacy: the harness plays a server that lies, repeats and pads.

Four routes a lying server took to a single node's reply, each tried at 3, 4, 5, 6, 8 and 16
nodes against the real node side (``secure_aggregation_mod`` in a real ClientApp, real
Contexts and Messages, in process), with the recovery routine of
``tests/test_secagg_malicious_server.py`` trying everything the server obtained:

1. *Sums of two*: a neighbourhood of two, an announced list padded with a node that never
   exists, a ring of the server's making that splits the session into small groups.
2. *Refusals that speak*: every refusal a node makes (every rule it refuses by) while its
   data holds distinctive values; no refusal text carries one of them.
3. *Averaging the noise away*: one question repeated as K = 400 sessions, with and without
   the target, under Gaussian DP noise from the node's OS entropy; the node's own budget.
4. *Differencing and keys*: the same question with and without the target, reruns opened
   after the fact, a relabelled round; with endorsed keys, invented, unmet and "restarted"
   node ids.
"""

from __future__ import annotations

import math
import re
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

from flower_app.privacy import SecureAggregation, secure_aggregation_mod
from flower_app.privacy.ledger import MAX_EPSILON, NODE_PRIVACY_RECORD, gaussian_release
from flower_app.privacy.refusals import RULES, NodeRefusedError, refusal_rule
from flower_app.privacy.secagg_client import SECAGG_RECORD
from flower_app.privacy.topology import ring_neighbours
from tests.test_secagg_malicious_server import (
    FRAC,
    Federation,
    Session,
    collect,
    collect_stage,
    recover,
    seeds_of,
    unmask,
)

ALL_SIZES = [3, 4, 5, 6, 8, 16]


def _flower_text(err: BaseException) -> str:
    """What Flower sends the server for an exception raised in a ClientApp."""
    return str(type(err)) + ":<'" + str(err) + "'>"


def _ring(nodes: list[int]) -> tuple[dict[int, list[int]], int]:
    k, t = SecureAggregation().plan(len(nodes))
    return ring_neighbours(nodes, k), t


# ----------------------------------------------------------------------- 1. sums of two
@pytest.mark.parametrize("n", ALL_SIZES)
def test_no_session_opens_a_sum_of_fewer_than_three_real_nodes(n: int) -> None:
    """A neighbourhood of two, a padded announced list, and a ring of the server's making
    (the target with one or two others as its whole neighbourhood): every lied-to node
    refuses before its handler runs, and nothing the server obtains gives a reply."""
    fed = Federation(n)
    fed.setup()
    target = fed.nodes[0]
    ring, t = _ring(fed.nodes)
    s = Session(fed.session + 1, fed.nodes, ring, t)
    other = fed.nodes[1]
    # a neighbourhood of two (threshold 2), with and without padding of the announced list
    pair = sorted([target, other])
    for announced in (fed.nodes, [*fed.nodes, 999_999_999]):
        stage = collect_stage(fed, s, target, neighbours=[str(v) for v in pair],
                              keys=[fed.keys[v] for v in pair], shares=2, threshold=2,
                              announced=[str(v) for v in announced])  # fmt: skip
        with pytest.raises(NodeRefusedError, match="a neighbourhood of 2 nodes"):
            fed.call(target, stage, train=True)
    # a ring of the server's making: the target, one other node and a padded id make a
    # "session" of three with everyone's neighbourhood the three of them
    padded = sorted([target, other, 999_999_999])
    stage = collect_stage(fed, s, target, neighbours=[str(v) for v in padded],
                          keys=[fed.keys[target], fed.keys[other], fed.keys[fed.nodes[-1]]],
                          shares=3, threshold=2,
                          announced=[str(v) for v in [*fed.nodes, 999_999_999]])  # fmt: skip
    with pytest.raises(NodeRefusedError, match="place in the ring"):
        fed.call(target, stage, train=True)
    # a ring split into groups of three inside the real announced set
    if n >= 6:
        group = fed.nodes[:3]
        for node in group:
            stage = collect_stage(fed, s, node, neighbours=[str(v) for v in group],
                                  keys=[fed.keys[v] for v in group], shares=3, threshold=2)
            if group != ring[node]:
                with pytest.raises(NodeRefusedError, match="place in the ring"):
                    fed.call(node, stage, train=True)
    assert fed.calls[target] == 0


@pytest.mark.parametrize("n", ALL_SIZES)
def test_a_padded_node_that_never_submits_leaves_the_session_unopenable(n: int) -> None:
    """The announced list padded with a node that does not exist (the server plays its
    key): its ring neighbours wait for its share and refuse to unmask, and since the ring is
    connected no set of the vectors the server holds sums free of pairwise masks."""
    fed = Federation(n)
    fed.setup()
    ghost = 10**12
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes

    _, pk = generate_key_pairs()
    fed.keys[ghost] = public_key_to_bytes(pk)
    announced = [*fed.nodes, ghost]
    ring, t = _ring(announced)
    s = Session(fed.session + 1, announced, ring, t)
    s.inbox = {v: [] for v in announced}
    for node in fed.nodes:  # the real nodes answer; the ghost never does
        rec = fed.call(node, collect_stage(fed, s, node), train=True)
        s.vectors[node] = rec["secagg-vector"]["masked"].numpy().copy()
        s.commitments[node] = bytes(rec[SECAGG_RECORD]["commitment"])
        for dst, ct in zip(rec[SECAGG_RECORD]["destinations"],
                           rec[SECAGG_RECORD]["ciphertexts"], strict=True):  # fmt: skip
            s.inbox[int(dst)].append((str(node), bytes(ct)))
    for node in fed.nodes:
        answered = unmask(fed, s, node)
        assert answered == (ghost not in ring[node])
    s.nodes = fed.nodes  # what the recovery may sum over: the vectors it holds
    assert not any(recover(fed, [s], node) for node in fed.nodes)
    # the sum over the real nodes stays masked by the ghost's pairwise masks
    seeds = seeds_of(s)
    if set(seeds) == set(fed.nodes):
        total = sum((s.vectors[v] for v in fed.nodes), np.zeros(8, np.uint64))
        assert not np.array_equal(total, sum(fed.encoded(v, n + 1) for v in fed.nodes))


# ----------------------------------------------------------------------- 2. refusals
PRIVATE = {
    "real": 734_567_891_234.5678,  # beyond ±2^63 / (n · 2^24) for every n here
    "int": 2**63 + 4_242_424_242,
    "int-n": (2**63 - 1) // 3 + 777_777,
    "loss": 0.6306178,
    "row": 987_654,
}


def _private_texts(value: Any) -> list[str]:
    """The ways a private number could show up in a text (digits of its leading part)."""
    out = {repr(value), str(value), f"{value:.4g}", f"{value:g}"}
    if isinstance(value, float):
        digits = re.sub(r"\D", "", f"{value:.6e}")[:5]
        out.add(digits)
    return [t for t in out if len(t) >= 3]


class _Leaky(Federation):
    """Nodes whose handler returns, per question, a reply built to break one rule."""

    def __init__(self, n: int, node_config: Any = None) -> None:
        super().__init__(n, node_config)
        self.app = ClientApp(mods=[secure_aggregation_mod])

        @self.app.train()
        def train(msg: Message, context: Context) -> Message:
            how = str(msg.content["config"]["leak"])
            nid = int(context.node_id)
            self.calls[nid] += 1
            if how == "raise":
                raise ValueError(f"loss {PRIVATE['loss']} too high for user 17")
            if how == "error-reply":  # e.g. a mod after the privacy mod answering an error
                return Message(Error(code=3, reason=f"loss {PRIVATE['loss']}"), reply_to=msg)
            metrics: dict[str, Any] = {"count": 1}
            arrays = {"v": Array(np.zeros(3))}
            if how == "real":
                arrays = {"v": Array(np.array([PRIVATE["real"], 0.0, 1.0]))}
            elif how == "int":
                arrays = {"v": Array(np.array([PRIVATE["int"]], dtype=np.uint64))}
            elif how == "int-n":
                arrays = {"v": Array(np.array([PRIVATE["int-n"]], dtype=np.int64))}
            elif how == "nan":
                arrays = {"v": Array(np.array([math.nan, PRIVATE["loss"]]))}
            elif how == "loss":
                metrics = {"train-loss": math.nan, "rho": PRIVATE["loss"], "num-examples": 3}
                arrays = {"w": Array(np.ones(3))}
            elif how == "rows":
                arrays = {"emb.rows": Array(np.array([0, PRIVATE["row"]], dtype=np.int64))}
                metrics = {"num-examples": 5}
            elif how == "config":
                return Message(RecordDict({"c": ConfigRecord({"x": PRIVATE["loss"]})}),
                               reply_to=msg)  # fmt: skip
            elif how == "dp":
                metrics.update(gaussian_release([nid], 0.1, 1000).metrics())
            content = RecordDict({"arrays": ArrayRecord(arrays), "metrics": MetricRecord(metrics)})
            return Message(content, reply_to=msg)

    def ask(self, node: int, stage: dict[str, Any], leak: str, question: int) -> RecordDict:
        content = RecordDict({SECAGG_RECORD: ConfigRecord(stage)})
        content["config"] = ConfigRecord({"server-round": 1, "leak": leak, "question": question})
        if leak in ("loss",):
            content["arrays"] = ArrayRecord({"w": Array(np.zeros(3))})
        if leak == "rows":
            content["arrays"] = ArrayRecord({"emb": Array(np.zeros((1000, 2)))})
        msg = Message(content, dst_node_id=node, message_type="train")
        return self.app(msg, self.contexts[node]).content


def test_no_refusal_a_node_makes_carries_a_private_value(tmp_path) -> None:
    """Every rule a node refuses by, triggered while the node's data holds distinctive
    values (a loss, a large real, an out-of-range integer, a row id, a handler's own error
    text): the text Flower would send the server names the rule and public parameters, and
    none of those values. The enumeration covers every rule of ``RULES``."""
    fed = _Leaky(4, lambda i: {MAX_EPSILON: 1.0})
    fed.setup()
    ring, t = _ring(fed.nodes)
    seen: dict[str, list[str]] = {rule: [] for rule in RULES}
    question = 0

    def attempt(node: int, leak: str, **override: Any) -> int:
        nonlocal question
        question += 1
        fed.session += 1
        s = Session(fed.session, fed.nodes, ring, t)
        with pytest.raises(NodeRefusedError) as info:
            fed.ask(node, collect_stage(fed, s, node, **override), leak, question)
        text = _flower_text(info.value)
        rule = refusal_rule(text)
        assert rule is not None, text
        seen[rule].append(text)
        return question

    node = fed.nodes[0]
    attempt(node, "real")  # encoding: too large for the session's range
    attempt(node, "int")  # encoding: outside int64
    attempt(node, "int-n")  # encoding: too large to sum n nodes
    attempt(node, "nan")  # encoding: non-finite
    attempt(node, "config")  # encoding: a ConfigRecord cannot be summed
    attempt(node, "loss", transform="maxfl-weighted-delta", **{"transform-loss-key": "train-loss",
            "transform-rho-key": "rho"})  # fmt: skip
    attempt(node, "rows", transform="fedsubavg-heat", **{"transform-rows-emb": 1000})
    raised = attempt(node, "raise")  # computation: the handler's error, with a private value
    attempt(node, "dp")  # privacy-budget: ε of σ/√K = 0.1/√1000 passes the budget of 1
    attempt(node, "plain", shares=2, threshold=2)  # protocol
    attempt(node, "plain", **{"frac-bits": 52})  # protocol: a range a server could move
    # asked-before: the refused question asked again in a new session
    fed.session += 1
    s = Session(fed.session, fed.nodes, ring, t)
    with pytest.raises(NodeRefusedError) as info:
        fed.ask(node, collect_stage(fed, s, node), "raise", raised)
    seen["asked-before"].append(_flower_text(info.value))
    # an error reply (not an exception) of the handler or a later mod: its reason replaced
    question += 1
    fed.session += 1
    s = Session(fed.session, fed.nodes, ring, t)
    msg = Message(RecordDict({SECAGG_RECORD: ConfigRecord(collect_stage(fed, s, node)),
                              "config": ConfigRecord({"server-round": 1, "leak": "error-reply",
                                                      "question": question})}),
                  dst_node_id=node, message_type="train")  # fmt: skip
    reply = fed.app(msg, fed.contexts[node])
    assert reply.has_error() and int(reply.error.code) == 3
    seen["computation"].append(str(reply.error.reason))
    assert all(seen[rule] for rule in RULES), {r: len(v) for r, v in seen.items()}
    for rule, texts in seen.items():
        for text in texts:
            for value in PRIVATE.values():
                for leak in _private_texts(value):
                    assert leak not in text, (rule, leak, text)
            assert "nan" not in text.lower().replace("finite", ""), text


# ----------------------------------------------------------------------- 3. averaging
SIGMA, DIM = 1.0, 4000


class _Noisy(Federation):
    """Nodes whose reply is a private vector plus Gaussian noise of std SIGMA per value,
    drawn from OS entropy on every handler run, declared to the node's ledger."""

    def __init__(self, n: int, node_config: Any = None) -> None:
        super().__init__(n, node_config)
        self.app = ClientApp(mods=[secure_aggregation_mod])
        self.truth = {v: np.random.default_rng(v).integers(-4, 5, DIM) / 4.0 for v in self.nodes}

        self.answers: dict[int, list[np.ndarray]] = {v: [] for v in self.nodes}

        @self.app.train()
        def train(msg: Message, context: Context) -> Message:
            nid = int(context.node_id)
            self.calls[nid] += 1
            noisy = self.truth[nid] + np.random.default_rng().normal(0.0, SIGMA, DIM)
            self.answers[nid].append(noisy)  # what a colluding node could hand over
            release = gaussian_release([0], 2.0, 4)  # a share of noise multiplier σ/√K = 1
            metrics = MetricRecord({"count": 1, **release.metrics()})
            return Message(RecordDict({"arrays": ArrayRecord({"v": Array(noisy)}),
                                       "metrics": metrics}), reply_to=msg)  # fmt: skip

    def encoded(self, node: int, n: int) -> np.ndarray:  # the truth is not a fixed encoding
        raise NotImplementedError


def _open(fed: _Noisy, nodes: list[int], question: int) -> tuple[dict[int, np.ndarray], bool]:
    """Collect ``question`` from ``nodes`` and unmask; return the decoded sum's vector."""
    ring, t = _ring(nodes)
    fed.session += 1
    s = Session(fed.session, list(nodes), ring, t)
    s.inbox = {v: [] for v in nodes}
    for node in nodes:
        try:
            rec = fed.call(node, collect_stage(fed, s, node), train=True, question=question)
        except NodeRefusedError:
            return {}, False
        s.vectors[node] = rec["secagg-vector"]["masked"].numpy().copy()
        s.commitments[node] = bytes(rec[SECAGG_RECORD]["commitment"])
        for dst, ct in zip(rec[SECAGG_RECORD]["destinations"],
                           rec[SECAGG_RECORD]["ciphertexts"], strict=True):  # fmt: skip
            s.inbox[int(dst)].append((str(node), bytes(ct)))
    for node in nodes:
        unmask(fed, s, node)
    seeds = seeds_of(s)
    if set(seeds) != set(nodes):
        return {}, False
    from flower_app.privacy.fixed_point import mask_stream

    size = next(iter(s.vectors.values())).size
    total = np.zeros(size, np.uint64)
    for node in nodes:
        total += s.vectors[node] - mask_stream(seeds[node], size, label=b"self|%d" % s.session)
    values = total.view(np.int64)[:DIM].astype(np.float64) / 2**FRAC
    return {0: values}, True


@pytest.mark.parametrize("n", ALL_SIZES)
def test_repeating_a_question_400_times_leaves_one_release_of_noise(n: int) -> None:
    """The server asks one question in K = 400 sessions, alternately with and without the
    target X, and averages (sum with X) - (sum without X). Each node answers a question
    once: after the first unmasked sum every repeat is refused, so the best estimate of X's
    reply the server has — given the true replies of every other node, as if all of them
    colluded — carries the noise of one release: std >= 0.9 sigma."""
    fed = _Noisy(n)
    fed.setup()
    target, others = fed.nodes[0], fed.nodes[1:]
    estimates: list[np.ndarray] = []
    refusals = 0
    for k in range(400):
        nodes = fed.nodes if k % 2 == 0 else others
        if len(nodes) < 3:
            nodes = fed.nodes
        got, opened = _open(fed, nodes, question=7)
        if not opened:
            refusals += 1
            continue
        if target in nodes:  # every other node colludes: it hands over its noisy answer
            estimates.append(got[0] - sum(fed.answers[v][-1] for v in nodes if v != target))
    assert len(estimates) <= 1 and refusals >= 399
    assert fed.calls[target] == 1  # one draw of noise, whatever was asked
    assert estimates, "the first session opens: one release"
    error = np.mean(estimates, axis=0) - fed.truth[target]
    assert 0.9 * SIGMA <= error.std() <= 1.1 * SIGMA  # one release (averaging: σ/√200)


@pytest.mark.parametrize("n", [3, 8])
def test_a_rerun_answers_from_the_kept_answer_with_the_same_noise(n: int) -> None:
    """Before any unmask, reruns of the question (nodes left out) are answered from the
    kept answer: the handler, and so the noise, runs once; a rerun that adds a node, or
    changes the encoding, is refused."""
    fed = _Noisy(n)
    fed.setup()
    first = collect(fed, fed.nodes, question=3)
    assert first.vectors and all(fed.calls[v] == 1 for v in fed.nodes)
    smaller = fed.nodes[:-1] if n > 3 else fed.nodes
    again = collect(fed, smaller, question=3)
    assert all(fed.calls[v] == 1 for v in fed.nodes) and again.vectors
    ring, t = _ring(fed.nodes)
    s = Session(fed.session + 1, fed.nodes, ring, t)
    node = fed.nodes[0]
    if n > 3:  # the left-out node back in: not a subset of the last session
        with pytest.raises(NodeRefusedError, match="asked-before"):
            fed.call(node, collect_stage(fed, s, node), train=True, question=3)
    fed2 = _Noisy(n)
    fed2.setup()
    collect(fed2, fed2.nodes, question=3)
    ring2, t2 = _ring(fed2.nodes)
    s2 = Session(fed2.session + 1, fed2.nodes, ring2, t2)
    with pytest.raises(NodeRefusedError, match="asked-before"):
        fed2.call(fed2.nodes[0], collect_stage(fed2, s2, fed2.nodes[0], **{"frac-bits": 20}),
                  train=True, question=3)  # fmt: skip


def test_a_node_refuses_past_its_own_budget_and_reports_its_own_figure() -> None:
    """``dp-max-epsilon`` in the node_config (the operator's, not the server's): the node
    charges each new question's release (its own share, noise multiplier σ/√K = 1) to its
    ledger, reports its figure in the clear ``node-privacy`` record, and refuses the first
    question that would take its user past the budget (rule ``privacy-budget``)."""
    from flower_app.algorithms.common.gaussian_dp import server_epsilon

    budget = server_epsilon(3.0, 1e-5) * (1 + 1e-9)  # three releases fit, a fourth does not
    fed = _Noisy(3, lambda i: {MAX_EPSILON: budget})
    fed.setup()
    ring, t = _ring(fed.nodes)
    node = fed.nodes[0]
    for question in range(3):
        fed.session += 1
        s = Session(fed.session, fed.nodes, ring, t)
        reply = fed.call(node, collect_stage(fed, s, node), train=True, question=question)
        figures = dict(reply[NODE_PRIVACY_RECORD])
        assert figures["dp-releases"] == question + 1
        assert figures["dp-epsilon"] == pytest.approx(server_epsilon(question + 1.0, 1e-5))
        assert figures["dp-max-epsilon"] == pytest.approx(budget)
    fed.session += 1
    s = Session(fed.session, fed.nodes, ring, t)
    with pytest.raises(NodeRefusedError, match=r"\[privacy-budget\]") as info:
        fed.call(node, collect_stage(fed, s, node), train=True, question=3)
    assert refusal_rule(_flower_text(info.value)) == "privacy-budget"
    assert fed.calls[node] == 4  # computed, then dropped: nothing of it was sent
    with pytest.raises(NodeRefusedError, match="asked-before"):  # and not asked again
        fed.session += 1
        s = Session(fed.session, fed.nodes, ring, t)
        fed.call(node, collect_stage(fed, s, node), train=True, question=3)


# ----------------------------------------------------------------------- 4. differencing
class _PerQuestion(Federation):
    """Nodes whose answer depends on the question, as every family's does (the model, S
    or x it is asked about): ``reply(node, question)``."""

    def __init__(self, n: int, node_config: Any = None) -> None:
        super().__init__(n, node_config)
        self.app = ClientApp(mods=[secure_aggregation_mod])

        @self.app.train()
        def train(msg: Message, context: Context) -> Message:
            nid = int(context.node_id)
            self.calls[nid] += 1
            q = int(msg.content["config"]["question"])
            return Message(RecordDict({"arrays": ArrayRecord({"v": Array(self.reply(nid, q))})}),
                           reply_to=msg)  # fmt: skip

    @staticmethod
    def reply(node: int, question: int) -> np.ndarray:
        return np.random.default_rng([node, question]).integers(-1000, 1000, 6) / 2**10


def _questioned(fed: _PerQuestion, nodes: list[int], question: int) -> Session:
    s = collect(fed, nodes, question=question)
    s.cache["question"] = question
    return s


def _recovers(fed: _PerQuestion, sessions: list[Session], target: int) -> bool:
    """Every way the harness knows to get ``target``'s answer to one of the sessions'
    questions: its vector minus the masks the server can remove, the sums of sessions
    whose seeds are all known, and every difference of two such sums."""
    from flower_app.privacy.fixed_point import mask_stream

    sums, candidates = [], []
    for s in sessions:
        seeds = seeds_of(s)
        clean = {}
        for node, y in s.vectors.items():
            clean[node] = y - mask_stream(seeds[node], y.size, label=b"self|%d" % s.session) \
                if node in seeds else y.copy()
        if target in clean:
            candidates.append(clean[target])
        if s.vectors and all(node in seeds for node in s.vectors):
            sums.append(sum(clean.values(), np.zeros_like(next(iter(clean.values())))))
    candidates += sums + [a - b for a in sums for b in sums]
    truths = [(fed.reply(target, int(s.cache["question"])) * 2**FRAC).astype(np.int64)
              .view(np.uint64) for s in sessions]  # fmt: skip
    return any(np.array_equal(c, t) for c in candidates for t in truths)


@pytest.mark.parametrize("n", ALL_SIZES)
def test_the_same_question_with_and_without_a_node_gives_no_reply(n: int) -> None:
    """Without DP. A question unmasked over every node, then asked again without X: every
    node refuses. A question collected from every node, rerun without X and unmasked, then
    the first session's unmask asked of everyone: only X answers (the others moved on), so
    the first session's sum cannot be opened. No reply is recovered from all of it."""
    fed = _PerQuestion(n)
    fed.setup()
    target, rest = fed.nodes[0], fed.nodes[1:]
    s1 = _questioned(fed, fed.nodes, 5)
    for node in fed.nodes:
        assert unmask(fed, s1, node)
    sessions = [s1]
    if len(rest) >= 3:
        ring, t = _ring(rest)
        s2 = Session(fed.session + 1, rest, ring, t)
        fed.session = s2.session
        for node in rest:
            with pytest.raises(NodeRefusedError, match="asked-before"):
                fed.call(node, collect_stage(fed, s2, node), train=True, question=5)
        s3 = _questioned(fed, fed.nodes, 6)
        s4 = _questioned(fed, rest, 6)  # the rerun without X
        for node in rest:
            assert unmask(fed, s4, node)
        assert unmask(fed, s3, target)  # X's last session is s3: it answers
        assert not any(unmask(fed, s3, node) for node in rest)
        sessions += [s3, s4]
    assert not any(_recovers(fed, sessions, node) for node in fed.nodes)
    # the baseline: with the sums of both sessions of question 6, X's answer would follow
    if len(rest) >= 3:
        assert not all(node in seeds_of(s3) for node in fed.nodes)


@pytest.mark.parametrize("n", ALL_SIZES)
def test_a_relabelled_round_is_the_same_question(n: int) -> None:
    """The same content under another round number (and another session) is the same
    question: refused once answered, so no second sum with the same answer exists."""
    fed = _PerQuestion(n)
    fed.setup()
    s1 = _questioned(fed, fed.nodes, 8)
    for node in fed.nodes:
        assert unmask(fed, s1, node)
    ring, t = _ring(fed.nodes)
    s2 = Session(fed.session + 1, fed.nodes, ring, t)
    node = fed.nodes[0]
    content = RecordDict({SECAGG_RECORD: ConfigRecord(collect_stage(fed, s2, node))})
    content["config"] = ConfigRecord({"server-round": 99, "question": 8})
    msg = Message(content, dst_node_id=node, message_type="train")
    with pytest.raises(NodeRefusedError, match="asked-before"):
        fed.app(msg, fed.contexts[node])
    assert fed.calls[node] == 1


@pytest.mark.parametrize("n", ALL_SIZES)
def test_with_endorsed_keys_invented_unmet_and_restarted_ids_are_refused(n: int, tmp_path) -> None:
    """Trust on first use off (every node trusts only keys endorsed by the federation's
    identities). The server invents a node (its own key and identity) as X's ring
    neighbour, substitutes its own key for a real neighbour X never met, and claims a
    neighbour restarted with a new key: X refuses each before its handler runs."""
    from flwr.supercore.primitives.asymmetric import (
        generate_key_pairs,
        private_key_to_bytes,
        public_key_to_bytes,
        sign_message,
    )

    from flower_app.privacy.secagg_client import IDENTITY_KEY, TRUSTED_KEYS, endorsement_message

    bundle = b""
    for i in range(n):
        sk, pk = generate_key_pairs()
        (tmp_path / f"node{i}.key").write_bytes(private_key_to_bytes(sk))
        bundle += public_key_to_bytes(pk)
    (tmp_path / "trusted.pem").write_bytes(bundle)
    fed = _PerQuestion(n, lambda i: {IDENTITY_KEY: str(tmp_path / f"node{i}.key"),
                                     TRUSTED_KEYS: str(tmp_path / "trusted.pem")})  # fmt: skip
    fed.setup()
    ident = {v: (fed.setup_replies[v]["identity"], fed.setup_replies[v]["endorsement"])
             for v in fed.nodes}  # fmt: skip
    ghost = 10**12
    target = next(v for v in _ring([*fed.nodes, ghost])[0][ghost] if v != ghost)

    def stage(nodes: list[int], keys: dict, ids: dict) -> dict[str, Any]:
        for v, key in keys.items():
            fed.keys.setdefault(v, key)
        ring, t = _ring(nodes)
        s = Session(fed.session + 1, nodes, ring, t)
        return collect_stage(fed, s, target, keys=[keys[v] for v in ring[target]],
                             identities=[ids[v][0] for v in ring[target]],
                             endorsements=[ids[v][1] for v in ring[target]])  # fmt: skip

    server_identity, server_identity_pk = generate_key_pairs()
    _, fake = generate_key_pairs()
    fake_pem = public_key_to_bytes(fake)
    # an invented node, announced with the real ones as the target's ring neighbour: the
    # server's key, endorsed by the server's own identity
    nodes = [*fed.nodes, ghost]
    keys = {v: fed.keys[v] for v in fed.nodes} | {ghost: fake_pem}
    ids = dict(ident) | {ghost: (public_key_to_bytes(server_identity_pk),
                                 sign_message(server_identity,
                                              endorsement_message(1, ghost, fake_pem)))}
    with pytest.raises(NodeRefusedError, match="not endorsed by an identity this node"):
        fed.call(target, stage(nodes, keys, ids), train=True)
    # a real neighbour the target never met, its key replaced (its identity's signature
    # kept, which signs another key)
    neighbour = next(v for v in _ring(fed.nodes)[0][target] if v != target)
    keys = {v: fed.keys[v] for v in fed.nodes} | {neighbour: fake_pem}
    with pytest.raises(NodeRefusedError, match="not endorsed by the identity given"):
        fed.call(target, stage(fed.nodes, keys, ident), train=True)
    # the same neighbour "restarted": a new key endorsed by the server's identity
    ids = dict(ident) | {neighbour: (public_key_to_bytes(server_identity_pk),
                                     sign_message(server_identity,
                                                  endorsement_message(1, neighbour, fake_pem)))}
    with pytest.raises(NodeRefusedError, match="not endorsed by an identity this node"):
        fed.call(target, stage(fed.nodes, keys, ids), train=True)
    assert fed.calls[target] == 0


# ----------------------------------------------------------------------- the whole run
def test_a_flower_run_reports_the_nodes_own_epsilon_and_the_node_that_stopped(tmp_path) -> None:
    """MaxFL with client-level DP under secure aggregation on 5 in-process nodes (the real
    ClientApp and runner). Each node's ledger charges its users' own shares and reports its
    figure; the rows' ``dp-epsilon`` is the nodes' figure (the same rule the server's
    accountant applies), and node 1's operator set a budget below one release: it refuses
    every private question, and the run records it as stopped by its privacy budget."""
    import json

    from flower_app.algorithms.common.gaussian_dp import server_epsilon
    from flower_app.config import AppConfig
    from flower_app.runners import maxfl as maxfl_runner
    from tests.support.local_grid import LocalGrid

    cfg = {"algorithm": "maxfl", "dataset": "synthetic-emnist", "num-users": 10,
           "maxfl-unseen-users": 0, "clients-per-round": 8, "maxfl-rounds": 3,
           "maxfl-eval-every": 3, "maxfl-participation": "all", "maxfl-solo-steps": 5,
           "maxfl-local-steps": 3, "seed": 5, "secure-aggregation": True,
           "maxfl-dp-noise": 0.8, "maxfl-dp-clip": 0.5,
           "output-dir": str(tmp_path), "run-name": "budget"}  # fmt: skip

    def node_config(i: int) -> dict:
        base = {"partition-id": i, "num-partitions": 5}
        return {**base, MAX_EPSILON: 1e-3} if i == 1 else base

    grid = LocalGrid(5, cfg, node_config=node_config)
    stopped = grid.node_ids[1]
    maxfl_runner.server_run(grid, AppConfig.from_run_config(cfg))
    folder = tmp_path / "budget"
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["server-round"] >= 1]
    summary = json.loads((folder / "summary.json").read_text())
    assert any(r.get("dp-budget-stopped") == [stopped] for r in rows)
    assert summary["failures"]["nodes-refused"] == {str(stopped): "privacy-budget"}
    per_round = 8 / 0.8**2  # K/σ²: one release of a client's own share
    for r in rows:
        assert r["dp-epsilon-nodes"] == pytest.approx(r["dp-epsilon"], rel=1e-9)
        assert r["dp-epsilon"] > r["dp-epsilon-honest-peers"]
        assert r["dp-epsilon"] == pytest.approx(
            server_epsilon(r["dp-rounds-worst-client"] * per_round, 1e-5), rel=1e-9)
    assert summary["privacy"]["epsilon-against-server"] == rows[-1]["dp-epsilon"]
    ledger = grid.contexts[stopped].state.get("dp-ledger")
    assert ledger is None or int(ledger["releases"]) == 0  # nothing of its users released


def test_a_ledger_file_keeps_one_budget_across_runs_and_refuses_a_changed_file(tmp_path) -> None:
    """With ``dp-ledger`` in the node_config the ledger lives on the node's disk: a second
    run (a new Context) starts from the first run's charges, so a server cannot reset a
    node's budget by starting a new run; a file not as the node wrote it is refused."""
    from flower_app.algorithms.common.gaussian_dp import server_epsilon
    from flower_app.privacy.ledger import LEDGER_FILE, PrivacyLedger

    path = tmp_path / "ledger.json"
    budget = server_epsilon(2.0, 1e-5) * (1 + 1e-9)
    config = {MAX_EPSILON: budget, LEDGER_FILE: str(path)}

    def context() -> Context:
        return Context(run_id=1, node_id=7, node_config=dict(config), state=RecordDict(),
                       run_config={})  # fmt: skip

    release = gaussian_release([3], 2.0, 4)  # noise multiplier 1: precision 1 per release
    PrivacyLedger(context()).charge(release)  # run 1
    second = PrivacyLedger(context())  # run 2: a new Context, the same file
    assert second.releases == 1 and second.worst() == pytest.approx(server_epsilon(1.0, 1e-5))
    second.charge(release)
    with pytest.raises(NodeRefusedError, match=r"\[privacy-budget\]"):
        PrivacyLedger(context()).charge(release)  # run 3: the third release passes the budget
    assert PrivacyLedger(context()).releases == 2
    path.write_text(path.read_text().replace('"releases": 2', '"releases": -1'))
    with pytest.raises(NodeRefusedError, match="ledger file"):
        PrivacyLedger(context())
