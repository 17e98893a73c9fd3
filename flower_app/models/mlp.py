"""The MLPs of the MaxFL experiments: 784 → 64 → dropout → 30 → C (Appendix D.1).

Images: "a deep multi-layer perceptron network with 2 hidden layers of units [64, 30] with
dropout after the first hidden layer" (:data:`HIDDEN`). Sent140: 3 hidden layers [128, 86, 30]
on the 200-D average-pooled tweet embedding, dropout after the first hidden layer as for the
images (:data:`SENT140_HIDDEN`). ReLU activations; the dropout rate is not given in the paper
(``dropout``, default 0.2 here). Dropout draws its mask from an explicit
:class:`torch.Generator`, so a client's training is reproducible from its seed alone
(every random draw depends on the seed, round and client only), whatever else runs in the
process.

Weights travel as a list of float32 numpy arrays in the order
``[W1 (64, 784), b1 (64,), W2 (30, 64), b2 (30,), W3 (C, 30), b3 (C,)]`` — torch's
``nn.Linear`` layout; :func:`layer_sizes` reads the architecture back from such a list.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

__all__ = ["HIDDEN", "MLP", "SENT140_HIDDEN", "init_weights", "layer_sizes", "weight_shapes"]

#: hidden layers of the image MLP
HIDDEN = (64, 30)
#: hidden layers of the Sent140 MLP (MaxFL paper, Appendix D.1)
SENT140_HIDDEN = (128, 86, 30)


def weight_shapes(
    n_in: int = 784, n_classes: int = 10, hidden: Sequence[int] = HIDDEN
) -> list[tuple[int, ...]]:
    """Return the shapes of the weight list.

    Parameters
    ----------
    n_in : int, optional
        Input size (default 784 = 28×28).
    n_classes : int, optional
        Output size (default 10).
    hidden : sequence of int, optional
        Hidden layer sizes (default (64, 30)).

    Returns
    -------
    list of tuple
        ``[(h1, n_in), (h1,), ..., (n_classes, h_last), (n_classes,)]``.
    """
    sizes = [n_in, *hidden, n_classes]
    shapes: list[tuple[int, ...]] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        shapes += [(b, a), (b,)]
    return shapes


def init_weights(
    seed: int, n_in: int = 784, n_classes: int = 10, hidden: Sequence[int] = HIDDEN
) -> list[np.ndarray]:
    """Return initial weights: U(−1/√fan_in, 1/√fan_in), torch's ``nn.Linear`` default.

    Parameters
    ----------
    seed : int
        Seeds ``numpy.random.default_rng([seed, 7919])``.
    n_in, n_classes : int, optional
        Input and output sizes.
    hidden : sequence of int, optional
        Hidden layer sizes.

    Returns
    -------
    list of numpy.ndarray
        float32 weights in the module's order.
    """
    rng = np.random.default_rng([int(seed), 7919])
    out = []
    for shape in weight_shapes(n_in, n_classes, hidden):
        fan_in = shape[1] if len(shape) == 2 else out[-1].shape[1]
        bound = 1.0 / np.sqrt(fan_in)
        out.append(rng.uniform(-bound, bound, size=shape).astype(np.float32))
    return out


def layer_sizes(weights: Sequence[np.ndarray]) -> tuple[int, tuple[int, ...], int]:
    """Return (n_in, hidden, n_classes) of a weight list in :func:`weight_shapes` order.

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        ``[W1, b1, ..., W_L, b_L]`` with W_i of shape (out, in).

    Returns
    -------
    tuple
        Input size, hidden sizes, output size.

    Raises
    ------
    ValueError
        If the list is not alternating (out, in) matrices and (out,) biases that chain.
    """
    shapes = [tuple(np.shape(w)) for w in weights]
    if len(shapes) < 2 or len(shapes) % 2:
        raise ValueError(f"an MLP weight list has pairs (W, b); got {len(shapes)} arrays")
    if len(shapes[0]) != 2:
        raise ValueError(f"MLP weight shapes do not chain: {shapes}")
    sizes = [shapes[0][1]]
    for w, b in zip(shapes[0::2], shapes[1::2], strict=True):
        if len(w) != 2 or w[1] != sizes[-1] or b != (w[0],):
            raise ValueError(f"MLP weight shapes do not chain: {shapes}")
        sizes.append(w[0])
    return int(sizes[0]), tuple(int(h) for h in sizes[1:-1]), int(sizes[-1])


class MLP(nn.Module):
    """n_in → h1 → ReLU → dropout → h2 → ReLU → ... → C (default 784 → 64 → 30 → C).

    Parameters
    ----------
    n_in : int, optional
        Input size (default 784).
    n_classes : int, optional
        Output size (default 10).
    hidden : sequence of int, optional
        Hidden sizes (default (64, 30)).
    dropout : float, optional
        Dropout rate after the first hidden layer (default 0.2).
    """

    def __init__(
        self,
        n_in: int = 784,
        n_classes: int = 10,
        hidden: Sequence[int] = HIDDEN,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        sizes = [n_in, *hidden, n_classes]
        self.layers = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )
        self.dropout = float(dropout)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Return logits; dropout is applied in training mode, with ``generator``'s draws.

        Parameters
        ----------
        x : torch.Tensor
            (n, n_in) float32 inputs.
        generator : torch.Generator, optional
            Source of the dropout mask (the global generator if None).

        Returns
        -------
        torch.Tensor
            (n, n_classes) logits.
        """
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i == len(self.layers) - 1:
                break
            h = F.relu(h)
            if i == 0 and self.training and self.dropout > 0:
                keep = torch.rand(h.shape, generator=generator) >= self.dropout
                h = h * keep / (1.0 - self.dropout)
        return h

    def get_weights(self) -> list[np.ndarray]:
        """Return the weights as float32 numpy arrays (copies)."""
        return [p.detach().cpu().numpy().astype(np.float32, copy=True) for p in self.parameters()]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Load weights from numpy arrays in the module's order.

        Parameters
        ----------
        weights : sequence of numpy.ndarray
            Arrays of the shapes of :func:`weight_shapes`.

        Raises
        ------
        ValueError
            On a wrong number of arrays or a shape mismatch.
        """
        params = list(self.parameters())
        if len(weights) != len(params):
            raise ValueError(f"expected {len(params)} arrays, got {len(weights)}")
        with torch.no_grad():
            for p, w in zip(params, weights, strict=True):
                if tuple(np.shape(w)) != tuple(p.shape):
                    raise ValueError(f"weight shape {np.shape(w)} != {tuple(p.shape)}")
                p.copy_(torch.from_numpy(np.asarray(w, dtype=np.float32)))
