"""examples/fmnist-maxfl: a user's PyTorch Fashion-MNIST app, as FedAvg and switched to MaxFL.

Both versions run with `flwr run` on a private SuperLink (10 simulated nodes, 4 rounds, the
first 6,000 training images split over the clients by a Dirichlet(1.0) label partition,
2,000 test images). MaxFL optimises GM-Appeal, not the average loss, so its accuracy need
not beat FedAvg's; the issue asks for the same band: within 5 points.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from flower_app.simulation import FlwrRun, LocalSimulation

pytestmark = [pytest.mark.flwr, pytest.mark.realdata]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fmnist-maxfl"
FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz")


def data_dir() -> Path:
    folder = Path(os.environ.get("FLOWER_APP_DATA", "")) / "fashion-mnist"
    if not os.environ.get("FLOWER_APP_DATA") or not all((folder / f).is_file() for f in FILES):
        pytest.fail(f"set FLOWER_APP_DATA to a folder holding fashion-mnist/{FILES[0]}, ...")
    return folder


def fedavg_copy(root: Path) -> Path:
    """The example with its FedAvg starting point as the app's components."""
    project = root / "fmnist-fedavg"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    toml = project / "pyproject.toml"
    text = toml.read_text()
    for part in ("server_app", "client_app"):
        text = text.replace(f"fmnist_maxfl.{part}:app", f"fmnist_maxfl.{part}_fedavg:app")
    toml.write_text(text)
    return project


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[FlwrRun, float]]]:
    folder = data_dir()
    out: dict[str, tuple[FlwrRun, float]] = {}
    projects = {
        "MaxFLStrategy": EXAMPLE,
        "FedAvg": fedavg_copy(tmp_path_factory.mktemp("projects")),
    }
    for name, project in projects.items():
        cli = LocalSimulation(
            tmp_path_factory.mktemp(f"flwr-home-{name}"), tmp_path_factory.mktemp("runs"), project
        )
        try:
            # every node trains each round: with fraction-train < 1 the sampled nodes follow
            # the random node ids Flower's simulation assigns, so runs would differ
            config = {"data-dir": str(folder), "fraction-train": 1.0}
            out[name] = cli.run(config, num_supernodes=10, timeout=300)
        finally:
            cli.stop()
    yield out


@pytest.mark.parametrize("name", ["FedAvg", "MaxFLStrategy"])
def test_each_version_finishes(runs, name) -> None:
    run = runs[name]
    assert run.status == "finished:completed", run.output + run.details
    assert run.summary["strategy"] == name
    assert sorted(run.summary["accuracy"], key=int) == ["0", "1", "2", "3", "4"]
    assert f"{name}: test accuracy by round" in run.output


def test_maxfl_reaches_fedavgs_accuracy_band(runs) -> None:
    fedavg = runs["FedAvg"].summary["final"]
    maxfl = runs["MaxFLStrategy"].summary["final"]
    assert fedavg > 0.6  # it learned (chance is 0.1)
    assert abs(maxfl - fedavg) <= 0.05, (maxfl, fedavg)
