"""``run_sim.py``: the command line of every sweep and reproduction.

``run_sim.py COMMAND ...`` runs one of the commands below; ``run_sim.py COMMAND --help``
lists its options. Every command runs on the direct engine (in-process, the same math the
Flower strategies run; ``fedsm-sweep --engine flower`` uses Flower's simulation engine
instead) and writes one run folder per run plus CSV tables and figures into its output folder.

``fedsm-sweep``, ``plot``
    FedSM Algorithm 1 over a K x d x seed grid (:mod:`reproductions.fedsm`).
``fedsm-modes``
    FedSM Algorithm 2 curves and the amplification (Algorithm 3) against Algorithm 1
    (:mod:`reproductions.fedsm_modes`).
``fedcg``
    FedCG, FedCG+ and the federated discrete greedy, by preset
    (:mod:`reproductions.fedcg`).
``maxfl``
    MaxFL and its seven baselines in the paper's settings (:mod:`reproductions.maxfl`).
``fedsubavg``
    FedSubAvg and the submodel baselines, Tables 2-3 and Figures 3-4
    (:mod:`reproductions.fedsubavg`).
``privacy``
    Utility against privacy: FedSM's shuffle-model DP, MaxFL's and FedSubAvg's Gaussian DP
    (:mod:`reproductions.privacy`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from reproductions import fedsm
from reproductions.sweep import run_command

__all__ = ["FAMILY_SWEEPS", "build_parser", "main"]

#: subcommand -> (module whose ``main(argv)`` runs it, one line of help)
FAMILY_SWEEPS = {
    "fedsm-modes": (
        "reproductions.fedsm_modes",
        "FedSM Algorithm 2 curves and the amplification (Algorithm 3) against Algorithm 1",
    ),
    "fedcg": (
        "reproductions.fedcg",
        "FedCG, FedCG+ and the federated discrete greedy on a preset (MovieLens-1M, DBLP "
        "stand-in): ratio to greedy by k",
    ),
    "maxfl": (
        "reproductions.maxfl",
        "MaxFL and its seven baselines in the paper's settings (Tables 1-4, EMNIST): "
        "accuracy and GM-Appeal",
    ),
    "fedsubavg": (
        "reproductions.fedsubavg",
        "FedSubAvg and the submodel baselines (Tables 2-3, Figures 3-4): rounds to target",
    ),
    "privacy": (
        "reproductions.privacy",
        "utility against privacy: FedSM shuffle-model DP, MaxFL and FedSubAvg Gaussian DP",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``run_sim.py`` (the family commands as entries only).

    ``fedsm-sweep`` and ``plot`` are parsed here; the family commands parse their own
    arguments (``run_sim.py maxfl --help``): :func:`main` hands them everything after the
    command's name.
    """
    parser = argparse.ArgumentParser(
        prog="run_sim.py",
        description="Sweeps and reproductions of the four papers (FedSM, FedCG, MaxFL, "
        "FedSubAvg): each command runs many configurations on the direct engine (in-process, "
        "the same math as the Flower strategies) and writes run folders, CSV tables and "
        "figures into its output folder.",
        epilog="run_sim.py COMMAND --help lists a command's options. Recorded results and "
        "the command behind each: docs/reproductions/.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fedsm.add_parsers(sub)
    for name, (_, text) in FAMILY_SWEEPS.items():
        sub.add_parser(name, add_help=False, help=f"{text} (run_sim.py {name} --help)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status (0 on success).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in FAMILY_SWEEPS:
        module = importlib.import_module(FAMILY_SWEEPS[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    return run_command(build_parser(), fedsm.run_command, argv)
