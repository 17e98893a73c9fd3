"""Runner of MaxFL and its baselines (fedavg, fedprox, qffl, scaffold, mwfed, perfedavg, pfedme).

``server_run`` runs :class:`~flower_app.strategies.cohort.maxfl.MaxFLCohorts` over
the grid and ``make_client`` builds a node's client (the direct engine, the repository's
``direct/maxfl.py``, runs the same protocol in-process with the settings, server and client
made here). Datasets (:data:`DATASETS`): images (an MLP with
hidden layers (64, 30) on the standardised pixels) and Sent140 (``sent140`` and its stand-in
``synthetic-sent140``, :mod:`flower_app.datasets.sent140_features`: accounts as clients,
308 seen + 619 unseen by default, an MLP with hidden layers (128, 86, 30) on the 200-D
average-pooled tweet embedding; ``maxfl-partition`` and ``maxfl-alpha`` do not apply, the
accounts are the partition). All three read the family's run_config keys
(``maxfl-*``, declared and validated in :mod:`flower_app.settings`) through
:func:`settings`, which adds the checks that involve several keys or the data.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context
from flwr.client import NumPyClient
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.common.dp_noise import warn_no_privacy
from flower_app.algorithms.common.gaussian_dp import (
    GaussianAccountant,
    GaussianDP,
)
from flower_app.algorithms.maxfl.appeal import AppealServer
from flower_app.algorithms.maxfl.learning import LocalConfig
from flower_app.algorithms.maxfl.participation import ParticipationSampler
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.learning import (
    DictState,
    LearningClient,
    RecordState,
    byzantine_clients,
)
from flower_app.config import AppConfig, ConfigError
from flower_app.datasets.federated import (
    Federation,
    build_federation,
    federation_from_clients,
)
from flower_app.datasets.maxfl_clients import DATASETS, SENT140, client_counts
from flower_app.datasets.own_images import load_image_clients
from flower_app.datasets.paths import resolve_data_dir
from flower_app.datasets.sent140_features import DIM
from flower_app.experiment import cohort_options, serve_rounds
from flower_app.models.mlp import HIDDEN, SENT140_HIDDEN, init_weights
from flower_app.node_data import MAXFL_SOURCE_KEYS, load_node_images, node_partition, source_of
from flower_app.results import RunWriter
from flower_app.settings.rules import Instance, raise_size_problems
from flower_app.strategies.cohort.maxfl import MaxFLCohorts

__all__ = [
    "DATASETS",
    "MaxFLSettings",
    "make_client",
    "server_run",
    "settings",
    "summary_line",
]

#: Sent140 (real and stand-in): the MLP on the 200-D pooled GloVe vector (3 hidden layers;
#: images keep HIDDEN); the datasets' client counts: :mod:`flower_app.datasets.maxfl_clients`


@dataclass(frozen=True)
class MaxFLSettings:
    """The family's validated settings (see README "MaxFL" for each key).

    Attributes
    ----------
    algorithm, dataset, data_dir : str
        From the common keys.
    seed, data_seed : int
        Algorithm and data seeds.
    n_seen, n_unseen, n_classes : int
        Clients and classes.
    clients_per_round : int
        K.
    rounds, eval_every, mandatory_rounds : int
        T, evaluation period, rounds before opting out.
    flexible : bool
        Appeal-based flexible participation.
    server_lr, eps : float
        η_g and ε.
    mw_eta : float
        MW-Fed's multiplicative-weights rate η_mw.
    partition : str
        ``dirichlet`` or ``clusters``.
    alpha, label_flip, train_fraction, byzantine : float
        Data settings and the Byzantine fraction of seen clients.
    local : LocalConfig
        Client hyperparameters.
    dp : GaussianDP or None
        Client-level Gaussian DP (``maxfl-dp-noise`` > 0), or None.
    data_file : str
        ``image-clients``: your file (:mod:`flower_app.datasets.own_images`).
    sent140_vectors : str
        ``synthetic-sent140``: the token vectors standing in for GloVe (``random`` or
        ``planted``; :func:`~flower_app.datasets.sent140_features.synthetic_sent140_features`).
    n_in : int
        The MLP's input: pixels per image (784 for 28×28) or 200 (Sent140's pooled GloVe).
    hidden : tuple of int
        The MLP's hidden layers: (64, 30) for images, (128, 86, 30) for Sent140.
    """

    algorithm: str
    dataset: str
    data_dir: str
    seed: int
    data_seed: int
    n_seen: int
    n_unseen: int
    n_classes: int
    clients_per_round: int
    rounds: int
    eval_every: int
    mandatory_rounds: int
    flexible: bool
    server_lr: float
    eps: float
    mw_eta: float
    partition: str
    alpha: float
    label_flip: float
    train_fraction: float
    byzantine: float
    local: LocalConfig
    dp: GaussianDP | None = None
    data_file: str = ""
    sent140_vectors: str = "random"
    n_in: int = 784
    hidden: tuple[int, ...] = HIDDEN

    @property
    def n_clients(self) -> int:
        """Seen plus unseen clients."""
        return self.n_seen + self.n_unseen


def settings(cfg: AppConfig) -> MaxFLSettings:
    """Return the family's typed settings (each key was validated by AppConfig).

    Parameters
    ----------
    cfg : AppConfig
        The parsed run config.

    Returns
    -------
    MaxFLSettings
        The settings.

    Raises
    ------
    ConfigError
        If ``clients-per-round`` exceeds the seen clients, or your file has fewer clients
        than asked for (the rules across keys: :mod:`flower_app.settings.rules`).
    """
    unseen = int(cfg.get("maxfl-unseen-users"))
    n_in, hidden, own_clients = 784, HIDDEN, None
    if cfg.dataset in SENT140:
        n_classes, n_in, hidden = 2, DIM, SENT140_HIDDEN
    elif cfg.dataset == "image-clients":
        own = load_image_clients(cfg.data_file)
        n_classes, n_in = own.data.n_classes, int(own.data.images.shape[1])
        own_clients = own.n_clients if own.clients is not None else None
    else:
        n_classes = DATASETS[cfg.dataset][1]
    n_seen, n_unseen = client_counts(cfg.dataset, cfg.num_users, unseen, own_clients,
                                     cfg.data_file)  # fmt: skip
    raise_size_problems(cfg, Instance(cfg.dataset, users=n_seen))
    per_round = cfg.clients_per_round
    per_round = per_round if isinstance(per_round, int) else max(1, int(per_round * n_seen))
    dp = None
    if float(cfg.get("maxfl-dp-noise")) > 0:
        dp = GaussianDP(float(cfg.get("maxfl-dp-noise")), float(cfg.get("maxfl-dp-clip")),
                        float(cfg.get("maxfl-dp-delta")),
                        reproducible=cfg.dp_reproducible_noise)  # fmt: skip
    local = LocalConfig(
        lr=float(cfg.get("maxfl-lr")),
        batch_size=int(cfg.get("maxfl-batch-size")),
        local_steps=int(cfg.get("maxfl-local-steps")),
        dropout=float(cfg.get("maxfl-dropout")),
        solo_steps=int(cfg.get("maxfl-solo-steps")),
        tune_steps=int(cfg.get("maxfl-tune-steps")),
        requirement=str(cfg.get("maxfl-requirement")),
        prox_mu=float(cfg.get("maxfl-prox-mu")),
        qffl_q=float(cfg.get("maxfl-qffl-q")),
        byzantine_loss=float(cfg.get("maxfl-byzantine-loss")),
        byzantine_noise=float(cfg.get("maxfl-byzantine-noise")),
        perfedavg_alpha=float(cfg.get("maxfl-perfedavg-alpha")),
        pfedme_lambda=float(cfg.get("maxfl-pfedme-lambda")),
        pfedme_k=int(cfg.get("maxfl-pfedme-k")),
        pfedme_lr=float(cfg.get("maxfl-pfedme-lr")),
        batched=bool(cfg.get("maxfl-batched-clients")),
    )
    return MaxFLSettings(
        algorithm=cfg.algorithm,
        dataset=cfg.dataset,
        data_dir=cfg.data_dir,
        seed=cfg.seed,
        data_seed=cfg.data_seed,
        n_seen=n_seen,
        n_unseen=n_unseen,
        n_classes=n_classes,
        clients_per_round=per_round,
        rounds=int(cfg.get("maxfl-rounds")),
        eval_every=int(cfg.get("maxfl-eval-every")),
        mandatory_rounds=int(cfg.get("maxfl-mandatory-rounds")),
        flexible=str(cfg.get("maxfl-participation")) == "flexible",
        server_lr=float(cfg.get("maxfl-server-lr")),
        eps=float(cfg.get("maxfl-eps")),
        mw_eta=float(cfg.get("maxfl-mw-eta")),
        partition=str(cfg.get("maxfl-partition")),
        alpha=float(cfg.get("maxfl-alpha")),
        label_flip=float(cfg.get("maxfl-label-flip")),
        train_fraction=float(cfg.get("maxfl-train-fraction")),
        byzantine=float(cfg.get("maxfl-byzantine")),
        local=local,
        dp=dp,
        data_file=cfg.data_file,
        sent140_vectors=str(cfg.get("maxfl-sent140-vectors")),
        n_in=n_in,
        hidden=hidden,
    )


# ---------------------------------------------------------------------- data (cached)
def federation(s: MaxFLSettings) -> Federation:
    """Return the (cached) clients of settings ``s``."""
    return _federation(
        s.dataset, s.data_dir, s.n_seen, s.n_unseen, s.partition, s.alpha, s.label_flip,
        s.train_fraction, s.data_seed, s.data_file, s.sent140_vectors,
    )  # fmt: skip


@lru_cache(maxsize=4)
def _federation(
    dataset: str,
    data_dir: str,
    n_seen: int,
    n_unseen: int,
    partition: str,
    alpha: float,
    label_flip: float,
    train_fraction: float,
    data_seed: int,
    data_file: str = "",
    sent140_vectors: str = "random",
) -> Federation:
    if dataset in SENT140:
        from flower_app.datasets import sent140_features

        features = (
            sent140_features.load_sent140_features(resolve_data_dir(data_dir))
            if dataset == "sent140"
            else sent140_features.synthetic_sent140_features(data_seed, vectors=sent140_vectors)
        )
        data, clients = features.as_labelled(dataset, data_seed)
        return federation_from_clients(
            data, clients, n_seen, n_unseen, label_flip, train_fraction, data_seed
        )
    if dataset == "image-clients":
        own = load_image_clients(data_file)
        if own.clients is not None:
            return federation_from_clients(
                own.data, own.clients, n_seen, n_unseen, label_flip, train_fraction, data_seed
            )
        data = own.data
    elif dataset == "fmnist":
        from flower_app.datasets.fmnist import load_fmnist

        data = load_fmnist(data_dir)
    elif dataset == "emnist":
        from flower_app.datasets.emnist import load_emnist

        data = load_emnist(data_dir)
    else:
        from flower_app.datasets.emnist import synthetic_emnist

        data = synthetic_emnist(n_seen + n_unseen, data_seed)
    return build_federation(
        data, n_seen, n_unseen, partition, alpha, label_flip, train_fraction, data_seed
    )


def _init(s: MaxFLSettings) -> list[np.ndarray]:
    return init_weights(s.seed, s.n_in, s.n_classes, s.hidden)


def _server(s: MaxFLSettings) -> tuple[AppealServer, ParticipationSampler]:
    server = AppealServer(
        s.algorithm, _init(s), s.n_seen, server_lr=s.server_lr, eps=s.eps, mw_eta=s.mw_eta
    )
    sampler = ParticipationSampler(
        s.n_seen, s.clients_per_round, s.flexible, s.mandatory_rounds, s.seed
    )
    return server, sampler


def _client(
    s: MaxFLSettings,
    first: int,
    count: int,
    state: DictState,
    pid: int,
    parts: int,
    fed: Federation | None = None,
):
    return LearningClient(
        federation(s) if fed is None else fed,
        first,
        count,
        s.algorithm,
        s.local,
        _init(s),
        s.seed,
        state,
        byzantine=byzantine_clients(s.n_seen, s.byzantine, s.seed),
        partition_id=pid,
        num_partitions=parts,
        reproducible_noise=s.dp is not None and s.dp.reproducible,
    )


# ---------------------------------------------------------------------- run folder
def _open(cfg: AppConfig, s: MaxFLSettings, engine: str) -> RunWriter:
    if s.dp is not None and s.dp.reproducible:
        warn_no_privacy()
    config = {**cfg.to_dict(), "engine": engine, "settings": _jsonable(asdict(s))}
    return RunWriter(cfg.run_folder(), config, resume=cfg.resume)


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_jsonable(v) if isinstance(v, dict) else v) for k, v in d.items()}


def model_digest(weights: list[np.ndarray]) -> str:
    """Return a short sha256 of the model's bytes (equal models, equal digests)."""
    h = hashlib.sha256()
    for w in weights:
        h.update(np.ascontiguousarray(w, dtype=np.float32).tobytes())
    return h.hexdigest()[:16]


