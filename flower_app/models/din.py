"""Deep Interest Network (Zhou et al., KDD 2018) as FedSubAvg's CTR model (Section 5).

As the authors' ``Model_DIN``: user and item embeddings of dimension 18; attention of the
target item over the user's clicked-item history; the MLP input is [user, item, Σ history,
item ⊙ Σ history, attended history]; then BatchNorm → 200 (Dice) → 80 (Dice) → 2 (softmax
cross-entropy). The user and item embedding tables are the sparse part (a client touches
its own user row and the rows of the items in its targets and histories:
:meth:`DIN.submodel_rows`); every other parameter is dense. Item id 0 is padding (its row
stays zero and is masked out of the attention).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["DIN", "Dice"]


class Dice(nn.Module):
    """The data-adaptive activation of DIN: p(x)·x + (1 − p(x))·α·x, p = σ(BN(x))."""

    def __init__(self, width: int, eps: float = 1e-8) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(width, eps=eps, affine=False)
        self.alpha = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply Dice to (batch, width)."""
        p = torch.sigmoid(self.bn(x))
        return p * x + (1 - p) * self.alpha * x


class DIN(nn.Module):
    """DIN with sparse user/item embeddings.

    Parameters
    ----------
    n_users, n_items : int
        User ids 1..n_users and item ids 1..n_items (0 is padding in both tables).
    dim : int, optional
        18 (the paper's).
    attention_hidden : int, optional
        Units of the attention MLP (80, as in DIN).
    """

    #: the parameters that are FedSubAvg's sparse tables
    SPARSE_KEYS = ("user_emb.weight", "item_emb.weight")

    def __init__(self, n_users: int, n_items: int, dim: int = 18, attention_hidden: int = 80):
        super().__init__()
        self.user_emb = nn.Embedding(n_users + 1, dim, padding_idx=0)
        self.item_emb = nn.Embedding(n_items + 1, dim, padding_idx=0)
        self.attention = nn.Sequential(
            nn.Linear(4 * dim, attention_hidden), nn.Sigmoid(), nn.Linear(attention_hidden, 1)
        )
        self.bn = nn.BatchNorm1d(5 * dim)
        self.fc1, self.act1 = nn.Linear(5 * dim, 200), Dice(200)
        self.fc2, self.act2 = nn.Linear(200, 80), Dice(80)
        self.out = nn.Linear(80, 2)

    def forward(self, uid: torch.Tensor, mid: torch.Tensor, hist: torch.Tensor) -> torch.Tensor:
        """Return click logits (batch, 2) for users, target items and (batch, L) histories."""
        u, i = self.user_emb(uid), self.item_emb(mid)
        h = self.item_emb(hist)  # (batch, L, dim)
        mask = (hist != 0).unsqueeze(-1).float()
        q = i.unsqueeze(1).expand_as(h)
        scores = self.attention(torch.cat([q, h, q - h, q * h], dim=-1))
        scores = scores.masked_fill(mask == 0, -1e9)
        weights = torch.softmax(scores, dim=1) * mask
        attended = (weights * h).sum(dim=1)
        summed = (h * mask).sum(dim=1)
        z = self.bn(torch.cat([u, i, summed, i * summed, attended], dim=-1))
        z = self.act1(self.fc1(z))
        z = self.act2(self.fc2(z))
        return self.out(z)

    @staticmethod
    def submodel_rows(
        uid: np.ndarray, mid: np.ndarray, hist: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Return the rows of each sparse table a client's data touches (padding excluded)."""
        items = np.unique(np.concatenate([np.asarray(mid).ravel(), np.asarray(hist).ravel()]))
        users = np.unique(np.asarray(uid))
        return {
            "user_emb.weight": users[users > 0].astype(np.int64),
            "item_emb.weight": items[items > 0].astype(np.int64),
        }
