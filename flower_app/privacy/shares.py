"""Shamir shares of a session's self-mask seed, and the seed's commitment.

A self-mask seed is 16 bytes (128 bits) of OS entropy, shared with pycryptodome's
``Shamir`` (GF(2^128), no ``ssss`` tweak) — the primitive Flower's own
``flwr.common.secure_aggregation.crypto.shamir.create_shares`` / ``combine_shares`` wrap.
Those wrappers PKCS#7-pad a secret to whole 16-byte chunks (a 16-byte seed becomes two
chunks) and start a thread pool per call; the server rebuilds one seed per node per round,
so the seed is shared here as the one 16-byte block it is, with the same library call.

A share travels as 2 bytes of its index (1-based, big-endian) and the 16 bytes of its value.
The commitment ``SHA-256(context, node, session, seed)`` sent with the masked vector lets the
server check a rebuilt seed: a wrong share (a node that lies in ``unmask``) makes the rebuilt
seed fail it, and the server then looks for a subset of shares that passes.
"""

from __future__ import annotations

import hashlib
import struct

from Crypto.Protocol.SecretSharing import Shamir

__all__ = ["SEED_BYTES", "SHARE_BYTES", "combine_seed", "seed_commitment", "share_index",
           "split_seed"]  # fmt: skip

SEED_BYTES = 16
SHARE_BYTES = 2 + 16
_INDEX = struct.Struct(">H")


def split_seed(seed: bytes, threshold: int, count: int) -> list[bytes]:
    """Return ``count`` shares of a 16-byte seed, any ``threshold`` of which rebuild it."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a seed is {SEED_BYTES} bytes, got {len(seed)}")
    if not 1 <= threshold <= count <= 0xFFFF:
        raise ValueError(f"threshold {threshold} of {count} shares")
    return [_INDEX.pack(idx) + value for idx, value in Shamir.split(threshold, count, seed)]


def share_index(share: bytes) -> int:
    """Return a share's 1-based index (ValueError if it is not a share)."""
    if not isinstance(share, bytes) or len(share) != SHARE_BYTES:
        raise ValueError(f"a share is {SHARE_BYTES} bytes")
    return int(_INDEX.unpack(share[:2])[0])


def combine_seed(shares: list[bytes]) -> bytes:
    """Rebuild a seed from exactly ``threshold`` shares with distinct indices."""
    return bytes(Shamir.combine([(share_index(s), s[2:]) for s in shares]))


def seed_commitment(seed: bytes, node: int, session: int) -> bytes:
    """Return the commitment to a node's seed of a session (SHA-256)."""
    return hashlib.sha256(
        b"flower_app secagg seed v2|%d|%d|" % (int(node), int(session)) + seed
    ).digest()
