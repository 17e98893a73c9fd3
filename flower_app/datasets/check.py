"""Check a run's data files and the instance they make, before Flower starts: :func:`check_data`.

``flower-app run`` and ``python -m flower_app.settings --check`` call it after the
run_config itself is valid. It finds each file the way its loader does (the loaders' own
functions and file names), and:

- reads a small file to its end with its loader (your own tables, sets and images, LEAF
  and Amazon files up to :data:`FULL_READ_BYTES` in all), so any bad line, any user seen in
  two files, is named before Flower starts; a gzip-compressed file up to that size is
  decompressed to its end (a truncated download is named);
- of a larger file reads what names the format: a table's header, the first record of a
  CSV or JSON-lines file, an IDX header, an ``.npz``'s array names (a bad line further down
  is named by its loader when the run reads it);
- learns what the rules between the keys and the instance need (users, elements, the
  matroid's rank: :class:`~flower_app.settings.rules.Instance`) where that is cheap: from
  the keys for the synthetic instances and MaxFL's clients, from the two id fields of
  MovieLens' ``ratings.dat``, from the files read to their end; and evaluates those rules
  (:data:`~flower_app.settings.rules.SIZE_RULES`), the same the runners evaluate on the
  loaded instance. What is not known (the DBLP dump, large Sentiment140 or Amazon files)
  is checked by the runner when it has loaded the instance.
"""

from __future__ import annotations

import csv
import os
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from flower_app.datasets.paths import (
    DATA_DIR_ENV,
    GZIP_ERRORS,
    OFFLINE_ENV,
    DataFormatError,
    DatasetNotFoundError,
    download_allowed,
    open_binary,
    open_text,
    resolve_data_dir,
)
from flower_app.registry import FEDSUBAVG_TORCH_DATASETS
from flower_app.settings.rules import (
    PARQUET_SUFFIXES,
    TABLE_SUFFIXES,
    TEXT_TABLE_SEPARATORS,
    Instance,
    size_problems,
)

__all__ = ["FULL_READ_BYTES", "check_data", "data_problems", "gzip_problem"]

#: the run_config keys that hold a path
PATH_KEYS = ("data-dir", "data-file", "item-names", "element-groups", "output-dir")
#: files (together) up to this size are read to their end by the check
FULL_READ_BYTES = 16 << 20

#: what a check returns: its problems, and what it learnt of the instance
Found = tuple[list[str], Instance | None]


def _first_line(path: Path, encoding: str = "utf-8") -> str:
    with open_text(path, encoding) as fh:
        return fh.readline()


def _small(*paths: Path) -> bool:
    return sum(p.stat().st_size for p in paths) <= FULL_READ_BYTES


def gzip_problem(path: Path) -> list[str]:
    """Return one line if ``path`` is gzip and its data end early or are damaged.

    Only a file up to :data:`FULL_READ_BYTES` is decompressed (to its end, the bytes
    discarded); a larger one is checked when its loader reads it.
    """
    if not path.is_file() or not _small(path):
        return []
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            return []
    try:
        with open_binary(path) as fh:
            while fh.read(1 << 20):
                pass
    except DataFormatError as err:
        return [str(err).splitlines()[0]]
    except GZIP_ERRORS as err:  # pragma: no cover (open_binary names the file)
        return [f"{path}: {err}"]
    return []


def _relative(cfg: Any) -> list[str]:
    found = []
    for key in PATH_KEYS:
        value = getattr(cfg, key.replace("-", "_"))
        if value and not os.path.isabs(os.path.expanduser(value)):
            found.append(
                f"run_config '{key}' = {value!r} is relative: the ServerApp and ClientApps do "
                f"not run in this folder; give the absolute path "
                f"{os.path.abspath(os.path.expanduser(value))!r}"
            )
    return found


def _rank(groups: Any, capacity: int) -> tuple[int, int]:
    """Return a partition matroid's rank and its number of blocks."""
    counts = Counter(str(g) for g in groups)
    return sum(min(capacity, c) for c in counts.values()), len(counts)


def _submodular(cfg: Any, name: str, users: int, elements: int, groups: Any = None) -> Instance:
    """Return a submodular instance (``groups``: its elements' blocks, if known)."""
    rank, blocks = None, None
    if cfg.matroid == "partition" and groups is not None:
        rank, blocks = _rank(groups, cfg.partition_capacity)
    return Instance(name, users=users, elements=elements, rank=rank, groups=blocks)


