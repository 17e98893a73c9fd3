"""Node-local data: one file per node, a manifest with checksums, and loading a node's file.

``python -m flower_app.export`` (:mod:`flower_app.export`) writes, for N nodes, the split the
cohort simulation uses (:func:`~flower_app.clients.cohorts.cohort_range`: contiguous,
near-equal blocks of users), so a deployment and a simulation of the same seed pick the same
set. Layout of the export folder (formats and fields: ``docs/node-local-data.md``)::

    manifest.json          dataset, sizes, split, sha256 + rows + user range of every file
    node-<p>.parquet       node p's users: columns user (global id, int64), item (int64),
                           value (float64), one row per non-zero entry
    element-groups.csv     element,group: each element's group label (genre, venue type)
                           for a partition matroid; public metadata, not any user's data

A SuperNode started with ``--node-config "data-path=/path/node-<p>.parquet"`` (the manifest
next to it) loads only that file, after checking its sha256 against the manifest
(:func:`load_node_rows`); ``partition-id`` / ``num-partitions`` may then be left out (they
come from the manifest) or must agree with it.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from flower_app.clients.cohorts import cohort_range
from flower_app.datasets.paths import file_checksum
from flower_app.files import atomic_file
from flower_app.submodular.objectives import MaxRowObjective

__all__ = [
    "FORMAT",
    "GROUPS_FILE",
    "MANIFEST",
    "NodeDataError",
    "NodeRows",
    "export_rows",
    "load_node_rows",
    "node_partition",
    "read_groups",
    "read_manifest",
    "sha256_file",
]

#: manifest file name, next to the node files
MANIFEST = "manifest.json"
#: element groups of the ground set (partition matroids), next to the manifest
GROUPS_FILE = "element-groups.csv"
#: format tag written into every manifest
FORMAT = "flower-app-node-data/1"
#: node_config key naming the node's own file
DATA_PATH_KEY = "data-path"

_COLUMNS = ("user", "item", "value")


class NodeDataError(ValueError):
    """A node file or manifest is missing, tampered with or does not fit the run."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file (64 hex digits), as the manifest records it."""
    return file_checksum(path, "sha256")


def node_file_name(partition_id: int) -> str:
    """Return the file name of node ``partition_id`` (``node-<p>.parquet``)."""
    return f"node-{int(partition_id)}.parquet"


