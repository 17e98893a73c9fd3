"""Submodular problem instances: dataset name -> objective, element groups and matroid.

Loading is cached per process (one load per Ray actor, server and direct engine), keyed on
everything that defines the instance, so thousands of virtual clients share one copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from flower_app.clients.cohorts import cohort_range
from flower_app.config import AppConfig, ConfigError
from flower_app.settings.rules import Instance, raise_size_problems
from flower_app.submodular.matroids import Matroid, PartitionMatroid, UniformMatroid
from flower_app.submodular.objectives import FacilityLocation, MaxCoverage, MaxRowObjective

__all__ = [
    "SubmodularProblem", "build_matroid", "cohort_objective", "config_matroid", "load_problem",
]

#: default sizes of the embedded synthetic facility-location instance
SYNTHETIC_FL_SIZE = (2000, 500)


@dataclass(frozen=True)
class SubmodularProblem:
    """A decomposable submodular instance: one sparse row per user (= client).

    Attributes
    ----------
    name : str
        Dataset name (``synthetic-*`` for stand-ins).
    objective : MaxRowObjective
        F(S) = (1/n) Σ_i f_i(S).
    element_groups : numpy.ndarray
        One label per element (genre, venue type) for partition matroids.
    item_labels, item_names : tuple of str or None
        Your own data's item labels (and names), in element order; None for built-ins.
    """

    name: str
    objective: MaxRowObjective
    element_groups: np.ndarray
    item_labels: tuple[str, ...] | None = None
    item_names: tuple[str, ...] | None = None

    @property
    def n_users(self) -> int:
        """Number of users n."""
        return self.objective.n_users

    @property
    def n_elements(self) -> int:
        """Ground-set size m."""
        return self.objective.n_elements


@lru_cache(maxsize=4)
def _load(
    dataset: str,
    data_dir: str,
    data_seed: int,
    num_users: int,
    num_elements: int,
    own: tuple[str, str, str] = ("", "", ""),
) -> SubmodularProblem:
    if dataset in ("facility-location-table", "coverage-sets"):
        from flower_app.datasets.own import OwnDataError, load_coverage_sets, load_facility_table

        data_file, columns, names = own
        try:
            if dataset == "facility-location-table":
                inst = load_facility_table(data_file, columns, names)
                objective: MaxRowObjective = FacilityLocation(inst.values, inst.name)
            else:
                if columns == "user,item,value":
                    columns = "user,item"
                inst = load_coverage_sets(data_file, columns, names)
                objective = MaxCoverage(inst.values, inst.name)
        except OwnDataError as err:
            raise ConfigError(str(err)) from None
        groups = np.zeros(inst.values.shape[1], dtype=np.int64)  # one block: see own.py
        return SubmodularProblem(inst.name, objective, groups, inst.items, inst.item_names)
    if dataset == "synthetic-facility-location":
        from flower_app.datasets.synthetic import synthetic_facility_location

        n = num_users or SYNTHETIC_FL_SIZE[0]
        m = num_elements or SYNTHETIC_FL_SIZE[1]
        rm = synthetic_facility_location(n, m, seed=data_seed)
        return SubmodularProblem(rm.name, FacilityLocation(rm.values, rm.name), rm.element_groups)
    if dataset == "movielens":
        from flower_app.datasets.movielens import facility_location_matrix, load_movielens_1m

        rm = facility_location_matrix(load_movielens_1m(data_dir or None))
        return SubmodularProblem(rm.name, FacilityLocation(rm.values, rm.name), rm.element_groups)
    if dataset == "dblp":
        from flower_app.datasets.dblp import load_dblp_venue_sets

        vs = load_dblp_venue_sets(data_dir or None)
        return SubmodularProblem(vs.name, MaxCoverage(vs.matrix, vs.name), vs.element_groups)
    if dataset == "synthetic-dblp":
        from flower_app.datasets.synthetic import synthetic_dblp

        kwargs = {"seed": data_seed}
        if num_users:
            kwargs["n_researchers"] = num_users
        if num_elements:
            kwargs["n_venues"] = num_elements
        vs = synthetic_dblp(**kwargs)
        return SubmodularProblem(vs.name, MaxCoverage(vs.matrix, vs.name), vs.element_groups)
    raise ConfigError(f"unknown dataset {dataset!r}")


def load_problem(cfg: AppConfig) -> SubmodularProblem:
    """Load (or reuse) the instance the configuration names.

    Parameters
    ----------
    cfg : AppConfig
        Uses ``dataset``, ``data_dir``, ``data_seed``, ``num_users``, ``num_elements``.

    Returns
    -------
    SubmodularProblem
        The cached instance.
    """
    return _load(
        cfg.dataset, cfg.data_dir, cfg.data_seed, cfg.num_users, cfg.num_elements,
        (cfg.data_file, cfg.data_columns, cfg.item_names),
    )  # fmt: skip


def build_matroid(cfg: AppConfig, problem: SubmodularProblem) -> Matroid:
    """Build the constraint of the configuration over the instance's element groups.

    See :func:`config_matroid` (``problem`` supplies its name, m and the groups).
    """
    return config_matroid(cfg, problem.name, problem.n_elements, problem.element_groups)


def config_matroid(
    cfg: AppConfig, name: str, n_elements: int, groups: np.ndarray | None = None
) -> Matroid:
    """Build the constraint of the configuration and check that k fits its rank.

    Parameters
    ----------
    cfg : AppConfig
        Uses ``matroid``, ``k`` and ``partition_capacity``.
    name : str
        The instance, as the message names it.
    n_elements : int
        m.
    groups : numpy.ndarray, optional
        One label per element (a partition matroid's blocks).

    Returns
    -------
    Matroid
        A uniform matroid of rank k, or a partition matroid over the element groups.

    Raises
    ------
    ConfigError
        If k exceeds the rank or the ground set (the ``k`` rule of
        :data:`flower_app.settings.rules.SIZE_RULES`, as ``flower-app run`` says it).
    """
    if cfg.matroid == "uniform":
        matroid: Matroid = UniformMatroid(n_elements, min(cfg.k, n_elements))
    else:
        matroid = PartitionMatroid.from_labels(groups, cfg.partition_capacity)
    caps = getattr(matroid, "capacities", None)
    raise_size_problems(cfg, Instance(name, elements=n_elements, rank=int(matroid.rank),
                                      groups=None if caps is None else len(caps)))  # fmt: skip
    return matroid


def cohort_objective(
    problem: SubmodularProblem, partition_id: int, num_partitions: int
) -> tuple[MaxRowObjective, int]:
    """Return the rows of one node's cohort as an objective, and its first global user.

    Parameters
    ----------
    problem : SubmodularProblem
        The whole instance.
    partition_id, num_partitions : int
        The node's place in the split (see :func:`~flower_app.clients.cohorts.cohort_range`).

    Returns
    -------
    tuple
        ``(objective over the cohort's rows, first user)``.
    """
    first, count = cohort_range(problem.n_users, partition_id, num_partitions)
    rows = problem.objective.values[first : first + count]
    return MaxRowObjective(rows, name=f"{problem.name}[{first}:{first + count}]"), first
