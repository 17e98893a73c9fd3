"""Checkpoints as plain data (``flower_app.checkpoint``): what is stored comes back as it was,
and what is not a flower_app checkpoint of this version is refused without running anything.

Round trips go through the bytes of a checkpoint file (:func:`checkpoint.dumps` /
:func:`checkpoint.loads`, the code :func:`checkpoint.write_checkpoint` and
:func:`checkpoint.read_checkpoint` use): nested dicts, lists, tuples and sets, ints beyond 64
bits, floats with NaN and ±inf, arrays and numpy scalars of many dtypes, generators whose
stream goes on where it was, objects shared between two places (still one object), and the
server states of the strategies (every FedSM mode resumes to the uninterrupted S). The
refusals: a pickle (as the file, or inside it as an object array), an unknown tag or type,
another format, a newer version, any truncation.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import pickle
import random
import subprocess
import sys
import textwrap
import zipfile
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flower_app import checkpoint
from flower_app.algorithms.common.gaussian_dp import GaussianAccountant, GaussianDP
from flower_app.algorithms.fedsm.modes import FedSMParams
from flower_app.checkpoint import CheckpointError, CheckpointType
from flower_app.checkpoint_types import FAMILIES
from flower_app.strategies.cohort.fedsm import FedSMCohorts
from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid
from tests.test_hostile_replies import N_COHORT, SCENARIOS, M


# ----------------------------------------------------------------------------- equality
def assert_same(a: Any, b: Any, path: str = "$") -> None:
    """Assert ``b`` is ``a`` rebuilt: same types, same bits (NaN as NaN), same key order."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} became {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), path
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype, path
        if a.dtype.kind in "fc" and np.isnan(a):
            assert np.isnan(b), path
        else:
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), path
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
        ), path
    elif isinstance(a, complex):
        assert_same(a.real, b.real, path)
        assert_same(a.imag, b.imag, path)
    elif isinstance(a, dict):
        assert len(a) == len(b), path
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            assert_same(ka, kb, f"{path}<key>")
            assert_same(va, vb, f"{path}[{ka!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def roundtrip(value: Any) -> Any:
    return checkpoint.loads(checkpoint.dumps(value))


# ----------------------------------------------------------------------------- values
DTYPES = [np.dtype(d) for d in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2",
                                "f4", "f8", "c8", "c16", "U4", "S3", "M8[s]", "m8[ms]", ">f8",
                                "<i4")]  # fmt: skip
STRUCTURED = np.dtype([("id", "<i8"), ("w", "<f4"), ("tag", "S2")])

arrays = st.one_of(
    st.sampled_from(DTYPES + [STRUCTURED]).flatmap(
        lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4))
    ),
    # non-contiguous and Fortran-ordered views
    hnp.arrays(np.float64, (3, 4)).map(lambda a: a[:, ::2]),
    hnp.arrays(np.int32, (3, 2)).map(np.asfortranarray),
)
scalars = st.sampled_from(DTYPES).flatmap(hnp.from_dtype).map(lambda x: x.dtype.type(x))
atoms = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**300), max_value=2**300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.complex_numbers(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    scalars,
)
keys = st.one_of(st.text(max_size=6), st.integers(), st.tuples(st.integers(), st.integers()))
values = st.recursive(
    st.one_of(atoms, arrays),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
        st.dictionaries(st.text(max_size=6), inner, max_size=4),
        st.sets(st.one_of(st.integers(), st.text(max_size=4)), max_size=4),
        st.frozensets(st.integers(), max_size=4),
    ),
    max_leaves=24,
)


@settings(max_examples=300)
@given(values)
def test_any_nesting_of_plain_values_comes_back_as_it_was(value) -> None:
    assert_same(value, roundtrip(value))


@given(st.integers(min_value=-(2**4000), max_value=2**4000))
def test_ints_of_any_size_come_back_exactly(n: int) -> None:
    assert roundtrip({"n": n})["n"] == n
    document, _ = checkpoint.encode(n)
    # ints beyond ±2**53 are tagged (a JSON reader that keeps numbers as doubles loses them)
    assert (type(document["root"]) is int) == (abs(n) <= 2**53)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=20))
