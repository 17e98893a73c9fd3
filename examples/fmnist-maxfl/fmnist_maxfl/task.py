"""The model, the data and the training loops of the app (nothing Flower-specific)."""

from __future__ import annotations

import gzip
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


class Net(nn.Module):
    """A small MLP for 28×28 grey images and 10 classes, initialised from ``seed``."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.fc1 = nn.Linear(28 * 28, 128)
            self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the class scores of a batch of images."""
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def data_dir(run_config) -> Path:
    """Return the folder of the Fashion-MNIST files (run_config ``data-dir`` or the env)."""
    configured = str(run_config.get("data-dir", ""))
    if configured:
        return Path(configured)
    return Path(os.environ.get("FLOWER_APP_DATA", "data")) / "fashion-mnist"


def _idx(path: Path, offset: int, count: int, size: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        f.seek(offset)
        return np.frombuffer(f.read(count * size), dtype=np.uint8)


@lru_cache(maxsize=4)
def load_split(folder: str, split: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the first ``count`` images (float32, scaled) and labels of a split."""
    folder_path = Path(folder)
    x = _idx(folder_path / f"{split}-images-idx3-ubyte.gz", 16, count, 784)
    y = _idx(folder_path / f"{split}-labels-idx1-ubyte.gz", 8, count, 1)
    x = (x.reshape(count, 784).astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return x, y.astype(np.int64)


def partition(labels: np.ndarray, num_partitions: int, alpha: float, seed: int) -> list:
    """Split example indices over clients: per class, Dirichlet(alpha) shares."""
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(num_partitions)]
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(rng.dirichlet([alpha] * num_partitions))[:-1] * len(idx)).astype(int)
        for p, chunk in enumerate(np.split(idx, cuts)):
            parts[p] += chunk.tolist()
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def load_data(partition_id: int, num_partitions: int, run_config) -> tuple[DataLoader, DataLoader]:
    """Return this client's train and validation loaders (80/20 of its partition)."""
    x, y = load_split(str(data_dir(run_config)), "train", int(run_config["train-examples"]))
    seed = int(run_config["seed"])
    idx = partition(y, num_partitions, float(run_config["alpha"]), seed)[partition_id]
    idx = np.random.default_rng([seed, partition_id]).permutation(idx)
    cut = int(0.8 * len(idx))
    batch = int(run_config["batch-size"])
    generator = torch.Generator().manual_seed(seed * 1000 + partition_id)

    def loader(rows: np.ndarray, shuffle: bool) -> DataLoader:
        data = TensorDataset(torch.from_numpy(x[rows]), torch.from_numpy(y[rows]))
        return DataLoader(data, batch_size=batch, shuffle=shuffle, generator=generator)

    return loader(idx[:cut], True), loader(idx[cut:], False)


def load_test(run_config) -> DataLoader:
    """Return the server's test loader (the first ``test-examples`` test images)."""
    x, y = load_split(str(data_dir(run_config)), "t10k", int(run_config["test-examples"]))
    return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=256)


def train(model: nn.Module, loader: DataLoader, epochs: int, lr: float, device: str) -> float:
    """Train ``model`` with SGD; return the mean training loss."""
    model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    total, batches = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
    return total / max(batches, 1)


def test(model: nn.Module, loader: DataLoader, device: str) -> tuple[float, float]:
    """Return the mean loss and the accuracy of ``model`` on ``loader``."""
    model.to(device).eval()
    loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(x.to(device))
            loss += nn.functional.cross_entropy(out, y.to(device), reduction="sum").item()
            correct += (out.argmax(1) == y.to(device)).sum().item()
            count += len(y)
    return loss / max(count, 1), correct / max(count, 1)
