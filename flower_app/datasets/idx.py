"""Reader and writer of the IDX format of MNIST, Fashion-MNIST and EMNIST (``*-idx?-ubyte[.gz]``).

An IDX file starts with a 4-byte magic number: two zero bytes, a type code (``0x08`` =
unsigned byte) and the number of dimensions; then one big-endian uint32 per dimension, then the
data in C order. The writer exists for tests, which build small files in the official format.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

from flower_app.datasets.paths import DataFormatError

__all__ = ["read_idx", "read_idx_shape", "write_idx"]

_UBYTE = 0x08


def _open(path: Path):
    with open(path, "rb") as handle:
        gz = handle.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


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
        with _open(path) as handle:
            return _header(path, handle, ndim)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
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
        with _open(path) as handle:
            shape = _header(path, handle, ndim)
            data = handle.read()
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise DataFormatError(path, f"cannot read: {err}") from err
    expected = int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        raise DataFormatError(
            path, f"header says shape {shape} ({expected} bytes) but {len(data)} bytes follow"
        )
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


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
