"""Your own data as a submodular instance: a (user, item, value) table or a set system.

``facility-location-table`` (f_i(S) = max_{j ∈ S} r_ij)
    A CSV (``.csv``), TSV (``.tsv``, ``.tab``) or parquet (``.parquet``, ``.pq``) table with a
    header; ``data-columns`` names its user, item and value columns (default
    ``user,item,value``; a fourth name is refused, not ignored). Values must be finite and
    ≥ 0; a (user, item) pair may appear once.
``coverage-sets`` (f_i(S) = 1 if S meets user i's set)
    Either a table of (user, item) pairs as above (``data-columns`` names two columns,
    ``user,item``; the default ``user,item,value`` is read as ``user,item``; other columns of
    the table are not read), or a text file (any other extension) with one line per user: the
    user's items separated by spaces, tabs or commas; lines starting with ``#`` are
    comments. A blank line between sets is refused (it would be a user with no items, who
    counts in n); blank lines at the end of the file are not users.

A table is UTF-8 text (a byte-order mark is allowed) with a header; every row has as many
fields as the header (an empty line is no row), and no user or item cell is empty (in
parquet: null, a list or a record). Users and items are labels (numbers or strings,
surrounding spaces removed), different whenever their text differs (``7`` and ``007`` are
two users). Users become clients 0..n−1 and items elements 0..m−1 in sorted label order
(integers numerically, exactly, however long; then decimals numerically; otherwise as text),
so the same file always gives the same instance. ``item-names`` optionally names a CSV with
header ``item,name``; ``summary.json`` then lists the selected items by label and name.
Every error names the file, the line (the header is line 1) and the expected format.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from flower_app.settings.rules import PARQUET_SUFFIXES, TABLE_SUFFIXES, TEXT_TABLE_SEPARATORS

if TYPE_CHECKING:  # pandas is imported where a table is read: a MaxFL ClientApp imports
    import pandas as pd  # this module for OwnDataError alone

__all__ = [
    "DEFAULT_COLUMNS",
    "OwnDataError",
    "OwnInstance",
    "load_coverage_sets",
    "load_facility_table",
    "table_columns",
]



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
        raise OwnDataError(f"run_config 'data-file': {file} not found (give an absolute path "
                           "for flwr run)")  # fmt: skip
    return file


#: ``data-columns``' default (facility location's); coverage-sets reads its first two
DEFAULT_COLUMNS = "user,item,value"


def _columns(spec: str, needed: int) -> list[str]:
    """Return exactly ``needed`` column names; more or fewer are refused, never cut."""
    names = [c.strip() for c in spec.split(",") if c.strip()]
    if len(names) != needed:
        raise OwnDataError(f"run_config 'data-columns' = {spec!r}: {len(names)} names; expected "
                           f"{needed} comma-separated names")  # fmt: skip
    return names


def table_columns(dataset: str, spec: str) -> list[str]:
    """Return the column names ``dataset`` reads from a table, given ``data-columns``.

    ``facility-location-table``: exactly user,item,value; ``coverage-sets``: exactly
    user,item (the default ``user,item,value`` is read as ``user,item``);
    ``rating-table``: user, one or more features, label.

    Raises
    ------
    OwnDataError
        Naming ``data-columns`` when it names more or fewer columns than the dataset reads
        (an extra name is refused, not ignored).
    """
    if dataset == "coverage-sets":
        return _columns("user,item" if spec == DEFAULT_COLUMNS else spec, 2)
    if dataset == "rating-table":
        names = [c.strip() for c in spec.split(",") if c.strip()]
        if len(names) < 3:
            raise OwnDataError(
                f"run_config 'data-columns' = {spec!r}: dataset 'rating-table' needs at least 3 "
                "names (user, one or more features, label)"
            )
        return _columns(spec, len(names))
    return _columns(spec, 3)


def _decode_error(file: Path, err: UnicodeDecodeError, expected: str) -> OwnDataError:
    return OwnDataError(
        f"{file}: not UTF-8 text ({err.reason} at byte {err.start}); expected {expected} "
        "saved as UTF-8"
    )


def _read_text_table(file: Path, sep: str, expected: str) -> tuple[pd.DataFrame, np.ndarray]:
    import pandas as pd

    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        with open(file, encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh, delimiter=sep, strict=True)
            header = next(reader, None)
            if header is None:
                raise OwnDataError(f"{file}: empty file; expected {expected}")
            header = [h.strip() for h in header]
            if len(set(header)) != len(header):
                raise OwnDataError(f"{file}: line 1: a column name repeats ({header}); "
                                   f"expected {expected}")  # fmt: skip
            start = reader.line_num
            for row in reader:
                if not row:
                    start = reader.line_num
                    continue  # an empty line holds no row
                if len(row) != len(header):
                    raise OwnDataError(
                        f"{file}: line {start + 1}: {len(row)} fields, the header has "
                        f"{len(header)}; expected {expected}"
                    )
                rows.append(row)
                lines.append(start + 1)
                start = reader.line_num
    except UnicodeDecodeError as err:
        raise _decode_error(file, err, expected) from None
    except csv.Error as err:
        raise OwnDataError(f"{file}: line {reader.line_num}: {err}; expected {expected}") from None
    frame = (
        pd.DataFrame(rows, columns=header, dtype=str)
        if rows
        else pd.DataFrame(columns=header, dtype=str)
    )
    return frame, np.asarray(lines, dtype=np.int64)


def _read_table(
    file: Path, columns: list[str], expected: str, labels: tuple[str, ...] = ()
) -> tuple[pd.DataFrame, np.ndarray]:
    """Return the table (text cells) and each row's line in the file (header: line 1).

    ``labels``: columns whose cells name a user or an item; an empty one is refused.
    """
    import pandas as pd

    suffix = file.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        try:
            frame = pd.read_parquet(file)
        except (ValueError, OSError) as err:
            raise OwnDataError(f"{file}: not a readable parquet table ({err}); "
                               f"expected {expected}") from None  # fmt: skip
        lines = np.arange(len(frame), dtype=np.int64) + 1  # rows, counted from 1
        nulls = [c for c in columns if c in frame.columns and frame[c].isna().any()]
        if nulls:
            row = int(np.flatnonzero(frame[nulls[0]].isna().to_numpy())[0])
            raise OwnDataError(f"{file}: row {row + 1}: column {nulls[0]!r} is null; "
                               f"expected {expected}")  # fmt: skip
        for name in (c for c in columns if c in frame.columns and frame[c].dtype == object):
            nested = frame[name].map(lambda v: isinstance(v, list | tuple | dict | np.ndarray))
            if nested.any():  # their text could collide (numpy shortens long arrays)
                row = int(np.flatnonzero(nested.to_numpy())[0])
                raise OwnDataError(f"{file}: row {row + 1}: column {name!r} holds a list or "
                                   f"record; expected one value per cell ({expected})")  # fmt: skip
        frame = frame.astype({c: str for c in columns if c in frame.columns})
    else:
        frame, lines = _read_text_table(file, TEXT_TABLE_SEPARATORS[suffix], expected)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise OwnDataError(
            f"{file}: no column {', '.join(map(repr, missing))} (found "
            f"{', '.join(map(repr, map(str, frame.columns)))}); expected {expected} "
            "(set data-columns to your column names)"
        )
    if frame.empty:
        raise OwnDataError(f"{file}: no rows; expected {expected}")
    where = "row" if suffix in PARQUET_SUFFIXES else "line"
    for name in labels:
        cells = frame[name].astype(str).str.strip()
        empty = (cells == "").to_numpy()
        if empty.any():
            raise OwnDataError(f"{file}: {where} {lines[np.flatnonzero(empty)[0]]}: column "
                               f"{name!r} is empty; expected {expected}")  # fmt: skip
        frame[name] = cells
    return frame, lines


_INTEGER = re.compile(r"[+-]?\d+")


def _index(labels: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """Return each label's index in sorted order and the sorted labels.

    Labels are equal only when their text is; the order is numeric (exact for integers of
    any length) when every label is a number, else by text.
    """
    import pandas as pd

    text = labels.astype(str)
    uniq, inverse = np.unique(text, return_inverse=True)
    words = [str(u) for u in uniq]
    if all(_INTEGER.fullmatch(w) for w in words):
        keys: list[Any] = [(int(w), w) for w in words]
    else:
        numbers = pd.to_numeric(pd.Series(words, dtype=object), errors="coerce").to_numpy()
        finite = np.isfinite(numbers.astype(np.float64))
        keys = [(float(n), w) for n, w in zip(numbers, words, strict=True)] if finite.all() \
            else [(0.0, w) for w in words]  # fmt: skip
    order = sorted(range(len(words)), key=keys.__getitem__)
    rank = np.empty(len(words), dtype=np.int64)
    rank[order] = np.arange(len(words))
    return rank[inverse.ravel()], tuple(words[k] for k in order)


def _names(path: str, items: tuple[str, ...]) -> tuple[str, ...] | None:
    if not path:
        return None
    file = Path(path).expanduser()
    if not file.is_file():
        raise OwnDataError(f"{file}: item-names file not found")
    names: dict[str, str] = {}
    expected = "a CSV with the header 'item,name' and two fields per line"
    try:
        with open(file, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None or [h.strip() for h in header] != ["item", "name"]:
                raise OwnDataError(f"{file}: line 1: expected the header 'item,name'")
            for row in reader:
                line = reader.line_num
                if not row:
                    continue
                if len(row) != 2 or not row[0].strip():
                    raise OwnDataError(f"{file}: line {line}: {row!r}; expected {expected}")
                item = row[0].strip()
                if item in names:
                    raise OwnDataError(f"{file}: line {line}: item {item!r} is named twice; "
                                       f"expected {expected}")  # fmt: skip
                names[item] = row[1].strip()
    except UnicodeDecodeError as err:
        raise _decode_error(file, err, expected) from None
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
    import pandas as pd

    file = _path(path)
    user, item, value = table_columns("facility-location-table", columns)
    expected = f"a table with columns {user},{item},{value} (value a number >= 0)"
    frame, lines = _read_table(file, [user, item, value], expected, labels=(user, item))
    raw = frame[value].astype(str).str.strip()
    numbers = pd.to_numeric(raw, errors="coerce").to_numpy(np.float64)
    bad = ~np.isfinite(numbers) | (numbers < 0)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise OwnDataError(
            f"{file}: line {lines[row]}: {value} = {raw.iloc[row]!r}; expected {expected}"
        )
    users, user_labels = _index(frame[user].to_numpy())
    items, item_labels = _index(frame[item].to_numpy())
    pairs = users.astype(np.int64) * len(item_labels) + items
    uniq, first, counts = np.unique(pairs, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[np.flatnonzero(counts > 1)[0]])
        twice = lines[np.flatnonzero(pairs == dup)[:2]]
        who, what = user_labels[dup // len(item_labels)], item_labels[dup % len(item_labels)]
        raise OwnDataError(
            f"{file}: lines {twice[0]} and {twice[1]}: the pair ({who}, {what}) appears twice; "
            f"expected one {value} per ({user}, {item})"
        )
    values = sp.csr_matrix(
        (numbers, (users, items)), shape=(len(user_labels), len(item_labels)), dtype=np.float64
    )
    values.eliminate_zeros()
    return OwnInstance(f"own:{file.name}", values, user_labels, item_labels,
                       _names(item_names, item_labels))  # fmt: skip


def load_coverage_sets(path: str, columns: str = "user,item", item_names: str = "") -> OwnInstance:
    """Load a set system (pairs table or one line of items per user) as max coverage.

    Raises
    ------
    OwnDataError
        Missing file or column, an empty file: the file, the line and the format are named.
    """
    file = _path(path)
    if file.suffix.lower() in TABLE_SUFFIXES:
        user, item = table_columns("coverage-sets", columns)
        frame, _ = _read_table(file, [user, item], f"a table with columns {user},{item}",
                               labels=(user, item))  # fmt: skip
        users, user_labels = _index(frame[user].to_numpy())
        items, item_labels = _index(frame[item].to_numpy())
    else:
        rows: list[list[str]] = []
        expected = "one line of items (separated by spaces, tabs or commas) per user"
        blank = 0  # the first blank line not yet followed by a set
        try:
            with open(file, encoding="utf-8-sig") as fh:
                for line, text in enumerate(fh, start=1):
                    text = text.strip()
                    if text.startswith("#"):
                        continue
                    if not text:
                        blank = blank or line
                        continue
                    if blank:
                        raise OwnDataError(
                            f"{file}: line {blank} is blank: every line is one user's set (a "
                            f"user with no items would count in n); delete it or start it "
                            f"with '#'; expected {expected}"
                        )
                    tokens = [t for t in text.replace(",", " ").split() if t]
                    if not tokens:
                        raise OwnDataError(f"{file}: line {line}: {text!r}; expected "
                                           f"{expected}")  # fmt: skip
                    rows.append(tokens)
        except UnicodeDecodeError as err:
            raise _decode_error(file, err, expected) from None
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
