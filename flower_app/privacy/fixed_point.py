"""Replies as one vector of integers modulo 2^64, and the masks that hide them.

Secure aggregation sums integers in a finite group. Here the group is Z/2^64 (numpy
``uint64`` arithmetic wraps exactly there), and a reply's arrays and metrics become one
vector of it:

* integer entries (dtype kind ``i``/``u``/``b``, Python ints) are sent as they are (two's
  complement): their sum is **exact**;
* real entries are sent as fixed-point numbers ``round(v · 2^f)`` with ``f = frac_bits``:
  each client's value is off by at most ``2^-(f+1)``, so a sum over n clients is off by at
  most ``n · 2^-(f+1)`` (default f = 24: 3·10⁻⁸ per client). A real value that is an
  integer times ``2^-f`` (e.g. FedSM's marginal gains on integer ratings) is exact too.

The sum is correct as long as every partial sum stays inside ±2^63 in fixed point: each
client checks ``|v| · 2^f < 2^63 / n`` for its own entries (n = clients in the round) and
refuses to encode otherwise, naming the entry (never the value: the refusal goes back to
the server). A node also refuses parameters that would leave each value a range smaller than
±2^:data:`MIN_RANGE_BITS`: by choosing the fractional bits a server could otherwise move the
limit onto a private value and read, from refusing or not, on which side of it the value
lies.

Masks are streams of uniform ``uint64`` from AES-256 in counter mode (the ``cryptography``
package Flower depends on), keyed by HKDF-SHA256 of the secret (a node's self-mask seed or a
pair's shared key) with a label that names the mask's kind and session: one pairwise key
gives an independent mask for every session, and a mask of one session tells nothing about
another's (HKDF as a pseudo-random function). Flower's own ``pseudo_rand_gen`` seeds a
32-bit ``RandomState`` (2^32 keys, which an observer can search) and draws below a modulus
< 2^63, so it is not used.

Integer entries must lie in the signed 64-bit range the sum is decoded in: an unsigned
entry ≥ 2^63 (or a Python int beyond int64) is refused by name, never wrapped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from flower_app.privacy.refusals import NodeRefusedError

__all__ = [
    "MIN_RANGE_BITS",
    "Entry",
    "decode_sum",
    "encode_reply",
    "layout_of",
    "mask_stream",
]

_MASK_CONTEXT = b"flower_app secure aggregation mask v2|"
#: a node refuses fractional bits f with n nodes unless every value keeps a range of at
#: least ±2^MIN_RANGE_BITS: f + ⌈log₂ n⌉ ≤ 63 − MIN_RANGE_BITS
MIN_RANGE_BITS = 20


def mask_stream(secret: bytes, size: int, label: bytes = b"") -> np.ndarray:
    """Return ``size`` uniform uint64 values derived from ``secret`` (AES-256-CTR).

    Parameters
    ----------
    secret : bytes
        A node's self-mask seed or a shared pairwise key (any length).
    size : int
        Number of values.
    label : bytes, optional
        What the mask is for (e.g. ``b"pair|<session>"``): the AES key is
        HKDF-SHA256(secret, info = context + label), so each label gives an independent
        stream from the same secret.

    Returns
    -------
    numpy.ndarray
        uint64 (size,), the same for the same secret and label on every machine.
    """
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
               info=_MASK_CONTEXT + bytes(label)).derive(bytes(secret))  # fmt: skip
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * int(size))), dtype="<u8").astype(np.uint64)


@dataclass(frozen=True)
class Entry:
    """One array or metric of a reply, as it lies in the summed vector.

    Attributes
    ----------
    kind : str
        ``"array"`` or ``"metric"``.
    record : str
        Name of the ArrayRecord / MetricRecord in the reply.
    key : str
        Key inside the record.
    real : bool
        Fixed point (True) or exact integer (False).
    shape : tuple of int
        Array shape; ``()`` for a scalar metric, ``(n,)`` for a list metric.
    is_list : bool
        A metric given as a list.
    """

    kind: str
    record: str
    key: str
    real: bool
    shape: tuple[int, ...]
    is_list: bool = False

    @property
    def size(self) -> int:
        """Number of vector positions the entry takes."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def text(self) -> str:
        """Return the entry as one line (what travels in the clear)."""
        shape = "x".join(str(s) for s in self.shape)
        return "|".join(
            [self.kind, self.record, self.key, "f" if self.real else "i", shape,
             "l" if self.is_list else "s"]
        )  # fmt: skip

    @staticmethod
    def parse(text: str) -> Entry:
        """Inverse of :meth:`text`."""
        kind, record, key, real, shape, lst = text.split("|")
        dims = tuple(int(s) for s in shape.split("x")) if shape else ()
        return Entry(kind, record, key, real == "f", dims, lst == "l")


def _metric_entry(record: str, key: str, value: Any) -> tuple[Entry, np.ndarray]:
    if isinstance(value, list):
        arr = np.asarray(value)
        real = arr.dtype.kind == "f" or any(isinstance(v, float) for v in value)
        return Entry("metric", record, key, real, (len(value),), True), arr
    real = isinstance(value, float)
    return Entry("metric", record, key, real, ()), np.asarray(value)


