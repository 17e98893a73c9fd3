"""A per-user budget across the run: what one user may claim on the elements selected.

For a monotone f_i with f_i(∅) = 0 the marginal gains a user reports on the elements that
end up selected telescope: Σ_t f_i(e_t | S_{t−1}) = f_i(S) ≤ max_S f_i(S). For the max-row
objectives (facility location, coverage) that is the largest value the user can hold (its
best rating; 1 for coverage), so an honest user never claims more than that in total over a
run, whichever rounds it took part in. :class:`ClaimBudget` keeps, per user, what its
reports claimed on each element at the round that element was selected, and clips a later
claim to what is left. Honest users are never clipped (up to ``slack`` for rounding); a
dishonest user spends its budget once.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ClaimBudget"]


class ClaimBudget:
    """Per-user ledger of the claims made on selected elements.

    Parameters
    ----------
    n_users : int
        Users n (ids 0..n−1).
    budget : float
        What one user may claim in total (> 0; e.g. λ, the objective's declared range).
    slack : float, optional
        Absolute tolerance for the rounding of honest reports (default 1e-9 · budget; the
        fixed-point reports of the discrete greedy need about one unit per round).
    """

    def __init__(self, n_users: int, budget: float, slack: float | None = None) -> None:
        if not (np.isfinite(budget) and budget > 0):
            raise ValueError(f"a claim budget must be positive and finite, got {budget!r}")
        if n_users < 0:
            raise ValueError(f"n_users={n_users} must be >= 0")
        self.budget = float(budget)
        self.slack = 1e-9 * self.budget if slack is None else float(slack)
        self.spent = np.zeros(int(n_users))

    def remaining(self, users: np.ndarray) -> np.ndarray:
        """Return what each of ``users`` may still claim (slack included)."""
        users = np.asarray(users, dtype=np.int64)
        return np.maximum(self.budget + self.slack - self.spent[users], 0.0)

    def clip(self, users: np.ndarray, claims: np.ndarray) -> tuple[np.ndarray, int]:
        """Clip each claim to its user's remaining budget.

        Parameters
        ----------
        users : numpy.ndarray
            The user of each claim (a user may appear on several entries: each one is a
            claim on a different element, and at most one of them is selected per round).
        claims : numpy.ndarray
            Non-negative claims, in the budget's units.

        Returns
        -------
        tuple
            ``(clipped claims, number of claims that were clipped)``.
        """
        claims = np.asarray(claims, dtype=np.float64)
        cap = self.remaining(users)
        over = claims > cap
        return np.where(over, cap, claims), int(over.sum())

    def charge(self, users: np.ndarray, claims: np.ndarray) -> None:
        """Book the claims the users made on the element just selected.

        Parameters
        ----------
        users : numpy.ndarray
            Users with a claim on that element (distinct).
        claims : numpy.ndarray
            Their (already clipped) claims, in the budget's units.
        """
        users = np.asarray(users, dtype=np.int64)
        claims = np.asarray(claims, dtype=np.float64)
        if users.shape != claims.shape:
            raise ValueError("one claim per user is needed")
        np.add.at(self.spent, users, claims)

    def exhausted(self) -> int:
        """Return how many users have no budget left."""
        return int((self.spent >= self.budget).sum())
