"""FedSubAvg's sentiment model (Section 5): embedding 25 → two-layer LSTM (100) → 2 classes.

The embedding table is the sparse part of the model: a client's submodel holds only the rows
of the tokens its tweets contain (:meth:`SentimentLSTM.submodel_rows`), and a step on its
data changes no other row (tested), so FedSubAvg's row-wise heat correction applies to it;
the LSTM and output layers are dense (every client touches them: heat N). Token id 0 is
padding and unknown words; its row is kept at zero (``padding_idx``), so it is never a
feature.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["SentimentLSTM"]


class SentimentLSTM(nn.Module):
    """Two-layer LSTM classifier over token ids.

    Parameters
    ----------
    vocab_size : int
        V: token ids 1..V (0 is padding), so the table has V + 1 rows.
    embedding_dim : int, optional
        25 (the paper's).
    hidden : int, optional
        100 units per LSTM layer (the paper's).
    layers : int, optional
        2 (the paper's).
    n_classes : int, optional
        2 (negative, positive).
    """

    #: the parameter that is FedSubAvg's sparse table
    SPARSE_KEY = "embedding.weight"
    #: the paper's embedding size
    EMBEDDING_DIM = 25

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int = EMBEDDING_DIM,
        hidden: int = 100,
        layers: int = 2,
        n_classes: int = 2,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size + 1, embedding_dim, padding_idx=0)
        self.lstm = nn.LSTM(embedding_dim, hidden, num_layers=layers, batch_first=True)
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return class logits for (batch, length) token ids (the last real token's state).

        Padding is at the end of each tweet: the state read is the one after the last
        non-zero token (the first one for an empty tweet).
        """
        x = self.embedding(tokens)
        states, _ = self.lstm(x)
        lengths = (tokens != 0).sum(dim=1).clamp(min=1)
        last = states[torch.arange(tokens.shape[0]), lengths - 1]
        return self.out(last)

    @staticmethod
    def submodel_rows(tokens: np.ndarray) -> np.ndarray:
        """Return the embedding rows a client's token ids touch (sorted, padding excluded)."""
        rows = np.unique(np.asarray(tokens))
        return rows[rows > 0].astype(np.int64)
