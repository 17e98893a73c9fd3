"""FedSM Algorithm 1 under shuffle-model differential privacy (Appendix C, Prop. C.1).

Each sampled user draws its d elements exactly as without DP (the same stream
``default_rng([seed, t, user])``), then reports, for every drawn element, the number of
ones among k randomised bits encoding f_i(e | S) ∈ [0, λ]
(:func:`flower_app.algorithms.fedsm.shuffle_dp.randomize_counts`), with randomness from its
node's :class:`~flower_app.algorithms.common.dp_noise.NoiseSource` (OS entropy; the key
``default_rng([seed, t, user, DP_STREAM])`` only in the research mode
``dp-reproducible-noise``, which gives no privacy against the server). A node sends the sum
of its users' counts; the server, which knows every user's draw from the public seed (so
the number of reporters n_e of each element among the users whose reports arrived),
debiases the total
(:func:`~flower_app.algorithms.fedsm.shuffle_dp.debias_counts`) into an unbiased estimate of
Σ_i f_i(e | S) and goes on as Algorithm 1 does. Unlike the plain report, users without a
positive gain must report too (their zeros are randomised like every other value).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from flower_app.algorithms.common.dp_noise import DP_STREAM, NoiseSource
from flower_app.algorithms.fedsm.sampling import user_draw
from flower_app.algorithms.fedsm.shuffle_dp import local_epsilon, randomize_counts

if TYPE_CHECKING:
    from flower_app.algorithms.fedsm.modes import RoundPlan

__all__ = ["DP_STREAM", "dp_entry_counts", "dp_local_epsilon", "dp_reporters", "dp_user_sums"]

_CHUNK = 1024


def _draws(ids: np.ndarray, n_pool: int, d: int, seed: int, server_round: int) -> np.ndarray:
    return np.stack([user_draw(int(u), n_pool, d, seed, server_round) for u in ids])


def dp_reporters(plan: RoundPlan, seed: int, users: np.ndarray | None = None) -> np.ndarray:
    """Return, for every element, how many of the round's users drew it (server side).

    The draws are the users' public-seed streams (no data), so the server knows n_e.
    ``users`` (default: all of ``plan.users``) restricts the count to the users whose
    reports arrived.
    """
    pool = np.setdiff1d(np.arange(plan.n_elements), plan.selected)
    out = np.zeros(plan.n_elements, dtype=np.int64)
    ids = np.asarray(plan.users if users is None else users, dtype=np.int64)
    for start in range(0, ids.size, _CHUNK):
        draws = _draws(ids[start : start + _CHUNK], pool.size, plan.d, seed, plan.server_round)
        out += np.bincount(pool[draws.ravel()], minlength=plan.n_elements)
    return out


def dp_user_sums(
    plan: RoundPlan, seed: int, users: np.ndarray, per_element: np.ndarray
) -> np.ndarray:
    """Return, for each of ``users``, the sum of ``per_element`` over the d elements it drew.

    The accounting's per-user charge of a round (e.g. the ε of every query it answered).
    """
    pool = np.setdiff1d(np.arange(plan.n_elements), plan.selected)
    values = np.asarray(per_element, dtype=np.float64)
    ids = np.asarray(users, dtype=np.int64)
    out = np.zeros(ids.size)
    for start in range(0, ids.size, _CHUNK):
        draws = _draws(ids[start : start + _CHUNK], pool.size, plan.d, seed, plan.server_round)
        out[start : start + draws.shape[0]] = values[pool[draws]].sum(axis=1)
    return out


def dp_local_epsilon(plan: RoundPlan, seed: int, users: np.ndarray) -> np.ndarray:
    """Return, for each of ``users``, the local randomiser's ε of its round's reports.

    Σ over the d elements it drew of k·ln((2 − p_e)/p_e) (δ = 0): what a node can verify its
    own users released, whoever else reported (:mod:`flower_app.privacy.ledger`).
    """
    assert plan.dp_flip is not None
    per_element = np.zeros(plan.n_elements)
    pool = np.setdiff1d(np.arange(plan.n_elements), plan.selected)
    for e in pool:
        per_element[e] = local_epsilon(plan.dp_bits, float(plan.dp_flip[e]))
    return dp_user_sums(plan, seed, users, per_element)


def dp_entry_counts(
    upos: np.ndarray,
    elem: np.ndarray,
    gain: np.ndarray,
    ids: np.ndarray,
    pool: np.ndarray,
    plan: RoundPlan,
    seed: int,
    noise: NoiseSource | None = None,
) -> tuple[np.ndarray, int]:
    """Return the users' summed counts of ones per element, and the values they encoded.

    Parameters
    ----------
    upos, elem, gain : numpy.ndarray
        The users' positive gains (position in ``ids``, element, f_i(e | S)).
    ids : numpy.ndarray
        Global ids of the node's sampled users (every one reports).
    pool : numpy.ndarray
        E \\ S, sorted.
    plan : RoundPlan
        The round, with ``dp_bits``, ``dp_flip``, ``dp_lam``.
    seed : int
        Run seed (the users' draws).
    noise : NoiseSource, optional
        The node's randomness for the round (default: a fresh one from OS entropy).

    Returns
    -------
    tuple
        ``(counts, values)``: float64 counts over E (integers), and users × d.
    """
    assert plan.dp_flip is not None
    m, t, k = plan.n_elements, plan.server_round, plan.dp_bits
    pos_of = np.full(m, -1, dtype=np.int64)
    pos_of[pool] = np.arange(pool.size)
    keep = (pos_of[elem] >= 0) & (gain > 0)
    upos, elem, gain = upos[keep], elem[keep], gain[keep]
    out = np.zeros(m)
    ids = np.asarray(ids, dtype=np.int64)
    noise = NoiseSource() if noise is None else noise
    for start in range(0, ids.size, _CHUNK):
        chunk = ids[start : start + _CHUNK]
        draws = _draws(chunk, pool.size, plan.d, seed, t)
        dense = np.zeros((chunk.size, pool.size))
        lo, hi = np.searchsorted(upos, [start, start + chunk.size])
        dense[upos[lo:hi] - start, pos_of[elem[lo:hi]]] = gain[lo:hi]
        values = np.take_along_axis(dense, draws, axis=1)
        elements = pool[draws]
        for row, user in enumerate(chunk):
            rng = noise.generator(t, int(user), DP_STREAM)
            ones = randomize_counts(values[row], plan.dp_lam, k, plan.dp_flip[elements[row]], rng)
            out += np.bincount(elements[row], weights=ones, minlength=m)
    return out, int(ids.size * plan.d)
