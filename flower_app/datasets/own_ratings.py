"""Your own rating table for the FedSubAvg family (``dataset = "rating-table"``).

``data-file`` is a CSV (``.csv``), TSV (``.tsv``, ``.tab``) or parquet (``.parquet``, ``.pq``)
table with a header; ``data-columns`` names its columns in order: the **user** (one client per
user), one or more **feature** columns, and the **label** last, e.g.
``user,movie,genre,clicked``. Features are categorical (any values: ids, strings); the label
must be 0 or 1 on every line (threshold a rating first, as the paper does with "rating ≥ 4").

The model is the paper's sparse logistic regression on one-hot features: row 0 is the bias,
then one block of rows per feature column, one row per distinct value (sorted; numbers
numerically). A client's submodel S(i) is the rows its training samples touch — the rows
FedSubAvg sends it and corrects by feature heat. Samples are split 80/20 into train and test
at random with ``data-seed`` (as for MovieLens); users left without a training sample are
dropped. Every error names the file, the line (the header is line 1) and the format.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from flower_app.datasets.movielens_rating import RatingTask, task_from_rows
from flower_app.datasets.own import (
    OwnDataError,
    _index,
    _path,
    _read_table,
    table_columns,
)
from flower_app.settings.rules import TABLE_SUFFIXES

__all__ = ["TableLayout", "load_rating_table"]

_EXPECTED = (
    "a CSV/TSV/parquet table with a header and columns user, feature(s)..., label (0 or 1), "
    "named in order by data-columns"
)


@dataclass(frozen=True)
class TableLayout:
    """Rows of a one-hot logistic regression: the bias, then one block per feature column.

    Attributes
    ----------
    columns : tuple of str
        The feature columns.
    sizes : tuple of int
        Distinct values of each.
    """

    columns: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def n_params(self) -> int:
        """Model rows M = 1 + Σ distinct values."""
        return 1 + int(sum(self.sizes))

    def blocks(self) -> dict[str, slice]:
        """Return each block's row range (``bias``, then the feature columns)."""
        out, start = {"bias": slice(0, 1)}, 1
        for name, size in zip(self.columns, self.sizes, strict=True):
            out[name] = slice(start, start + size)
            start += size
        return out


@lru_cache(maxsize=4)
def load_rating_table(data_file: str, data_columns: str, split_seed: int = 0) -> RatingTask:
    """Read your table into the rating task (see the module docstring); cached per process.

    Raises
    ------
    OwnDataError
        Naming the file, the line and the expected format.
    """
    file = _path(data_file)
    if file.suffix.lower() not in TABLE_SUFFIXES:
        raise OwnDataError(f"{file}: unknown table extension {file.suffix!r}; expected "
                           f"{_EXPECTED}")  # fmt: skip
    columns = table_columns("rating-table", data_columns)
    user_col, features, label_col = columns[0], columns[1:-1], columns[-1]
    frame, lines = _read_table(file, columns, _EXPECTED, labels=(user_col, *features))
    labels = frame[label_col].astype(str).str.strip()
    y = labels.map({"0": 0.0, "1": 1.0, "0.0": 0.0, "1.0": 1.0, "False": 0.0, "True": 1.0,
                    "false": 0.0, "true": 1.0})  # fmt: skip
    if y.isna().any():
        bad = int(np.flatnonzero(y.isna().to_numpy())[0])
        raise OwnDataError(
            f"{file}, line {lines[bad]}: label {label_col!r} = {labels.iloc[bad]!r}; expected 0 or "
            f"1 ({_EXPECTED})"
        )
    users, _ = _index(frame[user_col].to_numpy())
    offsets, sizes, blocks = 1, [], []
    for name in features:
        codes, values = _index(frame[name].to_numpy())
        blocks.append(offsets + codes)
        offsets += len(values)
        sizes.append(len(values))
    rows = np.column_stack([np.zeros(len(frame), dtype=np.int64), *blocks]).astype(np.int64)
    layout = TableLayout(tuple(features), tuple(sizes))
    return task_from_rows(rows, y.to_numpy(np.float64), users.astype(np.int64), layout,
                          f"own:{file.name}", split_seed)  # fmt: skip
