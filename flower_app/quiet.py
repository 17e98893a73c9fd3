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
"""

from __future__ import annotations

import logging

__all__ = ["NOISE", "is_noise", "quiet_flower_logs"]

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


def quiet_flower_logs() -> None:
    """Drop :data:`NOISE` messages from the ``flwr`` logger of this process (idempotent)."""
    logger = logging.getLogger("flwr")
    if not any(isinstance(f, _DropNoise) for f in logger.filters):
        logger.addFilter(_DropNoise())
