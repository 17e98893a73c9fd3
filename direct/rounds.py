"""The direct engine's round log, which every family's direct run writes its rows through."""

from __future__ import annotations

import time
from typing import Any

from flower_app.results import RunWriter

__all__ = ["DirectRounds"]


class DirectRounds:
    """The direct engine's round log of every family: ``rounds.log`` takes each row.

    A row goes to ``history`` and to the run folder's ``metrics.jsonl``, and moves the
    progress bar (tqdm, with ``progress``); with ``timed`` it first gets ``wall-time``
    (seconds since this object was made; FedSM's and FedCG's rows, the other families time
    their rows themselves). :meth:`close` closes the bar.

    Parameters
    ----------
    writer : RunWriter
        The open run's writer.
    progress : bool
        Show a progress bar.
    desc : str
        The bar's label.
    total : int, optional
        Rows expected (None: unknown, as FedSM's Algorithm 2).
    timed : bool, optional
        Add ``wall-time`` to each row (default True).
    """

    def __init__(
        self,
        writer: RunWriter,
        progress: bool,
        desc: str,
        total: int | None = None,
        *,
        timed: bool = True,
    ) -> None:
        self.writer = writer
        self.timed = timed
        self.history: list[dict[str, Any]] = []
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, leave=False)
        self.t0 = time.perf_counter()

    def log(self, row: dict[str, Any]) -> None:
        """Record one round's row."""
        if self.timed:
            row["wall-time"] = time.perf_counter() - self.t0
        self.history.append(row)
        self.writer.log_round(row)
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        """Close the progress bar (if any)."""
        if self.bar is not None:
            self.bar.close()
