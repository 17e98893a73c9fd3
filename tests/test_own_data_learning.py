"""Your own data for the learning families: labelled images for MaxFL (``image-clients``)
and a rating table for FedSubAvg (``rating-table``); end to end on the direct engine, the
in-process grid with the real ClientApp and a real ``flwr run``, with errors that name the
file, the line (or array) and the format."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from flwr.supercore.task_identity import TaskIdentity
from local_grid import LocalGrid

from flower_app.config import AppConfig
from flower_app.datasets.idx import write_idx
from flower_app.datasets.own import OwnDataError
from flower_app.experiment import run_direct


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 1
    TaskIdentity.task_id = 1


# ---------------------------------------------------------------------------- images
def _images(tmp_path, n_clients: int = 8, per_client: int = 14, side: int = 6, seed: int = 0):
    """Three classes with class-dependent pixel means; clients named c10, c11, ..."""
    rng = np.random.default_rng(seed)
    n = n_clients * per_client
    y = rng.integers(0, 3, size=n)
    x = rng.normal(60 + 60 * y[:, None, None], 25, size=(n, side, side))
    client = np.repeat(np.arange(10, 10 + n_clients), per_client)
    path = tmp_path / "images.npz"
    np.savez(path, x=np.clip(x, 0, 255).astype(np.uint8), y=y, client=client)
    return path


IMAGE_RUN = {
    "algorithm": "maxfl", "dataset": "image-clients", "clients-per-round": 3,
    "maxfl-rounds": 3, "maxfl-eval-every": 3, "maxfl-mandatory-rounds": 3,
    "maxfl-solo-steps": 10, "maxfl-local-steps": 3, "maxfl-batch-size": 8, "seed": 1,
}  # fmt: skip


def test_your_own_image_clients_on_both_engines(tmp_path) -> None:
    from flower_app.runners import maxfl as runner

    run = {**IMAGE_RUN, "data-file": str(_images(tmp_path)), "output-dir": str(tmp_path)}
    direct = run_direct(AppConfig.from_run_config({**run, "run-name": "direct"}))
    config = json.loads((tmp_path / "direct" / "config.json").read_text())
    assert config["dataset"] == "image-clients" and config["data-file"].endswith("images.npz")
    # 8 clients in the file: 4 seen (the first client ids), 4 unseen; 36 pixels in, 3 classes
    with np.load(tmp_path / "direct" / "model.npz") as z:
        shapes = [z[k].shape for k in sorted(z.files, key=lambda s: int(s.split("_")[1]))]
    assert shapes[0] == (64, 36) and shapes[-1] == (3,)
    assert 0.0 <= direct["final"]["unseen-acc"] <= 1.0
    flower = runner.server_run(
        LocalGrid(3, {**run, "run-name": "grid"}),
        AppConfig.from_run_config({**run, "run-name": "grid"}),
    )
    assert flower["model-digest"] == direct["model-digest"]
    assert flower["final"] == pytest.approx(direct["final"], rel=1e-9, abs=1e-12)


def test_images_from_idx_files_are_partitioned_like_fmnist(tmp_path) -> None:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, size=2400)
    x = np.clip(rng.normal(50 * y[:, None, None], 30, size=(2400, 28, 28)), 0, 255)
    images = write_idx(tmp_path / "my-images-idx3-ubyte", x.astype(np.uint8))
    write_idx(tmp_path / "my-labels-idx1-ubyte", y.astype(np.uint8))
    run = {**IMAGE_RUN, "data-file": str(images), "num-users": 4, "output-dir": str(tmp_path),
           "run-name": "idx", "maxfl-label-flip": 0.0}  # fmt: skip
    summary = run_direct(AppConfig.from_run_config(run))
    assert summary["final"]["seen-acc"] > 0.0
    config = json.loads((tmp_path / "idx" / "config.json").read_text())
    assert config["maxfl-partition"] == "dirichlet"  # no client array: partitioned
    with np.load(tmp_path / "idx" / "model.npz") as z:
        assert {z[k].shape for k in z.files} >= {(64, 784), (4,)}


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"x": np.zeros((4, 3, 3), np.uint8)}, r"images\.npz: arrays \['x'\] lack \['y'\]"),
        ({"x": np.full((4, 2), 1.5), "y": np.zeros(4, int)}, "floats outside"),
        ({"x": np.zeros((4, 2), np.uint8), "y": np.array([0, 1, -1, 1])}, r"y\[2\] = -1"),
        ({"x": np.zeros((4, 2), np.uint8), "y": np.array([0, 1, 0, 1]),
          "client": np.array([5, 5, 5, 6])}, "client 6 has 1 image"),  # fmt: skip
    ],
)
def test_malformed_image_files_name_the_file_array_and_format(tmp_path, arrays, match) -> None:
    from flower_app.datasets.own_images import load_image_clients

    path = tmp_path / "images.npz"
    np.savez(path, **arrays)
    load_image_clients.cache_clear()
    with pytest.raises(OwnDataError, match=match) as err:
        load_image_clients(str(path))
    assert "expected" in str(err.value)
    lone = write_idx(tmp_path / "lone-images-idx3-ubyte", np.zeros((3, 4, 4), np.uint8))
    with pytest.raises(OwnDataError, match="labels file lone-labels-idx1-ubyte is missing"):
        load_image_clients(str(lone))


@pytest.mark.flwr
def test_flwr_run_on_your_own_images(flower_cli, tmp_path) -> None:
    run = {**IMAGE_RUN, "data-file": str(_images(tmp_path))}
    result = flower_cli.run(run, num_supernodes=3)
    assert result.status == "finished:completed", result.output
    direct = run_direct(
        AppConfig.from_run_config({**run, "output-dir": str(tmp_path), "run-name": "d"})
    )
    assert result.summary["model-digest"] == direct["model-digest"]
