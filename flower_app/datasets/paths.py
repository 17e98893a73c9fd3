"""Where dataset files live, how they are downloaded, and the errors the loaders raise.

Every loader resolves its folder with :func:`resolve_data_dir`: the ``data-dir`` value from the
run config, else the ``FLOWER_APP_DATA`` environment variable, else
``~/.cache/flower_app/datasets``. Missing files raise :class:`DatasetNotFoundError`, whose
message lists the expected files with their absolute paths and where to get them; unreadable
files raise :class:`DataFormatError` naming the file and the line. Nothing is ever silently
replaced by synthetic data.

Every text file is opened with :func:`open_text` (or its bytes decoded with
:func:`decode_text`), so every text format reads alike:

- gzip-compressed or not, told by the first two bytes; a compressed file that ends early or
  is damaged is refused naming the file (never a bare ``EOFError``);
- a UTF-8 byte-order mark at the start is the mark, not data: it is dropped, and it says the
  file is UTF-8, so a file of a latin-1 format (MovieLens, Sentiment140's CSV) that starts
  with one is read as the UTF-8 its editor saved;
- a byte sequence that is not text in the encoding is refused naming the file.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

from flower_app.files import atomic_file

__all__ = [
    "DATA_DIR_ENV",
    "DEFAULT_DATA_DIR",
    "OFFLINE_ENV",
    "ChecksumError",
    "DataFormatError",
    "DatasetNotFoundError",
    "decode_text",
    "download_allowed",
    "download_file",
    "file_checksum",
    "json_object",
    "open_binary",
    "open_text",
    "resolve_data_dir",
]

DATA_DIR_ENV = "FLOWER_APP_DATA"
"""Environment variable that selects the data folder when ``data-dir`` is empty."""

OFFLINE_ENV = "FLOWER_APP_OFFLINE"
"""Environment variable: ``"1"`` forbids downloads unless a loader is told ``download=True``."""

DEFAULT_DATA_DIR = "~/.cache/flower_app/datasets"
"""Data folder used when neither ``data-dir`` nor ``FLOWER_APP_DATA`` is set."""

_MAX_LINE_CHARS = 200
_CHUNK_BYTES = 1 << 20


#: the UTF-8 byte-order mark
BOM = b"\xef\xbb\xbf"
#: what a damaged or truncated gzip stream raises while it is read
GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


def _gzip_error(path: Path, err: Exception) -> DataFormatError:
    why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return DataFormatError(
        path, f"the gzip data ends early or is damaged ({why}); copy or download the file again"
    )


class _NamedGzip(gzip.GzipFile):
    """A gzip file whose read errors name the file (:class:`DataFormatError`)."""

    def __init__(self, path: Path) -> None:
        super().__init__(filename=os.fspath(path), mode="rb")
        self.source = path

    def read(self, size: int | None = -1) -> bytes:
        try:
            return super().read(size)
        except GZIP_ERRORS as err:
            raise _gzip_error(self.source, err) from None

    def read1(self, size: int = -1) -> bytes:
        try:
            return super().read1(size)
        except GZIP_ERRORS as err:
            raise _gzip_error(self.source, err) from None

    def peek(self, n: int) -> bytes:
        try:
            return super().peek(n)
        except GZIP_ERRORS as err:
            raise _gzip_error(self.source, err) from None


class _NamedText(io.TextIOWrapper):
    """A text stream whose decode errors name the file (:class:`DataFormatError`)."""

    source: Path

    def _fail(self, err: UnicodeDecodeError) -> DataFormatError:
        return DataFormatError(
            self.source, f"not {self.encoding.removesuffix('-sig')} text ({err.reason} at "
            f"byte {err.start} of a block); save it in that encoding"
        )  # fmt: skip

    def read(self, size: int | None = -1) -> str:
        try:
            return super().read(size)
        except UnicodeDecodeError as err:
            raise self._fail(err) from None

    def readline(self, size: int | None = -1) -> str:
        try:
            return super().readline(size)
        except UnicodeDecodeError as err:
            raise self._fail(err) from None

    def __next__(self) -> str:
        try:
            return super().__next__()
        except UnicodeDecodeError as err:
            raise self._fail(err) from None


def open_binary(path: str | os.PathLike[str]) -> io.BufferedIOBase:
    """Open a file's bytes, gunzipped when it is gzip (told by its first two bytes).

    Read errors of a damaged or truncated gzip stream raise :class:`DataFormatError`
    naming the file.
    """
    path = Path(path)
    with open(path, "rb") as handle:
        packed = handle.read(2) == b"\x1f\x8b"
    return _NamedGzip(path) if packed else open(path, "rb")  # noqa: SIM115 (caller closes)


def open_text(path: str | os.PathLike[str], encoding: str = "utf-8") -> io.TextIOBase:
    """Open a text file for reading, gzip-compressed or not (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    encoding : str, optional
        The format's encoding; a file starting with a UTF-8 byte-order mark is read as
        UTF-8 and the mark dropped, whatever the format's encoding.

    Returns
    -------
    io.TextIOBase
        Universal newlines off (``newline=""``, as :mod:`csv` wants); reading a damaged gzip
        stream or bytes that are not text raises :class:`DataFormatError` naming the file.
    """
    path = Path(path)
    binary = open_binary(path)
    try:
        head = binary.peek(3)[:3] if hasattr(binary, "peek") else b""
    except BaseException:
        binary.close()
        raise
    text = _NamedText(binary, encoding="utf-8-sig" if head == BOM else encoding, newline="")
    text.source = path
    return text


def decode_text(data: bytes, encoding: str, path: str | os.PathLike[str]) -> str:
    """Decode a whole file's bytes as :func:`open_text` reads them (a leading BOM: UTF-8).

    Raises
    ------
    DataFormatError
        Naming ``path``, when the bytes are not text in the encoding.
    """
    if data.startswith(BOM):
        data, encoding = data[len(BOM) :], "utf-8"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as err:
        raise DataFormatError(path, f"not {encoding} text ({err.reason} at byte {err.start}); "
                              "save it in that encoding") from None  # fmt: skip


def json_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``object_pairs_hook`` of ``json.load``: refuse a key given twice in one object.

    Python's ``json`` keeps the last of two equal keys silently (``{"a": 1, "a": 2}`` is
    ``{"a": 2}``): a user or a field listed twice would become a different instance.

    Raises
    ------
    ValueError
        Naming the repeated key.
    """
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one JSON object")
        out[key] = value
    return out


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> Path:
    """Return the absolute data folder to read datasets from.

    Parameters
    ----------
    data_dir : str or os.PathLike or None
        The folder given by the user (run config ``data-dir``). ``""`` or ``None`` selects
        ``$FLOWER_APP_DATA`` if that is set and non-empty, else ``~/.cache/flower_app/datasets``.

    Returns
    -------
    pathlib.Path
        The folder with ``~`` expanded, made absolute and normalised. It need not exist.
    """
    if data_dir is None or os.fspath(data_dir) == "":
        data_dir = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(os.path.abspath(os.path.expanduser(os.fspath(data_dir))))


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not in the data folder (and could not be downloaded).

    Parameters
    ----------
    dataset : str
        Human-readable dataset name, e.g. ``"MovieLens-1M"``.
    expected : sequence of pathlib.Path
        The files the loader needs, as absolute paths.
    source : str
        Where to get the files (the official URL and, if useful, what to do with them).
    reason : str, optional
        Why the files are not there, e.g. that downloading is disabled or failed.
    data_dir : pathlib.Path, optional
        The resolved data folder, named in the message (default: the files' common folder).
    """

    def __init__(
        self,
        dataset: str,
        expected: Sequence[Path],
        source: str,
        reason: str | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.dataset = dataset
        self.expected = [Path(p) for p in expected]
        self.source = source
        self.reason = reason
        self.data_dir = data_dir
        super().__init__(self._message())

    def _message(self) -> str:
        lines = [f"{self.dataset} not found. Expected these files:"]
        for path in self.expected:
            state = "present" if path.exists() else "missing"
            lines.append(f"  {path}  ({state})")
        if self.reason:
            lines.append(f"Reason: {self.reason}")
        lines.append(f"Get them from {self.source}")
        folder = self.data_dir or _common_data_dir(self.expected)
        lines.append(
            "The data folder is chosen by the run config value `data-dir` "
            f"(or the {DATA_DIR_ENV} environment variable when `data-dir` is empty); "
            f"it is now {folder}."
        )
        return "\n".join(lines)

    def __reduce__(self):  # keep picklable (Ray ships errors)
        return (
            type(self),
            (self.dataset, self.expected, self.source, self.reason, self.data_dir),
        )


def _common_data_dir(paths: Sequence[Path]) -> Path | str:
    """Return the deepest folder common to ``paths`` (for the error message)."""
    if not paths:
        return "<unknown>"
    return Path(os.path.commonpath([str(p.parent) for p in paths]))


class DataFormatError(ValueError):
    """A dataset file exists but cannot be read as its official format.

    Parameters
    ----------
    path : str or os.PathLike
        The offending file.
    reason : str
        What is wrong, e.g. ``"expected 4 fields separated by '::', found 3"``.
    line_number : int, optional
        1-based line number of the first offending line, when known.
    line : str, optional
        The offending line; shown truncated to about 200 characters.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        reason: str,
        *,
        line_number: int | None = None,
        line: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.reason = reason
        self.line_number = line_number
        self.line = line
        super().__init__(self._message())

    def _message(self) -> str:
        where = str(self.path)
        if self.line_number is not None:
            where += f", line {self.line_number}"
        message = f"{where}: {self.reason}"
        if self.line is not None:
            shown = self.line.rstrip("\r\n")
            if len(shown) > _MAX_LINE_CHARS:
                shown = shown[:_MAX_LINE_CHARS] + "..."
            message += f"\n  offending line: {shown!r}"
        return message

    def __reduce__(self):  # keep picklable
        return (
            _rebuild_format_error,
            (type(self), self.path, self.reason, self.line_number, self.line),
        )


def _rebuild_format_error(
    cls: type[DataFormatError],
    path: Path,
    reason: str,
    line_number: int | None,
    line: str | None,
) -> DataFormatError:
    """Unpickle a :class:`DataFormatError` (keyword-only arguments need this)."""
    return cls(path, reason, line_number=line_number, line=line)


class ChecksumError(ValueError):
    """A downloaded (or previously downloaded) file does not have the published checksum.

    Parameters
    ----------
    path : str or os.PathLike
        The file that was checked (already deleted when raised by :func:`download_file`).
    algorithm : str
        ``"md5"`` or ``"sha256"``.
    expected : str
        The published hex digest.
    actual : str
        The hex digest of the file.
    url : str, optional
        Where the file came from.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        algorithm: str,
        expected: str,
        actual: str,
        url: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.algorithm = algorithm
        self.expected = expected
        self.actual = actual
        self.url = url
        source = f" downloaded from {url}" if url else ""
        super().__init__(
            f"{self.path}{source}: {algorithm} checksum mismatch: expected {expected}, "
            f"got {actual}. The file was deleted; the download is corrupt or the source "
            "has changed."
        )

    def __reduce__(self):  # keep picklable
        return (type(self), (self.path, self.algorithm, self.expected, self.actual, self.url))


def download_allowed(download: bool | None) -> bool:
    """Decide whether a loader may download missing files.

    Parameters
    ----------
    download : bool or None
        An explicit choice, or ``None`` for the default: allowed unless the environment variable
        ``FLOWER_APP_OFFLINE`` is ``"1"``.

    Returns
    -------
    bool
        Whether downloading is allowed.
    """
    if download is not None:
        return bool(download)
    return os.environ.get(OFFLINE_ENV, "").strip() != "1"


def file_checksum(path: str | os.PathLike[str], algorithm: str = "md5") -> str:
    """Return the hex digest of a file, read in 1 MiB chunks.

    Parameters
    ----------
    path : str or os.PathLike
        The file to hash.
    algorithm : str, default "md5"
        Any name :func:`hashlib.new` accepts.

    Returns
    -------
    str
        The lowercase hex digest.
    """
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_file(
    url: str,
    dest: Path,
    *,
    md5: str | None = None,
    sha256: str | None = None,
    timeout: float = 60,
) -> Path:
    """Download ``url`` to ``dest`` atomically, verifying its checksum.

    The body is written to a temporary file beside ``dest`` and renamed onto ``dest`` only after
    the checksum matched, so an interrupted or corrupt download never leaves a partial ``dest``.

    Parameters
    ----------
    url : str
        ``http(s)://`` or ``file://`` URL.
    dest : pathlib.Path
        Where to store the file; its folder is created if needed.
    md5 : str, optional
        Expected MD5 hex digest.
    sha256 : str, optional
        Expected SHA-256 hex digest. Both are checked when both are given.
    timeout : float, default 60
        Socket timeout in seconds.

    Returns
    -------
    pathlib.Path
        ``dest``.

    Raises
    ------
    ChecksumError
        If a checksum does not match; the downloaded bytes are deleted.
    urllib.error.URLError, OSError
        If the download fails (e.g. no network); nothing is left behind.
    """
    dest = Path(dest)
    expected = {name: value.lower() for name, value in (("md5", md5), ("sha256", sha256)) if value}
    digests = {name: hashlib.new(name) for name in expected}
    with atomic_file(dest) as out:
        _copy_url(url, out, digests, timeout)
        for name, digest in digests.items():
            actual = digest.hexdigest()
            if actual != expected[name]:
                raise ChecksumError(dest, name, expected[name], actual, url=url)
    return dest


def _copy_url(url: str, out, digests: dict, timeout: float) -> None:
    """Stream ``url`` into the open binary file ``out``, updating ``digests``."""
    import urllib.request

    from tqdm.auto import tqdm  # imported by a download only (with urllib, they are slow to import)

    with urllib.request.urlopen(url, timeout=timeout) as response:
        total = response.headers.get("Content-Length")
        with tqdm(
            total=int(total) if total else None,
            unit="B",
            unit_scale=True,
            desc=f"download {url.rsplit('/', 1)[-1]}",
            disable=None,
            leave=False,
        ) as bar:
            for chunk in iter(lambda: response.read(_CHUNK_BYTES), b""):
                out.write(chunk)
                for digest in digests.values():
                    digest.update(chunk)
                bar.update(len(chunk))
