"""MaxFL reproductions and sensitivity sweeps on the direct engine (hook for ``run_sim.py``).

``main(argv)`` runs every combination of ``--algorithms`` × ``--seeds`` × the ``--grid``
overrides for one ``--setting`` (the paper's Table 1, Table 2/3 or a custom one), writes one
run folder per run under ``--out/runs/``, a CSV of the final metrics (``sweep.csv``) and a
markdown table of mean ± std over seeds (``table.md``). Example::

    python -m flower_app.sweeps.maxfl --setting table1 --algorithms maxfl fedavg \\
        --seeds 0 1 2 --grid maxfl-requirement=train,heldout --out benchmarks/results/maxfl/t1
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flower_app.config import AppConfig
from flower_app.experiment import run_direct

__all__ = ["SETTINGS", "main", "parse_grid"]

#: the paper's settings (Appendix D.1) as run_config overrides
SETTINGS: dict[str, dict[str, Any]] = {
    "table1": {  # Dirichlet α = 0.5, flexible participation after 10 of 200 rounds
        "dataset": "fmnist",
        "maxfl-partition": "dirichlet",
        "maxfl-alpha": 0.5,
        "maxfl-participation": "flexible",
        "clients-per-round": 5,
    },
    "table2": {  # 5 clusters of 2 labels, every selected client takes part (Tables 2, 3)
        "dataset": "fmnist",
        "maxfl-partition": "clusters",
        "maxfl-participation": "all",
        "clients-per-round": 5,
    },
    "emnist": {
        "dataset": "synthetic-emnist",
        "maxfl-partition": "dirichlet",
        "maxfl-alpha": 0.05,
        "maxfl-participation": "flexible",
        "clients-per-round": 10,
    },
}

METRICS = (
    "seen-gm-appeal",
    "seen-acc",
    "seen-pref-acc",
    "seen-tuned-gm-appeal",
    "unseen-gm-appeal",
    "unseen-acc",
    "unseen-pref-acc",
    "unseen-tuned-gm-appeal",
)


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_grid(items: Sequence[str]) -> list[dict[str, Any]]:
    """Turn ``["key=a,b", "k2=c"]`` into the list of override dicts of their product."""
    keys, values = [], []
    for item in items:
        key, _, vals = item.partition("=")
        keys.append(key)
        values.append([_value(v) for v in vals.split(",")])
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def _name(algorithm: str, overrides: dict[str, Any], seed: int) -> str:
    parts = [algorithm] + [f"{k.removeprefix('maxfl-')}{v}" for k, v in overrides.items()]
    return "-".join(parts + [f"seed{seed}"]).replace(".", "p")


def main(argv: Sequence[str] | None = None) -> int:
    """Run a MaxFL sweep; see the module docstring for the options."""
    p = argparse.ArgumentParser(prog="maxfl-sweep", description=__doc__.splitlines()[0])
    p.add_argument("--setting", choices=sorted(SETTINGS), default="table1")
    p.add_argument("--algorithms", nargs="+", default=["maxfl", "fedavg"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--grid", nargs="*", default=[], help="key=v1,v2 run_config overrides")
    p.add_argument("--set", nargs="*", default=[], help="key=value fixed overrides")
    p.add_argument("--data-dir", default="")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    fixed = {k: v for item in args.set for k, v in parse_grid([item])[0].items()}
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for overrides in parse_grid(args.grid) or [{}]:
        for algorithm in args.algorithms:
            for seed in args.seeds:
                run_config = {
                    **SETTINGS[args.setting],
                    **fixed,
                    **overrides,
                    "algorithm": algorithm,
                    "seed": seed,
                    "data-dir": args.data_dir,
                    "output-dir": str((args.out / "runs").resolve()),
                    "run-name": _name(algorithm, overrides, seed),
                }
                summary = run_direct(AppConfig.from_run_config(run_config))
                row = {"algorithm": algorithm, "seed": seed, **overrides}
                row.update({m: summary["final"].get(m) for m in METRICS})
                row["final-pool-size"] = summary["final-pool-size"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    keys = list(rows[0])
    with (args.out / "sweep.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    (args.out / "table.md").write_text(table(rows, [k for k in keys if k not in METRICS]))
    return 0


def table(rows: list[dict[str, Any]], group_keys: list[str]) -> str:
    """Return a markdown table: mean ± std over seeds of GM-Appeal and accuracies (%)."""
    group_keys = [k for k in group_keys if k not in ("seed", "final-pool-size")]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in group_keys), []).append(row)
    shown = ["seen-gm-appeal", "seen-acc", "seen-pref-acc", "unseen-gm-appeal", "unseen-acc"]
    lines = [
        "| " + " | ".join(group_keys + shown + ["seeds", "final pool"]) + " |",
        "|" + "---|" * (len(group_keys) + len(shown) + 2),
    ]
    for key, members in groups.items():
        cells = [str(k) for k in key]
        for m in shown:
            vals = np.array([r[m] for r in members if r[m] is not None], dtype=float)
            scale = 100.0 if m.endswith("acc") else 1.0
            cells.append(
                f"{scale * vals.mean():.2f} ± {scale * vals.std():.2f}" if vals.size else ""
            )
        cells.append(str(len(members)))
        cells.append(",".join(str(r["final-pool-size"]) for r in members))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
