"""The small adapter that drives a NumPyClient from Message API messages.

Message contract (shared by the strategies of this package):

* ``query``: request ``"config"`` ConfigRecord; reply ``"properties"`` ConfigRecord
  = ``client.get_properties(config)``.
* ``train``: request ``"arrays"`` ArrayRecord (keys "0".."n") and ``"config"`` ConfigRecord;
  reply ``"arrays"`` ArrayRecord and ``"metrics"`` MetricRecord with ``num-examples``
  (``client.fit``).
* ``evaluate``: request as for ``train``; reply ``"metrics"`` MetricRecord with ``loss`` and
  ``num-examples`` (``client.evaluate``).

Arrays travel in the order the NumPyClient takes and returns them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient

__all__ = ["handle_evaluate", "handle_query", "handle_train", "to_record_value"]

ClientFactory = Callable[[Context], NumPyClient]


def to_record_value(value: Any) -> Any:
    """Turn numpy scalars into Python ones (Flower records reject numpy types)."""
    if isinstance(value, np.generic):
        return value.item()
    return value


def _metrics(values: dict[str, Any]) -> MetricRecord:
    out: dict[str, Any] = {}
    for key, value in values.items():
        value = to_record_value(value)
        if isinstance(value, bool):
            value = int(value)
        out[key] = value
    return MetricRecord(out)


def _config(msg: Message) -> dict[str, Any]:
    if "config" not in msg.content.config_records:
        return {}
    return dict(msg.content.config_records["config"])


def _arrays(msg: Message) -> list[np.ndarray]:
    if "arrays" not in msg.content.array_records:
        return []
    return msg.content.array_records["arrays"].to_numpy_ndarrays()


def handle_query(msg: Message, context: Context, factory: ClientFactory) -> Message:
    """Answer a ``query`` message with ``client.get_properties``."""
    props = factory(context).get_properties(_config(msg))
    record = ConfigRecord({key: to_record_value(value) for key, value in props.items()})
    return Message(RecordDict({"properties": record}), reply_to=msg)


def handle_train(msg: Message, context: Context, factory: ClientFactory) -> Message:
    """Answer a ``train`` message with ``client.fit``."""
    arrays, num_examples, metrics = factory(context).fit(_arrays(msg), _config(msg))
    content = RecordDict(
        {
            "arrays": ArrayRecord([np.asarray(a) for a in arrays]),
            "metrics": _metrics({**metrics, "num-examples": int(num_examples)}),
        }
    )
    return Message(content, reply_to=msg)


def handle_evaluate(msg: Message, context: Context, factory: ClientFactory) -> Message:
    """Answer an ``evaluate`` message with ``client.evaluate``."""
    loss, num_examples, metrics = factory(context).evaluate(_arrays(msg), _config(msg))
    record = _metrics({**metrics, "loss": float(loss), "num-examples": int(num_examples)})
    return Message(RecordDict({"metrics": record}), reply_to=msg)
