"""FedSM on the client side of *your* Flower app: one node = one user with its own utility.

A ClientApp that serves :class:`~flower_app.strategies.fedsm.FedSMStrategy` (plain mode, the
default) needs two lines per handler::

    from flwr.clientapp import ClientApp
    from flower_app.clients.fedcg import ScoreTable
    from flower_app.clients.fedsm import fedsm_evaluate, fedsm_reply

    app = ClientApp()

    @app.train()
    def train(msg, context):
        return fedsm_reply(msg, context, ScoreTable(my_scores, n_elements=M))

    @app.evaluate()  # only with FedSMStrategy(federated_evaluation=True)
    def evaluate(msg, context):
        return fedsm_evaluate(msg, context, ScoreTable(my_scores, n_elements=M))

The utility f_i is the same object the FedCG helpers take (``flower_app.clients.fedcg``):

* ``ScoreTable(scores, n_elements)`` — item → score data, facility location
  f_i(S) = max_{j ∈ S} score_j (also given directly as ``{item: score}`` or a dense vector);
* ``Coverage(items, n_elements)`` — f_i(S) = 1 if S contains one of the user's items;
* ``SetFunction(n_elements, gains)`` — any monotone submodular f_i, by a vectorised callable
  ``gains(S) -> f_i(S ∪ {e}) − f_i(S) for every e`` (also given directly as a callable, with
  ``n_elements``);
* :class:`~flower_app.algorithms.fedsm.user.GainsUtility` — the same, asked only for the
  elements FedSM samples: ``gains_fn(S, candidates)`` (for a large ground set).

Score tables and coverage take the fast sparse paths (every FedSM mode, amplification
included); gains callables run Algorithms 1 and 2. The helper handles the message contract
(the table in :class:`~flower_app.strategies.fedsm.FedSMStrategy`): the setup exchange
(m, λ_i, optional element groups), the rounds (the user draws its d elements from its own
stream ``default_rng([seed, t, user])`` exactly as a cohort's user does, so plain and cohort
mode give the same S for the same seed when one node holds one user), and the evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from flower_app.algorithms.fedsm.dp import dp_local_epsilon
from flower_app.algorithms.fedsm.modes import RoundPlan
from flower_app.algorithms.fedsm.user import (
    GainsUtility,
    UserUtility,
    user_max_singleton,
    user_report,
    user_value,
)
from flower_app.clients.fedcg import ScoreTable, SetFunction
from flower_app.clients.submodular import (
    element_ids,
    encode_report,
    plan_kind,
    report_arrays,
    round_plan,
)
from flower_app.privacy.ledger import local_release
from flower_app.submodular.objectives import MaxRowObjective

__all__ = ["as_utility", "fedsm_evaluate", "fedsm_reply"]

#: what :func:`fedsm_reply` takes as the user's utility
UtilityLike = Any


def as_utility(utility: UtilityLike, n_elements: int | None = None) -> UserUtility:
    """Return what the FedSM maths needs of the user's utility (see the module docstring).

    Parameters
    ----------
    utility : object
        ``ScoreTable`` / ``Coverage`` (or any object with a one-row max-row objective as
        ``rows``), a one-row ``MaxRowObjective``, ``SetFunction`` (or any object with
        ``n_elements`` and ``gains(S)``), a :class:`GainsUtility`, ``{item: score}`` or a
        dense score vector, or a ``gains(S)`` callable.
    n_elements : int, optional
        m, needed with a mapping or a callable.

    Returns
    -------
    MaxRowObjective or GainsUtility
        A one-row objective (fast path) or a gains evaluator.

    Raises
    ------
    TypeError
        If ``utility`` is none of these.
    """
    if isinstance(utility, MaxRowObjective | GainsUtility):
        return utility
    if isinstance(utility, Mapping | np.ndarray):
        utility = ScoreTable(utility, n_elements)
    elif callable(utility) and not hasattr(utility, "gains"):
        if n_elements is None:
            raise ValueError("a gains callable needs n_elements (the ground-set size m)")
        utility = SetFunction(int(n_elements), utility)
    rows = getattr(utility, "rows", None)
    if isinstance(rows, MaxRowObjective):
        return rows
    if hasattr(utility, "gains") and hasattr(utility, "n_elements"):
        whole = utility.gains

        def gains(selected: np.ndarray, candidates: np.ndarray) -> np.ndarray:
            out = np.asarray(whole(selected), dtype=np.float64)[candidates]
            return np.where(np.isin(candidates, selected), 0.0, out)  # entries on S: unused

        return GainsUtility(gains, int(utility.n_elements))
    raise TypeError(f"cannot use a {type(utility).__name__} as a FedSM utility")


def _ids(record: ArrayRecord, key: str, m: int) -> np.ndarray:
    return element_ids(record, key, m, distinct=True)


def _plan(record: ArrayRecord, config: Mapping[str, Any], m: int) -> RoundPlan:
    """Parse a plain-mode round request into the round it describes (checked)."""
    mode, surrogate = plan_kind(config)
    alg2, amplified = mode == "alg2", surrogate != "none"
    return round_plan(
        config,
        m,
        users=np.zeros(0, dtype=np.int64),
        selected=_ids(record, "selected", m),
        pool=_ids(record, "pool", m) if alg2 else None,
        sequence=_ids(record, "sequence", m) if alg2 else None,
        x_ids=_ids(record, "x-ids", m) if amplified else None,
        x_values=record["x-values"].numpy() if amplified else None,
    )


def fedsm_reply(
    msg: Message,
    context: Context,
    utility: UtilityLike,
    groups: Sequence[int] | None = None,
    n_elements: int | None = None,
) -> Message:
    """Answer a FedSM ``train`` message (setup or round) for this node's user.

    Parameters
    ----------
    msg : Message
        The ``train`` message of :class:`~flower_app.strategies.fedsm.FedSMStrategy` (plain
        mode): ``config["stage"]`` is ``"setup"`` or ``"round"``.
    context : Context
        The node's context: its node_config's ``partition-id`` (if any) is sent at setup,
        so the server numbers the users by it (the user id then comes with every round).
    utility : utility, mapping, numpy.ndarray or callable
        The user's f_i: ``ScoreTable``, ``Coverage``, ``SetFunction`` (of
        ``flower_app.clients.fedcg``), a :class:`GainsUtility`, or directly ``{item:
        score}``, a dense score vector, or a ``gains(S)`` callable (see :func:`as_utility`).
    groups : sequence of int, optional
        Group of every element, for a partition matroid (``FedSMStrategy(capacities=...)``);
        sent at setup.
    n_elements : int, optional
        m, when ``utility`` is a mapping or a callable.

    Returns
    -------
    Message
        Setup: ``metrics`` ``num-elements``, ``max-singleton``, ``objective``,
        ``num-examples`` (and ``partition-id``, ``arrays`` ``element-groups``). Round: the
        report, sparse (``ids`` int32, ``values`` float64) or dense (``values``), whichever
        is smaller (always dense if the config has ``secure-aggregation``),
        and ``metrics`` ``num-examples`` = 1, ``num-elements``, ``user-values``,
        ``positive-entries``.

    Raises
    ------
    ValueError
        On a malformed request (the strategy counts the error reply and leaves it out).
    """
    config = dict(msg.content.config_records["config"])
    record = msg.content.array_records.get("arrays", ArrayRecord())
    utility = as_utility(utility, n_elements)
    m = int(utility.n_elements)
    stage = str(config.get("stage", "round"))
    if stage == "setup":
        selected = _ids(record, "selected", m) if "selected" in record else np.zeros(0, int)
        arrays: dict[str, Array] = {}
        if groups is not None:
            g = np.asarray(list(groups), dtype=np.int64)
            if g.shape != (m,):
                raise ValueError(f"groups has {g.size} entries; the ground set has {m}")
            arrays["element-groups"] = Array(g)
        metrics = {
            "num-examples": 1,
            "num-elements": m,
            "max-singleton": float(user_max_singleton(utility)),
            "objective": float(user_value(utility, selected)),
        }
        pid = context.node_config.get("partition-id")
        if isinstance(pid, int) and not isinstance(pid, bool):
            metrics["partition-id"] = int(pid)  # orders the users (reproducible runs)
        content = RecordDict({"arrays": ArrayRecord(arrays), "metrics": MetricRecord(metrics)})
        return Message(content, reply_to=msg)
    if stage != "round":
        raise ValueError(f"unknown FedSM stage {stage!r}: expected 'setup' or 'round'")
    plan = _plan(record, config, m)
    # the node's own run_config, never the server's message, may ask for reproducible noise
    reproducible = bool(context.run_config.get("dp-reproducible-noise", False))
    report, hits = user_report(utility, plan, int(config["user-id"]), int(config["seed"]),
                               reproducible_noise=reproducible)  # fmt: skip
    out = report_arrays(encode_report(report, dense=bool(config.get("secure-aggregation", 0))))
    metrics: dict[str, Any] = {
        "num-examples": 1,
        "num-elements": m,
        "user-values": int(plan.d),
        "positive-entries": int(hits),
    }
    if plan.dp_bits:  # the local randomiser's ε, charged to the node's ledger by the mod
        user = int(config["user-id"])
        cost = dp_local_epsilon(plan, int(config["seed"]), np.asarray([user]))[0]
        metrics.update(local_release({user: float(cost)}).metrics())
    return Message(RecordDict({"arrays": out, "metrics": MetricRecord(metrics)}), reply_to=msg)


def fedsm_evaluate(
    msg: Message, context: Context, utility: UtilityLike, n_elements: int | None = None
) -> Message:
    """Answer a FedSM ``evaluate`` message with f_i(S) (``metrics`` ``objective``).

    Parameters
    ----------
    msg : Message
        The ``evaluate`` message: ``arrays`` ``selected`` int64.
    context : Context
        The node's context (unused).
    utility : utility, mapping, numpy.ndarray or callable
        The user's f_i, as for :func:`fedsm_reply`.
    n_elements : int, optional
        m, when ``utility`` is a mapping or a callable.

    Returns
    -------
    Message
        ``metrics``: ``objective`` f_i(S), ``loss`` −f_i(S), ``num-examples`` = 1.
    """
    record = msg.content.array_records.get("arrays", ArrayRecord())
    utility = as_utility(utility, n_elements)
    m = int(utility.n_elements)
    selected = _ids(record, "selected", m) if "selected" in record else np.zeros(0, int)
    value = float(user_value(utility, selected))
    metrics = MetricRecord({"objective": value, "loss": -value, "num-examples": 1})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
