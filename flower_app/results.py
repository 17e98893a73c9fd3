"""The run folder: ``config.json``, ``metrics.jsonl`` (one line per round), ``summary.json``.

A run folder is never overwritten: a new run refuses a folder that holds a run
(:func:`claim_run_folder`); ``resume = true`` is the only way to write into one.

Written as the run goes: the config first, each round's line as soon as the round ends
(flushed), the summary last, so an interrupted run keeps every finished round. A resumable
strategy also leaves ``checkpoint.pkl`` after every round (its state, replaced atomically),
from which ``resume = true`` continues an interrupted run in the same folder.

Every round reaches the operating system at once, so a killed process (a stopped SuperLink,
Ctrl-C, an out-of-memory kill) loses nothing. Forcing it to the disk (``fsync``) costs a few
milliseconds, as much as a whole short round, so it happens at most once per ``sync_every``
seconds (default 1 s) and at the end: a machine that loses power may lose the last second of
rounds, and resuming then continues from the last checkpoint that reached the disk.

Two times are recorded in ``summary.json``: ``wall-time``, the rounds' (from the strategy's
start to its end, as each family's runner measures it), and ``run-wall-time``, the whole run's:
from the start of the session (:func:`run_session`: the SuperLink accepting the run under
``flwr run``, the call of :func:`flower_app.experiment.run_direct`), through loading data, the
greedy reference and discovery, to the summary. A resumed run adds each earlier session's time
up to its last checkpoint (kept in ``checkpoint.pkl``), and ``run-sessions`` counts them.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CHECKPOINT",
    "ResumeError",
    "RunFolderError",
    "RunWriter",
    "claim_run_folder",
    "held_run",
    "read_metrics",
    "run_session",
    "to_jsonable",
]

#: the checkpoint file of a run folder
CHECKPOINT = "checkpoint.pkl"
#: config keys that may differ between an interrupted run and its resumption
RESUME_MAY_CHANGE = (
    "resume", "round-timeout", "discovery-timeout", "min-reply-fraction", "node-return-wait"
)
#: checkpoint key of the run's time so far (seconds, all sessions up to that checkpoint)
_ELAPSED = "run-elapsed"
#: when the current session started (Unix time), set by :func:`run_session`
_SESSION_START: ContextVar[float | None] = ContextVar("flower_app_session_start", default=None)


@contextmanager
def run_session(started_at: float | None = None) -> Iterator[float]:
    """Mark the start of a run session for the :class:`RunWriter` opened inside it.

    Parameters
    ----------
    started_at : float, optional
        Unix time the session started (e.g. when the SuperLink accepted the run); default:
        now. A writer opened outside any session counts from its own creation.

    Yields
    ------
    float
        The start time used.
    """
    start = time.time() if started_at is None else float(started_at)
    token = _SESSION_START.set(start)
    try:
        yield start
    finally:
        _SESSION_START.reset(token)


class ResumeError(ValueError):
    """A run folder cannot be resumed (no checkpoint, or a different configuration)."""


class RunFolderError(ValueError):
    """A new run's folder already holds a run: it is never overwritten."""


#: files that mark a folder as holding a run (a new run refuses such a folder)
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json")


def held_run(folder: Path) -> str | None:
    """Return what shows that ``folder`` holds a run, or None (no folder, no run file).

    E.g. ``"config.json, metrics.jsonl (10 rows)"``: the :data:`RUN_FILES` present.
    """
    held = [name for name in RUN_FILES if (Path(folder) / name).exists()]
    if not held:
        return None
    rows = Path(folder) / "metrics.jsonl"
    if rows.is_file():
        with rows.open("rb") as fh:
            count = sum(1 for line in fh if line.strip())
        held[held.index("metrics.jsonl")] = f"metrics.jsonl ({count} rows)"
    return ", ".join(held)


def claim_run_folder(folder: Path) -> None:
    """Make ``folder`` a new run's: create it, refuse it if it holds a run.

    ``config.json`` is created exclusively (``open(..., "x")``), so of two runs started with
    the same folder at once one gets it and the other is refused.

    Raises
    ------
    RunFolderError
        Naming the folder and what it holds.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    held = held_run(folder)
    try:
        if held is None:
            (folder / "config.json").open("x").close()
    except FileExistsError:
        held = "config.json"
    if held is not None:
        raise RunFolderError(
            f"run folder {folder} already holds a run ({held}); a run folder is never "
            "overwritten: choose another run_config 'run-name' (or 'output-dir'), or resume = "
            "true to continue that run"
        )


def to_jsonable(value: Any) -> Any:
    """Convert numpy types, paths and non-finite floats to plain JSON values."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


