"""MovieLens-1M loader, data-folder resolution, downloads and error messages."""

from __future__ import annotations

import hashlib
import os
import pickle
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from flower_app.datasets import movielens
from flower_app.datasets.movielens import (
    ML1M_URL,
    clear_cache,
    facility_location_matrix,
    load_movielens_1m,
)
from flower_app.datasets.paths import (
    ChecksumError,
    DataFormatError,
    DatasetNotFoundError,
    download_allowed,
    download_file,
    resolve_data_dir,
)

USERS = ["1::F::1::10::48067", "2::M::56::16::70072", "3::M::25::15::55117-1234"]
MOVIES = [
    "1::Toy Story (1995)::Animation|Children's|Comedy",
    "2::Café au Lait (1993)::Comedy",
    "3::Never Rated (1999)::Drama",
    "5::Heat (1995)::Action|Crime|Thriller",
]
RATINGS = [
    "1::1::5::978300760",
    "1::5::3::978302109",
    "2::2::4::978301968",
    "2::1::1::978300275",
]


def write_ml1m(
    data_dir: Path,
    *,
    users: list[str] = USERS,
    movies: list[str] = MOVIES,
    ratings: list[str] = RATINGS,
) -> Path:
    """Write the three official files (latin-1, ``::``) under ``data_dir/ml-1m``."""
    folder = data_dir / "ml-1m"
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in (("users.dat", users), ("movies.dat", movies), ("ratings.dat", ratings)):
        (folder / name).write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    return folder


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


# --------------------------------------------------------------------------- paths


def test_resolve_data_dir_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("FLOWER_APP_DATA", raising=False)
    default = Path("~/.cache/flower_app/datasets").expanduser()
    assert resolve_data_dir(None) == default
    assert resolve_data_dir("") == default
    monkeypatch.setenv("FLOWER_APP_DATA", str(tmp_path / "env"))
    assert resolve_data_dir(None) == tmp_path / "env"
    assert resolve_data_dir("") == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "given") == tmp_path / "given"


