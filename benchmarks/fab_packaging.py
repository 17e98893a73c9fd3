"""How long ``flwr run .`` takes to package this app, with the environment inside or beside it.

Flower 1.42 builds the app package (FAB) by walking *every* file of the app folder
(``flwr.cli.utils.collect_files``: ``os.walk`` plus a ``resolve()`` per file) and only then
drops what ``.gitignore`` and its own exclude patterns name. A virtual environment inside
the checkout (``.venv``, 45,000 files) is walked on every ``flwr run``; a *symbolic link*
``.venv`` is not entered (``os.walk(followlinks=False)``).

Three copies of the checkout (``git archive HEAD``) are timed in the same run:

``venv-inside``  ``.venv`` a real folder (hard links of this environment's files: the same
                 45,000 entries to walk), as ``python3 -m venv .venv`` makes it;
``venv-linked``  ``.venv`` a symbolic link to the environment beside the checkout;
``no-venv``      no ``.venv`` at all (the reference).

For each: ``build_fab_from_disk`` (the packaging alone, in a fresh process, median of
``--repeat``), and the whole ``flwr run . --run-config zzz=1`` against a running local
SuperLink of a private ``FLWR_HOME``: the CLI starts, packages, submits, and the SuperLink
refuses the unknown key, so nothing runs. The FAB bytes of the three copies are compared.

(Named ``fab_packaging``, not ``packaging``: a script in this folder runs with the folder
first on ``sys.path``, where a ``packaging.py`` shadows the installed ``packaging`` module.)

Usage: ``python benchmarks/fab_packaging.py [--repeat 5] [--out docs/benchmarks/packaging.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
VENV = Path(sys.prefix)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _copy(dest: Path, layout: str) -> Path:
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    if layout == "venv-inside":
        subprocess.run(["cp", "-al", str(VENV), str(dest / ".venv")], check=True)
    elif layout == "venv-linked":
        (dest / ".venv").symlink_to(VENV)
    return dest


_BUILD = """
import hashlib, sys, time
from pathlib import Path
from flwr.cli.build import build_fab_from_disk
from flwr.cli.utils import collect_files
app = Path(sys.argv[1])
t0 = time.perf_counter(); files = collect_files(app.resolve()); t1 = time.perf_counter()
fab = build_fab_from_disk(app); t2 = time.perf_counter()
print(len(files), t1 - t0, t2 - t1, hashlib.sha256(fab).hexdigest())
"""


def _build(app: Path) -> tuple[int, float, float, str]:
    out = subprocess.run([sys.executable, "-c", _BUILD, str(app)], capture_output=True,
                         text=True, check=True).stdout.split()  # fmt: skip
    return int(out[0]), float(out[1]), float(out[2]), out[3]


def _submit(app: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([str(BIN / "flwr"), "run", str(app), "--run-config", "zzz=1"],
                          env=env, capture_output=True, text=True)  # fmt: skip
    elapsed = time.perf_counter() - t0
    if "Invalid run configuration" not in proc.stdout + proc.stderr:
        raise RuntimeError(f"unexpected flwr run output:\n{proc.stdout}{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "packaging.json"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flower-app-packaging-"))
    home = tmp / "flwr-home"
    http, control = _free_port(), _free_port()
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http),
           "FLWR_LOCAL_CONTROL_API_PORT": str(control),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    results: dict[str, dict] = {}
    try:
        apps = {name: _copy(tmp / name, name) for name in ("no-venv", "venv-linked", "venv-inside")}
        subprocess.run([str(BIN / "flwr"), "ls"], env=env, capture_output=True)  # start it
        for _ in range(args.repeat):
            for name, app in apps.items():
                files, walk, build, digest = _build(app)
                row = results.setdefault(
                    name, {"files-walked": files, "fab-sha256": digest, "walk-s": [],
                           "build-s": [], "flwr-run-s": []},
                )  # fmt: skip
                row["walk-s"].append(walk)
                row["build-s"].append(build)
                row["flwr-run-s"].append(_submit(app, env))
    finally:
        from flower_app.cli.run import local_superlink_pids

        for pid in local_superlink_pids(home.resolve()):  # the one this run started, by PID
            os.kill(pid, signal.SIGTERM)
        time.sleep(1)
        shutil.rmtree(tmp, ignore_errors=True)
    ref = statistics.median(results["no-venv"]["flwr-run-s"])
    for row in results.values():
        for key in ("walk-s", "build-s", "flwr-run-s"):
            row[key.replace("-s", "-median-s")] = round(statistics.median(row[key]), 3)
        row["flwr-run-ratio-to-no-venv"] = round(row["flwr-run-median-s"] / ref, 2)
    digests = {row["fab-sha256"] for row in results.values()}
    report = {
        "what": "flwr run . packaging, venv inside vs linked vs none (benchmarks/fab_packaging.py)",
        "repeat": args.repeat,
        "load-average-1min-at-end": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "same-fab-bytes": len(digests) == 1,
        "layouts": results,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for name, row in results.items():
        print(f"{name:12s} files {row['files-walked']:6d}  walk {row['walk-median-s']:.3f} s  "
              f"build {row['build-median-s']:.3f} s  flwr run {row['flwr-run-median-s']:.2f} s "
              f"(x{row['flwr-run-ratio-to-no-venv']})")  # fmt: skip
    print(f"same FAB bytes: {len(digests) == 1}; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
