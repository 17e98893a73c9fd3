"""Your own data as a submodular instance: a (user, item, value) table or a set system.

``facility-location-table`` (f_i(S) = max_{j ∈ S} r_ij)
    A CSV (``.csv``), TSV (``.tsv``, ``.tab``) or parquet (``.parquet``, ``.pq``) table with a
    header; ``data-columns`` names its user, item and value columns (default
    ``user,item,value``). Values must be finite and ≥ 0; a (user, item) pair may appear once.
``coverage-sets`` (f_i(S) = 1 if S meets user i's set)
    Either a table of (user, item) pairs as above (``data-columns`` ``user,item``; a value
    column is ignored), or a text file (any other extension) with one line per user: the
    user's items separated by spaces, tabs or commas; blank lines and lines starting with
    ``#`` are skipped.

Users and items are labels (numbers or strings). Users become clients 0..n−1 and items
elements 0..m−1 in sorted label order (numbers numerically), so the same file always gives
the same instance. ``item-names`` optionally names a CSV with header ``item,name``;
``summary.json`` then lists the selected items by label and name. Every error names the
file, the line (the header is line 1) and the expected format.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

__all__ = ["OwnDataError", "OwnInstance", "load_coverage_sets", "load_facility_table"]

_TABLE = {".csv": ",", ".tsv": "\t", ".tab": "\t"}
_PARQUET = (".parquet", ".pq")


class OwnDataError(ValueError):
    """A user's data file does not have the documented format (file, line, expectation)."""


@dataclass(frozen=True)
class OwnInstance:
    """A user-provided instance: one sparse row per user.

    Attributes
    ----------
    name : str
        ``own:<file name>``.
    values : scipy.sparse.csr_matrix
        n × m (float64): r_ij, or 1.0 for coverage.
    users, items : tuple of str
        The labels of the rows and columns, in index order.
    item_names : tuple of str or None
        A name per item (from ``item-names``), or None.
    """

    name: str
    values: sp.csr_matrix
    users: tuple[str, ...]
    items: tuple[str, ...]
    item_names: tuple[str, ...] | None


def _path(path: str) -> Path:
    if not path:
        raise OwnDataError("dataset needs run_config 'data-file' (the path of your data file)")
    file = Path(path).expanduser()
    if not file.is_file():
        raise OwnDataError(f"{file}: data-file not found (give an absolute path for flwr run)")
    return file


def _columns(spec: str, needed: int) -> list[str]:
    names = [c.strip() for c in spec.split(",") if c.strip()]
    if len(names) < needed:
        raise OwnDataError(f"data-columns={spec!r}: expected {needed} comma-separated names")
    return names[:needed]


def _read_table(file: Path, columns: list[str], expected: str) -> pd.DataFrame:
    suffix = file.suffix.lower()
    try:
        if suffix in _PARQUET:
            frame = pd.read_parquet(file)
        else:
            frame = pd.read_csv(file, sep=_TABLE[suffix], dtype=str, keep_default_na=False)
    except (ValueError, OSError, pd.errors.ParserError) as err:
        raise OwnDataError(f"{file}: not a readable table ({err}); expected {expected}") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise OwnDataError(
            f"{file}: no column {', '.join(map(repr, missing))} (found "
            f"{', '.join(map(repr, map(str, frame.columns)))}); expected {expected} "
            "(set data-columns to your column names)"
        )
    if frame.empty:
        raise OwnDataError(f"{file}: no rows; expected {expected}")
    return frame


