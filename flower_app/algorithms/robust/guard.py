"""One run's per-user checks: refuse what no honest user sends, clip claims past the budget.

:class:`UserGuard` is what a party that sees single users' reports keeps for a run: a node
for its users before it sums and masks them, or the server for replies that are one user's
report in the clear (plain mode without secure aggregation). Each round it checks every
report (:func:`~.reports.refusal_reason`: range, own draw), clips each claim to its user's
remaining budget (:class:`~.budget.ClaimBudget`), and once the server has chosen the
round's element, books what every user claimed on it (:meth:`UserGuard.settle`).
"""

from __future__ import annotations

import numpy as np

from flower_app.algorithms.robust.budget import ClaimBudget
from flower_app.algorithms.robust.reports import ReportTally, refusal_reason

__all__ = ["UserGuard"]


class UserGuard:
    """Per-user range and draw checks and the claim budget across one run.

    Parameters
    ----------
    n_users : int
        Users n (ids 0..n−1).
    bound : float
        The declared range: the largest value one user may report on one element.
    budget : float, optional
        What one user may claim in total on the elements selected (default ``bound``).
    slack : float, optional
        Rounding tolerance of the budget (see :class:`~.budget.ClaimBudget`).
    """

    def __init__(
        self, n_users: int, bound: float, budget: float | None = None, slack: float | None = None
    ) -> None:
        if not (np.isfinite(bound) and bound > 0):
            raise ValueError(f"a report bound must be positive and finite, got {bound!r}")
        self.bound = float(bound)
        self.budget = ClaimBudget(n_users, self.bound if budget is None else budget, slack)
        self.tally = ReportTally()
        self._claims: list[tuple[int, np.ndarray, np.ndarray]] = []

    def check(
        self,
        user: int,
        ids: np.ndarray,
        values: np.ndarray,
        allowed: np.ndarray | None = None,
        bound: float | np.ndarray | None = None,
    ) -> np.ndarray | None:
        """Check one user's report; return its values as accepted (clipped) or None.

        Parameters
        ----------
        user : int
            The user's global id.
        ids : numpy.ndarray
            Elements of the report's entries.
        values : numpy.ndarray
            Its claims, in the budget's units.
        allowed : numpy.ndarray, optional
            Sorted elements the user may report on (its draw); None: any.
        bound : float or numpy.ndarray, optional
            A bound for this report instead of the guard's (e.g. per element).

        Returns
        -------
        numpy.ndarray or None
            The values to add (each at most the user's remaining budget), or None when the
            report is refused whole (counted by reason in :attr:`tally`).
        """
        ids = np.asarray(ids, dtype=np.int64)
        reason = refusal_reason(ids, values, self.bound if bound is None else bound, allowed)
        if reason is not None:
            self.tally.refuse(reason)
            return None
        clipped, n_clip = self.budget.clip(np.full(ids.size, int(user)), values)
        self.tally.clip(n_clip)
        self._claims.append((int(user), ids, clipped))
        return clipped

    def settle(self, element: int) -> dict[str, int]:
        """Book the round's claims on the element selected; return and reset the tally.

        Returns
        -------
        dict
            The round's row entries (:meth:`~.reports.ReportTally.row`).
        """
        for user, ids, values in self._claims:
            hit = values[ids == int(element)]
            if hit.size:
                self.budget.charge(np.array([user]), hit[:1])
        self._claims = []
        row = self.tally.row()
        self.tally = ReportTally()
        return row
