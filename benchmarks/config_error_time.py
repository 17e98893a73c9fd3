"""Seconds from the command to a config error: ``flower-app run`` against ``flwr run``.

``flower-app run`` checks the run_config in-process before anything of Flower starts
(``flower_app/cli/run.py: preflight``). The reference, measured in the same run, is the
earliest refusal Flower itself gives: ``flwr run . --run-config "zzz=1"`` (an unknown key,
refused by the SuperLink with ``[code: 15]`` after it has started a local SuperLink and
packaged the app) on a fresh ``FLWR_HOME`` with private ports. A bad *value* gets no such
refusal from Flower: it fails in the ServerApp after the simulation has started.

Usage: ``python benchmarks/config_error_time.py [--repeat 5]
[--out docs/benchmarks/config-error-time.json]``
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
CASES = [
    "k=abc",
    "secure-aggregation=maybe",
    "k=20 k=30",
    "k=0",
    "fsa-round=5",
    "fsa-lr=0.5",
    "dataset='coverage-sets' data-file='/nonexistent/sets.txt'",
    # rules the runners enforce, checked on the instance before Flower starts
    "fedsm-mode='alg2' fedsm-epsilon=1.5",
    "fedsm-mode='amplified' fedsm-eta=0.3",
    "clients-per-round=5000",
    "elements-per-client=600",
    "k=600",
    "k=100000000000000000000000000",
    "matroid='partition' k=40",
    "secure-aggregation=true",
    "dataset='facility-location-table' data-file='/tmp/x.npz'",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _time(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, proc.returncode, proc.stdout + proc.stderr


def main() -> None:
    from flower_app.cli.run import PORT_ENV, local_superlink_pids

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "docs/benchmarks/config-error-time.json"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flower-app-config-error-"))
    base = {k: v for k, v in os.environ.items() if k not in PORT_ENV}
    base.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    ours: dict[str, list[float]] = {case: [] for case in CASES}
    flower: list[float] = []
    failed: list[str] = []
    try:
        for r in range(args.repeat):
            for case in CASES:
                env = {**base, "FLWR_HOME": str(tmp / f"ours-{r}")}
                seconds, code, out = _time(
                    [str(BIN / "flower-app"), "run", ".", "--run-config", case], env
                )
                assert code == 2 and not (tmp / f"ours-{r}").exists(), out
                ours[case].append(seconds)
            home = tmp / f"flwr-{r}"
            env = {**base, "FLWR_HOME": str(home), PORT_ENV_HTTP: str(_free_port()),
                   PORT_ENV_CONTROL: str(_free_port())}  # fmt: skip
            seconds, _, out = _time([str(BIN / "flwr"), "run", ".", "--run-config", "zzz=1"], env)
            if "Invalid run configuration" in out:
                flower.append(seconds)
            else:  # e.g. Flower's 15 s limit on starting its SuperLink, on a loaded machine
                failed.append(" ".join(out.split())[-200:])
            for pid in local_superlink_pids(home.resolve()):  # the one it started, by PID
                os.kill(pid, signal.SIGTERM)
    finally:
        time.sleep(1)
        shutil.rmtree(tmp, ignore_errors=True)
    medians = {case: round(statistics.median(v), 3) for case, v in ours.items()}
    reference = statistics.median(flower) if flower else float("nan")
    report = {
        "what": "seconds to a config error (benchmarks/config_error_time.py)",
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "load-average-1min-at-end": os.getloadavg()[0],
        "flower-app-run-median-s": medians,
        "flower-app-run-max-s": round(max(max(v) for v in ours.values()), 3),
        "flwr-run-unknown-key-median-s": round(reference, 3),
        "flwr-run-did-not-refuse": failed,
        "ratio-flower-app-to-flwr": round(max(medians.values()) / reference, 3),
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


PORT_ENV_HTTP = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"
PORT_ENV_CONTROL = "FLWR_LOCAL_CONTROL_API_PORT"

if __name__ == "__main__":
    main()