def _finish(
    writer: RunWriter,
    s: MaxFLSettings,
    engine: str,
    rows: list[dict[str, Any]],
    weights: list[np.ndarray],
    started: float,
    accountant: GaussianAccountant | None = None,
) -> dict[str, Any]:
    np.savez(writer.folder / "model.npz", *[np.asarray(w) for w in weights])
    final = next((r for r in reversed(rows) if "seen-acc" in r), {})
    pools = [r["pool-size"] for r in rows if "pool-size" in r]
    summary = {
        "algorithm": s.algorithm,
        "dataset": s.dataset,
        "engine": engine,
        "seed": s.seed,
        "rounds": s.rounds,
        "final": {k: v for k, v in final.items() if k.startswith(("seen-", "unseen-"))},
        "final-pool-size": pools[-1] if pools else None,
        "model-digest": model_digest(weights),
        "bad-replies": int(sum(r.get("bad-replies", 0) for r in rows)),
        "wall-time": time.perf_counter() - started,
        "run-folder": str(writer.folder),
    }
    if accountant is not None:
        summary["privacy"] = accountant.summary()
    writer.write_summary(summary)
    return summary


# ---------------------------------------------------------------------- engines
def server_run(grid: Grid, cfg: AppConfig) -> dict[str, Any]:
    """Run the family's strategy over the grid and write the run folder; return the summary."""
    s = settings(cfg)
    started = time.perf_counter()
    writer = _open(cfg, s, "flower")
    log(INFO, "run folder: %s", writer.folder)
    server, sampler = _server(s)
    strategy = MaxFLCohorts(
        server,
        sampler,
        s.n_clients,
        eval_every=s.eval_every,
        dp=s.dp,
        **cohort_options(cfg, writer),
    )
    initial = ArrayRecord([np.asarray(w) for w in server.weights])
    serve_rounds(strategy, grid, writer, cfg, s.rounds, initial_arrays=initial)
    return _finish(writer, s, "flower", strategy.history, strategy.server.weights, started,
                   strategy.accountant)  # fmt: skip