def test_the_document_is_strict_json_even_with_nan_and_inf(xs) -> None:
    document, _ = checkpoint.encode(xs)
    text = json.dumps(document, allow_nan=False)  # no NaN / Infinity literals
    assert_same(xs, checkpoint.decode(json.loads(text), {}))


# ----------------------------------------------------------------------------- generators
BIT_GENERATORS = [np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937, np.random.Philox,
                  np.random.SFC64]  # fmt: skip


@settings(max_examples=60)
@given(
    st.sampled_from(BIT_GENERATORS),
    st.one_of(st.integers(0, 2**128), st.lists(st.integers(0, 2**32), min_size=1, max_size=3)),
    st.integers(0, 50),
    st.integers(0, 3),
)
def test_a_restored_generator_goes_on_with_the_same_stream(kind, seed, draws, spawned) -> None:
    rng = np.random.Generator(kind(np.random.SeedSequence(seed)))
    rng.random(draws)
    rng.integers(0, 2**32, size=draws % 3, dtype=np.uint32)  # an odd count leaves a buffered half
    rng.bit_generator.seed_seq.spawn(spawned)
    again = roundtrip(rng)
    assert type(again.bit_generator) is kind
    assert np.array_equal(again.integers(0, 2**32, size=5, dtype=np.uint32),
                          rng.integers(0, 2**32, size=5, dtype=np.uint32))  # fmt: skip
    assert np.array_equal(again.normal(size=7), rng.normal(size=7))
    assert np.array_equal(again.permutation(20), rng.permutation(20))
    # the seed sequence too: children spawned after the restore are the original's
    child, original = again.spawn(1)[0], rng.spawn(1)[0]
    assert np.array_equal(child.random(3), original.random(3))


@given(st.integers(0, 2**64), st.integers(0, 20), st.booleans())
def test_a_restored_random_random_goes_on_with_the_same_stream(seed, draws, gauss) -> None:
    rng = random.Random(seed)
    for _ in range(draws):
        rng.random()
    if gauss:
        rng.gauss(0.0, 1.0)  # leaves its second normal cached in the state
    again = roundtrip(rng)
    assert [again.gauss(0.0, 1.0) for _ in range(3)] == [rng.gauss(0.0, 1.0) for _ in range(3)]
    assert again.getrandbits(200) == rng.getrandbits(200)


def test_an_object_shared_by_two_places_is_one_object_again() -> None:
    """A FedSM run and its inner server hold the same generator: drawing from one must
    advance the other after a resume as before (pickle kept that; so must the format)."""
    rng, row, arr = np.random.default_rng(1), {"n": [1]}, np.zeros(3)
    value = {"run": {"rng": rng, "rows": [row], "x": arr},
             "inner": (rng, row, arr, row["n"])}  # fmt: skip
    again = roundtrip(value)
    run, inner = again["run"], again["inner"]
    assert inner[0] is run["rng"] and inner[1] is run["rows"][0] and inner[2] is run["x"]
    assert inner[3] is inner[1]["n"]
    assert roundtrip([value, value])[0] is not value  # a new object, shared within itself


# ----------------------------------------------------------------------------- server states
def test_registered_types_come_back_equal() -> None:
    dp = GaussianDP(noise_multiplier=0.7, clip=2.0, delta=1e-6, reproducible=True)
    accountant = GaussianAccountant(dp, 5)
    accountant.record(3, [0, 2, 4])
    accountant.record(3, [1])
    again = roundtrip({"acc": accountant, "dp": dp})
    assert again["dp"] == dp and again["acc"].dp == dp
    assert_same(vars(accountant), vars(again["acc"]))  # every attribute, whatever it keeps
    assert again["acc"].info() == accountant.info()
    # and it goes on as the original
    assert again["acc"].record(3, [0, 1, 2]) == accountant.record(3, [0, 1, 2])
    partition = PartitionMatroid([0, 1, 1, 2, 0], [1, 2, 1])
    uniform = roundtrip(UniformMatroid(9, 3))
    assert (uniform.n_elements, uniform.k) == (9, 3)
    again_p = roundtrip(partition)
    assert again_p.rank == partition.rank and np.array_equal(again_p.groups, partition.groups)


