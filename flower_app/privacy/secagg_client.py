"""The node's side of secure aggregation: a Flower mod for any ClientApp.

Add it to a ClientApp (``ClientApp(mods=[secure_aggregation_mod])``; this package's own
ClientApp has it) and every strategy of :mod:`flower_app.strategies` built with
``secure_aggregation=SecureAggregation()`` can sum the node's replies without seeing them.
The mod is a no-op for every message without a ``"secagg"`` ConfigRecord, so it costs
nothing when secure aggregation is off.

The protocol (described in full, with its security argument, in
:mod:`flower_app.privacy.secagg_server`) is SecAgg+'s double masking (Bell et al., CCS 2020)
on Flower's primitives, with keys agreed once per run and a session that is unmasked only
when every announced node submitted. Its stages arrive as messages of the same type as the
round's train message, each carrying ``"secagg"`` with a ``stage``:

===========  ===========================================  ===================================
stage        request ``"secagg"``                         reply
===========  ===========================================  ===================================
``setup``    (nothing else; once per node and run)        ``"secagg"``: ``pk`` (bytes, the
                                                          node's ECDH public key, PEM); with
                                                          an identity: ``identity`` (PEM),
                                                          ``endorsement`` (its signature
                                                          over run id, node id and ``pk``)
``collect``  the round's own train content, plus          ``"secagg"``: ``layout`` (str list),
             ``session`` (int, strictly increasing),      ``destinations`` (str ids),
             ``round`` (int, for the log),                ``ciphertexts`` (bytes: a Shamir
             ``announced`` (str ids: every node of the    share of the self-mask seed for
             session), ``neighbours`` (str ids, this      each neighbour), ``commitment``
             node included), ``keys`` (their public       (bytes: SHA-256 of the seed);
             keys, PEM), ``shares`` (int, the             ``"secagg-vector"``: ``masked``
             neighbourhood's size), ``threshold``,        uint64; ``"secagg-public"``: the
             ``frac-bits``, ``public`` (metric keys       public metrics
             sent in the clear), optional ``transform``
             and ``transform-*``, ``identities`` and
             ``endorsements`` (one per neighbour)
``unmask``   ``session``, ``sources`` (str ids: every     ``"secagg"``: ``nodes`` (str ids),
             neighbour but this node), ``ciphertexts``    ``shares`` (bytes): this node's
             (what each of them sent this node)           share of each neighbour's seed;
                                                          ``seed``: its own seed
===========  ===========================================  ===================================

What the node enforces (each refusal is a :class:`NodeRefusedError`, which Flower returns to
the server as an error reply: ``node refused [rule]: ...``, public parameters only):

* **parameters** — at least 3 announced nodes and a neighbourhood of at least 3; the
  neighbour list is exactly this node's place in the ring of the announced nodes
  (:func:`flower_app.privacy.topology.ring_neighbours`, which the node recomputes: the
  server opens the whole session's sum or nothing); the threshold is a strict majority
  of the neighbourhood (``threshold > shares / 2``, hence at least 2, the floor: no single
  neighbour ever holds a seed whole) and at most ``shares``; the fractional bits leave
  every value a range of at least ±2^20; every neighbour's key is a
  P-384 public key, distinct from the others, this node's own is its own, and a node id
  keeps the key first seen for it in this run (trust on first use, see the server module);
  with ``secagg-trusted-keys`` in the node_config (a PEM file of the identities its
  operator trusts), a neighbour's key must also be signed by one of them for this run and
  that node id (the node's own ``secagg-identity-key`` signs its key in ``setup``);
* **stage order** — sessions strictly increase; a session is collected once and unmasked
  at most once, only if it is the last one collected; nothing is answered for a session
  after its unmask, after a later session began, or after the server was caught lying in
  it (a refused ``unmask`` burns the session);
* **consistency** — ``unmask`` is answered only with a share from *every* neighbour, each
  decrypting under the pairwise key to (that neighbour, this node, this session, the digest
  of this session's parameters and announced set). The server cannot forge one: a session
  in which some announced node did not submit, or in which two neighbours were told
  different things, is never unmasked (the server reruns it without the missing nodes);
* **what travels in the clear** — only the public metrics the node allows: the problem
  sizes this package's strategies need (``num-elements``, ``n-elements``) and whatever its
  operator adds in ``secagg-public-metrics``; a request naming another metric as public
  (e.g. a loss) is refused;
* **what is revealed** — only the session's fresh self-mask seeds: its own, and its shares
  of its neighbours' (the server rebuilds the seed of a node that fails to answer from t of
  them; revealing its own seed tells the server nothing the shares would not). Private keys
  are never shared, so there is no key share to ask for (a request naming dropped nodes is
  refused), and no seed of another session;
* **one answer per question** (:mod:`flower_app.privacy.questions`) — a rerun of an open
  question is answered from the kept answer (a subset of the nodes, the same encoding); a
  question unmasked, answered in the clear or refused once is refused again
  (``asked-before``), also under another round number;
* **its own privacy budget** (:mod:`flower_app.privacy.ledger`) — the releases its DP code
  declares are charged before anything is sent, and refused past ``dp-max-epsilon``; the
  node's figures go back in the clear ``"node-privacy"`` record. A DP request without
  secure aggregation goes through the same question book and ledger;
* **no private value in a refusal** (:mod:`flower_app.privacy.refusals`) — any error of the
  handler, a reply transform or the encoding is replaced by a fixed text naming the stage.

In ``collect`` the mod calls the node's own handler (for a new question), encodes its
reply (every array and metric except the public ones, see
:mod:`flower_app.privacy.fixed_point`), adds its
self mask and the pairwise masks, and sends only the masked vector and the layout (names,
shapes, whether real or integer: the same on every node). The encoded reply is kept until
the session is unmasked: a rerun of the same request (after another node dropped out) is
answered from it with fresh masks, so the handler's side effects (e.g. SCAFFOLD's control
variates) happen once per round.

Why not Flower's ``secaggplus_mod``: it acts only on messages of type exactly ``train``
(this package's strategies send named actions and ``query``-style exchanges), sums only a
legacy ``FitRes`` (parameters weighted by ``num-examples``, no metrics, clipped to a
symmetric range), its masks come from a 32-bit-seeded ``RandomState``, and it trusts the
server's dropout claims (a server that tells some neighbours "X is active" and others "X
dropped out" gets both X's seed and X's private key).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from logging import WARNING
from typing import Any, cast

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.common.logger import log
from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    decrypt,
    encrypt,
    generate_shared_key,
)
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
    sign_message,
    verify_signature,
)

from flower_app.privacy.fixed_point import MIN_RANGE_BITS, encode_reply, layout_of, mask_stream
from flower_app.privacy.ledger import (
    NODE_PRIVACY_RECORD,
    PrivacyLedger,
    Release,
    is_private_request,
)
from flower_app.privacy.questions import QuestionBook, question_digest
from flower_app.privacy.refusals import (
    NodeRefusedError,
    SecureAggregationRefusedError,
    private_errors,
)
from flower_app.privacy.shares import SEED_BYTES, seed_commitment, split_seed
from flower_app.privacy.topology import MIN_NODES, ring_neighbours
from flower_app.privacy.transforms import apply_transform

__all__ = [
    "MIN_NODES",
    "SECAGG_RECORD",
    "NodeRefusedError",
    "SecureAggregationRefusedError",
    "minimum_threshold",
    "parameters_digest",
    "secure_aggregation_mod",
]

#: the ConfigRecord that marks a secure-aggregation message (request and reply)
SECAGG_RECORD = "secagg"
#: the node's protocol state in its Context: its key pair (once per run), the keys it
#: pinned and the pairwise keys it derived (grow as it meets nodes), the current session
KEYS_RECORD = "secagg-keys"
PEERS_RECORD = "secagg-peers"
PAIRS_RECORD = "secagg-pairs"
IDENTITIES_RECORD = "secagg-identities"
STATE_RECORD = "secagg-state"
#: what reply transforms keep on the node between rounds (e.g. FedSubAvg's declared rows)
STORE_RECORD = "secagg-store"
#: the encoded reply of the last collected session, until it is unmasked
CACHE_RECORD = "secagg-cache"
CACHE_META_RECORD = "secagg-cache-meta"
CACHE_PUBLIC_RECORD = "secagg-cache-public"
#: the threshold floor (implied by the strict majority of a neighbourhood of >= 3)
MIN_THRESHOLD = 2

_COLLECT_KEYS = {
    "stage", "session", "round", "announced", "neighbours", "keys", "shares", "threshold",
    "frac-bits", "public", "transform", "identities", "endorsements",
}  # fmt: skip
#: node_config keys (set by the node's operator; the server cannot change them)
IDENTITY_KEY = "secagg-identity-key"
TRUSTED_KEYS = "secagg-trusted-keys"
PUBLIC_METRICS = "secagg-public-metrics"
#: metrics a node sends in the clear when asked (problem sizes every node must agree on:
#: FedSM's num-elements, FedCG's and the discrete greedy's n-elements); anything else only
#: if the node's operator adds it (node_config ``secagg-public-metrics``, comma-separated)
DEFAULT_PUBLIC_METRICS = frozenset({"num-elements", "n-elements"})
_UNMASK_KEYS = {"stage", "session", "round", "sources", "ciphertexts"}
_PLAINTEXT = struct.Struct(">QQq32s")  # source, destination, session, parameters digest


def minimum_threshold(shares: int) -> int:
    """Return the least threshold a node accepts for a neighbourhood of ``shares``."""
    return max(MIN_THRESHOLD, shares // 2 + 1)


def parameters_digest(cfg: dict[str, Any]) -> bytes:
    """Return the digest of a collect request's session, parameters and announced set.

    Every neighbour puts it into the share it sends; a node unmasks only if all of them
    match its own (so all of its neighbours were told the same session).
    """
    transform = sorted((k, repr(v)) for k, v in cfg.items() if str(k).startswith("transform"))
    text = repr(
        (
            int(cfg["session"]), sorted(int(n) for n in cfg["announced"]), int(cfg["shares"]),
            int(cfg["threshold"]), int(cfg["frac-bits"]), list(cfg.get("public", [])), transform,
        )
    )  # fmt: skip
    return hashlib.sha256(b"flower_app secagg session v2|" + text.encode()).digest()


def _refuse(text: str) -> SecureAggregationRefusedError:
    return SecureAggregationRefusedError(text)


def _record(context: Context, name: str) -> dict[str, Any]:
    """Return a ConfigRecord of the node's state as a dict ({} if absent)."""
    return dict(context.state[name]) if name in context.state else {}


