"""``run_sim.py`` help matches the code: every command says what it does, every option has
help, and each ``--dataset`` offers exactly the datasets that command can run.

"Can run" is the registry's datasets of the command's algorithm family, less those the
command has no way to load: your own files (``data-file`` kinds) where the command has no
``--data-file`` option, and, for ``privacy fedsubavg-dp``, the torch tasks, which refuse
DP. Both exclusions are checked against the code here (the run refuses them), so a change
in what the app can run fails this test until the help follows.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from direct import run_direct
from flower_app.config import AppConfig
from flower_app.registry import ALGORITHMS, algorithms_of
from reproductions import cli, fedcg, fedsm_modes, fedsubavg, maxfl, privacy

ROOT = Path(__file__).resolve().parents[1]

#: dataset kinds that read run_config data-file (docs/own-data.md)
OWN_FILES = {"facility-location-table", "coverage-sets", "image-clients", "rating-table"}
#: datasets of the torch tasks (FedSubAvg's LSTM and DIN)
TORCH = {"sent140", "synthetic-sent140", "amazon", "synthetic-amazon"}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command and subcommand parser, by its command line (``fedsm-modes alg2-curve``)."""
    roots = {
        "": cli.build_parser(),
        "fedsm-modes": fedsm_modes.build_parser(),
        "fedcg": fedcg.build_parser(),
        "maxfl": maxfl.build_parser(),
        "fedsubavg": fedsubavg.build_parser(),
        "privacy": privacy.build_parser(),
    }
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    if sub not in cli.FAMILY_SWEEPS:  # placeholders: the modules parse them
                        walk(f"{name} {sub}".strip(), child)

    for name, parser in roots.items():
        walk(name, parser)
    return out


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[-1]: a for a in parser._actions if a.option_strings}


def _family(algorithm: str, *exclude: set[str]) -> list[str]:
    skip = set().union(*exclude) if exclude else set()
    return [d for d in ALGORITHMS[algorithm].datasets if d not in skip]


#: command -> (an algorithm it runs, the datasets it can run)
EXPECTED = {
    "fedsm-sweep": ("fedsm", _family("fedsm")),  # has --data-file: your own files too
    "fedsm-modes alg2-curve": ("fedsm", _family("fedsm", OWN_FILES)),
    "fedsm-modes amplification": ("fedsm", _family("fedsm", OWN_FILES)),
    "fedsubavg": ("fedsubavg", _family("fedsubavg", OWN_FILES)),
    "privacy fedsm-dp": ("fedsm", _family("fedsm", OWN_FILES)),
    "privacy maxfl-dp": ("maxfl", _family("maxfl", OWN_FILES)),
    "privacy fedsubavg-dp": ("fedsubavg", _family("fedsubavg", OWN_FILES, TORCH)),
}


def test_every_command_says_what_it_does_and_every_option_has_help() -> None:
    parsers = _parsers()
    assert set(EXPECTED) <= set(parsers)
    for name, parser in parsers.items():
        assert parser.prog == f"run_sim.py {name}".strip(), name  # not maxfl-sweep
        assert parser.description and len(parser.description) > 40, name
        parser.format_help()  # renders (no stray % in a help text)
        for flag, action in _options(parser).items():
            if flag != "--help":
                assert action.help and action.help.strip(), f"run_sim.py {name} {flag}"
    top = parsers[""].format_help()
    for command in ("fedsm-sweep", "plot", *cli.FAMILY_SWEEPS):
        assert command in top
    for paper in ("FedSM", "FedCG", "MaxFL", "FedSubAvg"):  # not only FedSM's sweeps
        assert paper in parsers[""].description


def test_each_dataset_option_offers_exactly_the_datasets_its_command_can_run() -> None:
    parsers = _parsers()
    with_dataset = {n for n, p in parsers.items() if "--dataset" in _options(p)}
    assert with_dataset == set(EXPECTED)
    for name, (algorithm, expected) in EXPECTED.items():
        options = _options(parsers[name])
        assert list(options["--dataset"].choices) == expected, name
        assert options["--dataset"].default in (None, *expected), name
        own = OWN_FILES & set(ALGORITHMS[algorithm].datasets)
        # your own files are offered exactly where the command can load one
        assert ("--data-file" in options) == (own <= set(expected)), name
        for dataset in expected:  # the app accepts each for the command's family
            AppConfig.from_run_config({"algorithm": algorithm, "dataset": dataset})
    maxfl_options = _options(parsers["maxfl"])
    assert list(maxfl_options["--algorithms"].choices) == list(algorithms_of("maxfl"))
    fedsubavg_options = _options(parsers["fedsubavg"])
    assert set(fedsubavg_options["--algorithms"].choices) == set(algorithms_of("fedsubavg"))
    assert set(maxfl.SETTING_HELP) == set(maxfl.SETTINGS)


@pytest.mark.parametrize(
    ("algorithm", "dataset"),
    [("fedsm", "facility-location-table"), ("fedsm", "coverage-sets"),
     ("maxfl", "image-clients"), ("fedsubavg", "rating-table")],
)  # fmt: skip
def test_own_file_datasets_cannot_run_without_a_data_file(tmp_path, algorithm, dataset) -> None:
    cfg = AppConfig.from_run_config(
        {"algorithm": algorithm, "dataset": dataset, "output-dir": str(tmp_path)}
    )
    with pytest.raises(ValueError, match="data-file"):
        run_direct(cfg)


@pytest.mark.parametrize("dataset", sorted(TORCH & {"synthetic-sent140", "synthetic-amazon"}))
def test_the_torch_tasks_refuse_the_dp_that_fedsubavg_dp_sweeps(tmp_path, dataset) -> None:
    run = {"algorithm": "fedsubavg", "dataset": dataset, "fsa-dp-noise": 1.0,
           "secure-aggregation": True, "output-dir": str(tmp_path)}  # fmt: skip
    with pytest.raises(ValueError, match="fsa-dp-noise"):  # when the config is made
        run_direct(AppConfig.from_run_config(run))
    assert not list(tmp_path.iterdir())


def test_family_help_is_reached_through_run_sim() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run_sim.py"), "maxfl", "--help"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert proc.stdout.startswith("usage: run_sim.py maxfl")
    assert "--algorithms ALGORITHM" in proc.stdout and "pfedme" in proc.stdout
