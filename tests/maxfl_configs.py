"""The small MaxFL run_config the MaxFL tests share (3 rounds of 3 of 6 EMNIST stand-in clients)."""

from __future__ import annotations

SMALL = {
    "algorithm": "maxfl",
    "dataset": "synthetic-emnist",
    "num-users": 6,
    "clients-per-round": 3,
    "maxfl-rounds": 3,
    "maxfl-eval-every": 1,
    "maxfl-mandatory-rounds": 1,
    "maxfl-solo-steps": 20,
    "maxfl-local-steps": 5,
    "seed": 4,
}