class _NodeState:
    """The node's protocol state, read from and written back to its Context.

    ``keys``: ``sk``, ``pk`` (PEM); ``peers``: node id -> the public key pinned for it;
    ``pairs``: node id -> the pairwise key (Fernet key, also the pairwise masks' secret);
    ``session``: ``session`` (int), ``stage`` ("", "collecting", "collected",
    "unmasked", "refused"), ``neighbours``, ``digest``, ``own-seed``, ``own-share``.
    """

    def __init__(self, context: Context) -> None:
        self.context = context
        self.keys = _record(context, KEYS_RECORD)
        self.session = _record(context, STATE_RECORD) or {"session": 0, "stage": ""}
        self._peers: dict[str, bytes] | None = None
        self._pairs: dict[str, bytes] | None = None
        self._identities: dict[bytes, str] | None = None

    @property
    def peers(self) -> dict[str, bytes]:
        if self._peers is None:
            self._peers = _record(self.context, PEERS_RECORD)
        return self._peers

    @property
    def pairs(self) -> dict[str, bytes]:
        if self._pairs is None:
            self._pairs = _record(self.context, PAIRS_RECORD)
        return self._pairs

    @property
    def identities(self) -> dict[bytes, str]:
        """Identity (canonical PEM) -> the node id it endorsed (``secagg-trusted-keys``)."""
        if self._identities is None:
            record = _record(self.context, IDENTITIES_RECORD)
            self._identities = {bytes(v): k for k, v in record.items()}
        return self._identities

    def save(self, keys: bool = False, peers: bool = False) -> None:
        """Write the session (always) and, when they changed, the keys and peers back."""
        state = self.context.state
        state[STATE_RECORD] = ConfigRecord(self.session)
        if keys:
            state[KEYS_RECORD] = ConfigRecord(self.keys)
        if peers:
            state[PEERS_RECORD] = ConfigRecord(self.peers)
            state[PAIRS_RECORD] = ConfigRecord(self.pairs)
            if self._identities:
                state[IDENTITIES_RECORD] = ConfigRecord(
                    {node: identity for identity, node in self._identities.items()}
                )


