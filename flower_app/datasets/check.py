"""Check a run's data files in about a second, before Flower starts: :func:`data_problems`.

``flower-app run`` and ``python -m flower_app.settings --check`` call it after the
run_config itself is valid. It finds each file the way its loader does (the loaders' own
functions and file names) and reads only what names the format: a table's header, the
first record of a CSV or JSON-lines file, an IDX header, an ``.npz``'s array names. A file
that passes may still hold a bad line further down; its loader names that one when the run
reads it.
"""

from __future__ import annotations

import csv
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flower_app.datasets.paths import (
    DATA_DIR_ENV,
    OFFLINE_ENV,
    DatasetNotFoundError,
    download_allowed,
    open_text,
    resolve_data_dir,
)

__all__ = ["data_problems"]

#: the run_config keys that hold a path
PATH_KEYS = ("data-dir", "data-file", "item-names", "element-groups", "output-dir")


def _first_line(path: Path, encoding: str = "utf-8") -> str:
    with open_text(path, encoding) as fh:
        return fh.readline()


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


def _movielens(cfg: Any) -> list[str]:
    from flower_app.datasets.movielens import _SCHEMAS, _SUBDIR, ML1M_FILES

    folder = resolve_data_dir(cfg.data_dir) / _SUBDIR
    paths = [folder / name for name in ML1M_FILES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        if download_allowed(None):
            return []  # the loader downloads the official archive (with its checksum)
        return [
            f"MovieLens-1M: {', '.join(map(str, missing))} missing and downloads are off "
            f"({OFFLINE_ENV}=1); put the official ml-1m/*.dat there or set data-dir"
        ]
    found = []
    for path in paths:
        line = _first_line(path, "latin-1").rstrip("\r\n")
        fields = len(_SCHEMAS[path.name])
        if line.count("::") != fields - 1:
            found.append(
                f"{path}, line 1: {line[:80]!r}; expected {fields} fields separated by '::'"
            )
    return found


def _idx_files(folder: Path, stems: Any, name: str, download: bool) -> list[str]:
    from flower_app.datasets.idx import read_idx_shape
    from flower_app.datasets.paths import DataFormatError

    found, missing = [], []
    for stem in stems:
        path = next((folder / n for n in (stem + ".gz", stem) if (folder / n).is_file()), None)
        if path is None:
            missing.append(folder / (stem + ".gz"))
            continue
        try:
            read_idx_shape(path, 1 if "labels" in stem else 3)
        except DataFormatError as err:
            found.append(str(err).splitlines()[0])
    if missing and not download:
        found.append(f"{name}: {', '.join(map(str, missing))} missing")
    return found


def _fmnist(cfg: Any) -> list[str]:
    from flower_app.datasets.fmnist import FMNIST_FILES

    folder = resolve_data_dir(cfg.data_dir) / "fashion-mnist"
    return _idx_files(folder, FMNIST_FILES, "Fashion-MNIST", download_allowed(None))


def _emnist(cfg: Any) -> list[str]:
    from flower_app.datasets.emnist import EMNIST_FILES

    folder = resolve_data_dir(cfg.data_dir) / "emnist"
    return _idx_files(folder, EMNIST_FILES, "EMNIST ByClass (cannot be downloaded)", False)


def _dblp(cfg: Any) -> list[str]:
    from flower_app.datasets.dblp import find_dblp_files

    xml, _ = find_dblp_files(cfg.data_dir)
    with open_text(xml, "utf-8") as fh:
        head = fh.read(4096)
    if "<dblp" not in head and "<?xml" not in head:
        return [f"{xml}: does not start like dblp.xml (no '<?xml' or '<dblp' in its first 4 KB)"]
    return []


def _sent140(cfg: Any) -> list[str]:
    from flower_app.datasets.sent140 import find_sent140_files, read_sentiment140_csv

    root = resolve_data_dir(cfg.data_dir)
    files = find_sent140_files(root / "sent140")
    found = []
    if files.csv is not None:
        next(read_sentiment140_csv(files.csv), None)  # the first line's six fields
    for path in files.paths[1 if files.csv else 0 :]:
        with open_text(path, "utf-8") as fh:
            if fh.read(64).lstrip()[:1] != "{":
                found.append(f"{path}: not a LEAF JSON object (it does not start with '{{')")
    if cfg.family == "maxfl":
        from flower_app.datasets.sent140_features import GLOVE_FILE

        names = [GLOVE_FILE, f"{GLOVE_FILE}.gz"]
        if not any((d / n).is_file() for d in (root / "sent140", root) for n in names):
            found.append(f"Sent140 (MaxFL): the GloVe file {GLOVE_FILE} is in neither "
                         f"{root / 'sent140'} nor {root}")  # fmt: skip
    if cfg.family == "fedsubavg" and cfg.get("fsa-embedding-init") == "glove":
        from flower_app.datasets.sent140 import GLOVE_25D_FILE

        names = [GLOVE_25D_FILE, f"{GLOVE_25D_FILE}.gz"]
        if not any((d / n).is_file() for d in (root / "sent140", root) for n in names):
            found.append(f"fsa-embedding-init = 'glove': {GLOVE_25D_FILE} is in neither "
                         f"{root / 'sent140'} nor {root}")  # fmt: skip
    return found


def _amazon(cfg: Any) -> list[str]:
    from flower_app.datasets.amazon import find_amazon_files

    files = find_amazon_files(resolve_data_dir(cfg.data_dir) / "amazon")
    next(files.read(), None)  # the first record (a header is recognised and skipped)
    return []


def _table_header(path: Path, columns: list[str]) -> list[str]:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        names = list(pq.read_schema(path).names)
    else:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            header = next(csv.reader(fh, delimiter="," if suffix == ".csv" else "\t"), [])
        names = [h.strip() for h in header]
    missing = [c for c in columns if c not in names]
    if missing:
        return [
            f"{path}: line 1: no column {', '.join(map(repr, missing))} (found "
            f"{', '.join(map(repr, names))}); set data-columns to your column names"
        ]
    return []


def _own(cfg: Any) -> list[str]:
    if not cfg.data_file:
        return [f"dataset {cfg.dataset!r} needs run_config 'data-file' (the path of your data)"]
    path = Path(cfg.data_file).expanduser()
    if not path.is_file():
        return [f"run_config 'data-file': {path} not found"]
    suffix = path.suffix.lower()
    columns = [c.strip() for c in cfg.data_columns.split(",") if c.strip()]
    tables = (".csv", ".tsv", ".tab", ".parquet", ".pq")
    if cfg.dataset == "image-clients":
        if suffix == ".npz":
            with zipfile.ZipFile(path) as z:
                names = {n.removesuffix(".npy") for n in z.namelist()}
            if not {"x", "y"} <= names:
                return [f"{path}: arrays {sorted(names)} lack x or y; expected an .npz with "
                        "x (images), y (labels) and optionally client"]  # fmt: skip
            if names - {"x", "y", "client"}:
                return [f"{path}: arrays {sorted(names - {'x', 'y', 'client'})} are not x, y "
                        "or client; expected an .npz with x (images), y (labels) and "
                        "optionally client"]  # fmt: skip
        return []
    if cfg.dataset == "rating-table" and suffix not in tables:
        return [f"{path}: dataset 'rating-table' reads a .csv, .tsv or .parquet table"]
    if suffix in tables:
        needed = {"facility-location-table": 3, "coverage-sets": 2}.get(cfg.dataset, 3)
        if len(columns) < needed:
            return [f"run_config 'data-columns' = {cfg.data_columns!r}: {cfg.dataset} needs "
                    f"{needed} comma-separated names"]  # fmt: skip
        keep = columns if cfg.dataset == "rating-table" else columns[:needed]
        return _table_header(path, keep)
    return []


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


#: dataset -> the check of its files
CHECKS: dict[str, Callable[[Any], list[str]]] = {
    "movielens": _movielens,
    "movielens-rating": _movielens,
    "dblp": _dblp,
    "fmnist": _fmnist,
    "emnist": _emnist,
    "sent140": _sent140,
    "amazon": _amazon,
    "facility-location-table": _own,
    "coverage-sets": _own,
    "rating-table": _own,
    "image-clients": _own,
}


def data_problems(cfg: Any) -> list[str]:
    """Return the problems of a valid config's data files, one line each (empty: none).

    Parameters
    ----------
    cfg : flower_app.config.AppConfig
        The validated run configuration.

    Returns
    -------
    list of str
        Relative paths (the Flower processes run elsewhere), missing files (naming where
        they were looked for), headers or first records that do not parse. With
        ``server-data = "none"`` the server reads no data: only ``element-groups`` is
        checked (the nodes check their own files).
    """
    found = _relative(cfg)
    if cfg.element_groups:
        found += _csv_header("element-groups", cfg.element_groups, ["element", "group"], "utf-8")
    if cfg.server_data == "none":
        return found
    check = CHECKS.get(cfg.dataset)
    if check is not None:
        try:
            found += check(cfg)
        except DatasetNotFoundError as err:
            lines = str(err).splitlines()
            files = "; ".join(line.strip() for line in lines[1:] if line.startswith("  "))
            found.append(f"{lines[0]} {files}; data folder: run_config 'data-dir' or "
                         f"${DATA_DIR_ENV}")  # fmt: skip
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            found.append(str(err).splitlines()[0])
    if cfg.item_names and cfg.dataset in ("facility-location-table", "coverage-sets"):
        found += _csv_header("item-names", cfg.item_names, ["item", "name"], "utf-8-sig")
    return found
