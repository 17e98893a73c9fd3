"""``flower-app``: an honest exit code for ``run``, ``stop`` of one SuperLink, ``report``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from direct import run_direct
from flower_app.cli.report import write_report
from flower_app.cli.run import local_superlink_pids
from flower_app.config import AppConfig
from rehearsal.processes import (
    flwr_env,
    free_port,
    start_process,
    superlink_command,
    wait_for_port,
)

ROOT = Path(__file__).resolve().parents[1]


def _cli(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flower_app.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_the_console_script_is_declared() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["flower-app"] == "flower_app.cli:main"


@pytest.mark.long
def test_run_exits_honestly_and_stop_stops_only_its_own_superlink(tmp_path) -> None:
    home = tmp_path / "flwr-home"
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        # ports of this home's local SuperLink (Flower's defaults are shared machine-wide)
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
    }
    out = f"output-dir='{tmp_path / 'runs'}'"
    good = _cli(["run", ".", "--run-config", f"k=2 {out} run-name='good'"], env)
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr
    assert "ratio" in good.stdout
    assert "Manually terminating" not in good.stdout  # flower_app.quiet's filter
    # k above the instance's elements: refused before Flower starts, naming the key
    early = _cli(["run", ".", "--run-config", f"k=3 num-elements=2 {out} run-name='bad'"], env)
    assert early.returncode == 2 and "'k' = 3 exceeds the 2 elements" in early.stderr
    # a run that passes every check and fails in the ServerApp (a DBLP dump whose first
    # 4 KB look right, broken further down): flwr run exits 0, flower-app run does not, and
    # says why
    dblp = tmp_path / "data" / "dblp"
    dblp.mkdir(parents=True)
    (dblp / "dblp.dtd").write_text("<!ELEMENT dblp (article)*>\n")
    (dblp / "dblp.xml").write_text('<?xml version="1.0"?>\n<dblp>\n<article key="a/b/c">'
                                   "<year>2019</broken>\n")  # fmt: skip
    data = f"dataset='dblp' data-dir='{tmp_path / 'data'}'"
    bad = _cli(["run", ".", "--run-config", f"k=2 {data} {out} run-name='bad'"], env)
    assert bad.returncode not in (0, 2), bad.stdout[-2000:] + bad.stderr
    assert "finished:failed" in bad.stderr and "malformed XML" in bad.stderr
    mine = local_superlink_pids(home.resolve())
    assert len(mine) == 1
    # another SuperLink on the machine (another home, another port): must survive `stop`
    other_port = free_port()
    other = start_process(
        "other-superlink",
        superlink_command(None, None, other_port, node_auth=False),
        tmp_path / "logs",
        flwr_env(tmp_path / "other-home"),
    )
    try:
        wait_for_port(other_port)
        stopped = _cli(["stop"], env, timeout=60)
        assert stopped.returncode == 0 and str(mine[0]) in stopped.stdout
        deadline = time.monotonic() + 120
        while local_superlink_pids(home.resolve()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not local_superlink_pids(home.resolve())
        assert other.alive()
        again = _cli(["stop"], env, timeout=60)
        assert again.returncode == 0 and "no local SuperLink" in again.stdout
    finally:
        other.stop()


def test_report_draws_fedsm_and_maxfl_runs_and_names_bad_files(tmp_path) -> None:
    runs = []
    for name, cfg in (
        ("fedsm-a", {"algorithm": "fedsm", "k": 6, "seed": 0}),
        ("fedsm-b", {"algorithm": "fedsm", "k": 6, "seed": 1, "clients-per-round": 0.3}),
        ("maxfl", {"algorithm": "maxfl", "dataset": "synthetic-emnist", "num-users": 6,
                   "clients-per-round": 3, "maxfl-rounds": 3, "maxfl-eval-every": 1,
                   "maxfl-solo-steps": 3, "maxfl-local-steps": 2}),
    ):  # fmt: skip
        run_direct(AppConfig.from_run_config({**cfg, "output-dir": str(tmp_path),
                                              "run-name": name}))  # fmt: skip
        runs.append(tmp_path / name)
    report = write_report(runs[:2], tmp_path / "fedsm-report")
    text = report.read_text()
    assert "| fedsm-a | fedsm |" in text and "| fedsm-b | fedsm |" in text
    assert "ratio-to-greedy" in text and "![quality](quality.png)" in text
    for png in ("quality.png", "bytes.png", "participants.png"):
        assert (report.parent / png).stat().st_size > 10_000  # a drawn figure, not empty
    report = write_report([runs[2]], tmp_path / "maxfl-report")
    assert (report.parent / "quality.png").stat().st_size > 10_000
    assert "| maxfl | maxfl | synthetic-emnist |" in report.read_text()
    # the console script, and a malformed metrics line named by file and line
    with open(runs[0] / "metrics.jsonl", "a") as fh:
        fh.write("{not json\n")
    proc = _cli(["report", str(runs[0]), "--out", str(tmp_path / "x")], dict(os.environ))
    assert proc.returncode == 1
    assert "metrics.jsonl: line 7: not JSON" in proc.stderr
    with pytest.raises(ValueError, match="config.json: missing"):
        write_report([tmp_path])
