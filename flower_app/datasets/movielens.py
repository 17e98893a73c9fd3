"""MovieLens-1M in its official layout, and the facility-location matrix built from it.

The official archive ``ml-1m.zip`` (https://files.grouplens.org/datasets/movielens/ml-1m.zip)
unpacks to ``ml-1m/ratings.dat``, ``ml-1m/users.dat`` and ``ml-1m/movies.dat``: latin-1 text
(a file saved again with a UTF-8 byte-order mark is read as UTF-8, the mark dropped), one
record per line, fields separated by ``::``::

    ratings.dat  UserID::MovieID::Rating::Timestamp
    users.dat    UserID::Gender::Age::Occupation::Zip-code
    movies.dat   MovieID::Title::Genres            (genres joined by "|")

:func:`load_movielens_1m` reads them from ``<data_dir>/ml-1m/``, downloading and verifying the
official archive first when the files are missing and downloading is allowed. The real data has
6,040 users, 3,706 rated movies (of 3,883 listed) and 1,000,209 ratings.
"""

from __future__ import annotations

import csv
import functools
import io
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pandas as pd
import scipy.sparse as sp

from flower_app.datasets.matrices import RatingsMatrix
from flower_app.datasets.movielens_files import (
    _FIELD_SEP,
    _INT_FIELD,
    _SCHEMAS,
    _SUBDIR,
    ML1M_FILES,
    _Column,
    _read_text,
    movielens_shape,
)
from flower_app.datasets.paths import (
    DataFormatError,
    DatasetNotFoundError,
    download_allowed,
    download_file,
    file_checksum,
    resolve_data_dir,
)
from flower_app.files import atomic_file

__all__ = [
    "ML1M_FILES",
    "ML1M_MD5",
    "ML1M_URL",
    "MovieLens1M",
    "clear_cache",
    "facility_location_matrix",
    "load_movielens_1m",
    "movielens_shape",
]

ML1M_URL = "https://files.grouplens.org/datasets/movielens/ml-1m.zip"
"""Official download URL of the MovieLens-1M archive."""

ML1M_MD5 = "c4d9eecfca2ab87c1945afe126590906"
"""MD5 of ``ml-1m.zip`` as published by GroupLens."""

_ONE_CHAR_SEP = "\x1f"  # ASCII unit separator: lets pandas' C parser split the fields


@dataclass(frozen=True, eq=False)
class MovieLens1M:
    """The three MovieLens-1M tables, as read from the official files.

    Instances are cached per process (see :func:`clear_cache`): do not modify the frames.

    Parameters
    ----------
    ratings : pandas.DataFrame
        Columns ``user_id``, ``movie_id``, ``rating`` (1..5), ``timestamp`` (Unix seconds),
        all int64, in file order.
    users : pandas.DataFrame
        Columns ``user_id`` (int64), ``gender`` (``"F"``/``"M"``), ``age`` (int64, the age
        bracket code), ``occupation`` (int64 code), ``zip`` (str).
    movies : pandas.DataFrame
        Columns ``movie_id`` (int64), ``title`` (str), ``genres`` (str, the raw ``"A|B"``
        string).
    """

    ratings: pd.DataFrame
    users: pd.DataFrame
    movies: pd.DataFrame


def load_movielens_1m(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    download: bool | None = None,
    url: str = ML1M_URL,
    md5: str = ML1M_MD5,
) -> MovieLens1M:
    """Load MovieLens-1M from ``<data_dir>/ml-1m/{ratings,users,movies}.dat``.

    Parameters
    ----------
    data_dir : str or os.PathLike or None, default None
        Data folder; ``None`` or ``""`` means ``$FLOWER_APP_DATA`` or
        ``~/.cache/flower_app/datasets`` (see :func:`~flower_app.datasets.paths.resolve_data_dir`).
    download : bool or None, default None
        Whether to download the official archive when files are missing. ``None`` allows it
        unless ``FLOWER_APP_OFFLINE=1``.
    url : str, default ML1M_URL
        Where to download ``ml-1m.zip`` from (tests pass a ``file://`` URL).
    md5 : str, default ML1M_MD5
        Expected MD5 of the archive at ``url``.

    Returns
    -------
    MovieLens1M
        The parsed tables; the same object for repeated calls on unchanged files.

    Raises
    ------
    DatasetNotFoundError
        If a file is missing and downloading is disallowed or fails.
    ChecksumError
        If the downloaded archive does not have the expected MD5.
    DataFormatError
        If a file is malformed; the message names the file and the first bad line.
    """
    folder = resolve_data_dir(data_dir) / _SUBDIR
    paths = [folder / name for name in ML1M_FILES]
    if not all(path.is_file() for path in paths):
        _fetch(folder, paths, download=download, url=url, md5=md5)
    stamps = tuple((path.stat().st_mtime_ns, path.stat().st_size) for path in paths)
    return _load_cached(str(folder), stamps)


