"""The clients' data: each client's scores for the items it knows (synthetic, no files).

Client ``partition_id`` likes a few items: popular items (low ids) are liked by many
clients, and each client has a taste cluster of its own. Its utility for a set S of
chosen items is facility location, f_i(S) = max_{j ∈ S} score_ij: a client is as happy as
its best chosen item.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["all_scores", "load_scores"]


def load_scores(partition_id: int, num_items: int, data_seed: int = 0) -> dict[int, float]:
    """Return client ``partition_id``'s scores ``{item: score in 1..5}``.

    Parameters
    ----------
    partition_id : int
        The client (node_config ``partition-id``).
    num_items : int
        Items 0..num_items−1 (the ground set every client shares).
    data_seed : int, optional
        Seed of the synthetic data (default 0).

    Returns
    -------
    dict
        About a fifth of the items, with integer scores 1..5.
    """
    rng = np.random.default_rng([int(data_seed), int(partition_id)])
    popularity = 1.0 / np.arange(1, num_items + 1)  # Zipf-like: low ids are popular
    taste = np.roll(
        np.exp(-0.5 * ((np.arange(num_items) - num_items / 2) / 3.0) ** 2),
        int(rng.integers(num_items)),
    )  # a cluster of items around a random one
    weights = popularity / popularity.sum() + taste / taste.sum()
    count = max(1, num_items // 5)
    items = rng.choice(num_items, size=count, replace=False, p=weights / weights.sum())
    scores = rng.integers(1, 6, size=count)
    return {int(i): float(s) for i, s in zip(items, scores, strict=True)}


def all_scores(num_clients: int, num_items: int, data_seed: int = 0) -> sp.csr_matrix:
    """Return the clients × items score matrix (for the centralized comparison only)."""
    out = np.zeros((num_clients, num_items))
    for p in range(num_clients):
        for item, score in load_scores(p, num_items, data_seed).items():
            out[p, item] = score
    return sp.csr_matrix(out)
