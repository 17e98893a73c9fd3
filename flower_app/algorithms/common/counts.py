"""Counts given as fractions or as absolute numbers (K clients, d elements, …)."""

from __future__ import annotations

import math

__all__ = ["RECIPROCAL_TOLERANCE", "reciprocal_steps", "resolve_count"]

#: how close 1/x must be to an integer (:func:`reciprocal_steps`)
RECIPROCAL_TOLERANCE = 1e-9


def resolve_count(spec: int | float, total: int, name: str) -> int:
    """Turn a count spec into a count in 1..total.

    Parameters
    ----------
    spec : int or float
        An ``int`` ≥ 1 is an absolute count; a ``float`` in (0, 1] is a fraction of
        ``total`` (rounded down, at least 1), as in the papers' "K = ⌊n/100⌋".
    total : int
        The population size the count is taken from.
    name : str
        Config key, for error messages.

    Returns
    -------
    int
        The count.

    Raises
    ------
    ValueError
        If the spec is not a positive int ≤ total or a float in (0, 1].
    """
    if isinstance(spec, bool) or not isinstance(spec, int | float):
        raise ValueError(f"{name}={spec!r}: expected an int count or a float fraction")
    if isinstance(spec, float):
        if not (math.isfinite(spec) and 0.0 < spec <= 1.0):
            raise ValueError(
                f"{name}={spec}: a float is a fraction and must lie in (0, 1]; "
                f"give an int for an absolute count (1..{total})"
            )
        return max(1, math.floor(spec * total + 1e-9))
    if not 1 <= spec <= total:
        raise ValueError(f"{name}={spec}: an absolute count must lie in 1..{total}")
    return int(spec)


def reciprocal_steps(value: float) -> int | None:
    """Return 1/value when it is an integer (within :data:`RECIPROCAL_TOLERANCE`), else None.

    FedSM's amplification takes 1/η steps of size η: η = 0.1, 0.2, 0.25 are valid, 0.3 is not.
    """
    if not (math.isfinite(value) and value > 0):
        return None
    steps = round(1.0 / value)
    return steps if steps >= 1 and abs(steps * value - 1.0) <= RECIPROCAL_TOLERANCE else None
