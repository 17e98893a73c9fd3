"""The strategies, importable from one place, as Flower's are from ``flwr.serverapp.strategy``.

.. code-block:: python

    from flower_app.strategies import FedSMStrategy, MaxFLStrategy

==============================  ==========================================================
strategy                        paper / what it does
==============================  ==========================================================
``FedSMStrategy``               Rafiey, Namani & Charalambides 2025: submodular selection by
                                sampled marginal gains (Alg. 1, Alg. 2, amplification)
``FedCGStrategy``               Rafiey 2024 (ICML): federated continuous greedy (FedCG,
                                FedCG+ with τ > 1 local steps) and rounding
``FedDiscreteGreedyStrategy``   the same paper's discrete greedy with importance factors
``MaxFLStrategy``               Cho et al. (TMLR): maximise global-model appeal
``AppealStrategy``              MaxFL and its baselines (FedAvg, FedProx, q-FFL, SCAFFOLD,
                                MW-Fed, Per-FedAvg, pFedMe) over cohorts: the runners'
                                ``MaxFLCohorts`` under its earlier name
``FedSubAvgStrategy``           Ding et al. 2022 (NeurIPS): submodels with feature-heat
                                correction; baselines ``FedAvgSubStrategy``,
                                ``FedProxSubStrategy``, ``FedAdamSubStrategy``,
                                ``ScaffoldSubStrategy``
``RoundStrategy``               their base: Flower's ``start()`` loop, written once
==============================  ==========================================================

Each strategy is plain, like Flower's ``FedAvg``: one node is one client, and its
constructor takes the paper's hyperparameters, ``FedAvg``'s own arguments where they apply
and ``secure_aggregation``. Its docstring has its message contract (one table) and its
client helpers live in :mod:`flower_app.clients`. This app's runners, where a node serves
many users, use the cohort classes of :mod:`flower_app.strategies.cohort`. Names are
imported on first use, so importing one strategy does not import the others' dependencies
(torch for the learning strategies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flower_app.lazy_exports import lazy_exports

__all__ = [
    "AllRepliesRejectedError",
    "AppealStrategy",
    "DiscoveryError",
    "FedAdamSubStrategy",
    "FedAvgSubStrategy",
    "FedCGStrategy",
    "FedDiscreteGreedyStrategy",
    "FedProxSubStrategy",
    "FedSMStrategy",
    "FedSubAvgStrategy",
    "InitialArraysError",
    "MaxFLStrategy",
    "MissingHandlerError",
    "NotEnoughNodesError",
    "RoundStrategy",
    "ScaffoldSubStrategy",
    "TooFewRepliesError",
]

#: public name -> the module that defines it
_HOME = {
    "AllRepliesRejectedError": "errors",
    "InitialArraysError": "errors",
    "MissingHandlerError": "errors",
    "NotEnoughNodesError": "errors",
    "RoundStrategy": "base",
    "TooFewRepliesError": "errors",
    "DiscoveryError": "discovery",
    "FedSMStrategy": "fedsm",
    "FedCGStrategy": "fedcg",
    "FedDiscreteGreedyStrategy": "discrete_greedy",
    "AppealStrategy": "cohort.maxfl",
    "MaxFLStrategy": "maxfl",
    "FedSubAvgStrategy": "fedsubavg",
    "FedAvgSubStrategy": "fedsubavg",
    "FedProxSubStrategy": "fedsubavg",
    "FedAdamSubStrategy": "fedsubavg",
    "ScaffoldSubStrategy": "fedsubavg",
}

if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load on first use
    from flower_app.strategies.base import RoundStrategy
    from flower_app.strategies.cohort.maxfl import AppealStrategy
    from flower_app.strategies.discovery import DiscoveryError
    from flower_app.strategies.discrete_greedy import FedDiscreteGreedyStrategy
    from flower_app.strategies.errors import (
        AllRepliesRejectedError,
        InitialArraysError,
        MissingHandlerError,
        NotEnoughNodesError,
        TooFewRepliesError,
    )
    from flower_app.strategies.fedcg import FedCGStrategy
    from flower_app.strategies.fedsm import FedSMStrategy
    from flower_app.strategies.fedsubavg import (
        FedAdamSubStrategy,
        FedAvgSubStrategy,
        FedProxSubStrategy,
        FedSubAvgStrategy,
        ScaffoldSubStrategy,
    )
    from flower_app.strategies.maxfl import MaxFLStrategy


__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
