"""Client side of :class:`~flower_app.strategies.maxfl.MaxFLStrategy` in a user's ClientApp.

A FedAvg-style ClientApp (``@app.train()`` replying ``arrays`` + ``metrics`` with
``num-examples``) becomes a MaxFL one with three additions:

1. its requirement ρ_k, computed once (e.g. the loss of a model trained on the local data
   alone) and kept in ``context.state``: :func:`ensure_rho`;
2. in ``@app.train()``, the loss F_k(w) of the *received* model on the local training data,
   measured before training, and ρ_k added to the reply's metrics: :func:`maxfl_metrics`;
3. with flexible participation (the default), an ``@app.evaluate("appeal")`` handler that
   answers the opt-in test with the same two numbers: :func:`appeal_reply`.

Example::

    from flower_app.clients.maxfl import appeal_reply, ensure_rho, maxfl_metrics

    @app.train()
    def train(msg, context):
        model, data = load(msg, context)
        rho = ensure_rho(context, lambda: solo_loss(data))  # once per node
        received_loss = loss_of(model, data)  # F_k(w), before training
        train_fn(model, data)
        metrics = maxfl_metrics(received_loss, rho, {"num-examples": len(data)})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content, reply_to=msg)

    @app.evaluate("appeal")
    def appeal(msg, context):
        model, data = load(msg, context)
        return appeal_reply(msg, loss_of(model, data), ensure_rho(context, lambda: ...))

No torch or Flower-strategy import here: the helpers work for any model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import Context, Message, MetricRecord, RecordDict

__all__ = [
    "APPEAL_ACTION",
    "RHO_RECORD",
    "appeal_reply",
    "ensure_rho",
    "maxfl_metrics",
    "stored_rho",
]

#: the action of the opt-in request: register ``@app.evaluate("appeal")``
APPEAL_ACTION = "appeal"

#: the MetricRecord of ``context.state`` that keeps ρ_k (key ``"rho"``)
RHO_RECORD = "maxfl"


def _finite(value: Any, name: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def stored_rho(context: Context) -> float | None:
    """Return the ρ_k kept in ``context.state``, or None if not computed yet."""
    if RHO_RECORD not in context.state:
        return None
    value = context.state[RHO_RECORD].get("rho")
    return None if value is None else float(value)


def ensure_rho(context: Context, compute: Callable[[], float]) -> float:
    """Return the node's requirement ρ_k, computing it once and keeping it in the state.

    Parameters
    ----------
    context : Context
        The ClientApp's context; ρ_k lives in ``context.state[RHO_RECORD]`` (a
        MetricRecord), which the node keeps across rounds.
    compute : callable
        ``compute() -> float``: the client's requirement, e.g. the training loss of a
        model trained on its local data alone (the MaxFL paper's ρ_k). Called only the
        first time.

    Returns
    -------
    float
        ρ_k.

    Raises
    ------
    ValueError
        If ``compute`` returns a non-finite value.
    """
    rho = stored_rho(context)
    if rho is None:
        rho = _finite(compute(), "ρ_k")
        context.state[RHO_RECORD] = MetricRecord({"rho": rho})
    return rho


def maxfl_metrics(train_loss: float, rho: float, metrics: Mapping[str, Any]) -> MetricRecord:
    """Return the ``metrics`` of a MaxFL train reply: the app's own metrics plus F_k(w), ρ_k.

    Parameters
    ----------
    train_loss : float
        F_k(w): the loss of the model the node *received*, on its training data (measured
        before local training).
    rho : float
        ρ_k (see :func:`ensure_rho`).
    metrics : mapping
        What a FedAvg reply carries: ``num-examples`` (int) and any other metrics (kept).

    Returns
    -------
    MetricRecord
        ``metrics`` with ``train-loss`` and ``rho`` added.

    Raises
    ------
    ValueError
        If ``num-examples`` is missing or a loss is not finite.
    """
    if "num-examples" not in metrics:
        raise ValueError("metrics need 'num-examples' (the local training examples)")
    values = {k: v.item() if hasattr(v, "item") else v for k, v in metrics.items()}
    values["train-loss"] = _finite(train_loss, "train_loss")
    values["rho"] = _finite(rho, "rho")
    return MetricRecord(values)


def appeal_reply(msg: Message, train_loss: float, rho: float) -> Message:
    """Return the reply to an opt-in request (``evaluate.appeal``).

    Parameters
    ----------
    msg : Message
        The request; its ``arrays`` are the current global model w.
    train_loss : float
        F_k(w) of that model on the local training data.
    rho : float
        ρ_k.

    Returns
    -------
    Message
        ``metrics``: ``train-loss``, ``rho`` and ``appealing`` (1 if F_k(w) < ρ_k, else
        0; the server decides from the first two).
    """
    loss = _finite(train_loss, "train_loss")
    rho = _finite(rho, "rho")
    metrics = MetricRecord({"train-loss": loss, "rho": rho, "appealing": int(loss < rho)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
