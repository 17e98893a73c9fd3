"""The direct engine's entry point (``direct.run_direct``): what it refuses, for every family.

The engines' results are compared family by family elsewhere (``test_*_engine.py``,
``test_*_flower.py``, the reproduction pins); here: the settings only ``flwr run`` honours
are refused before anything is written.
"""

from __future__ import annotations

import pytest

from direct import run_direct
from flower_app.config import AppConfig, ConfigError

#: one small configuration per family
FAMILIES = {
    "fedsm": {"algorithm": "fedsm", "k": 3},
    "fedcg": {"algorithm": "fedcg", "k": 3, "fedcg-rounds": 2},
    "maxfl": {"algorithm": "maxfl", "dataset": "synthetic-emnist", "maxfl-rounds": 1},
    "fedsubavg": {"algorithm": "fedsubavg", "dataset": "synthetic-movielens-rating",
                  "num-users": 20, "num-elements": 30, "fsa-rounds": 1},
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_resume_is_refused_before_the_run_folder_is_made(family, tmp_path) -> None:
    cfg = AppConfig.from_run_config(
        {**FAMILIES[family], "resume": True, "output-dir": str(tmp_path), "run-name": "r"}
    )
    with pytest.raises(ConfigError, match="resume = true is for flwr run"):
        run_direct(cfg)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("family", ["fedsm", "fedcg", "fedsubavg"])
def test_server_data_none_is_refused_before_the_run_folder_is_made(family, tmp_path) -> None:
    cfg = AppConfig.from_run_config(
        {**FAMILIES[family], "server-data": "none", "output-dir": str(tmp_path), "run-name": "n"}
    )
    with pytest.raises(ConfigError, match="the direct engine holds data"):
        run_direct(cfg)
    assert not (tmp_path / "n").exists()


def test_a_run_writes_the_direct_engines_run_folder(tmp_path) -> None:
    summary = run_direct(AppConfig.from_run_config(
        {**FAMILIES["fedsm"], "output-dir": str(tmp_path), "run-name": "d"}
    ))  # fmt: skip
    assert summary["engine"] == "direct" and len(summary["selected"]) == 3
    assert (tmp_path / "d" / "summary.json").exists()
