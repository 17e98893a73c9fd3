"""Every code block of README.md and docs/getting-started.md runs, as written.

``CHECKS`` names each block's check, by file and position; a block without a check (or a
check without its block) fails ``test_every_block_has_a_check``. What runs where:

- the README's second command (``pytest``) is CI's own test command: ``.ci/run`` reads it
  from the README and runs it; the test checks that it still does;
- the install part of the first line (``python3 -m venv``, ``pip install``) is what
  ``.ci/run`` does on a fresh clone: the test checks that the README installs no other pin
  or extra than CI installs;
- the Python blocks, ``python -m flower_app.settings --check``, ``flower-app report`` and the
  deployment block (certificates, node keys, node files) run here in the default suite, in
  a temporary folder;
- the README's drop-in block runs on ``tests/support/local_grid.py``'s in-process grid, which
  stands for the ``grid`` Flower passes a ServerApp (the one name the block does not
  define); the same drop-in under Flower's engine is ``tests/test_examples_topk_fedsm.py``;
- the blocks that start a whole Flower simulation (``flwr run``: the rest of the README's
  first line, its simulation block and the getting-started page's) run under the ``long``
  marker (CI), as written, in a copy of the project with its own ``FLWR_HOME`` and
  SuperLink ports, one after the other on one local SuperLink, stopped at the end.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flower_app.simulation import superlink_pids
from rehearsal.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
BIN = Path(sys.executable).parent


def code_blocks(path: Path) -> list[tuple[str, str]]:
    """Return ``(language, text)`` of every fenced code block of a Markdown file."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", path.read_text(encoding="utf-8"), re.M | re.S)


def _block(path: Path, index: int) -> str:
    return code_blocks(path)[index][1]


#: (file, block index) -> the check that runs it (a test below)
CHECKS = {
    ("README.md", 0): "install line: test_install_is_what_ci_installs; flwr run: long test; "
    "second line: test_the_test_command_is_what_ci_runs",
    ("README.md", 1): "test_flwr_run_blocks (long)",
    ("README.md", 2): "test_readme_drop_in_block_runs",
    ("README.md", 3): "test_readme_deployment_block_runs",
    ("getting-started.md", 0): "test_getting_started_install_is_the_readmes",
    ("getting-started.md", 1): "test_flwr_run_blocks (long)",
    ("getting-started.md", 2): "test_getting_started_blocks_run",
    ("getting-started.md", 3): "test_getting_started_blocks_run",
    ("getting-started.md", 4): "test_getting_started_blocks_run",
}


def test_every_block_has_a_check() -> None:
    found = {(p.name, i) for p in (README, GETTING_STARTED) for i in range(len(code_blocks(p)))}
    assert found == set(CHECKS), "a code block was added or removed: give it a check"
    languages = {(p.name, i): lang for p in (README, GETTING_STARTED)
                 for i, (lang, _) in enumerate(code_blocks(p))}  # fmt: skip
    assert all(lang in ("bash", "python") for lang in languages.values()), languages


def _readme_first_line() -> list[str]:
    return _block(README, 0).splitlines()[0].split(" && ")


def test_the_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "sed -n '/^```bash/{n;n;p;q}' README.md" in ci and 'eval "$test_cmd"' in ci
    lines = _block(README, 0).splitlines()
    assert code_blocks(README)[0][0] == "bash" and len(lines) == 2
    assert lines[1] == ". .venv/bin/activate && pytest"


def test_install_is_what_ci_installs() -> None:
    parts = _readme_first_line()
    # the environment beside the checkout, .venv a link to it, as .ci/run makes it
    assert parts[:3] == ['python3 -m venv "$PWD.venv"', 'ln -sfn "$PWD.venv" .venv',
                         ". .venv/bin/activate"]  # fmt: skip
    ci_text = (ROOT / ".ci" / "run").read_text()
    assert 'ln -s "$PWD.venv" .venv' in ci_text
    assert 'python3 -m venv "$(readlink -f .venv)"' in ci_text
    readme = re.fullmatch(r'pip install (--no-compile )?"(torch==[\d.]+)" -e "\.\[([\w,]+)\]"',
                          parts[3])  # fmt: skip
    # CI installs the same requirements with uv (same versions, faster: .ci/run's comment)
    uv = [line for line in ci_text.replace("\\\n", " ").splitlines() if "uv pip install" in line]
    ci = re.search(r'"(torch==[\d.]+)" -e "\.\[([\w,]+)\]"', uv[0]) if len(uv) == 1 else None
    assert readme and ci, (parts[3], uv)
    # both compile modules at install (pip by default, uv when asked), or neither
    assert (readme.group(1) is None) == ("--compile-bytecode" in uv[0].split())
    assert readme.group(2) == ci.group(1)  # the same torch pin
    assert set(readme.group(3).split(",")) <= set(ci.group(2).split(","))  # extras
    assert parts[4].startswith("export ") and parts[5] == "flower-app run ."


