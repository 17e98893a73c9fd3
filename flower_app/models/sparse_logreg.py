"""Logistic regression over one-hot features, stored as one flat vector of model *rows*.

The FedSubAvg paper's MovieLens model (Section 5.1): one-hot gender, age, movie, gender ×
movie and age × movie, fed into a logistic regression. With one-hot inputs the logit of a
sample is the sum of the weights of its active features, so the model is a flat float64
vector ``x`` of ``n_params`` rows and a sample is the 6 rows it touches:

==========  ==================================  ===============================
block       rows                                 heat (clients touching a row)
==========  ==================================  ===============================
bias        ``0``                                every client (the dense part)
gender      ``1 + g``                 (g < 2)    clients of that gender
age         ``3 + a``                 (a < 7)    clients in that age bracket
movie       ``10 + j``                (j < J)    clients who rated movie j
gender×mov  ``10 + J + g·J + j``                  clients of gender g who rated j
age×movie   ``10 + 3J + a·J + j``                 clients of age a who rated j
==========  ==================================  ===============================

A client's submodel S(i) is the sorted set of rows its training samples touch; outside
S(i) its loss does not depend on ``x`` (Section 2 of the paper). The bias row is the one
"dense layer" and lies in every submodel.

Local training (:func:`local_sgd`) is vectorised over many clients at once: their submodels
are concatenated into one vector and each client's samples point into its own slice, so a
round of thousands of clients is a handful of numpy calls, and every client's result is
bit-identical whether it is trained alone or beside others (each row belongs to one client;
contributions are accumulated in that client's batch order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "AGE_BRACKETS",
    "FEATURES_PER_SAMPLE",
    "GENDERS",
    "OneHotLayout",
    "accuracy",
    "accuracy_of_logits",
    "column_logits",
    "local_sgd",
    "log_loss",
    "logits",
    "loss_of_logits",
    "sigmoid",
]

#: gender codes of ``users.dat`` in row order
GENDERS = ("F", "M")
#: age-bracket codes of ``users.dat`` in row order
AGE_BRACKETS = (1, 18, 25, 35, 45, 50, 56)
#: rows a sample touches: bias, gender, age, movie, gender×movie, age×movie
FEATURES_PER_SAMPLE = 6

_N_G = len(GENDERS)
_N_A = len(AGE_BRACKETS)
_HEAD = 1 + _N_G + _N_A  # bias + gender + age rows


@dataclass(frozen=True)
class OneHotLayout:
    """Row layout of the model for ``n_movies`` movies (see the module docstring).

    Parameters
    ----------
    n_movies : int
        Number J of movie ids (0..J−1).
    """

    n_movies: int

    @property
    def n_params(self) -> int:
        """Model rows M = 10 + 10·J."""
        return _HEAD + self.n_movies * (1 + _N_G + _N_A)

    def blocks(self) -> dict[str, slice]:
        """Return each feature block's row range (``bias``, ``gender``, ... ``age×movie``)."""
        j = self.n_movies
        return {
            "bias": slice(0, 1),
            "gender": slice(1, 1 + _N_G),
            "age": slice(1 + _N_G, _HEAD),
            "movie": slice(_HEAD, _HEAD + j),
            "gender×movie": slice(_HEAD + j, _HEAD + (1 + _N_G) * j),
            "age×movie": slice(_HEAD + (1 + _N_G) * j, _HEAD + (1 + _N_G + _N_A) * j),
        }

    def rows(self, gender: np.ndarray, age: np.ndarray, movie: np.ndarray) -> np.ndarray:
        """Return the rows touched by each sample.

        Parameters
        ----------
        gender : numpy.ndarray
            Gender index per sample, 0..1 (position in :data:`GENDERS`).
        age : numpy.ndarray
            Age-bracket index per sample, 0..6 (position in :data:`AGE_BRACKETS`).
        movie : numpy.ndarray
            Movie index per sample, 0..J−1.

        Returns
        -------
        numpy.ndarray
            int64 array of shape (n, 6): bias, gender, age, movie, gender×movie and
            age×movie rows, in that order (all distinct within a sample).

        Raises
        ------
        ValueError
            If an index is out of range.
        """
        g, a, m = (np.asarray(v, dtype=np.int64) for v in (gender, age, movie))
        j = self.n_movies
        for name, value, top in (("gender", g, _N_G), ("age", a, _N_A), ("movie", m, j)):
            if value.size and (value.min() < 0 or value.max() >= top):
                raise ValueError(f"{name} index outside 0..{top - 1}")
        out = np.empty((m.size, FEATURES_PER_SAMPLE), dtype=np.int64)
        out[:, 0] = 0
        out[:, 1] = 1 + g
        out[:, 2] = 1 + _N_G + a
        out[:, 3] = _HEAD + m
        out[:, 4] = _HEAD + j + g * j + m
        out[:, 5] = _HEAD + (1 + _N_G) * j + a * j + m
        return out


