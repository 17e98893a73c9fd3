"""``flower-app run`` checks before Flower starts, keeps one SuperLink per FLWR_HOME, and
folds a failure into one line; ``python -m flower_app.settings --check`` never a traceback."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args
from hypothesis import given
from hypothesis import strategies as st

from flower_app.cli.run import (
    PORT_ENV,
    PORTS_FILE,
    _Console,
    local_ports,
    local_superlink_pids,
    preflight,
)
from flower_app.deploy.processes import free_port, wait_for_port
from flower_app.quiet import Collapser
from flower_app.settings import ConfigError
from flower_app.settings.__main__ import main as settings_main
from flower_app.settings.overrides import read_overrides

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PORT_ENV}
    # this environment's flower-superlink starts flower-superexec by name: BIN on PATH
    path = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "PATH": path, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0"}


def _cli(args: list[str], home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flower_app.cli", *args],
        cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


# ------------------------------------------------------------------ before Flower starts
BAD = [
    ("k=abc", "'k' = abc: not a TOML value"),
    ("secure-aggregation=maybe", "'secure-aggregation' = maybe: not a TOML value"),
    ("k=20 k=30", "'k' is given twice"),
    ("k = 20", "'k = 20' is not key=value"),
    ("k=0", "'k' = 0: must be >= 1"),
    ("fsa-round=5", "'fsa-round' (did you mean 'fsa-rounds'?) is not known"),
    ("fsa-lr=0.5", "'fsa-lr' belongs to fedsubavg"),
    ("dataset='fmnist'", "'fmnist' does not fit algorithm 'fedsm'"),
    ("resume=true", "'resume' = true needs the interrupted run's 'run-name'"),
    ("dataset='coverage-sets' data-file='/nonexistent/sets.txt'",
     "'data-file': /nonexistent/sets.txt not found"),
    ("dataset='coverage-sets' data-file='sets.txt'", "'data-file' = 'sets.txt' is relative"),
]  # fmt: skip


@pytest.mark.parametrize(("run_config", "named"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_run_config_exits_2_naming_it_and_starts_nothing(tmp_path, run_config, named):
    home = tmp_path / "home"
    proc = _cli(["run", ".", "--run-config", run_config], home, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr
    assert all(line.startswith("flower-app run: ") for line in proc.stderr.splitlines())
    assert "Traceback" not in proc.stderr + proc.stdout
    # nothing reached Flower: no SuperLink, no app package, not even the home folder
    assert not home.exists()
    assert not local_superlink_pids(home.resolve())


def test_every_problem_is_named_on_its_own_line(tmp_path) -> None:
    found = preflight(ROOT, ["k=0 seed=-1 zzz=1 fsa-lr=0.5"])
    assert len(found) == 4
    assert found[0].startswith("run_config key 'zzz'")
    assert any("'k' = 0" in p for p in found) and any("fsa-lr" in p for p in found)
    assert preflight(ROOT, ["k=20 fedsm-mode='alg2'"]) == []


def test_data_files_are_checked_by_their_header(tmp_path) -> None:
    table = tmp_path / "ratings.csv"
    table.write_text("customer,product,stars\na,b,1\n")
    run = f"dataset='facility-location-table' data-file='{table}'"
    assert preflight(ROOT, [run + " data-columns='customer,product,stars'"]) == []
    [problem] = preflight(ROOT, [run])
    assert "no column 'user', 'item', 'value'" in problem and "ratings.csv: line 1" in problem
    leaf = tmp_path / "sent140" / "train"
    leaf.mkdir(parents=True)
    (leaf / "all_data_0_train_9.json").write_text("{}")
    [problem] = preflight(ROOT, [f"algorithm='fedsubavg' dataset='sent140' data-dir='{tmp_path}'"])
    assert "train/ has JSON files but test/ has none" in problem


@pytest.mark.parametrize("text", ["k=abc", "secure-aggregation=maybe", "k=20 k=30", "k=x y"])
def test_settings_check_never_prints_a_traceback(capsys, text) -> None:
    assert settings_main(["--check", text]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: run_config")


_KEY = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
_VALUE = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.sampled_from(["true", "false"]),
    st.text("abc XYZ-_.", max_size=8).map(lambda s: f"'{s}'"),
    st.text("abc xyz", max_size=8).map(lambda s: f'"{s}"'),
)


@given(st.dictionaries(_KEY, _VALUE, max_size=6))
def test_overrides_are_read_as_flwr_reads_them(pairs) -> None:
    text = " ".join(f"{k}={v}" for k, v in pairs.items())
    assert read_overrides([text]) == parse_config_args([text])


@given(_KEY, st.from_regex(r"[a-zA-Z][a-zA-Z_]{0,6}", fullmatch=True))
def test_a_value_flwr_refuses_is_named_with_its_key(key, word) -> None:
    if word in ("true", "false", "inf", "nan"):
        return
    with pytest.raises(ConfigError, match=f"'{key}' = {word}: not a TOML value"):
        read_overrides([f"{key}={word}"])
    with pytest.raises(Exception, match="invalid format"):  # Flower's one generic message
        parse_config_args([f"{key}={word}"])


# ------------------------------------------------------------------ the log of a run
def test_a_traceback_is_kept_for_the_log_and_points_into_the_app() -> None:
    log = io.StringIO()
    console = _Console(ROOT, log, filter_noise=True, full=False)
    copy = "/home/u/.flwr/apps/flower-app.flower-app.0.1.0.7d16b1ba/"
    for line in [
        "INFO :      Starting Flower Simulation\n",
        "Traceback (most recent call last):\n",
        f'  File "{copy}flower_app/server_app.py", line 37, in main\n',
        "    summary = runner.server_run(grid, cfg)\n",
        f'  File "{copy}flower_app/problems.py", line 156, in build_matroid\n',
        "flower_app.settings.setting.ConfigError: k=3 exceeds the ground set\n",
        "ERROR :     Exit Code: 700\n",
    ]:
        console.line(line)
    console.close()
    assert f'  File "{ROOT}/flower_app/server_app.py", line 37, in main' in log.getvalue()
    assert console.errors == [("flower_app.settings.setting.ConfigError: k=3 exceeds the "
                               "ground set", "flower_app/problems.py:156")]  # fmt: skip


def test_repeated_errors_collapse_into_one_line_with_a_count() -> None:
    c = Collapser()
    shown = []
    for node in range(40):
        shown += c.feed(f"\x1b[91mERROR \x1b[0m:     No query function registered with name "
                        f"'x' (node {node})\n")  # fmt: skip
        shown += c.feed(f"INFO :      [ROUND {node}]\n")
    assert sum("No query function" in s for s in shown) == 1
    assert sum("[ROUND" in s for s in shown) == 40
    [summary] = c.flush()
    assert summary.startswith("flower-app run: 39 more like: ERROR :     No query function")


# ------------------------------------------------------------------ one SuperLink per home
def _local_superlink(home: Path, http: int, control: int) -> subprocess.Popen:
    """A SuperLink started as ``flwr run`` starts the local one (simulation, this home)."""
    (home / "local-superlink").mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation",
           "subprocess", "--control-api-address", f"127.0.0.1:{control}", "--host",
           "127.0.0.1", "--port", str(http), "--database",
           str(home / "local-superlink" / "state.db")]  # fmt: skip
    return subprocess.Popen(cmd, env=_env(home), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


def test_ports_are_chosen_once_and_never_another_homes(tmp_path) -> None:
    mine, other = (tmp_path / "mine").resolve(), (tmp_path / "other").resolve()
    ports, note = local_ports(mine)
    assert "chose" in note and json.loads((mine / PORTS_FILE).read_text()) == ports
    assert local_ports(mine) == (ports, "")  # kept
    # another home's SuperLink comes up on these ports: they are given up, never shared
    proc = _local_superlink(other, ports["http-api-port"], free_port())
    try:
        wait_for_port(ports["http-api-port"])
        moved, note = local_ports(mine)
        assert "held by the SuperLink" in note and str(proc.pid) in note
        assert moved["http-api-port"] != ports["http-api-port"]
        # this home's own SuperLink, started by a plain `flwr run` elsewhere, is adopted
        http, control = free_port(), free_port()
        own = _local_superlink(mine, http, control)
        try:
            wait_for_port(http)
            adopted, note = local_ports(mine)
            assert adopted == {"http-api-port": http, "control-api-port": control}
            assert "adopted" in note
        finally:
            os.killpg(own.pid, signal.SIGTERM)
            own.wait(30)
        assert local_ports(mine) == (adopted, "")  # kept once it stopped (TIME_WAIT is free)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


@pytest.mark.long
def test_two_homes_run_at_once_each_on_its_own_superlink(tmp_path) -> None:
    homes = [tmp_path / "a", tmp_path / "b"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "flower_app.cli", "run", ".", "--run-config",
             f"k=2 seed={i} output-dir='{tmp_path / 'runs'}' run-name='home-{i}'"],
            cwd=ROOT, env=_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        for i, home in enumerate(homes)
    ]  # fmt: skip
    try:
        outs = [p.communicate(timeout=900)[0] for p in procs]
        for proc, out in zip(procs, outs, strict=True):
            assert proc.returncode == 0, out[-3000:]
        ports = [json.loads((h / PORTS_FILE).read_text()) for h in homes]
        assert set(ports[0].values()).isdisjoint(ports[1].values())
        for i, home in enumerate(homes):
            summary = json.loads((tmp_path / "runs" / f"home-{i}" / "summary.json").read_text())
            config = json.loads((tmp_path / "runs" / f"home-{i}" / "config.json").read_text())
            assert config["seed"] == i and summary["selected"]
            assert len(local_superlink_pids(home.resolve())) == 1
            assert f"127.0.0.1:{ports[i]['http-api-port']}" in outs[i]
    finally:
        for home in homes:
            _cli(["stop"], home, timeout=60)
        deadline = time.monotonic() + 20
        while any(local_superlink_pids(h.resolve()) for h in homes):
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_the_flwr_logger_lets_a_repeated_error_through_once_then_by_powers_of_ten() -> None:
    import logging

    from flower_app.quiet import _CollapseRepeats

    logger = logging.getLogger("flwr-test-collapse")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    logger.addFilter(_CollapseRepeats())
    import flwr

    flwr_file = str(Path(flwr.__file__).parent / "server" / "superlink" / "vce_api.py")
    for node in range(120):
        for pathname in (flwr_file, __file__):  # Flower's record, and this app's own
            record = logger.makeRecord(logger.name, logging.ERROR, pathname, 1,
                                       "No query function registered (node %d)", (node,), None)
            logger.handle(record)
        logger.info("[ROUND %d]", node)
    flowers = [s for s in seen if "No query" in s]
    assert len(flowers) == 3 + 120  # Flower's: the 1st, 10th and 100th; the app's: all
    collapsed = [s for s in flowers if "[the " in s]
    assert collapsed == ["No query function registered (node 9) [the 10th of these]",
                         "No query function registered (node 99) [the 100th of these]"]
    assert sum("[ROUND" in s for s in seen) == 120
