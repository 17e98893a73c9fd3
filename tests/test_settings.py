"""The run_config declarations: validators, family and unknown-key errors, generated files."""

from __future__ import annotations

import math
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from flower_app.config import AppConfig, ConfigError
from flower_app.registry import ALGORITHMS, FAMILIES, algorithms_of
from flower_app.settings import (
    SETTINGS,
    Setting,
    defaults,
    help_text,
    markdown_reference,
    parse,
    toml_table,
)
from flower_app.settings.__main__ import check, main

ROOT = Path(__file__).resolve().parents[1]

#: one algorithm and dataset per family, to set that family's keys
FAMILY_RUN = {
    family: {
        "algorithm": algorithms_of(family)[0],
        "dataset": ALGORITHMS[algorithms_of(family)[0]].datasets[-1],
    }
    for family in FAMILIES
}


def _run_of(key: str) -> dict:
    family = SETTINGS[key].family
    return {} if family == "common" else dict(FAMILY_RUN[family])


# ------------------------------------------------------------------ defaults round-trip
def test_defaults_round_trip_for_every_family() -> None:
    cfg = AppConfig.from_run_config({})
    # config.json records the common keys and the run's own family's, no other family's
    assert cfg.to_dict() == {**defaults("common"), **defaults(cfg.family)}
    assert AppConfig.from_run_config(defaults()) == cfg
    for family, run in FAMILY_RUN.items():
        cfg = AppConfig.from_run_config(run)
        assert cfg.family == family
        again = AppConfig.from_run_config(cfg.to_dict())
        assert again == cfg and hash(again) == hash(cfg)
        for key, value in cfg.to_dict().items():
            if key not in run:
                assert type(value) is type(SETTINGS[key].default), key


def test_app_config_fields_are_the_common_keys() -> None:
    names = {f.name.replace("_", "-") for f in fields(AppConfig)} - {"extra"}
    assert names == set(defaults("common"))
    assert set(defaults()) == set(defaults("common")).union(*(defaults(f) for f in FAMILIES))


def test_values_come_back_typed() -> None:
    cfg = AppConfig.from_run_config(
        {**FAMILY_RUN["fedsubavg"], "fsa-lr": 1, "fsa-rounds": 3.0, "run-name": 2024, "k": 4.0}
    )
    assert cfg.get("fsa-lr") == 1.0 and type(cfg.get("fsa-lr")) is float
    assert cfg.get("fsa-rounds") == 3 and type(cfg.get("fsa-rounds")) is int
    assert cfg.run_name == "2024" and cfg.k == 4 and type(cfg.k) is int
    # a count keeps its type: the int is a count, the float a fraction
    assert AppConfig.from_run_config({"clients-per-round": 1}).clients_per_round == 1
    assert type(AppConfig.from_run_config({"clients-per-round": 1.0}).clients_per_round) is float


# ------------------------------------------------------------------ one validator per type
@pytest.mark.parametrize(
    ("override", "match"),
    [
        # int
        ({"k": 2.5}, "'k' = 2.5: expected an integer"),
        ({"k": True}, "'k' = True: expected an integer"),
        ({"k": 0}, "'k' = 0: must be >= 1"),
        ({"maxfl-unseen-users": -2}, "'maxfl-unseen-users' = -2: must be >= -1"),
        ({"fedsm-j-from": 2}, "'fedsm-j-from' = 2: must be <= 1"),
        # float
        ({"round-timeout": "ten"}, "'round-timeout' = 'ten': expected a number"),
        ({"round-timeout": math.nan}, "'round-timeout' = nan: expected a number"),
        ({"maxfl-eps": 0}, "'maxfl-eps' = 0.0: must be > 0"),
        ({"maxfl-label-flip": 1.5}, "'maxfl-label-flip' = 1.5: must be <= 1"),
        ({"maxfl-train-fraction": 1.0}, "'maxfl-train-fraction' = 1.0: must be < 1"),
        ({"fsa-adam-beta1": -0.1}, "'fsa-adam-beta1' = -0.1: must be >= 0"),
        # count or fraction
        ({"clients-per-round": 0.0}, "'clients-per-round' = 0.0: a float is a fraction"),
        ({"elements-per-client": -3}, "'elements-per-client' = -3: a count must be >= 1"),
        ({"clients-per-round": "all"}, "'clients-per-round' = 'all': expected a float fraction"),
        # choice
        ({"fedsm-mode": "turbo"}, "'fedsm-mode' = 'turbo' is not known; choose one of: alg1, "),
        ({"fsa-weighting": True}, "'fsa-weighting' = True is not known"),
        # bool
        ({"fedcg-fill-base": 1}, "'fedcg-fill-base' = 1: expected true or false"),
        ({"fedcg-fill-base": "true"}, "'fedcg-fill-base' = 'true': expected true or false"),
        # str
        ({"run-name": ["a"]}, "'run-name' = \\['a'\\]: expected a string"),
        ({"output-dir": False}, "'output-dir' = False: expected a string"),
    ],
)
def test_each_validator_names_the_key_the_value_and_what_is_valid(override, match) -> None:
    (key,) = override
    with pytest.raises(ConfigError, match=match):
        AppConfig.from_run_config({**_run_of(key), **override})


