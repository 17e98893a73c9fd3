"""Sweeps: many runs of one family, their CSV tables and plots (``run_sim.py``'s commands).

:mod:`reproductions.cli` is the command line; each family's module holds its sweep, its
report and its options. A command offers, in ``--dataset``, exactly the datasets it can run:
:func:`runnable_datasets` of its algorithm.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from flower_app.registry import ALGORITHMS

__all__ = ["FILE_DATASETS", "data_overrides", "runnable_datasets"]

#: dataset kinds read from run_config ``data-file`` (your own data, docs/own-data.md): a
#: command without a ``--data-file`` option cannot run them
FILE_DATASETS = ("facility-location-table", "coverage-sets", "image-clients", "rating-table")


def runnable_datasets(
    algorithm: str, data_file: bool = False, exclude: Iterable[str] = ()
) -> tuple[str, ...]:
    """Return the datasets a sweep command of ``algorithm`` can run, in the registry's order.

    Parameters
    ----------
    algorithm : str
        An algorithm of :data:`flower_app.registry.ALGORITHMS` (its family's datasets).
    data_file : bool, optional
        Whether the command has a ``--data-file`` option (else :data:`FILE_DATASETS` are
        left out).
    exclude : iterable of str, optional
        Datasets the command cannot run for another reason (say why where it is called).

    Returns
    -------
    tuple of str
        The ``--dataset`` choices.
    """
    skip = set(exclude) | (set() if data_file else set(FILE_DATASETS))
    return tuple(d for d in ALGORITHMS[algorithm].datasets if d not in skip)


def data_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Return the run_config entries of ``--data-dir``, ``--num-users`` and ``--num-elements``.

    Only the options given (non-empty, non-zero): the others keep their run_config default.
    """
    given = {
        "data-dir": args.data_dir,
        "num-users": args.num_users,
        "num-elements": args.num_elements,
    }
    return {key: value for key, value in given.items() if value}
