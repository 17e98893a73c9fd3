"""The server-state types a flower_app checkpoint may hold, each under a stable name.

Every resumable strategy's ``checkpoint_state`` returns plain data and instances of the
classes below (:mod:`flower_app.checkpoint` stores nothing else). Each class is registered
under a name of its own (``family.Class``), independent of the module it lives in: moving a
class to another module changes nothing in the files; renaming or removing one of its
dataclass fields makes older checkpoints fail to load with a message naming the fields.

Small value types convert through their constructor, so reading checks them as creating
them does: the DP settings (:class:`~flower_app.algorithms.common.gaussian_dp.GaussianDP`,
all its fields) and the matroids. The server states and the DP accountant (many attributes,
generators among them, and new ones as the algorithms grow) are stored as their attributes
(:func:`flower_app.checkpoint.attribute_type`): the object read back is the one saved, with
no constructor re-run (it would reseed the generators), and an attribute added to a class is
stored without a change here.

A class missing here cannot be checkpointed: writing names it and its place in the state.
The types are grouped by family (:data:`FAMILIES`), and a family's modules are imported only
when a state to write or a file to read holds one of its types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from flower_app.checkpoint import CheckpointType, attribute_type

__all__ = ["FAMILIES"]


def _dp() -> list[CheckpointType]:
    from flower_app.algorithms.common.gaussian_dp import GaussianAccountant, GaussianDP

    def dp_to_plain(dp: GaussianDP) -> dict[str, Any]:
        return {f.name: getattr(dp, f.name) for f in dataclasses.fields(dp)}

    # the settings through their constructor (it checks them); the accountant as its
    # attributes (per-client sums and the events so far: whatever it keeps)
    return [CheckpointType("dp.GaussianDP", GaussianDP, dp_to_plain, lambda p: GaussianDP(**p)),
            attribute_type("dp.GaussianAccountant", GaussianAccountant)]  # fmt: skip


def _matroids() -> list[CheckpointType]:
    from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid

    return [
        CheckpointType(
            "matroid.UniformMatroid", UniformMatroid,
            lambda m: {"n_elements": m.n_elements, "k": m.k},
            lambda p: UniformMatroid(p["n_elements"], p["k"]),
        ),
        CheckpointType(
            "matroid.PartitionMatroid", PartitionMatroid,
            lambda m: {"groups": m.groups, "capacities": m.capacities},
            lambda p: PartitionMatroid(p["groups"], p["capacities"]),
        ),
    ]  # fmt: skip


def _fedsm() -> list[CheckpointType]:
    from flower_app.algorithms.fedsm.alg2 import Alg2Round, FedSMAlg2Server
    from flower_app.algorithms.fedsm.core import FedSMRound, FedSMServer
    from flower_app.algorithms.fedsm.modes import FedSMParams, FedSMRun

    return _attributes("fedsm", FedSMRun, FedSMParams, FedSMServer, FedSMRound, FedSMAlg2Server,
                       Alg2Round)  # fmt: skip


def _robust() -> list[CheckpointType]:
    from flower_app.algorithms.robust.history import GainHistory

    return _attributes("robust", GainHistory)  # FedSM's history clamp (fedsm-history-clamp)


def _fedcg() -> list[CheckpointType]:
    from flower_app.algorithms.fedcg.continuous import FedCGRound, FedCGServer, LocalSteps
    from flower_app.algorithms.fedcg.discrete_greedy import (
        DiscreteGreedyRound,
        DiscreteGreedyServer,
    )

    return _attributes("fedcg", FedCGServer, FedCGRound, LocalSteps, DiscreteGreedyServer,
                       DiscreteGreedyRound)  # fmt: skip


def _maxfl() -> list[CheckpointType]:
    from flower_app.algorithms.maxfl.appeal import AppealServer, PoolCache
    from flower_app.algorithms.maxfl.participation import ParticipationSampler
    from flower_app.algorithms.maxfl.server_rules import (
        FedAvgRule,
        MaxFLRule,
        MWFedRule,
        QFFLRule,
        ScaffoldRule,
    )

    return _attributes("maxfl", AppealServer, PoolCache, ParticipationSampler, FedAvgRule,
                       MaxFLRule, QFFLRule, ScaffoldRule, MWFedRule)  # fmt: skip


def _fedsubavg() -> list[CheckpointType]:
    from flower_app.algorithms.fedsubavg.core import (
        AdamConfig,
        ClientSampler,
        ScaffoldApprox,
        ServerAdam,
        SubmodelAveraging,
    )

    return _attributes("fedsubavg", ClientSampler, SubmodelAveraging, ServerAdam,
                       ScaffoldApprox, AdamConfig)  # fmt: skip


def _attributes(family: str, *classes: type) -> list[CheckpointType]:
    return [attribute_type(f"{family}.{cls.__name__}", cls) for cls in classes]


#: family -> (the package or module its classes live in, its types). A type is stored as
#: ``<family>.<name>``; a family's modules are imported only when a checkpoint holds (or a
#: state being written is) one of its types, so a FedSM run never imports MaxFL's (torch)
FAMILIES: dict[str, tuple[str, Callable[[], list[CheckpointType]]]] = {
    "dp": ("flower_app.algorithms.common.gaussian_dp", _dp),
    "matroid": ("flower_app.submodular.matroids", _matroids),
    "fedsm": ("flower_app.algorithms.fedsm", _fedsm),
    "robust": ("flower_app.algorithms.robust", _robust),
    "fedcg": ("flower_app.algorithms.fedcg", _fedcg),
    "maxfl": ("flower_app.algorithms.maxfl", _maxfl),
    "fedsubavg": ("flower_app.algorithms.fedsubavg", _fedsubavg),
}
