"""FedSM users' draws for all sampled users at once (``fedsm-rng = "batched"``), no Flower import.

Two schemes decide which d elements (Algorithm 1) or pairs (Algorithm 2) a user i draws in
communication round t:

``"per-user"`` (default; the recorded reproductions use it)
    ``numpy.random.default_rng([seed, t, i]).choice(N, d, replace=False)``: one Python-level
    generator per user and round, then a dense d-subset of the N candidates. About 15 µs per
    user however sparse its report: the floor of the direct engine at scale (70,000 users a
    round on the DBLP-size instance).
``"batched"``
    A counter-based generator evaluated as numpy array arithmetic for every sampled user at
    once, and a draw whose cost is proportional to the user's *support* (the candidates where
    its value can be positive), not to d.

The batched generator
---------------------
Every random number is one output word of Philox4x64-10 (Salmon, Moraes, Dror & Shaw,
"Parallel random numbers: as easy as 1, 2, 3", SC 2011), the counter-based generator that
numpy ships as :class:`numpy.random.Philox`: a keyed bijection of a 256-bit counter, which
passes TestU01's BigCrush for any key and any counter pattern. :func:`philox4x64` evaluates it
on arrays of counters and is tested bit for bit against :class:`numpy.random.Philox`. The key
is (seed, a constant tag); the counter is (user id, round t, index, purpose), so

* the number a user gets depends only on (seed, t, user, index, purpose): not on which other
  users are in the batch, how the users are split over nodes, or the engine;
* distinct (t, user, index, purpose) are distinct counters, so their outputs are the outputs
  of a pseudo-random permutation at distinct points: as good as independent uniforms.

``purpose`` separates the uses: :data:`HYPER` (the size of the intersection), :data:`KEYS`
(the order of a user's support), :data:`DENSE` (the order of all candidates, for a user whose
support is unknown).

The support-proportional draw
-----------------------------
A user draws D, a uniformly random d-subset of the N candidates (E \\ S for Algorithm 1, the
|X|·r' pairs for Algorithm 2), and reports its values on D; its values are zero outside a set
A of s candidates known before the draw (its positive gains, or a superset of them). The
report depends on D only through D ∩ A, and for a uniform d-subset D

* |D ∩ A| is hypergeometric: P(|D ∩ A| = h) = C(s, h) C(N − s, d − h) / C(N, d);
* given |D ∩ A| = h, D ∩ A is a uniformly random h-subset of A (the law of D is invariant
  under permutations of the candidates that fix A).

So :func:`support_draw` draws h by inverting the hypergeometric CDF at the user's uniform
(word :data:`HYPER`), and takes the h elements of A with the smallest keys (words
:data:`KEYS`; distinct keys in a uniformly random order give a uniform h-subset). The report
has the law of the dense draw's, in time O(s log s) per user instead of O(d). The CDF is
summed in float64 from log-binomials (``scipy.special.gammaln``), so the probabilities are
exact up to ~1e-12 relative rounding. ``tests/test_fedsm_sampling.py`` checks the law
against an enumeration of every d-subset with a chi-square test.

What still uses per-user streams under ``"batched"``: the sampled amplification surrogate's
sets R ~ y (``default_rng([seed, t, user, 1])``), which are not draws of D.
"""

from __future__ import annotations

import numpy as np

from flower_app.algorithms.common.streams import user_rng

__all__ = [
    "DENSE",
    "HYPER",
    "KEYS",
    "RNG_SCHEMES",
    "check_scheme",
    "dense_draw",
    "draw_counts",
    "hypergeometric",
    "keyed_uniforms",
    "keyed_words",
    "philox4x64",
    "sample_users",
    "support_draw",
    "user_draw",
]

#: the ways users draw D (run_config ``fedsm-rng``)
RNG_SCHEMES = ("per-user", "batched")
#: counter word 3: the uniform that decides |D ∩ A|
HYPER = 1
#: counter word 3: the keys that order a user's support A
KEYS = 2
#: counter word 3: the keys that order all candidates (dense draw)
DENSE = 3
#: second key word of every FedSM draw (the first is the run seed)
_TAG = 0x46656453_4D726E67  # "FedSMrng"

