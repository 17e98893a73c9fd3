"""Bounds on a node's sum of reports that the server checks without seeing one user.

In cohort mode a node replies with the sum over its users, and under secure aggregation the
server sees only the total over all nodes. Per-user checks (:mod:`.reports`) are then the
nodes' job; what the server can still check on a sum is that it is *some* sum of honest
users' reports:

* FedSM: on each element e, at most λ for every one of the node's sampled users whose draw
  holds e (:func:`~flower_app.algorithms.fedsm.sampling.draw_counts`: the server recomputes
  the draws from the seed); nothing on an element no such user drew;
* discrete greedy: on each element e, at most ``participants · B_e`` with
  ``B_e = max(λ, O_e / κ)`` (:func:`discrete_element_bounds`), since an honest user's
  scaled report Δ_i[e] = f_i(e | S)/κ_i is at most λ when κ_i = 1 and at most
  r_ie / (κ r_ie / O_e) = O_e/κ otherwise (κ_i = κ·w_i with w_i ≥ r_ie / O_e);
* the histogram of Algs. 4/5: at most λ per user and element.

A dishonest node is thereby held to what its users could honestly send in that round; no
budget across rounds can be kept for it (the server cannot tell which of its users claimed
what), so its users count as dishonest users without a budget.
"""

from __future__ import annotations

import numpy as np

__all__ = ["discrete_element_bounds", "node_reason"]


def discrete_element_bounds(histogram: np.ndarray, lam: float, kappa: float) -> np.ndarray:
    """Return B_e = max(λ, O_e/κ): the most one honest discrete-greedy user reports on e.

    Parameters
    ----------
    histogram : numpy.ndarray
        O = Σ_i O_i, the histogram broadcast after Algs. 4/5 (sum form).
    lam : float
        λ, the declared range of one user's value.
    kappa : float
        κ of the run.

    Returns
    -------
    numpy.ndarray
        float64 bounds, one per element, in the reports' real units (not fixed point).
    """
    o = np.asarray(histogram, dtype=np.float64)
    return np.maximum(float(lam), o / float(kappa))


def node_reason(values: np.ndarray, cap: np.ndarray) -> str | None:
    """Return why a node's summed report cannot be a sum of honest reports, or None.

    Parameters
    ----------
    values : numpy.ndarray
        The node's dense report (length m).
    cap : numpy.ndarray
        The most its users can honestly send on each element (0 where none of them may
        report).

    Returns
    -------
    str or None
        ``"range"`` (a value that is not finite, negative or above its cap), ``"draw"`` (a
        non-zero value where the cap is 0), or None.
    """
    values = np.asarray(values, dtype=np.float64)
    cap = np.asarray(cap, dtype=np.float64)
    if values.shape != cap.shape:
        return "malformed"
    if not np.all(np.isfinite(values)) or (values < 0).any():
        return "range"
    if ((cap <= 0) & (values > 0)).any():
        return "draw"
    if (values > cap).any():
        return "range"
    return None
