"""What a run prints: the ETA of the round log, and the Flower/Ray noise that is dropped."""

from __future__ import annotations

import logging

from flower_app.quiet import NOISE, is_noise, quiet_flower_logs
from flower_app.strategies.round_rows import eta as _eta


def _rows(times: list[float]) -> list[dict]:
    return [{"server-round": 0}] + [
        {"server-round": t, "round-time": x} for t, x in enumerate(times, start=1)
    ]


def test_eta_is_the_mean_round_time_times_the_rounds_left() -> None:
    assert _eta(_rows([2.0, 4.0]), 2, 62) == "  eta 3m00s"  # 3 s × 60 rounds
    assert _eta(_rows([2.0] * 3), 3, 3) == ""  # the last round
    assert _eta(_rows([0.1] * 5), 5, 20) == ""  # under 5 s left: not worth a word
    assert _eta(_rows([30.0]), 1, 200) == "  eta 1h39m"
    assert _eta([{"server-round": 0}], 0, 10) == ""


def test_listed_noise_is_dropped_from_the_flwr_logger_only(caplog) -> None:
    quiet_flower_logs()
    quiet_flower_logs()  # idempotent
    logger = logging.getLogger("flwr")
    assert sum(type(f).__name__ == "_DropNoise" for f in logger.filters) == 1
    with caplog.at_level(logging.INFO, logger="flwr"):
        logger.warning("Manually terminating %s", "ClientAppActor")
        logger.warning("a real warning")
    assert [r.getMessage() for r in caplog.records] == ["a real warning"]
    assert all(is_noise(f"INFO: {fragment} (x)") for fragment in NOISE)
    assert not is_noise("Federation `@none/default` (100 simulated SuperNodes)")
