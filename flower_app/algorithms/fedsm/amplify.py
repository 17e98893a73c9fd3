"""FedSM Algorithm 3 (amplification to 1 − 1/e): the surrogate's values, with no Flower import.

Appendix B: x ← 0; for 1/η steps run Algorithm 1 or 2 on the surrogate

    g(T) = G(x + η1_T) − G(x),     G(y) = E_{R ~ y}[F(R)],

and set x ← x + η1_S; round x at the end. Users report values of their own g_i:

* Algorithm 1 inside: g_i(e | T) = G_i(x + η1_T + ηe_e) − G_i(x + η1_T) = η ∂_e G_i(y) with
  y = x + η1_T, because G_i is linear in each coordinate (and y_e + η ≤ 1: x_e ≤ (t−1)η
  before step t).
* Algorithm 2 inside: g_i(e | T ∪ {a_1..a_j}) = η ∂_e G_i(y + η1_{a_1..a_j}), j < r' (0 for
  e among a_1..a_j). One user is evaluated at several points: one per prefix that changes its row
  (its rated elements among a_1..a_r'), computed at once as "virtual rows".

``surrogate="exact"`` uses the closed forms of :mod:`flower_app.submodular.multilinear`;
``"sampled"`` estimates ∂_e G_i from ``samples`` sets R ~ y that each user draws from its own
stream ``default_rng([seed, t, user, 1])`` (unbiased; any objective with set evaluations).
Every reported value is rounded to a multiple of 2⁻³² before summing, so sums are exact in
float64 and do not depend on how users are split over nodes or the order of the replies.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from flower_app.algorithms.common.streams import user_rng
from flower_app.algorithms.fedsm.alg2 import SequencePairs, support_elements
from flower_app.submodular.multilinear import entry_gradients, sampled_entry_gradients
from flower_app.submodular.objectives import MaxRowObjective

__all__ = [
    "SURROGATES",
    "SurrogatePairGains",
    "quantize",
    "surrogate_entries",
    "user_uniforms",
]

#: ways a user computes its surrogate values
SURROGATES = ("exact", "sampled")
_GRID = 2.0**32


def quantize(values: np.ndarray) -> np.ndarray:
    """Round values to multiples of 2⁻³² (exact, order-independent float64 sums)."""
    return np.round(np.asarray(values, dtype=np.float64) * _GRID) / _GRID


def user_uniforms(
    rows: sp.csr_matrix, ids: np.ndarray, seed: int, server_round: int, samples: int
) -> np.ndarray:
    """Return the users' uniforms for sampling R, one row of ``samples`` per stored entry.

    User ``ids[p]`` draws ``(nnz of its row, samples)`` uniforms from
    ``default_rng([seed, server_round, ids[p], 1])``, in the row's CSR order.

    Parameters
    ----------
    rows : scipy.sparse.csr_matrix
        The users' rows.
    ids : numpy.ndarray
        Global user ids, one per row.
    seed, server_round : int
        Seed the streams.
    samples : int
        Sets R per user.

    Returns
    -------
    numpy.ndarray
        ``(rows.nnz, samples)`` float64.
    """
    counts = np.diff(rows.indptr)
    parts = [
        user_rng(seed, server_round, u, 1).random((c, samples))
        for u, c in zip(ids.tolist(), counts.tolist(), strict=True)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, samples))


def _check(surrogate: str, samples: int) -> None:
    if surrogate not in SURROGATES:
        raise ValueError(f"surrogate={surrogate!r}: choose one of {', '.join(SURROGATES)}")
    if surrogate == "sampled" and samples < 1:
        raise ValueError(f"samples={samples} must be >= 1 for the sampled surrogate")


def surrogate_entries(
    objective: MaxRowObjective,
    users: np.ndarray,
    ids: np.ndarray,
    point: np.ndarray,
    eta: float,
    surrogate: str,
    samples: int,
    seed: int,
    server_round: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the users' surrogate gains η ∂_e G_i(y), one per stored entry of their rows.

    Parameters
    ----------
    objective : MaxRowObjective
        Holds the users' rows.
    users : numpy.ndarray
        Row indices.
    ids : numpy.ndarray
        Global ids (streams of the sampled surrogate).
    point : numpy.ndarray
        y = x + η1_T.
    eta : float
        Step size η.
    surrogate : str
        ``"exact"`` or ``"sampled"``.
    samples : int
        Sets R per user (sampled surrogate).
    seed, server_round : int
        Seed the users' streams.

    Returns
    -------
    tuple of numpy.ndarray
        ``(upos, element, gain)`` grouped by user position, gains quantized.
    """
    _check(surrogate, samples)
    rows = objective.values[np.asarray(users, dtype=np.int64)]
    xe = point[rows.indices]
    if surrogate == "exact":
        upos, elem, weight = entry_gradients(rows, xe)
    else:
        uniforms = user_uniforms(rows, np.asarray(ids), seed, server_round, samples)
        weight = sampled_entry_gradients(rows, xe, uniforms)
        upos = np.repeat(np.arange(rows.shape[0]), np.diff(rows.indptr))
        elem = rows.indices.astype(np.int64)
    return upos, elem, quantize(eta * weight)


