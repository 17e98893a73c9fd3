"""Client side of FedCG, FedCG+ and federated discrete greedy in plain mode (one node = one client).

A node holds one client's utility f_i over a ground set of m elements (items, venues, ...)
and answers the strategies' messages (:mod:`flower_app.strategies.fedcg` has the
contract). Give the helpers what you can compute:

:class:`ScoreTable`
    facility location f(S) = max_{j ∈ S} s_j from an item → score table (exact and fast:
    the very code of the simulation's cohorts).
:class:`Coverage`
    maximum coverage f(S) = 1 if S meets the client's set G (exact and fast).
:class:`SetFunction`
    any monotone submodular f, through a callable giving all marginal gains at once,
    ``gains(S) -> f(S ∪ {e}) − f(S)`` for every e (length m), and optionally the exact
    multilinear gradient; FedCG then estimates the gradient by sampling (Appendix C.3).

Then, in the ClientApp::

    from flower_app.clients.fedcg import ScoreTable, add_fedcg_handlers

    app = ClientApp()
    add_fedcg_handlers(app, lambda context: ScoreTable(my_scores(context), n_elements=500))

or, inside handlers of your own, ``return fedcg_reply(msg, context, utility)``.

The client's random stream is ``default_rng([seed, round, user_id])`` with ``user_id`` the
node's ``partition-id`` (node_config) when it has one, else its node id
(``default_user_id``); pass ``user_id_fn`` to choose another stable id. The
importance-factor protocol keeps the broadcast histogram O in ``context.state`` (record
:data:`~flower_app.clients.continuous.HISTOGRAM_RECORD`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import numpy as np
import scipy.sparse as sp
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_app.algorithms.fedcg.continuous import (
    matroid_from_spec,
    set_function_direction,
    user_direction_sum,
)
from flower_app.algorithms.fedcg.discrete_greedy import (
    discrete_report_sum,
    histogram_sum,
    importance_factors,
    participation_probabilities,
    set_function_importance,
    set_function_report,
)
from flower_app.clients.continuous import HISTOGRAM_RECORD, local_steps, stored_histogram
from flower_app.clients.submodular import element_ids, encode_report, report_arrays
from flower_app.submodular.matroids import Matroid
from flower_app.submodular.objectives import MaxRowObjective

__all__ = [
    "FEDCG_ACTIONS",
    "Coverage",
    "ScoreTable",
    "SetFunction",
    "Utility",
    "add_fedcg_handlers",
    "answer_direction",
    "answer_discrete",
    "answer_histogram",
    "answer_importance",
    "default_user_id",
    "fedcg_evaluate",
    "fedcg_reply",
]

#: the named train actions of FedCGStrategy and FedDiscreteGreedyStrategy
FEDCG_ACTIONS = ("direction", "histogram", "importance", "discrete")


class Utility(Protocol):
    """What the helpers need of a client's utility f_i (monotone submodular, f(∅) = 0)."""

    n_elements: int
    #: the utility as one row of a max-row objective (fast exact path), or None
    rows: MaxRowObjective | None

    def gains(self, selected: np.ndarray) -> np.ndarray:
        """Return f(S ∪ {e}) − f(S) for every element e (float64, length m)."""
        ...


class ScoreTable:
    """Facility location f(S) = max_{j ∈ S} s_j of one client (s_j ≥ 0, 0 = no score).

    Parameters
    ----------
    scores : mapping or array_like
        ``{item: score}`` or a dense vector of length ``n_elements``.
    n_elements : int, optional
        Ground-set size m (required with a mapping; default the vector's length).
    """

    def __init__(
        self, scores: Mapping[int, float] | Iterable[float], n_elements: int | None = None
    ) -> None:
        if isinstance(scores, Mapping):
            if n_elements is None:
                raise ValueError("n_elements is required with an {item: score} mapping")
            dense = np.zeros(int(n_elements))
            for item, score in scores.items():
                if not 0 <= int(item) < int(n_elements):
                    raise ValueError(f"item {item} is outside 0..{int(n_elements) - 1}")
                dense[int(item)] = float(score)
        else:
            dense = np.asarray(list(scores), dtype=np.float64)
            if n_elements is not None and dense.shape != (int(n_elements),):
                raise ValueError(f"{dense.size} scores given for {n_elements} elements")
        self.rows: MaxRowObjective | None = self._objective(sp.csr_matrix(dense[None, :]))
        self.n_elements = int(dense.size)

    @staticmethod
    def _objective(matrix: sp.csr_matrix) -> MaxRowObjective:
        return MaxRowObjective(matrix)

    def value(self, selected: Iterable[int]) -> float:
        """Return f(S)."""
        assert self.rows is not None
        return float(self.rows.value(np.asarray(list(selected), dtype=np.int64)))

    def gains(self, selected: np.ndarray) -> np.ndarray:
        """Return f(S ∪ {e}) − f(S) for every e."""
        assert self.rows is not None
        current = self.rows.user_values(np.asarray(selected, dtype=np.int64))
        return self.rows.gains(current)


