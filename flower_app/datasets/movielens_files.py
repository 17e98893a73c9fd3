"""MovieLens-1M's files: their names, fields and encoding, read without pandas.

What :mod:`flower_app.datasets.movielens` parses, and :func:`movielens_shape`: the users,
the movies and their first genres from the id fields alone, for the check before Flower
(:mod:`flower_app.datasets.check`), which so imports neither pandas nor scipy.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from flower_app.datasets.paths import DataFormatError, decode_text

__all__ = ["ML1M_FILES", "movielens_shape"]

ML1M_FILES = ("ratings.dat", "users.dat", "movies.dat")
"""The files read from ``<data_dir>/ml-1m/``."""

_SUBDIR = "ml-1m"
_ENCODING = "latin-1"
_FIELD_SEP = "::"
_INT_FIELD = re.compile(r"-?\d+")


@dataclass(frozen=True)
class _Column:
    """One field of a ``.dat`` file: its name and whether it is an integer."""

    name: str
    integer: bool


_SCHEMAS: dict[str, tuple[_Column, ...]] = {
    "ratings.dat": (
        _Column("user_id", True),
        _Column("movie_id", True),
        _Column("rating", True),
        _Column("timestamp", True),
    ),
    "users.dat": (
        _Column("user_id", True),
        _Column("gender", False),
        _Column("age", True),
        _Column("occupation", True),
        _Column("zip", False),
    ),
    "movies.dat": (
        _Column("movie_id", True),
        _Column("title", False),
        _Column("genres", False),
    ),
}


def _read_text(path: Path) -> str:
    """Return the file's text: latin-1, or UTF-8 after a byte-order mark (which is dropped)."""
    return decode_text(_read_bytes(path), _ENCODING, path)



def movielens_shape(folder: str | os.PathLike[str]) -> tuple[int, int, list[str]] | None:
    """Return the users and movies with ratings, and each such movie's first genre, quickly.

    What :func:`facility_location_matrix` would build (its rows, columns and element groups),
    from the two id fields of ``ratings.dat`` and ``movies.dat``, without parsing or checking
    the rest (the check before Flower, which must be quick). None when a line
    does not start with two integer ids or a rated movie is not in ``movies.dat``: the
    loader then names the line.

    Parameters
    ----------
    folder : str or os.PathLike
        The ``ml-1m`` folder.
    """
    folder = Path(folder)
    users: set[bytes] = set()
    movies: set[bytes] = set()
    for line in _read_bytes(folder / "ratings.dat").split(b"\n"):
        fields = line.split(b"::", 2)
        if len(fields) == 3:
            users.add(fields[0])
            movies.add(fields[1])
        elif line.strip():
            return None
    try:
        user_ids = {int(u) for u in users}
        movie_ids = {int(m) for m in movies}
    except ValueError:
        return None
    genres: dict[int, str] = {}
    text = _read_text(folder / "movies.dat")
    for line in text.split("\n"):
        fields = line.rstrip("\r").split(_FIELD_SEP)
        if len(fields) == 3 and _INT_FIELD.fullmatch(fields[0].strip()):
            genres.setdefault(int(fields[0]), fields[2].split("|", 1)[0])
    if not movie_ids <= set(genres):
        return None
    return len(user_ids), len(movie_ids), [genres[m] for m in sorted(movie_ids)]


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise DataFormatError(path, f"cannot read the file: {error}") from error