def secure_aggregation_mod(msg: Message, context: Context, call_next: Any) -> Message:
    """Run this node's part of the secure-sum protocol and keep its privacy budget.

    Messages with a ``"secagg"`` ConfigRecord follow the protocol (see the module
    docstring). A differentially private request answered in the clear (e.g. FedSM's
    randomiser without secure aggregation) is answered once per question and charged to the
    node's ledger (:mod:`flower_app.privacy.ledger`). Every other message goes straight to
    the handler.

    Raises
    ------
    NodeRefusedError
        If the request breaks the protocol, was asked before, would pass the node's privacy
        budget, or the node's reply cannot be computed or encoded (the text names the rule
        and public parameters only: Flower returns it to the server).
    """
    if msg.has_error():
        return call_next(msg, context)
    if not isinstance(msg.content.get(SECAGG_RECORD), ConfigRecord):
        if is_private_request(msg.content):
            return _answer_in_clear(msg, context, call_next)
        return call_next(msg, context)
    cfg = dict(msg.content[SECAGG_RECORD])
    stage = str(cfg.get("stage"))
    nid = int(msg.metadata.dst_node_id)
    state = _NodeState(context)
    if stage == "setup":
        reply = _setup(context, nid, state)
    elif stage == "collect":
        return _collect(msg, context, call_next, nid, state, cfg)
    elif stage == "unmask":
        try:
            reply = _unmask(nid, state, cfg)
        except SecureAggregationRefusedError:
            if state.session.get("stage") == "collected":  # a lying server: session burnt
                state.session["stage"] = "refused"
                state.save()
            raise
        book = QuestionBook(context)
        book.close(bytes(state.session.get("question", b"")))
        book.save()
        state.save()
        _drop_cache(context)
    else:
        raise _refuse(f"unknown stage {stage!r}")
    return Message(RecordDict({SECAGG_RECORD: ConfigRecord(reply)}), reply_to=msg)