# ---------------------------------------------------------------------- built-in data
def _synthetic_submodular(cfg: Any) -> Found:
    """synthetic-facility-location, synthetic-dblp: sizes and groups from the keys."""
    from flower_app.datasets import synthetic
    from flower_app.problems import SYNTHETIC_FL_SIZE

    (n, m), groups = {
        "synthetic-facility-location": (SYNTHETIC_FL_SIZE, synthetic.facility_location_groups),
        "synthetic-dblp": (synthetic.SYNTHETIC_DBLP_SIZE, synthetic.dblp_groups),
    }[cfg.dataset]
    n, m = cfg.num_users or n, cfg.num_elements or m
    blocks = groups(m) if cfg.matroid == "partition" else None
    return [], _submodular(cfg, cfg.dataset, n, m, blocks)


def _synthetic_clients(cfg: Any) -> Found:
    """Count a learning family's stand-in clients from the keys (default: the paper's)."""
    if cfg.family == "maxfl":
        return [], _maxfl(cfg)
    from flower_app.datasets import amazon, movielens_rating, sent140

    paper = {
        "synthetic-movielens-rating": movielens_rating._ML1M_USERS,
        "synthetic-sent140": sent140.PAPER_TABLE1["clients"],
        "synthetic-amazon": amazon.PAPER_TABLE1["clients"],
    }[cfg.dataset]
    return [], Instance(cfg.dataset, users=cfg.num_users or paper)