# ---------------------------------------------------------------------- export
def _export_folder(out: str | os.PathLike[str], num_partitions: int) -> Path:
    """Check the number of nodes and return the (created) output folder of an export."""
    if num_partitions < 1:
        raise ValueError(f"num-partitions={num_partitions}: expected >= 1")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _node_entry(p: int, path: Path, rows: int, first: int, count: int) -> dict[str, Any]:
    """Return the manifest's entry of node ``p``'s file (its users first..first+count−1)."""
    return {
        "partition-id": p,
        "file": path.name,
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
        "rows": rows,
        "first-user": int(first),
        "num-users": int(count),
    }


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write ``folder/manifest.json`` and return the manifest."""
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def export_rows(
    values: sp.spmatrix,
    num_partitions: int,
    out: str | os.PathLike[str],
    *,
    dataset: str,
    instance: str,
    objective: str,
    element_groups: np.ndarray | None = None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write one parquet file per node (the cohort split) plus the manifest; return it.

    Parameters
    ----------
    values : scipy.sparse.spmatrix
        Users × elements matrix (row i = user i = f_i's row).
    num_partitions : int
        Number of nodes N (1 ≤ N; nodes beyond the n users get empty files).
    out : str or os.PathLike
        Folder to write (created; existing node files and manifest are replaced).
    dataset : str
        The ``dataset`` run_config value the files stand for (checked by the nodes).
    instance : str
        The instance's name (as the run folder records it).
    objective : str
        ``"facility-location"`` or ``"max-coverage"`` (recorded; the nodes' f_i is the
        max-row function of their rows either way).
    element_groups : numpy.ndarray, optional
        One group label per element (genre, venue type); written to ``element-groups.csv``.
    source : dict, optional
        How the instance was made (data-seed, num-users, ...), recorded as is.

    Returns
    -------
    dict
        The manifest (also written to ``out/manifest.json``).
    """
    import pandas as pd

    folder = _export_folder(out, num_partitions)
    csr = sp.csr_matrix(values, dtype=np.float64)
    csr.eliminate_zeros()
    csr.sort_indices()
    n, m = csr.shape
    files = []
    for p in range(num_partitions):
        first, count = cohort_range(n, p, num_partitions)
        block = csr[first : first + count].tocoo()
        frame = pd.DataFrame(
            {
                "user": (block.row.astype(np.int64) + first),
                "item": block.col.astype(np.int64),
                "value": block.data.astype(np.float64),
            }
        )
        path = folder / node_file_name(p)
        frame.to_parquet(path, engine="pyarrow", index=False)
        files.append(_node_entry(p, path, int(block.nnz), first, count))
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "family": "submodular",
        "dataset": dataset,
        "instance": instance,
        "objective": objective,
        "n-users": int(n),
        "n-elements": int(m),
        "nnz": int(csr.nnz),
        "num-partitions": int(num_partitions),
        "split": "contiguous user blocks (flower_app.clients.cohorts.cohort_range)",
        "columns": {"user": "int64 global user id", "item": "int64", "value": "float64"},
        "source": dict(source or {}),
        "files": files,
    }
    if element_groups is not None:
        groups = np.asarray(element_groups).astype(str)
        if groups.shape != (m,):
            raise ValueError(f"element_groups has shape {groups.shape}; expected ({m},)")
        path = folder / GROUPS_FILE
        with open(path, "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(["element", "group"])
            writer.writerows([e, g] for e, g in enumerate(groups.tolist()))
        manifest["element-groups"] = {
            "file": GROUPS_FILE,
            "sha256": sha256_file(path),
            "groups": int(np.unique(groups).size),
        }
    return _write_manifest(folder, manifest)


# ---------------------------------------------------------------------- reading
def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``folder/manifest.json``; raise :class:`NodeDataError` naming it if unusable."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NodeDataError(
            f"{path}: no manifest next to the node file (copy manifest.json written by "
            "python -m flower_app.export into the same folder)"
        ) from None
    except (OSError, ValueError) as err:
        raise NodeDataError(f"{path}: unreadable manifest: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise NodeDataError(f"{path}: not a {FORMAT} manifest")
    return manifest


def _verify(path: Path, expected: str) -> None:
    if not path.is_file():
        raise NodeDataError(f"{path}: file not found")
    actual = sha256_file(path)
    if actual != expected:
        raise NodeDataError(
            f"{path}: sha256 {actual} does not match the manifest ({expected}); the file was "
            "changed or belongs to another export"
        )


def file_entry(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(manifest, entry of this file)`` for a node file, its checksum verified.

    Raises
    ------
    NodeDataError
        If the manifest is missing or does not list the file, or the checksum differs.
    """
    file = Path(path).expanduser().resolve()
    manifest = read_manifest(file.parent)
    entries = [e for e in manifest.get("files", []) if e.get("file") == file.name]
    if len(entries) != 1:
        raise NodeDataError(f"{file}: not listed in {file.parent / MANIFEST}")
    _verify(file, str(entries[0]["sha256"]))
    return manifest, entries[0]


def node_partition(node_config: dict[str, Any]) -> tuple[int, int, str | None]:
    """Return ``(partition-id, num-partitions, data-path or None)`` of a node.

    With ``data-path`` the partition comes from the manifest (node_config's
    ``partition-id`` / ``num-partitions``, if given, must agree); without it both keys are
    required.

    Raises
    ------
    ValueError
        When neither is given, or they disagree with the manifest (the file is named).
    """
    raw = node_config.get(DATA_PATH_KEY)
    path = str(raw) if raw not in (None, "") else None
    given = "partition-id" in node_config and "num-partitions" in node_config
    if path is None:
        if not given:
            raise ValueError(
                "node_config needs 'partition-id' and 'num-partitions' (start a SuperNode "
                'with --node-config "partition-id=0 num-partitions=2"; simulation sets them '
                "itself) or 'data-path' (a node file of python -m flower_app.export)"
            )
        return int(node_config["partition-id"]), int(node_config["num-partitions"]), None
    manifest, entry = _entry_cached(*file_stamp(path))
    pid, parts = int(entry["partition-id"]), int(manifest["num-partitions"])
    if given and (
        int(node_config["partition-id"]) != pid or int(node_config["num-partitions"]) != parts
    ):
        raise NodeDataError(
            f"{path}: the manifest says partition-id={pid} num-partitions={parts}; the "
            f"node_config says partition-id={node_config['partition-id']} "
            f"num-partitions={node_config['num-partitions']}"
        )
    return pid, parts, path


def file_stamp(path: str) -> tuple[str, int, int]:
    """Return a node file's identity as a cache key: a changed file is read (and checked) again.

    Returns
    -------
    tuple
        The resolved path, the file's and its manifest's modification times, its size.
    """
    file = Path(path).expanduser().resolve()
    try:
        st = file.stat()
    except FileNotFoundError:
        raise NodeDataError(f"{file}: node data file not found (node_config data-path)") from None
    manifest = file.parent / MANIFEST
    mst = manifest.stat().st_mtime_ns if manifest.exists() else 0
    return str(file), st.st_mtime_ns ^ mst, st.st_size


@lru_cache(maxsize=16)
def _entry_cached(path: str, mtime: int, size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    return file_entry(path)


@dataclass(frozen=True)
class NodeRows:
    """The rows of one node's users, read from its own file.

    Attributes
    ----------
    objective : MaxRowObjective
        f_i of the node's users (row j = global user ``first_user + j``).
    first_user : int
        Global id of the node's first user.
    n_users_total, n_elements : int
        n and m of the whole instance (from the manifest).
    partition_id, num_partitions : int
        The node's place in the split.
    manifest : dict
        The manifest next to the file.
    folder : pathlib.Path
        The folder holding the file and the manifest.
    """

    objective: MaxRowObjective
    first_user: int
    n_users_total: int
    n_elements: int
    partition_id: int
    num_partitions: int
    manifest: dict[str, Any]
    folder: Path


def _check_source(
    path: str | os.PathLike[str], source: dict[str, Any], keys: tuple[str, ...], what: str
) -> None:
    """Refuse a node file exported for other run_config values of ``keys`` than ``source``'s.

    Raises
    ------
    NodeDataError
        Naming every differing key, its value in this run and in the export.
    """
    manifest = read_manifest(Path(path).expanduser().resolve().parent)
    differ = [
        f"{key}={source[key]!r} (export: {manifest['source'].get(key)!r})"
        for key in keys
        if key in source and manifest["source"].get(key) != source[key]
    ]
    if differ:
        raise NodeDataError(f"{path}: exported for {what} than this run's: " + ", ".join(differ))


def load_node_rows(path: str | os.PathLike[str], dataset: str | None = None) -> NodeRows:
    """Load one node's file (checksum verified against the manifest next to it).

    Cached per process on the file's path, size and modification time.

    Parameters
    ----------
    path : str or os.PathLike
        ``node-<p>.parquet`` of an export.
    dataset : str, optional
        The run's ``dataset``; must be the manifest's.

    Returns
    -------
    NodeRows
        The node's users as an objective, and the instance's sizes.

    Raises
    ------
    NodeDataError
        Missing or tampered file or manifest, another dataset, or entries outside the
        node's user range or the ground set (the file is named).
    """
    rows = _load_cached(*file_stamp(str(path)))
    if dataset is not None and rows.manifest["dataset"] != dataset:
        raise NodeDataError(
            f"{path}: exported from dataset {rows.manifest['dataset']!r}; the run has "
            f"dataset={dataset!r}"
        )
    return rows


#: bump when the binary cache's layout changes
_CACHE_VERSION = 1


def cache_dir() -> Path:
    """Return the folder of the nodes' binary caches.

    ``$FLOWER_APP_CACHE/node-data`` if set, else ``$XDG_CACHE_HOME/flower_app/node-data``
    (default ``~/.cache/flower_app/node-data``).
    """
    root = os.environ.get("FLOWER_APP_CACHE")
    if root:
        return Path(root).expanduser() / "node-data"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "flower_app" / "node-data"


def _binary_cache(path: str, mtime: int, size: int) -> Path:
    key = hashlib.sha256(f"{path}|{mtime}|{size}|{_CACHE_VERSION}".encode()).hexdigest()[:32]
    return cache_dir() / f"{key}.npz"


def _rows_from(values: sp.csr_matrix, meta: dict[str, Any], folder: Path) -> NodeRows:
    manifest, entry = meta["manifest"], meta["entry"]
    first, count = int(entry["first-user"]), int(entry["num-users"])
    return NodeRows(
        objective=MaxRowObjective(values, name=f"{manifest['instance']}[{first}:{first + count}]"),
        first_user=first,
        n_users_total=int(manifest["n-users"]),
        n_elements=int(manifest["n-elements"]),
        partition_id=int(entry["partition-id"]),
        num_partitions=int(manifest["num-partitions"]),
        manifest=manifest,
        folder=folder,
    )


def _read_binary_cache(cache: Path, folder: Path) -> NodeRows | None:
    """Return the rows from a binary cache, or None if there is none (or it is unreadable)."""
    try:
        with np.load(cache, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            values = sp.csr_matrix(
                (z["data"], z["indices"], z["indptr"]), shape=tuple(int(v) for v in z["shape"])
            )
    except (OSError, KeyError, ValueError):
        return None
    return _rows_from(values, meta, folder)


def _write_binary_cache(cache: Path, values: sp.csr_matrix, meta: dict[str, Any]) -> None:
    """Write the cache atomically; a node without a writable cache folder just reads again."""
    with contextlib.suppress(OSError), atomic_file(cache) as out:
        np.savez(
            out,
            data=values.data,
            indices=values.indices,
            indptr=values.indptr,
            shape=np.asarray(values.shape, dtype=np.int64),
            meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
        )


@lru_cache(maxsize=16)
def _load_cached(path: str, mtime: int, size: int) -> NodeRows:
    """Read a node file once per file version: parquet (checked) or its binary cache.

    Flower 1.42 starts a fresh ClientApp process for every message, so a per-process cache
    alone would read (and hash) the parquet file for every message. The first reader, after
    the checksum and range checks, leaves the node's CSR arrays in an uncompressed ``.npz``
    under :func:`cache_dir`, keyed by the file's path, size and modification time (and the
    manifest's); later processes load it without importing pandas or pyarrow. A changed
    file gets a new key.
    """
    file = Path(path)
    cache = _binary_cache(path, mtime, size)
    if cache.exists():
        rows = _read_binary_cache(cache, file.parent)
        if rows is not None:
            return rows
    import pyarrow.parquet as pq

    manifest, entry = file_entry(path)
    try:
        table = pq.read_table(file, columns=list(_COLUMNS))
    except Exception as err:  # noqa: BLE001 - any reader error names the file
        raise NodeDataError(f"{file}: unreadable parquet ({err})") from None
    user = table.column("user").to_numpy().astype(np.int64)
    item = table.column("item").to_numpy().astype(np.int64)
    value = table.column("value").to_numpy().astype(np.float64)
    m = int(manifest["n-elements"])
    first, count = int(entry["first-user"]), int(entry["num-users"])
    if user.size != int(entry["rows"]):
        raise NodeDataError(f"{file}: {user.size} rows, the manifest says {entry['rows']}")
    if user.size and (user.min() < first or user.max() >= first + count):
        raise NodeDataError(f"{file}: users outside the node's range [{first}, {first + count})")
    if item.size and (item.min() < 0 or item.max() >= m):
        raise NodeDataError(f"{file}: items outside the ground set 0..{m - 1}")
    values = sp.csr_matrix((value, (user - first, item)), shape=(count, m))
    meta = {"manifest": manifest, "entry": entry}
    _write_binary_cache(cache, values, meta)
    return _rows_from(values, meta, file.parent)


def read_groups(path: str | os.PathLike[str], n_elements: int | None = None) -> np.ndarray:
    """Read ``element,group`` CSV rows into one group label per element.

    Parameters
    ----------
    path : str or os.PathLike
        The CSV (header ``element,group``; every element 0..m−1 exactly once; a group is
        any label, e.g. a genre: elements with the same label form one block).
    n_elements : int, optional
        m, when known: the file must cover exactly 0..m−1.

    Returns
    -------
    numpy.ndarray
        The group label (str) of every element, for
        :meth:`~flower_app.submodular.matroids.PartitionMatroid.from_labels`.

    Raises
    ------
    NodeDataError
        Unreadable file, or a missing or repeated element (the file is named).
    """
    file = Path(path).expanduser()
    try:
        with open(file, encoding="utf-8-sig", newline="") as fh:  # a byte-order mark dropped
            rows = list(csv.reader(fh))
        if not rows or [c.strip() for c in rows[0]] != ["element", "group"]:
            raise ValueError("the header must be element,group")
        if any(len(row) != 2 for row in rows[1:]):
            raise ValueError("every row needs two columns element,group")
        elements = np.array([int(row[0]) for row in rows[1:]], dtype=np.int64)
        labels = [row[1] for row in rows[1:]]
    except (OSError, ValueError) as err:
        raise NodeDataError(f"{file}: unreadable element groups ({err})") from None
    m = int(n_elements) if n_elements is not None else int(elements.size)
    if elements.size != m or not np.array_equal(np.sort(elements), np.arange(m)):
        raise NodeDataError(f"{file}: must list every element 0..{m - 1} exactly once")
    out = np.empty(m, dtype=object)
    out[elements] = labels
    return out.astype(str)


def node_groups(rows: NodeRows) -> np.ndarray:
    """Return the element groups exported with a node's file (checksum verified)."""
    info = rows.manifest.get("element-groups")
    if not info:
        raise NodeDataError(
            f"{rows.folder / MANIFEST}: the export has no element groups (needed by a "
            "partition matroid)"
        )
    path = rows.folder / str(info["file"])
    _verify(path, str(info["sha256"]))
    return read_groups(path, rows.n_elements)


# ---------------------------------------------------------------------- images (MaxFL)
#: run_config keys that define MaxFL's clients (dataset and split); a node's file must match
MAXFL_SOURCE_KEYS = (
    "dataset",
    "data-seed",
    "num-users",
    "maxfl-unseen-users",
    "maxfl-partition",
    "maxfl-alpha",
    "maxfl-label-flip",
    "maxfl-train-fraction",
)


def source_of(cfg: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """Return the run's values of ``keys`` (an AppConfig), as a manifest's ``source``."""
    values = cfg.to_dict()
    return {key: values[key] for key in keys}


def _write_npz(folder: Path, p: int, arrays: dict[str, np.ndarray]) -> Path:
    """Write node ``p``'s ``node-<p>.npz`` (the MaxFL and FedSubAvg exports); return its path."""
    path = folder / f"node-{p}.npz"
    with open(path, "wb") as fh:  # on a handle: np.savez keeps the name as given
        np.savez(fh, **arrays)
    return path


@contextlib.contextmanager
def _unreadable(path: str) -> Iterator[None]:
    """Turn a read error inside the block into a NodeDataError naming the node file."""
    try:
        yield
    except NodeDataError:
        raise
    except (OSError, KeyError, ValueError) as err:
        raise NodeDataError(f"{path}: unreadable node file ({err})") from None


def _node_npz(path: str, family: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Return (manifest, entry, arrays) of ``family``'s checked ``node-<p>.npz`` (no pickles)."""
    manifest, entry = file_entry(path)
    if manifest.get("family") != family:
        raise NodeDataError(f"{path}: a {manifest.get('family')!r} node file, not {family}'s")
    with _unreadable(path), np.load(path, allow_pickle=False) as z:
        return manifest, entry, {key: z[key] for key in z.files}


def _client_manifest(
    family: str,
    dataset: str,
    instance: str,
    n: int,
    sizes: dict[str, int],
    num_partitions: int,
    source: dict[str, Any],
    files: list[dict[str, Any]],
) -> dict[str, Any]:
    """Return the manifest of a per-client export (MaxFL images, FedSubAvg ratings)."""
    return {
        "format": FORMAT,
        "family": family,
        "dataset": dataset,
        "instance": instance,
        "n-users": n,
        **sizes,
        "num-partitions": int(num_partitions),
        "split": "contiguous client blocks (flower_app.clients.cohorts.cohort_range)",
        "source": dict(source),
        "files": files,
    }


def _ragged(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([p.size for p in parts])
    flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    return flat, offsets


def export_images(
    federation: Any,
    num_partitions: int,
    out: str | os.PathLike[str],
    *,
    dataset: str,
    source: dict[str, Any],
) -> dict[str, Any]:
    """Write one ``node-<p>.npz`` per node (MaxFL clients, the cohort split) and the manifest.

    Parameters
    ----------
    federation : flower_app.datasets.federated.Federation
        Every client's train / test rows (seen clients first, then unseen).
    num_partitions : int
        Number of nodes N.
    out : str or os.PathLike
        Output folder.
    dataset : str
        The ``dataset`` run_config value.
    source : dict
        The run_config values of :data:`MAXFL_SOURCE_KEYS` that made ``federation``.

    Returns
    -------
    dict
        The manifest (also written to ``out/manifest.json``).

    Notes
    -----
    A node file holds its clients' own images only (as published, before any label flip);
    its arrays are listed in ``docs/node-local-data.md``.
    """
    folder = _export_folder(out, num_partitions)
    n = int(federation.n_clients)
    files = []
    for p in range(num_partitions):
        first, count = cohort_range(n, p, num_partitions)
        clients = np.arange(first, first + count, dtype=np.int64)
        rows = [federation.train_idx[k] for k in clients] + [
            federation.test_idx[k] for k in clients
        ]
        used = np.unique(np.concatenate(rows)) if rows else np.zeros(0, np.int64)
        local = {int(r): i for i, r in enumerate(used.tolist())}
        remap = [np.array([local[int(r)] for r in part], dtype=np.int64) for part in rows]
        train, train_off = _ragged(remap[:count])
        test, test_off = _ragged(remap[count:])
        arrays = {
            "images": federation.data.images[used].astype(np.uint8),
            "labels": federation.data.labels[used].astype(np.int64),
            "clients": clients,
            "train-index": train,
            "train-offsets": train_off,
            "test-index": test,
            "test-offsets": test_off,
            "flipped": np.asarray(federation.flipped, dtype=bool)[clients],
            "mean": np.float64(federation.mean),
            "std": np.float64(federation.std),
            "n-classes": np.int64(federation.n_classes),
        }
        path = _write_npz(folder, p, arrays)
        files.append(_node_entry(p, path, int(used.size), first, count))
    sizes = {
        "n-seen": int(federation.n_seen),
        "n-unseen": int(federation.n_unseen),
        "n-classes": int(federation.n_classes),
    }
    manifest = _client_manifest(
        "maxfl", dataset, str(federation.data.name), n, sizes, num_partitions, source, files
    )
    return _write_manifest(folder, manifest)


def load_node_images(path: str | os.PathLike[str], source: dict[str, Any]) -> Any:
    """Load one node's ``node-<p>.npz`` as a Federation holding its clients only.

    Parameters
    ----------
    path : str or os.PathLike
        The node file (manifest next to it).
    source : dict
        The run's values of :data:`MAXFL_SOURCE_KEYS`; each must equal the manifest's.

    Returns
    -------
    flower_app.datasets.federated.Federation
        Every client id exists (so global ids work), but only the node's clients have rows.

    Raises
    ------
    NodeDataError
        Missing or tampered file or manifest, or a run whose clients differ from the export.
    """
    fed = _images_cached(*file_stamp(str(path)))
    _check_source(path, source, MAXFL_SOURCE_KEYS, "other clients")
    return fed


@lru_cache(maxsize=4)
def _images_cached(path: str, mtime: int, size: int) -> Any:
    from flower_app.datasets.federated import Federation
    from flower_app.datasets.images import LabelledImages

    manifest, entry, arrays = _node_npz(path, "maxfl")
    with _unreadable(path):
        data = LabelledImages(str(manifest["instance"]), arrays["images"], arrays["labels"],
                              int(arrays["n-classes"]))  # fmt: skip
    n = int(manifest["n-users"])
    clients = arrays["clients"]
    first, count = int(entry["first-user"]), int(entry["num-users"])
    if not np.array_equal(clients, np.arange(first, first + count)):
        raise NodeDataError(
            f"{path}: clients differ from the manifest's [{first}, {first + count})"
        )
    empty = np.zeros(0, dtype=np.int64)
    train_idx, test_idx = [empty] * n, [empty] * n
    flipped = np.zeros(n, dtype=bool)
    for j, k in enumerate(clients.tolist()):
        train_idx[k] = arrays["train-index"][
            arrays["train-offsets"][j] : arrays["train-offsets"][j + 1]
        ]
        test_idx[k] = arrays["test-index"][
            arrays["test-offsets"][j] : arrays["test-offsets"][j + 1]
        ]
        flipped[k] = bool(arrays["flipped"][j])
    return Federation(
        data,
        int(manifest["n-seen"]),
        int(manifest["n-unseen"]),
        train_idx,
        test_idx,
        flipped,
        float(arrays["mean"]),
        float(arrays["std"]),
    )


# ---------------------------------------------------------------------- FedSubAvg ratings
#: run_config keys that define a rating task (they must match the export's)
RATING_SOURCE_KEYS = ("dataset", "data-seed", "num-users", "num-elements")


def export_ratings(
    task: Any,
    num_partitions: int,
    out: str | os.PathLike[str],
    *,
    dataset: str,
    source: dict[str, Any],
) -> dict[str, Any]:
    """Write one ``node-<p>.npz`` per node (FedSubAvg clients, the cohort split) + manifest.

    Parameters
    ----------
    task : flower_app.datasets.movielens_rating.RatingTask
        The rating task (every client).
    num_partitions : int
        Number of nodes N.
    out : str or os.PathLike
        Output folder.
    dataset : str
        The ``dataset`` run_config value.
    source : dict
        The run_config values of :data:`RATING_SOURCE_KEYS` that made ``task``.

    Returns
    -------
    dict
        The manifest (also written to ``out/manifest.json``).

    Notes
    -----
    A node file holds its clients' samples only, as model rows (no user or movie ids); its
    arrays are listed in ``docs/node-local-data.md``.
    """
    folder = _export_folder(out, num_partitions)
    n = int(task.n_clients)
    files = []
    for p in range(num_partitions):
        first, count = cohort_range(n, p, num_partitions)
        lo, hi = int(task.train_ptr[first]), int(task.train_ptr[first + count])
        s_lo, s_hi = int(task.sub_ptr[first]), int(task.sub_ptr[first + count])
        mine = (task.test_client >= first) & (task.test_client < first + count)
        ev = task.eval_idx[(task.eval_idx >= lo) & (task.eval_idx < hi)] - lo
        arrays = {
            "train-rows": task.train_rows[lo:hi],
            "train-pos": task.train_pos[lo:hi],
            "train-y": task.train_y[lo:hi],
            "train-counts": np.diff(task.train_ptr[first : first + count + 1]),
            "sub-rows": task.sub_rows[s_lo:s_hi],
            "sub-counts": np.diff(task.sub_ptr[first : first + count + 1]),
            "test-rows": task.test_rows[mine],
            "test-y": task.test_y[mine],
            "test-client": task.test_client[mine],
            "eval-local": ev.astype(np.int64),
            "n-movies": np.int64(task.layout.n_movies),
        }
        path = _write_npz(folder, p, arrays)
        files.append(_node_entry(p, path, hi - lo, first, count))
    sizes = {
        "n-params": int(task.n_params),
        "n-movies": int(task.layout.n_movies),
        "n-test-unattributed": int((task.test_client < 0).sum()),
    }
    manifest = _client_manifest(
        "fedsubavg", dataset, str(task.name), n, sizes, num_partitions, source, files
    )
    return _write_manifest(folder, manifest)


def load_node_ratings(path: str | os.PathLike[str], source: dict[str, Any]) -> Any:
    """Load one node's ``node-<p>.npz`` as a RatingTask holding its clients' samples only.

    Every client id exists (so the global ids of the protocol work): the other clients have
    no samples and empty submodels. ``eval_idx``, ``test_*`` are the node's share of the
    pooled train-loss sample and test set, so the nodes' sums are the pooled metrics.

    Raises
    ------
    NodeDataError
        Missing or tampered file or manifest, or a run whose task differs from the export.
    """
    task = _ratings_cached(*file_stamp(str(path)))
    _check_source(path, source, RATING_SOURCE_KEYS, "another task")
    return task


def _spread(counts: np.ndarray, first: int, n: int) -> np.ndarray:
    """Return (n+1,) offsets: client first+j has counts[j] items, every other client none."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    inner = np.cumsum(counts, dtype=np.int64)
    ptr[first + 1 : first + 1 + counts.size] = inner
    ptr[first + 1 + counts.size :] = inner[-1] if inner.size else 0
    return ptr


@lru_cache(maxsize=4)
def _ratings_cached(path: str, mtime: int, size: int) -> Any:
    from flower_app.datasets.movielens_rating import RatingTask
    from flower_app.models.sparse_logreg import OneHotLayout

    manifest, entry, a = _node_npz(path, "fedsubavg")
    with _unreadable(path):
        n = int(manifest["n-users"])
        first, count = int(entry["first-user"]), int(entry["num-users"])
        if a["train-counts"].size != count or a["sub-counts"].size != count:
            raise ValueError(f"{a['train-counts'].size} clients, the manifest says {count}")
        task = RatingTask(
            name=str(manifest["instance"]),
            layout=OneHotLayout(int(a["n-movies"])),
            user_ids=np.arange(n, dtype=np.int64),  # client numbers (no original ids)
            train_rows=a["train-rows"],
            train_pos=a["train-pos"],
            train_y=a["train-y"],
            train_ptr=_spread(a["train-counts"], first, n),
            sub_rows=a["sub-rows"],
            sub_ptr=_spread(a["sub-counts"], first, n),
            test_rows=a["test-rows"],
            test_y=a["test-y"],
            test_client=a["test-client"],
            eval_idx=a["eval-local"],
        )
    if task.n_params != int(manifest["n-params"]):
        raise NodeDataError(f"{path}: {task.n_params} model rows, the manifest says "
                            f"{manifest['n-params']}")  # fmt: skip
    return task