def _answer_in_clear(msg: Message, context: Context, call_next: Any) -> Message:
    """Answer a private request without secure aggregation: once, within the budget."""
    book = QuestionBook(context)
    question = question_digest(msg.metadata.message_type, msg.content)
    book.admit(question, None, b"")
    book.begin(question, None, b"")  # closed from now on, whatever happens below
    book.save()
    with private_errors("the node's reply"):
        out = call_next(msg, context)
    if out.has_error():
        return _quiet_error(out, msg)
    ledger = PrivacyLedger(context)
    _charge(out.content, ledger)
    out.content[NODE_PRIVACY_RECORD] = ledger.figures()
    return out


def _quiet_error(out: Message, msg: Message) -> Message:
    """Replace an error reply of the handler (or a mod after this one) by one without text.

    Its reason could hold a private value; it stays in the node's log.
    """
    log(WARNING, "the node's handler answered a private request with an error (kept in "
        "this log, not sent): %s", out.error.reason)  # fmt: skip
    reason = (
        f"node refused [computation]: the node's handler answered with an error (code "
        f"{int(out.error.code)}); the node's log has the details"
    )
    return Message(Error(code=int(out.error.code), reason=reason), reply_to=msg)


def _charge(content: RecordDict, ledger: PrivacyLedger) -> None:
    """Take the handler's release declaration out of its reply and charge it to the ledger."""
    with private_errors("reading the reply's dp-release declaration"):
        release = Release.pop_from(content)
    if release is not None:
        ledger.charge(release)


def endorsement_message(run_id: int, node: int, key: bytes) -> bytes:
    """Return what a node's identity key signs: its run key for this run and node id."""
    return b"flower_app secagg run key v1|%d|%d|" % (int(run_id), int(node)) + bytes(key)


def _read_pem(path: Any, what: str) -> bytes:
    try:
        with open(str(path), "rb") as handle:
            return handle.read()
    except OSError as err:
        raise _refuse(f"node_config '{what}' = {path!r} cannot be read ({err})") from None


def _trusted_identities(context: Context) -> set[bytes] | None:
    """Return the identities this node's operator trusts (``secagg-trusted-keys``), or None."""
    path = context.node_config.get(TRUSTED_KEYS)
    if not path:
        return None
    text = _read_pem(path, TRUSTED_KEYS)
    blocks = [b"-----BEGIN PUBLIC KEY-----" + part for part in
              text.split(b"-----BEGIN PUBLIC KEY-----")[1:]]  # fmt: skip
    out: set[bytes] = set()
    for block in blocks:
        try:
            out.add(public_key_to_bytes(bytes_to_public_key(block.strip() + b"\n")))
        except (ValueError, TypeError):
            raise _refuse(f"'{TRUSTED_KEYS}' holds a block that is not a PEM public key") from None
    if not out:
        raise _refuse(f"'{TRUSTED_KEYS}' = {path!r} holds no PEM public key")
    return out


