"""Flower and Ray messages a user cannot act on, and where each one is silenced.

Each entry of :data:`NOISE` is a message printed on every ordinary run, whatever the user
does, with the reason it is noise and the place this app silences it. Anything not listed
here is shown as Flower or Ray prints it.

``"Manually terminating ClientAppActor"``
    Logged (as a WARNING) by every Ray actor of Flower's simulation engine when a run ends
    normally (``flwr.simulation.ray_transport.ray_actor``). Silenced by a filter on the
    ``flwr`` logger installed when the ClientApp module is imported in the actor
    (:func:`quiet_flower_logs`).
``"Since flwr 1.32, default simulated SuperNodes changed from 10 to 2."``
    Logged by ``flwr-simulation`` before it loads any app, even when the federation sets
    ``num-supernodes`` (the line after it gives the real size). Nothing in an app can reach
    it; ``flower-app run`` drops the line from the streamed log (:func:`is_noise`).
Ray's ``FutureWarning`` about ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO``
    Not filtered: the ServerApp module opts in to the announced behaviour by setting that
    variable (unless the user set it), which is what the warning asks for.

Repeated errors: Flower logs an ERROR or WARNING once per message it concerns (e.g.
``No query function registered with name '…'`` and its traceback for every node asked).
In each process that imports this app's ServerApp or ClientApp (a plain ``flwr run``
included), :func:`quiet_flower_logs` lets the first of each kind through (numbers and ids
aside) and then only the 10th, 100th, ... with the count so far. ``flower-app run``
(:class:`Collapser`) shows the first one of each kind of its stream and, at the end of the
run, one line with how many more there were; its full log keeps every one.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections import Counter
from pathlib import Path

__all__ = ["NOISE", "Collapser", "is_noise", "quiet_flower_logs"]

#: message fragment -> why it is noise (see the module docstring for where it is silenced)
NOISE: dict[str, str] = {
    "Manually terminating ClientAppActor": "every Ray actor logs it when a run ends normally",
    "default simulated SuperNodes changed from 10 to 2": (
        "flwr-simulation logs it on every run, whatever num-supernodes is set to"
    ),
}


def is_noise(text: str) -> bool:
    """Return whether a log line or message is one of :data:`NOISE`."""
    return any(fragment in text for fragment in NOISE)


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not is_noise(record.getMessage())


def _flwr_package() -> str:
    """Return the folder of the installed ``flwr`` package (imported: it logged)."""
    flwr = sys.modules.get("flwr")
    return str(Path(flwr.__file__).parent) + os.sep if flwr and flwr.__file__ else "\0"


class _CollapseRepeats(logging.Filter):
    """Pass the first WARNING/ERROR of each kind, then the 10th, 100th, ... with a count."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        # Flower's own records only: this app's (and tests' counts of them) are left alone
        if record.levelno < logging.WARNING or not record.pathname.startswith(_flwr_package()):
            return True
        kind = _NUMBER.sub("#", record.getMessage()[:300])
        self.seen[kind] += 1
        count = self.seen[kind]
        if count == 1:
            return True
        if str(count).strip("0") != "1":  # 10, 100, 1000, ...
            return False
        record.msg, record.args = f"{record.getMessage()} [the {count}th of these]", None
        return True


def quiet_flower_logs() -> None:
    """Drop :data:`NOISE` and collapse repeats on the ``flwr`` logger of this process.

    Idempotent. Repeated WARNINGs and ERRORs (the same text but for numbers) pass once,
    then only the 10th, 100th, ... with their count.
    """
    logger = logging.getLogger("flwr")
    if not any(isinstance(f, _DropNoise) for f in logger.filters):
        logger.addFilter(_DropNoise())
    if not any(isinstance(f, _CollapseRepeats) for f in logger.filters):
        logger.addFilter(_CollapseRepeats())


_LEVEL = re.compile(r"\b(ERROR|WARNING)\b")
_NUMBER = re.compile(r"\d+")
_COLOR = re.compile(r"\x1b\[[0-9;]*m")


class Collapser:
    """Show each kind of ERROR or WARNING line once; count the repeats (see the module doc).

    Lines of other levels pass unchanged. Two lines are of one kind when they are equal once
    colours and numbers (node ids, rounds) are taken out.
    """

    def __init__(self) -> None:
        self.repeats: Counter[str] = Counter()
        self.first: dict[str, str] = {}

    def feed(self, line: str) -> list[str]:
        """Return what to print for ``line``: the line, or nothing for a repeat."""
        plain = _COLOR.sub("", line)
        if not _LEVEL.search(plain[:12]):
            return [line]
        kind = _NUMBER.sub("#", plain.strip())
        if kind in self.first:
            self.repeats[kind] += 1
            return []
        self.first[kind] = plain.strip()
        return [line]

    def flush(self) -> list[str]:
        """Return one line per repeated kind: the first one's text and how many more came."""
        out = [
            f"flower-app run: {count} more like: {self.first[kind]}\n"
            for kind, count in self.repeats.items()
        ]
        self.repeats.clear()
        return out
