"""Client side of FedSubAvg (plain mode) for any torch model: a few lines in a user's ClientApp.

The strategy (:class:`~flower_app.strategies.fedsubavg.FedSubAvgStrategy`) treats the
arrays it was told are sparse (``sparse_keys``, e.g. ``"item_emb.weight"``) as tables whose
rows a client downloads only if its data uses them. A FedAvg ClientApp changes in three
places:

1. a ``@app.query("feature_heat")`` handler declaring the rows its data touches, once::

       @app.query("feature_heat")
       def feature_heat(msg, context):
           items = load_data(context).item_ids          # the ids the data uses
           return heat_reply(msg, {"item_emb.weight": items}, num_examples=len(items))

2. in ``@app.train()``: ``load_submodel(model, msg)`` instead of
   ``model.load_state_dict(msg.content["arrays"].to_torch_state_dict())``;
3. the reply: ``return submodel_reply(model, msg, num_examples, {"train_loss": loss})``.

``@app.evaluate()`` stays as it is (it receives the full model, as from FedAvg).

Record layout (``"<key>"`` a sparse array, r the node's rows):

====================  ===========================================  =============================
message               received                                     replied
====================  ===========================================  =============================
``query.feature_``    ``"config"``: ``sparse-keys`` list[str]      ``"arrays"``: ``"<key>.rows"``
``heat``                                                           int64 distinct rows per key;
                                                                   ``"metrics"``: ``num-examples``
``train``             ``"arrays"``: ``"<key>"`` (r, *d) values,    the same keys and rows, the
                      ``"<key>.rows"`` int64 (r,), dense arrays    updated values; ``"metrics"``:
                      whole; ``"config"``: the user's config +     ``num-examples`` + the user's
                      ``server-round``                             metrics
====================  ===========================================  =============================

Only the declared rows of a sparse table are written by :func:`load_submodel`; the other rows
of the client's table keep whatever they held (the client's data must not use them: declare
every row it uses).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from flower_app.algorithms.fedsubavg.named import ROWS_SUFFIX, rows_key, unique_rows

__all__ = [
    "declare_rows",
    "heat_reply",
    "load_submodel",
    "requested_sparse_keys",
    "submodel_reply",
]


def _numpy(values: Any) -> np.ndarray:
    """Return a numpy array of a numpy array, list or (CPU or GPU) torch tensor."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def declare_rows(ids: Any, n_rows: int | None = None) -> np.ndarray:
    """Return the distinct rows of a table that ids used by the client's data touch.

    Parameters
    ----------
    ids : array-like or torch.Tensor of int
        Every id the client's training data uses in that table (any shape, repeats
        allowed), e.g. the item column of its ratings.
    n_rows : int, optional
        Rows of the table, to check the ids are in range.

    Returns
    -------
    numpy.ndarray
        Sorted distinct int64 row ids.
    """
    return unique_rows(_numpy(ids), n_rows)


def requested_sparse_keys(msg: Message) -> list[str]:
    """Return the sparse arrays the server asks about in a ``query.feature_heat`` message."""
    config = msg.content.config_records.get("config")
    return [str(k) for k in config.get("sparse-keys", [])] if config is not None else []


def heat_reply(
    msg: Message, rows: Mapping[str, Any], num_examples: int, partition_id: int | None = None
) -> Message:
    """Answer the counting query: the rows each sparse array's data touches, and the data size.

    Parameters
    ----------
    msg : Message
        The server's ``query.feature_heat`` message.
    rows : mapping of str to array-like
        Per sparse array (the strategy's ``sparse_keys``): the ids the client's data uses in
        it (passed through :func:`declare_rows`; repeats are fine).
    num_examples : int
        The client's training examples (the weight of ``weighting="samples"``).
    partition_id : int, optional
        The node's partition (``context.node_config["partition-id"]``). When every node
        gives a distinct one, the strategy samples over partitions instead of node ids, so
        a seed picks the same clients in every run (Flower's simulation gives nodes new
        random ids each run).

    Returns
    -------
    Message
        The reply (``"arrays"`` with ``"<key>.rows"``, ``"metrics"`` with ``num-examples``
        and ``partition-id`` if given).

    Raises
    ------
    ValueError
        If a sparse array the server asks about is missing from ``rows``.
    """
    keys = requested_sparse_keys(msg)
    missing = [k for k in keys if k not in rows]
    if missing:
        raise ValueError(
            f"the server's sparse_keys {keys} include {missing}, which heat_reply was not "
            "given rows for"
        )
    record = ArrayRecord({rows_key(k): Array(declare_rows(rows[k])) for k in keys})
    metrics = MetricRecord({"num-examples": int(num_examples)})
    if partition_id is not None:
        metrics["partition-id"] = int(partition_id)
    return Message(RecordDict({"arrays": record, "metrics": metrics}), reply_to=msg)


