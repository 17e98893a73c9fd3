"""The run folder's writer: every round reaches the OS at once, the disk at most once a second.

A killed process must lose nothing (each line and checkpoint is flushed, the checkpoint
replaced atomically); ``fsync`` costs about as much as a short round, so it is throttled to
``sync_every`` seconds, syncs the metrics before the checkpoint (the rows on disk always reach
the checkpoint on disk) and always at the end. A checkpoint that did not reach the disk is
refused by name on resume, and so is an older version's pickle checkpoint (never unpickled).
"""

from __future__ import annotations

import json
import os
import pickle

import pytest

import flower_app.results as results
from flower_app.results import CHECKPOINT, ResumeError, RunWriter

CONFIG = {"algorithm": "fedsm", "k": 3}


def _spy_fsync(monkeypatch) -> list[str]:
    """Record the file name of every fsync the writer makes (and really sync it)."""
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(results.os, "fsync", fsync)
    return synced


def test_rounds_are_flushed_at_once_and_synced_only_when_due(tmp_path, monkeypatch) -> None:
    synced = _spy_fsync(monkeypatch)
    writer = RunWriter(tmp_path / "run", CONFIG, sync_every=3600.0)
    for t in range(1, 31):
        writer.log_round({"server-round": t, "value": t / 10})
        writer.save_checkpoint({"server-round": t, "state": list(range(t))})
        # another reader (a resumed run after a kill) sees the round at once
        lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["server-round"] for x in lines] == list(range(1, t + 1))
    assert synced == []  # 30 rounds within the hour: nothing forced to disk yet
    writer.write_summary({"done": True})
    assert synced == ["metrics.jsonl"]  # the end is always synced


def test_each_due_sync_puts_the_metrics_on_disk_before_the_checkpoint(tmp_path, monkeypatch):
    synced = _spy_fsync(monkeypatch)
    writer = RunWriter(tmp_path / "run", CONFIG, sync_every=0.0)
    for t in (1, 2):
        writer.log_round({"server-round": t})
        writer.save_checkpoint({"server-round": t})
    # the checkpoint is synced as its temporary file, before the rename
    temporary = [name.startswith(f".{CHECKPOINT}.") and name.endswith(".part") for name in synced]
    names = [CHECKPOINT if tmp else name for name, tmp in zip(synced, temporary, strict=True)]
    assert names == ["metrics.jsonl", "metrics.jsonl", CHECKPOINT] * 2


def test_a_checkpoint_that_did_not_reach_the_disk_is_refused_by_name(tmp_path) -> None:
    writer = RunWriter(tmp_path / "run", CONFIG)
    writer.log_round({"server-round": 1})
    writer.save_checkpoint({"server-round": 1, "x": [1.0, 2.0]})
    path = tmp_path / "run" / CHECKPOINT
    path.write_bytes(path.read_bytes()[:7])  # what a power loss may leave
    with pytest.raises(ResumeError, match=r"checkpoint.npz is unreadable .*without 'resume'"):
        RunWriter(tmp_path / "run", CONFIG, resume=True)
    path.write_bytes(b"")
    with pytest.raises(ResumeError, match="unreadable"):
        RunWriter(tmp_path / "run", CONFIG, resume=True)


def test_the_summary_may_be_written_again_with_more_keys(tmp_path) -> None:
    writer = RunWriter(tmp_path / "run", CONFIG)
    writer.log_round({"server-round": 1})
    writer.write_summary({"a": 1})
    writer.write_summary({"a": 1, "b": 2})
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # the writer adds the run's time (all sessions) and its session count
    assert summary.pop("run-sessions") == 1 and summary.pop("run-wall-time") >= 0
    assert summary.pop("session-started-at").endswith("+00:00")
    assert summary == {"a": 1, "b": 2}


def test_an_older_versions_pickle_checkpoint_is_refused_without_running_it(tmp_path) -> None:
    """Before checkpoints were plain data, a run folder held ``checkpoint.pkl``: refused by
    name, never unpickled (a pickle runs what it says: here it would create a directory)."""
    writer = RunWriter(tmp_path / "run", CONFIG)
    writer.log_round({"server-round": 1})
    ran = tmp_path / "the-pickle-ran"
    data = pickle.dumps({"server-round": 1, "state": _Mkdir(str(ran))})
    (tmp_path / "run" / "checkpoint.pkl").write_bytes(data)
    with pytest.raises(ResumeError, match=r"older version of flower_app .*checkpoint.pkl.* cannot"):
        RunWriter(tmp_path / "run", CONFIG, resume=True)
    # the same pickle under the new name is refused as a pickle
    (tmp_path / "run" / CHECKPOINT).write_bytes(data)
    with pytest.raises(ResumeError, match=r"checkpoint.npz is a pickle.*nothing in it was run"):
        RunWriter(tmp_path / "run", CONFIG, resume=True)
    assert not ran.exists()
    pickle.loads(data)  # the pickle is live: unpickling it runs its code
    assert ran.is_dir()


class _Mkdir:
    """Unpickled, this creates the directory ``path`` (what any pickle could do instead)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return os.mkdir, (self.path,)


def test_a_new_run_never_overwrites_a_run_folder(tmp_path) -> None:
    """A second run with the same folder is refused naming it and what it holds (10 rows
    stay 10 rows, config.json stays as written); resume is the only way into it."""
    from flower_app.results import RunFolderError

    folder = tmp_path / "run"
    first = RunWriter(folder, CONFIG)
    for t in range(1, 11):
        first.log_round({"server-round": t})
    first.write_summary({"done": True})
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    with pytest.raises(RunFolderError, match=rf"run folder {folder} already holds a run "
                       r"\(config.json, metrics.jsonl \(10 rows\), summary.json\)"):  # fmt: skip
        RunWriter(folder, {**CONFIG, "k": 5})
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before
    (tmp_path / "empty").mkdir()  # an empty folder made beforehand is a new run's
    RunWriter(tmp_path / "empty", CONFIG).write_summary({})


def test_two_runs_claiming_one_folder_at_once_get_it_once(tmp_path) -> None:
    """config.json is created exclusively: of two runs started together, one is refused."""
    from concurrent.futures import ThreadPoolExecutor

    from flower_app.results import RunFolderError, claim_run_folder

    def claim(_: int) -> bool:
        try:
            claim_run_folder(tmp_path / "run")
        except RunFolderError:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(claim, range(8))) == 1
