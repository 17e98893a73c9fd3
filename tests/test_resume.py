"""Resume: a FedSM run whose SuperLink (and with it the ServerApp) dies mid-run continues.

A real ``flwr run`` on a private local SuperLink is stopped after round 3; ``resume = true``
with the same run_config on a fresh SuperLink continues from the run folder's
``checkpoint.pkl``: the finished rounds are not redone, ``metrics.jsonl`` holds every round
once, and S is the uninterrupted run's (the direct engine's, which Flower matches exactly).
Marked ``deploy`` (a SuperLink killed; about a minute): CI runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import pytest

from flower_app.config import AppConfig
from flower_app.deploy.processes import _children
from flower_app.experiment import run_direct
from flower_app.simulation import LocalSimulation, superlink_pids

pytestmark = pytest.mark.deploy

FEDSM = {
    "algorithm": "fedsm",
    "num-users": 400,
    "num-elements": 600,
    "k": 60,
    "clients-per-round": 0.2,
    "elements-per-client": 0.2,
    "seed": 11,
    "run-name": "interrupted",
}


def _rounds(folder) -> list[int]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(int(json.loads(line)["server-round"]))
        except (ValueError, KeyError):
            break
    return out


def test_resume_after_the_superlink_died_ends_as_the_uninterrupted_run(tmp_path) -> None:
    runs = tmp_path / "runs"
    folder = runs / FEDSM["run-name"]
    first = LocalSimulation(tmp_path / "home-1", runs)
    worker = threading.Thread(target=lambda: _quietly(first.run, FEDSM), daemon=True)
    worker.start()
    deadline = time.monotonic() + 300
    while max(_rounds(folder), default=0) < 3:
        assert time.monotonic() < deadline, "round 3 never ended"
        time.sleep(0.05)
    _crash(first)  # the SuperLink dies, and the simulation and ServerApp with it
    worker.join(timeout=120)
    first.stop()  # the `flwr ls` of the interrupted run's CLI started a fresh SuperLink
    done = max(_rounds(folder))
    assert 3 <= done < FEDSM["k"], "the run ended before it could be interrupted"
    assert not (folder / "summary.json").exists()

    second = LocalSimulation(tmp_path / "home-2", runs)
    try:
        run = second.run({**FEDSM, "resume": True}, timeout=600)
    finally:
        second.stop()
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    checkpointed = run.summary["resumed-from-round"]
    assert 3 <= checkpointed <= done
    assert "resuming after round" in run.output
    assert _rounds(folder) == list(range(1, FEDSM["k"] + 1))  # each round once
    direct = run_direct(
        AppConfig.from_run_config(
            {**FEDSM, "output-dir": str(tmp_path / "direct"), "run-name": "direct"}
        )
    )
    assert run.summary["selected"] == direct["selected"]
    assert run.summary["objective"] == pytest.approx(direct["objective"])


def _quietly(fn, cfg) -> None:
    with contextlib.suppress(Exception):  # the run is killed on purpose
        fn(cfg, timeout=300)


def _crash(sim: LocalSimulation) -> None:
    """SIGKILL the SuperLink this object started and every process under it."""
    for root in superlink_pids(sim.http_port):
        victims, todo = [], [root]
        while todo:
            pid = todo.pop()
            victims.append(pid)
            todo += _children(pid)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_resume_refuses_a_different_configuration(tmp_path) -> None:
    cfg = {**FEDSM, "k": 4, "output-dir": str(tmp_path), "run-name": "r"}
    from flower_app.runners.fedsm import _open

    exp = _open(AppConfig.from_run_config(cfg), "flower")
    exp.writer.save_checkpoint({"server-round": 1})
    with pytest.raises(ValueError, match=r"differs .*'k'"):
        _open(AppConfig.from_run_config({**cfg, "k": 5, "resume": True}), "flower")