def _setup(context: Context, nid: int, state: _NodeState) -> dict[str, Any]:
    """Make this node's key pair once per run (OS entropy); answer with the public key.

    With ``secagg-identity-key`` in the node_config, the reply also carries the identity's
    public key and its signature over (run, node id, run key), so that nodes trusting the
    identity can tell this node's run key from one the server made up.
    """
    if "sk" not in state.keys:
        sk, pk = generate_key_pairs()
        state.keys = {"sk": private_key_to_bytes(sk), "pk": public_key_to_bytes(pk)}
        path = context.node_config.get(IDENTITY_KEY)
        if path:
            try:
                identity = bytes_to_private_key(_read_pem(path, IDENTITY_KEY))
            except (ValueError, TypeError):
                raise _refuse(f"'{IDENTITY_KEY}' = {path!r} is not a PEM private key") from None
            message = endorsement_message(context.run_id, nid, state.keys["pk"])
            state.keys["identity"] = public_key_to_bytes(identity.public_key())
            state.keys["endorsement"] = sign_message(identity, message)
        state.save(keys=True)
    # how this node checks its neighbours' keys (its operator's choice), for the run's record
    trusts = "endorsed" if context.node_config.get(TRUSTED_KEYS) else "first-use"
    reply: dict[str, Any] = {"pk": state.keys["pk"], "trust": trusts}
    if "identity" in state.keys:
        reply.update(identity=state.keys["identity"], endorsement=state.keys["endorsement"])
    return reply


def _ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _refuse(f"'{what}' must be a list of node ids (str)")
    try:
        out = [int(v) for v in value]
    except ValueError:
        raise _refuse(f"'{what}' holds a value that is not a node id") from None
    if len(set(out)) != len(out):
        raise _refuse(f"'{what}' lists a node twice")
    return out


