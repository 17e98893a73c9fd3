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
    plan_run,
    preflight,
)
from flower_app.config import fresh_run_name
from flower_app.quiet import Collapser
from flower_app.settings import ConfigError
from flower_app.settings.__main__ import main as settings_main
from flower_app.settings.overrides import read_overrides
from rehearsal.processes import free_port, wait_for_port

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
    # rules the runners enforce, evaluated on the instance before Flower starts
    ("fedsm-mode='alg2' fedsm-epsilon=1.5", "'fedsm-epsilon' = 1.5: must be < 1"),
    ("fedsm-mode='amplified' fedsm-eta=0.3", "'fedsm-eta' = 0.3: 1/x must be an integer"),
    ("clients-per-round=5000", "'clients-per-round' = 5000 exceeds the 2000 users of synthetic"),
    ("elements-per-client=600", "'elements-per-client' = 600 exceeds the 500 elements"),
    ("k=600", "'k' = 600 exceeds the 500 elements of synthetic-facility-location"),
    ("k=100000000000000000000000000", "beyond the 64-bit integers Flower's run_config holds"),
    ("matroid='partition' k=40", "'k' = 40 exceeds the rank 36 of the partition matroid"),
    ("secure-aggregation=true", "'secure-aggregation' = true needs at least 3 nodes"),
    ("data-file='/tmp/ratings.csv'", "'data-file' = '/tmp/ratings.csv' is read only by the"),
    ("dataset='facility-location-table' data-file='/tmp/x.npz'", "reads files ending in .csv"),
    ("algorithm='fed-discrete-greedy' clients-per-round=5", "'clients-per-round' = 5 would be"),
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
    run = f"dataset='facility-location-table' data-file='{table}' k=1"
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


# ------------------------------------------------------------------ where the results go
def _readme_fedcg() -> str:
    """The README's FedCG command (its --run-config string)."""
    line = next(x for x in (ROOT / "README.md").read_text().splitlines()
                if x.startswith("flower-app run . --run-config \"algorithm='fedcg'"))  # fmt: skip
    return line.split("--run-config ", 1)[1].strip().strip('"')


