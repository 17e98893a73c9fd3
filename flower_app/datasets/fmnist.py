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

from flower_app.datasets.idx import idx_files, read_idx_split
from flower_app.datasets.images import LabelledImages
from flower_app.datasets.paths import resolve_data_dir

__all__ = ["FMNIST_FILES", "load_fmnist"]

URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
#: file name -> (md5 of the official .gz, expected number of items)
FMNIST_FILES = {
    "train-images-idx3-ubyte": ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", 60000),
    "train-labels-idx1-ubyte": ("25c81989df183df01b3e8a0aad5dffbe", 60000),
    "t10k-images-idx3-ubyte": ("bef4ecab320f06d8554ea6380940ec79", 10000),
    "t10k-labels-idx1-ubyte": ("bb300cfdad3c16e7a12a480ee83cd310", 10000),
}


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
    files = idx_files(
        Path(root) / "fashion-mnist", FMNIST_FILES, "Fashion-MNIST",
        URL + " (or https://github.com/zalandoresearch/fashion-mnist)", url=URL,
        md5={stem: md5 for stem, (md5, _) in FMNIST_FILES.items()}, download=download,
    )  # fmt: skip
    parts = [
        read_idx_split(files[f"{split}-images-idx3-ubyte"], files[f"{split}-labels-idx1-ubyte"],
                       10, FMNIST_FILES[f"{split}-images-idx3-ubyte"][1])  # fmt: skip
        for split in ("train", "t10k")
    ]
    images = np.concatenate([x.reshape(-1, 784) for x, _ in parts])
    return LabelledImages("fmnist", images, np.concatenate([y for _, y in parts]), 10)
