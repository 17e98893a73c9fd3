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

from direct import run_direct
from flower_app.config import AppConfig
from flower_app.datasets.idx import write_idx
from flower_app.datasets.own import OwnDataError
from tests.support.local_grid import LocalGrid


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
@pytest.mark.long
def test_flwr_run_on_your_own_images(flower_cli, tmp_path) -> None:
    run = {**IMAGE_RUN, "data-file": str(_images(tmp_path))}
    result = flower_cli.run(run, num_supernodes=3)
    assert result.status == "finished:completed", result.output
    direct = run_direct(
        AppConfig.from_run_config({**run, "output-dir": str(tmp_path), "run-name": "d"})
    )
    assert result.summary["model-digest"] == direct["model-digest"]


# ---------------------------------------------------------------------------- ratings
def _table(tmp_path, n_users: int = 30, seed: int = 2):
    """Clicks that depend on the item (a planted preference) and a little on the category."""
    rng = np.random.default_rng(seed)
    taste = rng.normal(0, 1.5, size=40)
    rows = []
    for u in range(n_users):
        for item in rng.choice(40, size=int(rng.integers(6, 14)), replace=False):
            cat = f"cat-{item % 5}"
            p = 1 / (1 + np.exp(-taste[item]))
            rows.append((f"user{u:02d}", int(item), cat, int(rng.random() < p)))
    path = tmp_path / "clicks.csv"
    pd.DataFrame(rows, columns=["who", "item", "category", "clicked"]).to_csv(path, index=False)
    return path


RATING_RUN = {
    "algorithm": "fedsubavg", "dataset": "rating-table",
    "data-columns": "who,item,category,clicked", "clients-per-round": 6, "fsa-rounds": 5,
    "seed": 3,
}  # fmt: skip


def test_your_own_rating_table_on_both_engines(tmp_path) -> None:
    from flower_app.runners import fedsubavg as runner
    from flower_app.runners.fedsubavg import load_task

    run = {**RATING_RUN, "data-file": str(_table(tmp_path)), "output-dir": str(tmp_path)}
    cfg = AppConfig.from_run_config({**run, "run-name": "direct"})
    task = load_task(cfg)
    assert task.n_params == 1 + 40 + 5 and task.n_clients == 30  # bias, items, categories
    assert task.layout.blocks()["category"] == slice(41, 46)
    direct = run_direct(cfg)
    assert direct["train-loss"] < direct["initial-train-loss"]  # it learns the preference
    assert direct["feature-heat-dispersion"] > 1
    grid_cfg = AppConfig.from_run_config({**run, "run-name": "grid"})
    flower = runner.server_run(LocalGrid(3, grid_cfg.to_dict()), grid_cfg)
    assert flower["train-loss-by-round"] == pytest.approx(direct["train-loss-by-round"],
                                                          rel=1e-9)  # fmt: skip


@pytest.mark.parametrize(
    ("content", "columns", "match"),
    [
        ("who,item,clicked\nu1,3,1\nu2,4,2\n", "who,item,clicked",
         r"clicks\.csv, line 3: label 'clicked' = '2'; expected 0 or 1"),
        ("who,item,clicked\nu1,,1\n", "who,item,clicked", r"line 2: column 'item' is empty"),
        ("who,item,clicked\nu1,3,1\n", "who,clicked", "needs at least 3 names"),
        ("who,item,clicked\nu1,3,1\n", "user,item,label", "no column 'user'"),
    ],
)  # fmt: skip
def test_a_malformed_rating_table_names_file_line_and_format(tmp_path, content, columns, match):
    from flower_app.datasets.own_ratings import load_rating_table

    path = tmp_path / "clicks.csv"
    path.write_text(content)
    with pytest.raises(OwnDataError, match=match):
        load_rating_table(str(path), columns, 0)


@pytest.mark.flwr
@pytest.mark.long
def test_flwr_run_on_your_own_rating_table(flower_cli, tmp_path) -> None:
    run = {**RATING_RUN, "data-file": str(_table(tmp_path))}
    result = flower_cli.run(run, num_supernodes=3)
    assert result.status == "finished:completed", result.output
    direct = run_direct(
        AppConfig.from_run_config({**run, "output-dir": str(tmp_path), "run-name": "d"})
    )
    assert result.summary["train-loss-by-round"] == pytest.approx(
        direct["train-loss-by-round"], rel=1e-9
    )
