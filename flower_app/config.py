"""The app's run_config, parsed and validated once, before any round starts.

Every key is declared once in :mod:`flower_app.settings` (type, default, valid values,
family, help; reference in ``docs/configuration.md``). :class:`AppConfig` holds the validated
values: the common keys as typed fields, each family's keys in :attr:`AppConfig.extra`
(read with :meth:`AppConfig.get`). Invalid configs raise :class:`ConfigError` naming the key,
the bad value and what would be valid.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flower_app.registry import ALGORITHMS, DATASETS
from flower_app.settings import MATROIDS, SETTINGS, ConfigError, defaults, parse, problems
from flower_app.settings.rules import rule_problems

if TYPE_CHECKING:
    from flower_app.privacy import SecureAggregation

__all__ = ["DATASETS", "MATROIDS", "AppConfig", "ConfigError", "fresh_run_name"]


def combination_problems(values: Mapping[str, Any]) -> list[str]:
    """Return the problems of valid keys that do not go together (one line each).

    The rules are declared in :mod:`flower_app.settings.rules` (:data:`~flower_app.
    settings.rules.RULES`).

    Parameters
    ----------
    values : Mapping
        Every key's validated value (:func:`flower_app.settings.parse`).
    """
    return rule_problems(values)


@dataclass(frozen=True)
class AppConfig:
    """Typed, validated run configuration (defaults and ranges: ``docs/configuration.md``).

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
    report_bound : float
        Submodular families: the largest value one user may report on one element (0 = the
        instance's λ; :mod:`flower_app.algorithms.robust`).
    output_dir : str
        Parent folder of run folders ("" = ``$FLOWER_APP_OUTPUT`` or ``~/flower_app_runs``).
    run_name : str
        Run folder name ("" = algorithm-dataset-seed-timestamp).
    round_timeout : float
        Seconds to wait for the replies of one round.
    discovery_timeout : float
        Seconds to wait for all nodes to register and announce their users.
    min_reply_fraction : float
        Least fraction of a round's sampled users whose replies must arrive.
    node_return_wait : float
        Seconds a round waits for offline nodes that serve users to be back (0: no wait).
    resume : bool
        Continue the interrupted run in the run folder from its checkpoint (FedSM).
    server_data : str
        ``"full"`` (the server loads the instance too, for its oracles) or ``"none"`` (it
        reads no client data; see ``docs/node-local-data.md``).
    element_groups : str
        CSV of the elements' groups for a partition matroid when ``server_data`` is
        ``"none"`` ("" otherwise).
    data_file, data_columns, item_names : str
        Your own data (``dataset`` = ``facility-location-table`` or ``coverage-sets``):
        the file, its column names, an optional item-name table (docs/own-data.md).
    dp_reproducible_noise : bool
        Research mode: DP noise derived from the seed (no privacy against the server;
        :mod:`flower_app.algorithms.common.dp_noise`).
    secure_aggregation : bool
        Sum each round's replies with secure aggregation (see :attr:`secure`).
    secagg_num_shares : int
        Its neighbourhood size (0: 2⌈log₂ n⌉ + 1).
    secagg_reconstruction_threshold : int or float
        Its threshold (a count, or a fraction of the neighbourhood).
    secagg_frac_bits : int
        Its fixed-point fractional bits.
    extra : tuple of (str, Any)
        The keys of the algorithm's own family with their validated values, sorted by key
        (another family's keys are refused unless at their defaults, and are not recorded).
    """

    algorithm: str
    dataset: str
    data_dir: str
    data_seed: int
    seed: int
    k: int
    matroid: str
    partition_capacity: int
    clients_per_round: int | float
    elements_per_client: int | float
    num_users: int
    num_elements: int
    report_bound: float
    output_dir: str
    run_name: str
    round_timeout: float
    discovery_timeout: float
    min_reply_fraction: float
    node_return_wait: float
    resume: bool
    server_data: str
    element_groups: str
    data_file: str
    data_columns: str
    item_names: str
    dp_reproducible_noise: bool
    secure_aggregation: bool
    secagg_num_shares: int
    secagg_reconstruction_threshold: int | float
    secagg_frac_bits: int
    extra: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any]) -> AppConfig:
        """Parse and validate a Flower ``run_config`` (kebab-case keys).

        Parameters
        ----------
        cfg : Mapping
            ``context.run_config``; missing keys take their declared defaults.

        Returns
        -------
        AppConfig
            The validated configuration.

        Raises
        ------
        ConfigError
            For an unknown key (named with the closest known one), a key of another family
            than the algorithm's with a non-default value, or an invalid value (see
            :func:`flower_app.settings.parse`).
        """
        values = parse(cfg)
        common = {
            f.name: values[f.name.replace("_", "-")] for f in fields(cls) if f.name != "extra"
        }
        family = ALGORITHMS[values["algorithm"]].family
        # only the algorithm's own family: another family's key with a non-default value was
        # refused by parse(), and config.json records the keys that applied to the run
        extra = tuple(sorted((k, v) for k, v in values.items() if SETTINGS[k].family == family))
        found = combination_problems(values)
        if found:
            raise ConfigError("\n".join(found))
        out = cls(**common, extra=extra)
        try:
            out.secure  # noqa: B018 - the settings' own checks, before Flower starts
        except ValueError as err:
            raise ConfigError(f"run_config secure aggregation (secagg-*): {err}") from err
        return out

    @classmethod
    def problems(cls, cfg: Mapping[str, Any]) -> list[str]:
        """Return every problem :meth:`from_run_config` would raise, one line each."""
        found = problems(cfg) or combination_problems(parse(cfg))
        if not found:
            try:
                cls.from_run_config(cfg)
            except ConfigError as err:  # the secure-aggregation settings' own checks
                found = str(err).splitlines()
        return found

    @property
    def secure(self) -> SecureAggregation | None:
        """Return the secure-aggregation settings, or None when it is off."""
        if not self.secure_aggregation:
            return None
        from flower_app.privacy import SecureAggregation

        return SecureAggregation(
            num_shares=self.secagg_num_shares or None,
            reconstruction_threshold=self.secagg_reconstruction_threshold,
            frac_bits=self.secagg_frac_bits,
        )

    def to_values(self) -> dict[str, Any]:
        """Return every declared key's value (another family's at its default), for rules."""
        return {**defaults(), **self.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        """Return the configuration with kebab-case keys (as written to config.json)."""
        out = {key.replace("_", "-"): value for key, value in asdict(self).items()}
        out.pop("extra")
        out.update(self.extra)
        return out

    @property
    def family(self) -> str:
        """Return the algorithm's family (:data:`flower_app.registry.FAMILIES`)."""
        return ALGORITHMS[self.algorithm].family

    def get(self, key: str) -> Any:
        """Return a family key's validated, typed value (e.g. ``cfg.get("fsa-lr")``)."""
        return dict(self.extra)[key]

    def output_root(self) -> Path:
        """Return the absolute parent of run folders.

        ``output-dir``, else ``$FLOWER_APP_OUTPUT`` of *this* process, else
        ``~/flower_app_runs``. Under ``flwr run`` the ServerApp's environment is the
        SuperLink's, fixed when it started; ``flower-app run`` therefore resolves this in the
        caller's environment and passes it as ``output-dir`` (docs/running.md).
        """
        root = self.output_dir or os.environ.get("FLOWER_APP_OUTPUT", "") or "~/flower_app_runs"
        return Path(root).expanduser().resolve()

    def run_folder(self) -> Path:
        """Return the absolute run folder: ``output_root() / run_name``.

        Without a ``run-name`` the name is ``<algorithm>-<dataset>-seed<seed>-<time>``, with
        ``-2``, ``-3``, ... added when a folder of that name exists (two runs started in the
        same second keep both).
        """
        root = self.output_root()
        if self.run_name:
            return root / self.run_name
        name = f"{self.algorithm}-{self.dataset}-seed{self.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        return root / fresh_run_name(root, name)


def fresh_run_name(root: Path, name: str) -> str:
    """Return ``name``, or ``name-2``, ``name-3``, ...: the first that is not in ``root``."""
    taken, k = name, 1
    while (Path(root) / taken).exists():
        k += 1
        taken = f"{name}-{k}"
    return taken
