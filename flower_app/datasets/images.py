"""A labelled image dataset held in memory: what the FMNIST and EMNIST loaders return."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LabelledImages"]


@dataclass(frozen=True)
class LabelledImages:
    """Flattened images and their labels (official train and test files, concatenated).

    Attributes
    ----------
    name : str
        Dataset name as in run_config ``dataset`` (``synthetic-*`` for stand-ins).
    images : numpy.ndarray
        (N, d) features, one row per example: uint8 pixels of 28×28 images flattened row by
        row (d = 784) for the image datasets, float32 pooled word vectors (d = 200) for the
        Sent140 features of :mod:`flower_app.datasets.sent140_features`.
    labels : numpy.ndarray
        int64 array (N,) of class ids 0..n_classes−1.
    n_classes : int
        Number of classes (10 for Fashion-MNIST, 62 for EMNIST ByClass).
    """

    name: str
    images: np.ndarray
    labels: np.ndarray
    n_classes: int

    def __post_init__(self) -> None:
        if self.images.ndim != 2 or self.images.shape[0] != self.labels.shape[0]:
            raise ValueError(
                f"images {self.images.shape} and labels {self.labels.shape} do not match"
            )
        if self.labels.size and (self.labels.min() < 0 or self.labels.max() >= self.n_classes):
            raise ValueError(f"labels must lie in 0..{self.n_classes - 1}")

    def __len__(self) -> int:
        return int(self.labels.shape[0])
