"""Resume: a FedSM run whose SuperLink (and with it the ServerApp) dies mid-run continues.

A real ``flwr run`` on a private local SuperLink is stopped after round 3; ``resume = true``
with the same run_config on a fresh SuperLink continues from the run folder's
``checkpoint.npz``: the finished rounds are not redone, ``metrics.jsonl`` holds every round
once, and S is the uninterrupted run's (the direct engine's, which Flower matches exactly).
Marked ``deploy`` (a SuperLink killed; about two minutes): CI runs it.

The ServerApp hands every family to the same ``runner.server_run(grid, cfg)``
(``flower_app/server_app.py``), so Flower's side of a resume (a SuperLink killed, a new
``flwr run`` with ``resume = true``) is the same for every family and is run here once, with
FedSM. Each family's own resume (what its checkpoint holds, that the resumed run ends as the
uninterrupted one) is checked through its runner with the ServerApp dying mid-run, in the
default suite: ``tests/test_node_failures.py::test_a_run_resumes_after_the_serverapp_died``
(FedCG, discrete greedy, FedAdam on submodels, MaxFL; the server holding its data) and
``::test_server_data_none_run_resumes_after_the_serverapp_died`` (FedSM, FedCG, FedSubAvg
with ``server-data = 'none'``); on the deployment rehearsal,
``tests/test_deploy_failures.py::test_superlink_and_serverapp_killed_then_resumed_to_the_same_set``.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from direct import run_direct
from flower_app.config import AppConfig
from flower_app.simulation import LocalSimulation, superlink_pids
from rehearsal.processes import kill_tree

pytestmark = pytest.mark.deploy

FEDSM = {
    "algorithm": "fedsm",
    "num-users": 400,
    "num-elements": 600,
    # 20 rounds: the SuperLink is killed within a poll (0.05 s) of round 3's row; a round
    # takes ~0.3 s here idle, more under load (was 60: the resumed part cost a minute more)
    "k": 20,
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


def _interrupt_and_resume(tmp_path, cfg: dict, rounds: int, after: int = 3):
    """Run ``cfg`` with ``flwr run``, crash its SuperLink after round ``after``, resume."""
    runs = tmp_path / "runs"
    folder = runs / cfg["run-name"]
    first = LocalSimulation(tmp_path / "home-1", runs)
    outcome: list[BaseException | object] = []
    worker = threading.Thread(target=lambda: _quietly(first.run, cfg, outcome), daemon=True)
    worker.start()
    deadline = time.monotonic() + 300
    while max(_rounds(folder), default=0) < after:
        assert time.monotonic() < deadline, f"round {after} never ended"
        time.sleep(0.05)
    _crash(first)  # the SuperLink dies, and the simulation and ServerApp with it
    # `flwr run --stream` ends with it, and LocalSimulation.run says so at once (it polled
    # `flwr ls` for 2 minutes, which started a fresh SuperLink listing the run as running)
    worker.join(timeout=120)
    assert not worker.is_alive() and len(outcome) == 1, "flwr run did not return"
    assert isinstance(outcome[0], RuntimeError) and "SuperLink" in str(outcome[0]), outcome
    first.stop()  # what is left of the killed run (its Ray, by this FLWR_HOME)
    done = max(_rounds(folder))
    assert after <= done < rounds, "the run ended before it could be interrupted"
    assert not (folder / "summary.json").exists()
    second = LocalSimulation(tmp_path / "home-2", runs)
    try:
        run = second.run({**cfg, "resume": True}, timeout=600)
    finally:
        second.stop()
    assert run.status == "finished:completed", run.output[-3000:] + run.details
    # a round's metrics row is written just before its checkpoint: a crash between the two
    # resumes from the round before (and runs that round again; its row is replaced)
    assert after - 1 <= run.summary["resumed-from-round"] <= done
    assert "resuming after round" in run.output
    assert [r for r in _rounds(folder) if r > 0] == list(range(1, rounds + 1))  # each once
    return run


def test_fedsm_resumed_after_the_superlink_died_ends_as_the_uninterrupted_run(tmp_path) -> None:
    run = _interrupt_and_resume(tmp_path, FEDSM, FEDSM["k"])
    direct = run_direct(
        AppConfig.from_run_config(
            {**FEDSM, "output-dir": str(tmp_path / "direct"), "run-name": "direct"}
        )
    )
    assert run.summary["selected"] == direct["selected"]
    assert run.summary["objective"] == pytest.approx(direct["objective"])


def _quietly(fn, cfg, outcome: list) -> None:
    """``fn(cfg)``, its result or exception appended to ``outcome`` (killed on purpose)."""
    try:
        outcome.append(fn(cfg, timeout=300))
    except Exception as err:  # noqa: BLE001 - checked by the caller
        outcome.append(err)


def _crash(sim: LocalSimulation) -> None:
    """SIGKILL the SuperLink this object started and every process under it."""
    for root in superlink_pids(sim.http_port):
        kill_tree(root)


def test_resume_refuses_a_different_configuration(tmp_path) -> None:
    cfg = {**FEDSM, "k": 4, "output-dir": str(tmp_path), "run-name": "r"}
    from flower_app.runners.fedsm import _open

    exp = _open(AppConfig.from_run_config(cfg), "flower")
    exp.writer.save_checkpoint({"server-round": 1})
    with pytest.raises(ValueError, match=r"differs .*'k'"):
        _open(AppConfig.from_run_config({**cfg, "k": 5, "resume": True}), "flower")