#: modules of the server states a checkpoint pickles, as they were named before
#: ``flower_app.algorithms`` got one subpackage per family (checkpoints of runs interrupted
#: before that move resume after it)
MOVED_MODULES = {
    f"flower_app.algorithms.{old}": f"flower_app.algorithms.{new}"
    for old, new in {
        "fedsm": "fedsm.core", "fedsm_alg2": "fedsm.alg2", "fedsm_amplify": "fedsm.amplify",
        "fedsm_dp": "fedsm.dp", "fedsm_modes": "fedsm.modes", "fedsm_sampling": "fedsm.sampling",
        "fedsm_user": "fedsm.user", "shuffle_dp": "fedsm.shuffle_dp",
        "fedcg": "fedcg.continuous", "discrete_greedy": "fedcg.discrete_greedy",
        "maxfl": "maxfl.core", "appeal": "maxfl.appeal", "fl_baselines": "maxfl.baselines",
        "participation": "maxfl.participation", "server_rules": "maxfl.server_rules",
        "learning": "maxfl.learning", "fedsubavg": "fedsubavg.core",
        "fedsubavg_direct": "fedsubavg.direct", "fedsubavg_named": "fedsubavg.named",
        "fedsubavg_dp": "fedsubavg.dp", "fedsubavg_torch": "fedsubavg.torch_engine",
        "torch_tasks": "fedsubavg.torch_tasks", "counts": "common.counts",
        "dp_noise": "common.dp_noise", "gaussian_dp": "common.gaussian_dp",
    }.items()
}  # fmt: skip


