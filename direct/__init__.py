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

from flower_app.config import AppConfig, ConfigError
from flower_app.registry import ALGORITHMS
from flower_app.results import run_session

__all__ = ["check_direct_engine", "run_direct"]


def check_direct_engine(cfg: AppConfig) -> None:
    """Refuse, for the direct engine, the settings that only ``flwr run`` can honour.

    Raises
    ------
    ConfigError
        With ``server-data = "none"`` (the direct engine holds the data) or
        ``resume = true`` (it does not checkpoint; it reruns in seconds).
    """
    if cfg.server_data == "none":
        raise ConfigError("server-data = 'none' is for the ServerApp; the direct engine holds data")
    if cfg.resume:
        raise ConfigError("resume = true is for flwr run; the direct engine reruns in seconds")


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

    Raises
    ------
    ConfigError
        For the settings only ``flwr run`` honours (:func:`check_direct_engine`), before
        anything is written.
    """
    check_direct_engine(cfg)
    family = importlib.import_module(f"direct.{ALGORITHMS[cfg.algorithm].family}")
    with run_session():  # summary.json's run-wall-time counts from here
        return family.direct_run(cfg, progress=progress)
