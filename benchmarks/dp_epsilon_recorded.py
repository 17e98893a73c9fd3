"""Recompute ε of the recorded client-level DP sweeps under the accounting against the server.

docs/privacy.md records two Gaussian-DP sweeps (MaxFL on Fashion-MNIST, FedSubAvg on the
MovieLens-1M rating task) whose ε columns were computed with amplification by sampling: the
figure of an observer who does not know who was sampled, not of the server, which sampled
them. ε against the server depends only on which clients each round sampled (the worst
client's number of rounds r gives r Gaussian mechanisms) and on σ, and the samplers are
seeded and independent of the data and of the noise (participation "all"), so this script
replays each run's sampler and feeds :class:`flower_app.algorithms.common.gaussian_dp.
GaussianAccountant`, which gives the three figures: against the server as each node verifies
it (each client's own noise share, the rule of the nodes' own ledgers), against the server if
every other client is honest, and against outsiders (amplified and capped). No training is
repeated: the utility columns stay as measured.

Before replaying, it checks on small synthetic runs of the direct engine that the replay
gives exactly the ε the runs themselves record (so the sampler is replayed as the run
draws it).

With ``--rewrite DIR`` it also rewrites the sweeps' ``<name>.csv`` and ``<name>.md`` in DIR:
``dp-epsilon`` becomes the figure against the server, ``dp-epsilon-honest-peers``,
``dp-epsilon-outsider`` and ``dp-rounds-worst-client`` are added, the figure recorded
before is kept as ``dp-epsilon-amplified-uncapped``, and every DP row is marked
``reproducible-noise`` (the sweeps ran with noise keyed by the seed, now the research mode
``dp-reproducible-noise``).

Usage::

    python benchmarks/dp_epsilon_recorded.py --out docs/benchmarks/privacy/epsilon-recorded.json \
        --rewrite docs/benchmarks/privacy
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from flower_app.algorithms.common.gaussian_dp import ACCOUNTANT, GaussianAccountant, GaussianDP
from flower_app.algorithms.fedsubavg.core import ClientSampler
from flower_app.config import AppConfig
from flower_app.runners import maxfl as maxfl_runner

#: the recorded sweeps (docs/privacy.md): clients sampled K of n, rounds, σ grid, seeds
RECORDED = {
    "maxfl-dp-fmnist": {"family": "maxfl", "n": 100, "k": 10, "rounds": 30},
    "fedsubavg-dp-movielens-rating": {"family": "fedsubavg", "n": 6040, "k": 604, "rounds": 50},
}
SIGMAS = (0.01, 0.03, 0.1, 0.3, 1.0)
SEEDS = (0, 1, 2)
CLIP, DELTA = 1.0, 1e-5


def maxfl_draws(n: int, k: int, rounds: int, seed: int) -> list[np.ndarray]:
    """Return the clients each round of a MaxFL run (participation all) samples."""
    cfg = AppConfig.from_run_config({"algorithm": "maxfl", "dataset": "synthetic-emnist",
                                     "num-users": n, "clients-per-round": k, "seed": seed,
                                     "maxfl-participation": "all"})  # fmt: skip
    _, sampler = maxfl_runner._server(maxfl_runner.settings(cfg))
    return [np.asarray(sampler.sample(None)) for _ in range(rounds)]


def fedsubavg_draws(n: int, k: int, rounds: int, seed: int) -> list[np.ndarray]:
    """Return the clients each round of a FedSubAvg run samples."""
    sampler = ClientSampler(n, k, seed)
    return [np.asarray(sampler.sample()) for _ in range(rounds)]


DRAWS = {"maxfl": maxfl_draws, "fedsubavg": fedsubavg_draws}


def replay(family: str, n: int, k: int, rounds: int, seed: int, sigma: float) -> dict[str, Any]:
    """Return the last round's privacy entries of a run, from its sampler alone."""
    accountant = GaussianAccountant(GaussianDP(sigma, CLIP, DELTA), n)
    row: dict[str, Any] = {}
    for users in DRAWS[family](n, k, rounds, seed):
        row = accountant.record(k, users)
    return row