def sigmoid(z: np.ndarray) -> np.ndarray:
    """Return the logistic function 1 / (1 + e^−z), computed without overflow."""
    return np.exp(-np.logaddexp(0.0, -z))


def logits(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Return each sample's logit: the sum of the weights of its rows.

    Parameters
    ----------
    x : numpy.ndarray
        Weights (the full model, or concatenated submodels when ``rows`` are positions).
    rows : numpy.ndarray
        (n, 6) rows (positions into ``x``) per sample.

    Returns
    -------
    numpy.ndarray
        float64 logits, shape (n,). The six weights are added left to right, so the
        result does not depend on how many samples are evaluated together.
    """
    return column_logits(x, np.asarray(rows).T)


def column_logits(x: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Return :func:`logits` of samples whose rows are given column by column.

    Parameters
    ----------
    x : numpy.ndarray
        Weights.
    columns : numpy.ndarray
        (6, n): ``columns[c]`` holds every sample's c-th row (the transpose of ``rows``; a
        C-contiguous one, kept by an evaluator, gathers fastest).

    Returns
    -------
    numpy.ndarray
        float64 logits, shape (n,): the six weights added left to right, as :func:`logits`.
    """
    z = x[columns[0]]
    for c in range(1, len(columns)):
        z += x[columns[c]]
    return z


def loss_of_logits(z: np.ndarray, y: np.ndarray) -> float:
    """Return :func:`log_loss` from the samples' logits ``z``."""
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def accuracy_of_logits(z: np.ndarray, y: np.ndarray) -> float:
    """Return :func:`accuracy` from the samples' logits ``z``."""
    return float(np.mean((z > 0) == (y > 0.5)))


def log_loss(x: np.ndarray, rows: np.ndarray, y: np.ndarray) -> float:
    """Return the mean binary cross-entropy of the samples.

    Parameters
    ----------
    x : numpy.ndarray
        Weights.
    rows : numpy.ndarray
        (n, 6) rows per sample.
    y : numpy.ndarray
        Labels in {0, 1}.

    Returns
    -------
    float
        mean_s [log(1 + e^{z_s}) − y_s z_s].
    """
    return loss_of_logits(logits(x, rows), y)


def accuracy(x: np.ndarray, rows: np.ndarray, y: np.ndarray) -> float:
    """Return the share of samples whose predicted label (logit > 0) equals ``y``.

    Parameters
    ----------
    x : numpy.ndarray
        Weights.
    rows : numpy.ndarray
        (n, 6) rows per sample.
    y : numpy.ndarray
        Labels in {0, 1}.

    Returns
    -------
    float
        Accuracy in [0, 1].
    """
    return accuracy_of_logits(logits(x, rows), y)


def local_sgd(
    w: np.ndarray,
    positions: np.ndarray,
    y: np.ndarray,
    batches: np.ndarray,
    lr: float,
    proximal_mu: float = 0.0,
) -> None:
    """Run I mini-batch SGD steps on many clients' submodels at once, in place.

    Parameters
    ----------
    w : numpy.ndarray
        float64 concatenated submodels of the clients (updated in place).
    positions : numpy.ndarray
        (n_samples, 6) positions into ``w`` of each sample's rows (a sample's positions lie
        in its own client's slice).
    y : numpy.ndarray
        Labels of the samples, float64 in {0, 1}.
    batches : numpy.ndarray
        (C, I, B) sample indices: client c's batch at local iteration j is
        ``batches[c, j]``.
    lr : float
        Learning rate γ.
    proximal_mu : float, optional
        FedProx's μ: adds μ (w − w_start) to the gradient (default 0: plain SGD).

    Notes
    -----
    Each step minimises the batch mean of the log-loss:
    g_m = (1/B) Σ_{s ∈ batch, m ∈ rows(s)} (σ(z_s) − y_s) (+ μ (w_m − w⁰_m)).
    """
    n_clients, iters, batch = batches.shape
    if n_clients == 0 or iters == 0:
        return
    start = w.copy() if proximal_mu else None
    for j in range(iters):
        s = batches[:, j, :].ravel()
        pos = positions[s]
        err = (sigmoid(logits(w, pos)) - y[s]) / batch
        grad = np.bincount(pos.ravel(), weights=np.repeat(err, pos.shape[1]), minlength=w.size)
        if start is not None:
            grad += proximal_mu * (w - start)
        w -= lr * grad
