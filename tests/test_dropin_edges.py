"""Drop-in edges shared by every strategy: FedAvg's defaults where FedAvg has the parameter."""

from __future__ import annotations

import inspect

import pytest
from flwr.serverapp.strategy import FedAvg

from flower_app.strategies import FedCGStrategy, FedSMStrategy, FedSubAvgStrategy, MaxFLStrategy
from flower_app.strategies.discrete_greedy import FedDiscreteGreedyStrategy


def _defaults(cls) -> dict:
    params = inspect.signature(cls.__init__).parameters
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize(
    "cls",
    [FedSubAvgStrategy, MaxFLStrategy, FedCGStrategy, FedSMStrategy, FedDiscreteGreedyStrategy],
)
def test_a_parameter_fedavg_has_keeps_fedavgs_default(cls) -> None:
    fedavg, ours = _defaults(FedAvg), _defaults(cls)
    shared = sorted(set(fedavg) & set(ours))
    assert shared, f"{cls.__name__} shares no parameter with FedAvg"
    assert {k: ours[k] for k in shared} == {k: fedavg[k] for k in shared}