def _index(labels: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """Return each label's index in sorted order (numbers numerically) and the sorted labels."""
    text = labels.astype(str)
    numeric = pd.to_numeric(pd.Series(text), errors="coerce")
    if not numeric.isna().any():
        keys = numeric.to_numpy()
        uniq, inverse = np.unique(keys, return_inverse=True)
        order = [text[np.flatnonzero(keys == u)[0]] for u in uniq]
        return inverse, tuple(order)
    uniq, inverse = np.unique(text, return_inverse=True)
    return inverse, tuple(str(u) for u in uniq)


def _names(path: str, items: tuple[str, ...]) -> tuple[str, ...] | None:
    if not path:
        return None
    file = Path(path).expanduser()
    if not file.is_file():
        raise OwnDataError(f"{file}: item-names file not found")
    names: dict[str, str] = {}
    with open(file, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["item", "name"]:
            raise OwnDataError(f"{file}: line 1: expected the header 'item,name'")
        for line, row in enumerate(reader, start=2):
            if len(row) < 2:
                raise OwnDataError(f"{file}: line {line}: expected 'item,name'")
            names[row[0].strip()] = row[1].strip()
    return tuple(names.get(item, "") for item in items)


def load_facility_table(
    path: str, columns: str = "user,item,value", item_names: str = ""
) -> OwnInstance:
    """Load a (user, item, value) table as a facility-location instance.

    Raises
    ------
    OwnDataError
        Missing file or column, a value that is not a finite number ≥ 0, a repeated
        (user, item) pair: the file, the line and the expected format are named.
    """
    file = _path(path)
    user, item, value = _columns(columns, 3)
    expected = f"a table with columns {user},{item},{value} (value a number >= 0)"
    frame = _read_table(file, [user, item, value], expected)
    raw = frame[value].astype(str).str.strip()
    numbers = pd.to_numeric(raw, errors="coerce").to_numpy(np.float64)
    bad = ~np.isfinite(numbers) | (numbers < 0)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise OwnDataError(
            f"{file}: line {row + 2}: {value} = {raw.iloc[row]!r}; expected {expected}"
        )
    users, user_labels = _index(frame[user].to_numpy())
    items, item_labels = _index(frame[item].to_numpy())
    pairs = users.astype(np.int64) * len(item_labels) + items
    uniq, first, counts = np.unique(pairs, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[np.flatnonzero(counts > 1)[0]])
        lines = np.flatnonzero(pairs == dup)[:2] + 2
        who, what = user_labels[dup // len(item_labels)], item_labels[dup % len(item_labels)]
        raise OwnDataError(
            f"{file}: lines {lines[0]} and {lines[1]}: the pair ({who}, {what}) appears twice; "
            f"expected one {value} per ({user}, {item})"
        )
    values = sp.csr_matrix(
        (numbers, (users, items)), shape=(len(user_labels), len(item_labels)), dtype=np.float64
    )
    values.eliminate_zeros()
    return OwnInstance(f"own:{file.name}", values, user_labels, item_labels,
                       _names(item_names, item_labels))  # fmt: skip


def load_coverage_sets(
    path: str, columns: str = "user,item", item_names: str = ""
) -> OwnInstance:
    """Load a set system (pairs table or one line of items per user) as max coverage.

    Raises
    ------
    OwnDataError
        Missing file or column, an empty file: the file, the line and the format are named.
    """
    file = _path(path)
    if file.suffix.lower() in (*_TABLE, *_PARQUET):
        user, item = _columns(columns, 2)
        frame = _read_table(file, [user, item], f"a table with columns {user},{item}")
        users, user_labels = _index(frame[user].to_numpy())
        items, item_labels = _index(frame[item].to_numpy())
    else:
        rows: list[list[str]] = []
        with open(file, encoding="utf-8") as fh:
            for line, text in enumerate(fh, start=1):
                text = text.strip()
                if not text or text.startswith("#"):
                    continue
                tokens = [t for t in text.replace(",", " ").split() if t]
                if not tokens:
                    raise OwnDataError(f"{file}: line {line}: expected items separated by "
                                       "spaces, tabs or commas")  # fmt: skip
                rows.append(tokens)
        if not rows:
            raise OwnDataError(f"{file}: no sets; expected one line of items per user")
        flat = np.array([t for r in rows for t in r], dtype=object)
        items, item_labels = _index(flat)
        users = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
        user_labels = tuple(str(i) for i in range(len(rows)))
    values = sp.csr_matrix(
        (np.ones(users.size), (users, items)), shape=(len(user_labels), len(item_labels))
    )
    values.data[:] = 1.0  # a pair listed twice still covers once
    return OwnInstance(f"own:{file.name}", values, user_labels, item_labels,
                       _names(item_names, item_labels))  # fmt: skip
