"""A run's checkpoint as plain data: numpy arrays and one JSON document, read without running code.

A checkpoint file (the run folder's ``checkpoint.npz``) is a zip archive in numpy's ``.npz``
layout: one ``a<i>.npy`` member per array (written and read with ``allow_pickle=False``) and
one member ``checkpoint.json``, the document::

    {"format": "flower_app-checkpoint", "version": 1, "flower_app": "<version>", "root": ...}

``root`` describes the stored value. JSON strings, booleans, ``null`` and arrays stand for
themselves (a JSON array is a Python list); a JSON number is an int if it has no fraction
or exponent, else a float. Everything else is a JSON object whose ``"$"`` member is a tag:

==================  ====================================================================
``int``             an int beyond ±2⁵³ (``"hex"``: e.g. node ids, generator states)
``float``           ``nan``, ``inf`` or ``-inf`` (``"v"``)
``complex``         ``"re"`` and ``"im"``
``bytes``           ``"b64"``: base64
``tuple``           ``"v"``: the items
``list``            ``"v"``: a list that is referenced more than once (it carries ``"id"``)
``dict``            ``"v"``: an object of its str keys, or ``"items"``: [key, value] pairs
``set``             ``"v"``: the items in iteration order (``frozenset`` likewise)
``ndarray``         ``"array"``: the npz member (``a3`` is ``a3.npy``)
``np.scalar``       ``"dtype"`` and ``"v"`` (bool, int, float); other kinds: ``"array"``
``np.Generator``    ``"bit_generator"``: an ``np.BitGenerator`` node
``np.BitGenerator`` ``"kind"`` (PCG64, PCG64DXSM, MT19937, Philox, SFC64), ``"state"`` and
                    ``"seed_seq"`` (its SeedSequence's entropy, spawn key, pool size and
                    children spawned)
``random.Random``   ``"state"``: ``getstate()``
``object``          ``"type"``: a registered type's name (:func:`register_type`), ``"v"``:
                    what its ``to_plain`` returned
``ref``             ``"id"``: the same object as the earlier node with that ``"id"``
==================  ====================================================================

A mutable object (list, dict, set, array, generator, registered object) referenced more than
once in the stored value carries an ``"id"`` at its first node, and is a ``ref`` after that:
a restored value shares what the saved one shared (e.g. a FedSM run's generator is its
inner server's). A cycle is refused when writing.

Objects that are not plain data are stored only if their exact type is registered: a name
(not a module path) with a ``to_plain``/``from_plain`` pair. The types of flower_app's own
server states are listed in :mod:`flower_app.checkpoint_types`, by family (``fedsm.*``,
``maxfl.*``, ...): a name of a known family loads that family's entries (imports of
flower_app's own modules, written in that list), any other name is unknown. Reading never
imports a module the file names, never evaluates anything from it and never unpickles: an
unknown tag or type name, an object array, a compressed member, a file of another format or
of a newer version, a truncated or corrupt archive, all raise :class:`CheckpointError`
naming the file and what is wrong.

Writing (:func:`write_checkpoint`) encodes the whole value first (an unstorable value leaves
the previous checkpoint as it was), writes a temporary file beside the target, optionally
``fsync``s it and renames it over the target: a reader sees the old checkpoint or the new
one, never a part.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import importlib.metadata
import io
import json
import math
import random
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from flower_app.files import atomic_file

__all__ = [
    "DOCUMENT",
    "FORMAT",
    "VERSION",
    "CheckpointError",
    "CheckpointType",
    "attribute_type",
    "decode",
    "dumps",
    "encode",
    "loads",
    "read_checkpoint",
    "register_type",
    "write_checkpoint",
]

#: the document's ``"format"``
FORMAT = "flower_app-checkpoint"
#: the document's ``"version"``: this module writes it and reads it and every older one
VERSION = 1
#: the archive member holding the JSON document
DOCUMENT = "checkpoint.json"
#: ints up to this magnitude are JSON numbers (exact in every JSON reader); larger: tagged
_JSON_INT = 2**53
#: the bit generators a checkpoint may hold, by the name it stores
_BIT_GENERATORS: dict[str, type[np.random.BitGenerator]] = {
    "PCG64": np.random.PCG64,
    "PCG64DXSM": np.random.PCG64DXSM,
    "MT19937": np.random.MT19937,
    "Philox": np.random.Philox,
    "SFC64": np.random.SFC64,
}
_ARRAY_NAME = re.compile(r"a[0-9]+")
#: how a zip archive (an npz) starts
_ZIP_MAGIC = b"PK\x03\x04"
#: how members are stored (as they are, as ``numpy.savez`` does)
_STORED = zipfile.ZIP_STORED
#: a fixed member time: the same value gives the same bytes
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class CheckpointError(ValueError):
    """A checkpoint file cannot be read: its name and what is wrong are in the message.

    Parameters
    ----------
    message : str
        The message (it starts with the file's name).
    kind : str
        ``"unreadable"`` (truncated or corrupt: e.g. it never reached the disk),
        ``"foreign"`` (not a flower_app checkpoint, e.g. an older version's pickle),
        ``"newer"`` (a newer format version) or ``"invalid"`` (an unknown tag or type, or
        content that does not fit its type).
    """

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class CheckpointType:
    """A type a checkpoint may hold, stored as plain data under a name.

    Parameters
    ----------
    name : str
        The name stored in the file (stable across module moves; not a module path).
    cls : type
        The class; only instances of exactly this class are stored under ``name``.
    to_plain : callable
        ``to_plain(obj)``: plain data (anything this module stores, registered objects
        included) that ``from_plain`` rebuilds ``obj`` from.
    from_plain : callable
        ``from_plain(plain) -> obj``; raises ``ValueError`` or ``TypeError`` on plain data
        it cannot rebuild from.
    """

    name: str
    cls: type
    to_plain: Callable[[Any], Any]
    from_plain: Callable[[Any], Any]


_BY_NAME: dict[str, CheckpointType] = {}
_BY_CLASS: dict[type, CheckpointType] = {}
_FAMILIES_LOADED: set[str] = set()


def register_type(entry: CheckpointType) -> None:
    """Let checkpoints hold instances of ``entry.cls`` (e.g. an own strategy's state).

    Parameters
    ----------
    entry : CheckpointType
        The name, class and conversions. Registering the same entry again does nothing.

    Raises
    ------
    ValueError
        If the name or the class is registered already with another entry (flower_app's
        own types included).
    """
    _lookup_name(entry.name)
    _lookup_class(entry.cls)
    old = _BY_NAME.get(entry.name) or _BY_CLASS.get(entry.cls)
    if old is not None and old != entry:
        raise ValueError(
            f"checkpoint type {entry.name!r} ({entry.cls.__qualname__}) clashes with the "
            f"registered {old.name!r} ({old.cls.__qualname__})"
        )
    _BY_NAME[entry.name] = entry
    _BY_CLASS[entry.cls] = entry


def _load_family(family: str) -> None:
    """Register one family of flower_app's own types (imports only that family's modules)."""
    if family in _FAMILIES_LOADED:
        return
    _FAMILIES_LOADED.add(family)
    from flower_app.checkpoint_types import FAMILIES

    for entry in FAMILIES[family][1]():
        _BY_NAME.setdefault(entry.name, entry)
        _BY_CLASS.setdefault(entry.cls, entry)


def _lookup_class(cls: type) -> CheckpointType | None:
    """Return the entry of exactly ``cls``, loading the flower_app family it belongs to."""
    entry = _BY_CLASS.get(cls)
    if entry is None:
        from flower_app.checkpoint_types import FAMILIES

        for family, (package, _) in FAMILIES.items():
            if cls.__module__ == package or cls.__module__.startswith(package + "."):
                _load_family(family)
                return _BY_CLASS.get(cls)
    return entry


def _lookup_name(name: str) -> CheckpointType | None:
    """Return the entry stored as ``name``, loading the flower_app family it names."""
    entry = _BY_NAME.get(name)
    if entry is None:
        from flower_app.checkpoint_types import FAMILIES

        family = name.split(".", 1)[0]
        if family in FAMILIES:
            _load_family(family)
            return _BY_NAME.get(name)
    return entry


def attribute_type(name: str, cls: type) -> CheckpointType:
    """Return a :class:`CheckpointType` that stores an object as its attributes.

    ``to_plain`` is the object's ``__dict__`` (every attribute, each stored as plain data or
    as a registered object); ``from_plain`` makes an instance without calling ``__init__``
    and sets those attributes, so the object is exactly the one saved (generators, counters
    and caches included). For a dataclass, every field without a plain default (those may
    live on the class only) must be in the stored attributes: a checkpoint of a version
    whose fields differ is refused by name.

    Parameters
    ----------
    name : str
        The stored name.
    cls : type
        The class (with a ``__dict__``; ``__init__`` is not called when reading).

    Returns
    -------
    CheckpointType
        The entry, for :func:`register_type`.
    """
    required = [  # a field with a plain default may live on the class only (init=False)
        f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
    ] if dataclasses.is_dataclass(cls) else []  # fmt: skip

    def to_plain(obj: Any) -> dict[str, Any]:
        return dict(vars(obj))

    def from_plain(plain: Any) -> Any:
        if type(plain) is not dict or not all(
            type(k) is str and k.isidentifier() and not k.startswith("__") for k in plain
        ):
            raise TypeError(f"expected a dict of {cls.__name__}'s attribute names")
        missing = [f for f in required if f not in plain]
        if missing:
            raise ValueError(
                f"{cls.__name__}'s fields {missing} are missing (written by a version whose "
                f"{cls.__name__} had other fields)"
            )
        obj = object.__new__(cls)
        obj.__dict__.update(plain)
        return obj

    return CheckpointType(name, cls, to_plain, from_plain)


# ----------------------------------------------------------------------------- encoding
_ATOMS = frozenset({type(None), bool, int, float, str, bytes, complex})
_SHARED = (list, dict, set)  # mutable containers: kept as one object when referenced twice


class _UnstorableError(Exception):
    """A value cannot be stored; ``where`` collects its place on the way up."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.where: list[str] = []

    def error(self) -> TypeError:
        return TypeError(f"${''.join(reversed(self.where))}: {self.problem}")


def _converted(value: Any) -> bool:
    """Whether ``value`` is stored through plain data of its own (not a container/atom)."""
    return (
        type(value) in (np.random.Generator, random.Random)
        or isinstance(value, np.random.BitGenerator)
        or _lookup_class(type(value)) is not None
    )


def _tag_of(value: Any) -> str:
    entry = _BY_CLASS.get(type(value))
    return entry.name if entry is not None else type(value).__name__


class _Encoder:
    """Turns a value into a JSON tree plus arrays (two passes: find shared objects, emit)."""

    def __init__(self) -> None:
        self.plain: dict[int, tuple[Any, Any]] = {}  # id -> (object, its plain data)
        self.count: dict[int, int] = {}
        self.stack: set[int] = set()
        self.ids: dict[int, int] = {}
        self.arrays: dict[str, np.ndarray] = {}

    # -- what an object stores, computed once (and kept alive: ids stay unique)
    def _plain(self, value: Any) -> Any:
        key = id(value)
        if key not in self.plain:
            self.plain[key] = (value, self._to_plain(value))
        return self.plain[key][1]

    @staticmethod
    def _to_plain(value: Any) -> Any:
        t = type(value)
        if t is np.random.Generator:
            return value.bit_generator
        if t is random.Random:
            return value.getstate()
        if isinstance(value, np.random.BitGenerator):
            if _BIT_GENERATORS.get(t.__name__) is not t:
                raise _UnstorableError(f"cannot store a {t.__qualname__} bit generator")
            seq = getattr(value, "seed_seq", None)
            seed_seq = None
            if type(seq) is np.random.SeedSequence:
                seed_seq = {
                    "entropy": seq.entropy,
                    "spawn_key": tuple(seq.spawn_key),
                    "pool_size": int(seq.pool_size),
                    "n_children_spawned": int(seq.n_children_spawned),
                }
            return {"kind": t.__name__, "state": value.state, "seed_seq": seed_seq}
        return _BY_CLASS[t].to_plain(value)

    # -- pass 1: count references, refuse cycles and what cannot be stored
    def scan(self, value: Any) -> None:
        t = type(value)
        if t in _ATOMS:
            return
        if isinstance(value, np.generic):
            if value.dtype.hasobject:
                raise _UnstorableError("cannot store a numpy object scalar")
            return
        if t is tuple or t is frozenset:
            self._scan_items(enumerate(value), "[{!r}]")
            return
        if not (t in _SHARED or t is np.ndarray or _converted(value)):
            raise _UnstorableError(
                f"cannot store a {t.__module__}.{t.__qualname__} in a checkpoint (not plain "
                "data and not a registered type: see flower_app.checkpoint_types)"
            )
        key = id(value)
        if key in self.stack:
            raise _UnstorableError("the value refers to itself (a cycle cannot be stored)")
        seen = self.count.get(key, 0)
        self.count[key] = seen + 1
        if seen:
            return
        self.stack.add(key)
        if t is dict:
            self._scan_items(((k, k) for k in value), "<key {!r}>")
            self._scan_items(value.items(), "[{!r}]")
        elif t is list or t is set:
            self._scan_items(enumerate(value), "[{!r}]")
        elif t is np.ndarray:
            if value.dtype.hasobject:
                raise _UnstorableError("cannot store an array of Python objects")
        else:
            self._scan_items([(_tag_of(value), self._plain(value))], "<{}>")
        self.stack.discard(key)

    def _scan_items(self, items: Any, where: str) -> None:
        """Scan each ``(label, item)``; a failure records ``where.format(label)``."""
        for label, item in items:
            if type(item) in _ATOMS:
                continue
            try:
                self.scan(item)
            except _UnstorableError as ex:
                ex.where.append(where.format(label))
                raise

    # -- pass 2: the JSON tree
    def emit(self, value: Any) -> Any:
        t = type(value)
        if t is str or t is bool or value is None:
            return value
        if t is int:
            return value if -_JSON_INT <= value <= _JSON_INT else {"$": "int", "hex": hex(value)}
        if t is float:
            return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
        if isinstance(value, np.generic):
            return self._scalar(value)
        if t is complex:
            return {"$": "complex", "re": self.emit(value.real), "im": self.emit(value.imag)}
        if t is bytes:
            return {"$": "bytes", "b64": base64.b64encode(value).decode("ascii")}
        if t is tuple:
            return {"$": "tuple", "v": [self.emit(x) for x in value]}
        if t is frozenset:
            return {"$": "frozenset", "v": [self.emit(x) for x in value]}
        key = id(value)
        if key in self.ids:
            return {"$": "ref", "id": self.ids[key]}
        node = self._shared(value)
        if self.count.get(key, 1) > 1:
            self.ids[key] = len(self.ids)
            if type(node) is list:
                node = {"$": "list", "v": node}
            node["id"] = self.ids[key]
        return node

    def _shared(self, value: Any) -> Any:
        t = type(value)
        emit = self.emit
        if t is list:
            return [emit(x) for x in value]
        if t is dict:
            if all(type(k) is str for k in value):
                return {"$": "dict", "v": {k: emit(v) for k, v in value.items()}}
            return {"$": "dict", "items": [[emit(k), emit(v)] for k, v in value.items()]}
        if t is set:
            return {"$": "set", "v": [emit(x) for x in value]}
        if t is np.ndarray:
            return {"$": "ndarray", "array": self._array(value)}
        plain = self._plain(value)
        if isinstance(value, np.random.BitGenerator):
            return {"$": "np.BitGenerator", "kind": plain["kind"], "state": emit(plain["state"]),
                    "seed_seq": emit(plain["seed_seq"])}  # fmt: skip
        if t is np.random.Generator:
            return {"$": "np.Generator", "bit_generator": emit(plain)}
        if t is random.Random:
            return {"$": "random.Random", "state": emit(plain)}
        return {"$": "object", "type": _BY_CLASS[t].name, "v": emit(plain)}

    def _array(self, value: np.ndarray) -> str:
        name = f"a{len(self.arrays)}"
        self.arrays[name] = value
        return name

    def _scalar(self, value: np.generic) -> dict[str, Any]:
        dtype = value.dtype
        if dtype.kind in "biuf" and dtype.itemsize <= 8:
            return {"$": "np.scalar", "dtype": dtype.str, "v": self.emit(value.item())}
        return {"$": "np.scalar", "array": self._array(np.asarray(value))}


def encode(value: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return the JSON document and the arrays that store ``value``.

    Parameters
    ----------
    value : object
        Plain data (see the module docstring), numpy arrays, generators and registered
        objects, nested in any way without cycles.

    Returns
    -------
    document : dict
        ``{"format", "version", "flower_app", "root"}`` (JSON-serialisable; no NaN).
    arrays : dict of str to numpy.ndarray
        The arrays the document names (``a0``, ``a1``, ...).

    Raises
    ------
    TypeError
        On a value that cannot be stored (its place in ``value`` is named).
    """
    encoder = _Encoder()
    try:
        encoder.scan(value)
    except _UnstorableError as ex:
        raise ex.error() from None
    root = encoder.emit(value)
    document = {"format": FORMAT, "version": VERSION, "flower_app": _package_version(),
                "root": root}  # fmt: skip
    return document, encoder.arrays


def _package_version() -> str:
    """Return the installed flower_app's version (recorded in the document, for messages)."""
    try:
        return importlib.metadata.version("flower_app")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# ----------------------------------------------------------------------------- decoding
class _Decoder:
    """Rebuilds a value from a JSON tree; arrays come from ``array(name)``."""

    def __init__(self, array: Callable[[str], np.ndarray], source: str) -> None:
        self.array = array
        self.source = source
        self.memo: dict[int, Any] = {}

    def fail(self, path: str, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.source}: {problem} (at {path})", "invalid")

    def decode(self, node: Any, path: str) -> Any:
        t = type(node)
        if node is None or t in (bool, int, float, str):
            return node
        if t is list:
            return [self.decode(x, f"{path}[{i}]") for i, x in enumerate(node)]
        if t is not dict:
            raise self.fail(path, f"unexpected JSON value {node!r}")
        tag = node.get("$")
        if tag == "ref":  # its id names an earlier node; it defines none
            ref = node.get("id")
            if type(ref) is not int or ref not in self.memo:
                raise self.fail(path, f"a reference to an unknown id {ref!r}")
            return self.memo[ref]
        handler = _TAGS.get(tag) if type(tag) is str else None
        if handler is None:
            raise self.fail(path, f"unknown type tag {tag!r}")
        try:
            value = handler(self, node, path)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as ex:
            problem = f"a {tag!r} node that does not fit ({type(ex).__name__}: {ex})"
            raise self.fail(path, problem) from ex
        if "id" in node:
            ref = node["id"]
            if type(ref) is not int or ref in self.memo:
                raise self.fail(path, f"bad or repeated id {ref!r}")
            self.memo[ref] = value
        return value

    def items(self, node: dict[str, Any], path: str) -> list[Any]:
        seq = node["v"]
        if type(seq) is not list:
            raise TypeError("'v' must be a list")
        return [self.decode(x, f"{path}[{i}]") for i, x in enumerate(seq)]

    def ndarray(self, node: dict[str, Any], path: str) -> np.ndarray:
        name = node["array"]
        if type(name) is not str or not _ARRAY_NAME.fullmatch(name):
            raise ValueError(f"bad array name {name!r}")
        return self.array(name)


def _dict(d: _Decoder, node: dict[str, Any], path: str) -> dict[Any, Any]:
    if "v" in node:
        if type(node["v"]) is not dict:
            raise TypeError("'v' must be an object")
        return {k: d.decode(v, f"{path}[{k!r}]") for k, v in node["v"].items()}
    out = {}
    for pair in node["items"]:
        if type(pair) is not list or len(pair) != 2:
            raise TypeError("'items' must hold [key, value] pairs")
        key = d.decode(pair[0], f"{path}<key>")
        out[key] = d.decode(pair[1], f"{path}[{key!r}]")
    return out


def _int(d: _Decoder, node: dict[str, Any], path: str) -> int:
    text = node["hex"]
    if type(text) is not str or not re.fullmatch(r"-?0x[0-9a-f]+", text):
        raise ValueError(f"bad hex int {text!r}")
    return int(text, 16)


def _float(d: _Decoder, node: dict[str, Any], path: str) -> float:
    if node["v"] not in ("nan", "inf", "-inf"):
        raise ValueError(f"bad float {node['v']!r}")
    return float(node["v"])


def _number(d: _Decoder, node: Any, path: str) -> float:
    value = d.decode(node, path)
    if type(value) not in (int, float):
        raise TypeError("expected a number")
    return float(value)


def _bytes(d: _Decoder, node: dict[str, Any], path: str) -> bytes:
    try:
        return base64.b64decode(node["b64"], validate=True)
    except binascii.Error as ex:
        raise ValueError(str(ex)) from ex


def _scalar(d: _Decoder, node: dict[str, Any], path: str) -> np.generic:
    if "array" in node:
        arr = d.ndarray(node, path)
        if arr.ndim != 0:
            raise ValueError("a scalar's array must be 0-d")
        return arr[()]
    dtype = np.dtype(node["dtype"])
    if dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise ValueError(f"dtype {dtype} is not stored as a JSON value")
    value = d.decode(node["v"], path)
    if type(value) not in (bool, int, float):
        raise TypeError("expected a bool, int or float")
    return dtype.type(value)


def _generator(d: _Decoder, node: dict[str, Any], path: str) -> np.random.Generator:
    bit_generator = d.decode(node["bit_generator"], f"{path}.bit_generator")
    if not isinstance(bit_generator, np.random.BitGenerator):
        raise TypeError("expected an np.BitGenerator node")
    return np.random.Generator(bit_generator)


def _bit_generator(d: _Decoder, node: dict[str, Any], path: str) -> np.random.BitGenerator:
    cls = _BIT_GENERATORS.get(node["kind"]) if type(node["kind"]) is str else None
    if cls is None:
        raise ValueError(f"unknown bit generator {node['kind']!r}")
    seq = d.decode(node["seed_seq"], f"{path}.seed_seq")
    if seq is None:
        bit_generator = cls()
    else:
        if type(seq) is not dict:
            raise TypeError("seed_seq must be a dict")
        bit_generator = cls(
            np.random.SeedSequence(
                seq["entropy"],
                spawn_key=seq["spawn_key"],
                pool_size=seq["pool_size"],
                n_children_spawned=seq["n_children_spawned"],
            )
        )
    state = d.decode(node["state"], f"{path}.state")
    if type(state) is not dict:
        raise TypeError("state must be a dict")
    bit_generator.state = state
    return bit_generator


def _random(d: _Decoder, node: dict[str, Any], path: str) -> random.Random:
    state = d.decode(node["state"], f"{path}.state")
    rng = random.Random()
    rng.setstate(state)
    return rng


def _object(d: _Decoder, node: dict[str, Any], path: str) -> Any:
    name = node["type"]
    entry = _lookup_name(name) if type(name) is str else None
    if entry is None:
        raise d.fail(path, f"unknown type {name!r} (not a registered checkpoint type)")
    plain = d.decode(node["v"], f"{path}<{name}>")
    try:
        return entry.from_plain(plain)
    except (TypeError, ValueError, KeyError, AttributeError) as ex:
        raise d.fail(path, f"cannot rebuild a {name} ({type(ex).__name__}: {ex})") from ex


_TAGS: dict[str, Callable[[_Decoder, dict[str, Any], str], Any]] = {
    "int": _int,
    "float": _float,
    "complex": lambda d, n, p: complex(_number(d, n["re"], p), _number(d, n["im"], p)),
    "bytes": _bytes,
    "tuple": lambda d, n, p: tuple(d.items(n, p)),
    "list": lambda d, n, p: d.items(n, p),
    "dict": _dict,
    "set": lambda d, n, p: set(d.items(n, p)),
    "frozenset": lambda d, n, p: frozenset(d.items(n, p)),
    "ndarray": lambda d, n, p: d.ndarray(n, p),
    "np.scalar": _scalar,
    "np.Generator": _generator,
    "np.BitGenerator": _bit_generator,
    "random.Random": _random,
    "object": _object,
}


def decode(
    document: Any,
    arrays: Callable[[str], np.ndarray] | dict[str, np.ndarray],
    source: str = "a checkpoint",
) -> Any:
    """Rebuild the value :func:`encode` stored.

    Parameters
    ----------
    document : dict
        The parsed JSON document.
    arrays : dict or callable
        The arrays by name, or ``arrays(name)`` returning one.
    source : str, optional
        Names the file in error messages.

    Returns
    -------
    object
        The value.

    Raises
    ------
    CheckpointError
        On a document of another format or a newer version, an unknown tag or type, or
        content that does not fit its type.
    """
    _check_header(document, source)
    if isinstance(arrays, dict):
        table = arrays

        def get(name: str) -> np.ndarray:
            if name not in table:
                raise ValueError(f"array {name!r} is missing")
            return table[name]

        getter: Callable[[str], np.ndarray] = get
    else:
        getter = arrays
    return _Decoder(getter, source).decode(document["root"], "$")


def _check_header(document: Any, source: str) -> None:
    if type(document) is not dict or document.get("format") != FORMAT:
        found = document.get("format") if type(document) is dict else type(document).__name__
        raise CheckpointError(
            f"{source} is not a flower_app checkpoint (format {found!r}, expected {FORMAT!r})",
            "foreign",
        )
    version = document.get("version")
    if type(version) is not int or version < 1:
        raise CheckpointError(f"{source}: bad checkpoint version {version!r}", "invalid")
    if version > VERSION:
        raise CheckpointError(
            f"{source} was written by a newer flower_app ({document.get('flower_app')!r}, "
            f"checkpoint version {version}); this one reads versions up to {VERSION}",
            "newer",
        )
    if "root" not in document:
        raise CheckpointError(f"{source}: the document has no 'root'", "invalid")


# ----------------------------------------------------------------------------- files
def _write_archive(fh: IO[bytes], document: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    text = json.dumps(document, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    with zipfile.ZipFile(fh, "w", compression=_STORED, allowZip64=True) as zf:
        zf.writestr(zipfile.ZipInfo(DOCUMENT, _ZIP_TIME), text.encode("utf-8"))
        for name, arr in arrays.items():
            with zf.open(zipfile.ZipInfo(name + ".npy", _ZIP_TIME), "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asanyarray(arr), allow_pickle=False)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON (non-finite floats are tagged)")


def _read_archive(fh: IO[bytes], source: str) -> Any:
    head = fh.read(4)
    fh.seek(0)
    if head[:1] == b"\x80":
        raise CheckpointError(
            f"{source} is a pickle, not a flower_app checkpoint (an older flower_app wrote "
            "pickles): it is refused, nothing in it was run",
            "foreign",
        )
    if _ZIP_MAGIC[: len(head)] != head:
        raise CheckpointError(
            f"{source} is not a flower_app checkpoint (it starts with {head!r}, not as a "
            "zip archive does)",
            "foreign",
        )
    if len(head) < len(_ZIP_MAGIC):
        raise CheckpointError(f"{source} is unreadable (empty or cut short)", "unreadable")
    try:
        with zipfile.ZipFile(fh) as zf:
            names = set(zf.namelist())
            if DOCUMENT not in names:
                raise CheckpointError(
                    f"{source} is not a flower_app checkpoint (no {DOCUMENT} in it)", "foreign"
                )
            packed = sorted(i.filename for i in zf.infolist() if i.compress_type != _STORED)
            if packed:  # this module stores members as they are: nothing to inflate
                raise CheckpointError(
                    f"{source}: compressed members {packed[:3]} (flower_app stores them "
                    "uncompressed)",
                    "invalid",
                )
            text = zf.read(DOCUMENT).decode("utf-8")
            document = json.loads(text, parse_constant=_reject_constant)

            def array(name: str) -> np.ndarray:
                member = name + ".npy"
                if member not in names:
                    raise ValueError(f"array {name!r} is missing")
                with zf.open(member) as stream:
                    return np.lib.format.read_array(stream, allow_pickle=False)

            return decode(document, array, source)
    except CheckpointError:
        raise
    except Exception as ex:  # noqa: BLE001 - whatever a broken archive raises (zipfile, numpy's
        # header parser, json: BadZipFile, NotImplementedError, struct.error, ...) means this
        raise CheckpointError(
            f"{source} is unreadable (truncated or corrupt: {type(ex).__name__}: {ex})",
            "unreadable",
        ) from ex


def write_checkpoint(path: Path, value: Any, sync: bool = True) -> None:
    """Replace the checkpoint file ``path`` atomically with ``value``.

    ``value`` is encoded first (nothing is written if it cannot be stored), then written
    through :func:`flower_app.files.atomic_file` (``fsync``\\ ed if ``sync``).

    Parameters
    ----------
    path : pathlib.Path
        The checkpoint file (e.g. a run folder's ``checkpoint.npz``).
    value : object
        What to store (see :func:`encode`).
    sync : bool, optional
        Force the file to the disk before the rename (default True).

    Raises
    ------
    TypeError
        On a value that cannot be stored.
    """
    document, arrays = encode(value)
    with atomic_file(path, sync=sync) as fh:
        _write_archive(fh, document, arrays)


def read_checkpoint(path: Path) -> Any:
    """Return the value stored in the checkpoint file ``path``.

    Parameters
    ----------
    path : pathlib.Path
        A file :func:`write_checkpoint` wrote.

    Returns
    -------
    object
        The stored value.

    Raises
    ------
    CheckpointError
        If the file is not a flower_app checkpoint (e.g. an older version's pickle), is of a
        newer version, is truncated or corrupt, or holds an unknown tag or type; the message
        names the file and the problem. Nothing in the file is ever run.
    FileNotFoundError
        If there is no such file.
    """
    path = Path(path)
    with path.open("rb") as fh:
        return _read_archive(fh, str(path))


def dumps(value: Any) -> bytes:
    """Return the bytes of a checkpoint file holding ``value`` (see :func:`write_checkpoint`)."""
    buffer = io.BytesIO()
    _write_archive(buffer, *encode(value))
    return buffer.getvalue()


def loads(data: bytes, source: str = "checkpoint bytes") -> Any:
    """Return the value of a checkpoint file's bytes (see :func:`read_checkpoint`)."""
    return _read_archive(io.BytesIO(data), source)
