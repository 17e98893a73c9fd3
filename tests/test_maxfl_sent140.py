"""MaxFL on Sent140 as the paper sets it up: GloVe reader, pooled tweet features, the
``synthetic-sent140`` stand-in, float features in the Federation, the 3-hidden-layer MLP (also
batched), and a short run on the direct engine equal to the in-process Flower grid."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity
from maxfl_configs import SMALL as MAXFL_SMALL

from direct import run_direct
from flower_app import registry
from flower_app.algorithms.maxfl.local_steps import local_sgd, local_sgd_batched, make_model
from flower_app.config import AppConfig, ConfigError
from flower_app.datasets.federated import federation_from_clients
from flower_app.datasets.images import LabelledImages
from flower_app.datasets.paths import DataFormatError, DatasetNotFoundError
from flower_app.datasets.sent140 import build_sent140
from flower_app.datasets.sent140_features import (
    GLOVE_FILE,
    SENT140_VECTORS,
    load_sent140_features,
    read_glove,
    synthetic_sent140_features,
    tweet_features,
)
from flower_app.models.mlp import SENT140_HIDDEN, init_weights, layer_sizes
from flower_app.runners import maxfl as runner
from flower_app.settings import SETTINGS
from tests.support.local_grid import LocalGrid

SENT140 = ("sent140", "synthetic-sent140")

SMALL = {
    **MAXFL_SMALL,
    "dataset": "synthetic-sent140",
    "num-users": 12,
    "maxfl-unseen-users": 12,
    "clients-per-round": 4,
}


def test_the_maxfl_family_lists_both_sent140_datasets() -> None:
    for name in registry.algorithms_of("maxfl"):
        assert set(SENT140) <= set(registry.ALGORITHMS[name].datasets)


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = 1


def _cfg(tmp_path, name: str, **extra) -> AppConfig:
    return AppConfig.from_run_config(
        {**SMALL, **extra, "output-dir": str(tmp_path), "run-name": name}
    )


# ------------------------------------------------------------------ GloVe reader
def _glove_lines(dim: int = 3) -> list[str]:
    return [f"w{i} " + " ".join(f"{0.5 * i + j:.2f}" for j in range(dim)) for i in range(4)]


@pytest.mark.parametrize("packed", [False, True])
def test_glove_reader_reads_plain_and_gzip(tmp_path, packed) -> None:
    text = "\n".join(["<user> 0.1 -0.2 3e-1", *_glove_lines()]) + "\n"
    path = tmp_path / ("g.txt.gz" if packed else "g.txt")
    if packed:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    got = read_glove(path, 3)
    assert list(got) == ["<user>", "w0", "w1", "w2", "w3"]
    np.testing.assert_array_equal(got["<user>"], np.float32([0.1, -0.2, 0.3]))
    assert got["w2"].dtype == np.float32 and got["w2"].shape == (3,)
    assert list(read_glove(path, 3, words={"w1", "zzz"})) == ["w1"]


def test_glove_reader_names_the_malformed_line(tmp_path) -> None:
    path = tmp_path / "g.txt"
    path.write_text("\n".join([*_glove_lines(), "bad 1.0 oops 2.0"]) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"g\.txt, line 5: a value is not a number"):
        read_glove(path, 3)


def test_glove_reader_names_a_wrong_dimension(tmp_path) -> None:
    path = tmp_path / "g.txt"
    path.write_text("\n".join(_glove_lines(3)) + "\nshort 1.0 2.0\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"line 5: 2 values after the word; expected 3"):
        read_glove(path, 3)
    with pytest.raises(DataFormatError, match=r"line 1: 3 values after the word; expected 200"):
        read_glove(path, 200)


def test_real_sent140_without_glove_names_the_file(tmp_path) -> None:
    with pytest.raises(DatasetNotFoundError, match=GLOVE_FILE):
        load_sent140_features(tmp_path)


# ------------------------------------------------------------------ features
def test_pooling_averages_known_tokens_and_keeps_accounts_with_50_tweets() -> None:
    from flower_app.datasets.sent140 import Tweet

    tweets = [Tweet("a", i % 2, "good day" if i % 2 else "bad zz") for i in range(50)]
    tweets += [Tweet("b", 1, "good") for _ in range(49)]
    task = build_sent140(tweets, min_samples=1, test_fraction=0.0, max_len=140)
    table = np.zeros((len(task.vocab) + 1, 2), np.float32)
    known = np.zeros(len(task.vocab) + 1, bool)
    vec = {"good": [1.0, 0.0], "day": [0.0, 1.0], "bad": [-1.0, 0.0]}  # "zz": no vector
    for k, word in enumerate(task.vocab, start=1):
        if word in vec:
            table[k], known[k] = vec[word], True
    feats = tweet_features(task, table, known)
    assert feats.users == ("a",) and feats.features.shape == (50, 2)
    assert feats.features.dtype == np.float32 and set(feats.clients.tolist()) == {0}
    pos = feats.features[feats.labels == 1]
    neg = feats.features[feats.labels == 0]
    np.testing.assert_allclose(pos, np.tile([0.5, 0.5], (25, 1)))
    np.testing.assert_allclose(neg, np.tile([-1.0, 0.0], (25, 1)))


def test_stand_in_has_enough_clients_of_50_tweets_and_200_d_features() -> None:
    feats = synthetic_sent140_features(0)
    sizes = np.bincount(feats.clients)
    assert feats.n_clients == sizes.size == 1303 >= 308 + 619
    assert sizes.min() >= 50
    assert feats.features.shape == (feats.labels.size, 200)
    assert feats.features.dtype == np.float32 and np.all(np.isfinite(feats.features))
    assert 0.3 < feats.labels.mean() < 0.7


def test_planted_vectors_carry_the_planted_sentiment_in_coordinate_0() -> None:
    """``maxfl-sent140-vectors = 'planted'``: only coordinate 0 changes, and it separates the
    classes (the mean planted weight of a tweet's tokens); the random vectors' does not."""
    random = synthetic_sent140_features(0, n_clients=150)
    planted = synthetic_sent140_features(0, n_clients=150, vectors="planted")
    np.testing.assert_array_equal(planted.labels, random.labels)
    np.testing.assert_array_equal(planted.features[:, 1:], random.features[:, 1:])
    assert not np.array_equal(planted.features[:, 0], random.features[:, 0])

    def gap(f: np.ndarray) -> float:  # class means of coordinate 0, in its standard deviations
        x = f[:, 0].astype(np.float64)
        return float((x[planted.labels == 1].mean() - x[planted.labels == 0].mean()) / x.std())

    assert gap(planted.features) > 0.5 > abs(gap(random.features))
    assert SETTINGS["maxfl-sent140-vectors"].choices == SENT140_VECTORS
    with pytest.raises(ValueError, match="choose one of"):
        synthetic_sent140_features(0, n_clients=150, vectors="glove")


def test_planted_vectors_are_refused_outside_the_stand_in() -> None:
    def settings_of(dataset: str) -> runner.MaxFLSettings:
        return runner.settings(
            AppConfig.from_run_config(
                {"algorithm": "maxfl", "dataset": dataset, "maxfl-sent140-vectors": "planted"}
            )
        )

    assert settings_of("synthetic-sent140").sent140_vectors == "planted"
    for dataset in ("sent140", "synthetic-emnist"):
        with pytest.raises(ConfigError, match="'maxfl-sent140-vectors' = 'planted'.*use 'random'"):
            settings_of(dataset)


def test_float_features_are_standardised_not_divided_by_255() -> None:
    rng = np.random.default_rng(0)
    x = (3.0 + 0.01 * rng.normal(size=(120, 5))).astype(np.float32)
    data = LabelledImages("f", x, rng.integers(0, 2, 120), 2)
    clients = np.repeat(np.arange(4), 30)
    fed = federation_from_clients(data, clients, 2, 2, 0.5, 0.6, 0)
    assert fed.mean == pytest.approx(float(x.astype(np.float64).mean()))
    assert fed.std == pytest.approx(float(x.astype(np.float64).std()))
    rows = np.concatenate([fed.client(k).x_train for k in range(4)] +
                          [fed.client(k).x_test for k in range(4)])  # fmt: skip
    assert rows.dtype == np.float32
    assert abs(rows.mean()) < 1e-3 and rows.std() == pytest.approx(1.0, rel=1e-3)
    assert fed.flipped.sum() == 2
    flipped = int(np.flatnonzero(fed.flipped)[0])
    raw = data.labels[fed.train_idx[flipped]]
    np.testing.assert_array_equal(fed.client(flipped).y_train, 1 - raw)


# ------------------------------------------------------------------ model
def test_sent140_mlp_has_three_hidden_layers_and_batched_training_matches() -> None:
    w = init_weights(0, 200, 2, SENT140_HIDDEN)
    assert layer_sizes(w) == (200, (128, 86, 30), 2)
    rng = np.random.default_rng(1)
    data = [(rng.normal(size=(n, 200)).astype(np.float32), rng.integers(0, 2, n)) for n in (40, 40)]
    single = [make_model(w, 2, 0.2) for _ in data]
    batched = [make_model(w, 2, 0.2) for _ in data]
    for k, (m, (x, y)) in enumerate(zip(single, data, strict=True)):
        local_sgd(m, x, y, 5, 0.05, 16, np.random.default_rng([k, 3]))
    local_sgd_batched(batched, data, 5, 0.05, 16, [np.random.default_rng([k, 3]) for k in (0, 1)])
    for a, b in zip(single, batched, strict=True):
        for p, q in zip(a.get_weights(), b.get_weights(), strict=True):
            np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="2 outputs; the data has 10"):
        make_model(w, 10, 0.2)


# ------------------------------------------------------------------ runs
def test_settings_use_the_papers_sent140_defaults() -> None:
    def of(dataset: str) -> runner.MaxFLSettings:
        return runner.settings(AppConfig.from_run_config({"algorithm": "maxfl",
                                                          "dataset": dataset}))  # fmt: skip

    s = of("synthetic-sent140")
    assert (s.n_seen, s.n_unseen, s.n_classes) == (308, 619, 2)
    assert (s.n_in, s.hidden) == (200, (128, 86, 30))
    images = of("synthetic-emnist")
    assert (images.n_in, images.hidden) == (784, (64, 30))


def test_fedsubavg_and_maxfl_both_take_synthetic_sent140() -> None:
    fsa = AppConfig.from_run_config({"algorithm": "fedsubavg", "dataset": "synthetic-sent140"})
    mfl = AppConfig.from_run_config({"algorithm": "maxfl", "dataset": "synthetic-sent140"})
    assert (fsa.family, mfl.family) == ("fedsubavg", "maxfl")
    assert registry.load_runner("maxfl") is runner
    assert registry.load_runner("fedsubavg").__name__ == "flower_app.runners.fedsubavg"


def test_short_run_direct_equals_in_process_flower_grid(tmp_path) -> None:
    direct = run_direct(_cfg(tmp_path, "direct"))
    with np.load(tmp_path / "direct" / "model.npz") as z:
        model = [z[k] for k in sorted(z.files, key=lambda s: int(s.split("_")[1]))]
    assert [m.shape for m in model] == [(128, 200), (128,), (86, 128), (86,), (30, 86), (30,),
                                        (2, 30), (2,)]  # fmt: skip
    assert all(np.all(np.isfinite(m)) for m in model)
    final = direct["final"]
    for key in ("seen-gm-appeal", "unseen-gm-appeal", "seen-acc", "unseen-acc"):
        assert math.isfinite(final[key])
    assert 0.0 <= final["seen-gm-appeal"] <= 1.0 and 0.0 <= final["unseen-acc"] <= 1.0
    flower = runner.server_run(LocalGrid(3, SMALL), _cfg(tmp_path, "grid"))
    assert flower["model-digest"] == direct["model-digest"]
    assert flower["final"] == pytest.approx(final, rel=1e-9, abs=1e-12)


def test_an_empty_opt_in_pool_is_said_once_and_trains_nobody(tmp_path, caplog) -> None:
    """On the stand-in every solo model (200 steps) fits its ~30 training tweets better than
    the chance-level global model, so after the mandatory round no client opts in; the
    rounds then train nobody (the pool cannot refill: the model no longer changes), and the
    run says so once instead of silently ending as round 1's model."""
    import json
    import logging

    from flower_app.algorithms.maxfl.participation import EMPTY_POOL

    cfg = _cfg(tmp_path, "empty", **{"maxfl-rounds": 4, "maxfl-solo-steps": 200})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run_direct(cfg)
    rows = [json.loads(x) for x in (tmp_path / "empty" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["pool-size"], r["sampled"]) for r in rows[1:]] == [(12, 4)] + [(0, 0)] * 3
    assert [r.getMessage() for r in caplog.records].count(EMPTY_POOL) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run_direct(_cfg(tmp_path, "all", **{"maxfl-rounds": 2, "maxfl-participation": "all"}))
    assert EMPTY_POOL not in [r.getMessage() for r in caplog.records]
