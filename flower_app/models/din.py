"""Deep Interest Network (Zhou et al., KDD 2018) as FedSubAvg's CTR model (Section 5).

As the authors' ``Model_DIN``: user and item embeddings of dimension 18; attention of the
target item over the user's clicked-item history; the MLP input is [user, item, Σ history,
item ⊙ Σ history, attended history]; then BatchNorm → 200 (Dice) → 80 (Dice) → 2 (softmax
cross-entropy). The user and item embedding tables are the sparse part (a client touches
its own user row and the rows of the items in its targets and histories:
:meth:`DIN.submodel_rows`); every other parameter is dense. Item id 0 is padding (its row
stays zero and is masked out of the attention).

The two normalisations follow the DIN reference code that the authors' model derives from,
not PyTorch's training-mode BatchNorm: the input "BatchNorm" is
``tf.layers.batch_normalization`` called without ``training``, i.e. always in inference mode
with its initial statistics (mean 0, variance 1, ε = 10⁻³): a trainable per-feature affine
map (:class:`FixedStatsNorm`); Dice normalises with the statistics of the batch it is given,
in training and evaluation alike (no running averages). This matters in federated training:
a client's batches hold 4 rows of one user, so running averages of their statistics (what
``nn.BatchNorm1d`` keeps and FedAvg would average) describe no population, and an
evaluation-mode model built on them diverged on the Amazon stand-in (train loss 0.72 → 55
in 200 FedSubAvg rounds while the clients' own training loss fell). Evaluation therefore
depends on the evaluation batch (the reference code uses 1,024 rows; we use
``EVAL_CHUNK`` of :mod:`flower_app.algorithms.fedsubavg.torch_tasks`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["DIN", "Dice", "FixedStatsNorm"]


class Dice(nn.Module):
    """The data-adaptive activation of DIN: p(x)·x + (1 − p(x))·α·x, p = σ(norm(x)).

    ``norm`` standardises each unit by the mean and standard deviation of the batch given
    (DIN's ``dice``: ``(x − μ) / (sqrt(mean((x − μ)²) + ε) + ε)``, ε = 10⁻⁹), in training and
    evaluation alike; a batch of one row gives p = ½.
    """

    def __init__(self, width: int, eps: float = 1e-9) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply Dice to (batch, width)."""
        mean = x.mean(dim=0, keepdim=True)
        std = torch.sqrt(((x - mean) ** 2 + self.eps).mean(dim=0, keepdim=True))
        p = torch.sigmoid((x - mean) / (std + self.eps))
        return p * x + (1 - p) * self.alpha * x


class FixedStatsNorm(nn.Module):
    """Batch normalisation in inference mode with its initial statistics: γ·x/√(1 + ε) + β.

    What ``tf.layers.batch_normalization(x)`` computes when it is never told it is training
    (DIN's ``bn1``): the moving mean 0 and variance 1 are never updated, γ and β are trained.
    """

    def __init__(self, width: int, eps: float = 1e-3) -> None:
        super().__init__()
        self.scale = float(1.0 / np.sqrt(1.0 + eps))
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the affine map to (batch, width)."""
        return x * (self.weight * self.scale) + self.bias


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
        self.bn = FixedStatsNorm(5 * dim)
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
    def submodel_rows(uid: np.ndarray, mid: np.ndarray, hist: np.ndarray) -> dict[str, np.ndarray]:
        """Return the rows of each sparse table a client's data touches (padding excluded)."""
        items = np.unique(np.concatenate([np.asarray(mid).ravel(), np.asarray(hist).ravel()]))
        users = np.unique(np.asarray(uid))
        return {
            "user_emb.weight": users[users > 0].astype(np.int64),
            "item_emb.weight": items[items > 0].astype(np.int64),
        }
