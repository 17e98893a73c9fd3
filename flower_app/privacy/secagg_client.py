"""The node's side of secure aggregation: a Flower mod for any ClientApp.

Add it to a ClientApp (``ClientApp(mods=[secure_aggregation_mod])``; this package's own
ClientApp has it) and every strategy of :mod:`flower_app.strategies` built with
``secure_aggregation=SecureAggregation()`` can sum the node's replies without seeing them.
The mod is a no-op for every message without a ``"secagg"`` ConfigRecord, so it costs
nothing when secure aggregation is off.

The protocol is SecAgg+ (Bell et al., CCS 2020) as Flower's ``secaggplus_mod`` runs it,
on Flower's primitives (key pairs, ECDH + HKDF shared keys, Fernet encryption, Shamir
sharing); the four stages arrive as messages of the same type as the round's train
message, each carrying ``"secagg"`` with a ``stage``:

=================  =================================================  ====================
stage              request ``"secagg"``                               reply ``"secagg"``
=================  =================================================  ====================
``setup``          ``clients``, ``shares``, ``threshold``,            ``pk1``, ``pk2``
                   ``frac-bits``, ``public`` (metric keys sent        bytes
                   in the clear)
``share-keys``     ``nodes`` (str ids), ``pk1``, ``pk2`` (bytes        ``destinations``,
                   lists): the neighbours' public keys                 ``ciphertexts``
``collect``        the round's train content, plus ``sources``,       ``layout`` (str list);
                   ``ciphertexts`` (the shares sent to this node)     ``"secagg-vector"``
                                                                      ``masked`` uint64;
                                                                      ``"secagg-public"``
``unmask``         ``active``, ``dead`` (str ids)                     ``nodes``, ``shares``
=================  =================================================  ====================

In ``collect`` the mod calls the node's own handler, encodes its reply (every array and
metric except the public ones, see :mod:`flower_app.privacy.fixed_point`), adds its
private mask and the pairwise masks, and sends only the masked vector and the layout
(names, shapes, whether real or integer: the same on every node).

Why not Flower's ``secaggplus_mod``: it acts only on messages of type exactly ``train``
(this package's strategies send named actions and ``query``-style exchanges), sums only a
legacy ``FitRes`` (parameters weighted by ``num-examples``, no metrics, clipped to a
symmetric range), and its masks come from a 32-bit-seeded ``RandomState``.
"""

from __future__ import annotations

import os
from typing import Any, cast

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    decrypt,
    encrypt,
    generate_shared_key,
)
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from flower_app.privacy.fixed_point import encode_reply, layout_of, mask_stream
from flower_app.privacy.transforms import apply_transform

__all__ = ["SECAGG_RECORD", "secure_aggregation_mod"]

#: the ConfigRecord that marks a secure-aggregation message (request and reply)
SECAGG_RECORD = "secagg"
STATE_RECORD = "secagg-state"
#: what reply transforms keep on the node between rounds (e.g. FedSubAvg's declared rows)
STORE_RECORD = "secagg-store"


def _load(context: Context) -> dict[str, Any]:
    if STATE_RECORD not in context.state.config_records:
        return {}
    return dict(context.state.config_records[STATE_RECORD])


def _save(context: Context, state: dict[str, Any]) -> None:
    context.state.config_records[STATE_RECORD] = ConfigRecord(state)


def _require(state: dict[str, Any], stage: str, server_round: Any) -> None:
    if state.get("round") != server_round:
        raise ValueError(
            f"secure aggregation: '{stage}' for round {server_round!r} but this node's "
            f"protocol state is for round {state.get('round')!r} (setup missing or lost)"
        )


