"""recsys-fedsubavg: the model, the data and the training loop (PyTorch)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: the embedding tables: a client's ratings touch only its users' and items' rows
SPARSE_KEYS = ("user_emb.weight", "item_emb.weight")


class RecModel(nn.Module):
    """User and item embeddings, concatenated, then an MLP predicting the rating."""

    def __init__(self, num_users: int, num_items: int, dim: int = 16) -> None:
        super().__init__()
        self.user_emb = nn.Embedding(num_users, dim)
        self.item_emb = nn.Embedding(num_items, dim)
        nn.init.normal_(self.user_emb.weight, std=0.1)
        nn.init.normal_(self.item_emb.weight, std=0.1)
        self.head = nn.Sequential(nn.Linear(2 * dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Return the predicted ratings of (user, item) pairs."""
        x = torch.cat([self.user_emb(users), self.item_emb(items)], dim=1)
        return self.head(x).squeeze(1)


@dataclass(frozen=True)
class Ratings:
    """All ratings: parallel arrays of user ids, item ids and ratings (1..5)."""

    name: str
    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    num_users: int
    num_items: int


def synthetic_ratings(num_users: int, num_items: int, seed: int = 0) -> Ratings:
    """Ratings from latent factors; item popularity is Zipf-like (a few hot, many cold)."""
    rng = np.random.default_rng(seed)
    u_f = rng.normal(0.0, 0.7, (num_users, 4))
    i_f = rng.normal(0.0, 0.7, (num_items, 4))
    i_bias = rng.normal(0.0, 0.5, num_items)
    popularity = 1.0 / np.arange(1, num_items + 1)
    popularity = rng.permutation(popularity / popularity.sum())
    users, items = [], []
    for u in range(num_users):
        chosen = rng.choice(num_items, size=int(rng.integers(20, 60)), replace=False, p=popularity)
        users.append(np.full(chosen.size, u))
        items.append(chosen)
    users_a, items_a = np.concatenate(users), np.concatenate(items)
    score = 3.5 + (u_f[users_a] * i_f[items_a]).sum(1) + i_bias[items_a]
    ratings = np.clip(np.rint(score + rng.normal(0.0, 0.5, score.size)), 1, 5)
    return Ratings("synthetic-ratings", users_a, items_a, ratings.astype(np.float32),
                   num_users, num_items)


def movielens_ratings(path: Path) -> Ratings:
    """MovieLens-1M ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``); ids are rows."""
    rows = [line.split("::")[:3] for line in path.read_text(encoding="latin-1").splitlines()]
    data = np.array(rows, dtype=np.int64)
    users, items = data[:, 0], data[:, 1]
    return Ratings("movielens-1m", users, items, data[:, 2].astype(np.float32),
                   int(users.max()) + 1, int(items.max()) + 1)


@lru_cache(maxsize=4)
def load_ratings(data_dir: str, synthetic_users: int, synthetic_items: int) -> Ratings:
    """MovieLens-1M if ``data_dir/ratings.dat`` exists, else the synthetic ratings."""
    path = Path(data_dir) / "ratings.dat" if data_dir else None
    if path is not None and path.is_file():
        return movielens_ratings(path)
    return synthetic_ratings(synthetic_users, synthetic_items)


def dataset(run_config: dict) -> Ratings:
    """Return the ratings the run config names."""
    return load_ratings(
        str(run_config["data-dir"]),
        int(run_config["synthetic-users"]),
        int(run_config["synthetic-items"]),
    )


def make_model(run_config: dict) -> RecModel:
    """Return the model, sized for the configured ratings."""
    data = dataset(run_config)
    return RecModel(data.num_users, data.num_items, int(run_config["embedding-dim"]))


def load_data(partition_id: int, num_partitions: int, run_config: dict):
    """Return train/test loaders (80/20) of the node's users' ratings (users round-robin)."""
    data = dataset(run_config)
    mine = np.flatnonzero(data.users % num_partitions == partition_id)
    rng = np.random.default_rng([int(run_config["seed"]), partition_id])
    mine = rng.permutation(mine)
    cut = int(0.8 * mine.size)

    def tensors(idx: np.ndarray) -> TensorDataset:
        return TensorDataset(
            torch.from_numpy(data.users[idx]),
            torch.from_numpy(data.items[idx]),
            torch.from_numpy(data.ratings[idx]),
        )

    batch = int(run_config["batch-size"])
    gen = torch.Generator().manual_seed(int(run_config["seed"]) * 1000 + partition_id)
    trainloader = DataLoader(tensors(mine[:cut]), batch_size=batch, shuffle=True, generator=gen)
    testloader = DataLoader(tensors(mine[cut:]), batch_size=256)
    return trainloader, testloader


def train(model: RecModel, loader: DataLoader, epochs: int, lr: float) -> float:
    """Plain SGD on the squared error; return the mean training loss."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    total, count = 0.0, 0
    for _ in range(epochs):
        for users, items, ratings in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(users, items), ratings)
            loss.backward()
            opt.step()
            total += loss.item() * len(ratings)
            count += len(ratings)
    return total / max(count, 1)


def test(model: RecModel, loader: DataLoader) -> float:
    """Mean squared error of the ratings."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for users, items, ratings in loader:
            total += nn.functional.mse_loss(model(users, items), ratings, reduction="sum").item()
            count += len(ratings)
    return total / max(count, 1)
