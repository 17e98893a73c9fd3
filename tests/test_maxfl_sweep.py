"""MaxFL sweeps: sweep.csv, table.md and the curve PNGs; ``report`` rebuilds them from the
run folders of a finished or interrupted sweep; ``--jobs`` gives the serial results."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from reproductions import maxfl as sweep

TINY = [
    "--setting",
    "emnist",
    "--algorithms",
    "maxfl",
    "mwfed",
    "--seeds",
    "0",
    "--set",
    "num-users=4",
    "maxfl-unseen-users=2",
    "clients-per-round=2",
    "maxfl-rounds=2",
    "maxfl-eval-every=1",
    "maxfl-solo-steps=5",
    "maxfl-local-steps=2",
    "maxfl-tune-steps=0",
    "--grid",
    "maxfl-lr=0.05,0.1",
]

PNG = b"\x89PNG\r\n\x1a\n"


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def _outputs(out: Path) -> list[Path]:
    return [out / "sweep.csv", out / "table.md", *sorted(out.glob("curves*.png"))]


def test_sweep_writes_report_and_report_mode_rebuilds_it(tmp_path, capsys) -> None:
    out = tmp_path / "sweep"
    assert sweep.main([*TINY, "--out", str(out)]) == 0
    rows = _csv(out / "sweep.csv")
    assert [(r["algorithm"], r["maxfl-lr"]) for r in rows] == [
        ("maxfl", "0.05"),
        ("maxfl", "0.1"),
        ("mwfed", "0.05"),
        ("mwfed", "0.1"),
    ]
    assert json.loads((out / "sweep.json").read_text())["grid-keys"] == ["maxfl-lr"]
    figures = sorted(p.name for p in out.glob("curves*.png"))
    assert figures == ["curves-lr0p05.png", "curves-lr0p1.png"]
    assert all(p.read_bytes().startswith(PNG) for p in out.glob("*.png"))
    table = (out / "table.md").read_text()
    assert "| mwfed | 0.1 |" in table and "Unfinished" not in table

    # an interrupted sweep: one run without summary and with a cut last line
    for path in _outputs(out):
        path.unlink()
    cut = out / "runs" / "mwfed-lr0p1-seed0"
    (cut / "summary.json").unlink()
    lines = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:20])
    capsys.readouterr()
    assert sweep.main(["report", "--out", str(out)]) == 0
    assert "3 finished, 1 unfinished" in capsys.readouterr().out
    assert len(_csv(out / "sweep.csv")) == 3
    assert (
        "Unfinished runs (curves only): mwfed-lr0p1-seed0 (round 1)"
        in (out / "table.md").read_text()
    )
    assert sorted(p.name for p in out.glob("curves*.png")) == figures


def test_sweep_bad_input_fails_clearly(tmp_path, capsys) -> None:
    assert sweep.main(["report", "--out", str(tmp_path / "nothing")]) == 2
    assert "no run folder" in capsys.readouterr().err
    assert sweep.main([*TINY, "--grid", "maxfl-lr", "--out", str(tmp_path / "a")]) == 2
    assert "expected key=value" in capsys.readouterr().err
    bad = [*TINY, "--out", str(tmp_path / "b")]
    bad[bad.index("--algorithms") + 1] = "nope"  # checked before any run starts
    with pytest.raises(SystemExit) as exit_:  # the parser lists the family's algorithms
        sweep.main(bad)
    assert exit_.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "b" / "runs").exists()  # nothing ran
    with pytest.raises(SystemExit):
        sweep.main([*TINY, "--jobs", "0", "--out", str(tmp_path / "c")])


@pytest.mark.slow
def test_sweep_jobs_give_the_serial_results(tmp_path) -> None:
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    assert sweep.main([*TINY, "--out", str(serial)]) == 0
    assert sweep.main([*TINY, "--jobs", "2", "--out", str(parallel)]) == 0
    assert _csv(serial / "sweep.csv") == _csv(parallel / "sweep.csv")
    for run in (serial / "runs").iterdir():
        a = json.loads((run / "summary.json").read_text())
        b = json.loads((parallel / "runs" / run.name / "summary.json").read_text())
        assert a["model-digest"] == b["model-digest"]


def test_sweeps_into_one_folder_accumulate_and_resume(tmp_path, capsys) -> None:
    """Each algorithm at its own grid point, one table; finished runs are not rerun."""
    out = tmp_path / "sweep"
    base = [a for a in TINY if a not in ("mwfed",)]
    lr_at = base.index("maxfl-lr=0.05,0.1")
    maxfl_only = [*base[:lr_at], "maxfl-lr=0.05", *base[lr_at + 1 :]]
    assert sweep.main([*maxfl_only, "--out", str(out)]) == 0
    first = (out / "runs" / "maxfl-lr0p05-seed0" / "summary.json").stat().st_mtime_ns
    fedavg = [a if a != "maxfl" else "fedavg" for a in maxfl_only]
    fedavg[fedavg.index("maxfl-lr=0.05")] = "maxfl-lr=0.1"
    capsys.readouterr()
    assert sweep.main([*fedavg, "--out", str(out)]) == 0
    assert "1 runs to do (0 finished before" in capsys.readouterr().out
    rows = _csv(out / "sweep.csv")
    assert [(r["algorithm"], r["maxfl-lr"]) for r in rows] == [
        ("fedavg", "0.1"),
        ("maxfl", "0.05"),
    ]
    # the same command again: nothing is rerun
    capsys.readouterr()
    assert sweep.main([*maxfl_only, "--out", str(out)]) == 0
    assert "0 runs to do (1 finished before, kept)" in capsys.readouterr().out
    assert (out / "runs" / "maxfl-lr0p05-seed0" / "summary.json").stat().st_mtime_ns == first
    # another grid in the same folder is refused with a clear message
    other = [a if not a.startswith("maxfl-lr=") else "maxfl-local-steps=1" for a in maxfl_only]
    assert sweep.main([*other, "--out", str(out)]) == 2
    assert "use another --out" in capsys.readouterr().err
