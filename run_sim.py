"""Sweeps and reproductions of FedSM, FedCG, MaxFL and FedSubAvg: ``python run_sim.py --help``.

A thin command line over :mod:`reproductions.cli` (the commands, their options and what
they write are documented there and in ``run_sim.py COMMAND --help``). The FedSM sweep's
functions are re-exported for scripts and tests that load this file.
"""

from __future__ import annotations

import sys

from reproductions.cli import FAMILY_SWEEPS, build_parser, main
from reproductions.fedsm import (
    SWEEP_COLUMNS,
    make_figures,
    make_table,
    markdown_ratio_table,
    parse_count,
    read_sweep,
    rows_from_run_folder,
    spec_label,
)

__all__ = [
    "FAMILY_SWEEPS",
    "SWEEP_COLUMNS",
    "build_parser",
    "main",
    "make_figures",
    "make_table",
    "markdown_ratio_table",
    "parse_count",
    "read_sweep",
    "rows_from_run_folder",
    "spec_label",
]

if __name__ == "__main__":
    sys.exit(main())
