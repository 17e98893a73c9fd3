"""Client helpers: what a user's ClientApp calls to serve this package's strategies.

.. code-block:: python

    from flower_app.clients import ScoreTable, fedsm_reply

=====================  ======================================================================
strategy               helpers (a few lines of a FedAvg-shaped ClientApp)
=====================  ======================================================================
FedSM                  ``fedsm_reply(msg, context, utility)`` in ``@app.train()``,
                       ``fedsm_evaluate`` in ``@app.evaluate()``; ``as_utility``
FedCG, discrete        ``add_fedcg_handlers(app, utility_fn)`` (registers the four
greedy                 ``train.<action>`` handlers) or ``fedcg_reply(msg, context, utility)``
(any of the above)     utilities: ``ScoreTable`` (facility location, item -> score),
                       ``Coverage`` (max coverage), ``SetFunction`` (any monotone submodular
                       f_i from vectorised marginal gains), ``GainsUtility`` (gains of the
                       sampled elements only)
MaxFL                  ``ensure_rho(context, compute)`` (ρ once, kept in ``context.state``),
                       ``maxfl_metrics(train_loss, rho, metrics)`` for the train reply,
                       ``appeal_reply(msg, train_loss, rho)`` for ``@app.evaluate("appeal")``
FedSubAvg              ``heat_reply`` / ``declare_rows`` for ``@app.query("feature_heat")``,
                       ``load_submodel(model, msg)`` and ``submodel_reply(model, msg, n)`` in
                       ``@app.train()``; ``requested_sparse_keys``
a legacy NumPyClient   ``numpy_client_app(client_fn)``: a Message-API ClientApp whose handlers
                       call the NumPyClient's ``fit`` / ``evaluate`` / ``get_properties``
=====================  ======================================================================

Names are imported on first use, so a submodular ClientApp does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Coverage",
    "GainsUtility",
    "ScoreTable",
    "SetFunction",
    "add_fedcg_handlers",
    "appeal_reply",
    "as_utility",
    "declare_rows",
    "ensure_rho",
    "fedcg_evaluate",
    "fedcg_reply",
    "fedsm_evaluate",
    "fedsm_reply",
    "heat_reply",
    "load_submodel",
    "maxfl_metrics",
    "numpy_client_app",
    "requested_sparse_keys",
    "stored_rho",
    "submodel_reply",
]

#: public name -> the module that defines it
_HOME = {
    "Coverage": "fedcg",
    "ScoreTable": "fedcg",
    "SetFunction": "fedcg",
    "add_fedcg_handlers": "fedcg",
    "fedcg_evaluate": "fedcg",
    "fedcg_reply": "fedcg",
    "GainsUtility": "fedsm",
    "as_utility": "fedsm",
    "fedsm_evaluate": "fedsm",
    "fedsm_reply": "fedsm",
    "appeal_reply": "maxfl",
    "ensure_rho": "maxfl",
    "maxfl_metrics": "maxfl",
    "stored_rho": "maxfl",
    "declare_rows": "fedsubavg",
    "heat_reply": "fedsubavg",
    "load_submodel": "fedsubavg",
    "requested_sparse_keys": "fedsubavg",
    "submodel_reply": "fedsubavg",
    "numpy_client_app": "adapter",
}

if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load on first use
    from flower_app.clients.adapter import numpy_client_app
    from flower_app.clients.fedcg import (
        Coverage,
        ScoreTable,
        SetFunction,
        add_fedcg_handlers,
        fedcg_evaluate,
        fedcg_reply,
    )
    from flower_app.clients.fedsm import GainsUtility, as_utility, fedsm_evaluate, fedsm_reply
    from flower_app.clients.fedsubavg import (
        declare_rows,
        heat_reply,
        load_submodel,
        requested_sparse_keys,
        submodel_reply,
    )
    from flower_app.clients.maxfl import appeal_reply, ensure_rho, maxfl_metrics, stored_rho


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'flower_app.clients' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
