"""Reply transforms: what a node sums under secure aggregation when its reply is not a sum.

A strategy whose plain-mode replies are not summable as they are (MaxFL: each node returns
its trained model and its loss and requirement; the server weights them) names a transform;
the node's :func:`~flower_app.privacy.secure_aggregation_mod` applies it to the reply its
handler produced, before encoding, so the user's ClientApp stays the FedAvg-style one.

``maxfl-weighted-delta``
    request arrays w, reply arrays w_k and metrics F_k(w) (``loss-key``) and ρ_k
    (``rho-key``) → arrays q_k (w − w_k) for every floating array (others dropped: the
    server keeps its own), metrics ``q-sum`` = q_k, ``loss-sum`` = F_k(w), ``appeal`` =
    [F_k(w) < ρ_k], ``num-examples``; q_k = σ(F_k(w) − ρ_k)(1 − σ(F_k(w) − ρ_k)) (MaxFL, Eq. 4).
``fedsubavg-heat`` (FedSubAvg's counting round, plain mode)
    reply ``"<key>.rows"`` (the rows the node's data touches, per sparse table of
    ``rows-<key>`` rows) → dense 0/1 counts ``<key>`` and ``<key>.samples`` (× the node's
    ``num-examples``), metrics ``num-examples`` and ``clients`` = 1; the rows are kept on the
    node (its Context) for the training rounds. A node declares its rows once per run and
    checks ``rows-<key>`` against the table it was sent: a refusal for rows that do not fit
    would otherwise let a server locate the node's largest row by asking with other sizes.
``fedsubavg-weighted-delta`` (FedSubAvg's training round, plain mode, full model sent)
    c_i (x_i − x) for every array, the sparse tables restricted to the rows the node declared
    (c_i = 1, or its ``num-examples`` with ``weighting = samples``); metrics
    ``num-examples``, ``weight-sum`` = c_i, ``clients`` = 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from flower_app.algorithms.maxfl.core import aggregation_weight
from flower_app.privacy.refusals import NodeRefusedError

__all__ = ["TRANSFORMS", "apply_transform"]

Transform = Callable[[RecordDict, RecordDict, Mapping[str, Any], dict[str, Any]], RecordDict]


def _maxfl_weighted_delta(
    request: RecordDict, reply: RecordDict, params: Mapping[str, Any], store: dict[str, Any]
) -> RecordDict:
    sent = request.array_records["arrays"]
    got = reply.array_records["arrays"]
    metrics = reply.metric_records["metrics"]
    loss = float(metrics[str(params["loss-key"])])
    rho = float(metrics[str(params["rho-key"])])
    if not (np.isfinite(loss) and np.isfinite(rho)):
        raise NodeRefusedError("transform", "the reply's loss or requirement is not finite")
    q = float(aggregation_weight(loss, rho))
    out: dict[str, Array] = {}
    for key in sent:
        w = sent[key].numpy()
        if w.dtype.kind != "f":
            continue
        if key not in got or got[key].numpy().shape != w.shape:
            raise NodeRefusedError("transform", f"the reply lacks '{key}' of shape {w.shape}")
        delta = w.astype(np.float64) - got[key].numpy().astype(np.float64)
        out[key] = Array(q * delta)
    n = int(metrics.get(str(params.get("weight-key", "num-examples")), 0))
    return RecordDict(
        {
            "arrays": ArrayRecord(out),
            "metrics": MetricRecord({"q-sum": q, "loss-sum": loss,
                                     "appeal": int(loss < rho), "num-examples": n}),
        }
    )  # fmt: skip


def _sparse_keys(params: Mapping[str, Any]) -> dict[str, int]:
    """``rows-<key>`` params -> {sparse key: table rows}."""
    return {k[len("rows-"):]: int(v) for k, v in params.items() if k.startswith("rows-")}


def _fedsubavg_heat(
    request: RecordDict, reply: RecordDict, params: Mapping[str, Any], store: dict[str, Any]
) -> RecordDict:
    """Turn the counting reply (declared rows) into dense counts and sample-weighted counts."""
    if store.get("heat"):  # declared rows once per run: a refusal is then one bit per run
        raise NodeRefusedError(
            "transform", "this node declared its rows to the heat count of this run already"
        )
    store["heat"] = 1
    sent = request.array_records.get("arrays")
    got = reply.array_records["arrays"]
    n = int(reply.metric_records["metrics"]["num-examples"])
    out: dict[str, Array] = {}
    for key, size in _sparse_keys(params).items():
        if sent is not None and key in sent and sent[key].numpy().shape[:1] != (size,):
            raise NodeRefusedError(
                "transform", f"rows-{key} = {size} is not the row count of the table sent"
            )
        rows = got[f"{key}.rows"].numpy().astype(np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= size):
            raise NodeRefusedError(
                "transform", f"the node's rows of '{key}' do not fit a table of {size} rows"
            )
        mark = np.zeros(size, dtype=np.int64)
        mark[rows] = 1
        out[key] = Array(mark)
        out[f"{key}.samples"] = Array(mark * n)
        store[f"rows:{key}"] = [int(r) for r in np.flatnonzero(mark)]  # S(i), kept on the node
    return RecordDict(
        {"arrays": ArrayRecord(out),
         "metrics": MetricRecord({"num-examples": n, "clients": 1})}
    )  # fmt: skip


def _fedsubavg_weighted_delta(
    request: RecordDict, reply: RecordDict, params: Mapping[str, Any], store: dict[str, Any]
) -> RecordDict:
    """Turn a trained full model into c_i (x_i − x), sparse tables restricted to S(i)."""
    sent = request.array_records["arrays"]
    got = reply.array_records["arrays"]
    n = int(reply.metric_records["metrics"]["num-examples"])
    weight = float(n) if params.get("weighting") == "samples" else 1.0
    sparse = _sparse_keys(params)
    out: dict[str, Array] = {}
    for key in sent:
        if key.endswith(".rows"):
            continue
        if key not in got or got[key].numpy().shape != sent[key].numpy().shape:
            raise NodeRefusedError("transform", f"the reply lacks '{key}' as sent")
        delta = got[key].numpy().astype(np.float64) - sent[key].numpy().astype(np.float64)
        if key in sparse:  # only the rows the node's data touches (declared at counting)
            if f"rows:{key}" not in store:
                raise NodeRefusedError("transform", "no rows declared for this node")
            keep = np.zeros(delta.shape[0], dtype=bool)
            keep[np.asarray(store[f"rows:{key}"], dtype=np.int64)] = True
            delta[~keep] = 0.0
        out[key] = Array(weight * delta)
    return RecordDict(
        {"arrays": ArrayRecord(out),
         "metrics": MetricRecord({"num-examples": n, "weight-sum": weight, "clients": 1})}
    )  # fmt: skip


#: transform name -> function(request, reply, params, node store) -> new reply content
TRANSFORMS: dict[str, Transform] = {
    "maxfl-weighted-delta": _maxfl_weighted_delta,
    "fedsubavg-heat": _fedsubavg_heat,
    "fedsubavg-weighted-delta": _fedsubavg_weighted_delta,
}


def apply_transform(
    name: str,
    request: RecordDict,
    reply: RecordDict,
    params: Mapping[str, Any],
    store: dict[str, Any] | None = None,
) -> RecordDict:
    """Apply the named transform.

    ``store`` persists on the node between rounds (its Context): the counting round keeps
    the node's declared rows there for the training rounds (and answers once per run).

    Raises
    ------
    NodeRefusedError
        (rule ``transform``) An unknown name, or a reply the transform cannot use; the text
        names the rule and the request's parameters, never a value of the reply.
    """
    if name not in TRANSFORMS:
        raise NodeRefusedError("transform", f"unknown reply transform {name!r}")
    return TRANSFORMS[name](request, reply, params, {} if store is None else store)