def clear_cache() -> None:
    """Forget the MovieLens-1M tables cached by :func:`load_movielens_1m` in this process."""
    _load_cached.cache_clear()


def facility_location_matrix(ml: MovieLens1M) -> RatingsMatrix:
    """Build the users x movies ratings matrix for facility location.

    Parameters
    ----------
    ml : MovieLens1M
        Tables from :func:`load_movielens_1m`.

    Returns
    -------
    RatingsMatrix
        Rows: the users that have ratings, sorted by ``user_id``. Columns: the movies with at
        least one rating, sorted by ``movie_id``. Values: the ratings as float64. Groups: each
        movie's first genre. On the real data: 6,040 x 3,706 with 1,000,209 entries.
    """
    ratings = ml.ratings
    user_ids, rows = np.unique(ratings["user_id"].to_numpy(np.int64), return_inverse=True)
    movie_ids, cols = np.unique(ratings["movie_id"].to_numpy(np.int64), return_inverse=True)
    values = sp.csr_matrix(
        (ratings["rating"].to_numpy(np.float64), (rows, cols)),
        shape=(len(user_ids), len(movie_ids)),
    )
    values.sum_duplicates()
    genres = ml.movies.set_index("movie_id")["genres"].reindex(movie_ids)
    first_genre = genres.str.split("|", n=1).str[0].to_numpy(dtype=str)
    return RatingsMatrix(
        values=values,
        user_ids=user_ids,
        element_ids=movie_ids,
        element_groups=first_genre,
        name="movielens-1m",
    )


# --------------------------------------------------------------------------- download


def _fetch(folder: Path, paths: list[Path], *, download: bool | None, url: str, md5: str) -> None:
    """Download and unpack the archive into ``folder.parent``, or raise DatasetNotFoundError."""
    source = (
        f"{ML1M_URL} (unzip it in the data folder so that the files above exist; "
        "see https://grouplens.org/datasets/movielens/1m/)"
    )
    if not download_allowed(download):
        reason = (
            "downloading is disabled (download=False or FLOWER_APP_OFFLINE=1); "
            "place the files there yourself"
        )
        raise DatasetNotFoundError("MovieLens-1M", paths, source, reason, folder.parent)
    archive = folder.parent / "ml-1m.zip"
    try:
        if not (archive.is_file() and file_checksum(archive, "md5") == md5.lower()):
            download_file(url, archive, md5=md5)
        _extract(archive, folder)
    except (URLError, TimeoutError, ConnectionError) as error:
        reason = f"downloading {url} failed: {error}"
        raise DatasetNotFoundError("MovieLens-1M", paths, source, reason, folder.parent) from error
    missing = [path for path in paths if not path.is_file()]
    if missing:
        reason = f"the archive {archive} did not contain {', '.join(p.name for p in missing)}"
        raise DatasetNotFoundError("MovieLens-1M", paths, source, reason, folder.parent)


def _extract(archive: Path, folder: Path) -> None:
    """Extract ``ml-1m/*.dat`` from ``archive`` into ``folder`` (and nothing else)."""
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive) as bundle:
        for name in ML1M_FILES:
            member = f"{_SUBDIR}/{name}"
            if member not in bundle.namelist():
                continue
            with bundle.open(member) as source, atomic_file(folder / name) as out:
                shutil.copyfileobj(source, out, 1 << 20)


# --------------------------------------------------------------------------- parsing


@functools.lru_cache(maxsize=4)
def _load_cached(folder: str, stamps: tuple) -> MovieLens1M:
    """Parse the three files of ``folder``; ``stamps`` (mtimes, sizes) invalidates the cache."""
    del stamps
    base = Path(folder)
    users = _read_dat(base / "users.dat")
    movies = _read_dat(base / "movies.dat")
    ratings = _read_dat(base / "ratings.dat")
    _check_unique(base / "users.dat", users, ["user_id"])
    _check_unique(base / "movies.dat", movies, ["movie_id"])
    _check_values(base / "users.dat", users, "gender", users["gender"].isin(["F", "M"]), "F or M")
    _check_values(
        base / "ratings.dat", ratings, "rating", ratings["rating"].between(1, 5), "in 1..5"
    )
    _check_values(
        base / "ratings.dat",
        ratings,
        "user_id",
        ratings["user_id"].isin(users["user_id"]),
        "a UserID listed in users.dat",
    )
    _check_values(
        base / "ratings.dat",
        ratings,
        "movie_id",
        ratings["movie_id"].isin(movies["movie_id"]),
        "a MovieID listed in movies.dat",
    )
    _check_unique(base / "ratings.dat", ratings, ["user_id", "movie_id"])
    return MovieLens1M(ratings=ratings, users=users, movies=movies)