def _split(record: ArrayRecord) -> dict[str, np.ndarray | None]:
    """Return value key -> its rows (sparse) or None (dense), in the record's order."""
    out: dict[str, np.ndarray | None] = {}
    for key in record:
        if key.endswith(ROWS_SUFFIX) and key[: -len(ROWS_SUFFIX)] in record:
            continue
        rk = rows_key(key)
        out[key] = record[rk].numpy().astype(np.int64) if rk in record else None
    return out


def _state(model: Any) -> MutableMapping[str, Any]:
    """Return the model's writable named arrays (torch: its state_dict, sharing storage)."""
    if hasattr(model, "state_dict"):
        return model.state_dict()
    if isinstance(model, MutableMapping):
        return model
    raise TypeError("model must be a torch.nn.Module or a mutable mapping of numpy arrays")


def load_submodel(model: Any, msg: Message) -> dict[str, np.ndarray]:
    """Write the received submodel into the model: the sent rows of sparse tables, dense whole.

    Parameters
    ----------
    model : torch.nn.Module or mutable mapping of numpy.ndarray
        The client's full model (same array names as the server's ``initial_arrays``).
    msg : Message
        The ``train`` message.

    Returns
    -------
    dict
        The rows received per sparse array (int64).

    Raises
    ------
    ValueError
        If the message names an array the model lacks.
    """
    record = msg.content.array_records["arrays"]
    state = _state(model)
    received: dict[str, np.ndarray] = {}
    for key, rows in _split(record).items():
        if key not in state:
            raise ValueError(f"the model has no array '{key}' (server sent {list(record)})")
        values = np.array(record[key].numpy())  # writable copy
        target = state[key]
        if hasattr(target, "copy_"):  # torch tensor: write in place (shares the parameter)
            import torch

            src = torch.from_numpy(values).to(dtype=target.dtype, device=target.device)
            with torch.no_grad():
                if rows is None:
                    target.copy_(src.reshape(target.shape))
                else:
                    target[torch.from_numpy(rows).to(target.device)] = src
        elif rows is None:
            state[key] = values.reshape(np.shape(target)).astype(np.asarray(target).dtype)
        else:
            np.asarray(target)[rows] = values
        if rows is not None:
            received[key] = rows
    return received


def submodel_reply(
    model: Any,
    msg: Message,
    num_examples: int,
    metrics: Mapping[str, int | float] | None = None,
) -> Message:
    """Reply to a ``train`` message with the updated submodel (the rows that were sent).

    Parameters
    ----------
    model : torch.nn.Module or mutable mapping of numpy.ndarray
        The client's model after local training.
    msg : Message
        The ``train`` message (its ``"<key>.rows"`` say which rows to return).
    num_examples : int
        Training examples used (FedAvg's ``num-examples``).
    metrics : mapping, optional
        Further numbers to report (e.g. ``{"train_loss": 0.41}``), averaged by
        ``num-examples`` on the server.

    Returns
    -------
    Message
        ``"arrays"`` (same keys and rows as received, updated values) and ``"metrics"``.
    """
    record = msg.content.array_records["arrays"]
    state = _state(model)
    out = ArrayRecord()
    for key, rows in _split(record).items():
        value = _numpy(state[key])
        if rows is not None:
            value = value[rows]
            out[rows_key(key)] = Array(rows)
        out[key] = Array(np.array(value, order="C"))  # keeps 0-d arrays 0-d
    values = {k: (float(v) if isinstance(v, float | np.floating) else int(v))
              for k, v in (metrics or {}).items()}
    reply_metrics = MetricRecord({**values, "num-examples": int(num_examples)})
    return Message(RecordDict({"arrays": out, "metrics": reply_metrics}), reply_to=msg)
