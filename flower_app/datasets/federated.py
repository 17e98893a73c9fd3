"""Clients of the MaxFL experiments: partitions, label flipping, 60/40 splits, seen / unseen.

Appendix D.1 of Cho et al. (TMLR 2024), as we read it:

* ``dirichlet``: labels are spread over all clients (seen and unseen together) by a Dirichlet
  distribution with concentration α (0.5 for FMNIST, 0.05 for EMNIST), using flwr-datasets'
  :class:`~flwr_datasets.partitioner.DirichletPartitioner` (Hsu et al. 2019). "All clients
  have at least 50 data samples": ``min_partition_size=50``.
* ``clusters``: the labels are split into ``n_classes / 2`` disjoint pairs (5 clusters of 2
  labels for FMNIST, random pairing by ``data_seed``); clients are assigned to clusters at
  random (balanced) and each cluster's examples are split i.i.d. over its clients with
  :class:`~flwr_datasets.partitioner.IidPartitioner`.
* The first ``n_seen`` clients are *seen* (trained on), the next ``n_unseen`` are *unseen*
  (only evaluated); both come from the same partition, so from the same distribution.
* Label flipping on a fraction of clients (30%, drawn uniformly without replacement from all
  clients): the paper does not say which flip; we map label y to C − 1 − y on the client's
  train and test data.
* Each client's examples are split 60 % train / 40 % test by a permutation seeded by
  ``(data_seed, client)``.

Images (uint8 pixels) are scaled to [0, 1] and standardised by the dataset's global pixel mean
and standard deviation ("the normalized flattened image"). Float feature rows (e.g. the
average-pooled tweet embeddings of :mod:`flower_app.datasets.sent140_features`) are not
scaled: they are standardised by the global mean and standard deviation of all their values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from flower_app.datasets.images import LabelledImages

__all__ = ["ClientData", "Federation", "build_federation", "federation_from_clients"]

PARTITIONS = ("dirichlet", "clusters")
MIN_CLIENT_SIZE = 50


@dataclass(frozen=True)
class ClientData:
    """One client's data, ready for the MLP.

    Attributes
    ----------
    x_train, x_test : numpy.ndarray
        float32 (n, D) standardised images or feature rows.
    y_train, y_test : numpy.ndarray
        int64 labels (after flipping, if the client is flipped).
    flipped : bool
        Whether the client's labels are flipped.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    flipped: bool


@dataclass(frozen=True)
class Federation:
    """All clients of one experiment (seen first, then unseen).

    Attributes
    ----------
    data : LabelledImages
        The pooled dataset: uint8 pixels or float feature rows.
    n_seen, n_unseen : int
        Seen clients are ids 0..n_seen−1, unseen ones n_seen..n_seen+n_unseen−1.
    train_idx, test_idx : list of numpy.ndarray
        Row indices into ``data`` of each client's train and test examples.
    flipped : numpy.ndarray
        bool (n_clients,): clients whose labels are flipped.
    mean, std : float
        Standardisation: of pixels scaled to [0, 1] (uint8 data), or of the raw values
        (float feature rows).
    """

    data: LabelledImages
    n_seen: int
    n_unseen: int
    train_idx: list[np.ndarray]
    test_idx: list[np.ndarray]
    flipped: np.ndarray
    mean: float
    std: float

    @property
    def n_clients(self) -> int:
        """Seen plus unseen clients."""
        return self.n_seen + self.n_unseen

    @property
    def n_classes(self) -> int:
        """Number of classes."""
        return self.data.n_classes

    def _rows(self, idx: np.ndarray, flipped: bool) -> tuple[np.ndarray, np.ndarray]:
        if _is_pixels(self.data.images):
            x = (self.data.images[idx].astype(np.float32) / 255.0 - self.mean) / self.std
        else:
            x = (self.data.images[idx].astype(np.float32) - self.mean) / self.std
        y = self.data.labels[idx].astype(np.int64)
        if flipped:
            y = self.n_classes - 1 - y
        return x.astype(np.float32), y

    def client(self, k: int) -> ClientData:
        """Return client ``k``'s train and test data.

        Parameters
        ----------
        k : int
            Client id, 0..n_clients−1.

        Returns
        -------
        ClientData
            Standardised images and (possibly flipped) labels.
        """
        if not 0 <= k < self.n_clients:
            raise IndexError(f"client {k} does not exist (0..{self.n_clients - 1})")
        flipped = bool(self.flipped[k])
        x_tr, y_tr = self._rows(self.train_idx[k], flipped)
        x_te, y_te = self._rows(self.test_idx[k], flipped)
        return ClientData(x_tr, y_tr, x_te, y_te, flipped)


