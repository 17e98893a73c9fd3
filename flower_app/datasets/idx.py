"""Reader and writer of the IDX format of MNIST, Fashion-MNIST and EMNIST (``*-idx?-ubyte[.gz]``).

An IDX file starts with a 4-byte magic number: two zero bytes, a type code (``0x08`` =
unsigned byte) and the number of dimensions; then one big-endian uint32 per dimension, then the
data in C order. The writer exists for tests, which build small files in the official format.
:func:`idx_files` finds (or downloads) a dataset's files and :func:`read_idx_split` reads one
images file with its labels file: what the Fashion-MNIST and EMNIST loaders share.
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from flower_app.datasets.paths import (
    DataFormatError,
    DatasetNotFoundError,
    download_allowed,
    download_file,
    open_binary,
)

__all__ = ["find_idx", "idx_files", "read_idx", "read_idx_shape", "read_idx_split", "write_idx"]

_UBYTE = 0x08


def _header(path: Path, handle, ndim: int | None) -> tuple[int, ...]:
    header = handle.read(4)
    if len(header) != 4 or header[0] != 0 or header[1] != 0:
        raise DataFormatError(path, f"not an IDX file (magic bytes {header!r})")
    if header[2] != _UBYTE:
        raise DataFormatError(path, f"IDX type 0x{header[2]:02x}; expected 0x08 (ubyte)")
    dims = header[3]
    if ndim is not None and dims != ndim:
        raise DataFormatError(path, f"IDX file has {dims} dimensions; expected {ndim}")
    raw = handle.read(4 * dims)
    if len(raw) != 4 * dims:
        raise DataFormatError(path, "IDX header is truncated")
    return tuple(struct.unpack(f">{dims}I", raw))


def read_idx_shape(path: str | os.PathLike[str], ndim: int | None = None) -> tuple[int, ...]:
    """Return the shape an IDX file's header announces, reading only the header.

    Raises
    ------
    DataFormatError
        As :func:`read_idx` for the header (the data are not read).
    """
    path = Path(path)
    try:
        with open_binary(path) as handle:
            return _header(path, handle, ndim)
    except (OSError, EOFError) as err:  # a damaged .gz: open_binary names the file
        raise DataFormatError(path, f"cannot read: {err}") from err


def read_idx(path: str | os.PathLike[str], ndim: int | None = None) -> np.ndarray:
    """Read an unsigned-byte IDX file (plain or gzip-compressed).

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    ndim : int, optional
        Expected number of dimensions (1 for labels, 3 for images); checked if given.

    Returns
    -------
    numpy.ndarray
        uint8 array of the file's shape.

    Raises
    ------
    DataFormatError
        On a bad magic number, a type other than unsigned byte, an unexpected number of
        dimensions, or a data size that does not match the header.
    """
    path = Path(path)
    try:
        with open_binary(path) as handle:
            shape = _header(path, handle, ndim)
            data = handle.read()
    except (OSError, EOFError) as err:  # a damaged .gz: open_binary names the file
        raise DataFormatError(path, f"cannot read: {err}") from err
    expected = int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        raise DataFormatError(
            path, f"header says shape {shape} ({expected} bytes) but {len(data)} bytes follow"
        )
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def find_idx(folder: Path, stem: str) -> Path | None:
    """Return ``folder/<stem>.gz``, else ``folder/<stem>``, whichever is a file (None: neither)."""
    return next((folder / n for n in (stem + ".gz", stem) if (folder / n).is_file()), None)


def idx_files(
    folder: Path,
    stems: Iterable[str],
    dataset: str,
    source: str,
    *,
    url: str | None = None,
    md5: Mapping[str, str] | None = None,
    download: bool | None = None,
) -> dict[str, Path]:
    """Return the path of every IDX file ``stems`` names in ``folder``, downloading missing ones.

    ``url`` is the base URL of the official ``<stem>.gz`` files with their ``md5`` (None: the
    dataset cannot be downloaded); ``download`` allows it (default: unless
    ``FLOWER_APP_OFFLINE=1``); ``dataset`` and ``source`` name the data in the error.

    Raises
    ------
    DatasetNotFoundError
        Listing the files, when one is missing and is not (or could not be) downloaded.
    """
    stems = tuple(stems)
    found = {stem: find_idx(folder, stem) for stem in stems}
    missing = [stem for stem, path in found.items() if path is None]
    if not missing:
        return found  # type: ignore[return-value]
    expected = [folder / (stem + ".gz") for stem in stems]
    if url is None:
        reason = f"{dataset} cannot be downloaded automatically"
    elif not download_allowed(download):
        reason = "downloads are disabled (FLOWER_APP_OFFLINE=1)"
    else:
        try:
            for stem in missing:
                dest = folder / (stem + ".gz")
                found[stem] = download_file(url + stem + ".gz", dest, md5=(md5 or {})[stem])
        except OSError as err:
            raise DatasetNotFoundError(dataset, expected, source, reason=f"download failed: {err}",
                                       data_dir=folder.parent) from err  # fmt: skip
        return found  # type: ignore[return-value]
    raise DatasetNotFoundError(dataset, expected, source, reason=reason, data_dir=folder.parent)


def read_idx_split(
    images: Path, labels: Path, n_classes: int, count: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read an images file (28×28 each) and its labels file, checked against each other.

    Labels must lie in 0..n_classes−1; ``count``, when given, is the number of images the
    official file holds.

    Returns
    -------
    tuple of numpy.ndarray
        uint8 (N, 28, 28) images and int64 (N,) labels.

    Raises
    ------
    DataFormatError
        Naming the file: not IDX, another shape or count, a label out of range.
    """
    x, y = read_idx(images, ndim=3), read_idx(labels, ndim=1)
    n = y.shape[0] if count is None else count
    if x.shape != (n, 28, 28) or y.shape != (n,):
        raise DataFormatError(images, f"images {x.shape} and labels {y.shape}; expected {n} "
                              f"images of 28×28 and {n} labels, one per image")  # fmt: skip
    if y.size and y.max() >= n_classes:
        raise DataFormatError(labels, f"label {int(y.max())} exceeds {n_classes - 1}")
    return x, y.astype(np.int64)


def write_idx(path: str | os.PathLike[str], array: np.ndarray, compress: bool = True) -> Path:
    """Write a uint8 array as an IDX file (gzip-compressed unless ``compress`` is False).

    Parameters
    ----------
    path : str or os.PathLike
        Destination.
    array : numpy.ndarray
        Data; cast to uint8.
    compress : bool, optional
        Gzip the file (default True), as the official downloads are.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = Path(path)
    array = np.ascontiguousarray(array, dtype=np.uint8)
    payload = bytes([0, 0, _UBYTE, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload += array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress:
        with gzip.open(path, "wb") as handle:
            handle.write(payload)
    else:
        path.write_bytes(payload)
    return path
