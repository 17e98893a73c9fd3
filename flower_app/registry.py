"""Which algorithms the app runs, their families and datasets, and where each runner lives.

A *runner* module (``flower_app/runners/<family>.py``) ties one algorithm family to the app:

``server_run(grid, cfg) -> dict``
    the ServerApp side: runs the strategy over the grid, writes the run folder, returns the
    summary.
``make_client(cfg, context) -> NumPyClient``
    the ClientApp side: the node's client.
``summary_line(summary) -> str``
    the one line printed at the end of a run.

A family's own run_config keys (beyond the common ones of
:class:`~flower_app.config.AppConfig`) are declared, with their types, defaults and ranges,
in :mod:`flower_app.settings` (family = the :attr:`Algorithm.family` of this registry); the
runner reads them already validated and typed with ``cfg.get(key)``.

Runners are imported lazily, so a run of one family never imports another's dependencies.
The direct engine (the repository's ``direct/``, not installed) runs each family in-process
with the pieces of its runner.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

__all__ = ["ALGORITHMS", "DATASETS", "FAMILIES", "Algorithm", "algorithms_of", "load_runner"]

#: dataset name -> short description (each algorithm accepts the subset its entry lists)
DATASETS = {
    "synthetic-facility-location": "embedded synthetic facility location (no files needed)",
    "movielens": "MovieLens-1M facility location (users = clients), ml-1m/*.dat in data-dir",
    "dblp": "DBLP researcher-venue max coverage 2018-2021, dblp/dblp.xml(.gz) in data-dir",
    "synthetic-dblp": "calibrated synthetic stand-in for DBLP (704,738 researchers, 2,675 venues)",
    "facility-location-table": "your own (user, item, value) table in data-file (CSV/TSV/parquet)",
    "coverage-sets": "your own set system in data-file (one line of items per user, or pairs)",
    # maxfl
    "fmnist": "Fashion-MNIST, official IDX files fashion-mnist/*.gz in data-dir",
    "image-clients": "your own labelled images in data-file (.npz x, y[, client] or IDX)",
    "emnist": "EMNIST ByClass (62 classes), official IDX files emnist/*.gz in data-dir",
    "synthetic-emnist": "calibrated synthetic stand-in for EMNIST ByClass (no files needed)",
    # fedsubavg
    "movielens-rating": "MovieLens-1M rating classification (FedSubAvg), ml-1m/*.dat in data-dir",
    "synthetic-movielens-rating": "calibrated synthetic stand-in for movielens-rating",
    "rating-table": "your own table user, features..., 0/1 label in data-file (FedSubAvg)",
    "sent140": "Sentiment140: FedSubAvg's LSTM (one client per node) or MaxFL's MLP on GloVe "
    "features; sent140/ CSV or LEAF JSON (+ GloVe for MaxFL) in data-dir",
    "synthetic-sent140": "calibrated synthetic stand-in for sent140 (1,473 clients; MaxFL: 927 "
    "of its accounts with >= 50 tweets, random token vectors for GloVe)",
    "amazon": "Amazon Electronics CTR (DIN, one client per node), amazon/ files in data-dir",
    "synthetic-amazon": "calibrated synthetic stand-in for amazon (1,870 clients)",
}

#: algorithm families, one runner each (flower_app/runners/<family>.py)
FAMILIES = ("fedsm", "fedcg", "maxfl", "fedsubavg")

#: datasets of the submodular families (facility location and max coverage instances)
SUBMODULAR_DATASETS = (
    "synthetic-facility-location",
    "movielens",
    "dblp",
    "synthetic-dblp",
    "facility-location-table",
    "coverage-sets",
)
#: datasets of MaxFL and its baselines
MAXFL_DATASETS = (
    "fmnist", "emnist", "synthetic-emnist", "image-clients", "sent140", "synthetic-sent140"
)  # fmt: skip
#: datasets of FedSubAvg and its baselines
FEDSUBAVG_DATASETS = (
    "movielens-rating",
    "synthetic-movielens-rating",
    "rating-table",
    "sent140",
    "synthetic-sent140",
    "amazon",
    "synthetic-amazon",
)
#: FedSubAvg's torch tasks (an LSTM, DIN: :mod:`flower_app.runners.fedsubavg_torch`); the
#: others are numpy tasks, whose ClientApps never import torch
FEDSUBAVG_TORCH_DATASETS = ("sent140", "synthetic-sent140", "amazon", "synthetic-amazon")


@dataclass(frozen=True)
class Algorithm:
    """One value of the ``algorithm`` run_config key.

    Attributes
    ----------
    name : str
        The key's value.
    description : str
        One line for error messages and the README.
    family : str
        One of :data:`FAMILIES`: the runner and the family's run_config keys.
    datasets : tuple of str
        Values of ``dataset`` the algorithm accepts.
    """

    name: str
    description: str
    family: str
    datasets: tuple[str, ...]

    @property
    def runner(self) -> str:
        """Return the module path of the family's runner."""
        return f"flower_app.runners.{self.family}"


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm(
            "fedsm",
            "FedSM: Alg. 1 (r rounds, K users, d sampled gains per user), Alg. 2 (O(log m) "
            "rounds) or amplification (Alg. 3), by fedsm-mode",
            "fedsm",
            SUBMODULAR_DATASETS,
        ),
        # maxfl: MaxFL (Cho et al., TMLR 2024) and the paper's baselines, one runner
        *(
            Algorithm(name, text, "maxfl", MAXFL_DATASETS)
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
            "fedcg",
            SUBMODULAR_DATASETS,
        ),
        Algorithm(
            "fedcg-plus",
            "FedCG+ Alg. 2: tau local continuous-greedy steps per user between aggregations",
            "fedcg",
            SUBMODULAR_DATASETS,
        ),
        Algorithm(
            "fed-discrete-greedy",
            "Federated discrete greedy Alg. 3 with importance factors (Algs. 4/5)",
            "fedcg",
            SUBMODULAR_DATASETS,
        ),
        # fedsubavg: FedSubAvg (Ding et al., NeurIPS 2022) and its baselines, one runner
        *(
            Algorithm(name, text, "fedsubavg", FEDSUBAVG_DATASETS)
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


def algorithms_of(family: str) -> tuple[str, ...]:
    """Return the algorithms of ``family``, in registry order."""
    return tuple(a.name for a in ALGORITHMS.values() if a.family == family)


def load_runner(name: str) -> ModuleType:
    """Import and return the runner module of algorithm ``name``."""
    return importlib.import_module(ALGORITHMS[name].runner)
