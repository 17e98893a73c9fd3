"""The history clamp: a round's estimated gain held to a bound from its estimates so far.

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
(round 1 is never changed). The choice is then the argmax of the clamped estimates. That is
the ``"mean"`` clamp; the default adds a margin for honest noise (below).

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

The noise-aware bound (the default, ``fedsm-history-clamp = "noise-aware"``). Holding every
estimate to the plain mean also clips honest sampling noise: an element's estimate lies
above the mean of its own estimates in about half of the rounds, so the plain clamp changes
which elements honest runs choose (on MovieLens-1M at K = d = 10 % it raised the clean runs'
ratio to greedy by 0.4 % at k = 10 and 0.9 % at k = 30, by damping the winner's curse of the
argmax over noisy estimates). The default bound therefore leaves room for that noise:

    min(F̂_t(e | S), mean_t(e) + c · se_t(e)),

mean_t(e) and se_t(e) the mean of the element's estimates over rounds 1..t (this round's
included) and its standard error (the sample standard deviation over √t), c =
:data:`NOISE_AWARE_MARGIN`. An honest estimate is an unbiased sample of a gain that only
shrinks, so it passes c standard errors above its own history's mean rarely; a spike that a
few sampled dishonest users make (each of their reports counting m/(dK) times) stands out of
a history of small estimates, and is held down. c = 0 is the plain mean clamp
(``fedsm-history-clamp = "mean"``: tighter, and a larger change to honest runs). How c was
chosen, and what each value did: ``docs/strategies/fedsm.md`` ("Dishonest users and nodes").

Both bounds deviate from the paper (its Eq. (3) estimate is used as it is): they change
which elements some honest runs choose, so the recorded reproductions of Algorithm 1 set
``fedsm-history-clamp = "off"`` (the paper's algorithm) explicitly.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CLAMPS", "NOISE_AWARE_MARGIN", "GainHistory", "clamp_margin"]

#: the bound above the mean, in standard errors of the mean, of the default clamp
NOISE_AWARE_MARGIN = 3.0
#: the history clamps by name: the margin c of each (None: no clamp, the paper's estimate)
CLAMPS: dict[str, float | None] = {"off": None, "noise-aware": NOISE_AWARE_MARGIN, "mean": 0.0}


def clamp_margin(clamp: str | bool) -> float | None:
    """Return the margin c of a history clamp given by name (None: off).

    Parameters
    ----------
    clamp : str or bool
        ``"off"``, ``"noise-aware"`` or ``"mean"`` (:data:`CLAMPS`); a bool is read as
        written before the clamp had names (True: the plain mean clamp, False: off).

    Returns
    -------
    float or None
        c ≥ 0, or None for no clamp.

    Raises
    ------
    ValueError
        On any other value.
    """
    if isinstance(clamp, bool):
        return 0.0 if clamp else None
    if clamp not in CLAMPS:
        raise ValueError(f"history clamp {clamp!r}: choose one of {', '.join(CLAMPS)}")
    return CLAMPS[clamp]


class GainHistory:
    """Per-element sums of a run's estimated marginal gains, and the clamp they give.

    Parameters
    ----------
    n_elements : int
        Ground-set size m.
    margin : float, optional
        c ≥ 0: estimates are held to the mean of the element's estimates so far plus c
        standard errors of that mean (default 0: the plain mean).
    """

    #: c; a class default, so that a checkpoint written before the noise-aware bound (which
    #: holds neither ``margin`` nor ``squares``) restores the plain mean clamp it was
    margin: float = 0.0

    def __init__(self, n_elements: int, margin: float = 0.0) -> None:
        if isinstance(n_elements, bool) or not isinstance(n_elements, int) or n_elements < 1:
            raise ValueError(f"n_elements={n_elements!r} must be a positive int")
        if not (np.isfinite(margin) and margin >= 0):
            raise ValueError(f"margin={margin!r} must be finite and >= 0")
        self.total = np.zeros(n_elements)
        self.squares = np.zeros(n_elements)
        self.margin = float(margin)
        self.rounds = 0

    def bound(self) -> np.ndarray:
        """Return mean + c · (standard error of the mean) of each element's estimates so far.

        The sample variance over the rounds 1..t (t − 1 in the denominator; 0 while t = 1)
        over t gives the squared standard error; with c = 0 the bound is the mean itself.
        """
        mean = self.total / max(self.rounds, 1)
        if self.margin == 0.0 or self.rounds < 2:
            return mean
        t = self.rounds
        variance = np.maximum(self.squares - t * mean * mean, 0.0) / (t - 1)
        return mean + self.margin * np.sqrt(variance / t)

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
            ``(clamped, lowered)``: min(F̂_t, :meth:`bound`) per element (with c = 0: the
            mean of F̂_1..F̂_t), and how many candidates' estimates it lowered.
        """
        estimate = np.asarray(estimate, dtype=np.float64)
        if estimate.shape != self.total.shape or not np.all(np.isfinite(estimate)):
            raise ValueError(f"estimates must be a finite vector of length {self.total.size}")
        self.total += estimate
        if self.margin:  # the sums of squares only feed the noise-aware bound
            self.squares += estimate * estimate
        self.rounds += 1
        bound = self.bound()
        lowered = estimate > bound
        if candidates is not None:
            lowered &= np.asarray(candidates, dtype=bool)
        return np.minimum(estimate, bound), int(lowered.sum())
