"""Amazon Electronics (FedSubAvg's CTR task): reviews JSON lines, rating_only.csv and the
metadata read from files the tests write (gzip, malformed lines named), the authors'
partition rules, and the calibrated stand-in's statistics beside the paper's Table 1."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from flower_app.datasets.amazon import (
    PAPER_TABLE1,
    TIME_CUTOFF,
    Rating,
    build_amazon,
    read_metadata,
    read_rating_only_csv,
    read_reviews_json,
    synthetic_amazon,
)


def _ratings() -> list[Rating]:
    """u1: 45 ratings (every 3rd a 5), u2: 39 ratings (dropped), u3: 130 clicks then more."""
    out = []
    for k in range(45):
        out.append(Rating("u1", f"i{k % 7}", 5.0 if k % 3 == 0 else 3.0,
                          TIME_CUTOFF - 45 + k + (10 if k >= 40 else 0)))  # fmt: skip
    out += [Rating("u2", "i1", 5.0, 1000 + k) for k in range(39)]
    out += [Rating("u3", f"j{k}", 5.0, 1_300_000_000 + k) for k in range(140)]
    return out


def test_reviews_json_lines_plain_and_gzip(tmp_path) -> None:
    lines = [
        json.dumps({"reviewerID": r.user, "asin": r.item, "overall": r.rating,
                    "unixReviewTime": r.time, "reviewText": "ok"})
        for r in _ratings()
    ]  # fmt: skip
    plain = tmp_path / "reviews_Electronics_5.json"
    plain.write_text("\n".join(lines) + "\n")
    packed = tmp_path / "reviews_Electronics_5.json.gz"
    with gzip.open(packed, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    assert list(read_reviews_json(plain)) == list(read_reviews_json(packed)) == _ratings()
    plain.write_text(lines[0] + "\n" + '{"reviewerID": "u9", "asin": "x"}\n')
    with pytest.raises(ValueError, match=r"line 2: KeyError 'overall'"):
        list(read_reviews_json(plain))


def test_rating_only_csv_with_or_without_header(tmp_path) -> None:
    rows = [f"{r.user},{r.item},{r.rating},{r.time}" for r in _ratings()]
    a, b = tmp_path / "a.csv", tmp_path / "rating_only.csv"
    a.write_text("\n".join(rows) + "\n")
    b.write_text("uid,item,rating,time\n" + "\n".join(rows) + "\n")
    assert list(read_rating_only_csv(a)) == list(read_rating_only_csv(b)) == _ratings()
    a.write_text(rows[0] + "\nu1,i1,five,1\n")
    with pytest.raises(ValueError, match=r"line 2: .*expected CSV lines uid,item,rating,time"):
        list(read_rating_only_csv(a))


def test_metadata_json_and_python_literals(tmp_path) -> None:
    path = tmp_path / "meta_Electronics.json"
    path.write_text(
        json.dumps({"asin": "i1", "categories": [["Electronics", "Cameras"]]}) + "\n"
        + str({"asin": "i2", "categories": [["Electronics", "Audio", "Headphones"]]}) + "\n"
        + json.dumps({"asin": "i3", "category": ["Electronics", "TV"]}) + "\n"
    )  # fmt: skip
    assert read_metadata(path) == {"i1": "Cameras", "i2": "Headphones", "i3": "TV"}
    path.write_text("{'asin': 'i1', 'categories': [[\n")
    with pytest.raises(ValueError, match="line 1: neither JSON nor a Python literal"):
        read_metadata(path)


def test_partition_follows_the_authors_pipeline() -> None:
    task = build_amazon(_ratings(), categories={"i1": "Cameras", "i2": "Audio"})
    assert task.users == ("u1", "u3")  # at least 40 ratings: u2 (39) is dropped
    assert task.stats()["samples"] == 45 + 140
    # ids 1..N in sorted order, 0 padding; categories of known items
    assert task.items[0] == "i0" and task.item_category[task.items.index("i1") + 1] > 0
    # time split: rows up to the cut train (u1's first 40), later ones test (its last 5)
    assert int(task.train_ptr[1] - task.train_ptr[0]) == 40
    assert int(task.test_ptr[1] - task.test_ptr[0]) == 5
    assert task.train_time.max() <= TIME_CUTOFF < task.test_time.min()
    # click = rating 5; history = earlier clicks only, the last 100, most recent last
    u1 = slice(int(task.train_ptr[0]), int(task.train_ptr[1]))
    assert task.train_clk[u1].tolist() == [1 if k % 3 == 0 else 0 for k in range(40)]
    assert task.train_hist[u1][0].sum() == 0  # nothing before the first event
    assert np.count_nonzero(task.train_hist[u1][4]) == 2  # clicks at k = 0 and 3
    u3 = slice(int(task.train_ptr[1]), int(task.train_ptr[2]))
    last = task.train_hist[u3][-1]
    assert np.count_nonzero(last) == 100  # capped
    assert last[-1] == task.train_mid[u3][-2]  # the previous event, most recent last
    # heat: u1 touches its items and its own row
    n = task.n_clients
    assert task.heat_clients[1] == task.heat_clients[2] == 1  # user rows
    i1 = n + 1 + task.items.index("i1") + 1
    assert task.heat_clients[i1] == 1 and task.heat_samples[i1] == 40
    with pytest.raises(ValueError, match="no user has 40"):
        build_amazon(_ratings()[45:84])


def test_the_stand_in_matches_table_1_and_carries_a_learnable_signal() -> None:
    task = synthetic_amazon(seed=0)
    stats = task.stats()
    assert stats["clients"] == PAPER_TABLE1["clients"]
    assert abs(stats["samples"] / PAPER_TABLE1["samples"] - 1) < 0.01
    paper = PAPER_TABLE1["feature-heat-dispersion"]
    assert abs(stats["feature-heat-dispersion"] / paper - 1) < 0.10
    assert task.name == "synthetic-amazon" and 0.3 < stats["click-share"] < 0.6
    # clicks are more likely on items of a category the user clicked before
    cats = task.item_category
    same = (cats[task.train_hist] == cats[task.train_mid][:, None]) & (task.train_hist > 0)
    seen = same.any(axis=1)
    assert task.train_clk[seen].mean() > task.train_clk[~seen].mean() + 0.03


@pytest.mark.parametrize(
    "header", ["", "userId,productId,Rating,Timestamp\n", "USERID,PRODUCTID,RATING,TIMESTAMP\n"]
)
def test_amazons_own_ratings_file_is_found_and_read_with_any_header(tmp_path, header) -> None:
    from flower_app.datasets.amazon import find_amazon_files

    rows = [f"{r.user},{r.item},{r.rating},{r.time}" for r in _ratings()]
    folder = tmp_path / "amazon"
    folder.mkdir()
    (folder / "ratings_Electronics.csv").write_text(header + "\n".join(rows) + "\n")
    (folder / "meta_Electronics.json").write_text(json.dumps({"asin": "i1", "category": ["TV"]}))
    files = find_amazon_files(folder)
    assert files.ratings.name == "ratings_Electronics.csv"
    assert files.meta is not None and files.meta.name == "meta_Electronics.json"
    assert list(files.read()) == _ratings()
    (folder / "rating_only.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(ValueError, match="several ratings files"):
        find_amazon_files(folder)
    with pytest.raises(FileNotFoundError, match=r"ratings_<Category>.csv"):
        find_amazon_files(tmp_path)
