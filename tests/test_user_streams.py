"""The users' streams: ``first_uniforms`` is ``user_rng(...).random()`` for many users at once."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flower_app.algorithms.common.streams import first_uniforms, user_rng

WORD = st.integers(0, 2**32 - 1)
KEY = st.one_of(WORD, st.integers(0, 2**40))  # beyond 2^32: the per-user fallback


@settings(max_examples=60, deadline=None)
@given(
    seed=KEY,
    server_round=KEY,
    users=st.lists(KEY, max_size=40),
    purpose=st.lists(WORD, max_size=3),
)
def test_first_uniforms_are_each_users_first_draw(seed, server_round, users, purpose) -> None:
    """Bit for bit the first ``random()`` of each user's own generator (SeedSequence + PCG64)."""
    got = first_uniforms(seed, server_round, np.array(users, dtype=np.int64), *purpose)
    expected = [user_rng(seed, server_round, u, *purpose).random() for u in users]
    assert got.dtype == np.float64 and got.shape == (len(users),)
    assert got.tolist() == expected


def test_first_uniforms_on_many_users_match_and_look_uniform() -> None:
    """10,000 consecutive ids: equal to the per-user streams, and spread over [0, 1)."""
    users = np.arange(10_000)
    got = first_uniforms(3, 17, users)
    assert got.tolist() == [user_rng(3, 17, int(u)).random() for u in users]
    counts = np.histogram(got, bins=10, range=(0.0, 1.0))[0]
    assert counts.min() > 850 and counts.max() < 1150


def test_user_rng_fast_seeding_is_default_rng() -> None:
    """user_rng's uint32-word seeding gives numpy's default_rng stream for the same keys."""
    for keys in ([0, 0, 0], [1, 2, 3, 4], [2**32 - 1, 0, 7, 1, 2], [5, 2**32, 1]):
        ours = user_rng(*keys).integers(0, 2**62, 8)
        assert ours.tolist() == np.random.default_rng(keys).integers(0, 2**62, 8).tolist()