_M0 = np.uint64(0xD2E7470EE14C6C93)
_M1 = np.uint64(0xCA5A826395121157)
_W0 = np.uint64(0x9E3779B97F4A7C15)
_W1 = np.uint64(0xBB67AE8584CAA73B)
_LO32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def sample_users(rng: np.random.Generator, n_users: int, k: int) -> np.ndarray:
    """Draw the K users of a round: uniformly without replacement, sorted global indices.

    The one place where FedSM's server samples users (Algorithm 1's
    :meth:`~flower_app.algorithms.fedsm.core.FedSMServer.sample_users` and Algorithm 2's
    :meth:`~flower_app.algorithms.fedsm.alg2.FedSMAlg2Server.plan` call it): change the user
    sampling here.

    Parameters
    ----------
    rng : numpy.random.Generator
        The server's generator (its state is part of a run's checkpoint).
    n_users : int
        n, the number of users.
    k : int
        K, the users per round (1 ≤ K ≤ n).

    Returns
    -------
    numpy.ndarray
        K distinct user indices in increasing order.
    """
    return np.sort(rng.choice(n_users, size=k, replace=False))


def check_scheme(scheme: str) -> str:
    """Return ``scheme`` if it is one of :data:`RNG_SCHEMES`, else raise ValueError."""
    if scheme not in RNG_SCHEMES:
        raise ValueError(f"fedsm rng={scheme!r}: choose one of {', '.join(RNG_SCHEMES)}")
    return scheme


