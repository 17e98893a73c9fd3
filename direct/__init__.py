"""The direct engine: each algorithm family's rounds in one process, without Flower.

The same server steps and client computations as the Flower engine (the runners'
``server_run`` and ``make_client``, :mod:`flower_app.runners`), called in-process: the speed
reference of the Flower engine and the workhorse of ``run_sim.py``, ``reproductions/``,
``benchmarks/`` and the tests, which hold the two engines equal. It is part of the
repository, not of the installed package (pip and the FAB ship ``flower_app/`` only):
``flower_app`` never imports it, it imports ``flower_app``.

:func:`run_direct` runs one configuration and writes the same run folder as ``flwr run``
(``engine = "direct"`` in its ``config.json``); ``direct.<family>`` holds each family's
``direct_run`` and the in-process loops behind it.
"""

from __future__ import annotations

import importlib

from flower_app.config import AppConfig
from flower_app.registry import ALGORITHMS
from flower_app.results import run_session

__all__ = ["run_direct"]


def run_direct(cfg: AppConfig, progress: bool = False) -> dict:
    """Run one experiment on the direct engine (in-process) and write its run folder.

    Parameters
    ----------
    cfg : AppConfig
        Validated configuration; ``cfg.algorithm`` picks the family
        (``direct.<family>.direct_run``).
    progress : bool, optional
        Show a progress bar over rounds.

    Returns
    -------
    dict
        The run's summary (as in ``summary.json``).
    """
    family = importlib.import_module(f"direct.{ALGORITHMS[cfg.algorithm].family}")
    with run_session():  # summary.json's run-wall-time counts from here
        return family.direct_run(cfg, progress=progress)
