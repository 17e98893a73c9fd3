"""The one skeleton every reproduction runs on (reproductions/sweep.py), and FedCG's command.

Names, CSV rows, resume by folder or by row, tables, the exit status of a bad input, and
``--jobs`` giving the serial results; then ``run_sim.py fedcg run`` / ``report`` end to end
(the one command no other test runs), resumed.
"""

from __future__ import annotations

import argparse
import json

import pytest

from reproductions import fedcg
from reproductions.sweep import (
    Run,
    Sweep,
    append_csv,
    csv_keys,
    group_by,
    label_slug,
    markdown_table,
    read_csv,
    run_command,
    slug,
    write_csv,
)

TINY = {"algorithm": "fedsm", "dataset": "synthetic-facility-location", "num-users": 60,
        "num-elements": 20, "k": 3}  # fmt: skip


def test_names_tables_and_groups() -> None:
    assert slug(0.05) == "0p05" and slug(20) == "20" and slug("1.0") == "1p0"
    assert label_slug("j from 1, no level cap") == "j-from-1--no-level-cap"
    assert label_slug("Alg. 1 (K/η, d)") == "alg--1--k-η--d"
    assert markdown_table(["", "a", "b"], [["x", 1, ""]]) == [
        "| | a | b |",
        "|---|---|---|",
        "| x | 1 |  |",
    ]
    rows = [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}, {"a": 1, "b": "y"}]
    assert list(group_by(rows, "a")) == [1, 2]
    assert group_by(rows, ("a", "b"))[(1, "y")] == [rows[2]]


def test_csv_rows_are_written_appended_and_read_as_text(tmp_path) -> None:
    path = tmp_path / "runs.csv"
    append_csv(path, ["variant", "seed"], [{"variant": "a, b", "seed": 0, "other": 9}])
    append_csv(path, ["variant", "seed"], [{"variant": "c", "seed": 1}])
    assert read_csv(path) == [{"variant": "a, b", "seed": "0"}, {"variant": "c", "seed": "1"}]
    assert csv_keys(path, ("variant", "seed")) == {("a, b", "0"), ("c", "1")}
    assert csv_keys(tmp_path / "none.csv", ("seed",)) == set()
    write_csv(path, [{"x": None, "y": 1.5}])
    assert path.read_text().splitlines() == ["x,y", ",1.5"]


def test_a_sweep_runs_resumes_by_folder_and_jobs_give_the_serial_results(tmp_path) -> None:
    grid = [Run(f"seed{s}", {**TINY, "seed": s}, {"seed": s}) for s in (0, 1)]
    serial = Sweep(tmp_path / "serial")
    assert not serial.finished(grid[0])
    done = dict((r.name, s) for r, s in serial.execute(grid))
    assert [serial.finished(r) for r in grid] == [True, True]
    assert done["seed0"]["run-folder"] == str(serial.folder("seed0"))
    config = json.loads((serial.folder("seed1") / "config.json").read_text())
    assert config["output-dir"] == str(tmp_path / "serial" / "runs") and config["seed"] == 1
    parallel = dict((r.name, s) for r, s in Sweep(tmp_path / "parallel").execute(grid, jobs=2))
    for name in done:
        assert parallel[name]["selected"] == done[name]["selected"]
        assert parallel[name]["objective"] == done[name]["objective"]


def test_a_bad_input_exits_2_with_the_command_named(capsys) -> None:
    parser = argparse.ArgumentParser(prog="run_sim.py x")
    parser.add_argument("--jobs", type=int, default=1)

    def fails(args: argparse.Namespace) -> None:
        raise ValueError("k must be positive")

    assert run_command(parser, fails, []) == 2
    assert "run_sim.py x: error: k must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        run_command(parser, fails, ["--jobs", "0"])
    assert exit_.value.code == 2


def test_fedcg_runs_a_preset_resumes_by_row_and_reports(tmp_path, capsys) -> None:
    out = tmp_path / "fedcg"
    variants = "FedCG T=40, 10% clients, exact gradients|discrete greedy kappa=10"
    argv = ["run", "--preset", "synthetic-dblp", "--num-users", "1000", "--num-elements", "50",
            "--ks", "4", "--seeds", "0,1", "--jobs", "2", "--out", str(out),
            "--variants", variants]  # fmt: skip
    assert fedcg.main(argv) == 0
    rows = read_csv(out / "runs.csv")
    assert sorted((r["variant"], r["seed"]) for r in rows) == [
        ("FedCG T=40, 10% clients, exact gradients", "0"),
        ("FedCG T=40, 10% clients, exact gradients", "1"),
        ("discrete greedy kappa=10", "0"),
        ("discrete greedy kappa=10", "1"),
    ]
    assert all(0 < float(r["ratio"]) <= 1 for r in rows)
    assert len(list((out / "runs").glob("synthetic-dblp-*-k4-seed*"))) == 4
    capsys.readouterr()
    assert fedcg.main(argv) == 0  # resumed: every row is there, nothing runs
    assert "0 runs to do (4 already in" in capsys.readouterr().out
    assert len(read_csv(out / "runs.csv")) == 4
    assert fedcg.main(["report", "--out", str(out)]) == 0
    table = (out / "synthetic-dblp.md").read_text().splitlines()
    assert table[0].startswith("| variant | k | seeds | rounds | greedy F |")
    assert any(line.startswith("| discrete greedy kappa=10 | 4 | 2 |") for line in table)
    assert (out / "synthetic-dblp.png").stat().st_size > 10_000
    assert len(read_csv(out / "table-synthetic-dblp.csv")) == 2


def test_a_run_asked_for_again_keeps_the_earlier_folder(tmp_path, capsys) -> None:
    """A run folder is never overwritten: running a sweep's run again (after it finished,
    or after it was interrupted: a folder without summary.json) moves the earlier folder
    aside as ``<name>.previous-<k>``, said on stderr, and runs into a fresh one."""
    run = Run("seed0", {**TINY, "seed": 0}, {"seed": 0})
    sweep = Sweep(tmp_path)
    first = next(summary for _, summary in sweep.execute([run]))
    (sweep.folder(run) / "marker").write_text("first")
    again = next(summary for _, summary in sweep.execute([run]))
    assert again["selected"] == first["selected"] and sweep.finished(run)
    kept = sweep.folder("seed0.previous-1")
    assert (kept / "marker").read_text() == "first" and (kept / "summary.json").is_file()
    (sweep.folder(run) / "summary.json").unlink()  # interrupted: no summary
    list(sweep.execute([run]))
    assert sweep.folder("seed0.previous-2").is_dir() and sweep.finished(run)
    assert "kept as seed0.previous-2" in capsys.readouterr().err
