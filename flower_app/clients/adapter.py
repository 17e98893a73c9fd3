"""Drive a NumPyClient from Message-API messages: the NumPyClient path for legacy apps.

A Flower ``ClientApp(client_fn=...)`` built the legacy way answers only the compat messages
(``fitins.parameters`` records, no ``query``), so it cannot serve a Message-API strategy,
Flower's own ``FedAvg`` included. :func:`numpy_client_app` turns the same NumPyClient
factory into a Message-API ``ClientApp`` instead: every message type a strategy of this
package sends is routed to the client's methods, with the message's action (the part after
the dot of ``"query.cohort"``) given to the client as ``config["kind"]``:

==============================  =================================  ==========================
message type                    request                            reply (client method)
==============================  =================================  ==========================
``query`` / ``query.<action>``  ``"config"`` ConfigRecord          ``"properties"``
                                                                   ConfigRecord
                                                                   (``get_properties``)
``train`` / ``train.<action>``  ``"arrays"`` ArrayRecord (keys     ``"arrays"`` ArrayRecord,
                                "0".."n"), ``"config"``            ``"metrics"`` MetricRecord
                                                                   with ``num-examples``
                                                                   (``fit``)
``evaluate`` /                  as for ``train``                   ``"metrics"`` with
``evaluate.<action>``                                              ``loss``, ``num-examples``
                                                                   (``evaluate``)
==============================  =================================  ==========================

Arrays travel in the order the NumPyClient takes and returns them. A client that has a
``handle(msg) -> Message`` method answers the messages itself (e.g.
:class:`~flower_app.clients.torch_tasks.TorchTaskClient`, whose named-array submodels are not
NumPyClient-shaped).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

__all__ = [
    "handle_evaluate",
    "handle_query",
    "handle_train",
    "numpy_client_app",
    "to_record_value",
]

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
    config = {}
    if "config" in msg.content.config_records:
        config = dict(msg.content.config_records["config"])
    _, _, action = msg.metadata.message_type.partition(".")
    if action:
        config.setdefault("kind", action)
    return config


def _arrays(msg: Message) -> list[np.ndarray]:
    if "arrays" not in msg.content.array_records:
        return []
    return msg.content.array_records["arrays"].to_numpy_ndarrays()


def _message_level(client: NumPyClient, msg: Message) -> Message | None:
    """Return ``client.handle(msg)`` if the client answers messages itself, else None."""
    handle = getattr(client, "handle", None)
    return handle(msg) if callable(handle) else None


def handle_query(msg: Message, context: Context, factory: ClientFactory) -> Message:
    """Answer a ``query`` message with ``client.get_properties``."""
    client = factory(context)
    if (reply := _message_level(client, msg)) is not None:
        return reply
    props = client.get_properties(_config(msg))
    record = ConfigRecord({key: to_record_value(value) for key, value in props.items()})
    return Message(RecordDict({"properties": record}), reply_to=msg)


def handle_train(msg: Message, context: Context, factory: ClientFactory) -> Message:
    """Answer a ``train`` message with ``client.fit``."""
    client = factory(context)
    if (reply := _message_level(client, msg)) is not None:
        return reply
    arrays, num_examples, metrics = client.fit(_arrays(msg), _config(msg))
    content = RecordDict(
        {
            "arrays": ArrayRecord([np.asarray(a) for a in arrays]),
            "metrics": _metrics({**metrics, "num-examples": int(num_examples)}),
        }
    )
    return Message(content, reply_to=msg)


def handle_evaluate(msg: Message, context: Context, factory: ClientFactory) -> Message:
    """Answer an ``evaluate`` message with ``client.evaluate``."""
    client = factory(context)
    if (reply := _message_level(client, msg)) is not None:
        return reply
    loss, num_examples, metrics = client.evaluate(_arrays(msg), _config(msg))
    record = _metrics({**metrics, "loss": float(loss), "num-examples": int(num_examples)})
    return Message(RecordDict({"metrics": record}), reply_to=msg)


#: the named actions the strategies of this package send, by message category
ACTIONS: dict[str, tuple[str, ...]] = {
    "query": ("cohort", "feature_heat", "submodel"),
    "train": ("direction", "histogram", "importance", "discrete", "feature_heat"),
    "evaluate": ("appeal", "metrics"),
}


def numpy_client_app(
    factory: ClientFactory,
    actions: dict[str, Iterable[str]] | None = None,
    mods: list[Any] | None = None,
) -> ClientApp:
    """Return a Message-API ClientApp whose handlers call a NumPyClient.

    Parameters
    ----------
    factory : callable
        ``factory(context) -> NumPyClient``, the legacy ``client_fn`` without
        ``.to_client()``.
    actions : dict, optional
        Named actions to register per category (``"query"``, ``"train"``, ``"evaluate"``)
        besides the default one (default: :data:`~flower_app.clients.adapter.ACTIONS`,
        what this package's strategies send).
    mods : list, optional
        Flower mods around every handler (default: ``[secure_aggregation_mod]``, a no-op
        unless a strategy runs with secure aggregation).

    Returns
    -------
    ClientApp
        Answers ``train``, ``evaluate`` and ``query`` messages, plain or with an action.
    """
    from flower_app.privacy.secagg_client import secure_aggregation_mod

    app = ClientApp(mods=[secure_aggregation_mod] if mods is None else list(mods))
    handlers = {"query": handle_query, "train": handle_train, "evaluate": handle_evaluate}
    named = ACTIONS if actions is None else actions
    for category, handle in handlers.items():
        register = getattr(app, category)
        for action in ("default", *named.get(category, ())):

            def handler(msg: Message, context: Context, _h: Any = handle) -> Message:
                return _h(msg, context, factory)

            handler.__name__ = f"{category}_{action}"
            register(action)(handler)
    return app
