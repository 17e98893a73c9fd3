"""Rules across run_config keys, and between the keys and the instance, each declared once.

A value's own range is its :class:`~flower_app.settings.setting.Setting`. What involves
several keys, or the keys and the data, is a rule here:

- :data:`RULES`: keys that do not go together (``fsa-dp-noise`` without secure aggregation,
  ``data-file`` without a dataset that reads it, ...). :meth:`flower_app.config.AppConfig.
  from_run_config` refuses a config that breaks one, so every runner gets a config that
  keeps them all, and ``flower-app run`` names each broken one before Flower starts.
- :data:`SIZE_RULES`: the keys against the instance and the federation (``k`` above the
  elements or the matroid's rank, ``clients-per-round`` above the users, secure aggregation
  on fewer nodes than it needs, ...). ``flower-app run`` evaluates them on what it learns of
  the instance before Flower starts (:func:`flower_app.datasets.check.check_data`); each
  runner evaluates the same rules on the loaded instance (:func:`raise_size_problems`).

Each rule returns one line naming the key(s), the value(s) and what would be valid. The
rules import no algorithm code (a config is checked in a fraction of a second); constants
they repeat from :mod:`flower_app.algorithms` are checked equal by ``tests/test_settings.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flower_app.registry import ALGORITHMS, FEDSUBAVG_TORCH_DATASETS
from flower_app.settings.setting import ConfigError

__all__ = [
    "DP_ALGORITHMS",
    "NOT_SECURE",
    "OWN_DATASETS",
    "RULES",
    "SECURE_FAMILIES",
    "PARQUET_SUFFIXES",
    "SIZE_RULES",
    "TABLE_SUFFIXES",
    "TEXT_TABLE_SEPARATORS",
    "Instance",
    "Rule",
    "raise_size_problems",
    "rule_problems",
    "size_problems",
    "submodular_instance",
]

#: the families whose strategies take ``secure-aggregation`` = true
SECURE_FAMILIES = ("fedsm", "maxfl", "fedcg", "fedsubavg")
#: algorithms of those families that refuse it (their step is not a function of a sum)
NOT_SECURE = ("mwfed", "central-sgd")
#: MaxFL-family algorithms with client-level Gaussian DP (as in
#: :data:`flower_app.algorithms.common.gaussian_dp.DP_ALGORITHMS`)
DP_ALGORITHMS = ("maxfl", "fedavg")
#: datasets read from ``data-file`` -> the file extensions each reads (None: any text file)
OWN_DATASETS: dict[str, tuple[str, ...] | None] = {
    "facility-location-table": (".csv", ".tsv", ".tab", ".parquet", ".pq"),
    "coverage-sets": None,
    "rating-table": (".csv", ".tsv", ".tab", ".parquet", ".pq"),
    "image-clients": (".npz", "images-idx3-ubyte", "images-idx3-ubyte.gz"),
}
#: the text tables your own data may come in, by extension, and their separators
TEXT_TABLE_SEPARATORS = {".csv": ",", ".tsv": "\t", ".tab": "\t"}
#: the extensions of a Parquet table
PARQUET_SUFFIXES = (".parquet", ".pq")
#: the file extensions of a table (the other files of coverage-sets are text, a set per line)
TABLE_SUFFIXES = (*TEXT_TABLE_SEPARATORS, *PARQUET_SUFFIXES)
#: datasets whose file is a table named by ``data-columns`` (coverage-sets: a table or text)
_COLUMN_DATASETS = ("facility-location-table", "coverage-sets", "rating-table")
#: datasets that read ``item-names``
_NAMED_DATASETS = ("facility-location-table", "coverage-sets")


def _family(v: Mapping[str, Any]) -> str:
    return ALGORITHMS[v["algorithm"]].family


@dataclass(frozen=True)
class Rule:
    """One rule across keys: when it is broken, and the line that says so.

    Attributes
    ----------
    keys : tuple of str
        The keys it involves (the first is the one a message names first).
    broken : callable
        ``broken(values) -> bool`` on every key's validated value.
    message : callable
        ``message(values) -> str``: the problem in one line.
    """

    keys: tuple[str, ...]
    broken: Callable[[Mapping[str, Any]], bool]
    message: Callable[[Mapping[str, Any]], str]


def _suffix_fits(dataset: str, path: str) -> bool:
    accepted = OWN_DATASETS[dataset]
    return accepted is None or path.lower().endswith(accepted)


def _non_default(v: Mapping[str, Any], key: str) -> bool:
    from flower_app.settings.declarations import SETTINGS

    return bool(v[key] != SETTINGS[key].default)


RULES: tuple[Rule, ...] = (
    # ---------------------------------------------------------------- every family
    Rule(
        ("server-data", "algorithm"),
        lambda v: v["server-data"] == "none"
        and (_family(v) not in ("fedsm", "fedcg", "fedsubavg") or v["algorithm"] == "central-sgd"),
        lambda v: f"run_config 'server-data' = 'none' is implemented for the submodular "
        f"families (fedsm, fedcg) and the federated FedSubAvg family, not for "
        f"{v['algorithm']!r} ({_family(v)})",
    ),
    Rule(
        ("resume", "algorithm"),
        lambda v: v["resume"] and v["algorithm"] == "central-sgd",
        lambda v: "run_config 'resume' = true is implemented for every federated algorithm "
        "(not central-sgd, which trains inside the ServerApp), not for algorithm "
        f"{v['algorithm']!r}",
    ),
    Rule(
        ("secure-aggregation", "algorithm"),
        lambda v: v["secure-aggregation"]
        and (_family(v) not in SECURE_FAMILIES or v["algorithm"] in NOT_SECURE),
        lambda v: f"run_config 'secure-aggregation' = true is implemented for the "
        f"{', '.join(SECURE_FAMILIES)} families (except {', '.join(NOT_SECURE)}: their steps "
        f"need every client's reply), not yet for {v['algorithm']!r} ({_family(v)})",
    ),
    Rule(
        ("resume", "run-name"),
        lambda v: v["resume"] and not v["run-name"],
        lambda v: "run_config 'resume' = true needs the interrupted run's 'run-name' (and the "
        "same 'output-dir'): the run folder holds its checkpoint",
    ),
    # ---------------------------------------------------------------- your own data
    Rule(
        ("data-file", "dataset"),
        lambda v: bool(v["data-file"]) and v["dataset"] not in OWN_DATASETS,
        lambda v: f"run_config 'data-file' = {v['data-file']!r} is read only by the datasets "
        f"{', '.join(OWN_DATASETS)}; this run's dataset {v['dataset']!r} would ignore it: set "
        "'dataset' to the kind of your file (docs/own-data.md), or drop 'data-file'",
    ),
    Rule(
        ("data-file", "dataset"),
        lambda v: v["dataset"] in OWN_DATASETS
        and bool(v["data-file"])
        and not _suffix_fits(v["dataset"], v["data-file"]),
        lambda v: f"run_config 'data-file' = {v['data-file']!r}: dataset {v['dataset']!r} reads "
        f"files ending in {', '.join(OWN_DATASETS[v['dataset']] or ())}",
    ),
    Rule(
        ("data-columns", "dataset"),
        lambda v: _non_default(v, "data-columns") and v["dataset"] not in _COLUMN_DATASETS,
        lambda v: f"run_config 'data-columns' = {v['data-columns']!r} names the columns of a "
        f"table of {', '.join(_COLUMN_DATASETS)}; dataset {v['dataset']!r} would ignore it: "
        "leave it at its default",
    ),
    Rule(
        ("data-columns", "data-file"),
        lambda v: v["dataset"] == "coverage-sets"
        and _non_default(v, "data-columns")
        and bool(v["data-file"])
        and not v["data-file"].lower().endswith(TABLE_SUFFIXES),
        lambda v: f"run_config 'data-columns' = {v['data-columns']!r} names a table's columns; "
        f"'data-file' = {v['data-file']!r} is a text file of one set per line (a table ends in "
        f"{', '.join(TABLE_SUFFIXES)}): leave 'data-columns' at its default",
    ),
    Rule(
        ("item-names", "dataset"),
        lambda v: bool(v["item-names"]) and v["dataset"] not in _NAMED_DATASETS,
        lambda v: f"run_config 'item-names' names the items of {', '.join(_NAMED_DATASETS)}; "
        f"dataset {v['dataset']!r} would ignore it: drop it",
    ),
    # ---------------------------------------------------------------- fedsm
    Rule(
        ("fedsm-dp-epsilon", "fedsm-mode", "fedsm-rng"),
        lambda v: _family(v) == "fedsm"
        and v["fedsm-dp-epsilon"] > 0
        and (v["fedsm-mode"] != "alg1" or v["fedsm-rng"] != "per-user"),
        lambda v: "run_config 'fedsm-dp-epsilon' > 0 (shuffle-model DP) is implemented for "
        "fedsm-mode = 'alg1' with fedsm-rng = 'per-user', not fedsm-mode = "
        f"{v['fedsm-mode']!r}, fedsm-rng = {v['fedsm-rng']!r}",
    ),
    Rule(
        ("fedsm-history-clamp", "fedsm-mode"),
        lambda v: _family(v) == "fedsm"
        and v["fedsm-history-clamp"] == "mean"
        and v["fedsm-mode"] != "alg1",
        lambda v: "run_config 'fedsm-history-clamp' = 'mean' is implemented for fedsm-mode = "
        f"'alg1', not {v['fedsm-mode']!r} (the other modes run without a clamp: drop it or set "
        "'off')",
    ),
    # ---------------------------------------------------------------- fedcg
    Rule(
        ("clients-per-round", "algorithm"),
        lambda v: v["algorithm"] == "fed-discrete-greedy" and _non_default(v, "clients-per-round"),
        lambda v: "fed-discrete-greedy samples each user with probability min(1, κ w_i) set by "
        f"'dgreedy-kappa' (now {v['dgreedy-kappa']}); 'clients-per-round' = "
        f"{v['clients-per-round']!r} would be ignored: leave it at its default and set "
        "'dgreedy-kappa' instead",
    ),
    Rule(
        ("fedcg-rounding", "algorithm"),
        lambda v: v["algorithm"] == "fed-discrete-greedy" and _non_default(v, "fedcg-rounding"),
        lambda v: f"run_config 'fedcg-rounding' = {v['fedcg-rounding']!r} rounds FedCG's "
        "fractional point; fed-discrete-greedy chooses its set itself and would ignore it: "
        "leave it at its default",
    ),
    Rule(
        ("dgreedy-kappa", "fedcg-rounding"),
        lambda v: v["algorithm"] in ("fedcg", "fedcg-plus")
        and _non_default(v, "dgreedy-kappa")
        and v["fedcg-rounding"] != "verified",
        lambda v: f"run_config 'dgreedy-kappa' = {v['dgreedy-kappa']} is the discrete greedy's "
        f"κ; {v['algorithm']} uses it only with fedcg-rounding = 'verified' (now "
        f"{v['fedcg-rounding']!r}) and would ignore it: drop it or set that rounding",
    ),
    Rule(
        ("fedcg-client-weights", "server-data"),
        lambda v: _family(v) == "fedcg"
        and v["fedcg-client-weights"] == "data-size"
        and v["server-data"] == "none",
        lambda v: "run_config 'fedcg-client-weights' = 'data-size' needs every user's data size "
        "on the server; with server-data = 'none' use 'uniform'",
    ),
    # ---------------------------------------------------------------- maxfl
    Rule(
        ("maxfl-sent140-vectors", "dataset"),
        lambda v: _family(v) == "maxfl"
        and v["maxfl-sent140-vectors"] != "random"
        and v["dataset"] != "synthetic-sent140",
        lambda v: f"run_config 'maxfl-sent140-vectors' = {v['maxfl-sent140-vectors']!r} is for "
        f"the synthetic-sent140 stand-in; {v['dataset']} uses its own features (GloVe for "
        "sent140): use 'random'",
    ),
    Rule(
        ("maxfl-dp-noise", "algorithm"),
        lambda v: _family(v) == "maxfl"
        and v["maxfl-dp-noise"] > 0
        and v["algorithm"] not in DP_ALGORITHMS,
        lambda v: "run_config 'maxfl-dp-noise' > 0 (client-level DP) is implemented for "
        f"{', '.join(DP_ALGORITHMS)}, not {v['algorithm']!r}",
    ),
    Rule(
        ("maxfl-dp-noise", "maxfl-participation"),
        lambda v: _family(v) == "maxfl"
        and v["maxfl-dp-noise"] > 0
        and v["maxfl-participation"] != "all",
        lambda v: "run_config 'maxfl-dp-noise' > 0 needs maxfl-participation = 'all': the "
        "flexible opt-in test reveals each client's appeal, outside the DP guarantee",
    ),
    Rule(
        ("maxfl-dp-noise", "secure-aggregation"),
        lambda v: _family(v) == "maxfl" and v["maxfl-dp-noise"] > 0 and not v["secure-aggregation"],
        lambda v: "run_config 'maxfl-dp-noise' > 0 needs secure-aggregation = true: the noise "
        "is added by the clients, so only a securely aggregated sum is private",
    ),
    # ---------------------------------------------------------------- fedsubavg
    Rule(
        ("fsa-dp-noise", "fsa-weighting"),
        lambda v: _family(v) == "fedsubavg"
        and v["fsa-dp-noise"] > 0
        and (v["algorithm"] == "central-sgd" or v["fsa-weighting"] != "clients"),
        lambda v: "run_config 'fsa-dp-noise' > 0 (client-level DP) needs a federated algorithm "
        "and fsa-weighting = 'clients' (sample-size weights have no bounded sensitivity)",
    ),
    Rule(
        ("fsa-dp-noise", "secure-aggregation"),
        lambda v: _family(v) == "fedsubavg"
        and v["fsa-dp-noise"] > 0
        and not v["secure-aggregation"]
        and v["dataset"] not in FEDSUBAVG_TORCH_DATASETS,
        lambda v: "run_config 'fsa-dp-noise' > 0 needs secure-aggregation = true: the clients "
        "add the noise, so only a securely aggregated sum is private",
    ),
    Rule(
        ("dataset", "secure-aggregation", "fsa-dp-noise", "server-data", "resume"),
        lambda v: _family(v) == "fedsubavg"
        and v["dataset"] in FEDSUBAVG_TORCH_DATASETS
        and bool(_torch_unsupported(v)),
        lambda v: f"{_torch_unsupported(v)} not supported on the torch tasks ({v['dataset']}) "
        "yet",
    ),
    Rule(
        ("fsa-embedding-init", "dataset"),
        lambda v: _family(v) == "fedsubavg"
        and v["fsa-embedding-init"] != "random"
        and "sent140" not in v["dataset"],
        lambda v: f"run_config 'fsa-embedding-init' = {v['fsa-embedding-init']!r} is for the "
        f"Sent140 LSTM, not {v['dataset']} (use 'random')",
    ),
    Rule(
        ("fsa-embedding-init", "dataset"),
        lambda v: _family(v) == "fedsubavg"
        and v["fsa-embedding-init"] == "planted"
        and v["dataset"] == "sent140",
        lambda v: "run_config 'fsa-embedding-init' = 'planted' is for the stand-in "
        "synthetic-sent140 (real data: 'glove' or 'random')",
    ),
)


def _torch_unsupported(v: Mapping[str, Any]) -> list[str]:
    given = {
        "secure-aggregation": v["secure-aggregation"],
        "fsa-dp-noise": v["fsa-dp-noise"] > 0,
        "server-data = 'none'": v["server-data"] == "none",
        "resume": v["resume"],
    }
    return [key for key, on in given.items() if on]


def rule_problems(values: Mapping[str, Any]) -> list[str]:
    """Return the lines of every broken rule of :data:`RULES` (empty: none is broken).

    Parameters
    ----------
    values : Mapping
        Every key's validated value (:func:`flower_app.settings.parse`).
    """
    return [rule.message(values) for rule in RULES if rule.broken(values)]


# ---------------------------------------------------------------------- the instance
@dataclass(frozen=True)
class Instance:
    """What is known of a run's instance and federation; None: not known (not checked).

    Attributes
    ----------
    name : str
        The instance, as messages name it (e.g. ``"synthetic-facility-location"``).
    users : int, optional
        The users (clients) a round samples from; MaxFL: the seen clients.
    elements : int, optional
        The ground set's size m (submodular families).
    rank : int, optional
        The rank of the configured matroid: ``k`` for a uniform one, the sum of the blocks'
        ``min(capacity, size)`` for a partition one.
    groups : int, optional
        The partition matroid's blocks (for the message).
    nodes : int, optional
        The federation's SuperNodes.
    one_client_per_node : bool
        Every node runs one client (FedSubAvg's torch tasks): ``nodes`` must equal ``users``.
    """

    name: str
    users: int | None = None
    elements: int | None = None
    rank: int | None = None
    groups: int | None = None
    nodes: int | None = None
    one_client_per_node: bool = False


#: secure aggregation's least number of nodes (as
#: :data:`flower_app.privacy.topology.MIN_NODES`)
SECURE_MIN_NODES = 3


@dataclass(frozen=True)
class SizeRule:
    """One rule between the keys and the instance (see :class:`Rule`).

    ``broken(values, instance)`` is only asked when every field it needs is known.
    """

    keys: tuple[str, ...]
    needs: tuple[str, ...]
    broken: Callable[[Mapping[str, Any], Instance], bool]
    message: Callable[[Mapping[str, Any], Instance], str]


def _submodular(v: Mapping[str, Any]) -> bool:
    return _family(v) in ("fedsm", "fedcg")


def _clients(v: Mapping[str, Any]) -> str:
    """Return what a round samples, in the family's words."""
    return {"maxfl": "seen clients", "fedsubavg": "clients"}.get(_family(v), "users")


def _int_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pairs_mode(v: Mapping[str, Any]) -> bool:
    """FedSM's d counts (element, prefix) pairs (Alg. 2, or amplification over Alg. 2)."""
    return v["fedsm-mode"] == "alg2" or (
        v["fedsm-mode"] == "amplified" and v["fedsm-inner"] == "alg2"
    )


def _d_cap(v: Mapping[str, Any], inst: Instance) -> int:
    assert inst.elements is not None
    return inst.elements * v["k"] if _pairs_mode(v) else inst.elements


def _matroid_words(v: Mapping[str, Any], inst: Instance) -> str:
    if v["matroid"] == "partition":
        return (f"the rank {inst.rank} of the partition matroid ({inst.groups} groups of "
                f"{inst.name}, partition-capacity {v['partition-capacity']} each)")  # fmt: skip
    return f"the {inst.elements} elements of {inst.name}"


SIZE_RULES: tuple[SizeRule, ...] = (
    SizeRule(
        ("k",),
        ("elements", "rank"),
        lambda v, inst: _submodular(v) and v["k"] > (inst.rank if v["matroid"] == "partition"
                                                     else inst.elements),  # fmt: skip
        lambda v, inst: f"run_config 'k' = {v['k']} exceeds {_matroid_words(v, inst)}"
        + (": lower k or raise partition-capacity" if v["matroid"] == "partition" else ""),
    ),
    SizeRule(
        ("k", "fedsm-mode"),
        ("rank",),
        lambda v, inst: _family(v) == "fedsm"
        and v["fedsm-mode"] == "amplified"
        and v["matroid"] == "partition"
        and v["k"] < (inst.rank or 0),
        lambda v, inst: f"run_config 'k' = {v['k']}: amplification (fedsm-mode = 'amplified') "
        f"rounds x in the matroid's own polytope, so k must equal {_matroid_words(v, inst)} "
        "(lower partition-capacity or raise k)",
    ),
    SizeRule(
        ("clients-per-round",),
        ("users",),
        lambda v, inst: _int_count(v["clients-per-round"])
        and v["algorithm"] != "fed-discrete-greedy"
        and v["clients-per-round"] > (inst.users or 0),
        lambda v, inst: f"run_config 'clients-per-round' = {v['clients-per-round']} exceeds the "
        f"{inst.users} {_clients(v)} of {inst.name}; "
        f"give a count up to {inst.users}, or a fraction (a float in (0, 1])",
    ),
    SizeRule(
        ("elements-per-client",),
        ("elements",),
        lambda v, inst: _family(v) == "fedsm"
        and _int_count(v["elements-per-client"])
        and v["elements-per-client"] > _d_cap(v, inst),
        lambda v, inst: f"run_config 'elements-per-client' = {v['elements-per-client']} exceeds "
        + (f"the |E|·k = {_d_cap(v, inst)} (element, prefix) pairs" if _pairs_mode(v)
           else f"the {inst.elements} elements") + f" of {inst.name}; give a count up to "
        f"{_d_cap(v, inst)}, or a fraction (a float in (0, 1])",  # fmt: skip
    ),
    SizeRule(
        ("secure-aggregation",),
        ("nodes",),
        lambda v, inst: v["secure-aggregation"] and (inst.nodes or 0) < SECURE_MIN_NODES,
        lambda v, inst: f"run_config 'secure-aggregation' = true needs at least "
        f"{SECURE_MIN_NODES} nodes (a sum of fewer would reveal a node's reply to the others); "
        f"this federation has {inst.nodes} (--federation-config \"num-supernodes=...\")",
    ),
    SizeRule(
        ("dataset",),
        ("nodes", "users"),
        lambda v, inst: inst.one_client_per_node and inst.nodes != inst.users,
        lambda v, inst: f"run_config 'dataset' = {v['dataset']!r}: {inst.name} has {inst.users} "
        f"clients and runs one per node; start {inst.users} SuperNodes "
        f"(--federation-config \"num-supernodes={inst.users}\"), not {inst.nodes}",
    ),
)


def size_problems(values: Mapping[str, Any], instance: Instance) -> list[str]:
    """Return the lines of every broken rule of :data:`SIZE_RULES` whose facts are known.

    Parameters
    ----------
    values : Mapping
        Every key's validated value.
    instance : Instance
        What is known of the instance and the federation.
    """
    found = []
    for rule in SIZE_RULES:
        facts = [getattr(instance, name) for name in rule.needs]
        if rule.needs == ("elements", "rank"):  # k: the rank of a partition, else m
            known = (instance.rank if values["matroid"] == "partition" else instance.elements)
            facts = [known]
        if all(f is not None for f in facts) and rule.broken(values, instance):
            found.append(rule.message(values, instance))
    return found


def submodular_instance(problem: Any, matroid: Any) -> Instance:
    """Return what a runner knows of a submodular instance and its matroid.

    Parameters
    ----------
    problem : flower_app.problems.SubmodularProblem or flower_app.server_data.RemoteProblem
        Its ``name``, ``n_users`` and ``n_elements``.
    matroid : flower_app.submodular.matroids.Matroid
        Its ``rank`` (and, for a partition matroid, its blocks' ``capacities``).
    """
    capacities = getattr(matroid, "capacities", None)
    return Instance(
        str(getattr(problem, "name", "the instance")),
        users=int(problem.n_users),
        elements=int(matroid.n_elements),
        rank=int(matroid.rank),
        groups=None if capacities is None else int(len(capacities)),
    )


def raise_size_problems(cfg: Any, instance: Instance) -> None:
    """Raise :class:`ConfigError` for the broken :data:`SIZE_RULES` (a runner's check).

    Parameters
    ----------
    cfg : flower_app.config.AppConfig
        The run's configuration.
    instance : Instance
        The loaded instance.
    """
    found = size_problems(cfg.to_values(), instance)
    if found:
        raise ConfigError("\n".join(found))
