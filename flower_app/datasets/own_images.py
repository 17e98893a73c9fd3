"""Your own labelled images for the MaxFL family (``dataset = "image-clients"``).

``data-file`` is one of:

``.npz`` (numpy ``np.savez``)
    ``x``: images, (N, H, W) or (N, D), uint8 0..255, or floats k/255 (8-bit pixels saved
    as floats, e.g. ``x.astype(np.float32) / 255``: read back exactly; any other float is
    refused, never rounded to 8 bits); ``y``: integer
    labels 0..C−1, (N,); optionally ``client``: an integer client id per image, (N,). With
    ``client`` the clients are yours (natural federated data: each id is one client, in
    sorted id order); without it the images are split over clients by ``maxfl-partition``
    (Dirichlet with ``maxfl-alpha``, or clusters), as for Fashion-MNIST.
an IDX images file (``*-images-idx3-ubyte``, optionally ``.gz``)
    the MNIST format; its labels file must lie beside it under the same name with
    ``images-idx3`` replaced by ``labels-idx1``. Clients by ``maxfl-partition``.

The images are flattened (the MLP's input is H·W or D) and standardised with the pixel mean
and standard deviation of the whole file, as for Fashion-MNIST. Seen and unseen clients:
with your own clients, the first ``num-users`` client ids (default: the first half, rounded
up) are seen and the next ``maxfl-unseen-users`` (default −1: all the others) unseen; each
client's examples are split into train and test by ``maxfl-train-fraction``. The MaxFL
setting flips the labels of ``maxfl-label-flip`` of the clients (default 0.3): set it to 0 to
train on your labels as they are. Every error names the file, the array and what was
expected. An ``.npz`` holds ``x``, ``y`` and optionally ``client``, nothing else (a misspelt
``clients`` would otherwise leave your clients unused); a damaged archive or an ``.npy``
saved under the ``.npz`` name is refused.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from flower_app.datasets.idx import read_idx
from flower_app.datasets.images import LabelledImages
from flower_app.datasets.own import OwnDataError, _path

__all__ = ["OwnImages", "check_npz_names", "load_image_clients"]

NPZ_FORMAT = (
    "an .npz with arrays x (N, H, W) or (N, D) of uint8 0..255 or floats k/255, "
    "y (N,) integer labels 0..C-1, and optionally client (N,) integer client ids"
)


@dataclass(frozen=True)
class OwnImages:
    """A user's images, their labels, and (optionally) their clients.

    Attributes
    ----------
    data : LabelledImages
        uint8 (N, D) images and int64 labels.
    clients : numpy.ndarray or None
        int64 (N,) client of each image, renumbered 0..K−1 in sorted id order; None when
        the file gives no clients (they come from the configured partition).
    client_ids : tuple of str
        The file's client ids, in order (empty without clients).
    """

    data: LabelledImages
    clients: np.ndarray | None
    client_ids: tuple[str, ...]

    @property
    def n_clients(self) -> int:
        """Clients the file defines (0 without a ``client`` array)."""
        return len(self.client_ids)


def _fail(path: Path, message: str, expected: str = NPZ_FORMAT) -> OwnDataError:
    return OwnDataError(f"{path}: {message}; expected {expected}")


def _images(path: Path, x: np.ndarray) -> np.ndarray:
    if x.ndim not in (2, 3) or x.size == 0:
        raise _fail(path, f"array x has shape {x.shape}")
    flat = x.reshape(x.shape[0], -1)
    if flat.dtype.kind == "f":
        if not np.all(np.isfinite(flat)) or flat.min() < 0 or flat.max() > 1:
            raise _fail(path, "array x holds floats outside [0, 1]")
        scaled = flat * np.asarray(255.0, dtype=flat.dtype)
        pixels = np.rint(scaled)
        tolerance = max(FLOAT_PIXEL_TOLERANCE, 255.0 * float(np.finfo(flat.dtype).eps))
        off = np.abs(scaled - pixels) > tolerance
        if off.any():  # 8-bit pixels would round these: refuse rather than change the images
            row, col = (int(i[0]) for i in np.nonzero(off))
            raise _fail(
                path, f"array x holds floats that are not 8-bit pixel values k/255 (e.g. image "
                f"{row}, value {col}: {float(flat[row, col])!r}); the app trains on 8-bit pixels "
                "and does not round yours: save x as uint8 (np.rint(x * 255).astype(np.uint8)) "
                "if 8 bits hold your images",
            )  # fmt: skip
        return pixels.astype(np.uint8)
    if flat.dtype.kind not in "iu":
        raise _fail(path, f"array x has dtype {flat.dtype}")
    if flat.min() < 0 or flat.max() > 255:
        raise _fail(path, f"array x holds integers outside 0..255 (e.g. {int(flat.max())})")
    return flat.astype(np.uint8)


def _labels(path: Path, y: np.ndarray, n: int, name: str = "y") -> np.ndarray:
    if y.shape != (n,) or y.dtype.kind not in "iu":
        raise _fail(path, f"array {name} has shape {y.shape} and dtype {y.dtype} for {n} images")
    if y.min() < 0:
        bad = int(np.flatnonzero(y < 0)[0])
        raise _fail(path, f"array {name}[{bad}] = {int(y[bad])} is negative")
    if y.dtype == np.uint64 and y.max() > np.iinfo(np.int64).max:  # would wrap to negative
        bad = int(np.argmax(y))
        raise _fail(path, f"array {name}[{bad}] = {int(y[bad])} exceeds 2**63 - 1")
    return y.astype(np.int64)


_NPZ_ARRAYS = ("x", "y", "client")
#: how far (in units of 1/255) a float pixel may lie from k/255 and still be pixel k: above
#: the float32 rounding of k/255 (the float's own rounding for shorter floats), far below the
#: half step that rounding to 8 bits would silently cross
FLOAT_PIXEL_TOLERANCE = 1e-3
_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def check_npz_names(path: Path, names: Iterable[str]) -> None:
    """Refuse an ``.npz`` whose array names lack ``x`` or ``y`` or include another name.

    Raises
    ------
    OwnDataError
        Naming the file and the arrays (a misspelt ``client`` would leave the clients unused).
    """
    names = set(names)
    missing = [k for k in ("x", "y") if k not in names]
    if missing:
        raise _fail(path, f"arrays {sorted(names)} lack {missing}")
    unknown = sorted(names - set(_NPZ_ARRAYS))
    if unknown:
        raise _fail(path, f"arrays {unknown} are not among {list(_NPZ_ARRAYS)}")


def _from_npz(path: Path) -> OwnImages:
    try:
        loaded = np.load(path, allow_pickle=False)
    except _UNREADABLE as err:
        raise _fail(path, f"cannot be read as .npz ({type(err).__name__}: {err})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise _fail(path, "holds one unnamed array (an .npy file), not named arrays x and y")
    try:
        with loaded as z:
            arrays = {k: z[k] for k in z.files}
    except _UNREADABLE as err:
        raise _fail(path, f"cannot be read as .npz ({type(err).__name__}: {err})") from None
    check_npz_names(path, arrays)
    images = _images(path, arrays["x"])
    labels = _labels(path, arrays["y"], images.shape[0])
    clients, ids = None, ()
    if "client" in arrays:
        raw = _labels(path, arrays["client"], images.shape[0], "client")
        uniq, clients = np.unique(raw, return_inverse=True)
        ids = tuple(str(int(u)) for u in uniq)
    return _own(path, images, labels, clients, ids)


def _labels_file(path: Path) -> Path:
    name = path.name.replace("images-idx3", "labels-idx1")
    if name == path.name:
        raise _fail(path, "is an IDX file whose name has no 'images-idx3'",
                    "an IDX images file named *-images-idx3-ubyte[.gz] with its "
                    "*-labels-idx1-ubyte[.gz] beside it")  # fmt: skip
    return path.with_name(name)


def _from_idx(path: Path) -> OwnImages:
    expected = "an IDX images file *-images-idx3-ubyte[.gz] with *-labels-idx1-ubyte[.gz] beside it"
    labels_path = _labels_file(path)
    if not labels_path.is_file():
        raise _fail(path, f"its labels file {labels_path.name} is missing", expected)
    try:
        x, y = read_idx(path), read_idx(labels_path)
    except (OSError, ValueError) as err:
        raise _fail(path, f"cannot be read as IDX ({err})", expected) from None
    images = _images(path, np.asarray(x))
    return _own(path, images, _labels(labels_path, np.asarray(y), images.shape[0]), None, ())


def _own(
    path: Path, images: np.ndarray, labels: np.ndarray, clients: np.ndarray | None,
    ids: tuple[str, ...],
) -> OwnImages:  # fmt: skip
    n_classes = int(labels.max()) + 1
    if n_classes < 2:
        raise _fail(path, "the labels hold a single class; at least 2 are needed")
    data = LabelledImages(f"own:{path.name}", images, labels, n_classes)
    if clients is not None:
        counts = np.bincount(clients)
        if counts.min() < 2:
            small = ids[int(np.argmin(counts))]
            raise _fail(path, f"client {small} has {int(counts.min())} image(s); each needs 2 "
                              "(one for training, one for testing)")  # fmt: skip
    return OwnImages(data, clients, ids)


@lru_cache(maxsize=4)
def load_image_clients(data_file: str) -> OwnImages:
    """Load ``data_file`` (see the module docstring); cached per process.

    Raises
    ------
    OwnDataError
        Naming the file, the array and the expected format.
    """
    path = _path(data_file)
    if path.suffix == ".npz":
        return _from_npz(path)
    return _from_idx(path)