def _a_finished_run(folder: Path, rows: int = 3) -> dict[str, bytes]:
    """Leave ``folder`` as a finished run leaves it; return its files' bytes."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"algorithm": "fedcg"}')
    (folder / "metrics.jsonl").write_text("".join(f'{{"server-round": {t}}}\n'
                                                  for t in range(1, rows + 1)))  # fmt: skip
    (folder / "summary.json").write_text('{"objective": 1.0}')
    return {f.name: f.read_bytes() for f in folder.iterdir()}


def test_the_readmes_fedcg_command_run_twice_refuses_the_second_by_name(
    tmp_path, monkeypatch
) -> None:
    """A reused run-name never overwrites the run it names: refused before Flower starts,
    naming the folder and what it holds (the first run's files stay as they were)."""
    home, out = tmp_path / "home", tmp_path / "runs"
    folder = out / "readme-fedcg"
    before = _a_finished_run(folder)
    env = {**_env(home), "FLOWER_APP_OUTPUT": str(out)}
    proc = subprocess.run([sys.executable, "-m", "flower_app.cli", "run", ".", "--run-config",
                           _readme_fedcg()], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert f"run folder {folder} already holds a run (config.json, metrics.jsonl (3 rows)" in line
    assert "resume = true" in line and "'run-name'" in line
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before
    assert not home.exists()
    # resume = true is the way into it; with nothing to resume, refused too
    monkeypatch.setenv("FLOWER_APP_OUTPUT", str(out))
    plan = plan_run(ROOT, [_readme_fedcg() + " resume=true"], home=home)
    assert plan.problems == [] and plan.folder == folder
    empty = plan_run(ROOT, ["run-name='nothing-here' resume=true"], home=home)
    assert empty.problems == [
        f"run_config 'resume' = true: run folder {out / 'nothing-here'} holds no run to resume "
        "(check 'run-name' and 'output-dir')"
    ]


def test_results_go_where_the_caller_of_flower_app_run_says(tmp_path, monkeypatch) -> None:
    """output-dir and data-dir are resolved in the caller's environment and passed with the
    run (never the environment a SuperLink captured when it started); a run without a name
    gets a fresh one (a suffix when the folder exists), said on the first line."""
    home, out, data = tmp_path / "home", tmp_path / "mine", tmp_path / "data"
    monkeypatch.setenv("FLOWER_APP_OUTPUT", str(out))
    monkeypatch.setenv("FLOWER_APP_DATA", str(data))
    plan = plan_run(ROOT, ["k=3"], home=home)
    assert plan.problems == []
    assert plan.pinned["output-dir"] == str(out) and plan.pinned["data-dir"] == str(data)
    name = plan.pinned["run-name"]
    assert name.startswith("fedsm-synthetic-facility-location-seed0-")
    assert plan.folder == out / name
    (out / name).mkdir(parents=True)  # a run started in the same second: the next name
    assert fresh_run_name(out, name) == f"{name}-2"
    again = plan_run(ROOT, ["k=3"], home=home)
    assert not (out / again.pinned["run-name"]).exists()
    # given keys win; another SuperLink (not local) pins nothing: its machine decides
    given = plan_run(ROOT, [f"output-dir='{tmp_path / 'given'}' run-name='x'"], home=home)
    assert given.pinned == {"data-dir": str(data)} and given.folder == tmp_path / "given" / "x"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "remote"\n[superlink.remote]\n'
                                      'address = "127.0.0.1:9093"\ninsecure = true\n')  # fmt: skip
    remote = plan_run(ROOT, ["k=3"], home=home)
    assert remote.problems == [] and remote.pinned == {} and remote.folder is None
    assert remote.where == ("on the SuperLink's machine, in $FLOWER_APP_OUTPUT or "
                            "~/flower_app_runs/fedsm-synthetic-facility-location-seed0-<time> "
                            "as its ServerApp resolves them")  # fmt: skip


def test_the_pinned_keys_reach_flwr_run_after_the_callers_own(tmp_path) -> None:
    """The caller's --run-config options first, the pinned keys last (a later option wins,
    as in flwr run); a .toml run-config is merged into one file (Flower refuses a mix)."""
    from flower_app.cli.run import _with_pinned

    pinned = {"output-dir": "/o/it's", "run-name": "r"}
    [first, last] = _with_pinned(["k=3"], pinned, tmp_path)
    assert parse_config_args([first, last]) == {"k": 3, "output-dir": "/o/it's", "run-name": "r"}
    toml = tmp_path / "run.toml"
    toml.write_text("k = 4\nrun-name = 'mine'\n")
    [merged] = _with_pinned([str(toml)], {"output-dir": "/o"}, tmp_path)
    assert parse_config_args([merged]) == {"k": 4, "run-name": "mine", "output-dir": "/o"}


def test_a_federation_size_comes_from_the_federation_config_or_flowers_default(tmp_path) -> None:
    from flwr.supercore.constant import DEFAULT_SIMULATION_CONFIG

    from flower_app.cli.run import LOCAL_DEFAULT_NODES, local_nodes

    assert DEFAULT_SIMULATION_CONFIG.num_supernodes == LOCAL_DEFAULT_NODES
    assert local_nodes(None, None, tmp_path) == LOCAL_DEFAULT_NODES
    assert local_nodes(None, ["num-supernodes=5"], tmp_path) == 5
    plan = plan_run(ROOT, ["secure-aggregation=true"], federation_config=["num-supernodes=3"],
                    home=tmp_path)  # fmt: skip
    assert plan.problems == []


# ------------------------------------------------------------------ the app folder
def test_a_venv_or_too_much_data_in_the_app_folder_is_named_before_packaging(tmp_path) -> None:
    """Venvs by their pyvenv.cfg (whatever the name): walked on every run, packaged unless
    Flower's rules exclude them; data over Flower's 10 MB, the largest paths named."""
    from flower_app.cli.app_folder import app_folder_warnings

    app = tmp_path / "app"
    (app / "pkg").mkdir(parents=True)
    (app / "pkg" / "task.py").write_text("x = 1\n")
    assert app_folder_warnings(app, {}) == []
    for name in (".venv", "myenv"):
        (app / name / "lib" / "site-packages").mkdir(parents=True)
        (app / name / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (app / name / "lib" / "site-packages" / "big.py").write_text("# x\n")
    (app / "notavenv").mkdir()
    (app / "notavenv" / "module.py").write_text("y = 2\n")
    warnings = app_folder_warnings(app, {})
    assert len(warnings) == 2
    hidden, packaged = sorted(warnings)
    assert hidden.startswith(f"{app / '.venv'} is a virtual environment")
    assert "walks every file" in hidden and "would package" not in hidden
    assert packaged.startswith(f"{app / 'myenv'} is a virtual environment")
    assert "would package its .py files" in packaged
    data = app / "data"
    data.mkdir()
    for k in range(3):
        (data / f"all_data_{k}.json").write_bytes(b"[" + b"0," * (2 << 20) + b"0]")
    [size] = [w for w in app_folder_warnings(app, {}) if w.startswith("flwr run would package")]
    assert f"{data / 'all_data_0.json'} (4.0 MB)" in size and "fab-exclude" in size
    assert not [w for w in app_folder_warnings(app, {"fab-exclude": ["data/**"]})
                if w.startswith("flwr run would package")]  # fmt: skip


def test_flowers_packaging_rules_are_the_ones_copied(tmp_path) -> None:
    from flwr.common import constant as common
    from flwr.supercore import constant as supercore

    from flower_app.cli import app_folder

    assert app_folder.FAB_MAX_SIZE == common.FAB_MAX_SIZE
    assert app_folder.FAB_INCLUDE == common.FAB_INCLUDE_PATTERNS
    assert app_folder.FAB_EXCLUDE == common.FAB_EXCLUDE_PATTERNS
    assert app_folder.PUBLISH_INCLUDE == supercore.APP_PUBLISH_INCLUDE_PATTERNS
    assert app_folder.PUBLISH_EXCLUDE == supercore.APP_PUBLISH_EXCLUDE_PATTERNS


# ------------------------------------------------------------------ one SuperLink per home
def test_ports_reports_every_superlink_on_the_homes_database(tmp_path) -> None:
    """A plain flwr run after flower-app run starts a second SuperLink on the same home's
    database: flower-app ports names both (PID, ports) and says what to do."""
    home = (tmp_path / "home").resolve()
    links = [(free_port(), free_port()) for _ in range(2)]
    procs = []
    try:
        for http, control in links:  # the second after the first, as a later flwr run does
            procs.append(_local_superlink(home, http, control))
            wait_for_port(http, timeout=300)
        proc = _cli(["ports"], home, timeout=120)
        assert proc.returncode == 0 and proc.stdout.startswith("export "), proc.stderr
        lines = proc.stderr.splitlines()
        for p, (http, control) in zip(procs, links, strict=True):
            assert (f"flower-app ports: SuperLink PID {p.pid} uses {home / 'local-superlink'} "
                    f"(ports {http}, {control})") in lines  # fmt: skip
        assert any("warning: 2 SuperLinks share the database" in x for x in lines), lines
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)
