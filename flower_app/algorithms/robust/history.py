"""The history clamp: a round's estimated gain held to the mean of its estimates so far.

FedSM's Algorithm 1 estimates every marginal gain F(e | S) afresh each round from a small
sample (K users, d elements each: about 1 % of the (user, element) pairs at K = d = 10 %),
and adds the element of largest estimate. One sampled user's report counts m/(dK) times in
that estimate, so a few users who claim the top value λ on the same useless elements win a
late round whenever two or three of them happen to draw one of those elements together: a
spike of a heavy-tailed estimate, not a large gain.

Submodularity gives the server a check that needs nothing but the estimates it already has:
the gains only shrink as S grows, F(e | S_t) ≤ F(e | S_τ) for every earlier round τ ≤ t,
so each earlier round's estimate of e is an unbiased estimate of an *upper bound* on its
gain now, and their mean over the rounds 1..t is a far less noisy one. :class:`GainHistory`
keeps, per element, the sum of its estimates (scaled, in the units of F̂) and replaces the
round's estimate by

    min(F̂_t(e | S), (F̂_1(e) + … + F̂_t(e)) / t),

i.e. an estimate above the mean of the element's earlier estimates is pulled down to the mean
of all of them, this round's included; an estimate at or below that mean is left as it is
(round 1 is never changed). The choice is then the argmax of the clamped estimates.

What it holds against:

* **committed profiles** (the node computes every report from the profile fixed at setup):
  a dishonest user's claims then follow a submodular profile, so the coalition's estimate
  of a promoted element has a constant mean (its true gain for the committed profiles) until
  one is chosen, and the clamp holds it to that mean plus the noise of a t-round average;
  the spike that won a late round by luck is gone;
* **per-user checks without commitment**: a user who withholds its claims in early rounds
  to spike later lowers its own history mean; claiming in every round is its best, and then
  the same holds as with committed profiles;
* **secure aggregation**: the clamp uses only the round's total, all the server ever sees,
  so it holds the same;
* it does **not** bound a dishonest *node* that sends the largest sum its bound allows in
  every round: its claims are steady, not spikes (the node's sum is held to λ per user it
  was sent, see ``node_bounds``).

This is a deviation from the paper (its Eq. (3) estimate is used as it is), so it is
opt-in (run_config ``fedsm-history-clamp``): it changes which elements honest runs choose
(on MovieLens-1M at K = d = 10 % it raised the clean runs' ratio to greedy, by damping the
winner's curse of the argmax over noisy estimates), and with it the recorded reproductions.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GainHistory"]


class GainHistory:
    """Per-element sums of a run's estimated marginal gains, and the clamp they give.

    Parameters
    ----------
    n_elements : int
        Ground-set size m.
    """

    def __init__(self, n_elements: int) -> None:
        if isinstance(n_elements, bool) or not isinstance(n_elements, int) or n_elements < 1:
            raise ValueError(f"n_elements={n_elements!r} must be a positive int")
        self.total = np.zeros(n_elements)
        self.rounds = 0

    def clamp(
        self, estimate: np.ndarray, candidates: np.ndarray | None = None
    ) -> tuple[np.ndarray, int]:
        """Record this round's estimates; return them held to the mean over the rounds.

        Parameters
        ----------
        estimate : numpy.ndarray
            F̂_t(e | S) for every element (scaled to the units of F; finite).
        candidates : numpy.ndarray, optional
            bool mask of the elements that may still be chosen: only those are counted
            (default: every element).

        Returns
        -------
        tuple
            ``(clamped, lowered)``: min(F̂_t, mean of F̂_1..F̂_t) per element, and how many
            candidates' estimates it lowered.
        """
        estimate = np.asarray(estimate, dtype=np.float64)
        if estimate.shape != self.total.shape or not np.all(np.isfinite(estimate)):
            raise ValueError(f"estimates must be a finite vector of length {self.total.size}")
        self.total += estimate
        self.rounds += 1
        mean = self.total / self.rounds
        lowered = estimate > mean
        if candidates is not None:
            lowered &= np.asarray(candidates, dtype=bool)
        return np.minimum(estimate, mean), int(lowered.sum())
