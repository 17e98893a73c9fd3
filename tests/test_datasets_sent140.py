"""Sentiment140 (FedSubAvg's sentiment task): the official CSV and LEAF JSON read from files
the tests write (plain and gzip, malformed lines named), the paper's partition rules, and the
calibrated stand-in's statistics beside the paper's Table 1."""

from __future__ import annotations

import csv
import gzip
import json

import numpy as np
import pytest

from flower_app.datasets.sent140 import (
    PAPER_TABLE1,
    Tweet,
    build_sent140,
    find_sent140_files,
    load_sent140,
    read_leaf_json,
    read_sentiment140_csv,
    synthetic_sent140,
    tokenize,
)


def _rows(n_users: int = 5, seed: int = 0) -> list[list[str]]:
    """Official-layout rows: accounts with 45, 41, 40, 10 and 60 tweets."""
    rng = np.random.default_rng(seed)
    sizes = [45, 41, 40, 10, 60][:n_users]
    out = []
    for u, size in enumerate(sizes):
        for k in range(size):
            polarity = "4" if rng.random() < 0.5 else "0"
            mood = "great" if polarity == "4" else "bad"
            text = f"@friend café #{k} is {mood} http://t.co/x{k} !"
            out.append([polarity, str(1000 * u + k), "Mon Apr 06 22:19:45 PDT 2009",
                        "NO_QUERY", f"acct{u}", text])  # fmt: skip
    return out


def _write_csv(path, rows, gz: bool = False) -> None:
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="latin-1", newline="") as fh:
        csv.writer(fh, quoting=csv.QUOTE_ALL).writerows(rows)


def test_tokens() -> None:
    assert tokenize("@bob I can't wait!! http://x.co/a :(") == [
        "<user>", "i", "can't", "wait", "!", "!", "<url>", ":", "(",
    ]  # fmt: skip


@pytest.mark.parametrize("gz", [False, True])
def test_official_csv_is_read_with_its_encoding_and_partitioned_as_the_paper(tmp_path, gz):
    path = tmp_path / ("training.1600000.processed.noemoticon.csv" + (".gz" if gz else ""))
    rows = _rows()
    _write_csv(path, rows, gz)
    tweets = list(read_sentiment140_csv(path))
    assert len(tweets) == len(rows) and tweets[0].user == "acct0"
    assert "café" in tweets[0].text  # latin-1, not mangled
    assert {t.label for t in tweets} == {0, 1}
    task = load_sent140(path, split_seed=3)
    # more than 40 samples: 45, 41 and 60 stay; 40 and 10 go
    assert task.users == ("acct0", "acct1", "acct4")
    assert task.stats()["samples"] == 45 + 41 + 60
    assert int(np.diff(task.test_ptr).sum()) == round(0.2 * 146)  # 80/20 over all samples
    # the vocabulary is the training tokens; heat counts the clients using each token
    train_tokens = {task.vocab[i - 1] for i in np.unique(task.train_x) if i > 0}
    assert train_tokens == set(task.vocab)
    great = task.vocab.index("great") + 1
    users_with_great = sum(great in task.client_tokens(c) for c in range(task.n_clients))
    assert task.heat[great] == users_with_great >= 1
    assert task.dispersion() >= 1


@pytest.mark.parametrize(
    ("row", "match"),
    [
        (["4", "1", "date", "q", "acct"], r"line 3: 5 fields"),
        (["2", "1", "date", "q", "acct", "neutral"], r"line 3: polarity '2'"),
    ],
)
def test_a_malformed_csv_line_is_named(tmp_path, row, match) -> None:
    path = tmp_path / "s140.csv"
    _write_csv(path, _rows(1)[:2] + [row])
    with pytest.raises(ValueError, match=match):
        list(read_sentiment140_csv(path))


def test_leaf_json_gives_the_same_task_as_the_csv(tmp_path) -> None:
    rows = _rows()
    users = sorted({r[4] for r in rows})
    data = {
        "users": users,
        "num_samples": [sum(r[4] == u for r in rows) for u in users],
        "user_data": {
            u: {"x": [[r[1], r[2], r[3], r[4], r[5]] for r in rows if r[4] == u],
                "y": [1 if r[0] == "4" else 0 for r in rows if r[4] == u]}
            for u in users
        },
    }  # fmt: skip
    leaf = tmp_path / "all_data_0.json"
    leaf.write_text(json.dumps(data))
    csv_path = tmp_path / "s140.csv"
    _write_csv(csv_path, sorted(rows, key=lambda r: r[4]))
    a, b = load_sent140(leaf, split_seed=1), load_sent140(csv_path, split_seed=1)
    assert a.users == b.users and a.vocab == b.vocab
    assert np.array_equal(a.train_x, b.train_x) and np.array_equal(a.test_y, b.test_y)
    bad = dict(data)
    bad["user_data"] = {**data["user_data"], "acct0": {"x": data["user_data"]["acct0"]["x"]}}
    leaf.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="user 'acct0' has no x/y"):
        list(read_leaf_json(leaf))
    leaf.write_text('{"users": ["a"],\n "user_data": ')
    with pytest.raises(ValueError, match=r"line 2: not JSON"):
        list(read_leaf_json(leaf))


def test_build_keeps_accounts_above_40_and_truncates_tweets() -> None:
    tweets = [Tweet("a", 1, " ".join(["w"] * 30))] * 41 + [Tweet("b", 0, "x")] * 40
    task = build_sent140(tweets, max_len=25)
    assert task.users == ("a",) and task.train_x.shape[1] == 25
    assert (task.train_x != 0).sum(axis=1).max() == 25
    with pytest.raises(ValueError, match="no account has 41"):
        build_sent140(tweets[41:])


