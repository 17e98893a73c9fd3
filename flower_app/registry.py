"""Which algorithms the app runs, and where each one's runner lives.

A *runner* module (``flower_app/runners/<family>.py``) ties one algorithm family to the app:

``server_run(grid, cfg, run_config) -> dict``
    the ServerApp side: runs the strategy over the grid, writes the run folder, returns the
    summary.
``direct_run(cfg, run_config, progress=False) -> dict``
    the same algorithm on the direct engine (in-process, no Flower).
``make_client(cfg, context) -> NumPyClient``
    the ClientApp side: the node's client.
``summary_line(summary) -> str``
    the one line printed at the end of a run.

A family's own run_config keys (beyond the common ones of
:class:`~flower_app.config.AppConfig`) and their defaults are listed here, in its
:class:`Algorithm` entry, so that config validation needs no runner import; every key must
also be declared in ``[tool.flwr.app.config]`` (a test checks it). The runner parses them from
``cfg.extra``.

Runners are imported lazily, so a run of one family never imports another's dependencies.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["ALGORITHMS", "Algorithm", "family_keys", "load_runner"]

#: datasets of the submodular families (facility location and max coverage instances)
SUBMODULAR_DATASETS = ("synthetic-facility-location", "movielens", "dblp", "synthetic-dblp")

# maxfl: datasets and run_config keys of MaxFL and its baselines (flower_app/runners/maxfl.py)
MAXFL_DATASETS = ("fmnist", "emnist", "synthetic-emnist")
MAXFL_CONFIG: dict[str, Any] = {
    "maxfl-rounds": 200,
    "maxfl-lr": 0.05,
    "maxfl-server-lr": 1.0,
    "maxfl-batch-size": 64,
    "maxfl-local-steps": 10,
    "maxfl-eps": 0.001,
    "maxfl-solo-steps": 100,
    "maxfl-tune-steps": 5,
    "maxfl-requirement": "train",
    "maxfl-participation": "flexible",
    "maxfl-mandatory-rounds": 10,
    "maxfl-partition": "dirichlet",
    "maxfl-alpha": 0.5,
    "maxfl-unseen-users": -1,
    "maxfl-label-flip": 0.3,
    "maxfl-train-fraction": 0.6,
    "maxfl-dropout": 0.2,
    "maxfl-eval-every": 10,
    "maxfl-prox-mu": 0.01,
    "maxfl-qffl-q": 1.0,
    "maxfl-byzantine": 0.0,
    "maxfl-byzantine-loss": 10.0,
    "maxfl-byzantine-noise": 0.1,
    "maxfl-mw-eta": 0.1,
    "maxfl-perfedavg-alpha": 0.01,
    "maxfl-pfedme-lambda": 15.0,
    "maxfl-pfedme-k": 5,
    "maxfl-pfedme-lr": 0.01,
}


# fedsm: run_config keys of FedSM's modes (flower_app/runners/fedsm.py documents each one)
FEDSM_CONFIG: dict[str, Any] = {
    "fedsm-mode": "alg1",
    "fedsm-epsilon": 0.405,
    "fedsm-tau": 0.0,
    "fedsm-levels": 0,
    "fedsm-j-from": 1,
    "fedsm-eta": 0.1,
    "fedsm-inner": "alg1",
    "fedsm-surrogate": "exact",
    "fedsm-samples": 4,
    "fedsm-rounding": "pipage",
}


# fedcg: run_config keys of FedCG, FedCG+ and the federated discrete greedy
# (flower_app/runners/fedcg.py documents each one)
FEDCG_CONFIG: dict[str, Any] = {
    "fedcg-rounds": 100,
    "fedcg-eta": 0.0,
    "fedcg-local-steps": 5,
    "fedcg-gradient": "exact",
    "fedcg-gradient-samples": 10,
    "fedcg-rounding": "greedy",
    "fedcg-fill-base": True,
    "fedcg-client-weights": "uniform",
    "dgreedy-kappa": 50.0,
}


# fedsubavg: datasets and run_config keys of FedSubAvg and its baselines
# (flower_app/runners/fedsubavg.py documents each key)
FEDSUBAVG_DATASETS = ("movielens-rating", "synthetic-movielens-rating")
FEDSUBAVG_CONFIG: dict[str, Any] = {
    "fsa-rounds": 200,
    "fsa-local-iters": 10,
    "fsa-batch-size": 5,
    "fsa-lr": 0.1,
    "fsa-weighting": "clients",
    "fsa-proximal-mu": 0.01,
    "fsa-adam-eta": 1.0,
    "fsa-adam-beta1": 0.9,
    "fsa-adam-beta2": 0.99,
    "fsa-adam-tau": 0.001,
}


@dataclass(frozen=True)
class Algorithm:
    """One value of the ``algorithm`` run_config key.

    Attributes
    ----------
    name : str
        The key's value.
    description : str
        One line for error messages and the README.
    runner : str
        Module path of the runner.
    datasets : tuple of str
        Values of ``dataset`` the algorithm accepts.
    config : dict
        The family's own run_config keys and their defaults.
    """

    name: str
    description: str
    runner: str
    datasets: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm(
            "fedsm",
            "FedSM: Alg. 1 (r rounds, K users, d sampled gains per user), Alg. 2 (O(log m) "
            "rounds) or amplification (Alg. 3), by fedsm-mode",
            "flower_app.runners.fedsm",
            SUBMODULAR_DATASETS,
            FEDSM_CONFIG,
        ),
        # maxfl: MaxFL (Cho et al., TMLR 2024) and the paper's baselines, one runner
        *(
            Algorithm(name, text, "flower_app.runners.maxfl", MAXFL_DATASETS, MAXFL_CONFIG)
            for name, text in (
                ("maxfl", "MaxFL Algorithm 1: q_k-weighted updates, adaptive global lr"),
                ("fedavg", "FedAvg baseline of the MaxFL experiments"),
                ("fedprox", "FedProx baseline of the MaxFL experiments"),
                ("qffl", "q-FFL (q-FedAvg) baseline of the MaxFL experiments"),
                ("scaffold", "SCAFFOLD baseline of the MaxFL experiments"),
                ("mwfed", "MW-Fed (Blum et al. 2021): multiplicative weights on unmet clients"),
                ("perfedavg", "Per-FedAvg (FO) baseline of the MaxFL experiments"),
                ("pfedme", "pFedMe baseline of the MaxFL experiments"),
            )
        ),
        # fedcg: Rafiey (ICML 2024), one runner for the three algorithms
        Algorithm(
            "fedcg",
            "FedCG Alg. 1: T rounds, each sampled user sends the base maximising its gradient",
            "flower_app.runners.fedcg",
            SUBMODULAR_DATASETS,
            FEDCG_CONFIG,
        ),
        Algorithm(
            "fedcg-plus",
            "FedCG+ Alg. 2: tau local continuous-greedy steps per user between aggregations",
            "flower_app.runners.fedcg",
            SUBMODULAR_DATASETS,
            FEDCG_CONFIG,
        ),
        Algorithm(
            "fed-discrete-greedy",
            "Federated discrete greedy Alg. 3 with importance factors (Algs. 4/5)",
            "flower_app.runners.fedcg",
            SUBMODULAR_DATASETS,
            FEDCG_CONFIG,
        ),
        # fedsubavg: FedSubAvg (Ding et al., NeurIPS 2022) and its baselines, one runner
        *(
            Algorithm(
                name, text, "flower_app.runners.fedsubavg", FEDSUBAVG_DATASETS, FEDSUBAVG_CONFIG
            )
            for name, text in (
                ("fedsubavg", "FedSubAvg Alg. 1: submodel updates corrected by feature heat N/n_m"),
                ("fedavg-sub", "FedAvg on submodels (no heat correction), FedSubAvg baseline"),
                ("fedprox-sub", "FedProx (mu = 0.01) on submodels, FedSubAvg baseline"),
                ("fedadam-sub", "FedAdam (Table 5) on submodels, FedSubAvg baseline"),
                ("scaffold-sub", "server-side SCAFFOLD approximation (App. D.2), baseline"),
                ("central-sgd", "CentralSGD on pooled data, batch K*B (FedSubAvg reference)"),
            )
        ),
    )
}


def family_keys() -> dict[str, Any]:
    """Return every family-specific run_config key with its default."""
    keys: dict[str, Any] = {}
    for algorithm in ALGORITHMS.values():
        keys.update(algorithm.config)
    return keys


def load_runner(name: str) -> ModuleType:
    """Import and return the runner module of algorithm ``name``."""
    return importlib.import_module(ALGORITHMS[name].runner)