def secure_aggregation_mod(msg: Message, context: Context, call_next: Any) -> Message:
    """Run this node's part of the secure-sum protocol (see the module docstring).

    Messages without a ``"secagg"`` ConfigRecord go straight to the handler.
    """
    if msg.has_error() or SECAGG_RECORD not in msg.content.config_records:
        return call_next(msg, context)
    cfg = dict(msg.content.config_records[SECAGG_RECORD])
    stage = str(cfg.get("stage"))
    server_round = cfg.get("round")
    nid = int(msg.metadata.dst_node_id)
    if stage == "setup":
        state, reply = _setup(nid, cfg)
    elif stage == "share-keys":
        state = _load(context)
        _require(state, stage, server_round)
        reply = _share_keys(nid, state, cfg)
    elif stage == "collect":
        state = _load(context)
        _require(state, stage, server_round)
        return _collect(msg, context, call_next, nid, state, cfg)
    elif stage == "unmask":
        state = _load(context)
        _require(state, stage, server_round)
        reply = _unmask(state, cfg)
    else:
        raise ValueError(f"secure aggregation: unknown stage {stage!r}")
    _save(context, state)
    return Message(RecordDict({SECAGG_RECORD: ConfigRecord(reply)}), reply_to=msg)


def _setup(nid: int, cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    sk1, pk1 = generate_key_pairs()
    sk2, pk2 = generate_key_pairs()
    state = {
        "round": cfg["round"],
        "nid": str(nid),
        "clients": int(cfg["clients"]),
        "shares": int(cfg["shares"]),
        "threshold": int(cfg["threshold"]),
        "frac-bits": int(cfg["frac-bits"]),
        "public": list(cfg.get("public", [])),
        "sk1": private_key_to_bytes(sk1),
        "pk1": public_key_to_bytes(pk1),
        "sk2": private_key_to_bytes(sk2),
        "pk2": public_key_to_bytes(pk2),
    }
    return state, {"pk1": state["pk1"], "pk2": state["pk2"]}


def _share_keys(nid: int, state: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    nodes = [int(n) for n in cast(list[str], cfg["nodes"])]
    pk1s, pk2s = cast(list[bytes], cfg["pk1"]), cast(list[bytes], cfg["pk2"])
    if len(nodes) < state["threshold"]:
        raise ValueError(
            f"secure aggregation: {len(nodes)} neighbours, fewer than the threshold "
            f"{state['threshold']}"
        )
    if len(set(pk1s) | set(pk2s)) != 2 * len(nodes):
        raise ValueError("secure aggregation: some public keys are identical")
    own = nodes.index(nid)
    if pk1s[own] != state["pk1"] or pk2s[own] != state["pk2"]:
        raise ValueError("secure aggregation: the server relayed wrong keys for this node")
    seed = os.urandom(32)
    seed_shares = create_shares(seed, state["threshold"], len(nodes))
    # the raw private scalar (48 bytes on P-384), not the 306-byte PEM: 4 Shamir chunks
    # instead of 20, the server's key rebuild is ec.derive_private_key (cryptography)
    sk1_shares = create_shares(_scalar(state["sk1"]), state["threshold"], len(nodes))
    sk2 = bytes_to_private_key(state["sk2"])
    dsts: list[str] = []
    cts: list[bytes] = []
    share_nodes: list[str] = []
    seed_kept: list[bytes] = []
    sk1_kept: list[bytes] = []
    for idx, node in enumerate(nodes):
        if node == nid:
            share_nodes.append(str(nid))
            seed_kept.append(seed_shares[idx])
            sk1_kept.append(sk1_shares[idx])
            continue
        key = generate_shared_key(sk2, bytes_to_public_key(pk2s[idx]))
        plaintext = share_keys_plaintext_concat(nid, node, seed_shares[idx], sk1_shares[idx])
        dsts.append(str(node))
        cts.append(encrypt(key, plaintext))
    state.update(
        {
            "seed": seed,
            "neighbours": [str(n) for n in nodes],
            "neighbour-pk1": list(pk1s),
            "neighbour-pk2": list(pk2s),
            "share-nodes": share_nodes,
            "seed-shares": seed_kept,
            "sk1-shares": sk1_kept,
        }
    )
    return {"destinations": dsts, "ciphertexts": cts}


def _scalar(private_key: bytes) -> bytes:
    """Return a private key's scalar as big-endian bytes of the curve's size."""
    key = bytes_to_private_key(private_key)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    size = (key.curve.key_size + 7) // 8
    return key.private_numbers().private_value.to_bytes(size, "big")


def _collect(
    msg: Message,
    context: Context,
    call_next: Any,
    nid: int,
    state: dict[str, Any],
    cfg: dict[str, Any],
) -> Message:
    srcs = [int(s) for s in cast(list[str], cfg["sources"])]
    cts = cast(list[bytes], cfg["ciphertexts"])
    if len(srcs) + 1 < state["threshold"]:
        raise ValueError("secure aggregation: fewer neighbours left than the threshold")
    neighbours = [int(n) for n in state["neighbours"]]
    pk2 = dict(zip(neighbours, state["neighbour-pk2"], strict=True))
    sk2 = bytes_to_private_key(state["sk2"])
    share_nodes = list(state["share-nodes"])
    seed_shares, sk1_shares = list(state["seed-shares"]), list(state["sk1-shares"])
    for src, ct in zip(srcs, cts, strict=True):
        if src not in pk2:
            raise ValueError(f"secure aggregation: a share from node {src}, not a neighbour")
        plaintext = decrypt(generate_shared_key(sk2, bytes_to_public_key(pk2[src])), ct)
        actual, dst, seed_share, sk1_share = share_keys_plaintext_separate(plaintext)
        if actual != src or dst != nid:
            raise ValueError(f"secure aggregation: share from {actual} to {dst} relayed as "
                             f"from {src} to {nid}")  # fmt: skip
        share_nodes.append(str(src))
        seed_shares.append(seed_share)
        sk1_shares.append(sk1_share)
    state.update(
        {"share-nodes": share_nodes, "seed-shares": seed_shares, "sk1-shares": sk1_shares,
         "masked-with": [str(s) for s in srcs]}
    )  # fmt: skip
    # the node's own reply, computed by its handler from the round's request
    content = RecordDict(
        {name: rec for name, rec in msg.content.items() if name != SECAGG_RECORD}
    )
    msg.content = content
    out = call_next(msg, context)
    if out.has_error():
        _save(context, state)
        return out
    reply_content = out.content
    if cfg.get("transform"):  # a reply that is not a sum as it is (e.g. MaxFL's plain mode)
        params = {k[len("transform-"):]: v for k, v in cfg.items() if k.startswith("transform-")}
        store = dict(context.state.config_records.get(STORE_RECORD, ConfigRecord()))
        reply_content = apply_transform(
            str(cfg["transform"]), content, out.content, params, store
        )
        context.state.config_records[STORE_RECORD] = ConfigRecord(store)
    entries = layout_of(reply_content, state["public"])
    vector = encode_reply(entries, state["frac-bits"], state["clients"])
    vector = vector + mask_stream(state["seed"], vector.size)
    sk1 = bytes_to_private_key(state["sk1"])
    pk1 = dict(zip(neighbours, state["neighbour-pk1"], strict=True))
    for src in srcs:
        pair = mask_stream(generate_shared_key(sk1, bytes_to_public_key(pk1[src])), vector.size)
        vector = vector + pair if nid > src else vector - pair
    metrics = reply_content.metric_records.get("metrics")
    public = {k: metrics[k] for k in state["public"] if metrics is not None and k in metrics}
    _save(context, state)
    reply = RecordDict(
        {
            SECAGG_RECORD: ConfigRecord({"layout": [e.text() for e, _ in entries]}),
            "secagg-public": ConfigRecord(public),
            "secagg-vector": ArrayRecord({"masked": Array(np.asarray(vector, np.uint64))}),
        }
    )
    return Message(reply, reply_to=msg)


def _unmask(state: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    active = [str(n) for n in cast(list[str], cfg["active"])]
    dead = [str(n) for n in cast(list[str], cfg["dead"])]
    if len(active) < state["threshold"]:
        raise ValueError("secure aggregation: fewer active neighbours than the threshold")
    index = {n: i for i, n in enumerate(state["share-nodes"])}
    unknown = [n for n in active + dead if n not in index]
    if unknown:
        raise ValueError(f"secure aggregation: no shares held for nodes {unknown}")
    overlap = set(active) & set(dead)
    if overlap:
        raise ValueError(f"secure aggregation: nodes {sorted(overlap)} both active and dead")
    shares = [state["seed-shares"][index[n]] for n in active]
    shares += [state["sk1-shares"][index[n]] for n in dead]
    state["round"] = -1  # one unmask per round: the shares of this round are spent
    return {"nodes": active + dead, "shares": shares}