_BAD = {"int": "x", "float": "x", "count": "x", "choice": "x", "bool": "x", "str": None}


@pytest.mark.parametrize("key", list(SETTINGS))
def test_every_key_refuses_a_value_of_the_wrong_type(key) -> None:
    run = _run_of(key)
    assert parse({**run, key: SETTINGS[key].default})[key] == SETTINGS[key].default
    with pytest.raises(ConfigError, match=f"run_config '{key}' = "):
        parse({**run, key: _BAD[SETTINGS[key].kind]})


def test_an_inconsistent_declaration_is_a_bug() -> None:
    with pytest.raises(ValueError, match="inconsistent declaration"):
        Setting("x", "str", "", "common", "bounded string", ge=0)
    with pytest.raises(ValueError, match="inconsistent declaration"):
        Setting("x", "choice", "a", "common", "choice without choices")
    with pytest.raises(ConfigError, match="'x' = 0: must be >= 1"):
        Setting("x", "int", 0, "common", "default out of range", ge=1)
    with pytest.raises(ValueError, match="default of the wrong type"):
        Setting("x", "float", 1, "common", "an int default for a float")


# ------------------------------------------------------------------ families and unknown keys
def test_a_key_of_another_family_is_refused_with_its_family() -> None:
    with pytest.raises(ConfigError) as err:
        AppConfig.from_run_config({"fsa-rounds": 5})
    assert str(err.value).startswith(
        "run_config 'fsa-rounds' belongs to fedsubavg (algorithm = fedsubavg, fedavg-sub, "
    )
    assert "this run's algorithm is 'fedsm'" in str(err.value)
    with pytest.raises(ConfigError, match="'maxfl-lr' belongs to maxfl .*'fedcg-rounds' belongs"):
        AppConfig.from_run_config({**FAMILY_RUN["fedsubavg"], "maxfl-lr": 1.0, "fedcg-rounds": 1})
    with pytest.raises(ConfigError, match="'fedcg-fill-base' belongs to fedcg"):
        AppConfig.from_run_config({"fedcg-fill-base": 1})  # 1 is not true


def test_keys_of_other_families_at_their_defaults_pass() -> None:
    # flwr run sends every key of the pyproject table, each family's at its default
    run = {**defaults(), **FAMILY_RUN["maxfl"], "fsa-lr": 0.1, "fedcg-rounds": 100.0}
    cfg = AppConfig.from_run_config(run)
    assert cfg.algorithm == "maxfl"
    # ... and are not recorded: config.json holds the keys that applied to the run
    assert "fsa-lr" not in cfg.to_dict() and "fedcg-rounds" not in cfg.to_dict()
    assert cfg.get("maxfl-rounds") == defaults("maxfl")["maxfl-rounds"]


def test_an_unknown_key_is_named_with_the_closest_known_one() -> None:
    with pytest.raises(ConfigError, match="'fsa-round' \\(did you mean 'fsa-rounds'\\?\\)"):
        AppConfig.from_run_config({"fsa-round": 5})
    with pytest.raises(ConfigError, match="'clients_per_round' \\(did you mean 'clients-per-r"):
        AppConfig.from_run_config({"clients_per_round": 5, "zzz": 1})
    with pytest.raises(ConfigError, match="key 'zzz' is not known; every key is listed in docs/"):
        AppConfig.from_run_config({"zzz": 1})


def test_the_dataset_must_fit_the_algorithm() -> None:
    with pytest.raises(ConfigError, match="'fmnist' does not fit algorithm 'fedsm'"):
        AppConfig.from_run_config({"dataset": "fmnist"})


def test_check_reads_a_run_config_string_like_flwr() -> None:
    assert check("k=20 fedsm-mode='alg2'") == "run_config ok: k=20, fedsm-mode=\"alg2\""
    with pytest.raises(ConfigError, match="did you mean 'fedsm-mode'"):
        check("fedsm-mod='alg2'")
    assert main(["--check", "fsa-lr=0.5"]) == 2


# ------------------------------------------------------------------ generated files
def test_pyproject_table_has_the_declared_keys_and_defaults() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    table = pyproject["tool"]["flwr"]["app"]["config"]
    assert list(table) == list(SETTINGS)
    for key, value in table.items():
        default = SETTINGS[key].default
        assert value == default and type(value) is type(default), key
    assert tomllib.loads(toml_table())["tool"]["flwr"]["app"]["config"] == defaults()