class _CheckpointUnpickler(pickle.Unpickler):
    """Read a run's own ``checkpoint.pkl``, mapping the server states' moved modules."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED_MODULES.get(module, module), name)


class RunWriter:
    """Writes one run's folder.

    Parameters
    ----------
    folder : pathlib.Path
        Run folder (created). A new run refuses a folder that holds a run
        (:func:`claim_run_folder`); only ``resume`` writes into one.
    config : dict
        Written to ``config.json`` at once.
    resume : bool, optional
        Continue the interrupted run in ``folder``: its ``config.json`` must match
        ``config`` (except :data:`RESUME_MAY_CHANGE`), its ``checkpoint.pkl`` is loaded into
        :attr:`checkpoint`, and ``metrics.jsonl`` keeps the rows up to the checkpoint's
        round (later rows, written after the checkpoint, are dropped: they are redone).
    sync_every : float, optional
        Seconds between two ``fsync`` of ``metrics.jsonl`` (and between two of the
        checkpoint; the metrics are synced first, so the rows on disk always reach the
        checkpoint on disk). 0 syncs every round.

    Raises
    ------
    RunFolderError
        Without ``resume``: the folder holds a run.
    ResumeError
        With ``resume``: no checkpoint in the folder, or a configuration that differs (the
        keys are named).
    """

    def __init__(
        self, folder: Path, config: dict[str, Any], resume: bool = False, sync_every: float = 1.0
    ) -> None:
        self.folder = Path(folder)
        self.sync_every = float(sync_every)
        self._synced = {"metrics": time.monotonic(), "checkpoint": time.monotonic()}
        started = _SESSION_START.get()
        self._session_start = time.time() if started is None else started
        self._elapsed_before = 0.0  # earlier sessions' time (a resumed run)
        self._sessions = 1
        if resume:
            self.folder.mkdir(parents=True, exist_ok=True)
        else:
            claim_run_folder(self.folder)
        #: the loaded checkpoint (``resume``), else None
        self.checkpoint: dict[str, Any] | None = None
        kept: list[dict[str, Any]] = []
        if resume:
            self.checkpoint = self._load_checkpoint(config)
            self._elapsed_before = float(self.checkpoint.get(_ELAPSED, 0.0))
            self._sessions = int(self.checkpoint.get("run-sessions", 1)) + 1
            last = int(self.checkpoint["server-round"])
            kept = [r for r in _complete_rows(self.folder) if int(r.get("server-round", 0)) <= last]
        _atomic_write(self.folder / "config.json", json.dumps(to_jsonable(config), indent=2))
        _atomic_write(
            self.folder / "metrics.jsonl", "".join(json.dumps(to_jsonable(r)) + "\n" for r in kept)
        )
        self._metrics = (self.folder / "metrics.jsonl").open("a", encoding="utf-8")
        #: merged into ``summary.json`` (e.g. a Flower run's node failures)
        self.extra_summary: dict[str, Any] = {}

    def run_elapsed(self) -> float:
        """Return the run's time so far in seconds: this session's plus earlier sessions'."""
        return self._elapsed_before + max(0.0, time.time() - self._session_start)

    def _due(self, what: str) -> bool:
        """Return whether ``what`` should be synced now (and note that it is)."""
        now = time.monotonic()
        if now - self._synced[what] < self.sync_every:
            return False
        self._synced[what] = now
        return True

    def log_round(self, row: dict[str, Any]) -> None:
        """Append one round's metrics as a JSON line; flush it, sync it when due."""
        self._metrics.write(json.dumps(to_jsonable(row)) + "\n")
        self._metrics.flush()
        if self._due("metrics"):
            os.fsync(self._metrics.fileno())

    def _load_checkpoint(self, config: dict[str, Any]) -> dict[str, Any]:
        path = self.folder / CHECKPOINT
        if not path.exists():
            raise ResumeError(
                f"resume: {path} does not exist: the run folder has no checkpoint (the run "
                "never finished a round, or its strategy is not resumable)"
            )
        old = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))
        new = to_jsonable(config)
        differ = sorted(
            k
            for k in set(old) | set(new)
            if k not in RESUME_MAY_CHANGE and old.get(k) != new.get(k)
        )
        if differ:
            raise ResumeError(
                f"resume: the configuration differs from the interrupted run's in {differ} "
                f"(e.g. {differ[0]}: {old.get(differ[0])!r} then, {new.get(differ[0])!r} now); "
                "resume with the same run_config"
            )
        try:
            with path.open("rb") as fh:
                return dict(_CheckpointUnpickler(fh).load())
        except (ImportError, AttributeError) as ex:
            raise ResumeError(
                f"resume: {path} was written by a version of flower_app whose server state "
                f"this version cannot read ({type(ex).__name__}: {ex}); finish it with that "
                "version, or start the run again without 'resume'"
            ) from ex
        except (EOFError, pickle.UnpicklingError, TypeError, ValueError) as ex:
            raise ResumeError(
                f"resume: {path} is unreadable ({type(ex).__name__}: {ex}); if the machine "
                "lost power, the last checkpoint may not have reached the disk: start the run "
                "again without 'resume'"
            ) from ex

    def save_checkpoint(self, payload: dict[str, Any]) -> None:
        """Replace ``checkpoint.pkl`` atomically with ``payload`` (a strategy's state).

        When a sync is due, the metrics are synced first, then the checkpoint. The run's
        time so far and its session count are stored beside the strategy's state, so that a
        resumed run's ``run-wall-time`` counts the interrupted session too.
        """
        payload = {**payload, _ELAPSED: self.run_elapsed(), "run-sessions": self._sessions}
        tmp = self.folder / (CHECKPOINT + ".tmp")
        sync = self._due("checkpoint")
        if sync:
            os.fsync(self._metrics.fileno())
        with tmp.open("wb") as fh:
            pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, self.folder / CHECKPOINT)

    def record_failures(self, failures: dict[str, Any]) -> None:
        """Put a Flower run's node failures into the summary (``degraded`` and ``failures``).

        Parameters
        ----------
        failures : dict
            :meth:`flower_app.strategies.base.RoundStrategy.failure_summary`.
        """
        self.extra_summary["degraded"] = bool(failures.get("degraded"))
        self.extra_summary["failures"] = failures

    def write_summary(self, summary: dict[str, Any]) -> Path:
        """Write ``summary.json``, sync and close the metrics file; return the summary's path."""
        if not self._metrics.closed:  # a runner may write the summary again with more keys
            self._metrics.flush()
            os.fsync(self._metrics.fileno())
            self._metrics.close()
        if self.checkpoint is not None:
            summary["resumed-from-round"] = int(self.checkpoint["server-round"])
        summary["run-wall-time"] = self.run_elapsed()
        summary["run-sessions"] = self._sessions
        summary["session-started-at"] = datetime.fromtimestamp(
            self._session_start, UTC
        ).isoformat(timespec="seconds")
        summary.update(self.extra_summary)
        path = self.folder / "summary.json"
        _atomic_write(path, json.dumps(to_jsonable(summary), indent=2))
        return path


def _complete_rows(folder: Path) -> list[dict[str, Any]]:
    """Rows of ``metrics.jsonl`` without a last line cut short by a crash."""
    path = Path(folder) / "metrics.jsonl"
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl`` of a run folder (one dict per round)."""
    lines = (Path(folder) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