def _int(cfg: dict[str, Any], key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(f"'{key}' must be an int, got {value!r}")
    return int(value)


def _check_identities(
    context: Context, nid: int, state: _NodeState, cfg: dict[str, Any], new: list[int]
) -> None:
    """Check new neighbours' run keys against the identities this node trusts.

    With ``secagg-trusted-keys``: every new neighbour's run key is endorsed by a trusted
    identity, for this run and its node id, and no identity stands for two nodes.
    """
    trusted = _trusted_identities(context)
    if trusted is None or not new:
        return
    neighbours = [int(n) for n in cfg["neighbours"]]
    identities, endorsements = cfg.get("identities"), cfg.get("endorsements")
    if not isinstance(identities, list) or not isinstance(endorsements, list) or not (
        len(identities) == len(endorsements) == len(neighbours)
    ):
        raise _refuse("this node trusts only endorsed keys, and the request carries none")
    seen = dict(state.identities)
    for node, key, identity, signature in zip(
        neighbours, cfg["keys"], identities, endorsements, strict=True
    ):
        if node not in new:
            continue
        try:
            canonical = public_key_to_bytes(bytes_to_public_key(bytes(identity)))
        except (ValueError, TypeError):
            canonical = b""
        if canonical not in trusted:
            raise _refuse(f"node {node}'s key is not endorsed by an identity this node trusts")
        message = endorsement_message(context.run_id, node, bytes(key))
        if not verify_signature(bytes_to_public_key(canonical), message, bytes(signature)):
            raise _refuse(f"node {node}'s key is not endorsed by the identity given for it")
        if seen.get(canonical, str(node)) != str(node):
            raise _refuse(f"one identity stands for nodes {seen[canonical]} and {node}")
        seen[canonical] = str(node)
    state.identities.update(seen)


def _check_collect(nid: int, state: _NodeState, cfg: dict[str, Any]) -> None:
    """Every check of a collect request before the handler runs (see the module docstring)."""
    if "sk" not in state.keys:
        raise _refuse("this node has no keys for this run (setup missing or its state lost)")
    unknown = set(cfg) - _COLLECT_KEYS - {k for k in cfg if str(k).startswith("transform-")}
    if unknown:
        raise _refuse(f"unexpected fields {sorted(unknown)} in a collect request")
    session = _int(cfg, "session")
    if session <= int(state.session["session"]):
        raise _refuse(
            f"collect for session {session}, but this node already took part in session "
            f"{state.session['session']} (a session is collected once; sessions only increase)"
        )
    announced = _ids(cfg.get("announced"), "announced")
    neighbours = _ids(cfg.get("neighbours"), "neighbours")
    shares, threshold = _int(cfg, "shares"), _int(cfg, "threshold")
    if len(announced) < MIN_NODES:
        raise _refuse(
            f"{len(announced)} nodes announced; a secure sum needs at least {MIN_NODES} (with "
            "two, each node could subtract its own reply from the sum)"
        )
    if nid not in announced or nid not in neighbours:
        raise _refuse(f"this node ({nid}) is not among the announced nodes and its neighbours")
    if not set(neighbours) <= set(announced):
        raise _refuse("the neighbour list names nodes that were not announced")
    if len(neighbours) != shares:
        raise _refuse(
            f"the neighbour list has {len(neighbours)} nodes, the announced neighbourhood "
            f"size is {shares}"
        )
    if shares < MIN_NODES:
        raise _refuse(
            f"a neighbourhood of {shares} nodes; every node masks with at least {MIN_NODES} "
            "(itself included), so that no sum the server can open has fewer"
        )
    if not minimum_threshold(shares) <= threshold <= shares:
        raise _refuse(
            f"threshold {threshold} for {shares} neighbours: it must be a strict majority "
            f"({minimum_threshold(shares)}..{shares}), at least {MIN_THRESHOLD}"
        )
    try:
        ring = ring_neighbours(announced, shares)
    except ValueError as err:
        raise _refuse(str(err)) from None
    if neighbours != ring[nid]:
        raise _refuse(
            "the neighbour list is not this node's place in the ring of the announced nodes "
            "(a ring of the server's making could split the session into small sums)"
        )
    frac = _int(cfg, "frac-bits")
    if not 0 <= frac <= 52:
        raise _refuse(f"frac-bits {frac} outside 0..52")
    if frac + math.ceil(math.log2(len(announced))) > 63 - MIN_RANGE_BITS:
        raise _refuse(
            f"frac-bits {frac} with {len(announced)} nodes leaves each value less than "
            f"+-2^{MIN_RANGE_BITS} (a limit a server could move onto a private value)"
        )
    public = cfg.get("public", [])
    if not isinstance(public, list) or not all(isinstance(k, str) for k in public):
        raise _refuse("'public' must be a list of metric names")
    extra = str(state.context.node_config.get(PUBLIC_METRICS, ""))
    allowed = set(DEFAULT_PUBLIC_METRICS) | {k.strip() for k in extra.split(",") if k.strip()}
    if not set(public) <= allowed:
        raise _refuse(
            f"metrics {sorted(set(public) - allowed)} asked in the clear; this node sends only "
            f"{sorted(allowed)} unmasked (node_config '{PUBLIC_METRICS}' adds names)"
        )
    keys = cfg.get("keys")
    if not isinstance(keys, list) or len(keys) != len(neighbours):
        raise _refuse("'keys' must hold one public key per neighbour")
    if len({bytes(k) for k in keys}) != len(keys):
        raise _refuse("two neighbours were given the same public key")
    pinned = state.peers
    for node, key in zip(neighbours, keys, strict=True):
        if not isinstance(key, bytes):
            raise _refuse(f"the key of node {node} is not bytes")
        known = state.keys["pk"] if node == nid else pinned.get(str(node))
        if known is not None and known != key:
            raise _refuse(
                f"node {node} is announced with another public key than the one this node "
                "saw first in this run (keys are pinned on first use)"
            )
        if known is None:
            try:
                public = bytes_to_public_key(key)
            except (ValueError, TypeError):
                raise _refuse(f"the key of node {node} is not a PEM public key") from None
            if not isinstance(public.curve, ec.SECP384R1):
                raise _refuse(f"the key of node {node} is not on P-384")


def _pin_and_pair_keys(
    nid: int, state: _NodeState, neighbours: list[int], keys: list[bytes]
) -> tuple[dict[int, bytes], bool]:
    """Pin new neighbours' keys (first use); return the pairwise keys and whether any is new."""
    out: dict[int, bytes] = {}
    sk = None
    new = False
    for node, key in zip(neighbours, keys, strict=True):
        if node == nid:
            continue
        if str(node) not in state.pairs:
            sk = sk or cast(ec.EllipticCurvePrivateKey, bytes_to_private_key(state.keys["sk"]))
            state.peers[str(node)] = bytes(key)
            state.pairs[str(node)] = generate_shared_key(sk, bytes_to_public_key(bytes(key)))
            new = True
        out[node] = state.pairs[str(node)]
    return out, new


def _drop_cache(context: Context) -> None:
    for name in (CACHE_RECORD, CACHE_META_RECORD, CACHE_PUBLIC_RECORD):
        if name in context.state:
            del context.state[name]


def _collect(
    msg: Message,
    context: Context,
    call_next: Any,
    nid: int,
    state: _NodeState,
    cfg: dict[str, Any],
) -> Message:
    _check_collect(nid, state, cfg)
    session = int(cfg["session"])
    neighbours = [int(n) for n in cfg["neighbours"]]
    new = [n for n in neighbours if n != nid and str(n) not in state.pairs]
    _check_identities(context, nid, state, cfg, new)
    pair, new_peers = _pin_and_pair_keys(nid, state, neighbours, [bytes(k) for k in cfg["keys"]])
    public_keys = [str(k) for k in cfg.get("public", [])]
    announced = [int(n) for n in cfg["announced"]]
    content = RecordDict(
        {name: rec for name, rec in msg.content.items() if name != SECAGG_RECORD}
    )
    question = question_digest(msg.metadata.message_type, content)
    encoding = _encoding_digest(cfg)
    book = QuestionBook(context)
    # the session is spent from here on: a second collect for it is refused even if the
    # question is refused or the handler fails below
    state.session = {"session": session, "stage": "collecting", "question": question}
    state.save(peers=new_peers)
    if book.admit(question, announced, encoding):
        # a rerun of the question this node answered (another node dropped out): the same
        # answer, noise included, under fresh masks; the handler's side effects not repeated
        cached = context.state.get(CACHE_META_RECORD)
        if not isinstance(cached, ConfigRecord) or bytes(cached["request"]) != question:
            raise SecureAggregationRefusedError(
                "a rerun of a question whose kept answer this node no longer has",
                rule="asked-before",
            )
        book.save()
        vector = context.state[CACHE_RECORD]["encoded"].numpy().copy()
        layout = [str(t) for t in cached["layout"]]
        public = dict(context.state[CACHE_PUBLIC_RECORD])
    else:
        _drop_cache(context)
        book.begin(question, announced, encoding)
        book.save()
        try:
            answer = _answer(msg, context, call_next, content, cfg, public_keys)
        except NodeRefusedError:
            book.close(question)  # refused once, refused for good: no fresh draw later
            book.save()
            raise
        if isinstance(answer, Message):  # the handler answered with an error
            book.close(question)
            book.save()
            return answer
        vector, layout, public = answer
        context.state[CACHE_RECORD] = ArrayRecord({"encoded": Array(vector)})
        context.state[CACHE_META_RECORD] = ConfigRecord({"request": question, "layout": layout})
        context.state[CACHE_PUBLIC_RECORD] = ConfigRecord(public)
    # fresh self-mask seed for this session (OS entropy), shared among the neighbours
    seed = os.urandom(SEED_BYTES)
    masked = vector + mask_stream(seed, vector.size, label=b"self|%d" % session)
    for other in neighbours:
        if other == nid:
            continue
        stream = mask_stream(pair[other], vector.size, label=b"pair|%d" % session)
        masked = masked + stream if nid > other else masked - stream
    threshold = int(cfg["threshold"])
    seed_shares = split_seed(seed, threshold, len(neighbours))
    params = parameters_digest(cfg)
    dsts: list[str] = []
    cts: list[bytes] = []
    own_share = b""
    for idx, other in enumerate(neighbours):
        if other == nid:
            own_share = seed_shares[idx]
            continue
        plaintext = _PLAINTEXT.pack(nid, other, session, params) + seed_shares[idx]
        dsts.append(str(other))
        cts.append(encrypt(pair[other], plaintext))
    state.session.update(
        {"stage": "collected", "neighbours": [str(n) for n in neighbours], "digest": params,
         "own-seed": seed, "own-share": own_share}
    )  # fmt: skip
    state.save()
    reply = RecordDict(
        {
            SECAGG_RECORD: ConfigRecord(
                {"layout": layout, "destinations": dsts, "ciphertexts": cts,
                 "commitment": seed_commitment(seed, nid, session)}
            ),  # fmt: skip
            "secagg-public": ConfigRecord(public),
            "secagg-vector": ArrayRecord({"masked": Array(np.asarray(masked, np.uint64))}),
        }
    )
    ledger = PrivacyLedger(context)
    if ledger.releases or is_private_request(content):
        reply[NODE_PRIVACY_RECORD] = ledger.figures()
    return Message(reply, reply_to=msg)


def _encoding_digest(cfg: dict[str, Any]) -> bytes:
    """Digest of how a session encodes its answer (a rerun must encode it the same way)."""
    transform = sorted((k, repr(v)) for k, v in cfg.items() if str(k).startswith("transform"))
    text = repr((int(cfg["frac-bits"]), list(cfg.get("public", [])), transform))
    return hashlib.sha256(b"flower_app secagg encoding v1|" + text.encode()).digest()


def _answer(
    msg: Message,
    context: Context,
    call_next: Any,
    content: RecordDict,
    cfg: dict[str, Any],
    public_keys: list[str],
) -> tuple[np.ndarray, list[str], dict[str, Any]] | Message:
    """Compute, charge and encode the node's answer to a new question.

    Returns the encoded vector, its layout and the public metrics, or the handler's error
    reply. Every failure is a :class:`NodeRefusedError` whose text holds no private value.
    """
    msg.content = content
    with private_errors("the node's handler"):
        out = call_next(msg, context)
    if out.has_error():
        return _quiet_error(out, msg)
    reply_content = out.content
    with private_errors("reading the reply's dp-release declaration"):
        release = Release.pop_from(reply_content)
    if cfg.get("transform"):  # a reply that is not a sum as it is (e.g. MaxFL plain mode)
        params = {k[len("transform-"):]: v for k, v in cfg.items()
                  if k.startswith("transform-")}  # fmt: skip
        store = _record(context, STORE_RECORD)
        try:
            with private_errors("the reply transform"):
                reply_content = apply_transform(
                    str(cfg["transform"]), content, reply_content, params, store
                )
        finally:  # kept also when refused (e.g. the heat's rows are declared once per run)
            context.state[STORE_RECORD] = ConfigRecord(store)
    with private_errors("encoding the reply"):
        entries = layout_of(reply_content, public_keys)
        vector = encode_reply(entries, int(cfg["frac-bits"]), len(cfg["announced"]))
    if release is not None:  # charged once the answer exists, before anything is sent
        PrivacyLedger(context).charge(release)
    layout = [e.text() for e, _ in entries]
    metrics = reply_content.metric_records.get("metrics")
    public = {k: metrics[k] for k in public_keys if metrics is not None and k in metrics}
    return vector, layout, public


def _unmask(nid: int, state: _NodeState, cfg: dict[str, Any]) -> dict[str, Any]:
    if "sk" not in state.keys:
        raise _refuse("this node has no keys for this run (setup missing or its state lost)")
    unknown = set(cfg) - _UNMASK_KEYS
    if unknown:
        hint = ""
        if {"dead", "active"} & unknown:
            hint = (" (this protocol never reveals anything about a dropped node: a session "
                    "with dropouts is rerun without them)")  # fmt: skip
        raise _refuse(f"unexpected fields {sorted(unknown)} in an unmask request{hint}")
    session = _int(cfg, "session")
    current = state.session
    if session != int(current["session"]) or current.get("stage") != "collected":
        raise _refuse(
            f"unmask for session {session}, but this node's last session is "
            f"{current['session']} ({current.get('stage') or 'nothing collected'}): a session "
            "is unmasked once, only after its collect, and never after a later one began"
        )
    neighbours = [int(n) for n in current["neighbours"]]
    sources = _ids(cfg.get("sources"), "sources")
    cts = cfg.get("ciphertexts")
    if not isinstance(cts, list) or len(cts) != len(sources):
        raise _refuse("'ciphertexts' must hold one ciphertext per source")
    expected = set(neighbours) - {nid}
    missing = sorted(expected - set(sources))
    if missing:
        raise _refuse(
            f"no share from neighbour(s) {missing}: a session is unmasked only when every "
            "announced node submitted (the server reruns a session with dropouts without them)"
        )
    if set(sources) != expected:
        raise _refuse(f"shares from nodes {sorted(set(sources) - expected)}, not neighbours")
    pair = state.pairs
    got: dict[int, bytes] = {}
    for src, ct in zip(sources, cts, strict=True):
        try:
            plaintext = decrypt(pair[str(src)], bytes(ct))
        except Exception:  # noqa: BLE001 - InvalidToken, bad base64, wrong type
            raise _refuse(f"the share from node {src} does not decrypt (pair key)") from None
        if len(plaintext) <= _PLAINTEXT.size:
            raise _refuse(f"the share from node {src} is malformed")
        actual, dst, their_session, digest = _PLAINTEXT.unpack(plaintext[: _PLAINTEXT.size])
        if (actual, dst, their_session) != (src, nid, session):
            raise _refuse(
                f"a share from {actual} to {dst} for session {their_session} relayed as from "
                f"{src} to {nid} for session {session}"
            )
        if digest != bytes(current["digest"]):
            raise _refuse(
                f"node {src} was told another session (parameters or announced nodes) than "
                "this node"
            )
        got[src] = plaintext[_PLAINTEXT.size :]
    nodes = [str(nid)] + [str(n) for n in sorted(got)]
    shares = [bytes(current["own-share"])] + [got[n] for n in sorted(got)]
    seed = bytes(current["own-seed"])
    # spent: never answered again
    current.update({"stage": "unmasked", "own-seed": b"", "own-share": b""})
    return {"nodes": nodes, "shares": shares, "seed": seed}