def _offline_hf() -> None:
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        os.environ.setdefault(key, "1")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


def _dirichlet(labels: np.ndarray, n_clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    _offline_hf()
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    # arrow format: the partitioner reads the label column in one piece (datasets 4 would
    # otherwise iterate it row by row); the partitions are the same
    ds = Dataset.from_dict({"label": labels, "idx": np.arange(labels.size)}).with_format("arrow")
    part = DirichletPartitioner(
        num_partitions=n_clients,
        partition_by="label",
        alpha=alpha,
        min_partition_size=MIN_CLIENT_SIZE,
        self_balancing=False,
        shuffle=True,
        seed=seed,
    )
    part.dataset = ds
    return [_indices(part.load_partition(i)) for i in range(n_clients)]


def _indices(partition: Any) -> np.ndarray:
    """Return a partition's sorted ``idx`` column as int64 (read as one numpy column)."""
    column = partition.with_format("arrow")[:]["idx"]
    return np.sort(np.asarray(column.to_numpy(), dtype=np.int64))


def _clusters(
    labels: np.ndarray, n_classes: int, n_clients: int, rng: np.random.Generator, seed: int
) -> list[np.ndarray]:
    _offline_hf()
    from datasets import Dataset
    from flwr_datasets.partitioner import IidPartitioner

    if n_classes % 2:
        raise ValueError(f"clusters of 2 labels need an even number of classes, got {n_classes}")
    n_clusters = n_classes // 2
    pairs = rng.permutation(n_classes).reshape(n_clusters, 2)
    cluster_of_client = rng.permutation(n_clients) % n_clusters
    out: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * n_clients
    for c in range(n_clusters):
        members = np.flatnonzero(cluster_of_client == c)
        rows = np.flatnonzero(np.isin(labels, pairs[c]))
        part = IidPartitioner(num_partitions=members.size)
        part.dataset = Dataset.from_dict({"idx": rng.permutation(rows)})
        for j, client in enumerate(members):
            out[int(client)] = _indices(part.load_partition(j))
    return out


def federation_from_clients(
    data: LabelledImages,
    clients: np.ndarray,
    n_seen: int,
    n_unseen: int,
    label_flip: float = 0.3,
    train_fraction: float = 0.6,
    data_seed: int = 0,
) -> Federation:
    """Make a federation from clients the data already has (your own ``client`` array).

    Client ids 0..n_seen−1 are seen, n_seen..n_seen+n_unseen−1 unseen (ids beyond are not
    used); flips, the train/test split and the standardisation are those of
    :func:`build_federation`.

    Raises
    ------
    ValueError
        If more clients are asked for than the data has, or a client has fewer than 2
        examples.
    """
    n_have = int(clients.max()) + 1 if clients.size else 0
    if n_seen < 1 or n_unseen < 0 or n_seen + n_unseen > n_have:
        raise ValueError(
            f"{n_seen} seen + {n_unseen} unseen clients asked for; the data has {n_have}"
        )
    order = np.argsort(clients, kind="stable")
    bounds = np.searchsorted(clients[order], np.arange(n_seen + n_unseen + 1))
    parts = [order[bounds[k] : bounds[k + 1]] for k in range(n_seen + n_unseen)]
    return _split(data, parts, n_seen, n_unseen, label_flip, train_fraction, data_seed)


def build_federation(
    data: LabelledImages,
    n_seen: int,
    n_unseen: int,
    partition: str = "dirichlet",
    alpha: float = 0.5,
    label_flip: float = 0.3,
    train_fraction: float = 0.6,
    data_seed: int = 0,
) -> Federation:
    """Partition a dataset into seen and unseen clients (Appendix D.1).

    Parameters
    ----------
    data : LabelledImages
        The pooled dataset.
    n_seen : int
        Clients trained on.
    n_unseen : int
        Clients only evaluated (from the same distribution).
    partition : str, optional
        ``"dirichlet"`` (default) or ``"clusters"``.
    alpha : float, optional
        Dirichlet concentration (default 0.5).
    label_flip : float, optional
        Fraction of clients whose labels are flipped (default 0.3).
    train_fraction : float, optional
        Share of each client's examples used for training (default 0.6).
    data_seed : int, optional
        Seed of the partition, the flips and the splits (default 0).

    Returns
    -------
    Federation
        The clients.

    Raises
    ------
    ValueError
        On an unknown partition or out-of-range fractions.
    """
    n_clients = n_seen + n_unseen
    if n_seen < 1 or n_unseen < 0:
        raise ValueError(f"need n_seen >= 1 and n_unseen >= 0, got {n_seen}, {n_unseen}")
    if partition not in PARTITIONS:
        raise ValueError(f"partition {partition!r} is not known; choose one of {PARTITIONS}")
    if not 0.0 <= label_flip <= 1.0 or not 0.0 < train_fraction < 1.0:
        raise ValueError("label_flip must lie in [0, 1] and train_fraction in (0, 1)")
    rng = np.random.default_rng([data_seed, 5])
    if partition == "dirichlet":
        if alpha <= 0:
            raise ValueError(f"Dirichlet alpha must be > 0, got {alpha}")
        parts = _dirichlet(data.labels, n_clients, alpha, data_seed)
    else:
        parts = _clusters(data.labels, data.n_classes, n_clients, rng, data_seed)
    return _split(data, parts, n_seen, n_unseen, label_flip, train_fraction, data_seed, rng)


def _split(
    data: LabelledImages,
    parts: list[np.ndarray],
    n_seen: int,
    n_unseen: int,
    label_flip: float,
    train_fraction: float,
    data_seed: int,
    rng: np.random.Generator | None = None,
) -> Federation:
    """Flip labels, split each client's examples into train/test, standardise."""
    if not 0.0 <= label_flip <= 1.0 or not 0.0 < train_fraction < 1.0:
        raise ValueError("label_flip must lie in [0, 1] and train_fraction in (0, 1)")
    n_clients = n_seen + n_unseen
    rng = np.random.default_rng([data_seed, 5]) if rng is None else rng
    flipped = np.zeros(n_clients, dtype=bool)
    flipped[rng.choice(n_clients, int(round(label_flip * n_clients)), replace=False)] = True
    train_idx, test_idx = [], []
    for k, rows in enumerate(parts):
        if rows.size < 2:
            raise ValueError(f"client {k} has {rows.size} examples; at least 2 are needed")
        perm = np.random.default_rng([data_seed, 6, k]).permutation(rows)
        n_train = min(max(int(round(train_fraction * rows.size)), 1), rows.size - 1)
        train_idx.append(np.sort(perm[:n_train]))
        test_idx.append(np.sort(perm[n_train:]))
    mean, std = _standardisation(data.images)
    return Federation(data, n_seen, n_unseen, train_idx, test_idx, flipped, mean, std)


def _is_pixels(values: np.ndarray) -> bool:
    """Return whether ``values`` are pixels 0..255 (integer dtype; uint8 in practice)."""
    return bool(np.issubdtype(values.dtype, np.integer))


def _standardisation(values: np.ndarray) -> tuple[float, float]:
    """Return the global (mean, std) used to standardise ``values``.

    Pixels (integer dtype, uint8 in practice): of the pixels scaled to [0, 1], from their
    histogram (the images' path, unchanged). Floating feature rows: of the raw values,
    accumulated in float64.

    Raises
    ------
    ValueError
        For another dtype, non-finite features or features of zero spread.
    """
    if _is_pixels(values):
        pixels = values.reshape(-1)
        counts = np.zeros(256, dtype=np.float64)
        for start in range(0, pixels.size, 1 << 24):  # in chunks: no int64 copy of every pixel
            counts += np.bincount(pixels[start : start + (1 << 24)], minlength=256)
        scaled = np.arange(256) / 255.0
        mean = float(counts @ scaled / counts.sum())
        return mean, float(np.sqrt(counts @ (scaled - mean) ** 2 / counts.sum()))
    if not np.issubdtype(values.dtype, np.floating):
        raise ValueError(f"client data must be pixels or float features, not {values.dtype}")
    flat = values.reshape(-1).astype(np.float64)
    if not np.all(np.isfinite(flat)):
        raise ValueError("float features hold NaN or infinite values")
    mean, std = float(flat.mean()), float(flat.std())
    if not std > 0:
        raise ValueError("float features have zero spread; they cannot be standardised")
    return mean, std
