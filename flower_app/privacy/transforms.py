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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from flower_app.algorithms.maxfl import aggregation_weight

__all__ = ["TRANSFORMS", "apply_transform"]

Transform = Callable[[RecordDict, RecordDict, Mapping[str, Any]], RecordDict]


def _maxfl_weighted_delta(
    request: RecordDict, reply: RecordDict, params: Mapping[str, Any]
) -> RecordDict:
    sent = request.array_records["arrays"]
    got = reply.array_records["arrays"]
    metrics = reply.metric_records["metrics"]
    loss = float(metrics[str(params["loss-key"])])
    rho = float(metrics[str(params["rho-key"])])
    if not (np.isfinite(loss) and np.isfinite(rho)):
        raise ValueError(f"secure aggregation: non-finite loss {loss} or rho {rho}")
    q = float(aggregation_weight(loss, rho))
    out: dict[str, Array] = {}
    for key in sent:
        w = sent[key].numpy()
        if w.dtype.kind != "f":
            continue
        if key not in got or got[key].numpy().shape != w.shape:
            raise ValueError(f"secure aggregation: the reply lacks '{key}' of shape {w.shape}")
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


#: transform name -> function(request content, reply content, params) -> new reply content
TRANSFORMS: dict[str, Transform] = {"maxfl-weighted-delta": _maxfl_weighted_delta}


def apply_transform(
    name: str, request: RecordDict, reply: RecordDict, params: Mapping[str, Any]
) -> RecordDict:
    """Apply the named transform (ValueError for an unknown name)."""
    if name not in TRANSFORMS:
        raise ValueError(f"secure aggregation: unknown reply transform {name!r}")
    return TRANSFORMS[name](request, reply, params)