def _mulhilo(m: np.uint64, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the high and low 64-bit words of the 128-bit product m·x (x an array)."""
    m_lo, m_hi = m & _LO32, m >> _S32
    x_lo, x_hi = x & _LO32, x >> _S32
    ll = m_lo * x_lo
    lh = m_lo * x_hi
    hl = m_hi * x_lo
    cross = (ll >> _S32) + (lh & _LO32) + hl  # < 2^64: no overflow
    hi = m_hi * x_hi + (lh >> _S32) + (cross >> _S32)
    return hi, m * x


def philox4x64(counter: tuple[np.ndarray, ...], key: tuple[int, int]) -> list[np.ndarray]:
    """Evaluate Philox4x64-10 on arrays of counters (the bijection of numpy's ``Philox``).

    Parameters
    ----------
    counter : tuple of four numpy.ndarray
        The counter words c0..c3, broadcastable uint64 arrays.
    key : tuple of two int
        The key words (< 2**64).

    Returns
    -------
    list of numpy.ndarray
        The four uint64 output words. ``numpy.random.Philox(key=key, counter=c − 1)
        .random_raw(4)`` gives the same four numbers (numpy increments before it encrypts).
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in np.broadcast_arrays(*counter))
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    with np.errstate(over="ignore"):
        for r in range(10):
            if r:
                k0, k1 = k0 + _W0, k1 + _W1
            hi0, lo0 = _mulhilo(_M0, c0)
            hi1, lo1 = _mulhilo(_M1, c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return [c0, c1, c2, c3]


def keyed_words(
    seed: int, server_round: int, users: np.ndarray, index: np.ndarray, purpose: int
) -> np.ndarray:
    """Return one uint64 per (user, index): word 0 of Philox((user, t, index, purpose); seed).

    Parameters
    ----------
    seed : int
        Run seed (key word 0).
    server_round : int
        Communication round t.
    users : numpy.ndarray
        Global user ids (broadcast against ``index``).
    index : numpy.ndarray
        Element, pair or draw index.
    purpose : int
        :data:`HYPER`, :data:`KEYS` or :data:`DENSE`.

    Returns
    -------
    numpy.ndarray
        uint64 words.
    """
    u = np.asarray(users, dtype=np.int64).astype(np.uint64)
    i = np.asarray(index, dtype=np.int64).astype(np.uint64)
    t = np.uint64(int(server_round))
    p = np.uint64(int(purpose))
    return philox4x64((u, t, i, p), (int(seed) % 2**64, _TAG))[0]


def keyed_uniforms(
    seed: int, server_round: int, users: np.ndarray, index: np.ndarray, purpose: int
) -> np.ndarray:
    """Return uniforms in [0, 1) (53 bits of :func:`keyed_words`), one per (user, index)."""
    words = keyed_words(seed, server_round, users, index, purpose)
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53


def hypergeometric(u: np.ndarray, s: np.ndarray, n: int, d: int) -> np.ndarray:
    """Invert the hypergeometric CDF: the size h of D ∩ A for |A| = s, |D| = d, N = n.

    Parameters
    ----------
    u : numpy.ndarray
        Uniforms in [0, 1), one per user.
    s : numpy.ndarray
        Support sizes s ≤ n, one per user.
    n : int
        Candidates N.
    d : int
        Draws per user, 1 ≤ d ≤ N.

    Returns
    -------
    numpy.ndarray
        int64 h = min{h : P(H ≤ h) > u}, in [max(0, d − (N − s)), min(s, d)].
    """
    u = np.asarray(u, dtype=np.float64)
    s = np.asarray(s, dtype=np.int64)
    out = np.empty(s.shape, dtype=np.int64)
    # imported here, not at the top: every ClientApp process imports this module, and only
    # the messages whose users draw need scipy.special (~0.15-0.3 CPU-s per process)
    from scipy.special import gammaln

    log_fact = gammaln(np.arange(n + 1, dtype=np.float64) + 1.0)  # log j!, j = 0..N

    def log_binom(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return log_fact[a] - log_fact[b] - log_fact[a - b]

    log_total = float(log_fact[n] - log_fact[d] - log_fact[n - d])
    h = np.maximum(0, d - (n - s))
    hi = np.minimum(s, d)
    idx = np.arange(s.size)
    cdf = np.zeros(s.size)
    while idx.size:
        cdf = cdf + np.exp(log_binom(s, h) + log_binom(n - s, d - h) - log_total)
        stop = (u < cdf) | (h >= hi)
        out[idx[stop]] = h[stop]
        keep = ~stop
        idx, h, cdf, u, s, hi = idx[keep], h[keep] + 1, cdf[keep], u[keep], s[keep], hi[keep]
    return out


def support_draw(
    upos: np.ndarray,
    cand: np.ndarray,
    ids: np.ndarray,
    n_candidates: int,
    d: int,
    seed: int,
    server_round: int,
) -> np.ndarray:
    """Return which support entries fall in the users' uniform d-subsets D (batched scheme).

    Parameters
    ----------
    upos : numpy.ndarray
        Position of each support entry's user in ``ids`` (any order; grouped is fastest).
    cand : numpy.ndarray
        The entry's candidate index in 0..N−1 (element id or pair id), distinct per user.
    ids : numpy.ndarray
        Global user ids.
    n_candidates : int
        N, the candidates each user draws d of.
    d : int
        Draws per user, 1 ≤ d ≤ N.
    seed, server_round : int
        Key the generator.

    Returns
    -------
    numpy.ndarray
        bool mask over the entries: True for the entries in D (per user: a uniform subset of
        its support of hypergeometric size, see the module docstring).
    """
    upos = np.asarray(upos, dtype=np.int64)
    if upos.size == 0:
        return np.zeros(0, dtype=bool)
    if not 1 <= d <= n_candidates:
        raise ValueError(f"d={d} must lie in 1..{n_candidates}")
    ids = np.asarray(ids, dtype=np.int64)
    cand = np.asarray(cand, dtype=np.int64)
    if upos.size > 1 and (np.diff(upos) < 0).any():  # group the entries by user
        order = np.argsort(upos, kind="stable")
        mask = np.empty(upos.size, dtype=bool)
        mask[order] = support_draw(
            upos[order], cand[order], ids, n_candidates, d, seed, server_round
        )
        return mask
    first = np.flatnonzero(np.r_[True, upos[1:] != upos[:-1]])
    counts = np.diff(np.r_[first, upos.size])
    size = hypergeometric(
        keyed_uniforms(seed, server_round, ids[upos[first]], np.zeros(1, np.int64), HYPER),
        counts,
        n_candidates,
        d,
    )
    group = np.repeat(np.arange(first.size), counts)
    mask = size[group] >= counts[group]  # h = s: the whole support; h = 0: none of it
    partial = np.flatnonzero((size > 0) & (size < counts))
    if partial.size:  # 0 < h < s: the h entries with the smallest keys
        ent = np.flatnonzero(np.isin(group, partial))
        keys = keyed_words(seed, server_round, ids[upos[ent]], cand[ent], KEYS)
        order = np.lexsort((keys, group[ent]))
        g = group[ent][order]
        start = np.searchsorted(g, g, side="left")
        mask[ent[order]] = np.arange(ent.size) - start < size[g]
    return mask


def dense_draw(user: int, n_candidates: int, d: int, seed: int, server_round: int) -> np.ndarray:
    """Return one user's d-subset of 0..N−1 under the batched scheme, drawn densely.

    For a user whose support is unknown (a gains callable): the d candidates with the
    smallest keys (word :data:`DENSE`), a uniform d-subset in O(N).

    Parameters
    ----------
    user : int
        Global user id.
    n_candidates : int
        N.
    d : int
        1 ≤ d ≤ N.
    seed, server_round : int
        Key the generator.

    Returns
    -------
    numpy.ndarray
        int64 candidate indices, sorted.
    """
    if not 1 <= d <= n_candidates:
        raise ValueError(f"d={d} must lie in 1..{n_candidates}")
    keys = keyed_words(seed, server_round, np.int64(user), np.arange(n_candidates), DENSE)
    if d == n_candidates:
        return np.arange(n_candidates, dtype=np.int64)
    return np.sort(np.argpartition(keys, d - 1)[:d]).astype(np.int64)


def user_draw(
    user: int, n_candidates: int, d: int, seed: int, server_round: int, scheme: str = "per-user"
) -> np.ndarray:
    """Return one user's d-subset of 0..N−1, drawn densely, under ``scheme``.

    ``"per-user"``: ``user_rng(seed, server_round, user).choice(N, d, replace=False)`` (in
    the generator's order); ``"batched"``: :func:`dense_draw` (sorted). The draw every FedSM
    user makes when it does not draw on its support only: Algorithm 1's elements, Algorithm
    2's pairs, the DP server's count of the reporters.
    """
    if scheme == "batched":
        return dense_draw(user, n_candidates, d, seed, server_round)
    return user_rng(seed, server_round, user).choice(n_candidates, d, replace=False)


def draw_counts(
    user_ids: np.ndarray,
    pool: np.ndarray,
    d: int,
    seed: int,
    server_round: int,
    n_elements: int,
    scheme: str = "per-user",
) -> np.ndarray:
    """Return, per element, how many of these FedSM users drew it this round.

    Parameters
    ----------
    user_ids : numpy.ndarray
        Global ids of the sampled users (a node's, or all of the round's).
    pool : numpy.ndarray
        Sorted elements the users draw from (E \\ S).
    d : int
        Elements per user.
    seed, server_round : int
        Key the users' draws.
    n_elements : int
        m.
    scheme : str, optional
        ``"per-user"`` or ``"batched"`` (as the run's ``fedsm-rng``).

    Returns
    -------
    numpy.ndarray
        int64 counts of length m.
    """
    counts = np.zeros(n_elements, dtype=np.int64)
    pool = np.asarray(pool, dtype=np.int64)
    for user in np.asarray(user_ids, dtype=np.int64):
        counts[pool[user_draw(int(user), pool.size, d, seed, server_round, scheme)]] += 1
    return counts
