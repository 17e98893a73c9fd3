"""The app's run_config, parsed and validated once, before any round starts.

Every key lives in ``[tool.flwr.app.config]`` of ``pyproject.toml`` (kebab-case, as Flower
requires for ``--run-config`` overrides); :class:`AppConfig` turns the flat mapping into
typed fields and raises :class:`ConfigError` naming the key, the bad value and what would
be valid.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flower_app.registry import ALGORITHMS, family_keys

__all__ = ["DATASETS", "MATROIDS", "AppConfig", "ConfigError"]

#: dataset name -> short description (each algorithm accepts the subset its registry entry lists)
DATASETS = {
    "synthetic-facility-location": "embedded synthetic facility location (no files needed)",
    "movielens": "MovieLens-1M facility location (users = clients), ml-1m/*.dat in data-dir",
    "dblp": "DBLP researcher-venue max coverage 2018-2021, dblp/dblp.xml(.gz) in data-dir",
    "synthetic-dblp": "calibrated synthetic stand-in for DBLP (704,738 researchers, 2,675 venues)",
    # maxfl
    "fmnist": "Fashion-MNIST, official IDX files fashion-mnist/*.gz in data-dir",
    "emnist": "EMNIST ByClass (62 classes), official IDX files emnist/*.gz in data-dir",
    "synthetic-emnist": "calibrated synthetic stand-in for EMNIST ByClass (no files needed)",
    # fedsubavg
    "movielens-rating": "MovieLens-1M rating classification (FedSubAvg), ml-1m/*.dat in data-dir",
    "synthetic-movielens-rating": "calibrated synthetic stand-in for movielens-rating",
}
MATROIDS = ("uniform", "partition")


class ConfigError(ValueError):
    """An invalid run_config value: says which key, what was given and what is valid."""


def _get(cfg: Mapping[str, Any], key: str, default: Any) -> Any:
    return cfg.get(key, default)


def _int(cfg: Mapping[str, Any], key: str, default: int, minimum: int | None = None) -> int:
    value = _get(cfg, key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"run_config '{key}' = {value!r}: expected an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(f"run_config '{key}' = {value}: must be >= {minimum}")
    return value


def _count(cfg: Mapping[str, Any], key: str, default: float) -> int | float:
    value = _get(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            f"run_config '{key}' = {value!r}: expected a float fraction in (0, 1] "
            "or an integer count"
        )
    if isinstance(value, float) and not 0.0 < value <= 1.0:
        raise ConfigError(
            f"run_config '{key}' = {value}: a float is a fraction and must lie in (0, 1]; "
            "write an integer (e.g. 50) for an absolute count"
        )
    if isinstance(value, int) and value < 1:
        raise ConfigError(f"run_config '{key}' = {value}: a count must be >= 1")
    return value


def _choice(cfg: Mapping[str, Any], key: str, default: str, options: Any) -> str:
    value = str(_get(cfg, key, default))
    if value not in options:
        raise ConfigError(
            f"run_config '{key}' = {value!r} is not known; choose one of: "
            + ", ".join(sorted(options))
        )
    return value


@dataclass(frozen=True)
class AppConfig:
    """Typed run configuration (see ``[tool.flwr.app.config]`` for the defaults).

    Attributes
    ----------
    algorithm : str
        One of :data:`flower_app.registry.ALGORITHMS`.
    dataset : str
        One of :data:`DATASETS` that the algorithm accepts.
    data_dir : str
        Dataset root ("" = ``$FLOWER_APP_DATA`` or ``~/.cache/flower_app/datasets``).
    data_seed : int
        Seed of synthetic instances (kept apart from ``seed`` so that seeds vary the
        algorithm, not the instance).
    seed : int
        Seed of everything the algorithm draws (server and users).
    k : int
        Number of elements to select (communication rounds of FedSM Alg. 1).
    matroid : str
        ``"uniform"`` (|S| ≤ k) or ``"partition"`` (at most ``partition_capacity`` elements
        per element group: genre for MovieLens, venue type for DBLP).
    partition_capacity : int
        Capacity of every block of the partition matroid.
    clients_per_round : int or float
        K: users sampled per round, a count (int) or fraction of all users (float).
    elements_per_client : int or float
        d: elements each sampled user evaluates, a count or a fraction of |E|.
    num_users, num_elements : int
        Size of synthetic instances (0 = the dataset's default).
    output_dir : str
        Parent folder of run folders ("" = ``$FLOWER_APP_OUTPUT`` or ``~/flower_app_runs``).
    run_name : str
        Run folder name ("" = algorithm-dataset-seed-timestamp).
    round_timeout : float
        Seconds to wait for the replies of one round.
    discovery_timeout : float
        Seconds to wait for all nodes to register and announce their users.
    """

    algorithm: str = "fedsm"
    dataset: str = "synthetic-facility-location"
    data_dir: str = ""
    data_seed: int = 0
    seed: int = 0
    k: int = 10
    matroid: str = "uniform"
    partition_capacity: int = 2
    clients_per_round: int | float = 0.1
    elements_per_client: int | float = 0.1
    num_users: int = 0
    num_elements: int = 0
    output_dir: str = ""
    run_name: str = ""
    round_timeout: float = 600.0
    discovery_timeout: float = 300.0
    extra: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any]) -> AppConfig:
        """Parse and validate a Flower ``run_config`` (kebab-case keys).

        Parameters
        ----------
        cfg : Mapping
            ``context.run_config``; missing keys take the defaults above.

        Returns
        -------
        AppConfig
            The validated configuration.

        Raises
        ------
        ConfigError
            For any unknown name or out-of-range value.
        """
        d = cls()
        known = set(d.to_dict()) | set(family_keys())
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ConfigError(
                f"run_config keys {unknown} are not known; the app reads: "
                + ", ".join(sorted(known))
            )
        timeout = _get(cfg, "round-timeout", d.round_timeout)
        discovery = _get(cfg, "discovery-timeout", d.discovery_timeout)
        for key, value in (("round-timeout", timeout), ("discovery-timeout", discovery)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"run_config '{key}' = {value!r}: must be a positive number")
        algorithm = _choice(cfg, "algorithm", d.algorithm, ALGORITHMS)
        dataset = _choice(cfg, "dataset", d.dataset, DATASETS)
        if dataset not in ALGORITHMS[algorithm].datasets:
            raise ConfigError(
                f"run_config 'dataset' = {dataset!r} does not fit algorithm {algorithm!r}; "
                "choose one of: " + ", ".join(ALGORITHMS[algorithm].datasets)
            )
        return cls(
            algorithm=algorithm,
            dataset=dataset,
            data_dir=str(_get(cfg, "data-dir", d.data_dir)),
            data_seed=_int(cfg, "data-seed", d.data_seed, minimum=0),
            seed=_int(cfg, "seed", d.seed, minimum=0),
            k=_int(cfg, "k", d.k, minimum=1),
            matroid=_choice(cfg, "matroid", d.matroid, MATROIDS),
            partition_capacity=_int(cfg, "partition-capacity", d.partition_capacity, minimum=1),
            clients_per_round=_count(cfg, "clients-per-round", d.clients_per_round),
            elements_per_client=_count(cfg, "elements-per-client", d.elements_per_client),
            num_users=_int(cfg, "num-users", d.num_users, minimum=0),
            num_elements=_int(cfg, "num-elements", d.num_elements, minimum=0),
            output_dir=str(_get(cfg, "output-dir", d.output_dir)),
            run_name=str(_get(cfg, "run-name", d.run_name)),
            round_timeout=float(timeout),
            discovery_timeout=float(discovery),
            extra=tuple(sorted((k, cfg.get(k, v)) for k, v in family_keys().items())),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the configuration with kebab-case keys (as written to config.json)."""
        out = {key.replace("_", "-"): value for key, value in asdict(self).items()}
        out.pop("extra")
        out.update(self.extra)
        return out

    def get(self, key: str) -> Any:
        """Return a family-specific key's value (see :mod:`flower_app.registry`)."""
        return dict(self.extra)[key]

    def run_folder(self) -> Path:
        """Return the absolute run folder: ``output_dir / run_name``."""
        root = self.output_dir or os.environ.get("FLOWER_APP_OUTPUT", "") or "~/flower_app_runs"
        name = self.run_name or (
            f"{self.algorithm}-{self.dataset}-seed{self.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        return Path(root).expanduser().resolve() / name
