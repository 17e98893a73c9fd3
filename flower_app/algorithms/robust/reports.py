"""Checks on one user's report that cost an honest user nothing, and their tally.

What a server (on a reply that is one user's report, in the clear) or a node (on each of
its users before it sums and masks) can check without any private data:

* **range**: every value lies in [0, bound], the bound being the largest value an honest
  user can report (the objective's declared range: the top rating for facility location,
  1 for coverage; for the discrete greedy's scaled reports, that bound divided by the
  user's participation probability);
* **draw**: a FedSM user reports only on the elements of its own draw D_i, which anyone can
  recompute from ``(seed, round, user)``;
* **coin**: a discrete-greedy user reports only when its participation coin, recomputable
  from ``(seed, round, user)``, came up for its committed probability.

A report that fails one of them is refused whole (it cannot be honest); a claim past the
user's budget across the run (:class:`~.budget.ClaimBudget`) is clipped. :class:`ReportTally`
counts both, per reason, for the round's row of ``metrics.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flower_app.algorithms.common.streams import first_uniforms

__all__ = ["REASONS", "ReportTally", "coin_refusals", "merge_tally", "refusal_reason"]

#: why a report is refused, in the order the checks run
REASONS = ("malformed", "range", "draw", "coin", "overflow")


@dataclass
class ReportTally:
    """What one round's checks refused and clipped.

    Attributes
    ----------
    refused : dict
        Reports refused whole, per reason (:data:`REASONS`).
    clipped_values : int
        Values clipped to their user's remaining budget.
    clipped_reports : int
        Reports with at least one clipped value.
    """

    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    clipped_values: int = 0
    clipped_reports: int = 0

    def refuse(self, reason: str, count: int = 1) -> None:
        """Count ``count`` reports refused for ``reason``."""
        if reason not in self.refused:
            raise ValueError(f"unknown refusal reason {reason!r}: one of {', '.join(REASONS)}")
        self.refused[reason] += int(count)

    def clip(self, values: int) -> None:
        """Count one report of which ``values`` values were clipped (0: nothing)."""
        if values:
            self.clipped_values += int(values)
            self.clipped_reports += 1

    @property
    def refused_total(self) -> int:
        """Reports refused, all reasons."""
        return sum(self.refused.values())

    def row(self) -> dict[str, int]:
        """Return the round row's entries.

        ``reports-refused`` (all reasons), ``refused-<reason>`` for each reason,
        ``reports-clipped`` and ``values-clipped``.
        """
        out = {"reports-refused": self.refused_total}
        out.update({f"refused-{reason}": n for reason, n in self.refused.items()})
        out["reports-clipped"] = self.clipped_reports
        out["values-clipped"] = self.clipped_values
        return out


def merge_tally(row: dict[str, Any], tally: ReportTally) -> dict[str, int]:
    """Return the round row's tally entries: ``tally``'s added to those ``row`` has.

    ``row`` may already count what the server step clipped; the sum goes into the round's
    row of ``metrics.jsonl``.
    """
    return {key: int(row.get(key, 0)) + value for key, value in tally.row().items()}


def refusal_reason(
    ids: np.ndarray,
    values: np.ndarray,
    bound: float | np.ndarray,
    allowed: np.ndarray | None = None,
) -> str | None:
    """Return why one user's sparse report cannot be honest, or None if it passes.

    Parameters
    ----------
    ids : numpy.ndarray
        Element (or pair) ids of the report's entries.
    values : numpy.ndarray
        The values, one per id.
    bound : float or numpy.ndarray
        Largest value an honest user can report: one number, or one per id.
    allowed : numpy.ndarray, optional
        Sorted ids the user may report on (its draw D_i); None: any id.

    Returns
    -------
    str or None
        ``"malformed"`` (shapes, repeated ids), ``"range"`` (a value that is not finite,
        negative, or above ``bound``), ``"draw"`` (an id outside ``allowed`` with a non-zero
        value), or None.
    """
    ids = np.asarray(ids)
    values = np.asarray(values, dtype=np.float64)
    if ids.ndim != 1 or values.shape != ids.shape or np.unique(ids).size != ids.size:
        return "malformed"
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), values.shape)
    if not np.all(np.isfinite(values)) or (values < 0).any() or (values > bound).any():
        return "range"
    if allowed is not None:
        nonzero = ids[values != 0]
        pos = np.searchsorted(allowed, nonzero)
        inside = (pos < allowed.size) & (allowed[np.minimum(pos, allowed.size - 1)] == nonzero)
        if not inside.all():
            return "draw"
    return None


def coin_refusals(
    seed: int, server_round: int, users: np.ndarray, kappa_i: np.ndarray
) -> np.ndarray:
    """Return which of these discrete-greedy reporters had no participation coin this round.

    User i takes part in round t iff the first uniform of ``default_rng([seed, t, i])`` is
    below its probability κ_i (as
    :func:`~flower_app.algorithms.fedcg.discrete_greedy.discrete_report_sum` draws it), so
    whoever knows κ_i (committed at setup) can recompute the coin.

    Parameters
    ----------
    seed, server_round : int
        Key the coins.
    users : numpy.ndarray
        Global ids of the users who sent a report this round.
    kappa_i : numpy.ndarray
        Their committed participation probabilities.

    Returns
    -------
    numpy.ndarray
        bool mask: True for a report whose coin did not come up (refuse it: ``"coin"``).
    """
    users = np.asarray(users, dtype=np.int64)
    kappa_i = np.asarray(kappa_i, dtype=np.float64)
    if users.shape != kappa_i.shape:
        raise ValueError("one committed κ_i per user is needed")
    out = kappa_i <= 0
    flip = np.flatnonzero((kappa_i > 0) & (kappa_i < 1))
    if flip.size:
        out[flip] = first_uniforms(seed, server_round, users[flip]) >= kappa_i[flip]
    return out
