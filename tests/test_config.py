"""run_config validation: every bad value is named before any round starts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from flower_app.config import AppConfig, ConfigError
from flower_app.problems import build_matroid, load_problem
from flower_app.registry import ALGORITHMS, FAMILIES, algorithms_of

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_declares_every_key_the_app_reads() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    read = set()
    for family in FAMILIES:  # config.json holds the common keys + the run's family keys
        algorithm = ALGORITHMS[algorithms_of(family)[0]]
        run = {"algorithm": algorithm.name, "dataset": algorithm.datasets[-1]}
        read |= set(AppConfig.from_run_config(run).to_dict())
    assert read == set(declared)
    assert AppConfig.from_run_config(declared) == AppConfig.from_run_config({})


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"algorithm": "fedfoo"}, "'algorithm' = 'fedfoo' is not known; choose one of: .*fedsm"),
        ({"dataset": "mnist"}, "'dataset' = 'mnist' is not known"),
        ({"k": 0}, "'k' = 0: must be >= 1"),
        ({"k": 2.5}, "'k' = 2.5: expected an integer"),
        ({"seed": -3}, "'seed' = -3: must be >= 0"),
        ({"clients-per-round": 1.5}, "fraction and must lie in \\(0, 1\\]"),
        ({"elements-per-client": 0}, "a count must be >= 1"),
        ({"elements-per-client": "10%"}, "expected a float fraction"),
        ({"matroid": "graphic"}, "'matroid' = 'graphic' is not known"),
        ({"round-timeout": 0}, "'round-timeout' = 0.0: must be > 0"),
        ({"num-rounds": 5}, "key 'num-rounds' .*is not known"),
    ],
)
def test_bad_values_are_named(override, match) -> None:
    with pytest.raises(ConfigError, match=match):
        AppConfig.from_run_config(override)


def test_k_above_rank_is_refused() -> None:
    cfg = AppConfig.from_run_config({"matroid": "partition", "partition-capacity": 1, "k": 19})
    with pytest.raises(ConfigError, match="exceeds the rank 18 of the partition matroid"):
        build_matroid(cfg, load_problem(cfg))
    cfg = AppConfig.from_run_config({"k": 501})
    with pytest.raises(ConfigError, match="'k' = 501 exceeds the 500 elements of synthetic"):
        build_matroid(cfg, load_problem(cfg))


def test_missing_movielens_files_say_where_to_put_them(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLOWER_APP_OFFLINE", "1")
    cfg = AppConfig.from_run_config({"dataset": "movielens", "data-dir": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="ratings.dat") as err:
        load_problem(cfg)
    assert str(tmp_path / "ml-1m") in str(err.value)
