"""The users' random streams: one generator per (seed, round, user[, purpose]).

DESIGN principle 4: everything a user draws in a round — FedSM's elements or pairs, FedCG's
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

__all__ = ["user_rng"]

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