class SurrogatePairGains(SequencePairs):
    """Values g_i(e | T ∪ {a_1..a_j}) = η ∂_e G_i(y + η1_{a_1..a_j}) for Algorithm 2 pairs.

    Parameters
    ----------
    objective : MaxRowObjective
        Holds the users' rows.
    users : numpy.ndarray
        Row indices of the users that will be evaluated.
    ids : numpy.ndarray
        Their global ids.
    point : numpy.ndarray
        y = x + η1_T.
    eta : float
        Step size η.
    sequence : numpy.ndarray
        a_1..a_r'.
    surrogate : str
        ``"exact"`` or ``"sampled"``.
    samples : int
        Sets R per user (sampled).
    seed, server_round : int
        Seed the users' streams.
    j_from : int, optional
        Prefix length of pair column 0 (0 or 1).
    """

    def __init__(
        self,
        objective: MaxRowObjective,
        users: np.ndarray,
        ids: np.ndarray,
        point: np.ndarray,
        eta: float,
        sequence: np.ndarray,
        surrogate: str,
        samples: int,
        seed: int,
        server_round: int,
        j_from: int = 0,
    ) -> None:
        _check(surrogate, samples)
        super().__init__(objective, users, sequence, j_from)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.point = np.asarray(point, dtype=np.float64)
        self.eta = float(eta)
        self.surrogate = surrogate
        self.samples = int(samples)
        self.seed = int(seed)
        self.server_round = int(server_round)

    def active(self, users: np.ndarray, pool: np.ndarray) -> np.ndarray:
        """Return positions of the users whose row meets X (the others report zeros)."""
        rows = self.objective.values[self.users[users]]
        row_of = np.repeat(np.arange(rows.shape[0]), np.diff(rows.indptr))
        return np.asarray(users)[np.unique(row_of[self.pool_mask(pool)[rows.indices]])]

    def support(self, users: np.ndarray, pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return (index into ``users``, position in X) of the users' row entries in X."""
        return support_elements(self.objective, self.users[users], None, pool)

    def evaluate(
        self, users: np.ndarray, upos: np.ndarray, elem: np.ndarray, jdx: np.ndarray
    ) -> np.ndarray:
        """Return the quantized surrogate values of the pairs (see the class docstring)."""
        m, r_prime = self.objective.n_elements, self.sequence.size
        rows = self.objective.values[self.users[users]]
        n_rows, counts = rows.shape[0], np.diff(rows.indptr)
        row_of = np.repeat(np.arange(n_rows), counts)
        seqpos = np.full(m, -1, dtype=np.int64)
        seqpos[self.sequence] = np.arange(r_prime)
        sp_e = seqpos[rows.indices]
        hit_idx = np.flatnonzero(sp_e >= 0)
        hit_idx = hit_idx[np.lexsort((sp_e[hit_idx], row_of[hit_idx]))]
        h = np.bincount(row_of[hit_idx], minlength=n_rows)
        hit_start = np.cumsum(h) - h
        rank = np.full(rows.nnz, np.iinfo(np.int64).max)
        rank[hit_idx] = np.arange(hit_idx.size) - np.repeat(hit_start, h)
        # virtual row (i, p): user i at y + η·1{its first p hits of the sequence}
        pieces = h + 1
        v_base = np.cumsum(pieces) - pieces
        v_row = np.repeat(np.arange(n_rows), pieces)
        v_p = np.arange(v_row.size) - np.repeat(v_base, pieces)
        v_counts = counts[v_row]
        v_indptr = np.concatenate([[0], np.cumsum(v_counts)])
        entry = np.repeat(rows.indptr[:-1][v_row], v_counts) + (
            np.arange(v_indptr[-1]) - np.repeat(v_indptr[:-1], v_counts)
        )
        cols = rows.indices[entry].astype(np.int64)
        xe = self.point[cols] + self.eta * (rank[entry] < np.repeat(v_p, v_counts))
        vmat = sp.csr_matrix((rows.data[entry], cols, v_indptr), shape=(v_row.size, m))
        if self.surrogate == "exact":
            vr, vc, weight = entry_gradients(vmat, np.minimum(xe, 1.0))
        else:
            uniforms = user_uniforms(
                rows, self.ids[users], self.seed, self.server_round, self.samples
            )[entry]
            weight = sampled_entry_gradients(vmat, np.minimum(xe, 1.0), uniforms)
            vr, vc = np.repeat(np.arange(v_row.size), v_counts), cols
        keys = vr * m + vc
        order = np.argsort(keys)
        keys, weight = keys[order], weight[order]
        hit_keys = row_of[hit_idx] * r_prime + sp_e[hit_idx]
        length = jdx + self.j_from  # prefix a_1..a_length
        piece = np.searchsorted(hit_keys, upos * r_prime + length, side="left") - hit_start[upos]
        query = (v_base[upos] + piece) * m + elem
        loc = np.minimum(np.searchsorted(keys, query), max(keys.size - 1, 0))
        found = keys[loc] == query if keys.size else np.zeros(query.size, dtype=bool)
        value = np.where(found, weight[loc] if keys.size else 0.0, 0.0)
        in_prefix = (seqpos[elem] >= 0) & (seqpos[elem] < length)
        value[in_prefix] = 0.0
        return quantize(self.eta * value)
