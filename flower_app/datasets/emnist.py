"""EMNIST ByClass (Cohen et al. 2017): the official IDX files, and a calibrated stand-in.

Official layout under the data folder (the ``gzip/`` folder of NIST's ``gzip.zip``)::

    emnist/emnist-byclass-train-images-idx3-ubyte.gz   697,932 × 28 × 28
    emnist/emnist-byclass-train-labels-idx1-ubyte.gz   labels 0..61
    emnist/emnist-byclass-test-images-idx3-ubyte.gz    116,323 × 28 × 28
    emnist/emnist-byclass-test-labels-idx1-ubyte.gz

Classes 0–9 are digits, 10–35 upper-case and 36–61 lower-case letters. EMNIST stores each
image transposed relative to MNIST; the loader transposes it back. The files cannot be
downloaded in this workplace, so the loader is tested on small files in this format that the
tests write (:func:`flower_app.datasets.idx.write_idx`).

``synthetic-emnist`` is the stand-in the experiments use where the files are absent. It is
calibrated to what is published about ByClass — 814,255 images in 62 unbalanced classes,
"more digits than letters", letters "roughly" at their frequency in English — and to its
pixel statistics (mean ≈ 0.17 of full intensity, mostly-black backgrounds). Our assumptions,
named here because the exact per-class counts are not at hand: digits are 50 % of the images
(equal per digit); a letter's share is its English frequency, split 50/50 between upper and
lower case. Images are a class prototype (a random smooth stroke pattern) plus per-image
noise and a random shift, so the task is learnable but not trivial. The size scales with the
number of clients: 814,255 · n_clients / 1,000 images (the paper's 500 + 500 clients get
the real dataset's size).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from flower_app.datasets.idx import idx_files, read_idx_split
from flower_app.datasets.images import LabelledImages
from flower_app.datasets.paths import resolve_data_dir

__all__ = ["EMNIST_FILES", "load_emnist", "synthetic_emnist"]

EMNIST_FILES = (
    "emnist-byclass-train-images-idx3-ubyte",
    "emnist-byclass-train-labels-idx1-ubyte",
    "emnist-byclass-test-images-idx3-ubyte",
    "emnist-byclass-test-labels-idx1-ubyte",
)
SOURCE = "https://www.nist.gov/itl/products-and-services/emnist-dataset (gzip.zip, folder gzip/)"
N_CLASSES = 62
TOTAL_IMAGES = 814_255
PAPER_CLIENTS = 1_000

#: English letter frequencies (percent), a..z
_LETTERS = np.array(
    [8.2, 1.5, 2.8, 4.3, 12.7, 2.2, 2.0, 6.1, 7.0, 0.15, 0.77, 4.0, 2.4,
     6.7, 7.5, 1.9, 0.095, 6.0, 6.3, 9.1, 2.8, 0.98, 2.4, 0.15, 2.0, 0.074]
)  # fmt: skip


def class_shares() -> np.ndarray:
    """Return the stand-in's class distribution (62 shares summing to 1)."""
    letters = _LETTERS / _LETTERS.sum() * 0.5
    return np.concatenate([np.full(10, 0.05), letters / 2, letters / 2])


def load_emnist(data_dir: str | os.PathLike[str] | None = None) -> LabelledImages:
    """Load EMNIST ByClass (train then test) from the official IDX files.

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        Data folder; ``emnist/`` is looked up inside it.

    Returns
    -------
    LabelledImages
        Images (uint8, flattened, MNIST orientation) and labels 0..61.

    Raises
    ------
    DatasetNotFoundError
        If a file is missing (the message lists them and the source).
    DataFormatError
        If a file is not valid IDX, image and label counts differ, or labels exceed 61.
    """
    return _load(str(resolve_data_dir(data_dir)))


@lru_cache(maxsize=2)
def _load(root: str) -> LabelledImages:
    paths = idx_files(Path(root) / "emnist", EMNIST_FILES, "EMNIST ByClass", SOURCE)
    xs, ys = [], []
    for split in ("train", "test"):
        stem = f"emnist-byclass-{split}"
        x, y = read_idx_split(paths[f"{stem}-images-idx3-ubyte"],
                              paths[f"{stem}-labels-idx1-ubyte"], N_CLASSES)  # fmt: skip
        xs.append(np.ascontiguousarray(x.transpose(0, 2, 1)).reshape(-1, 784))
        ys.append(y)
    return LabelledImages("emnist", np.concatenate(xs), np.concatenate(ys), N_CLASSES)


def _prototypes(rng: np.random.Generator) -> np.ndarray:
    """Return 62 smooth stroke patterns in [0, 1], shape (62, 28, 28)."""
    yy, xx = np.mgrid[0:28, 0:28] / 27.0
    out = np.zeros((N_CLASSES, 28, 28))
    for c in range(N_CLASSES):
        img = np.zeros((28, 28))
        for _ in range(3):  # three strokes: Gaussian tubes along random segments
            (x0, y0), (x1, y1) = rng.uniform(0.2, 0.8, size=(2, 2))
            for s in np.linspace(0, 1, 12):
                cx, cy = x0 + s * (x1 - x0), y0 + s * (y1 - y0)
                img = np.maximum(img, np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 0.012))
        out[c] = img
    return out


def synthetic_emnist(n_clients: int, data_seed: int = 0) -> LabelledImages:
    """Return the calibrated EMNIST stand-in for ``n_clients`` clients (see module doc).

    Parameters
    ----------
    n_clients : int
        Seen plus unseen clients; the size is 814,255 · n_clients / 1,000 images.
    data_seed : int, optional
        Seed of prototypes, labels and noise.

    Returns
    -------
    LabelledImages
        Named ``synthetic-emnist``.
    """
    return _synthetic(int(n_clients), int(data_seed))


@lru_cache(maxsize=2)
def _synthetic(n_clients: int, data_seed: int) -> LabelledImages:
    rng = np.random.default_rng([data_seed, 62])
    n = max(int(round(TOTAL_IMAGES * n_clients / PAPER_CLIENTS)), N_CLASSES)
    protos = _prototypes(rng)
    labels = rng.choice(N_CLASSES, size=n, p=class_shares()).astype(np.int64)
    images = np.empty((n, 784), dtype=np.uint8)
    chunk = 50_000
    for start in range(0, n, chunk):
        lab = labels[start : start + chunk]
        shift = rng.integers(-2, 3, size=(lab.size, 2))
        base = protos[lab]
        rows = np.arange(lab.size)[:, None, None]
        yi = (np.arange(28)[None, :, None] + shift[:, 0, None, None]) % 28
        xi = (np.arange(28)[None, None, :] + shift[:, 1, None, None]) % 28
        img = base[rows, yi, xi] * rng.uniform(0.6, 1.0, size=(lab.size, 1, 1))
        img = img + rng.normal(0.0, 0.25, size=img.shape) * (img > 0.05)
        images[start : start + lab.size] = (np.clip(img, 0, 1) * 255).reshape(-1, 784)
    return LabelledImages("synthetic-emnist", images, labels, N_CLASSES)
