"""Your own data: facility location from a (user, item, value) table, coverage from a set
system; end to end on the direct engine, the in-process grid and a real ``flwr run``, with
item names in summary.json and errors that name the file, the line and the format."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from direct import run_direct
from flower_app.config import AppConfig, ConfigError
from flower_app.datasets.own import OwnDataError, load_coverage_sets, load_facility_table
from flower_app.registry import load_runner
from tests.support.local_grid import LocalGrid


def _ratings(tmp_path, n_users: int = 40, n_items: int = 25, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        for j in rng.choice(n_items, size=6, replace=False):
            rows.append((f"shopper-{u:03d}", f"sku{j}", int(rng.integers(1, 6))))
    frame = pd.DataFrame(rows, columns=["customer", "product", "stars"])
    path = tmp_path / "ratings.csv"
    frame.to_csv(path, index=False)
    names = tmp_path / "names.csv"
    pd.DataFrame({"item": [f"sku{j}" for j in range(n_items)],
                  "name": [f"Product {j}" for j in range(n_items)]}).to_csv(names, index=False)
    return path, names, frame


def _trips(tmp_path, n_users: int = 50, n_items: int = 30, seed: int = 1):
    rng = np.random.default_rng(seed)
    lines = ["# one shopping trip per line"]
    for _ in range(n_users):
        size = int(rng.integers(1, 5))
        lines.append(", ".join(f"p{j}" for j in rng.choice(n_items, size=size, replace=False)))
    path = tmp_path / "trips.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_facility_table_end_to_end_with_item_names(tmp_path) -> None:
    path, names, frame = _ratings(tmp_path)
    run = {
        "algorithm": "fedsm", "dataset": "facility-location-table", "data-file": str(path),
        "data-columns": "customer,product,stars", "item-names": str(names), "k": 4,
        "clients-per-round": 0.5, "elements-per-client": 0.5, "seed": 2,
        "output-dir": str(tmp_path),
    }  # fmt: skip
    direct = run_direct(AppConfig.from_run_config({**run, "run-name": "direct"}))
    assert direct["dataset"] == "own:ratings.csv" and direct["greedy-objective"] > 0
    items = sorted(frame["product"].unique())  # labels in sorted (string) order
    assert direct["selected-items"] == [items[e] for e in direct["selected"]]
    assert direct["selected-names"] == [f"Product {s[3:]}" for s in direct["selected-items"]]
    assert len(direct["greedy-selected-items"]) == 4
    # F(S) from the file by hand: mean over users of the best stars among the chosen items
    chosen = set(direct["selected-items"])
    best = frame[frame["product"].isin(chosen)].groupby("customer")["stars"].max()
    assert direct["objective"] == pytest.approx(best.reindex(frame["customer"].unique())
                                                .fillna(0).mean())  # fmt: skip
    cfg = AppConfig.from_run_config({**run, "run-name": "grid"})
    grid = LocalGrid(3, {**run, "run-name": "grid"})
    flower = load_runner("fedsm").server_run(grid, cfg)
    assert flower["selected"] == direct["selected"]
    assert flower["selected-names"] == direct["selected-names"]


def test_coverage_sets_from_lines_and_from_pairs_are_the_same_instance(tmp_path) -> None:
    path = _trips(tmp_path)
    lines = load_coverage_sets(str(path))
    rows = [(u, item) for u, trip in enumerate(path.read_text().splitlines()[1:])
            for item in trip.split(", ")]  # fmt: skip
    pairs = tmp_path / "pairs.tsv"
    pd.DataFrame(rows, columns=["trip", "product"]).to_csv(pairs, sep="\t", index=False)
    table = load_coverage_sets(str(pairs), "trip,product")
    assert lines.items == table.items
    assert (lines.values != table.values).nnz == 0
    parquet = tmp_path / "pairs.parquet"
    pd.DataFrame(rows, columns=["trip", "product"]).to_parquet(parquet)
    assert (load_coverage_sets(str(parquet), "trip,product").values != lines.values).nnz == 0
    run = {
        "algorithm": "fedcg", "dataset": "coverage-sets", "data-file": str(path), "k": 3,
        "fedcg-rounds": 6, "clients-per-round": 1.0, "seed": 1, "output-dir": str(tmp_path),
    }  # fmt: skip
    direct = run_direct(AppConfig.from_run_config({**run, "run-name": "direct"}))
    covered = np.asarray(lines.values[:, direct["selected"]].sum(axis=1)).ravel() > 0
    assert direct["objective"] == pytest.approx(covered.mean())
    assert direct["selected-items"] == [lines.items[e] for e in direct["selected"]]
    cfg = AppConfig.from_run_config({**run, "run-name": "grid"})
    flower = load_runner("fedcg").server_run(LocalGrid(2, {**run, "run-name": "grid"}), cfg)
    assert flower["selected"] == direct["selected"]


@pytest.mark.long
def test_flwr_run_on_your_own_table(flower_cli, tmp_path) -> None:
    path, names, _ = _ratings(tmp_path, n_users=30)
    run = {"dataset": "facility-location-table", "data-file": str(path),
           "data-columns": "customer,product,stars", "item-names": str(names), "k": 3,
           "seed": 4}  # fmt: skip
    result = flower_cli.run(run, num_supernodes=3)
    assert result.status == "finished:completed", result.output[-3000:] + result.details
    direct = run_direct(AppConfig.from_run_config({**run, "output-dir": str(tmp_path)}))
    assert result.summary["selected"] == direct["selected"]
    assert result.summary["selected-names"] == direct["selected-names"]
    config = json.loads((result.folder / "config.json").read_text())
    assert config["data-file"] == str(path)


@pytest.mark.parametrize(
    ("content", "columns", "match"),
    [
        ("user,item\n1,2\n", "user,item,value", r"no column 'value' \(found 'user', 'item'\)"),
        ("user,item,value\n1,2,3\n1,3,-1\n", "user,item,value", r"line 3: value = '-1'"),
        ("user,item,value\n1,2,3\n2,3,lots\n", "user,item,value", r"line 3: value = 'lots'"),
        ("user,item,value\n1,2,3\n2,3,1\n1,2,4\n", "user,item,value",
         r"lines 2 and 4: the pair \(1, 2\) appears twice"),
        ("user,item,value\n", "user,item,value", "no rows"),
    ],
    ids=["missing-column", "negative", "not-a-number", "duplicate", "empty"],
)
def test_a_malformed_table_names_file_line_and_format(tmp_path, content, columns, match) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(OwnDataError, match=match) as err:
        load_facility_table(str(path), columns)
    assert "bad.csv" in str(err.value) and "expected" in str(err.value)


def test_other_bad_inputs_are_named(tmp_path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    with pytest.raises(OwnDataError, match="empty.txt: no sets; expected one line of items"):
        load_coverage_sets(str(empty))
    with pytest.raises(OwnDataError, match="'data-file': .*missing.csv not found"):
        load_facility_table(str(tmp_path / "missing.csv"))
    path, _, _ = _ratings(tmp_path)
    names = tmp_path / "bad-names.csv"
    names.write_text("sku,title\nsku1,x\n")
    with pytest.raises(OwnDataError, match="bad-names.csv: line 1: expected the header"):
        load_facility_table(str(path), "customer,product,stars", str(names))
    # through the config: a ConfigError before any round, naming data-file
    cfg = AppConfig.from_run_config({"dataset": "facility-location-table", "k": 2})
    with pytest.raises(ConfigError, match="needs run_config 'data-file'"):
        run_direct(cfg)


def test_run_sim_sweeps_your_own_set_system(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    path = _trips(tmp_path)
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(root / "run_sim.py"), "fedsm-sweep", "--dataset", "coverage-sets",
         "--data-file", str(path), "--k", "2", "4", "--clients", "0.5", "--elements", "0.5",
         "--seeds", "0", "1", "--out", str(tmp_path / "sweep")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert len(table) == 2 * 2 and (table["dataset"] == "own:trips.txt").all()
