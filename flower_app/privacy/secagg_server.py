"""The server's side of secure aggregation: one round's replies, summed unseen.

:func:`secure_sum` replaces "send the round's train messages, receive every reply" by
SecAgg+'s double masking (Bell et al., CCS 2020) in a form that a lying server cannot open
(see :mod:`flower_app.privacy.secagg_client` for the messages and the node's checks):

1. ``setup`` (once per node and run): the node makes an ECDH key pair (P-384, OS entropy)
   and sends the public key. Every pair of nodes then has a pairwise key
   (ECDH + HKDF, Flower's ``generate_shared_key``) that the server never learns.
2. ``collect`` (one *session*): the server announces the session's nodes U, each node's
   neighbours (its place in the ring of ``shares`` nodes that
   :func:`~flower_app.privacy.topology.ring_neighbours` makes of U, which every node
   recomputes and checks: the same ring every round for the same nodes, so each node
   derives a pairwise key once per neighbour and run) with their public keys, the threshold
   t and the encoding. Each node runs its handler, encodes its reply in Z/2^64, and adds a **self
   mask** from a fresh 16-byte seed and, for each neighbour, the **pairwise mask** of the
   session (AES-CTR keyed by HKDF(pair key, "pair|session"); one node adds it, the other
   subtracts it). It Shamir-shares the seed among its neighbours (t of k rebuild it),
   encrypts each share to its owner under the pair key (Fernet) together with the session
   and a digest of the session's parameters and announced set, and sends the masked
   vector, the ciphertexts and a SHA-256 commitment to the seed.
3. ``unmask``: only if **every** node of U submitted. The nodes asked (as few as give
   every seed: 6 of 10 with the default neighbourhood) get the ciphertexts addressed to
   them and return their own seeds and their shares of their neighbours' seeds; the seed
   of a node not asked, or that does not answer or answers wrongly, is rebuilt from t
   shares; every seed is checked against its commitment. The server removes every
   self mask; the pairwise masks cancel in the sum, and the sum is decoded.

Dropouts. A node that fails before or during ``collect`` (or whose reply is malformed) is
left out and the session is **rerun** without it (a new session: fresh seeds, fresh masks;
each node answers a rerun of the same request from the reply it kept, so its handler runs
once per round). The aborted session is never unmasked, so the vectors the server holds
from it — even one that arrives late — stay masked by seeds nobody reveals. A node that
fails during ``unmask`` stays in the sum: other holders of its neighbours' shares are asked,
and its own seed is rebuilt from shares.
The round fails only when some seed has fewer than t valid shares left, or fewer than 3
nodes remain. (SecAgg+ instead removes a dropped node's pairwise masks by rebuilding its
private key from its neighbours' shares; that recovery is exactly what a server that lies
about who dropped out exploits, so it is not used here: no private key is ever shared.)

Costs. Keys are agreed once per run (``setup`` only for nodes not seen before), so a round
is two exchanges: ``collect`` (the round's own, carrying the masked reply) and ``unmask``
(small messages, to as few nodes as give every seed).

Freshness. Every secret that protects one session is fresh for it and cannot be obtained
from anything revealed in another: the self-mask seed is 16 bytes of OS entropy drawn for
the session, revealed (by its owner or through t of its shares) only in that session's
``unmask``, and bound to it by the commitment, which includes the session; the pairwise
masks are AES-CTR streams keyed by HKDF(pair key, "pair|<session>"), so the masks of
different sessions are independent outputs of a pseudo-random function whose key (the
pairwise key) is never revealed — revealed seeds of other sessions say nothing about them;
the shares travel encrypted under the pairwise key with the session inside, so a share of
one session replayed into another is refused. Nothing long-lived is ever revealed (there
is no key share), so no node has to make new keys after a round, whoever dropped out.
(Tested in ``tests/test_secagg_malicious_server.py``: seeds and commitments never repeat,
no seed opens another session's vector, keys never appear in a message, replays refused.)

What the server learns: the sum over the session's nodes of every reply entry (every
array and every metric except the ``public`` ones, which the strategy names: values that
must agree, such as FedSM's ``num-elements``), the layout (record names, keys, shapes), who
took part, and message sizes.

**Security model.** The server may deviate arbitrarily (drop, replay, reorder, forge or
alter messages, announce any parameters, tell nodes different things); nodes are honest
unless said otherwise. Guaranteed, per session, for an honest node X:

* the server learns nothing about X's reply beyond the sum over every announced node of
  the session (at least 3, each of which submitted): X's vector carries a pairwise mask
  with every ring neighbour, made from a key that is never revealed, and each neighbour's
  vector carries the other half; a sum is free of pairwise masks only if it holds every
  node's neighbours, and the ring every node checks is connected; the seeds that are
  revealed only remove self masks;
* no seed is revealed for a session in which some announced neighbour did not submit, or
  in which two neighbours were told different parameters or announced sets: each node
  checks an authenticated share from every neighbour first (the consistency check, in the
  place of Bell et al.'s signed survivor set: the pairwise Fernet MAC authenticates the
  same claim, and no dropout claim is ever acted on because dropouts rerun the session);
* every stage is answered at most once per session; nothing after ``unmask`` or for an
  older session; a session's masks are never reused (fresh seed, session in every label).

Not guaranteed:

* **Keys are trusted on first use** unless the nodes' operators bind them. The server
  relays the public keys. A server that substitutes keys when two nodes first meet (or
  invents nodes, i.e. plays all of X's neighbours itself) can read X's shares and knows X's
  pairwise masks: it then recovers X's reply. Nodes pin the first key they see for each
  node id for the run, so keys cannot be swapped afterwards. With ``secagg-identity-key``
  and ``secagg-trusted-keys`` in every node's node_config (identities distributed out of
  band), a run key counts only if a trusted identity signed it for the run and node id:
  the server can then neither substitute keys nor invent nodes.
* **Colluding nodes.** A node colluding with the server knows its pairwise keys with its
  neighbours: if all of X's session neighbours collude, X's reply is exposed. Below that,
  X's reply is hidden in a sum with its honest neighbours' replies.
* **Different questions.** Each node answers a question once and takes part in at most
  one unmasked sum per question (:mod:`flower_app.privacy.questions`), so two sums of the
  same question never differ by one node; but a server can ask *another* question (a later
  round) of another set of nodes. Differential privacy bounds what such differences tell,
  each new question being a release the node charges to its own budget
  (:mod:`flower_app.privacy.ledger`).
* **Availability.** A lying server can always make a round fail (nodes refuse); it cannot
  make one succeed with less protection.

The strict-majority threshold (t > k/2, at least 2, checked by every node) keeps any
minority of a node's neighbours from rebuilding its seed of a session alone, and lets
k − t neighbours fail during ``unmask``. In SecAgg+ the majority is what stops a lying
server from getting both the seed shares and the key shares of one node; here no key share
exists, so what protects X against the server is the pairwise masks and the consistency
check, and the threshold only bounds collusion on the self mask and the dropout tolerance.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.primitives.asymmetric import bytes_to_public_key

from flower_app.privacy.fixed_point import MIN_RANGE_BITS, Entry, decode_sum, mask_stream
from flower_app.privacy.ledger import NODE_PRIVACY_RECORD
from flower_app.privacy.refusals import refusal_rule
from flower_app.privacy.secagg_client import SECAGG_RECORD, minimum_threshold
from flower_app.privacy.shares import SEED_BYTES, combine_seed, seed_commitment, share_index
from flower_app.privacy.topology import MIN_NODES, ring_neighbours

__all__ = ["KeyBook", "SecureAggregation", "SecureSum", "key_book", "secure_sum"]

SendFn = Callable[[list[Message]], list[Message]]

#: most subsets of shares tried when a rebuilt seed fails its commitment (a lying holder)
MAX_SUBSETS = 256


@dataclass(frozen=True)
class SecureAggregation:
    """Settings of secure aggregation (SecAgg+ double masking on Flower's primitives).

    Parameters
    ----------
    num_shares : int or float, optional
        Neighbours each node shares its self-mask seed with and masks with, itself
        included: a count, a fraction of the round's nodes (1.0: every node, i.e. SecAgg),
        or None (default: 2⌈log₂ n⌉ + 1, SecAgg+'s O(log n) neighbourhood; every node up to
        n = 9). At least 3 (or n); rounded up to an odd number when below the node count.
    reconstruction_threshold : int or float, optional
        Shares needed to rebuild a seed: a count, or a fraction of ``num_shares`` (default
        0.5). Always at least a strict majority of the neighbourhood, ⌊k/2⌋ + 1 (and so at
        least 2): nodes refuse anything less. A count below the majority is an error; a
        fraction below 0.5 is refused here. Up to ``num_shares − threshold`` neighbours of
        a node may fail during ``unmask``.
    frac_bits : int, optional
        Fractional bits of the fixed-point encoding of real values (default 24: each
        client's value is off by at most 2^-25, a sum over n clients by n·2^-25).
    min_nodes : int, optional
        Fewest nodes a secure round may have (default and least 3: in a "sum" of two nodes
        each could subtract its own reply; a sum of one is the reply).
    """

    num_shares: int | float | None = None
    reconstruction_threshold: int | float = 0.5
    frac_bits: int = 24
    min_nodes: int = MIN_NODES

    def __post_init__(self) -> None:
        if not 0 <= int(self.frac_bits) <= 63 - MIN_RANGE_BITS - 2:
            raise ValueError(
                f"frac_bits={self.frac_bits}: expected 0..{63 - MIN_RANGE_BITS - 2} (nodes "
                f"refuse more than {63 - MIN_RANGE_BITS} - ceil(log2(nodes)), which leaves "
                f"every value a range of +-2^{MIN_RANGE_BITS})"
            )
        for name in ("num_shares", "reconstruction_threshold"):
            value = getattr(self, name)
            if value is None and name == "num_shares":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name}={value!r}: expected a positive count or fraction")
            if isinstance(value, float) and value > 1.0:
                raise ValueError(f"{name}={value!r}: a fraction must be in (0, 1]")
        thr = self.reconstruction_threshold
        if isinstance(thr, float) and thr < 0.5:
            raise ValueError(
                f"reconstruction_threshold={thr}: the threshold must be a strict majority of "
                "the neighbourhood (a fraction of at least 0.5; nodes refuse less)"
            )
        if int(self.min_nodes) < MIN_NODES:
            raise ValueError(
                f"min_nodes={self.min_nodes}: secure aggregation needs >= {MIN_NODES} nodes "
                "(nodes refuse fewer)"
            )

    def plan(self, nodes: int) -> tuple[int, int]:
        """Return (shares, threshold) for a round of ``nodes`` nodes.

        Raises
        ------
        ValueError
            If an explicit threshold count is not a strict majority of the neighbourhood.
        """
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
        least = minimum_threshold(count)
        if isinstance(thr, float):
            threshold = max(math.ceil(thr * count), least)
        else:
            threshold = min(int(thr), count)
            if threshold < least:
                raise ValueError(
                    f"reconstruction_threshold={thr} with {count} neighbours: the threshold "
                    f"must be a strict majority, at least {least} (nodes refuse less)"
                )
        return count, min(threshold, count)

    def as_config(self) -> dict[str, Any]:
        """Return the settings as run_config-style entries (for ``config.json``)."""
        return {
            "secure-aggregation": True,
            "secagg-num-shares": 0 if self.num_shares is None else self.num_shares,
            "secagg-reconstruction-threshold": self.reconstruction_threshold,
            "secagg-frac-bits": int(self.frac_bits),
        }


@dataclass
class KeyBook:
    """The nodes' public keys the server has relayed in this run (one book per run).

    Attributes
    ----------
    keys : dict of int to bytes
        Node id -> the node's public key (PEM), from its ``setup`` reply.
    endorsed : dict of int to (bytes, bytes)
        Node id -> (identity public key, its signature over the run key), for nodes whose
        operator gave them an identity (``secagg-identity-key``); relayed to neighbours
        that check them (``secagg-trusted-keys``).
    lost : dict of int to str
        Nodes left out for the rest of the run: a node that lost its protocol state makes
        new keys, but its neighbours pinned the old ones.
    trust : dict of int to str
        How each node said it checks its neighbours' keys: ``endorsed`` (only keys a trusted
        identity signed) or ``first-use``.
    """

    keys: dict[int, bytes] = field(default_factory=dict)
    endorsed: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    trust: dict[int, str] = field(default_factory=dict)


_BOOKS: weakref.WeakKeyDictionary[Any, KeyBook] = weakref.WeakKeyDictionary()
_SESSION_LOCK = threading.Lock()
_LAST_SESSION = 0


def key_book(grid: Any) -> KeyBook:
    """Return the :class:`KeyBook` of a grid (one per run: strategies of a run share it)."""
    if grid not in _BOOKS:
        _BOOKS[grid] = KeyBook()
    return _BOOKS[grid]


def _next_session() -> int:
    """Return a session id larger than every one this process gave before.

    Nodes require strictly increasing sessions; wall-clock based, so a new strategy object
    in the same run continues above the last one.
    """
    global _LAST_SESSION
    with _SESSION_LOCK:
        _LAST_SESSION = max(time.time_ns(), _LAST_SESSION + 1)
        return _LAST_SESSION


@dataclass
class SecureSum:
    """One round's outcome of :func:`secure_sum`.

    Attributes
    ----------
    content : RecordDict or None
        The summed reply (arrays as float64/int64, metrics, the public metrics), or None
        if no sum could be made.
    survivors : list of int
        Nodes whose replies are in the sum.
    failed : dict of int to str
        Nodes left out, with the reason (the stage where they failed).
    bad : int
        Of ``failed``, nodes that answered but were rejected (error reply, other layout).
    template : Message or None
        A collect request of a survivor (to build the summed reply as a reply to it).
    unmask_rejected : dict of int to str
        Survivors whose unmask reply was left out (duplicate, wrong-kind or malformed
        shares; shares that fail the seed's commitment), with the reason. Their replies
        are in the sum.
    refused : dict of int to str
        Of ``failed``, nodes that refused by a named rule (``privacy-budget``,
        ``asked-before``, ``encoding``, ...: :data:`flower_app.privacy.refusals.RULES`).
    node_privacy : dict of int to dict
        The ``"node-privacy"`` figures of the nodes whose replies are in the sum (each
        node's own ledger: :mod:`flower_app.privacy.ledger`).
    cost : dict
        ``secagg-messages``, ``secagg-bytes-up``, ``secagg-bytes-down`` (all stages),
        ``secagg-bytes-up-max-node`` (the most one node sent, all stages),
        ``secagg-setup-time`` (key setup of new nodes), ``secagg-collect-time`` (stage 2,
        reruns included), ``secagg-unmask-time`` (stage 3 and the server's unmasking),
        ``secagg-sessions`` (1, or more after dropouts), ``secagg-unmask-nodes`` (nodes
        asked to unmask).
    """

    content: RecordDict | None = None
    survivors: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    bad: int = 0
    template: Message | None = None
    unmask_rejected: dict[int, str] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    node_privacy: dict[int, dict[str, Any]] = field(default_factory=dict)


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
        self.errors: dict[int, str] = {}

    def __call__(self, stage: str, messages: list[Message]) -> dict[int, RecordDict]:
        """Return the usable replies by node; the others go to ``out.failed``."""
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
                reason = str(reply.error.reason)
                rule = refusal_rule(reason)
                if rule is not None:
                    self.out.refused[src] = rule
                self.errors[src] = reason
                self.out.failed[src] = f"secure aggregation {stage}: {reason}{hint}"
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


def _setup(
    exchange: _Exchange, base: Message, nodes: list[int], book: KeyBook, out: SecureSum
) -> None:
    """Get the public key of every node not in the book (once per node and run)."""
    got = exchange("setup", [_stage_message(base, n, {"stage": "setup"}) for n in nodes])
    known = set(book.keys.values())
    for node in sorted(got):
        key = got[node][SECAGG_RECORD].get("pk")
        try:
            assert isinstance(key, bytes) and key not in known
            assert isinstance(bytes_to_public_key(key).curve, ec.SECP384R1)
        except (AssertionError, ValueError, TypeError):
            out.failed[node] = "secure aggregation setup: no valid, unique P-384 public key"
            out.bad += 1
            continue
        book.keys[node] = key
        book.trust[node] = str(got[node][SECAGG_RECORD].get("trust", "first-use"))
        known.add(key)
        identity, endorsement = got[node][SECAGG_RECORD].get("identity"), None
        if isinstance(identity, bytes):
            endorsement = got[node][SECAGG_RECORD].get("endorsement")
        if isinstance(identity, bytes) and isinstance(endorsement, bytes):
            book.endorsed[node] = (identity, endorsement)


def _check_collect_reply(
    node: int, content: RecordDict, ring: list[int], size: int | None
) -> str | None:
    """Return why a collect reply is unusable, or None."""
    rec = content[SECAGG_RECORD]
    dsts, cts = rec.get("destinations"), rec.get("ciphertexts")
    if dsts != [str(v) for v in ring if v != node]:
        return "its shares are not addressed to exactly its neighbours"
    if not isinstance(cts, list) or len(cts) != len(dsts) or not all(
        isinstance(c, bytes) for c in cts
    ):
        return "one ciphertext per neighbour expected"
    commitment = rec.get("commitment")
    if not isinstance(commitment, bytes) or len(commitment) != 32:
        return "no seed commitment"
    if "secagg-vector" not in content.array_records or "secagg-public" not in content:
        return "no masked vector"
    vector = content.array_records["secagg-vector"]["masked"].numpy()
    if vector.dtype != np.uint64 or vector.ndim != 1 or (size is not None and vector.size != size):
        return "the masked vector is not a uint64 vector of the layout's size"
    return None


def _cover(owners: dict[int, list[int]], need: dict[int, int], exclude: set[int]) -> list[int]:
    """Pick nodes to ask so that every owner with ``need`` > 0 is served.

    An asked node sends its own seed (its need is met) and one share of each of its
    neighbours' seeds (their need drops by one). Greedy: the node serving most owners first.
    """
    holders: dict[int, set[int]] = {}
    for owner, around in owners.items():
        if need.get(owner, 0) > 0:
            for h in around:
                if h not in exclude:
                    holders.setdefault(h, set()).add(owner)
    need = dict(need)
    picked: list[int] = []
    while any(v > 0 for v in need.values()) and holders:
        best = max(sorted(holders), key=lambda h: sum(need[o] > 0 for o in holders[h]))
        if not any(need[o] > 0 for o in holders[best]):
            break
        picked.append(best)
        for o in holders.pop(best):
            need[o] -= 1
        need[best] = 0
    return picked


def _accept_unmask_reply(
    holder: int, content: RecordDict, ring: dict[int, list[int]], threshold: int
) -> tuple[dict[int, bytes] | None, str]:
    """Return the holder's shares by owner, or None and why they are all left out."""
    rec = content[SECAGG_RECORD]
    seed = rec.get("seed")
    if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
        return None, "malformed reply (no seed of its own)"
    nodes, shares = rec.get("nodes"), rec.get("shares")
    if not isinstance(nodes, list) or not isinstance(shares, list) or len(nodes) != len(shares):
        return None, "malformed reply (nodes and shares lists of equal length expected)"
    out: dict[int, bytes] = {}
    for owner_text, share in zip(nodes, shares, strict=True):
        try:
            owner = int(owner_text)
        except (TypeError, ValueError):
            return None, f"malformed owner id {owner_text!r}"
        if owner in out:
            return None, f"two shares for node {owner} (duplicate)"
        if owner not in ring or holder not in ring[owner]:
            return None, f"a share for node {owner}, which it does not hold (wrong kind)"
        try:
            index = share_index(share)
        except ValueError:
            return None, f"malformed share for node {owner}"
        if index != ring[owner].index(holder) + 1:
            return None, f"the share for node {owner} has index {index}, not its own"
        out[owner] = share
    return out, ""


def _rebuild(
    owner: int, shares: dict[int, bytes], threshold: int, commitment: bytes, session: int
) -> tuple[bytes | None, set[int]]:
    """Rebuild an owner's seed from holders' shares; return it and the holders caught lying."""
    holders = sorted(shares)
    first = holders[:threshold]
    seed = combine_seed([shares[h] for h in first])
    if seed_commitment(seed, owner, session) == commitment:
        return seed, set()
    for n, subset in enumerate(itertools.combinations(holders, threshold)):
        if n >= MAX_SUBSETS:
            break
        seed = combine_seed([shares[h] for h in subset])
        if seed_commitment(seed, owner, session) != commitment:
            continue
        liars = set()
        good = list(subset[: threshold - 1])
        for h in holders:
            if h in subset:
                continue
            check = combine_seed([shares[g] for g in good] + [shares[h]])
            if seed_commitment(check, owner, session) != commitment:
                liars.add(h)
        return seed, liars
    return None, set()


def secure_sum(
    send: SendFn,
    messages: Sequence[Message],
    settings: SecureAggregation,
    server_round: int,
    public: Sequence[str] = (),
    transform: Mapping[str, Any] | None = None,
    keys: KeyBook | None = None,
) -> SecureSum:
    """Run the protocol for one round's train messages; return the unmasked sum.

    Parameters
    ----------
    send : callable
        ``send(messages) -> replies`` (the strategy's :meth:`RoundStrategy.send`).
    messages : sequence of Message
        The round's train requests, one per node, as the strategy built them; their
        ``"config"`` gets ``secure-aggregation = 1`` (clients then reply densely).
    settings : SecureAggregation
        Shares, threshold, fixed point.
    server_round : int
        The round (for the nodes' logs; sessions are numbered by the server).
    public : sequence of str
        Metric keys of ``"metrics"`` sent in the clear; every survivor must send the same
        value.
    transform : mapping, optional
        ``{"name": ..., <param>: ...}``: a reply transform the nodes apply before encoding
        (:mod:`flower_app.privacy.transforms`).
    keys : KeyBook, optional
        The run's public keys (:func:`key_book` of the grid); without it every node is set
        up again (an extra exchange; a node answers with the keys it already has).

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
    least = max(int(settings.min_nodes), MIN_NODES)
    t0 = time.perf_counter()
    if len(nodes) < least:
        for node in nodes:
            out.failed[node] = (
                f"secure aggregation needs at least {least} nodes in a round; "
                f"{len(nodes)} sampled (in a sum of two, each node could subtract its own reply)"
            )
        return out
    if int(settings.frac_bits) + math.ceil(math.log2(len(nodes))) > 63 - MIN_RANGE_BITS:
        for node in nodes:
            out.failed[node] = (
                f"secure aggregation: secagg-frac-bits {settings.frac_bits} with {len(nodes)} "
                f"nodes leaves values less than +-2^{MIN_RANGE_BITS}, which nodes refuse: "
                "lower secagg-frac-bits"
            )
        return out
    book = KeyBook() if keys is None else keys
    for node in nodes:
        if node in book.lost:
            out.failed[node] = book.lost[node]
    new = [n for n in nodes if n not in book.keys and n not in out.failed]
    if new:
        _setup(exchange, base, new, book, out)
    t1 = time.perf_counter()
    active = [n for n in nodes if n in book.keys and n not in out.failed]
    sessions = 0
    while True:
        if len(active) < least:
            for node in active:
                out.failed[node] = (
                    f"secure aggregation: {len(active)} nodes left after dropouts, fewer than "
                    f"{least}"
                )
            out.cost = _cost(exchange, t0, t1, time.perf_counter(), sessions, 0)
            return out
        shares, threshold = settings.plan(len(active))
        ring = ring_neighbours(active, shares)
        session = _next_session()
        sessions += 1
        collect_msgs = {
            n: _collect_request(by_node[n], n, session, server_round, active, ring[n], book,
                                shares, threshold, settings, public, transform)
            for n in active
        }  # fmt: skip
        got = exchange("collect", list(collect_msgs.values()))
        for node, reason in exchange.errors.items():
            if "no keys for this run" in reason:  # state lost: new keys would clash with pins
                book.lost[node] = f"secure aggregation: node lost its protocol state ({reason})"
                book.keys.pop(node, None)
        exchange.errors.clear()
        usable = _check_collected(got, ring, out)
        if set(usable) == set(active):
            break
        active = sorted(usable)  # rerun the session without the nodes that did not submit
    t2 = time.perf_counter()
    vectors = {n: c.array_records["secagg-vector"]["masked"].numpy() for n, c in usable.items()}
    for node, content in usable.items():
        figures = content.metric_records.get(NODE_PRIVACY_RECORD)
        if figures is not None:
            out.node_privacy[node] = dict(figures)
    layout = tuple(usable[active[0]][SECAGG_RECORD]["layout"])
    public_values = dict(usable[active[0]]["secagg-public"])
    seeds, asked = _unmask(exchange, base, usable, ring, threshold, session, out)
    if seeds is None:
        out.cost = _cost(exchange, t0, t1, t2, sessions, asked)
        return out
    size = vectors[active[0]].size
    total = np.zeros(size, np.uint64)
    for node in active:
        total += vectors[node]
        total -= mask_stream(seeds[node], size, label=b"self|%d" % session)
    entries = [Entry.parse(str(t)) for t in layout]
    out.content = decode_sum(total, entries, settings.frac_bits, public_values)
    out.survivors = list(active)
    out.template = collect_msgs[active[0]]
    out.cost = _cost(exchange, t0, t1, t2, sessions, asked)
    # how many of the summed nodes check keys against trusted identities (the rest trust
    # on first use): the run's record of which guarantee held
    out.cost["secagg-nodes-endorsed"] = sum(book.trust.get(n) == "endorsed" for n in active)
    return out


def _collect_request(
    msg: Message,
    node: int,
    session: int,
    server_round: int,
    active: list[int],
    around: list[int],
    book: KeyBook,
    shares: int,
    threshold: int,
    settings: SecureAggregation,
    public: Sequence[str],
    transform: Mapping[str, Any] | None,
) -> Message:
    content = RecordDict(dict(msg.content.items()))
    if "config" in content.config_records:
        content["config"] = ConfigRecord(
            {**dict(content.config_records["config"]), "secure-aggregation": 1}
        )
    stage: dict[str, Any] = {
        "stage": "collect", "session": session, "round": int(server_round),
        "announced": [str(v) for v in active], "neighbours": [str(v) for v in around],
        "keys": [book.keys[v] for v in around], "shares": shares, "threshold": threshold,
        "frac-bits": int(settings.frac_bits), "public": list(public),
    }  # fmt: skip
    if any(v in book.endorsed for v in around):  # for nodes that trust only endorsed keys
        stage["identities"] = [book.endorsed.get(v, (b"", b""))[0] for v in around]
        stage["endorsements"] = [book.endorsed.get(v, (b"", b""))[1] for v in around]
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


def _check_collected(
    got: dict[int, RecordDict], ring: dict[int, list[int]], out: SecureSum
) -> dict[int, RecordDict]:
    """Return the collect replies that can be summed; the others go to ``out.failed``."""
    layouts = {n: tuple(c[SECAGG_RECORD].get("layout") or ()) for n, c in got.items()}
    common = Counter(layouts.values()).most_common(1)[0][0] if layouts else ()
    try:
        size = sum(Entry.parse(str(t)).size for t in common)
    except ValueError:
        size = None
    usable: dict[int, RecordDict] = {}
    public_values: dict[str, Any] | None = None
    for node in sorted(got):
        content = got[node]
        reason = None
        if layouts[node] != common or size is None:
            reason = "its reply has another layout"
        else:
            reason = _check_collect_reply(node, content, ring[node], size)
        if reason is None:
            values = dict(content["secagg-public"])
            if public_values is None:
                public_values = values
            elif values != public_values:
                reason = f"public metrics {values} differ from {public_values}"
        if reason is not None:
            out.failed[node] = f"secure aggregation collect: {reason}"
            out.bad += 1
            continue
        usable[node] = content
    return usable


def _unmask(
    exchange: _Exchange,
    base: Message,
    got: dict[int, RecordDict],
    ring: dict[int, list[int]],
    threshold: int,
    session: int,
    out: SecureSum,
) -> tuple[dict[int, bytes] | None, int]:
    """Ask nodes to unmask until every seed is known; rebuild those not sent by their owner.

    The first nodes asked are as few as give every seed (their own, and t shares of each
    other's); a node that fails or lies makes the server ask others. Returns the seeds by
    node (None if some seed has fewer than ``threshold`` valid shares) and the number of
    nodes asked. A reply that is malformed, of the wrong kind, or whose
    own seed fails its commitment is left out whole; a holder whose share fails a rebuilt
    seed's commitment is found by trying subsets and left out too.
    """
    active = sorted(got)
    inbox: dict[int, list[tuple[str, bytes]]] = {n: [] for n in active}
    for src in active:
        rec = got[src][SECAGG_RECORD]
        for dst, ct in zip(rec["destinations"], rec["ciphertexts"], strict=True):
            inbox[int(dst)].append((str(src), bytes(ct)))
    commitments = {n: bytes(got[n][SECAGG_RECORD]["commitment"]) for n in active}
    owners = {n: ring[n] for n in active}
    collected: dict[int, dict[int, bytes]] = {n: {} for n in active}
    seeds: dict[int, bytes] = {}
    asked: set[int] = set()
    distrusted: set[int] = set()
    extra = dict.fromkeys(active, 0)  # shares beyond the threshold, to outvote a liar
    failed_before, bad_before = set(out.failed), out.bad
    while True:
        need = {o: threshold + extra[o] - len(collected[o]) for o in active if o not in seeds}
        # as few nodes as give every seed: each asked node sends its own seed and its
        # shares of its neighbours' (one unmask message costs more in Flower's simulation
        # than rebuilding a seed); more only if a node fails or lies
        holders = _cover(owners, need, asked)
        if any(v > 0 for v in need.values()) and not holders:
            short = sorted(o for o, v in need.items() if v > 0)
            for n in active:
                out.failed[n] = (
                    f"secure aggregation unmask: fewer valid shares of node {short[0]}'s seed "
                    f"than the threshold {threshold}"
                )
            out.survivors = []
            return None, len(asked)
        if holders:
            asked.update(holders)
            replies = exchange("unmask", [
                _stage_message(base, h, {
                    "stage": "unmask", "session": session,
                    "sources": [s for s, _ in inbox[h]], "ciphertexts": [c for _, c in inbox[h]],
                }) for h in holders
            ])  # fmt: skip
            for holder, content in sorted(replies.items()):
                accepted, why = _accept_unmask_reply(holder, content, ring, threshold)
                if accepted is None:
                    out.unmask_rejected[holder] = why
                    continue
                own = bytes(content[SECAGG_RECORD]["seed"])
                if seed_commitment(own, holder, session) == commitments[holder]:
                    seeds[holder] = own
                else:  # its own seed is wrong: every share it sent is suspect too
                    out.unmask_rejected[holder] = "its own seed fails its commitment"
                    continue
                for owner, share in accepted.items():
                    if owner not in seeds:
                        collected[owner][holder] = share
        for owner in active:
            if owner in seeds or len(collected[owner]) < threshold + extra[owner]:
                continue
            seed, liars = _rebuild(owner, collected[owner], threshold, commitments[owner],
                                   session)  # fmt: skip
            if seed is None:  # no subset of these shares passes: ask one more holder
                extra[owner] += 1
                continue
            for liar in liars - distrusted:
                distrusted.add(liar)
                out.unmask_rejected[liar] = (
                    f"a share for node {owner} that does not rebuild its committed seed"
                )
                for shares in collected.values():
                    shares.pop(liar, None)
            if seed is not None:
                seeds[owner] = seed
        if len(seeds) == len(active):
            break
    for node in set(out.failed) - failed_before:
        # its vector arrived: it is in the sum; it only could not help unmasking
        out.unmask_rejected[node] = out.failed.pop(node)
    out.bad = bad_before
    return seeds, len(asked)


def _cost(
    exchange: _Exchange, t0: float, t1: float, t2: float, sessions: int, asked: int
) -> dict[str, Any]:
    return {
        "secagg-messages": int(exchange.messages),
        "secagg-bytes-up": int(exchange.up),
        "secagg-bytes-down": int(exchange.down),
        "secagg-bytes-up-max-node": max(exchange.node_up.values(), default=0),
        "secagg-setup-time": t1 - t0,
        "secagg-collect-time": t2 - t1,
        "secagg-unmask-time": time.perf_counter() - t2,
        "secagg-sessions": int(sessions),
        "secagg-unmask-nodes": int(asked),
    }
