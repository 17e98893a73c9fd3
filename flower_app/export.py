"""Export a dataset into per-node files plus a manifest: ``python -m flower_app.export``.

Submodular datasets become ``node-<p>.parquet`` (user, item, value) files, MaxFL's image
datasets ``node-<p>.npz`` files (the node's clients' images, labels and splits), FedSubAvg's
rating tasks ``node-<p>.npz`` files (the node's clients' samples as model rows, their
submodels, their test samples).

The split is the cohort simulation's (:func:`~flower_app.clients.cohorts.cohort_range`), so
a deployment whose SuperNodes each hold one of these files and a simulation with the same
``num-partitions`` and ``seed`` give the same result. Formats and manifest fields:
``docs/node-local-data.md``; loading: :mod:`flower_app.node_data`.

Example::

    python -m flower_app.export --dataset movielens --data-dir /data --num-partitions 4 \\
        --out /data/export-ml1m-4
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from flower_app.registry import FEDSUBAVG_DATASETS, MAXFL_DATASETS, SUBMODULAR_DATASETS

__all__ = ["export_dataset", "main"]


def export_dataset(
    dataset: str,
    num_partitions: int,
    out: str,
    *,
    data_dir: str = "",
    data_seed: int = 0,
    num_users: int = 0,
    num_elements: int = 0,
    run_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Export ``dataset`` into ``out/node-<p>.*`` for p < N and ``out/manifest.json``.

    Parameters
    ----------
    dataset : str
        A submodular dataset (``synthetic-facility-location``, ``movielens``, ``dblp``,
        ``synthetic-dblp``: parquet files) or a MaxFL one (``fmnist``, ``emnist``,
        ``synthetic-emnist``: npz files).
    num_partitions : int
        Number of nodes N.
    out : str
        Output folder.
    data_dir, data_seed, num_users, num_elements
        As the run_config keys of the same names (they define the instance).
    run_config : dict, optional
        Further run_config keys that define the instance (MaxFL: ``maxfl-partition``,
        ``maxfl-alpha``, ``maxfl-label-flip``, ``maxfl-train-fraction``,
        ``maxfl-unseen-users``), as the run will be given them.

    Returns
    -------
    dict
        The manifest written.

    Raises
    ------
    ValueError
        For a dataset this command does not export yet (FedSubAvg's).
    """
    from flower_app.config import AppConfig

    if dataset in ("image-clients", "rating-table"):
        raise ValueError(
            f"dataset {dataset!r}: your own learning data is not exported to node files yet "
            "(every node reads run_config data-file)"
        )
    if "sent140" in dataset or "amazon" in dataset:
        raise ValueError(
            f"dataset {dataset!r}: node files for the Sent140 and Amazon tasks are not written "
            "yet (their clients are tokens and histories, not the image or rating rows this "
            "command exports)"
        )
    if dataset in SUBMODULAR_DATASETS:
        algorithm = "fedsm"
    elif dataset in MAXFL_DATASETS:
        algorithm = "maxfl"
    elif dataset in FEDSUBAVG_DATASETS:
        algorithm = "fedsubavg"
    else:
        raise ValueError(
            f"dataset {dataset!r}: this command exports the submodular datasets "
            f"({', '.join(SUBMODULAR_DATASETS)}), MaxFL's ({', '.join(MAXFL_DATASETS)}) and "
            f"FedSubAvg's ({', '.join(FEDSUBAVG_DATASETS)})"
        )
    given = {
        "algorithm": algorithm,
        "dataset": dataset,
        "data-dir": data_dir,
        "data-seed": data_seed,
        "num-users": num_users,
        **({"num-elements": num_elements} if algorithm != "maxfl" else {}),
        **(run_config or {}),
    }
    cfg = AppConfig.from_run_config(given)
    if algorithm == "maxfl":
        return _export_maxfl(cfg, num_partitions, out)
    if algorithm == "fedsubavg":
        return _export_ratings(cfg, num_partitions, out)
    return _export_submodular(cfg, num_partitions, out)


def _export_ratings(cfg: Any, num_partitions: int, out: str) -> dict[str, Any]:
    from flower_app.node_data import RATING_SOURCE_KEYS, export_ratings, source_of
    from flower_app.runners.fedsubavg import load_task

    return export_ratings(
        load_task(cfg), num_partitions, out, dataset=cfg.dataset,
        source=source_of(cfg, RATING_SOURCE_KEYS),
    )  # fmt: skip


def _export_submodular(cfg: Any, num_partitions: int, out: str) -> dict[str, Any]:
    from flower_app.node_data import export_rows
    from flower_app.problems import load_problem
    from flower_app.submodular.objectives import MaxCoverage

    problem = load_problem(cfg)
    coverage = isinstance(problem.objective, MaxCoverage)
    values = cfg.to_dict()
    return export_rows(
        problem.objective.values,
        num_partitions,
        out,
        dataset=cfg.dataset,
        instance=problem.name,
        objective="max-coverage" if coverage else "facility-location",
        element_groups=problem.element_groups,
        source={key: values[key] for key in ("dataset", "data-seed", "num-users", "num-elements")},
    )


def _export_maxfl(cfg: Any, num_partitions: int, out: str) -> dict[str, Any]:
    from flower_app.node_data import MAXFL_SOURCE_KEYS, export_images, source_of
    from flower_app.runners.maxfl import federation, settings

    return export_images(
        federation(settings(cfg)),
        num_partitions,
        out,
        dataset=cfg.dataset,
        source=source_of(cfg, MAXFL_SOURCE_KEYS),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: parse the arguments, export, print a one-line summary."""
    parser = argparse.ArgumentParser(
        prog="python -m flower_app.export",
        description="Write one file per node (the cohort split of the simulation) and a "
        "manifest with sha256 checksums (docs/node-local-data.md).",
    )
    parser.add_argument(
        "--dataset", required=True,
        choices=SUBMODULAR_DATASETS + MAXFL_DATASETS + FEDSUBAVG_DATASETS,
    )  # fmt: skip
    parser.add_argument("--num-partitions", type=int, required=True, help="number of nodes N")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--data-dir", default="", help="dataset root (as run_config data-dir)")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of synthetic instances")
    parser.add_argument("--num-users", type=int, default=0, help="users of a synthetic instance")
    parser.add_argument(
        "--num-elements", type=int, default=0, help="elements of a synthetic instance"
    )
    parser.add_argument(
        "--run-config",
        default="",
        help="further keys that define the clients, in flwr's syntax (MaxFL: e.g. "
        '"maxfl-alpha=0.5 maxfl-unseen-users=10"); the run must be given the same',
    )
    args = parser.parse_args(argv)
    try:
        extra = {}
        if args.run_config:
            from flwr.common.config import parse_config_args

            extra = parse_config_args([args.run_config])
        manifest = export_dataset(
            args.dataset,
            args.num_partitions,
            args.out,
            data_dir=args.data_dir,
            data_seed=args.data_seed,
            num_users=args.num_users,
            num_elements=args.num_elements,
            run_config=extra,
        )
    except (ValueError, OSError) as err:
        print(f"export failed: {err}", file=sys.stderr)
        return 1
    if "n-elements" in manifest:
        sizes = f"{manifest['n-elements']} elements, {manifest['nnz']} entries"
    elif "n-params" in manifest:
        sizes = f"{manifest['n-params']} model rows"
    else:
        sizes = f"{manifest['n-seen']} seen + {manifest['n-unseen']} unseen clients"
    print(
        f"{manifest['dataset']}: {manifest['n-users']} users, {sizes} -> "
        f"{len(manifest['files'])} node files in {args.out} (manifest.json)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
