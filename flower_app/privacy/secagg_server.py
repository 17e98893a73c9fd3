"""The server's side of secure aggregation: one round's replies, summed unseen.

:func:`secure_sum` replaces "send the round's train messages, receive every reply" by the
four SecAgg+ stages (see :mod:`flower_app.privacy.secagg_client` for the messages):

1. ``setup``: each sampled node makes two key pairs and sends the public keys.
2. ``share-keys``: each node gets its neighbours' public keys (a ring of ``shares`` nodes,
   shuffled by a generator seeded from the strategy's seed and the round), Shamir-shares
   its private mask seed and its first private key among them, and sends each share
   encrypted to its owner (the server relays ciphertexts it cannot read).
3. ``collect``: each node gets the round's own train request and the shares meant for it,
   runs its handler, and returns its reply encoded in Z/2^64 plus its private mask plus
   ± the masks it shares with each neighbour. The server sees only masked vectors.
4. ``unmask``: the nodes still there send, for every neighbour, the share of its private
   seed (if the neighbour's vector arrived) or of its private key (if it dropped out
   after sharing); with ``threshold`` shares the server rebuilds each secret, removes
   every private mask and the pairwise masks of the dropped nodes, and decodes the sum.

Dropouts: a node that fails before ``collect`` is left out of the round like a failed
node in a plain round; one that fails after sharing its keys is removed from the sum
through its neighbours' shares; the round fails only if some secret has fewer than
``threshold`` shares left. A node whose reply has another layout than the others' is
treated as dropped (its vector cannot be added), and counted as a bad reply.

What the server learns: the sum of the survivors' replies (every array and every metric
except the ``public`` ones, which the strategy names: values that must agree, such as
FedSM's ``num-elements``), the layout (record names, keys, shapes), who took part, and
message sizes. Security model: honest-but-curious server and up to ``threshold − 1``
colluding nodes per neighbourhood, as in Flower's SecAgg+ (no signatures: a server that
lies about dropouts is out of this model).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.supercore.primitives.asymmetric import bytes_to_public_key

from flower_app.privacy.fixed_point import Entry, decode_sum, mask_stream
from flower_app.privacy.secagg_client import SECAGG_RECORD

__all__ = ["SecureAggregation", "SecureSum", "secure_sum"]

SendFn = Callable[[list[Message]], list[Message]]


@dataclass(frozen=True)
class SecureAggregation:
    """Settings of secure aggregation (SecAgg+ on Flower's primitives).

    Parameters
    ----------
    num_shares : int or float, optional
        Neighbours each node shares its secrets with, itself included: a count, a
        fraction of the round's nodes (1.0: every node, i.e. SecAgg), or None (default:
        2⌈log₂ n⌉ + 1, SecAgg+'s O(log n) neighbourhood; every node up to n = 9). Rounded
        up to an odd number when below the node count.
    reconstruction_threshold : int or float, optional
        Shares needed to rebuild a secret: a count, or a fraction of ``num_shares``
        (default 0.5; at least 2). Up to ``num_shares − threshold`` neighbours of a node
        may drop out; ``threshold − 1`` colluding neighbours learn nothing.
    frac_bits : int, optional
        Fractional bits of the fixed-point encoding of real values (default 24: each
        client's value is off by at most 2^-25, a sum over n clients by n·2^-25).
    min_nodes : int, optional
        Fewest nodes a secure round may have (default 2: a "sum" of one node is its reply).
    """

    num_shares: int | float | None = None
    reconstruction_threshold: int | float = 0.5
    frac_bits: int = 24
    min_nodes: int = 2

    def __post_init__(self) -> None:
        if not 0 <= int(self.frac_bits) <= 52:
            raise ValueError(f"frac_bits={self.frac_bits}: expected 0..52")
        for name in ("num_shares", "reconstruction_threshold"):
            value = getattr(self, name)
            if value is None and name == "num_shares":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name}={value!r}: expected a positive count or fraction")
            if isinstance(value, float) and value > 1.0:
                raise ValueError(f"{name}={value!r}: a fraction must be in (0, 1]")
        if int(self.min_nodes) < 2:
            raise ValueError(f"min_nodes={self.min_nodes}: secure aggregation needs >= 2 nodes")

    def plan(self, nodes: int) -> tuple[int, int]:
        """Return (shares, threshold) for a round of ``nodes`` nodes."""
        shares = self.num_shares
        if shares is None:
            count = 2 * math.ceil(math.log2(max(nodes, 2))) + 1
        elif isinstance(shares, float):
            count = math.ceil(shares * nodes)
        else:
            count = int(shares)
        count = max(min(count, nodes), min(nodes, 3))
        if count < nodes and count % 2 == 0:
            count += 1
        thr = self.reconstruction_threshold
        threshold = math.ceil(thr * count) if isinstance(thr, float) else int(thr)
        threshold = min(max(threshold, 2), count)
        return count, threshold

    def as_config(self) -> dict[str, Any]:
        """Return the settings as run_config-style entries (for ``config.json``)."""
        return {
            "secure-aggregation": True,
            "secagg-num-shares": 0 if self.num_shares is None else self.num_shares,
            "secagg-reconstruction-threshold": self.reconstruction_threshold,
            "secagg-frac-bits": int(self.frac_bits),
        }


@dataclass
class SecureSum:
    """One round's outcome of :func:`secure_sum`.

    Attributes
    ----------
    content : RecordDict or None
        The summed reply (arrays as float64/int64, metrics, the public metrics), or None
        if no node's vector could be summed.
    survivors : list of int
        Nodes whose replies are in the sum.
    failed : dict of int to str
        Nodes left out, with the reason (the stage where they failed).
    bad : int
        Of ``failed``, nodes that answered but were rejected (error reply, other layout).
    template : Message or None
        A collect request of a survivor (to build the summed reply as a reply to it).
    cost : dict
        ``secagg-messages``, ``secagg-bytes-up``, ``secagg-bytes-down`` (all stages),
        ``secagg-bytes-up-max-node`` (the most one node sent, all stages),
        ``secagg-setup-time`` (stages 1–2), ``secagg-unmask-time`` (stage 4).
    """

    content: RecordDict | None = None
    survivors: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    bad: int = 0
    template: Message | None = None
    cost: dict[str, Any] = field(default_factory=dict)


def _stage_message(base: Message, node: int, stage: dict[str, Any]) -> Message:
    return Message(
        RecordDict({SECAGG_RECORD: ConfigRecord(stage)}),
        dst_node_id=node,
        message_type=base.metadata.message_type,
        group_id=base.metadata.group_id,
    )


def _bytes(content: RecordDict) -> int:
    total = 0
    for rec in content.array_records.values():
        total += rec.count_bytes()
    for rec in content.metric_records.values():
        total += rec.count_bytes()
    for rec in content.config_records.values():
        # not ConfigRecord.count_bytes(): it fails on an empty list (flwr 1.42)
        for key, value in rec.items():
            total += len(key)
            for v in value if isinstance(value, list) else [value]:
                total += len(v) if isinstance(v, bytes | str) else 8
    return int(total)


class _Exchange:
    """Sends one stage, sorts replies into answered and failed, counts the cost."""

    def __init__(self, send: SendFn, out: SecureSum) -> None:
        self.send, self.out = send, out
        self.messages = self.up = self.down = 0
        self.node_up: dict[int, int] = {}

    def __call__(self, stage: str, messages: list[Message]) -> dict[int, RecordDict]:
        self.messages += 2 * len(messages)
        self.down += sum(_bytes(m.content) for m in messages)
        replies = self.send(messages)
        # push_messages gave every message its id: an error the SuperLink sends for an
        # unreachable node comes from the SuperLink, in reply to that node's message
        dst = {str(m.metadata.message_id): int(m.metadata.dst_node_id) for m in messages}
        got: dict[int, RecordDict] = {}
        asked = set(dst.values())
        for reply in replies:
            src = int(reply.metadata.src_node_id)
            if src not in asked and reply.has_error():
                src = dst.get(str(reply.metadata.reply_to_message_id), src)
            if src not in asked or src in got or src in self.out.failed:
                continue
            if reply.has_error():
                hint = ""
                if stage == "setup":
                    hint = (" (if its ClientApp lacks the secure-aggregation mod: add "
                            "flower_app.privacy.secure_aggregation_mod to its mods)")  # fmt: skip
                self.out.failed[src] = f"secure aggregation {stage}: {reply.error.reason}{hint}"
                self.out.bad += 1
                continue
            nbytes = _bytes(reply.content)
            self.up += nbytes
            self.node_up[src] = self.node_up.get(src, 0) + nbytes
            if SECAGG_RECORD not in reply.content.config_records:
                self.out.failed[src] = (
                    f"secure aggregation {stage}: the reply has no '{SECAGG_RECORD}' record "
                    "(add flower_app.privacy.secure_aggregation_mod to the ClientApp's mods)"
                )
                self.out.bad += 1
                continue
            got[src] = reply.content
        for node in sorted(asked - set(got) - set(self.out.failed)):
            self.out.failed[node] = f"secure aggregation {stage}: no reply within the timeout"
        return got


def _neighbours(nodes: Sequence[int], shares: int, rng: random.Random) -> dict[int, list[int]]:
    order = list(nodes)
    rng.shuffle(order)
    n, half = len(order), shares // 2
    if shares >= n:
        return {u: sorted(order) for u in order}
    return {
        u: sorted({order[(i + off) % n] for off in range(-half, half + 1)})
        for i, u in enumerate(order)
    }


def secure_sum(
    send: SendFn,
    messages: Sequence[Message],
    settings: SecureAggregation,
    rng: random.Random,
    server_round: int,
    public: Sequence[str] = (),
    transform: Mapping[str, Any] | None = None,
) -> SecureSum:
    """Run the four stages for one round's train messages; return the unmasked sum.

    Parameters
    ----------
    send : callable
        ``send(messages) -> replies`` (the strategy's :meth:`RoundStrategy.send`).
    messages : sequence of Message
        The round's train requests, one per node, as the strategy built them; their
        ``"config"`` gets ``secure-aggregation = 1`` (clients then reply densely).
    settings : SecureAggregation
        Shares, threshold, fixed point.
    rng : random.Random
        Shuffles the neighbour ring (seeded per round by the strategy).
    server_round : int
        The round (nodes check that every stage belongs to it).
    public : sequence of str
        Metric keys of ``"metrics"`` sent in the clear; every survivor must send the same
        value.
    transform : mapping, optional
        ``{"name": ..., <param>: ...}``: a reply transform the nodes apply before encoding
        (:mod:`flower_app.privacy.transforms`).

    Returns
    -------
    SecureSum
        The sum, the survivors, the failed nodes, the protocol's cost.
    """
    out = SecureSum()
    exchange = _Exchange(send, out)
    by_node = {int(m.metadata.dst_node_id): m for m in messages}
    nodes = sorted(by_node)
    if not nodes:
        return out
    base = messages[0]
    t0 = time.perf_counter()
    if len(nodes) < settings.min_nodes:
        for node in nodes:
            out.failed[node] = (
                f"secure aggregation needs at least {settings.min_nodes} nodes in a round; "
                f"{len(nodes)} sampled"
            )
        return out
    shares, threshold = settings.plan(len(nodes))
    setup = {
        "stage": "setup",
        "round": int(server_round),
        "clients": len(nodes),
        "shares": shares,
        "threshold": threshold,
        "frac-bits": int(settings.frac_bits),
        "public": list(public),
    }
    got = exchange("setup", [_stage_message(base, n, setup) for n in nodes])
    keys = {n: (bytes(c[SECAGG_RECORD]["pk1"]), bytes(c[SECAGG_RECORD]["pk2"]))
            for n, c in got.items()}  # fmt: skip
    ring = _neighbours(sorted(keys), shares, rng)

    def share_request(node: int) -> Message:
        around = [v for v in ring[node] if v in keys]
        return _stage_message(base, node, {
            "stage": "share-keys", "round": int(server_round),
            "nodes": [str(v) for v in around],
            "pk1": [keys[v][0] for v in around], "pk2": [keys[v][1] for v in around],
        })  # fmt: skip

    got = exchange("share-keys", [share_request(n) for n in sorted(keys)])
    sharing = sorted(got)
    inbox: dict[int, list[tuple[str, bytes]]] = {n: [] for n in sharing}
    for src in sharing:
        rec = got[src][SECAGG_RECORD]
        for dst, ct in zip(rec["destinations"], rec["ciphertexts"], strict=True):
            if int(dst) in inbox:
                inbox[int(dst)].append((str(src), bytes(ct)))
    t1 = time.perf_counter()

    def collect_request(node: int) -> Message:
        msg = by_node[node]
        content = RecordDict(dict(msg.content.items()))
        if "config" in content.config_records:
            content["config"] = ConfigRecord(
                {**dict(content.config_records["config"]), "secure-aggregation": 1}
            )
        srcs, cts = zip(*inbox[node], strict=True) if inbox[node] else ((), ())
        stage = {
            "stage": "collect", "round": int(server_round),
            "sources": list(srcs), "ciphertexts": list(cts),
        }  # fmt: skip
        if transform:
            stage["transform"] = str(transform["name"])
            stage.update({f"transform-{k}": v for k, v in transform.items() if k != "name"})
        content[SECAGG_RECORD] = ConfigRecord(stage)
        return Message(
            content,
            dst_node_id=node,
            message_type=msg.metadata.message_type,
            group_id=msg.metadata.group_id,
        )

    collect_msgs = {n: collect_request(n) for n in sharing}
    got = exchange("collect", list(collect_msgs.values()))
    t2 = time.perf_counter()
    layouts = {n: tuple(c[SECAGG_RECORD]["layout"]) for n, c in got.items()}
    common = Counter(layouts.values()).most_common(1)[0][0] if layouts else ()
    vectors: dict[int, np.ndarray] = {}
    for node, content in got.items():
        if layouts[node] != common:
            out.failed[node] = "secure aggregation collect: its reply has another layout"
            out.bad += 1
            continue
        vector = content.array_records["secagg-vector"]["masked"].numpy()
        if vector.dtype != np.uint64 or vector.ndim != 1:
            out.failed[node] = "secure aggregation collect: the masked vector is not uint64"
            out.bad += 1
            continue
        vectors[node] = vector
    public_values: dict[str, Any] = {}
    for node in list(vectors):
        values = dict(got[node]["secagg-public"])
        if not public_values:
            public_values = values
        elif values != public_values:
            out.failed[node] = (
                f"secure aggregation collect: public metrics {values} differ from "
                f"{public_values}"
            )
            out.bad += 1
            del vectors[node]
    alive = set(vectors)
    dead = set(sharing) - alive
    sizes = {v.size for v in vectors.values()}
    if not alive or len(sizes) != 1:
        out.cost = _cost(exchange, t0, t1, t2)
        return out

    def unmask_request(node: int) -> Message:
        return _stage_message(base, node, {
            "stage": "unmask", "round": int(server_round),
            "active": [str(v) for v in ring[node] if v in alive],
            "dead": [str(v) for v in ring[node] if v in dead],
        })  # fmt: skip

    failed_before = set(out.failed)
    got = exchange("unmask", [unmask_request(n) for n in sorted(alive)])
    for node in set(out.failed) - failed_before:
        # its vector arrived: it is in the sum; it only could not help unmasking
        out.failed.pop(node)
    collected: dict[int, list[bytes]] = {}
    for content in got.values():
        rec = content[SECAGG_RECORD]
        for owner, share in zip(rec["nodes"], rec["shares"], strict=True):
            collected.setdefault(int(owner), []).append(bytes(share))
    size = sizes.pop()
    total = np.zeros(size, np.uint64)
    for node in sorted(alive):
        total += vectors[node]
    for node in sorted(alive | dead):
        share_list = collected.get(node, [])
        if len(share_list) < threshold:
            for n in sorted(alive):
                out.failed[n] = (
                    f"secure aggregation unmask: {len(share_list)} shares of node {node}'s "
                    f"secret, fewer than the threshold {threshold}"
                )
            out.survivors = []
            out.cost = _cost(exchange, t0, t1, t2)
            return out
        secret = combine_shares(share_list)
        if node in alive:
            total -= mask_stream(secret, size)
            continue
        # the dead node's first private key, shared as its raw scalar (see the client)
        curve = bytes_to_public_key(keys[node][0]).curve
        sk1 = ec.derive_private_key(int.from_bytes(secret, "big"), curve)
        for other in ring[node]:
            if other == node or other not in alive:
                continue
            pair = mask_stream(generate_shared_key(sk1, bytes_to_public_key(keys[other][0])), size)
            # ``other`` added the pair mask if other > node, else subtracted it
            total = total - pair if other > node else total + pair
    entries = [Entry.parse(str(t)) for t in common]
    out.content = decode_sum(total, entries, settings.frac_bits, public_values)
    out.survivors = sorted(alive)
    out.template = collect_msgs[out.survivors[0]]
    out.cost = _cost(exchange, t0, t1, t2)
    return out


def _cost(exchange: _Exchange, t0: float, t1: float, t2: float) -> dict[str, Any]:
    return {
        "secagg-messages": int(exchange.messages),
        "secagg-bytes-up": int(exchange.up),
        "secagg-bytes-down": int(exchange.down),
        "secagg-bytes-up-max-node": max(exchange.node_up.values(), default=0),
        "secagg-setup-time": t1 - t0,
        "secagg-unmask-time": time.perf_counter() - t2,
    }
