"""Reading a run folder: one rule for the last line an interrupted run cut, one reader.

The writer appends each round and its newline in one write, so only the last line can be
cut, and a cut line has no newline: :func:`flower_app.results.read_rows` leaves out such a
line and refuses any other line that is not a JSON object, naming the file and the line.
Every reader of ``metrics.jsonl`` (the report, the reproductions, a resumed run) goes
through it, so they agree on an interrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from direct import run_direct
from flower_app.cli.report import load_run
from flower_app.config import AppConfig
from flower_app.results import RunWriter, read_rows, read_run

ROWS = [{"server-round": t, "objective": t / 2} for t in (1, 2, 3)]


def _folder(tmp_path: Path, text: str, summary: bool = True) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"algorithm": "fedsm", "k": 3}))
    (folder / "metrics.jsonl").write_text(text)
    if summary:
        (folder / "summary.json").write_text(json.dumps({"objective": 1.5}))
    return folder


def _lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_a_finished_file_reads_every_row(tmp_path) -> None:
    assert read_rows(_folder(tmp_path, _lines(ROWS))) == ROWS


@pytest.mark.parametrize("keep", [1, 10, len(json.dumps(ROWS[2])) - 1])
def test_a_last_line_cut_mid_write_is_left_out(tmp_path, keep) -> None:
    cut = json.dumps(ROWS[2])[:keep]  # no newline: the write was interrupted
    assert read_rows(_folder(tmp_path, _lines(ROWS[:2]) + cut)) == ROWS[:2]


def test_a_whole_last_row_without_its_newline_is_kept(tmp_path) -> None:
    assert read_rows(_folder(tmp_path, _lines(ROWS)[:-1])) == ROWS


def test_a_corrupt_line_in_the_middle_is_refused_by_file_and_line(tmp_path) -> None:
    folder = _folder(tmp_path, _lines(ROWS[:1]) + '{"server-round": 2, "obj\n' + _lines(ROWS[2:]))
    with pytest.raises(ValueError, match=r"run/metrics.jsonl: line 2: not JSON"):
        read_rows(folder)
    with pytest.raises(ValueError, match="line 2"):  # every reader says the same
        load_run(folder)


@pytest.mark.parametrize("bad", ['{"server-round": 3\n', "[1, 2]\n", "\xff\n"])
def test_a_bad_last_line_with_its_newline_is_corrupt_not_cut(tmp_path, bad) -> None:
    with pytest.raises(ValueError, match="line 3: not"):
        read_rows(_folder(tmp_path, _lines(ROWS[:2]) + bad))


def test_blank_lines_and_a_missing_file_give_no_rows(tmp_path) -> None:
    folder = _folder(tmp_path, "\n" + _lines(ROWS[:1]) + "  \n")
    assert read_rows(folder) == ROWS[:1]
    (folder / "metrics.jsonl").unlink()
    assert read_rows(folder) == []


def test_read_run_gives_config_rows_and_summary_or_none(tmp_path) -> None:
    folder = _folder(tmp_path, _lines(ROWS[:2]) + '{"server-ro', summary=False)
    run = read_run(folder)
    assert run.config == {"algorithm": "fedsm", "k": 3} and run.rows == ROWS[:2]
    assert run.summary is None and not run.finished and run.name == "run"
    (folder / "summary.json").write_text("{")
    with pytest.raises(ValueError, match="summary.json: not JSON"):
        read_run(folder)
    (folder / "config.json").unlink()
    with pytest.raises(ValueError, match="config.json: missing"):
        read_run(folder)
    with pytest.raises(ValueError, match="not a folder"):
        read_run(tmp_path / "nothing")


def test_a_real_run_reads_back_as_written(tmp_path) -> None:
    summary = run_direct(AppConfig.from_run_config(
        {"k": 4, "num-users": 40, "num-elements": 12, "output-dir": str(tmp_path),
         "run-name": "real"}
    ))  # fmt: skip
    run = read_run(summary["run-folder"])
    assert run.finished and run.summary["objective"] == summary["objective"]
    assert [r["server-round"] for r in run.rows] == [1, 2, 3, 4]
    assert run.config["k"] == 4


def test_a_resumed_run_keeps_the_rows_before_a_cut_line(tmp_path) -> None:
    writer = RunWriter(tmp_path / "run", {"k": 3})
    for row in ROWS[:2]:
        writer.log_round(row)
        writer.save_checkpoint({"server-round": row["server-round"]})
    with open(tmp_path / "run" / "metrics.jsonl", "a") as fh:
        fh.write('{"server-round": 3, "obj')  # the process died in this write
    resumed = RunWriter(tmp_path / "run", {"k": 3}, resume=True)
    assert read_rows(tmp_path / "run") == ROWS[:2]
    resumed.log_round(ROWS[2])
    assert read_rows(tmp_path / "run") == ROWS
