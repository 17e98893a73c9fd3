"""Profiles committed at setup: every later report is computed from them.

A node that holds its users' data (cohort mode) computes each report itself, from the
profile the user had when the run started, so a dishonest user can only choose that
profile: its reports stay consistent with S across rounds (a claim on an element that is
then selected uses up what the profile holds, whether or not the user was sampled in that
round) and within the declared range. :func:`commit_profiles` clips the profile values to
the declared range once, at setup, and counts what it clipped; honest data (values within
the range) comes back as the very same object.
"""

from __future__ import annotations

import numpy as np

from flower_app.submodular.objectives import MaxRowObjective

__all__ = ["commit_profiles", "declared_bound"]


def declared_bound(setting: float, instance_lam: float) -> float:
    """Return the report bound in force: the ``report-bound`` setting, or λ when it is 0.

    Parameters
    ----------
    setting : float
        The run_config value (0: not set).
    instance_lam : float
        λ = max_{e,i} f_i({e}) of the instance (its top rating; 1 for coverage).

    Returns
    -------
    float
        A positive bound (λ if both are 0, which only an empty instance has: then 1).
    """
    if setting and setting > 0:
        return float(setting)
    return float(instance_lam) if instance_lam > 0 else 1.0


def commit_profiles(objective: MaxRowObjective, bound: float) -> tuple[MaxRowObjective, int]:
    """Return the users' profiles clipped to [0, bound], and how many values were clipped.

    Parameters
    ----------
    objective : MaxRowObjective
        The users' rows as held by the node.
    bound : float
        The declared range (``report-bound``).

    Returns
    -------
    tuple
        ``(objective, clipped)``: ``objective`` itself when nothing exceeds the bound, else a
        copy of the same class with the values clipped.
    """
    data = objective.values.data
    over = data > bound
    if not over.any():
        return objective, 0
    values = objective.values.copy()
    values.data = np.minimum(values.data, bound)
    clone = object.__new__(type(objective))
    MaxRowObjective.__init__(clone, values, name=objective.name)
    return clone, int(over.sum())