class Coverage(ScoreTable):
    """Maximum coverage of one client: f(S) = 1 if S meets its set G, else 0.

    Parameters
    ----------
    members : iterable of int
        The elements of G (e.g. the venues a researcher published at).
    n_elements : int
        Ground-set size m.
    """

    def __init__(self, members: Iterable[int], n_elements: int) -> None:
        super().__init__({int(e): 1.0 for e in members}, n_elements)


class SetFunction:
    """Any monotone submodular utility, given by its marginal gains.

    Parameters
    ----------
    n_elements : int
        Ground-set size m.
    gains : callable
        ``gains(S) -> f(S ∪ {e}) − f(S)`` for every element e: S an int64 array, the
        result a float vector of length m (its entries on S are not used).
    gradient : callable, optional
        ``gradient(x) -> ∇F(x)``: the exact gradient of the multilinear extension
        (length m), used when the strategy asks for ``gradient="exact"``; without it
        FedCG's clients estimate the gradient from ``gradient-samples`` sets R ∼ x.
    """

    def __init__(
        self,
        n_elements: int,
        gains: Callable[[np.ndarray], np.ndarray],
        gradient: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.n_elements = int(n_elements)
        self.rows: MaxRowObjective | None = None
        self._gains = gains
        self.gradient = gradient

    def gains(self, selected: np.ndarray) -> np.ndarray:
        """Return f(S ∪ {e}) − f(S) for every e."""
        return np.asarray(self._gains(np.asarray(selected, dtype=np.int64)), dtype=np.float64)


# ---------------------------------------------------------------------------- helpers
def default_user_id(context: Context) -> int:
    """Return the node's ``partition-id`` (node_config) if it has one, else its node id."""
    pid = context.node_config.get("partition-id")
    return int(pid) if pid is not None else int(context.node_id)


def _config(msg: Message) -> ConfigRecord:
    return msg.content.config_records.get("config", ConfigRecord())


def _arrays(msg: Message) -> ArrayRecord:
    return msg.content.array_records.get("arrays", ArrayRecord())


def _matroid(msg: Message, m: int) -> Matroid:
    arrays, cfg = _arrays(msg), _config(msg)
    groups = arrays["matroid-groups"].numpy() if "matroid-groups" in arrays else None
    caps = arrays["matroid-capacities"].numpy() if "matroid-capacities" in arrays else None
    return matroid_from_spec(m, int(cfg.get("matroid-k", 0)), groups, caps)


def _reply(msg: Message, parts: list[np.ndarray] | None, **metrics: int | float) -> Message:
    record = ArrayRecord() if parts is None else report_arrays(parts)
    content = RecordDict({"arrays": record, "metrics": MetricRecord(dict(metrics))})
    return Message(content, reply_to=msg)


def answer_direction(
    msg: Message, context: Context, utility: Utility, user_id: int | None = None
) -> Message:
    """Answer ``train.direction`` (FedCG / FedCG+): the client's τ local steps from x.

    Parameters
    ----------
    msg : Message
        The request (arrays ``"x"``, the matroid; config ``seed``, ``server-round``,
        ``local-steps``, ``gradient``, ``gradient-samples``, ``fill-base``).
    context : Context
        The node's context.
    utility : Utility
        The client's f_i.
    user_id : int, optional
        Seeds the client's stream (default ``default_user_id``).

    Returns
    -------
    Message
        ``"arrays"``: the sum of the τ vertices (``"values"`` or ``"ids"`` + ``"values"``);
        ``"metrics"``: ``num-examples`` (1), ``n-elements``, ``ids-sent``.
    """
    cfg, m = _config(msg), utility.n_elements
    x = np.asarray(_arrays(msg)["x"].numpy(), dtype=np.float64)
    if x.size == 0:
        x = np.zeros(m)
    if x.shape != (m,):
        raise ValueError(f"x has shape {x.shape}; this client's ground set has {m} elements")
    local = local_steps(cfg)
    matroid = _matroid(msg, m)
    uid = default_user_id(context) if user_id is None else int(user_id)
    seed, t = int(cfg["seed"]), int(cfg["server-round"])
    if utility.rows is not None:
        total, sent = user_direction_sum(
            utility.rows, np.zeros(1, dtype=np.int64), np.ones(1), x, matroid, local, seed, t,
            user_ids=np.array([uid], dtype=np.int64),
        )  # fmt: skip
    else:
        total, sent = set_function_direction(
            utility.gains, x, matroid, local, seed, t, uid,
            gradient=getattr(utility, "gradient", None),
        )  # fmt: skip
    report = encode_report(total, dense=bool(cfg.get("secure-aggregation", 0)))
    return _reply(msg, report, **{"num-examples": 1, "n-elements": m, "ids-sent": int(sent)})


def answer_histogram(msg: Message, context: Context, utility: Utility) -> Message:
    """Answer ``train.histogram`` (round 1 of Algs. 4/5): O_i = (f_i({j}))_j."""
    m = utility.n_elements
    if utility.rows is not None:
        singletons = histogram_sum(utility.rows)
    else:
        singletons = np.maximum(utility.gains(np.zeros(0, dtype=np.int64)), 0.0)
    dense = bool(_config(msg).get("secure-aggregation", 0))
    return _reply(msg, encode_report(singletons, dense), **{"num-examples": 1, "n-elements": m})


def _kappa_i(utility: Utility, histogram: np.ndarray, kappa: float) -> tuple[float, float]:
    if utility.rows is not None:
        w = float(importance_factors(utility.rows, histogram)[0])
    else:
        w = set_function_importance(utility.gains(np.zeros(0, dtype=np.int64)), histogram)
    return float(participation_probabilities(np.array([w]), kappa)[0]), w


def answer_importance(msg: Message, context: Context, utility: Utility) -> Message:
    """Answer ``train.importance`` (round 2 of Algs. 4/5): keep O, report κ_i only."""
    histogram = np.asarray(_arrays(msg)["histogram"].numpy(), dtype=np.float64)
    if histogram.shape != (utility.n_elements,):
        raise ValueError(f"the histogram has shape {histogram.shape}; m is {utility.n_elements}")
    kappa_i, w = _kappa_i(utility, histogram, float(_config(msg)["kappa"]))
    context.state[HISTOGRAM_RECORD] = ArrayRecord([histogram])
    metrics = {"expected-participants": kappa_i, "max-w": w, "num-examples": 1}
    return _reply(msg, None, **metrics)


def answer_discrete(
    msg: Message, context: Context, utility: Utility, user_id: int | None = None
) -> Message:
    """Answer ``train.discrete`` (one round of Alg. 3): the fixed-point report Δ_i.

    Parameters
    ----------
    msg : Message
        The request (arrays ``"selected"``, the matroid; config ``seed``, ``kappa``,
        ``server-round``).
    context : Context
        The node's context (its state holds O from ``train.importance``).
    utility : Utility
        The client's f_i.
    user_id : int, optional
        Seeds the client's coin (default ``default_user_id``).

    Returns
    -------
    Message
        ``"arrays"``: int64 report; ``"metrics"``: ``participants`` (0 or 1),
        ``num-examples`` (1), ``n-elements``.
    """
    histogram = stored_histogram(context.state)
    m, cfg = utility.n_elements, _config(msg)
    kappa_i, _ = _kappa_i(utility, histogram, float(cfg["kappa"]))
    selected = element_ids(_arrays(msg), "selected", m)
    matroid = _matroid(msg, m)
    uid = default_user_id(context) if user_id is None else int(user_id)
    seed, t = int(cfg["seed"]), int(cfg["server-round"])
    if utility.rows is not None:
        total, count = discrete_report_sum(
            utility.rows, selected, matroid, np.array([kappa_i]), seed, t,
            np.array([uid], dtype=np.int64),
        )  # fmt: skip
    else:
        total, count = set_function_report(
            utility.gains(selected), selected, matroid, kappa_i, seed, t, uid
        )
    metrics = {"participants": int(count), "num-examples": 1, "n-elements": m}
    dense = bool(_config(msg).get("secure-aggregation", 0))
    return _reply(msg, encode_report(total, dense, np.int64), **metrics)


_ANSWERS: dict[str, Callable[..., Message]] = {
    "direction": answer_direction,
    "histogram": lambda msg, ctx, utility, user_id=None: answer_histogram(msg, ctx, utility),
    "importance": lambda msg, ctx, utility, user_id=None: answer_importance(msg, ctx, utility),
    "discrete": answer_discrete,
}


def fedcg_reply(
    msg: Message, context: Context, utility: Utility, user_id: int | None = None
) -> Message:
    """Answer any message of FedCGStrategy / FedDiscreteGreedyStrategy (by its action).

    Parameters
    ----------
    msg : Message
        ``train.direction``, ``train.histogram``, ``train.importance`` or
        ``train.discrete``.
    context : Context
        The node's context.
    utility : Utility
        The client's f_i (:class:`ScoreTable`, :class:`Coverage`, :class:`SetFunction`).
    user_id : int, optional
        Seeds the client's randomness (default ``default_user_id``).

    Returns
    -------
    Message
        The reply.
    """
    _, _, action = msg.metadata.message_type.partition(".")
    if action not in _ANSWERS:
        raise ValueError(f"message type {msg.metadata.message_type!r} is not a FedCG message")
    return _ANSWERS[action](msg, context, utility, user_id=user_id)


def utility_value(utility: Utility, selected: Iterable[int]) -> float:
    """Return f_i(S): exact for a score table or coverage, else by the chain of its gains."""
    chosen = [int(e) for e in selected]
    value = getattr(utility, "value", None)
    if callable(value):
        return float(value(chosen))
    total = 0.0
    for k, e in enumerate(chosen):
        total += float(utility.gains(np.asarray(chosen[:k], dtype=np.int64))[e])
    return total


def fedcg_evaluate(msg: Message, context: Context, utility: Utility) -> Message:
    """Answer FedCG's ``evaluate`` message with f_i(S) (``metrics`` ``objective``).

    Parameters
    ----------
    msg : Message
        ``arrays`` ``selected`` int64: the set S (the final rounding, or ∅ before round 1).
    context : Context
        The node's context (unused).
    utility : Utility
        The client's f_i.

    Returns
    -------
    Message
        ``metrics``: ``objective`` f_i(S), ``num-examples`` = 1.
    """
    m = int(utility.n_elements)
    record = msg.content.array_records.get("arrays", ArrayRecord())
    selected = element_ids(record, "selected", m) if "selected" in record else np.zeros(0, int)
    metrics = MetricRecord({"objective": utility_value(utility, selected), "num-examples": 1})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def add_fedcg_handlers(
    app: ClientApp,
    utility_fn: Callable[[Context], Utility],
    user_id_fn: Callable[[Context], int] | None = None,
    evaluate: bool = True,
) -> ClientApp:
    """Register ``@app.train("direction" | "histogram" | "importance" | "discrete")``.

    With ``evaluate`` (default) also ``@app.evaluate()`` answering f_i(S) of the final set
    (:func:`~flower_app.clients.fedcg_evaluate`;
    ``FedCGStrategy(federated_evaluation=True)``, its default), unless the app already has
    an ``@app.evaluate()`` handler.

    Parameters
    ----------
    app : ClientApp
        The user's ClientApp (its other handlers are untouched).
    utility_fn : callable
        ``utility_fn(context) -> Utility``: the node's f_i (cache it if it is costly).
    user_id_fn : callable, optional
        ``user_id_fn(context) -> int``: a stable id seeding the client's randomness
        (default ``default_user_id``).
    evaluate : bool, optional
        Also register ``@app.evaluate()`` with
        :func:`~flower_app.clients.fedcg_evaluate` (default True; kept off when the app
        has its own).

    Returns
    -------
    ClientApp
        ``app``.
    """
    for action in FEDCG_ACTIONS:

        def handler(msg: Message, context: Context, _action: str = action) -> Message:
            uid = None if user_id_fn is None else int(user_id_fn(context))
            return _ANSWERS[_action](msg, context, utility_fn(context), user_id=uid)

        handler.__name__ = f"fedcg_{action}"
        app.train(action)(handler)
    if evaluate and "evaluate.default" not in getattr(app, "_registered_funcs", {}):

        def evaluate_handler(msg: Message, context: Context) -> Message:
            return fedcg_evaluate(msg, context, utility_fn(context))

        app.evaluate()(evaluate_handler)
    return app
