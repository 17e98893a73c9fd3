"""Fashion-MNIST and EMNIST loaders (official IDX format, files written by the tests) and the
MaxFL partitions: Dirichlet, 5 clusters of 2 labels, seen/unseen, label flips, 60/40 splits."""

from __future__ import annotations

import os

import numpy as np
import pytest

from flower_app.datasets.emnist import EMNIST_FILES, class_shares, load_emnist, synthetic_emnist
from flower_app.datasets.federated import build_federation
from flower_app.datasets.fmnist import load_fmnist
from flower_app.datasets.idx import read_idx, write_idx
from flower_app.datasets.images import LabelledImages
from flower_app.datasets.paths import DataFormatError, DatasetNotFoundError


def _write_fmnist(root, n_train=60000, n_test=10000, seed=0):
    rng = np.random.default_rng(seed)
    folder = root / "fashion-mnist"
    for split, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", np.zeros((n, 28, 28), np.uint8))
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    return folder


def test_idx_round_trip_and_format_errors(tmp_path) -> None:
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a.gz", a), ndim=3), a)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a", a, compress=False)), a)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05abc")
    with pytest.raises(DataFormatError, match="5 bytes"):
        read_idx(tmp_path / "bad")
    (tmp_path / "junk").write_bytes(b"hello world")
    with pytest.raises(DataFormatError, match="not an IDX file"):
        read_idx(tmp_path / "junk")
    with pytest.raises(DataFormatError, match="expected 1"):
        read_idx(tmp_path / "a.gz", ndim=1)


def test_fmnist_reads_the_official_layout(tmp_path) -> None:
    _write_fmnist(tmp_path)
    data = load_fmnist(tmp_path, download=False)
    assert data.images.shape == (70000, 784) and data.labels.shape == (70000,)
    assert data.n_classes == 10 and data.name == "fmnist"


def test_fmnist_missing_files_say_where_to_put_them(tmp_path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        load_fmnist(tmp_path, download=False)
    text = str(err.value)
    assert str(tmp_path / "fashion-mnist" / "train-images-idx3-ubyte.gz") in text
    assert "missing" in text and "data-dir" in text


def test_fmnist_wrong_size_is_a_format_error(tmp_path) -> None:
    _write_fmnist(tmp_path, n_train=100, n_test=10)
    with pytest.raises(DataFormatError, match="expected 60000 images"):
        load_fmnist(tmp_path, download=False)


def test_emnist_byclass_loader_transposes_and_checks(tmp_path) -> None:
    folder = tmp_path / "emnist"
    img = np.zeros((3, 28, 28), np.uint8)
    img[:, 0, 5] = 255  # stored transposed: row 0, column 5 -> MNIST row 5, column 0
    for stem in EMNIST_FILES:
        n = 3 if "train" in stem else 2
        if "images" in stem:
            write_idx(folder / f"{stem}.gz", img[:n])
        else:
            write_idx(folder / f"{stem}.gz", np.array([0, 35, 61][:n]))
    data = load_emnist(tmp_path)
    assert data.images.shape == (5, 784) and data.n_classes == 62
    assert data.images[0].reshape(28, 28)[5, 0] == 255
    assert data.labels.tolist() == [0, 35, 61, 0, 35]
    write_idx(folder / f"{EMNIST_FILES[1]}.gz", np.array([0, 62, 1]))
    from flower_app.datasets import emnist

    emnist._load.cache_clear()
    with pytest.raises(DataFormatError, match="exceeds 61"):
        load_emnist(tmp_path)
    with pytest.raises(DatasetNotFoundError, match="EMNIST ByClass"):
        load_emnist(tmp_path / "nowhere")


def test_synthetic_emnist_is_calibrated() -> None:
    shares = class_shares()
    assert shares.shape == (62,) and shares.sum() == pytest.approx(1.0)
    assert shares[:10].sum() == pytest.approx(0.5)  # "more digits than letters" (assumed half)
    data = synthetic_emnist(20)
    assert data.name == "synthetic-emnist" and len(data) == round(814255 * 20 / 1000)
    assert 0.12 < data.images.mean() / 255 < 0.22  # EMNIST's mean pixel ≈ 0.17


def _toy_data(n=6000, classes=10, seed=0) -> LabelledImages:
    rng = np.random.default_rng(seed)
    return LabelledImages("toy", rng.integers(0, 256, (n, 784), dtype=np.uint8),
                          rng.integers(0, classes, n), classes)  # fmt: skip


def test_clusters_partition_gives_two_labels_per_client() -> None:
    fed = build_federation(_toy_data(), 10, 10, "clusters", label_flip=0.3, data_seed=1)
    assert fed.n_clients == 20 and fed.flipped.sum() == 6
    pairs = set()
    for k in range(20):
        c = fed.client(k)
        labels = set(np.concatenate([c.y_train, c.y_test]).tolist())
        if c.flipped:
            labels = {9 - y for y in labels}
        assert len(labels) == 2
        pairs.add(tuple(sorted(labels)))
        n = c.y_train.size + c.y_test.size
        assert c.y_train.size == round(0.6 * n)
    assert len(pairs) == 5 and len(set().union(*pairs)) == 10  # disjoint clusters
    rows = np.concatenate(fed.train_idx + fed.test_idx)
    assert np.unique(rows).size == rows.size  # no example in two clients


def test_dirichlet_partition_and_standardisation() -> None:
    fed = build_federation(_toy_data(), 10, 5, "dirichlet", alpha=0.5, data_seed=0)
    sizes = [fed.train_idx[k].size + fed.test_idx[k].size for k in range(15)]
    assert min(sizes) >= 50 and sum(sizes) == 6000
    c = fed.client(0)
    assert c.x_train.dtype == np.float32 and c.x_train.shape[1] == 784
    assert abs(float(np.concatenate([fed.client(k).x_train for k in range(15)]).mean())) < 0.05
    same = build_federation(_toy_data(), 10, 5, "dirichlet", alpha=0.5, data_seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(fed.train_idx, same.train_idx, strict=True))


@pytest.mark.realdata
def test_real_fmnist_table1_partition() -> None:
    data = load_fmnist(os.environ.get("FLOWER_APP_DATA", ""), download=False)
    assert len(data) == 70000 and np.bincount(data.labels).tolist() == [7000] * 10
    fed = build_federation(data, 100, 100, "dirichlet", alpha=0.5)
    assert fed.n_clients == 200 and fed.flipped.sum() == 60
    assert min(i.size for i in fed.train_idx) >= 30
