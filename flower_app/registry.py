"""Which algorithms the app runs, and where each one's runner lives.

A *runner* module (``flower_app/runners/<family>.py``) ties one algorithm family to the app:

``server_run(grid, cfg, run_config) -> dict``
    the ServerApp side: runs the strategy over the grid, writes the run folder, returns the
    summary.
``direct_run(cfg, run_config, progress=False) -> dict``
    the same algorithm on the direct engine (in-process, no Flower).
``make_client(cfg, context) -> NumPyClient``
    the ClientApp side: the node's client.
``summary_line(summary) -> str``
    the one line printed at the end of a run.

A family's own run_config keys (beyond the common ones of
:class:`~flower_app.config.AppConfig`) and their defaults are listed here, in its
:class:`Algorithm` entry, so that config validation needs no runner import; every key must
also be declared in ``[tool.flwr.app.config]`` (a test checks it). The runner parses them from
``cfg.extra``.

Runners are imported lazily, so a run of one family never imports another's dependencies.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["ALGORITHMS", "Algorithm", "family_keys", "load_runner"]

#: datasets of the submodular families (facility location and max coverage instances)
SUBMODULAR_DATASETS = ("synthetic-facility-location", "movielens", "dblp", "synthetic-dblp")


@dataclass(frozen=True)
class Algorithm:
    """One value of the ``algorithm`` run_config key.

    Attributes
    ----------
    name : str
        The key's value.
    description : str
        One line for error messages and the README.
    runner : str
        Module path of the runner.
    datasets : tuple of str
        Values of ``dataset`` the algorithm accepts.
    config : dict
        The family's own run_config keys and their defaults.
    """

    name: str
    description: str
    runner: str
    datasets: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm(
            "fedsm",
            "FedSM Algorithm 1: r rounds, K users, d sampled marginal gains per user",
            "flower_app.runners.fedsm",
            SUBMODULAR_DATASETS,
        ),
    )
}


def family_keys() -> dict[str, Any]:
    """Return every family-specific run_config key with its default."""
    keys: dict[str, Any] = {}
    for algorithm in ALGORITHMS.values():
        keys.update(algorithm.config)
    return keys


def load_runner(name: str) -> ModuleType:
    """Import and return the runner module of algorithm ``name``."""
    return importlib.import_module(ALGORITHMS[name].runner)