def _read_dat(path: Path) -> pd.DataFrame:
    """Read one ``::``-separated latin-1 file with pandas' C parser; validate every line.

    The fast path replaces ``::`` by a one-character separator and parses with pandas. If
    anything looks wrong (wrong field count, non-integer value), a slow line-by-line pass finds
    the first bad line and raises :class:`DataFormatError`.
    """
    schema = _SCHEMAS[path.name]
    text = _read_text(path)
    frame = _parse_fast(text, schema)
    if frame is None:
        _raise_first_bad_line(path, text, schema)
        raise DataFormatError(path, "cannot parse the file (no single bad line found)")
    frame.columns = [column.name for column in schema]
    if frame.empty:
        raise DataFormatError(path, "the file has no records")
    return frame


def _parse_fast(text: str, schema: tuple[_Column, ...]) -> pd.DataFrame | None:
    """Parse ``text`` with pandas; return None if it is not cleanly in the schema's shape."""
    if _ONE_CHAR_SEP in text:
        return None
    text = text.replace(_FIELD_SEP, _ONE_CHAR_SEP)
    strings = {i: str for i, column in enumerate(schema) if not column.integer}
    try:
        frame = pd.read_csv(
            io.StringIO(text),
            sep=_ONE_CHAR_SEP,
            header=None,
            engine="c",
            quoting=csv.QUOTE_NONE,
            dtype=strings,
            na_filter=False,
        )
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError):
        return None
    expected_seps = (len(schema) - 1) * len(frame)
    if frame.shape[1] != len(schema) or text.count(_ONE_CHAR_SEP) != expected_seps:
        return None
    for i, column in enumerate(schema):
        if column.integer and not pd.api.types.is_integer_dtype(frame[i].dtype):
            return None
        if column.integer:
            frame[i] = frame[i].astype(np.int64)
    return frame


def _raise_first_bad_line(path: Path, text: str, schema: tuple[_Column, ...]) -> None:
    """Scan ``text`` line by line and raise DataFormatError at the first malformed line."""
    n_fields = len(schema)
    n_records = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if not line:
            continue
        n_records += 1
        fields = line.split(_FIELD_SEP)
        if _ONE_CHAR_SEP in line or len(fields) != n_fields:
            raise DataFormatError(
                path,
                f"expected {n_fields} fields separated by '::', found {len(fields)}",
                line_number=number,
                line=line,
            )
        for column, value in zip(schema, fields, strict=True):
            if column.integer and not _INT_FIELD.fullmatch(value.strip()):
                raise DataFormatError(
                    path,
                    f"field {column.name!r} must be an integer, got {value!r}",
                    line_number=number,
                    line=line,
                )
    if n_records == 0:
        raise DataFormatError(path, "the file has no records")


def _record_line_numbers(path: Path) -> np.ndarray:
    """Return the 1-based line number of each record (non-blank line) of ``path``."""
    text = _read_text(path)
    lines = text.split("\n")
    nonblank = np.fromiter((bool(line.rstrip("\r")) for line in lines), bool, len(lines))
    return np.flatnonzero(nonblank) + 1


def _raise_at_record(path: Path, record: int, reason: str) -> None:
    """Raise DataFormatError for the ``record``-th (0-based) record of ``path``."""
    number = int(_record_line_numbers(path)[record])
    line = _read_text(path).split("\n")[number - 1]
    raise DataFormatError(path, reason, line_number=number, line=line)


def _check_values(
    path: Path, frame: pd.DataFrame, column: str, ok: pd.Series, expected: str
) -> None:
    """Raise DataFormatError at the first record where ``ok`` is False."""
    bad = np.flatnonzero(~ok.to_numpy(bool))
    if len(bad):
        value = frame[column].iloc[bad[0]]
        _raise_at_record(path, int(bad[0]), f"field {column!r} must be {expected}, got {value!r}")


def _check_unique(path: Path, frame: pd.DataFrame, columns: list[str]) -> None:
    """Raise DataFormatError at the first record repeating an earlier one's ``columns``."""
    duplicated = frame.duplicated(subset=columns).to_numpy(bool)
    if duplicated.any():
        record = int(np.argmax(duplicated))
        key = ", ".join(f"{c}={frame[c].iloc[record]}" for c in columns)
        _raise_at_record(path, record, f"duplicate record for {key}")
