"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) from its official IDX files.

Layout under the data folder (``data-dir``, ``$FLOWER_APP_DATA`` or
``~/.cache/flower_app/datasets``)::

    fashion-mnist/train-images-idx3-ubyte.gz   60,000 × 28 × 28
    fashion-mnist/train-labels-idx1-ubyte.gz
    fashion-mnist/t10k-images-idx3-ubyte.gz    10,000 × 28 × 28
    fashion-mnist/t10k-labels-idx1-ubyte.gz

Uncompressed files (without ``.gz``) are read too. Missing files are downloaded from the
official mirror when downloads are allowed (md5 of the official ``.gz`` files as published by
torchvision; the download path is not exercised in this workplace, which has no internet);
otherwise :class:`~flower_app.datasets.paths.DatasetNotFoundError` lists the files and where to
get them. The MaxFL experiments pool train and test (70,000 images) and split each client's
data 60/40 themselves (Appendix D.1 of the MaxFL paper).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from flower_app.datasets.idx import read_idx
from flower_app.datasets.images import LabelledImages
from flower_app.datasets.paths import (
    DataFormatError,
    DatasetNotFoundError,
    download_allowed,
    download_file,
    resolve_data_dir,
)

__all__ = ["FMNIST_FILES", "load_fmnist"]

URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
#: file name -> (md5 of the official .gz, expected number of items)
FMNIST_FILES = {
    "train-images-idx3-ubyte": ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", 60000),
    "train-labels-idx1-ubyte": ("25c81989df183df01b3e8a0aad5dffbe", 60000),
    "t10k-images-idx3-ubyte": ("bef4ecab320f06d8554ea6380940ec79", 10000),
    "t10k-labels-idx1-ubyte": ("bb300cfdad3c16e7a12a480ee83cd310", 10000),
}


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem):
        if (folder / name).exists():
            return folder / name
    return None


def _ensure_files(folder: Path, download: bool | None) -> dict[str, Path]:
    found = {stem: _find(folder, stem) for stem in FMNIST_FILES}
    missing = [stem for stem, path in found.items() if path is None]
    if missing and download_allowed(download):
        try:
            for stem in missing:
                md5 = FMNIST_FILES[stem][0]
                found[stem] = download_file(URL + stem + ".gz", folder / (stem + ".gz"), md5=md5)
        except OSError as err:
            raise DatasetNotFoundError(
                "Fashion-MNIST",
                [folder / (s + ".gz") for s in FMNIST_FILES],
                URL + " (or https://github.com/zalandoresearch/fashion-mnist)",
                reason=f"download failed: {err}",
                data_dir=folder.parent,
            ) from err
    elif missing:
        raise DatasetNotFoundError(
            "Fashion-MNIST",
            [folder / (s + ".gz") for s in FMNIST_FILES],
            URL + " (or https://github.com/zalandoresearch/fashion-mnist)",
            reason="downloads are disabled (FLOWER_APP_OFFLINE=1)",
            data_dir=folder.parent,
        )
    return {stem: path for stem, path in found.items() if path is not None}


def load_fmnist(data_dir: str | os.PathLike[str] | None = None, download: bool | None = None):
    """Load Fashion-MNIST, train then test images, as one :class:`LabelledImages`.

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        Data folder; ``fashion-mnist/`` is looked up inside it ("" or None: the default).
    download : bool, optional
        Allow downloading missing files (default: unless ``FLOWER_APP_OFFLINE=1``).

    Returns
    -------
    LabelledImages
        70,000 images (uint8, flattened to 784) and labels 0..9.

    Raises
    ------
    DatasetNotFoundError
        If files are missing and cannot be downloaded.
    DataFormatError
        If a file is not a valid IDX file of the expected size.
    """
    return _load(str(resolve_data_dir(data_dir)), download)


@lru_cache(maxsize=2)
def _load(root: str, download: bool | None) -> LabelledImages:
    folder = Path(root) / "fashion-mnist"
    files = _ensure_files(folder, download)
    parts_x, parts_y = [], []
    for split in ("train", "t10k"):
        x = read_idx(files[f"{split}-images-idx3-ubyte"], ndim=3)
        y = read_idx(files[f"{split}-labels-idx1-ubyte"], ndim=1)
        count = FMNIST_FILES[f"{split}-images-idx3-ubyte"][1]
        if x.shape != (count, 28, 28) or y.shape != (count,):
            raise DataFormatError(
                files[f"{split}-images-idx3-ubyte"],
                f"expected {count} images of 28×28 and {count} labels, "
                f"got images {x.shape} and labels {y.shape}",
            )
        if y.max() > 9:
            raise DataFormatError(files[f"{split}-labels-idx1-ubyte"], "labels exceed 9")
        parts_x.append(x.reshape(count, 784))
        parts_y.append(y.astype(np.int64))
    return LabelledImages("fmnist", np.concatenate(parts_x), np.concatenate(parts_y), 10)