def layout_of(content: RecordDict, public: Iterable[str] = ()) -> list[tuple[Entry, np.ndarray]]:
    """Return the summable entries of a reply with their values, in a fixed order.

    Arrays of every ArrayRecord (records by name, keys in record order), then the
    metrics of every MetricRecord except the ``public`` keys of ``"metrics"``.

    Raises
    ------
    NodeRefusedError
        (rule ``encoding``) If the reply holds a ConfigRecord (which cannot be summed) or a
        non-numeric array.
    """
    # one pass over the records (RecordDict's typed views copy the dict on every access)
    records = dict(content.items())
    configs = sorted(n for n, r in records.items() if isinstance(r, ConfigRecord))
    if configs:
        raise NodeRefusedError(
            "encoding",
            f"secure aggregation sums arrays and metrics; the reply has ConfigRecord(s) "
            f"{configs}, which cannot be summed",
        )
    public = set(public)
    out: list[tuple[Entry, np.ndarray]] = []
    for name in sorted(n for n, r in records.items() if isinstance(r, ArrayRecord)):
        for key, array in records[name].items():
            a = array.numpy()
            if a.dtype.kind not in "biuf":
                raise NodeRefusedError(
                    "encoding", f"array '{name}/{key}' has dtype {a.dtype}: not a number"
                )
            out.append((Entry("array", name, key, a.dtype.kind == "f", tuple(a.shape)), a))
    for name in sorted(n for n, r in records.items() if isinstance(r, MetricRecord)):
        for key, value in records[name].items():
            if name == "metrics" and key in public:
                continue
            out.append(_metric_entry(name, key, value))
    return out


def encode_reply(
    entries: list[tuple[Entry, np.ndarray]], frac_bits: int, clients: int
) -> np.ndarray:
    """Encode a reply's entries as one uint64 vector (fixed point for reals).

    Parameters
    ----------
    entries : list
        From :func:`layout_of`.
    frac_bits : int
        Fractional bits f of the fixed-point reals.
    clients : int
        Clients summed in the round (bounds each value so the sum cannot overflow).

    Raises
    ------
    NodeRefusedError
        (rule ``encoding``) A non-finite value, an integer outside the signed 64-bit range
        (e.g. a uint64 ≥ 2^63), or a value too large to be summed over ``clients``
        clients. The message names the entry and the limit, never the value: the text goes
        back to the server.
    """
    limit = float(2**63) / max(int(clients), 1)
    parts = []
    for entry, value in entries:
        flat = np.asarray(value).reshape(-1)
        where = f"{entry.kind} '{entry.record}/{entry.key}'"
        if entry.real:
            x = flat.astype(np.float64)
            if not np.all(np.isfinite(x)):
                raise NodeRefusedError("encoding", f"{where} has a non-finite value")
            scaled = np.rint(x * float(2**frac_bits))
            if scaled.size and float(np.max(np.abs(scaled))) >= limit:
                raise NodeRefusedError(
                    "encoding",
                    f"{where} has a value too large to sum {clients} clients at {frac_bits} "
                    "fractional bits (lower secagg-frac-bits)",
                )
            parts.append(scaled.astype(np.int64).view(np.uint64))
        else:
            parts.append(_encode_integers(flat, where, clients).view(np.uint64))
    if not parts:
        return np.zeros(0, np.uint64)
    return np.concatenate(parts)


def _encode_integers(flat: np.ndarray, where: str, clients: int) -> np.ndarray:
    """Return integer entries as int64, refusing (never wrapping) what does not fit."""
    bound = (2**63 - 1) // max(int(clients), 1)  # n values of at most this sum in int64
    if flat.size == 0:
        return np.zeros(0, np.int64)
    if flat.dtype.kind == "O":  # Python ints too large for any numpy integer type
        values = [int(v) for v in flat]
        lo, hi = min(values), max(values)
    else:
        lo, hi = int(flat.min()), int(flat.max())
    if lo < -(2**63) or hi >= 2**63:
        raise NodeRefusedError(
            "encoding",
            f"{where} holds a value outside the signed 64-bit range the sum is decoded in "
            "(it would wrap): send it as int64 or as a real",
        )
    if max(hi, -lo) > bound:
        raise NodeRefusedError(
            "encoding",
            f"{where} holds a value too large to sum {clients} clients in 64 bits (at most "
            f"{bound} in absolute value)",
        )
    return flat.astype(np.int64)


def decode_sum(
    total: np.ndarray, entries: list[Entry], frac_bits: int, public: Mapping[str, Any]
) -> RecordDict:
    """Turn the unmasked sum back into a reply: summed arrays (float64 / int64) and metrics.

    ``public`` metrics (sent in the clear, equal on every node) go back into ``"metrics"``.
    """
    signed = np.asarray(total, dtype=np.uint64).view(np.int64)
    arrays: dict[str, dict[str, Array]] = {}
    metrics: dict[str, dict[str, Any]] = {}
    pos = 0
    scale = float(2**frac_bits)
    for entry in entries:
        part = signed[pos : pos + entry.size]
        pos += entry.size
        value: Any = part.astype(np.float64) / scale if entry.real else part.copy()
        if entry.kind == "array":
            arrays.setdefault(entry.record, {})[entry.key] = Array(value.reshape(entry.shape))
        else:
            cast = float if entry.real else int
            metrics.setdefault(entry.record, {})[entry.key] = (
                [cast(v) for v in value] if entry.is_list else cast(value[0])
            )
    if pos != total.size:
        raise ValueError(f"the summed vector has {total.size} values, the layout {pos}")
    if public:
        metrics.setdefault("metrics", {}).update(public)
    content = RecordDict()
    for name, values in arrays.items():
        content[name] = ArrayRecord(values)
    for name, values in metrics.items():
        content[name] = MetricRecord(values)
    return content