def make_client(cfg: AppConfig, context: Context) -> NumPyClient:
    """Return the node's LearningClient (its cohort; ρ_k kept in ``context.state``).

    With node_config ``data-path`` (a ``node-<p>.npz`` of ``python -m flower_app.export``)
    the node reads only its own clients' images, checksum verified against the manifest
    next to it, and checks that the run's split keys are the export's.
    """
    s = settings(cfg)
    pid, parts, path = node_partition(context.node_config)
    first, count = cohort_range(s.n_clients, pid, parts)
    fed = None
    if path is not None and s.dataset in SENT140:
        raise ConfigError(
            f"node_config 'data-path' (node-local image files) is for image datasets; "
            f"{s.dataset!r} holds float tweet features: run it without data-path"
        )
    if path is not None:
        fed = load_node_images(path, source_of(cfg, MAXFL_SOURCE_KEYS))
    return _client(s, first, count, RecordState(context.state), pid, parts, fed)


def summary_line(summary: dict[str, Any]) -> str:
    """Return the one line printed at the end of a run."""
    f = summary["final"]

    def pct(key: str) -> str:
        return f"{100 * f[key]:.2f}" if key in f else "n/a"

    def num(key: str) -> str:
        return f"{f[key]:.3f}" if key in f else "n/a"

    return (
        f"{summary['algorithm']} on {summary['dataset']} ({summary['rounds']} rounds, "
        f"seed={summary['seed']}, {summary['engine']} engine): seen GM-Appeal "
        f"{num('seen-gm-appeal')}, acc {pct('seen-acc')} %; unseen GM-Appeal "
        f"{num('unseen-gm-appeal')}, acc {pct('unseen-acc')} %; results in "
        f"{summary['run-folder']}"
    )