def test_resolve_data_dir_expands_and_absolutises(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_data_dir("~/data") == tmp_path / "data"
    monkeypatch.chdir(tmp_path)
    resolved = resolve_data_dir("rel/../data")
    assert resolved.is_absolute()
    assert resolved == tmp_path / "data"


def test_download_allowed(monkeypatch):
    monkeypatch.delenv("FLOWER_APP_OFFLINE", raising=False)
    assert download_allowed(None) is True
    monkeypatch.setenv("FLOWER_APP_OFFLINE", "1")
    assert download_allowed(None) is False
    assert download_allowed(True) is True
    monkeypatch.setenv("FLOWER_APP_OFFLINE", "0")
    assert download_allowed(None) is True
    assert download_allowed(False) is False


def test_download_file_checks_sha256_and_md5(tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"payload" * 1000)
    md5 = hashlib.md5(source.read_bytes()).hexdigest()
    sha = hashlib.sha256(source.read_bytes()).hexdigest()
    dest = download_file(source.as_uri(), tmp_path / "out" / "copy.bin", md5=md5, sha256=sha)
    assert dest.read_bytes() == source.read_bytes()

    bad = tmp_path / "out" / "bad.bin"
    with pytest.raises(ChecksumError) as info:
        download_file(source.as_uri(), bad, sha256="0" * 64)
    assert "0" * 64 in str(info.value) and sha in str(info.value)
    assert not bad.exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["copy.bin"]


def test_errors_are_picklable(tmp_path):
    errors = [
        DataFormatError(tmp_path / "f.dat", "bad", line_number=3, line="x::y"),
        DatasetNotFoundError("X", [tmp_path / "a"], "http://example.org", "why", tmp_path),
        ChecksumError(tmp_path / "z", "md5", "a" * 32, "b" * 32, url="file:///z"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)


def test_data_format_error_truncates_long_lines(tmp_path):
    error = DataFormatError(tmp_path / "f.dat", "bad", line_number=7, line="x" * 1000)
    message = str(error)
    assert "line 7" in message and "f.dat" in message
    assert "x" * 200 in message and "x" * 201 not in message and "..." in message


# --------------------------------------------------------------------------- loading


def test_load_parses_official_format(tmp_path):
    write_ml1m(tmp_path)
    ml = load_movielens_1m(tmp_path, download=False)
    assert list(ml.ratings.columns) == ["user_id", "movie_id", "rating", "timestamp"]
    assert all(dtype == np.int64 for dtype in ml.ratings.dtypes)
    assert ml.ratings.to_numpy().tolist() == [
        [1, 1, 5, 978300760],
        [1, 5, 3, 978302109],
        [2, 2, 4, 978301968],
        [2, 1, 1, 978300275],
    ]
    assert list(ml.users.columns) == ["user_id", "gender", "age", "occupation", "zip"]
    assert ml.users["user_id"].tolist() == [1, 2, 3]
    assert ml.users["gender"].tolist() == ["F", "M", "M"]
    assert ml.users["age"].tolist() == [1, 56, 25]
    assert ml.users["occupation"].tolist() == [10, 16, 15]
    assert ml.users["zip"].tolist() == ["48067", "70072", "55117-1234"]
    assert list(ml.movies.columns) == ["movie_id", "title", "genres"]
    assert ml.movies["movie_id"].tolist() == [1, 2, 3, 5]
    assert ml.movies["title"].tolist()[1] == "Café au Lait (1993)"
    assert ml.movies["genres"].tolist()[0] == "Animation|Children's|Comedy"


def test_facility_location_matrix(tmp_path):
    write_ml1m(tmp_path)
    matrix = facility_location_matrix(load_movielens_1m(tmp_path, download=False))
    assert matrix.name == "movielens-1m"
    assert (matrix.n_users, matrix.n_elements) == (2, 3)  # user 3 and movie 3 never rated
    assert matrix.user_ids.tolist() == [1, 2]
    assert matrix.element_ids.tolist() == [1, 2, 5]
    assert matrix.element_ids.dtype == np.int64 and matrix.user_ids.dtype == np.int64
    assert matrix.element_groups.tolist() == ["Animation", "Comedy", "Action"]
    assert matrix.values.dtype == np.float64 and matrix.values.has_canonical_format
    assert matrix.values.toarray().tolist() == [[5.0, 0.0, 3.0], [1.0, 4.0, 0.0]]


def test_crlf_and_blank_lines_are_accepted(tmp_path):
    folder = write_ml1m(tmp_path)
    (folder / "ratings.dat").write_bytes(("\r\n".join(RATINGS) + "\r\n\r\n").encode("latin-1"))
    ml = load_movielens_1m(tmp_path, download=False)
    assert len(ml.ratings) == 4


def test_results_are_cached_per_folder(tmp_path):
    folder = write_ml1m(tmp_path)
    first = load_movielens_1m(tmp_path, download=False)
    assert load_movielens_1m(str(tmp_path), download=False) is first
    clear_cache()
    second = load_movielens_1m(tmp_path, download=False)
    assert second is not first
    (folder / "ratings.dat").write_bytes(("\n".join(RATINGS[:2]) + "\n").encode("latin-1"))
    os.utime(folder / "ratings.dat", ns=(time.time_ns() + 10**9,) * 2)
    assert len(load_movielens_1m(tmp_path, download=False).ratings) == 2


def test_missing_files_without_download(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        load_movielens_1m(tmp_path, download=False)
    message = str(info.value)
    for name in ("ratings.dat", "users.dat", "movies.dat"):
        assert str(tmp_path / "ml-1m" / name) in message
    assert ML1M_URL in message
    assert "data-dir" in message and "FLOWER_APP_DATA" in message
    assert f"it is now {tmp_path}." in message
    assert isinstance(info.value, FileNotFoundError)


def test_offline_env_forbids_download(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWER_APP_OFFLINE", "1")
    write_ml1m(tmp_path)
    (tmp_path / "ml-1m" / "users.dat").unlink()
    with pytest.raises(DatasetNotFoundError, match="disabled") as info:
        load_movielens_1m(tmp_path, url=(tmp_path / "nowhere.zip").as_uri())
    assert "users.dat  (missing)" in str(info.value)


def test_failed_download_says_where_to_put_files(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="failed") as info:
        load_movielens_1m(tmp_path / "data", download=True, url=(tmp_path / "no.zip").as_uri())
    assert str(tmp_path / "data" / "ml-1m" / "ratings.dat") in str(info.value)


def _build_zip(tmp_path: Path) -> tuple[Path, str]:
    source = write_ml1m(tmp_path / "src")
    archive = tmp_path / "ml-1m.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        for name in ("ratings.dat", "users.dat", "movies.dat", "README"):
            if name == "README":
                bundle.writestr("ml-1m/README", "not extracted")
            else:
                bundle.write(source / name, f"ml-1m/{name}")
    return archive, hashlib.md5(archive.read_bytes()).hexdigest()


def test_download_extracts_official_archive(tmp_path):
    archive, md5 = _build_zip(tmp_path)
    data_dir = tmp_path / "data"
    ml = load_movielens_1m(data_dir, download=True, url=archive.as_uri(), md5=md5)
    assert ml.movies["title"].tolist()[1] == "Café au Lait (1993)"
    assert sorted(p.name for p in (data_dir / "ml-1m").iterdir()) == [
        "movies.dat",
        "ratings.dat",
        "users.dat",
    ]
    assert (data_dir / "ml-1m.zip").is_file()


def test_download_with_wrong_checksum(tmp_path):
    archive, _ = _build_zip(tmp_path)
    data_dir = tmp_path / "data"
    with pytest.raises(ChecksumError) as info:
        load_movielens_1m(data_dir, download=True, url=archive.as_uri(), md5="0" * 32)
    assert "0" * 32 in str(info.value)
    assert list(data_dir.iterdir()) == []


def test_default_checksum_is_the_official_one(tmp_path):
    archive, _ = _build_zip(tmp_path)
    with pytest.raises(ChecksumError, match=movielens.ML1M_MD5):
        load_movielens_1m(tmp_path / "data", download=True, url=archive.as_uri())


@pytest.mark.parametrize(
    ("file", "lines", "bad_line", "reason"),
    [
        ("ratings.dat", [*RATINGS[:2], "2::2::4", *RATINGS[3:]], 3, "expected 4 fields"),
        ("ratings.dat", [*RATINGS[:3], "2::1::1::97::1"], 4, "expected 4 fields"),
        ("ratings.dat", [RATINGS[0], "1::5::three::978302109"], 2, "'rating' must be an integer"),
        ("ratings.dat", [*RATINGS[:2], "2::2::6::978301968"], 3, "in 1..5"),
        ("ratings.dat", [*RATINGS, "1::1::2::978300761"], 5, "duplicate"),
        ("ratings.dat", [*RATINGS, "9::1::2::978300761"], 5, "users.dat"),
        ("ratings.dat", [*RATINGS, "1::4::2::978300761"], 5, "movies.dat"),
        ("users.dat", [USERS[0], "2::X::56::16::70072"], 2, "F or M"),
        ("users.dat", ["1::F::1::10"], 1, "expected 5 fields"),
        ("movies.dat", [*MOVIES[:2], "3::No Genres"], 3, "expected 3 fields"),
        ("movies.dat", [*MOVIES, "x7::Seven (1995)::Crime"], 5, "'movie_id' must be an integer"),
    ],
)
def test_malformed_lines_are_reported(tmp_path, file, lines, bad_line, reason):
    files = {"users.dat": USERS, "movies.dat": MOVIES, "ratings.dat": RATINGS}
    files[file] = lines
    write_ml1m(
        tmp_path,
        users=files["users.dat"],
        movies=files["movies.dat"],
        ratings=files["ratings.dat"],
    )
    with pytest.raises(DataFormatError) as info:
        load_movielens_1m(tmp_path, download=False)
    message = str(info.value)
    assert f"{tmp_path / 'ml-1m' / file}, line {bad_line}:" in message
    assert reason in message
    assert repr(lines[bad_line - 1]) in message
    assert info.value.line_number == bad_line


def test_empty_file_is_reported(tmp_path):
    folder = write_ml1m(tmp_path)
    (folder / "movies.dat").write_bytes(b"")
    with pytest.raises(DataFormatError, match="movies.dat"):
        load_movielens_1m(tmp_path, download=False)


@pytest.mark.realdata
def test_real_movielens_1m():
    data_dir = os.environ.get("FLOWER_APP_DATA")
    assert data_dir and (Path(data_dir) / "ml-1m" / "ratings.dat").is_file(), (
        "realdata tests need FLOWER_APP_DATA pointing to a folder holding ml-1m/"
    )
    start = time.perf_counter()
    ml = load_movielens_1m(data_dir, download=False)
    loaded = time.perf_counter() - start
    matrix = facility_location_matrix(ml)
    built = time.perf_counter() - start - loaded
    print(f"\nMovieLens-1M: load {loaded:.2f} s, facility_location_matrix {built:.2f} s")
    assert len(ml.users) == 6040
    assert len(ml.ratings) == 1_000_209
    assert (matrix.n_users, matrix.n_elements) == (6040, 3706)
    assert matrix.values.nnz == 1_000_209
    assert set(np.unique(matrix.values.data)) == {1.0, 2.0, 3.0, 4.0, 5.0}
