"""The run folder: ``config.json``, ``metrics.jsonl`` (one line per round), ``summary.json``.

A run folder is never overwritten: a new run refuses a folder that holds a run
(:func:`claim_run_folder`); ``resume = true`` is the only way to write into one.

Written as the run goes: the config first, each round's line as soon as the round ends
(flushed), the summary last, so an interrupted run keeps every finished round. A resumable
strategy also leaves ``checkpoint.npz`` after every round (its state as plain data: arrays and
a JSON document, :mod:`flower_app.checkpoint`; replaced atomically), from which
``resume = true`` continues an interrupted run in the same folder. A folder whose checkpoint
is an older version's ``checkpoint.pkl`` (a pickle) is refused: it is never unpickled.

Every round reaches the operating system at once, so a killed process (a stopped SuperLink,
Ctrl-C, an out-of-memory kill) loses nothing. Forcing it to the disk (``fsync``) costs a few
milliseconds, as much as a whole short round, so it happens at most once per ``sync_every``
seconds (default 1 s) and at the end: a machine that loses power may lose the last second of
rounds, and resuming then continues from the last checkpoint that reached the disk.

Two times are recorded in ``summary.json``: ``wall-time``, the rounds' (from the strategy's
start to its end, as each family's runner measures it), and ``run-wall-time``, the whole run's:
from the start of the session (:func:`run_session`: the SuperLink accepting the run under
``flwr run``, the call of the direct engine's ``run_direct``), through loading data, the
greedy reference and discovery, to the summary. A resumed run adds each earlier session's time
up to its last checkpoint (kept in ``checkpoint.npz``), and ``run-sessions`` counts them.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from flower_app.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from flower_app.files import atomic_write_text

__all__ = [
    "CHECKPOINT",
    "ResumeError",
    "RunFolder",
    "RunFolderError",
    "RunWriter",
    "claim_run_folder",
    "held_run",
    "read_rows",
    "read_run",
    "run_session",
    "to_jsonable",
]

#: the checkpoint file of a run folder
CHECKPOINT = "checkpoint.npz"
#: the checkpoint file of a run folder written by flower_app before checkpoints were plain
#: data (a pickle): refused, never read
OLD_CHECKPOINT = "checkpoint.pkl"
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
        ``config`` (except :data:`RESUME_MAY_CHANGE`), its ``checkpoint.npz`` is loaded into
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
        With ``resume``: no checkpoint in the folder, a configuration that differs (the
        keys are named), or a checkpoint that cannot be read (an older version's pickle,
        a newer version's file, a truncated or corrupt one; the file and the reason are
        named).
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
        atomic_write_text(self.folder / "config.json", json.dumps(to_jsonable(config), indent=2))
        atomic_write_text(
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
        if not path.exists() and (self.folder / OLD_CHECKPOINT).exists():
            raise ResumeError(
                f"resume: {self.folder} was written by an older version of flower_app (its "
                f"checkpoint is {OLD_CHECKPOINT}, a pickle, which this version never reads): "
                "this version cannot resume it; finish the run with the version that started "
                "it, or start it again without 'resume'"
            )
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
            payload = read_checkpoint(path)
        except CheckpointError as ex:
            advice = {
                "unreadable": "if the machine lost power, the last checkpoint may not have "
                "reached the disk: start the run again without 'resume'",
                "newer": "finish it with the newer version, or start the run again without "
                "'resume'",
            }.get(ex.kind, "finish the run with the flower_app version that wrote it, or "
                  "start it again without 'resume'")
            raise ResumeError(f"resume: {ex}; {advice}") from ex
        if not isinstance(payload, dict) or "server-round" not in payload:
            raise ResumeError(
                f"resume: {path} holds no round's state (not a run folder's checkpoint); "
                "start the run again without 'resume'"
            )
        return payload

    def save_checkpoint(self, payload: dict[str, Any]) -> None:
        """Replace ``checkpoint.npz`` atomically with ``payload`` (a strategy's state).

        The payload is stored as plain data (:func:`flower_app.checkpoint.write_checkpoint`:
        written to ``checkpoint.npz.tmp``, flushed, renamed over the checkpoint). When a
        sync is due, the metrics are synced first, then the checkpoint. The run's time so
        far and its session count are stored beside the strategy's state, so that a resumed
        run's ``run-wall-time`` counts the interrupted session too.

        Raises
        ------
        TypeError
            If the payload holds something a checkpoint cannot store (the previous
            checkpoint is left as it was).
        """
        payload = {**payload, _ELAPSED: self.run_elapsed(), "run-sessions": self._sessions}
        sync = self._due("checkpoint")
        if sync:
            os.fsync(self._metrics.fileno())
        write_checkpoint(self.folder / CHECKPOINT, payload, sync=sync)

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
        atomic_write_text(path, json.dumps(to_jsonable(summary), indent=2))
        return path


def _complete_rows(folder: Path) -> list[dict[str, Any]]:
    """Return the rows a resumed run keeps: :func:`read_rows` (a cut last line left out)."""
    return read_rows(folder)


def _row(line: bytes) -> dict[str, Any] | str:
    """Return the JSON object of one line of ``metrics.jsonl``, or why it is not one."""
    try:
        row = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        return f"not UTF-8 ({err.reason})"
    except json.JSONDecodeError as err:
        return f"not JSON ({err.msg})"
    return row if isinstance(row, dict) else "not a JSON object"


def read_rows(folder: str | Path) -> list[dict[str, Any]]:
    """Return the rows of a run folder's ``metrics.jsonl``, one dict per logged round.

    The one rule for a file an interrupted run left: the writer appends each round as one
    JSON object and its newline in a single write, so only the *last* line can be cut,
    and a cut line has no newline. Hence

    * a last line without a newline that is not a whole JSON object is a row cut mid-write:
      it is left out (the run logged the rounds before it); a last line without a newline
      that is a whole object is kept (only its newline was lost);
    * any other line that is not a JSON object (in the middle of the file, or a last line
      that ends with its newline) means the file is corrupt: :class:`ValueError` names the
      file and the line;
    * blank lines are skipped, and a folder without ``metrics.jsonl`` has no rows.

    Parameters
    ----------
    folder : str or pathlib.Path
        The run folder.

    Returns
    -------
    list of dict
        The rows, in the file's order.

    Raises
    ------
    ValueError
        If a line other than an unterminated last one is not a JSON object.
    """
    path = Path(folder) / "metrics.jsonl"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    cut = lines.pop()  # the text after the last newline: b"" unless the last line was cut
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = _row(line)
        if isinstance(row, str):
            raise ValueError(
                f"{path}: line {number}: {row}: the file is corrupt (only a last line "
                "without its newline is a row cut by an interruption)"
            )
        rows.append(row)
    if cut.strip() and isinstance(row := _row(cut), dict):
        rows.append(row)
    return rows


def _read_object(path: Path) -> dict[str, Any]:
    """Return the JSON object in ``path`` (``config.json``, ``summary.json``)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (is {path.parent} a run folder?)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


@dataclass(frozen=True)
class RunFolder:
    """What a run folder holds, as :func:`read_run` reads it.

    Attributes
    ----------
    folder : pathlib.Path
        The run folder.
    config : dict
        ``config.json``.
    rows : list of dict
        ``metrics.jsonl``, one dict per logged round (:func:`read_rows`).
    summary : dict or None
        ``summary.json``; None while the run has not finished (or was interrupted).
    """

    folder: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None

    @property
    def name(self) -> str:
        """The folder's name (the run's ``run-name``)."""
        return self.folder.name

    @property
    def finished(self) -> bool:
        """Whether the run wrote its ``summary.json``."""
        return self.summary is not None


def read_run(folder: str | Path) -> RunFolder:
    """Read a run folder: ``config.json``, the rows of ``metrics.jsonl``, ``summary.json``.

    Parameters
    ----------
    folder : str or pathlib.Path
        The run folder, finished or not.

    Returns
    -------
    RunFolder
        Its configuration, rows (:func:`read_rows`: the rule for a cut last line) and
        summary (None without ``summary.json``).

    Raises
    ------
    ValueError
        If ``config.json`` is missing, a file is not JSON, or ``metrics.jsonl`` has a
        corrupt line (the file and line named).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder")
    summary = folder / "summary.json"
    return RunFolder(
        folder=folder,
        config=_read_object(folder / "config.json"),
        rows=read_rows(folder),
        summary=_read_object(summary) if summary.exists() else None,
    )