def check_against_real_runs() -> None:
    """The replay gives the ε that small direct-engine runs record themselves."""
    from direct import run_direct
    from flower_app.results import read_rows

    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "maxfl": {"algorithm": "maxfl", "dataset": "synthetic-emnist", "num-users": 8,
                      "clients-per-round": 3, "maxfl-rounds": 4, "maxfl-eval-every": 4,
                      "maxfl-participation": "all", "maxfl-solo-steps": 2,
                      "maxfl-local-steps": 1, "maxfl-dp-noise": 0.7},
            "fedsubavg": {"algorithm": "fedsubavg", "dataset": "synthetic-movielens-rating",
                          "num-users": 30, "num-elements": 20, "clients-per-round": 7,
                          "fsa-rounds": 4, "fsa-dp-noise": 0.7},
        }  # fmt: skip
        for family, config in runs.items():
            prefix = "maxfl" if family == "maxfl" else "fsa"
            cfg = AppConfig.from_run_config({**config, "seed": 3, "secure-aggregation": True,
                                             f"{prefix}-dp-clip": CLIP, f"{prefix}-dp-delta": DELTA,
                                             "output-dir": tmp, "run-name": family})  # fmt: skip
            run_direct(cfg)
            rows = [r for r in read_rows(Path(tmp) / family) if "dp-epsilon" in r]
            last = rows[-1]
            n = config["num-users"]
            k, rounds = config["clients-per-round"], len(rows)
            got = replay(family, n, k, rounds, 3, 0.7)
            for key in ("dp-epsilon", "dp-epsilon-honest-peers", "dp-epsilon-outsider",
                        "dp-rounds-worst-client"):
                if got[key] != last[key]:
                    raise AssertionError(f"{family}: replayed {key} {got[key]} != run {last[key]}")
    print("replay check: the samplers replay as the direct engine draws them", flush=True)


def rewrite(folder: Path, name: str, spec: dict[str, Any]) -> None:
    """Rewrite ``<name>.csv`` / ``.md`` with the ε's of :func:`replay` (utility unchanged)."""
    from reproductions.privacy import GAUSSIAN_SWEEPS, _metric_table

    path = folder / f"{name}.csv"
    rows = list(csv.DictReader(path.read_text().splitlines()))
    out = []
    for row in rows:
        new = {k: v for k, v in row.items() if k not in ("dp-epsilon", "run-folder")}
        extra = dict.fromkeys(("dp-epsilon", "dp-epsilon-honest-peers", "dp-epsilon-outsider",
                               "dp-rounds-worst-client", "dp-epsilon-amplified-uncapped",
                               "reproducible-noise"), "")  # fmt: skip
        if row["noise"] != "none":
            got = replay(spec["family"], spec["n"], spec["k"], spec["rounds"], int(row["seed"]),
                         float(row["noise"]))  # fmt: skip
            extra = {"dp-epsilon": got["dp-epsilon"],
                     "dp-epsilon-honest-peers": got["dp-epsilon-honest-peers"],
                     "dp-epsilon-outsider": got["dp-epsilon-outsider"],
                     "dp-rounds-worst-client": got["dp-rounds-worst-client"],
                     # the figure recorded before (kept when rewriting twice)
                     "dp-epsilon-amplified-uncapped": row.get("dp-epsilon-amplified-uncapped")
                     or row["dp-epsilon"],
                     "reproducible-noise": True}  # fmt: skip
        out.append({**new, **extra, "run-folder": ""})
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(out[0]))
        writer.writeheader()
        writer.writerows(out)
    table_rows = [{**r, "noise": r["noise"] if r["noise"] == "none" else float(r["noise"])}
                  for r in out]  # fmt: skip
    args = argparse.Namespace(clip=CLIP, delta=DELTA, reproducible_noise=True)
    keys = GAUSSIAN_SWEEPS[spec["family"]]["keys"]
    (folder / f"{name}.md").write_text(_metric_table(table_rows, args, keys))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--rewrite", default="", help="folder of the sweeps' CSV/MD to update")
    args = parser.parse_args()
    check_against_real_runs()
    out: dict[str, Any] = {"accountant": ACCOUNTANT, "clip": CLIP, "delta": DELTA, "sweeps": {}}
    for name, spec in RECORDED.items():
        rows = []
        for sigma in SIGMAS:
            for seed in SEEDS:
                r = replay(spec["family"], spec["n"], spec["k"], spec["rounds"], seed, sigma)
                rows.append({"sigma": sigma, "seed": seed,
                             "epsilon-against-server": r["dp-epsilon"],
                             "epsilon-if-peers-honest": r["dp-epsilon-honest-peers"],
                             "rounds-worst-client": r["dp-rounds-worst-client"],
                             "epsilon-against-outsiders": r["dp-epsilon-outsider"]})  # fmt: skip
                print(name, rows[-1], flush=True)
        out["sweeps"][name] = {**spec, "runs": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if args.rewrite:
        for name, spec in RECORDED.items():
            rewrite(Path(args.rewrite), name, spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