def test_docs_configuration_md_is_generated_from_the_declarations() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert text == markdown_reference(), (
        "docs/configuration.md is stale: python -m flower_app.settings --markdown "
        "> docs/configuration.md"
    )
    for key in SETTINGS:
        assert f"| `{key}` |" in text


def test_main_prints_the_generated_text(capsys) -> None:
    assert main(["--toml"]) == 0
    assert capsys.readouterr().out == toml_table()


def test_choices_agree_with_the_algorithm_modules() -> None:
    from flower_app.algorithms.fedcg import continuous as fedcg
    from flower_app.algorithms.fedsm import amplify as fedsm_amplify
    from flower_app.algorithms.fedsm import modes as fedsm_modes
    from flower_app.algorithms.fedsubavg import core as fedsubavg
    from flower_app.runners import fedcg as fedcg_runner

    def choices(key: str) -> set[str]:
        return set(SETTINGS[key].choices)

    assert choices("fedsm-mode") == set(fedsm_modes.MODES)
    assert choices("fedsm-inner") == set(fedsm_modes.INNER)
    assert choices("fedsm-rounding") == set(fedsm_modes.ROUNDINGS)
    assert choices("fedsm-surrogate") == set(fedsm_amplify.SURROGATES)
    assert choices("fedcg-gradient") == set(fedcg.GRADIENTS)
    # the oblivious roundings of x, and the runner's verified rounding
    assert choices("fedcg-rounding") == {*fedcg.ROUNDINGS, fedcg_runner.VERIFIED}
    assert choices("fsa-weighting") == set(fedsubavg.WEIGHTINGS)
    assert set(algorithms_of("fedsubavg")) == set(fedsubavg.ALGORITHM_NAMES)


def test_run_sim_help_comes_from_the_declarations() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_sim", ROOT / "run_sim.py")
    run_sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_sim)
    sweep = run_sim.build_parser()._subparsers._group_actions[0].choices["fedsm-sweep"]
    helps = {a.dest: a.help for a in sweep._actions}
    for key in ("dataset", "data-dir", "num-users", "matroid", "partition-capacity"):
        assert helps[key.replace("-", "_")] == help_text(key)


def test_the_rules_constants_agree_with_the_code_they_stand_for() -> None:
    from flower_app.algorithms.common.gaussian_dp import DP_ALGORITHMS
    from flower_app.algorithms.fedsm.modes import FedSMParams
    from flower_app.privacy.topology import MIN_NODES
    from flower_app.settings import rules

    assert rules.DP_ALGORITHMS == DP_ALGORITHMS
    assert rules.SECURE_MIN_NODES == MIN_NODES
    # fedsm-eta's declared range and 1/x rule are the algorithm's own
    for eta in (0.1, 0.2, 0.25, 0.5, 0.3, 0.15, 1 / 3, 0.999):
        try:
            FedSMParams(eta=eta).steps()
            ok = True
        except ValueError:
            ok = False
        try:
            SETTINGS["fedsm-eta"].validate(eta)
            declared = True
        except ConfigError:
            declared = False
        assert declared == ok, eta


@pytest.mark.parametrize(
    ("run", "named"),
    [
        ({"data-file": "/d/ratings.csv"}, "'data-file' = '/d/ratings.csv' is read only by"),
        ({"dataset": "facility-location-table", "data-file": "/d/x.npz"}, "files ending in .csv"),
        ({"dataset": "coverage-sets", "data-file": "/d/sets.txt", "data-columns": "u,i"},
         "'data-columns' = 'u,i' names a table's columns"),
        ({"algorithm": "maxfl", "dataset": "fmnist", "item-names": "/d/n.csv"},
         "'item-names' names the items of"),
        ({"algorithm": "maxfl", "dataset": "fmnist", "data-columns": "a,b,c"},
         "'data-columns' = 'a,b,c' names the columns of a table"),
        ({"algorithm": "fed-discrete-greedy", "clients-per-round": 5}, "would be ignored"),
        ({"algorithm": "maxfl", "dataset": "fmnist", "maxfl-dp-noise": 1.0},
         "needs maxfl-participation = 'all'"),
        ({"algorithm": "fedsubavg", "dataset": "synthetic-amazon", "resume": True,
          "run-name": "r"}, "['resume'] not supported on the torch tasks"),
        ({"algorithm": "fedsubavg", "dataset": "movielens-rating", "fsa-embedding-init":
          "glove"}, "is for the Sent140 LSTM"),
    ],
)
def test_a_rule_across_keys_is_refused_when_the_config_is_made(run, named) -> None:
    with pytest.raises(ConfigError) as err:
        AppConfig.from_run_config(run)
    assert named in str(err.value)
