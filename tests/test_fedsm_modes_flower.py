"""`flwr run .` of FedSM Algorithm 2 and amplification: same S as the direct engine."""

from __future__ import annotations

import json

import pytest

from direct import run_direct
from flower_app.config import AppConfig

pytestmark = pytest.mark.flwr

TINY = {
    "num-users": 40,
    "num-elements": 60,
    "k": 8,
    "clients-per-round": 1.0,
    "seed": 4,
}


@pytest.mark.parametrize(
    ("override", "num_supernodes"),
    [
        ({"fedsm-mode": "alg2", "elements-per-client": 100, "fedsm-tau": 0.01}, 3),
        pytest.param(
            {
                "fedsm-mode": "amplified",
                "fedsm-eta": 0.5,
                "fedsm-inner": "alg2",
                "elements-per-client": 100,
                "fedsm-tau": 0.01,
                "fedsm-surrogate": "sampled",
            },
            7,
            marks=pytest.mark.long,
        ),
        pytest.param(
            {"fedsm-mode": "amplified", "fedsm-eta": 0.5, "elements-per-client": 0.3},
            5,
            marks=pytest.mark.long,
        ),
    ],
    ids=["alg2", "amplified-alg2-sampled", "amplified-alg1-exact"],
)
def test_flower_and_direct_engines_agree(flower_cli, tmp_path, override, num_supernodes) -> None:
    config = {**TINY, **override}
    run = flower_cli.run(config, num_supernodes=num_supernodes)
    assert run.status == "finished:completed", run.output
    cfg = AppConfig.from_run_config({**config, "output-dir": str(tmp_path), "run-name": "d"})
    direct = run_direct(cfg)
    flower = run.summary
    assert flower["selected"] == direct["selected"]
    assert flower["communication-rounds"] == direct["communication-rounds"]
    assert flower["objective"] == pytest.approx(direct["objective"])
    rows = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert all(r["bad-replies"] == 0 and r["bytes-up"] > 0 and r["bytes-down"] > 0 for r in rows)
    assert flower["bytes-up"] == sum(r["bytes-up"] for r in rows)
    if override["fedsm-mode"] == "alg2":  # blocks: fewer rounds than elements
        assert flower["communication-rounds"] < flower["set-size"] == 8
