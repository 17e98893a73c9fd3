"""The run folder: ``config.json``, ``metrics.jsonl`` (one line per round), ``summary.json``.

Written as the run goes: the config first, each round's line as soon as the round ends
(flushed), the summary last, so an interrupted run keeps every finished round.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RunWriter", "read_metrics", "to_jsonable"]


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


class RunWriter:
    """Writes one run's folder.

    Parameters
    ----------
    folder : pathlib.Path
        Run folder (created; an existing ``metrics.jsonl`` is replaced).
    config : dict
        Written to ``config.json`` at once.
    """

    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.folder / "config.json", json.dumps(to_jsonable(config), indent=2))
        self._metrics = (self.folder / "metrics.jsonl").open("w", encoding="utf-8")
        #: merged into ``summary.json`` (e.g. a Flower run's node failures)
        self.extra_summary: dict[str, Any] = {}

    def log_round(self, row: dict[str, Any]) -> None:
        """Append one round's metrics as a JSON line and flush it to disk."""
        self._metrics.write(json.dumps(to_jsonable(row)) + "\n")
        self._metrics.flush()
        os.fsync(self._metrics.fileno())

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
        """Write ``summary.json``, close the metrics file and return the summary's path."""
        self._metrics.close()
        summary.update(self.extra_summary)
        path = self.folder / "summary.json"
        _atomic_write(path, json.dumps(to_jsonable(summary), indent=2))
        return path


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl`` of a run folder (one dict per round)."""
    lines = (Path(folder) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
