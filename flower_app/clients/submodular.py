"""SubmodularClient: a node's cohort of users answering FedSM's rounds (a NumPyClient).

The client holds the rows of its cohort only. Its three calls, in NumPyClient terms:

``get_properties(config)``
    ``{"partition-id", "num-partitions", "first-user", "num-users", "n-users-total",
    "n-elements", "max-singleton", "profile-values-clipped"}``: the server's discovery step
    maps users to nodes with it (``max-singleton``, the cohort's max f_i({e}), gives λ when
    the server holds no data; ``profile-values-clipped``: the users' values this node clipped
    to ``report-bound`` when it committed their profiles).
``fit(parameters=[selected, users, (pool, sequence), (x ids, x values)], config)``
    ``selected``: int64 S (T inside an amplification step); ``users``: int64 global ids of
    the cohort's sampled users; ``config``: ``server-round``, ``d``, ``seed`` and ``mode``
    (``"alg1"``, the default, or ``"alg2"``). Algorithm 2 adds ``pool`` (X) and ``sequence``
    (a_1..a_r'); amplification (``config["surrogate"]`` ``"exact"`` or ``"sampled"``, with
    ``eta`` and ``samples``) adds the non-zero coordinates of x. Returns the cohort's
    summed reports (length m, or |X|·r' for Algorithm 2), as ``[index int32, value float64]``
    (sparse) or ``[value float64]`` (dense), whichever is smaller; ``num_examples`` = number
    of sampled users; metrics ``user-values`` (= users × d) and ``positive-entries``.
``evaluate(parameters=[selected], config)``
    Returns ``(−mean f_i(S), num_users, {"objective-sum": Σ_i f_i(S)})`` over the cohort.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.client import NumPyClient

from flower_app.algorithms.fedsm.amplify import SURROGATES
from flower_app.algorithms.fedsm.core import ENTRY_BYTES
from flower_app.algorithms.fedsm.dp import dp_local_epsilon
from flower_app.algorithms.fedsm.modes import RoundPlan, cohort_report
from flower_app.algorithms.fedsm.sampling import check_scheme
from flower_app.algorithms.robust.profiles import commit_profiles, declared_bound
from flower_app.privacy.ledger import local_release
from flower_app.submodular.objectives import MaxRowObjective

__all__ = [
    "SubmodularClient",
    "element_ids",
    "encode_report",
    "plan_kind",
    "report_arrays",
    "round_plan",
]

Config = dict[str, Any]


def encode_report(
    total: np.ndarray, dense: bool = False, dtype: type = np.float64
) -> list[np.ndarray]:
    """Encode a report vector sparsely (ids, values) or densely, whichever is smaller.

    Parameters
    ----------
    total : numpy.ndarray
        Vector over E.
    dense : bool, optional
        Always dense (under secure aggregation, where only equal-length vectors can be
        summed and the ids would show which elements a user gained on).
    dtype : type, optional
        The values' dtype on the wire: ``numpy.float64`` (default) or ``numpy.int64`` (the
        discrete greedy's fixed-point reports); 8 bytes either way.

    Returns
    -------
    list of numpy.ndarray
        ``[index int32, value dtype]`` or ``[value dtype]``.
    """
    nz = np.flatnonzero(total)
    if not dense and nz.size * ENTRY_BYTES < total.size * 8:
        return [nz.astype(np.int32), total[nz].astype(dtype)]
    return [total.astype(dtype)]


def report_arrays(parts: list[np.ndarray]) -> ArrayRecord:
    """Return an :func:`encode_report` result as a reply's ``arrays`` (FedSM's, FedCG's).

    ``ids`` + ``values`` when it is sparse, ``values`` when it is dense.
    """
    keys = ("ids", "values") if len(parts) == 2 else ("values",)
    pairs = zip(keys, parts, strict=True)
    return ArrayRecord({k: Array(np.ascontiguousarray(a)) for k, a in pairs})


def element_ids(record: ArrayRecord, key: str, m: int, *, distinct: bool = False) -> np.ndarray:
    """Return a request's array ``key`` as int64 element ids, checked to lie in 0..m−1.

    With ``distinct`` an id given twice is refused too (FedSM's sets and sequences).

    Raises
    ------
    ValueError
        Naming the array: missing, not a 1-D integer array, an id out of range (or repeated).
    """
    if key not in record:
        raise ValueError(f"the message has no '{key}' array")
    ids = np.asarray(record[key].numpy())
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError(f"'{key}' must be a 1-D integer array")
    ids = ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= m):
        raise ValueError(f"'{key}' must hold element ids in 0..{m - 1}")
    if distinct and np.unique(ids).size != ids.size:
        raise ValueError(f"'{key}' must hold distinct element ids in 0..{m - 1}")
    return ids


class SubmodularClient(NumPyClient):
    """The users of one node, for FedSM (and other set-function algorithms).

    Parameters
    ----------
    objective : MaxRowObjective
        Objective over the cohort's rows only (row j = global user ``first_user + j``).
    first_user : int
        Global index of the cohort's first user.
    n_users_total : int
        Users in the whole dataset (reported for the server's consistency check).
    partition_id, num_partitions : int
        The node's place in the split.
    reproducible_noise : bool, optional
        The research mode ``dp-reproducible-noise`` (default False), from the node's own
        run_config (never from a message): the shuffle-DP randomiser keyed by
        (seed, round, user) instead of OS entropy; no privacy against the server.
    report_bound : float, optional
        The run's ``report-bound`` (0 or None: this node's own largest value, i.e. nothing
        to clip). The users' profiles are committed at construction: clipped to the bound
        once (:func:`~flower_app.algorithms.robust.profiles.commit_profiles`), every later
        report computed from them; the count is reported at discovery
        (``profile-values-clipped``).
    """

    def __init__(
        self,
        objective: MaxRowObjective,
        first_user: int,
        n_users_total: int,
        partition_id: int,
        num_partitions: int,
        reproducible_noise: bool = False,
        report_bound: float | None = None,
    ) -> None:
        bound = declared_bound(report_bound or 0.0, objective.max_singleton)
        self.objective, self.profile_values_clipped = commit_profiles(objective, bound)
        self.reproducible_noise = bool(reproducible_noise)
        self.first_user = int(first_user)
        self.n_users_total = int(n_users_total)
        self.partition_id = int(partition_id)
        self.num_partitions = int(num_partitions)

    @property
    def num_users(self) -> int:
        """Users in this cohort."""
        return self.objective.n_users

    def get_properties(self, config: Config) -> dict[str, Any]:
        """Describe the cohort (discovery)."""
        return {
            "partition-id": self.partition_id,
            "num-partitions": self.num_partitions,
            "first-user": self.first_user,
            "num-users": self.num_users,
            "n-users-total": self.n_users_total,
            "n-elements": self.objective.n_elements,
            "max-singleton": self.objective.max_singleton,
            "profile-values-clipped": self.profile_values_clipped,
        }

    def _selected(self, array: np.ndarray) -> np.ndarray:
        sel = np.asarray(array).astype(np.int64, copy=False).ravel()
        m = self.objective.n_elements
        if sel.size and (sel.min() < 0 or sel.max() >= m or np.unique(sel).size != sel.size):
            raise ValueError(f"selected set must hold distinct element ids in 0..{m - 1}")
        return sel

    def fit(self, parameters: list[np.ndarray], config: Config) -> tuple[list, int, dict]:
        """Report the summed values of the sampled users for one FedSM round.

        Algorithm 1 (lines 6-12), Algorithm 2 (lines 10-13), or either on the amplification
        surrogate; the math is :func:`~flower_app.algorithms.fedsm.modes.cohort_report`.

        Parameters
        ----------
        parameters : list of numpy.ndarray
            ``[selected, users]`` (+ ``[pool, sequence]`` for Algorithm 2, + ``[x ids,
            x values]`` for amplification), as described in the module docstring.
        config : dict
            ``server-round``, ``d``, ``seed``, ``mode`` and, for amplification,
            ``surrogate``, ``eta``, ``samples``.

        Returns
        -------
        tuple
            ``(encoded report, number of sampled users, metrics)``.
        """
        plan = self._plan(parameters, config)
        local = plan.users - self.first_user
        if local.size and (local.min() < 0 or local.max() >= self.num_users):
            raise ValueError(
                f"sampled users outside this node's cohort "
                f"[{self.first_user}, {self.first_user + self.num_users})"
            )
        total, hits = cohort_report(self.objective, local, plan.users, plan, int(config["seed"]),
                                    reproducible_noise=self.reproducible_noise)  # fmt: skip
        metrics: dict[str, Any] = {
            "user-values": int(plan.users.size * plan.d),
            "positive-entries": int(hits),
        }
        if plan.dp_bits:  # each user's local randomiser ε, charged to the node's ledger
            costs = dp_local_epsilon(plan, int(config["seed"]), plan.users)
            metrics.update(local_release(dict(zip(plan.users.tolist(), costs.tolist(),
                                                   strict=True))).metrics())  # fmt: skip
        dense = bool(config.get("secure-aggregation", 0))
        return encode_report(total, dense), int(plan.users.size), metrics

    def _plan(self, parameters: list[np.ndarray], config: Config) -> RoundPlan:
        """Parse and check a ``fit`` request into the round it describes."""
        mode, surrogate = plan_kind(config)
        expected = 2 + (2 if mode == "alg2" else 0) + (2 if surrogate != "none" else 0)
        if len(parameters) != expected:
            raise ValueError(
                f"fit in mode {mode} (surrogate {surrogate}) expects {expected} arrays, "
                f"got {len(parameters)}"
            )
        alg2, amplified = mode == "alg2", surrogate != "none"
        return round_plan(
            config,
            self.objective.n_elements,
            users=np.asarray(parameters[1]).astype(np.int64, copy=False).ravel(),
            selected=self._selected(parameters[0]),
            pool=self._selected(parameters[2]) if alg2 else None,
            sequence=self._selected(parameters[3]) if alg2 else None,
            x_ids=self._selected(parameters[-2]) if amplified else None,
            x_values=parameters[-1] if amplified else None,
        )

    def evaluate(self, parameters: list[np.ndarray], config: Config) -> tuple[float, int, dict]:
        """Return the cohort's objective Σ_i f_i(S) for S = ``parameters[0]``."""
        selected = self._selected(parameters[0])
        total = self.objective.value(selected)
        mean = total / max(self.num_users, 1)
        return -mean, self.num_users, {"objective-sum": float(total)}


def plan_kind(config: Config) -> tuple[str, str]:
    """Return a round request's ``(mode, surrogate)``, checked."""
    mode = str(config.get("mode", "alg1"))
    surrogate = str(config.get("surrogate", "none"))
    if mode not in ("alg1", "alg2"):
        raise ValueError(f"unknown mode {mode!r}: expected 'alg1' or 'alg2'")
    if surrogate not in ("none", *SURROGATES):
        raise ValueError(f"unknown surrogate {surrogate!r}")
    return mode, surrogate


def round_plan(
    config: Config,
    n_elements: int,
    *,
    users: np.ndarray,
    selected: np.ndarray,
    pool: np.ndarray | None = None,
    sequence: np.ndarray | None = None,
    x_ids: np.ndarray | None = None,
    x_values: np.ndarray | None = None,
) -> RoundPlan:
    """Build the round a FedSM request describes from its (already checked) id arrays.

    Shared by the cohort NumPyClient (positional arrays) and the plain-mode helper
    :func:`flower_app.clients.fedsm.fedsm_reply` (named arrays).

    Parameters
    ----------
    config : mapping
        The request's config (``server-round``, ``d``, ``mode``, ``surrogate``, ``rng``
        (absent: ``"per-user"``), ...).
    n_elements : int
        Ground-set size m.
    users, selected : numpy.ndarray
        The node's sampled users and S (int64).
    pool, sequence : numpy.ndarray, optional
        Algorithm 2's X and a_1..a_r' (int64).
    x_ids, x_values : numpy.ndarray, optional
        Amplification: the non-zero coordinates of x.

    Returns
    -------
    RoundPlan
        The round.

    Raises
    ------
    ValueError
        If x is not given as distinct ids with values in [0, 1].
    """
    mode, surrogate = plan_kind(config)
    empty = np.zeros(0, dtype=np.int64)
    point = None
    if surrogate != "none":
        values = np.asarray(x_values, dtype=np.float64).ravel()
        if (
            x_ids is None
            or values.shape != x_ids.shape
            or not np.all((values >= 0) & (values <= 1))
        ):
            raise ValueError("x must be given as distinct ids with values in [0, 1]")
        point = np.zeros(n_elements)
        point[x_ids] = values
    return RoundPlan(
        server_round=int(config["server-round"]),
        mode=mode,
        users=users,
        selected=selected,
        d=int(config["d"]),
        pool=empty if pool is None else pool,
        sequence=empty if sequence is None else sequence,
        point=point,
        eta=float(config.get("eta", 1.0)),
        surrogate=surrogate,
        samples=int(config.get("samples", 1)),
        n_elements=n_elements,
        j_from=int(config.get("j-from", 1)),
        rng=check_scheme(str(config.get("rng", "per-user"))),
        **_dp_fields(config, n_elements),
    )


def _dp_fields(config: Config, n_elements: int) -> dict[str, Any]:
    """Return the shuffle-DP fields of a round (``dp-bits``, ``dp-lam``, ``dp-flip``)."""
    bits = int(config.get("dp-bits", 0))
    if not bits:
        return {}
    flip = np.asarray(config.get("dp-flip", []), dtype=np.float64)
    lam = float(config.get("dp-lam", 0.0))
    if bits < 1 or flip.shape != (n_elements,) or not np.all((flip >= 0) & (flip <= 1)):
        raise ValueError(f"dp-flip must hold {n_elements} probabilities and dp-bits be >= 1")
    if not (np.isfinite(lam) and lam > 0):
        raise ValueError(f"dp-lam = {lam}: expected a bound > 0")
    return {"dp_bits": bits, "dp_flip": flip, "dp_lam": lam}
