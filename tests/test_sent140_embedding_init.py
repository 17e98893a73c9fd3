"""``fsa-embedding-init``: the Sent140 LSTM's embedding from GloVe or the stand-in's planted model.

The GloVe file is written here in the official text format (25-D, gzip); the stand-in is tiny.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from direct import run_direct
from flower_app.algorithms.fedsubavg.torch_engine import initial_state
from flower_app.algorithms.fedsubavg.torch_tasks import (
    GLOVE_25D_FILE,
    Sent140Task,
    load_torch_task,
    sent140_embedding_init,
)
from flower_app.config import AppConfig, ConfigError
from flower_app.datasets.paths import DataFormatError, DatasetNotFoundError
from flower_app.datasets.sent140 import Tweet, build_sent140, synthetic_sent140
from flower_app.runners.fedsubavg_torch import _cached_task

TINY = {"dataset": "synthetic-sent140", "num-users": 8, "num-elements": 400,
        "algorithm": "fedsubavg", "clients-per-round": 4, "fsa-rounds": 1}  # fmt: skip


def _real_like() -> Sent140Task:
    tweets = [Tweet("a", i % 2, "good day :)" if i % 2 else "bad day") for i in range(41)]
    tweets += [Tweet("b", i % 2, "so good" if i % 2 else "so sad") for i in range(41)]
    return Sent140Task(build_sent140(tweets, name="sent140"), eval_samples=20)


def _write_glove(path: Path, words: dict[str, np.ndarray]) -> None:
    lines = [w + " " + " ".join(f"{v:.6f}" for v in vec) for w, vec in words.items()]
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


def test_glove_rows_are_written_and_the_rest_of_the_model_is_untouched(tmp_path: Path) -> None:
    task = _real_like()
    vocab = task.data.vocab
    rng = np.random.default_rng(0)
    known = {"good": rng.normal(size=25), "bad": rng.normal(size=25), "zebra": np.ones(25)}
    (tmp_path / "sent140").mkdir()
    _write_glove(tmp_path / "sent140" / f"{GLOVE_25D_FILE}.gz", known)
    table = sent140_embedding_init(task.data, "glove", str(tmp_path))
    assert table is not None and table.shape == (len(vocab) + 1, 25)
    for k, word in enumerate(vocab, start=1):
        if word in known:
            np.testing.assert_allclose(table[k], known[word], atol=1e-6)
        else:  # not in GloVe: stays PyTorch's random row
            assert np.isnan(table[k]).all()
    assert np.isnan(table[0]).all()  # padding
    glove = Sent140Task(task.data, eval_samples=20, embedding_init=table)
    torch.manual_seed(3)
    plain = task.make_model()
    torch.manual_seed(3)
    model = glove.make_model()
    emb, ref = model.embedding.weight.detach(), plain.embedding.weight.detach()
    given = torch.from_numpy(~np.isnan(table).all(axis=1))
    assert torch.equal(emb[given], torch.from_numpy(table[given.numpy()]))
    assert torch.equal(emb[~given], ref[~given]) and not emb[0].any()
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        if name != "embedding.weight":  # the LSTM and the output layer: the same draws
            assert torch.equal(p, q), name


def test_glove_errors_name_the_file(tmp_path: Path) -> None:
    task = _real_like()
    with pytest.raises(DatasetNotFoundError, match=GLOVE_25D_FILE.replace(".", r"\.")):
        sent140_embedding_init(task.data, "glove", str(tmp_path))
    (tmp_path / GLOVE_25D_FILE).write_text("good 0.1 0.2\n", encoding="utf-8")  # 2-D, not 25
    with pytest.raises(DataFormatError, match="line 1"):
        sent140_embedding_init(task.data, "glove", str(tmp_path))
    with pytest.raises(ValueError, match="planted sentiment model|planted model"):
        sent140_embedding_init(task.data, "planted")
    with pytest.raises(ValueError, match="choose one of"):
        sent140_embedding_init(task.data, "word2vec")
    with pytest.raises(ValueError, match="has shape"):
        Sent140Task(task.data, embedding_init=np.zeros((3, 25), dtype=np.float32))


def test_planted_init_holds_the_stand_ins_weights_through_the_app_config() -> None:
    cfg = AppConfig.from_run_config({**TINY, "fsa-embedding-init": "planted"})
    task = _cached_task(cfg)
    named = initial_state(task, 0)
    planted = task.data.planted
    assert planted is not None and np.count_nonzero(planted) > 0
    np.testing.assert_array_equal(named["embedding.weight"][:, 0], planted.astype(np.float32))
    plain = initial_state(_cached_task(AppConfig.from_run_config(TINY)), 0)
    assert np.array_equal(named["embedding.weight"][:, 1:], plain["embedding.weight"][:, 1:])
    assert not np.array_equal(named["embedding.weight"], plain["embedding.weight"])


def test_embedding_init_is_refused_where_it_does_not_apply(tmp_path: Path) -> None:
    amazon = {**TINY, "dataset": "synthetic-amazon", "num-elements": 300}
    with pytest.raises(ConfigError, match="is for the Sent140 LSTM"):
        run_direct(AppConfig.from_run_config({**amazon, "fsa-embedding-init": "planted"}))
    real = {**TINY, "dataset": "sent140", "data-dir": str(tmp_path)}
    with pytest.raises(ConfigError, match="'planted' is for the stand-in"):
        run_direct(AppConfig.from_run_config({**real, "fsa-embedding-init": "planted"}))
    with pytest.raises(ValueError, match="is for the Sent140 LSTM"):
        load_torch_task("synthetic-amazon", embedding_init="glove")
    with pytest.raises(DatasetNotFoundError, match="GloVe 25-D"):  # the stand-in has no GloVe
        load_torch_task("synthetic-sent140", str(tmp_path), num_users=8, num_elements=400,
                        embedding_init="glove")  # fmt: skip


def test_the_planted_stand_in_is_the_default_stand_in() -> None:
    """The planted weights are a view of the generator's model: the data do not change."""
    kw = {"data_seed": 1, "num_users": 8, "num_elements": 400}
    a = load_torch_task("synthetic-sent140", **kw).data
    b = load_torch_task("synthetic-sent140", embedding_init="planted", **kw).data
    assert np.array_equal(a.train_x, b.train_x) and np.array_equal(a.train_y, b.train_y)
    assert np.array_equal(a.planted, b.planted)
    c = synthetic_sent140(seed=1, n_clients=8, n_samples=429, vocab_size=400,
                          target_dispersion=1451 * 8 / 1473)  # fmt: skip
    assert np.array_equal(a.test_x, c.test_x) and np.array_equal(a.planted, c.planted)