def _fedsm(params: FedSMParams, k: int, **options) -> FedSMCohorts:
    return FedSMCohorts(N_COHORT, UniformMatroid(M, k), k, params, seed=3, lam=1.0,
                        discovery_timeout=0.5, **options)  # fmt: skip


@pytest.mark.parametrize(
    ("params", "k"),
    [
        (FedSMParams("alg2", 0.5, 0.5, tau=0.05), 3),
        (FedSMParams("amplified", 0.5, 0.5, eta=0.5, inner="alg1"), 2),
        (FedSMParams("amplified", 0.5, 0.5, eta=0.5, inner="alg2", tau=0.05), 2),
        (FedSMParams("alg1", 0.5, 0.5, dp_epsilon=2.0), 3),
    ],
    ids=["alg2", "amplified-alg1", "amplified-alg2", "alg1-shuffle-dp"],
)
def test_every_fedsm_mode_resumes_from_its_stored_checkpoint_to_the_same_set(params, k) -> None:
    """The FedSM modes beyond Algorithm 1 (which ``test_node_failures.py`` resumes) through
    the checkpoint's bytes: same S as the uninterrupted run, the generator still shared."""
    saved: list[bytes] = []
    whole = _fedsm(params, k, checkpoint_fn=lambda payload: saved.append(checkpoint.dumps(payload)))
    start = {"initial_arrays": ArrayRecord(), "num_rounds": 100, "timeout": 5}
    whole.start(grid=SCENARIOS["fedsm-cohort"].grid(), **start)
    assert len(saved) >= 2
    payload = checkpoint.loads(saved[len(saved) // 2])
    state = payload["state"]
    assert state.rng is state.inner.rng and state.matroid is state.inner.matroid
    resumed = _fedsm(params, k)
    resumed.resume_from(payload)
    resumed.start(grid=SCENARIOS["fedsm-cohort"].grid(), **start)
    assert resumed.run.selected == whole.run.selected
    rounds = [r["server-round"] for r in whole.history]
    assert [r["server-round"] for r in resumed.history] == rounds


# ----------------------------------------------------------------------------- writing
class _Unregistered:
    pass


def test_what_cannot_be_stored_is_refused_when_writing_and_the_old_file_stays(tmp_path) -> None:
    path = tmp_path / "checkpoint.npz"
    checkpoint.write_checkpoint(path, {"server-round": 1})
    before = path.read_bytes()
    cycle: list[Any] = []
    cycle.append(cycle)
    for bad, message in [
        ({"state": {"x": _Unregistered()}}, r"\$\['state'\]\['x'\]: cannot store .*_Unregist"),
        ({"f": lambda: 0}, "cannot store a builtins.function"),
        ({"a": np.array([object()])}, "array of Python objects"),
        ({"c": cycle}, "refers to itself"),
        ({"legacy": np.random.RandomState(1)}, "cannot store a numpy.random.mtrand.RandomState"),
    ]:
        with pytest.raises(TypeError, match=message):
            checkpoint.write_checkpoint(path, bad)
        assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.npz"]  # no temporary file left


def test_the_file_is_an_npz_with_a_json_document(tmp_path) -> None:
    """``numpy.load`` opens it (no pickles allowed) and the document is plain JSON."""
    path = tmp_path / "checkpoint.npz"
    checkpoint.write_checkpoint(path, {"x": np.arange(4.0), "round": 2}, sync=False)
    with zipfile.ZipFile(path) as zf:
        document = json.loads(zf.read(checkpoint.DOCUMENT))
    assert document["format"] == "flower_app-checkpoint" and document["version"] == 1
    assert document["root"]["v"] == {"x": {"$": "ndarray", "array": "a0"}, "round": 2}
    with np.load(path, allow_pickle=False) as npz:
        assert np.array_equal(npz["a0"], np.arange(4.0))
    # the same value gives the same bytes
    assert checkpoint.dumps({"x": np.arange(4.0), "round": 2}) == path.read_bytes()


def test_each_family_names_its_types_after_itself_and_loads_only_its_own_modules() -> None:
    """Stored names are ``<family>.<Class>`` and unique; a family's classes live in its
    package (how the writer finds the family of an object without importing the others)."""
    names: set[str] = set()
    for family, (package, load) in FAMILIES.items():
        for entry in load():
            assert entry.name == f"{family}.{entry.cls.__name__}", entry.name
            assert entry.cls.__module__ == package or entry.cls.__module__.startswith(package + ".")
            assert entry.name not in names
            names.add(entry.name)
    # the state each resumable strategy's checkpoint_state returns
    assert {"fedsm.FedSMRun", "fedcg.FedCGServer", "fedcg.DiscreteGreedyServer",
            "maxfl.AppealServer", "maxfl.ParticipationSampler", "maxfl.PoolCache",
            "fedsubavg.ClientSampler", "dp.GaussianAccountant"} <= names  # fmt: skip


def test_a_fedsm_checkpoint_does_not_import_the_other_families() -> None:
    """Reading and writing a FedSM run's state imports FedSM's types only (MaxFL's would
    bring torch into a FedSM ServerApp: about 200 MiB it never needs)."""
    code = textwrap.dedent("""
        import sys
        from flower_app import checkpoint
        from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun
        from flower_app.submodular.matroids import UniformMatroid
        run = FedSMRun(10, UniformMatroid(8, 3), 3, FedSMParams(), 1.0)
        again = checkpoint.loads(checkpoint.dumps({"state": run}))["state"]
        assert again.rng is again.inner.rng
        fedsm = ("flower_app.algorithms.fedsm", "flower_app.algorithms.common",
                 "flower_app.algorithms.robust")
        others = [m for m in sys.modules
                  if m.startswith("flower_app.algorithms.") and not m.startswith(fedsm)]
        print(sorted(others), "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout  # fmt: skip
    assert out.split() == ["[]", "False"], out


@dataclasses.dataclass
class Box:
    """A server state of an own strategy, registered by the test below."""

    a: int
    b: list[int] = dataclasses.field(default_factory=list)


def test_a_dataclass_of_another_version_is_refused_by_its_fields() -> None:
    checkpoint.register_type(checkpoint.attribute_type("test.Box", Box))
    document, arrays = checkpoint.encode(Box(1, [2]))
    again = checkpoint.decode(document, arrays)
    assert type(again) is Box and again == Box(1, [2])
    del document["root"]["v"]["v"]["b"]  # written when Box had no field b
    with pytest.raises(CheckpointError, match=r"cannot rebuild a test.Box .*fields \['b'\]"):
        checkpoint.decode(document, arrays)
    with pytest.raises(ValueError, match="clashes"):
        checkpoint.register_type(CheckpointType("test.Box", dict, dict, dict))


# ----------------------------------------------------------------------------- refusals
class _Mkdir:
    """Unpickled, this creates the directory ``path`` (what any pickle could do instead)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return os.mkdir, (self.path,)


def _archive(document: Any, members: dict[str, bytes] | None = None, compress=False) -> bytes:
    buffer = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer, "w", method) as zf:
        zf.writestr(checkpoint.DOCUMENT, json.dumps(document))
        for name, data in (members or {}).items():
            zf.writestr(name, data)
    return buffer.getvalue()


def _document(root: Any, **header: Any) -> dict[str, Any]:
    return {"format": "flower_app-checkpoint", "version": 1, "root": root, **header}


def test_a_crafted_pickle_is_refused_without_running_it(tmp_path) -> None:
    ran = tmp_path / "the-pickle-ran"
    crafted = pickle.dumps({"server-round": 3, "state": _Mkdir(str(ran))})
    path = tmp_path / "checkpoint.npz"
    path.write_bytes(crafted)  # a pickle as the whole file
    with pytest.raises(CheckpointError, match=r"checkpoint.npz is a pickle.*nothing in it was run"):
        checkpoint.read_checkpoint(path)
    # a pickle inside the archive: an object array, as numpy would pickle it
    member = io.BytesIO()
    np.lib.format.write_array(member, np.array([_Mkdir(str(ran))], dtype=object), allow_pickle=True)
    path.write_bytes(_archive(_document({"$": "ndarray", "array": "a0"}),
                              {"a0.npy": member.getvalue()}))  # fmt: skip
    with pytest.raises(CheckpointError, match=r"checkpoint.npz: .*Object arrays cannot be loaded"):
        checkpoint.read_checkpoint(path)
    assert not ran.exists()
    pickle.loads(crafted)  # the pickle is live: unpickling it runs its code
    assert ran.is_dir()


@pytest.mark.parametrize(
    ("root", "message"),
    [
        ({"$": "os.system", "v": "touch /tmp/x"}, r"unknown type tag 'os.system'"),
        ({"$": "object", "type": "posix.system", "v": "ls"}, r"unknown type 'posix.system'"),
        ({"$": "object", "type": "flower_app.results.RunWriter", "v": {}}, "unknown type"),
        ({"$": "dict", "v": {"a": {"x": 1}}}, r"unknown type tag None \(at \$\['a'\]\)"),
        ({"$": "ref", "id": 0}, "unknown id 0"),
        ({"$": "np.BitGenerator", "kind": "os", "state": {}, "seed_seq": None}, "unknown bit"),
        ({"$": "np.scalar", "dtype": "O", "v": 1}, "not stored as a JSON value"),
        ({"$": "ndarray", "array": "../etc/passwd"}, "bad array name"),
        ({"$": "ndarray", "array": "a7"}, "array 'a7' is missing"),
        ({"$": "int", "hex": "__import__('os')"}, "bad hex int"),
        ({"$": "object", "type": "dp.GaussianDP",
          "v": {"$": "dict", "v": {"noise_multiplier": -1}}}, r"cannot rebuild a dp.GaussianDP"),
    ],  # fmt: skip
)
def test_an_unknown_tag_or_content_that_does_not_fit_is_refused(tmp_path, root, message) -> None:
    path = tmp_path / "checkpoint.npz"
    path.write_bytes(_archive(_document(root)))
    with pytest.raises(CheckpointError, match=message) as err:
        checkpoint.read_checkpoint(path)
    assert str(err.value).startswith(str(path)) and err.value.kind == "invalid"


@pytest.mark.parametrize(
    ("data", "kind", "message"),
    [
        (_archive(_document(1, format="other-app")), "foreign", "not a flower_app checkpoint"),
        (_archive(_document(1, version=2)), "newer", r"newer flower_app .*version 2"),
        (_archive(_document(1, version="1")), "invalid", "bad checkpoint version"),
        (_archive([1, 2]), "foreign", "not a flower_app checkpoint"),
        (b"", "unreadable", "is unreadable"),
        (b"{}", "foreign", r"starts with b'\{\}', not as a zip archive does"),
        (b"PK", "unreadable", "cut short"),
        (_archive(_document(1), compress=True), "invalid", r"compressed members \['checkpoint"),
        (b"PK\x03\x04" + b"\0" * 40, "unreadable", "is unreadable"),
    ],
)
def test_another_format_a_newer_version_or_a_broken_file_is_refused(
    tmp_path, data, kind, message
) -> None:
    path = tmp_path / "checkpoint.npz"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=message) as err:
        checkpoint.read_checkpoint(path)
    assert str(path) in str(err.value) and err.value.kind == kind


VALID = checkpoint.dumps({"server-round": 4, "x": np.linspace(0, 1, 50), "rng":
                          np.random.default_rng(2), "rows": [{"loss": 0.5}] * 3})  # fmt: skip


@settings(max_examples=200)
@given(st.integers(0, len(VALID) - 1))
def test_any_truncation_is_refused_as_unreadable(cut: int) -> None:
    with pytest.raises(CheckpointError, match="unreadable") as err:
        checkpoint.loads(VALID[:cut], "cut.npz")
    assert err.value.kind == "unreadable"


@settings(max_examples=200)
@given(st.integers(0, len(VALID) - 1), st.integers(1, 255))
def test_a_corrupted_byte_is_refused_or_changes_nothing(at: int, flip: int) -> None:
    """Each member is CRC-checked: a flipped byte is refused (CheckpointError, never another
    exception), unless it fell on a header field zip does not use."""
    data = bytearray(VALID)
    data[at] ^= flip
    try:
        value = checkpoint.loads(bytes(data), "flipped.npz")
    except CheckpointError:
        return
    original = checkpoint.loads(VALID)
    assert value["server-round"] == original["server-round"]
    assert np.array_equal(value["x"], original["x"]) and value["rows"] == original["rows"]
    assert value["rng"].random() == original["rng"].random()