def _movielens(cfg: Any) -> Found:
    from flower_app.datasets.movielens_files import _SCHEMAS, _SUBDIR, ML1M_FILES, movielens_shape

    folder = resolve_data_dir(cfg.data_dir) / _SUBDIR
    paths = [folder / name for name in ML1M_FILES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        if download_allowed(None):
            return [], None  # the loader downloads the official archive (with its checksum)
        return [
            f"MovieLens-1M: {', '.join(map(str, missing))} missing and downloads are off "
            f"({OFFLINE_ENV}=1); put the official ml-1m/*.dat there or set data-dir"
        ], None
    found = []
    for path in paths:
        line = _first_line(path, "latin-1").rstrip("\r\n")
        fields = len(_SCHEMAS[path.name])
        if line.count("::") != fields - 1:
            found.append(
                f"{path}, line 1: {line[:80]!r}; expected {fields} fields separated by '::'"
            )
    shape = None if found else movielens_shape(folder)
    if shape is None:
        return found, None
    users, movies, groups = shape
    if cfg.dataset == "movielens-rating":  # clients: the users (those left without a training
        return found, Instance("movielens-rating", users=users)  # sample are dropped)
    return found, _submodular(cfg, "movielens", users, movies, groups)


def _idx_files(folder: Path, stems: Any, name: str, download: bool) -> list[str]:
    from flower_app.datasets.idx import find_idx, read_idx_shape

    found, missing = [], []
    for stem in stems:
        path = find_idx(folder, stem)
        if path is None:
            missing.append(folder / (stem + ".gz"))
            continue
        try:
            read_idx_shape(path, 1 if "labels" in stem else 3)
        except DataFormatError as err:
            found.append(str(err).splitlines()[0])
            continue
        found += gzip_problem(path)
    if missing and not download:
        found.append(f"{name}: {', '.join(map(str, missing))} missing")
    return found


def _maxfl(cfg: Any, own_clients: int | None = None) -> Instance:
    """MaxFL's seen clients (what ``clients-per-round`` counts), from the keys."""
    from flower_app.datasets.maxfl_clients import client_counts

    seen, _ = client_counts(cfg.dataset, cfg.num_users, int(cfg.get("maxfl-unseen-users")),
                            own_clients, cfg.data_file)  # fmt: skip
    return Instance(cfg.dataset, users=seen)


def _fmnist(cfg: Any) -> Found:
    from flower_app.datasets.fmnist import FMNIST_FILES

    folder = resolve_data_dir(cfg.data_dir) / "fashion-mnist"
    found = _idx_files(folder, FMNIST_FILES, "Fashion-MNIST", download_allowed(None))
    return found, _maxfl(cfg)


def _emnist(cfg: Any) -> Found:
    from flower_app.datasets.emnist import EMNIST_FILES

    folder = resolve_data_dir(cfg.data_dir) / "emnist"
    found = _idx_files(folder, EMNIST_FILES, "EMNIST ByClass (cannot be downloaded)", False)
    return found, _maxfl(cfg)


def _dblp(cfg: Any) -> Found:
    from flower_app.datasets.dblp import find_dblp_files

    xml, _ = find_dblp_files(cfg.data_dir)
    with open_text(xml, "utf-8") as fh:
        head = fh.read(4096)
    if "<dblp" not in head and "<?xml" not in head:
        return [f"{xml}: does not start like dblp.xml (no '<?xml' or '<dblp' in its first "
                "4 KB)"], None  # fmt: skip
    return gzip_problem(xml), None


def _sent140(cfg: Any) -> Found:
    from flower_app.datasets.sent140 import (
        build_sent140,
        find_sent140_files,
        read_sentiment140_csv,
    )

    root = resolve_data_dir(cfg.data_dir)
    files = find_sent140_files(root / "sent140")
    found: list[str] = []
    instance = _maxfl(cfg) if cfg.family == "maxfl" else None
    if _small(*files.paths):  # every line, every user across the files
        gz = [p for path in files.paths for p in gzip_problem(path)]
        if gz:
            return gz, instance
        tweets = read_sentiment140_csv(files.csv) if files.csv else files.tweets()
        if cfg.family == "maxfl":
            for _ in tweets:
                pass
        else:  # FedSubAvg: one client per account with more than 40 tweets
            try:
                task = build_sent140(tweets, split_seed=cfg.data_seed)
            except ValueError as err:
                if str(err).startswith("no account"):
                    return [f"{root / 'sent140'}: {err}"], None
                raise
            instance = Instance("sent140", users=task.n_clients)
    else:
        if files.csv is not None:
            next(read_sentiment140_csv(files.csv), None)  # the first line's six fields
        for path in files.paths[1 if files.csv else 0 :]:
            with open_text(path, "utf-8") as fh:
                if fh.read(64).lstrip()[:1] != "{":
                    found.append(f"{path}: not a LEAF JSON object (it does not start with "
                                 "'{')")  # fmt: skip
    from flower_app.datasets.sent140 import GLOVE_25D_FILE
    from flower_app.datasets.sent140_features import GLOVE_FILE, find_glove

    glove = None
    if cfg.family == "maxfl":
        glove = ("Sent140 (MaxFL): the GloVe file", GLOVE_FILE)
    elif cfg.family == "fedsubavg" and cfg.get("fsa-embedding-init") == "glove":
        glove = ("fsa-embedding-init = 'glove':", GLOVE_25D_FILE)
    if glove is not None and find_glove(root, glove[1]) is None:
        found.append(f"{glove[0]} {glove[1]} is in neither {root / 'sent140'} nor {root}")
    return found, instance


def _amazon(cfg: Any) -> Found:
    from flower_app.datasets.amazon import MIN_RATINGS, find_amazon_files, read_metadata

    files = find_amazon_files(resolve_data_dir(cfg.data_dir) / "amazon")
    paths = [files.ratings, *([files.meta] if files.meta else [])]
    if not _small(*paths):
        next(files.read(), None)  # the first record (a header is recognised and skipped)
        return [], None
    gz = [p for path in paths for p in gzip_problem(path)]
    if gz:
        return gz, None
    counts = Counter(r.user for r in files.read())  # every line
    if files.meta is not None:
        read_metadata(files.meta)
    users = sum(c >= MIN_RATINGS for c in counts.values())
    if not users:
        return [f"{files.ratings}: no user has {MIN_RATINGS} or more ratings (one client per "
                "such user)"], None  # fmt: skip
    return [], Instance("amazon", users=users)


# ---------------------------------------------------------------------- your own data
def _table_header(path: Path, columns: list[str]) -> list[str]:
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        names = list(pq.read_schema(path).names)
    else:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            header = next(csv.reader(fh, delimiter=TEXT_TABLE_SEPARATORS[suffix]), [])
        names = [h.strip() for h in header]
    missing = [c for c in columns if c not in names]
    if missing:
        return [
            f"{path}: line 1: no column {', '.join(map(repr, missing))} (found "
            f"{', '.join(map(repr, names))}); set data-columns to your column names"
        ]
    return []


def _own_images(cfg: Any, path: Path) -> Found:
    from flower_app.datasets.own_images import check_npz_names, load_image_clients

    if _small(path):
        own = load_image_clients.__wrapped__(str(path))  # not cached: the file may change
        return [], _maxfl(cfg, own.n_clients if own.clients is not None else None)
    if path.suffix == ".npz":  # the array names only (the loader's check)
        with zipfile.ZipFile(path) as z:
            check_npz_names(path, (n.removesuffix(".npy") for n in z.namelist()))
    return [], None


def _own(cfg: Any) -> Found:
    from flower_app.datasets.own import _path, table_columns

    path = _path(cfg.data_file)  # missing: refused as the loaders refuse it
    if cfg.dataset == "image-clients":
        return _own_images(cfg, path)
    table = path.suffix.lower() in TABLE_SUFFIXES
    if table:
        columns = table_columns(cfg.dataset, cfg.data_columns)
        found = _table_header(path, columns)
        if found or not _small(path):
            return found, None
    elif not _small(path):
        return [], None
    if cfg.dataset == "rating-table":
        from flower_app.datasets.own_ratings import load_rating_table

        task = load_rating_table.__wrapped__(cfg.data_file, cfg.data_columns, cfg.data_seed)
        return [], Instance(f"own:{path.name}", users=int(task.n_clients))
    from flower_app.datasets.own import load_coverage_sets, load_facility_table

    load = load_facility_table if cfg.dataset == "facility-location-table" else load_coverage_sets
    inst = load(cfg.data_file, cfg.data_columns)  # item-names: its header, below
    n, m = inst.values.shape
    return [], _submodular(cfg, inst.name, n, m, ["one block"] * m)


def _csv_header(key: str, value: str, expected: list[str], encoding: str) -> list[str]:
    """Check that run_config ``key``'s CSV exists and starts with the ``expected`` header.

    Parameters
    ----------
    key : str
        The run_config key that names the file (in the messages).
    value : str
        Its value, the path (``~`` expanded).
    expected : list of str
        The header's column names, in order.
    encoding : str
        The encoding its loader reads the file with.

    Returns
    -------
    list of str
        One message if the file is missing or its header differs, else none.
    """
    path = Path(value).expanduser()
    if not path.is_file():
        return [f"run_config '{key}': {path} not found"]
    with open(path, encoding=encoding, newline="") as fh:
        header = [h.strip() for h in next(csv.reader(fh), [])]
    if header != expected:
        return [
            f"{path}: line 1: {','.join(header)!r}; expected the header '{','.join(expected)}'"
        ]
    return []


#: dataset -> the check of its files (and what it learns of the instance)
CHECKS: dict[str, Callable[[Any], Found]] = {
    "synthetic-facility-location": _synthetic_submodular,
    "synthetic-dblp": _synthetic_submodular,
    "movielens": _movielens,
    "movielens-rating": _movielens,
    "synthetic-movielens-rating": _synthetic_clients,
    "dblp": _dblp,
    "fmnist": _fmnist,
    "emnist": _emnist,
    "synthetic-emnist": _synthetic_clients,
    "sent140": _sent140,
    "synthetic-sent140": _synthetic_clients,
    "amazon": _amazon,
    "synthetic-amazon": _synthetic_clients,
    "facility-location-table": _own,
    "coverage-sets": _own,
    "rating-table": _own,
    "image-clients": _own,
}


def check_data(cfg: Any, nodes: int | None = None) -> tuple[list[str], Instance]:
    """Return the problems of a valid config's data, and what is known of its instance.

    Parameters
    ----------
    cfg : flower_app.config.AppConfig
        The validated run configuration.
    nodes : int, optional
        The federation's SuperNodes, when known (a local simulation's ``num-supernodes``).

    Returns
    -------
    tuple
        The problems, one line each (empty: none): relative paths (the Flower processes run
        elsewhere), missing files (naming where they were looked for), lines that do not
        parse, the keys that do not fit the instance (:data:`~flower_app.settings.rules.
        SIZE_RULES`); and the :class:`~flower_app.settings.rules.Instance`. With
        ``server-data = "none"`` the server reads no data: only ``element-groups`` and the
        federation's size are checked (the nodes check their own files).
    """
    found = _relative(cfg)
    if cfg.element_groups:
        found += _csv_header("element-groups", cfg.element_groups, ["element", "group"],
                             "utf-8-sig")  # fmt: skip
    instance = None
    check = CHECKS.get(cfg.dataset)
    if cfg.server_data != "none" and check is not None:
        try:
            more, instance = check(cfg)
            found += more
        except DatasetNotFoundError as err:
            lines = str(err).splitlines()
            files = "; ".join(line.strip() for line in lines[1:] if line.startswith("  "))
            found.append(f"{lines[0]} {files}; data folder: run_config 'data-dir' or "
                         f"${DATA_DIR_ENV}")  # fmt: skip
        except (OSError, ValueError, zipfile.BadZipFile) as err:  # ConfigError too
            found.append(str(err).splitlines()[0])
    if cfg.item_names and cfg.dataset in ("facility-location-table", "coverage-sets"):
        found += _csv_header("item-names", cfg.item_names, ["item", "name"], "utf-8-sig")
    instance = replace(
        instance or Instance(cfg.dataset),
        nodes=nodes,
        one_client_per_node=cfg.dataset in FEDSUBAVG_TORCH_DATASETS,
    )
    if not found:
        found = size_problems(cfg.to_values(), instance)
    return found, instance


def data_problems(cfg: Any, nodes: int | None = None) -> list[str]:
    """Return the problems of :func:`check_data`, one line each (empty: none)."""
    return check_data(cfg, nodes)[0]