def test_the_stand_in_matches_table_1_and_carries_a_learnable_signal() -> None:
    task = synthetic_sent140(seed=0)
    stats = task.stats()
    assert stats["clients"] == PAPER_TABLE1["clients"]
    assert abs(stats["samples"] / PAPER_TABLE1["samples"] - 1) < 0.01
    paper = PAPER_TABLE1["feature-heat-dispersion"]
    assert abs(stats["feature-heat-dispersion"] / paper - 1) < 0.05
    assert task.name == "synthetic-sent140"
    assert all(np.diff(task.train_ptr) + np.diff(task.test_ptr) > 40)  # more than 40 each
    # a bag-of-words log-count ratio learnt on train beats the majority class on test
    v = len(task.vocab) + 1
    pos = np.bincount(task.train_x[task.train_y == 1].ravel(), minlength=v) + 1.0
    neg = np.bincount(task.train_x[task.train_y == 0].ravel(), minlength=v) + 1.0
    r = np.log(pos / pos.sum()) - np.log(neg / neg.sum())
    r[0] = 0.0
    pred = (r[task.test_x].sum(axis=1) > 0).astype(int)
    majority = max(task.test_y.mean(), 1 - task.test_y.mean())
    assert (pred == task.test_y).mean() > majority + 0.05
    # the planted token weights, kept by id, classify the test tweets better than the counts
    # (measured 0.679: the generator's model with the account biases reaches 0.716)
    assert task.planted is not None and task.planted.shape == (v,) and task.planted[0] == 0
    assert 0.08 < np.mean(task.planted[1:] != 0) < 0.12  # 10 % of the tokens are weighted
    planted = (task.planted[task.test_x].sum(axis=1) > 0).astype(int)
    assert (planted == task.test_y).mean() > (pred == task.test_y).mean()
    assert (
        build_sent140([Tweet("a", 1, "w")] * 41, name="real").planted is None
    )  # real data has no planted model


def _leaf(rows: list[list[str]]) -> dict:
    users = sorted({r[4] for r in rows})
    return {
        "users": users,
        "num_samples": [sum(r[4] == u for r in rows) for u in users],
        "user_data": {
            u: {"x": [r[1:] for r in rows if r[4] == u],
                "y": [1 if r[0] == "4" else 0 for r in rows if r[4] == u]}
            for u in users
        },
    }  # fmt: skip


def test_every_leaf_file_is_read_by_fedsubavgs_loader(tmp_path) -> None:
    """LEAF writes several all_data_*.json: FedSubAvg's loader read only the first."""
    from flower_app.algorithms.fedsubavg.torch_tasks import load_torch_task

    rows = _rows()  # accounts 0, 1, 4 qualify (45, 41, 60 tweets)
    folder = tmp_path / "sent140"
    folder.mkdir()
    (folder / "all_data_0.json").write_text(json.dumps(_leaf([r for r in rows if r[4] <= "acct1"])))
    (folder / "all_data_1.json").write_text(json.dumps(_leaf([r for r in rows if r[4] > "acct1"])))
    task = load_torch_task("sent140", str(tmp_path), data_seed=1)
    assert task.data.users == ("acct0", "acct1", "acct4")
    csv_path = tmp_path / "s140.csv"
    _write_csv(csv_path, sorted(rows, key=lambda r: r[4]))
    whole = load_sent140(csv_path, split_seed=1)
    assert np.array_equal(task.data.train_y, whole.train_y)
    # LEAF's own data folder: all_data/ is found as well
    (folder / "all_data").mkdir()
    for f in sorted(folder.glob("*.json")):
        f.rename(folder / "all_data" / f.name)
    assert load_sent140(folder, split_seed=1).users == ("acct0", "acct1", "acct4")


def test_leafs_train_test_split_is_kept(tmp_path) -> None:
    rows = [r for r in _rows() if r[4] == "acct0"]  # 45 tweets
    folder = tmp_path / "sent140"
    for part, chunk in (("train", rows[:36]), ("test", rows[36:])):
        (folder / part).mkdir(parents=True)
        (folder / part / f"all_data_0_niid_0_keep_0_{part}_9.json").write_text(
            json.dumps(_leaf(chunk))
        )
    task = load_sent140(folder)
    assert task.users == ("acct0",) and task.train_y.size == 36 and task.test_y.size == 9
    assert find_sent140_files(folder).train and find_sent140_files(folder).test


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        (["all_data_0.json", "training.1600000.processed.noemoticon.csv"], "keep one source"),
        (["all_data_0.json", "all_data/all_data_1.json"], "keep one copy"),
        (["train/a.json"], "test/ has none"),
        ([], "none of"),
    ],
)
def test_an_ambiguous_or_empty_sent140_folder_is_refused(tmp_path, layout, match) -> None:
    for name in layout:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        find_sent140_files(tmp_path)


def test_a_leaf_file_is_read_exactly_or_refused(tmp_path) -> None:
    data = _leaf(_rows(2))
    path = tmp_path / "all_data_0.json"
    for change, match in (
        (lambda d: d.update(num_samples=d["num_samples"][:-1]), "'num_samples' has 1 entries"),
        (lambda d: d.update(users=d["users"][:1]), "'acct1' is in 'user_data' but not in"),
        (lambda d: d.update(users=d["users"] + d["users"][:1]), "listed twice"),
        (lambda d: d["user_data"]["acct0"]["x"][0].append("extra"), "sample"),
    ):
        bad = json.loads(json.dumps(data))
        change(bad)
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=match):
            list(read_leaf_json(path))
