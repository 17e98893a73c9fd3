"""The users' random streams: one generator per (seed, round, user[, purpose]).

One seed decides everything: everything a user draws in a round — FedSM's elements or pairs, FedCG's
tie-breaks and sampled sets, the discrete greedy's coin, the mini-batches of MaxFL's and
FedSubAvg's clients — comes from ``numpy.random.default_rng([seed, round, user, *purpose])``
and from nothing else, so a node's sum over its users does not depend on how users are split
over nodes, nor on the engine. Every family keys its streams here; the purposes that keep a
user's draws for different uses apart are the families' own constants (MaxFL's ``TRAIN``,
``SOLO``, ``TUNE``, ``BYZANTINE``; FedSM's surrogate sets use 1; the research mode of
:mod:`~flower_app.algorithms.common.dp_noise` its streams).
"""

from __future__ import annotations

import numpy as np

__all__ = ["first_uniforms", "user_rng"]

_WORD = 2**32


def user_rng(seed: int, server_round: int, user: int, *purpose: int) -> np.random.Generator:
    """Return ``default_rng([seed, server_round, user, *purpose])``: a user's stream.

    Parameters
    ----------
    seed : int
        The run's seed.
    server_round : int
        The round (0 for what happens before round 1, e.g. MaxFL's solo models).
    user : int
        The user's global id (or a family's reserved id, e.g. FedSubAvg's CentralSGD).
    *purpose : int
        Further keys that separate a user's streams for different uses; none for the
        user's main stream.

    Returns
    -------
    numpy.random.Generator
        A fresh generator; the same keys give the same draws.
    """
    keys = [int(seed), int(server_round), int(user), *(int(p) for p in purpose)]
    if min(keys) >= 0 and max(keys) < _WORD:
        # SeedSequence turns each int below 2^32 into one uint32 word: handing it the words
        # directly gives the same entropy (the same stream) without its per-int coercion
        words = np.array(keys, dtype=np.uint32)
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
    return np.random.default_rng(keys)


# ---------------------------------------------------------------- many users' first uniform
# numpy's SeedSequence (bit_generator.pyx) and PCG64 (pcg64.h) constants
_POOL_SIZE = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_PCG_MULT = (2549297995355413924, 4865540595714422341)  # high, low word of the multiplier
_LOW32 = np.uint64(0xFFFFFFFF)


def first_uniforms(seed: int, server_round: int, users: np.ndarray, *purpose: int) -> np.ndarray:
    """Return ``[user_rng(seed, server_round, u, *purpose).random() for u in users]``.

    The first uniform of many users' streams at once (e.g. FedCG's participation coins): the
    same numbers, bit for bit, as one generator per user. When every key is below 2^32 the
    streams are not created: numpy's SeedSequence hashing and PCG64's seeding and first
    output are computed for all users together (uint32/uint64 arithmetic on arrays);
    otherwise, one generator per user.

    Parameters
    ----------
    seed, server_round : int
        As for :func:`user_rng`.
    users : numpy.ndarray
        Global user ids.
    *purpose : int
        As for :func:`user_rng`.

    Returns
    -------
    numpy.ndarray
        float64 in [0, 1), one per user.
    """
    users = np.asarray(users, dtype=np.int64).ravel()
    fixed = [int(seed), int(server_round), *(int(p) for p in purpose)]
    if users.size == 0:
        return np.zeros(0)
    if min(fixed) < 0 or max(fixed) >= _WORD or users.min() < 0 or users.max() >= _WORD:
        return np.array([user_rng(seed, server_round, int(u), *purpose).random() for u in users])
    columns = [np.full(users.size, key, np.uint32) for key in fixed]
    columns.insert(2, users.astype(np.uint32))  # the keys' order: seed, round, user, purpose
    with np.errstate(over="ignore"):
        s_high, s_low, i_high, i_low = _seed_words(_seed_pool(columns))
        # pcg64_set_seed: state 0, inc = (initseq << 1) | 1; step; state += seed; step
        inc_h = (i_high << np.uint64(1)) | (i_low >> np.uint64(63))
        inc_l = (i_low << np.uint64(1)) | np.uint64(1)
        mult_h, mult_l = np.uint64(_PCG_MULT[0]), np.uint64(_PCG_MULT[1])
        state = _add128((inc_h, inc_l), (s_high, s_low))
        state = _add128(_mul128(state, (mult_h, mult_l)), (inc_h, inc_l))
        # the first 64-bit output: step, then XSL-RR of the new state
        high, low = _add128(_mul128(state, (mult_h, mult_l)), (inc_h, inc_l))
        x = high ^ low
        rot = high >> np.uint64(58)
        out = (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))
    # Generator.random(): the top 53 bits times 2^-53
    return (out >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def _seed_pool(columns: list[np.ndarray]) -> list[np.ndarray]:
    """SeedSequence's pool (4 uint32 words) of each row of entropy words ``columns``."""
    hash_const = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal hash_const
        value = value ^ np.uint32(hash_const)
        hash_const = (hash_const * _MULT_A) & 0xFFFFFFFF
        value = value * np.uint32(hash_const)
        return value ^ (value >> np.uint32(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
        return r ^ (r >> np.uint32(16))

    zero = np.zeros_like(columns[0])
    pool = [hashmix(columns[i] if i < len(columns) else zero) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL_SIZE, len(columns)):
        for dst in range(_POOL_SIZE):
            pool[dst] = mix(pool[dst], hashmix(columns[src]))
    return pool


def _seed_words(pool: list[np.ndarray]) -> list[np.ndarray]:
    """SeedSequence.generate_state(4, uint64) from the pool: four uint64 arrays."""
    hash_const = _INIT_B
    words = []
    for i in range(8):
        value = pool[i % _POOL_SIZE] ^ np.uint32(hash_const)
        hash_const = (hash_const * _MULT_B) & 0xFFFFFFFF
        value = value * np.uint32(hash_const)
        words.append((value ^ (value >> np.uint32(16))).astype(np.uint64))
    return [words[2 * j] | (words[2 * j + 1] << np.uint64(32)) for j in range(4)]


def _mul128(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) of a · b mod 2^128 for 128-bit numbers given as (high, low) uint64."""
    (a_h, a_l), (b_h, b_l) = a, b
    a0, a1 = a_l & _LOW32, a_l >> np.uint64(32)
    b0, b1 = b_l & _LOW32, b_l >> np.uint64(32)
    ll, lh, hl = a0 * b0, a0 * b1, a1 * b0
    mid = (ll >> np.uint64(32)) + (lh & _LOW32) + (hl & _LOW32)
    low = (ll & _LOW32) | (mid << np.uint64(32))
    high = a1 * b1 + (lh >> np.uint64(32)) + (hl >> np.uint64(32)) + (mid >> np.uint64(32))
    return high + a_l * b_h + a_h * b_l, low


def _add128(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) of a + b mod 2^128."""
    low = a[1] + b[1]
    return a[0] + b[0] + (low < a[1]).astype(np.uint64), low