def test_getting_started_install_is_the_readmes() -> None:
    assert _block(GETTING_STARTED, 0).strip() == _block(README, 0).splitlines()[0]


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(tmp_path / "flwr-home"),
        "FLOWER_APP_OUTPUT": str(tmp_path / "runs"),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }


def _bash(script: str, cwd: Path, env: dict[str, str], timeout: float = 300):
    return subprocess.run(["bash", "-c", f"set -euo pipefail\n{script}"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_readme_drop_in_block_runs(capsys) -> None:
    from tests.support.local_grid import LocalGrid

    client_part, server_part = re.split(r"^# server_app\.py.*$", _block(README, 2), flags=re.M)
    namespace: dict = {}
    exec(compile(client_part, "README.md (drop-in, ClientApp)", "exec"), namespace)  # noqa: S102
    namespace["grid"] = LocalGrid(4, {}, app=namespace["app"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(server_part, "README.md (drop-in, ServerApp)", "exec"), namespace)  # noqa: S102
    selected = namespace["result"].arrays["selected"].numpy().tolist()
    # every client and item is sampled (K = d = 1.0), so FedSM is greedy: item 7 (worth 2 to
    # all four clients, F = 2) first, then client 0's own item (+3 for one client of four;
    # ties go to the lowest index)
    assert selected == [7, 0]
    assert str(namespace["result"].arrays["selected"].numpy()) in out.getvalue()


def test_readme_deployment_block_runs(tmp_path) -> None:
    proc = _bash(_block(README, 3), tmp_path, _env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("ca.crt", "server.pem", "server.key"):
        assert (tmp_path / "certs" / name).is_file()
    keys = sorted(p.name for p in (tmp_path / "keys").iterdir())
    assert keys == [f"supernode-{i}{s}" for i in range(4) for s in ("", ".pub")]
    manifest = json.loads((tmp_path / "nodes-4" / "manifest.json").read_text())
    assert [f["partition-id"] for f in manifest["files"]] == [0, 1, 2, 3]
    assert all((tmp_path / "nodes-4" / f["file"]).is_file() for f in manifest["files"])


def test_getting_started_blocks_run(tmp_path) -> None:
    env = _env(tmp_path)
    check = _bash(_block(GETTING_STARTED, 2), tmp_path, env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "did you mean 'fedsm-mode'" in check.stdout + check.stderr
    assert "refused, as it should be" in check.stdout
    direct = subprocess.run([sys.executable, "-c", _block(GETTING_STARTED, 3)], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert direct.returncode == 0, direct.stderr
    summary = json.loads((tmp_path / "runs" / "fedsm-k10" / "summary.json").read_text())
    assert str(summary["selected"]) in direct.stdout and len(summary["selected"]) == 10
    report = _bash(_block(GETTING_STARTED, 4), tmp_path, env)
    assert report.returncode == 0, report.stdout + report.stderr
    for name in ("report.md", "quality.png", "bytes.png", "participants.png"):
        assert name in report.stdout and (tmp_path / "runs" / "report" / name).is_file()


@pytest.mark.long
def test_flwr_run_blocks(tmp_path) -> None:
    """The README's first line after the install, its simulation block, getting-started's."""
    project = tmp_path / "project"  # a copy: the blocks set FLWR_HOME="$PWD/.flwr"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()  # fmt: skip
    for name in files:
        if (ROOT / name).is_file():
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, project / name)
    env = _env(tmp_path)
    port = free_port()
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(port)  # never the machine-wide default
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_port())
    exports = _readme_first_line()[4]
    runs = {
        "main job": " && ".join(_readme_first_line()[4:]),
        "README simulation": f"{exports} && {_block(README, 1).strip()}",
        "getting started": f"{exports} && {_block(GETTING_STARTED, 1).strip()}",
    }
    try:
        for what, script in runs.items():
            proc = _bash(script, project, env, timeout=900)
            output = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"{what}:\n{output[-3000:]}"
            assert re.search(r"flower engine\): F\(S\) = [\d.]+, centralized greedy", output), (
                f"{what}: no result line\n{output[-3000:]}"
            )
    finally:
        for pid in superlink_pids(port):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    for name in ("readme-fedcg", "fedcg-k5"):
        summary = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
        assert summary["algorithm"] == "fedcg" and len(summary["selected"]) == 5
