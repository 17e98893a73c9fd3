"""FedSubAvg's non-linear tasks as torch models with sparse tables: Sent140 (LSTM), Amazon (DIN).

A :class:`TorchSubmodelTask` binds a federated dataset to a model whose embedding tables are
FedSubAvg's sparse submodels (:mod:`flower_app.algorithms.fedsubavg.named` maps such a model
onto the flat vector the server steps act on). It says, for client c (0..N−1):

* which rows of each sparse table its training data touches (:meth:`client_rows`: its
  feature set S(c), what it declares in the counting query);
* its training size n_c (:meth:`n_train`);
* the loss of the model on a batch of its training samples (:meth:`batch_loss`, samples
  addressed by their global training index, so CentralSGD's pooled batches use it too);

and evaluates a full model centrally (:meth:`evaluate`). Both engines
(:mod:`flower_app.algorithms.fedsubavg.torch_engine`) use exactly these methods.

Tasks
=====
:class:`Sent140Task`
    :class:`~flower_app.models.lstm.SentimentLSTM` (embedding 25, two LSTM layers of 100,
    2 classes, cross-entropy); sparse table ``embedding.weight`` (token rows). Evaluation:
    train loss on a fixed sample of up to 10,000 training tweets (as the paper's MovieLens
    protocol; the paper's Figure 3(b) plots train loss), test loss and accuracy. The initial
    embedding is PyTorch's N(0, 1) unless ``fsa-embedding-init`` asks for pre-trained rows
    (:func:`sent140_embedding_init`: GloVe's 25-D Twitter vectors, or on the stand-in its
    planted sentiment weights); the paper does not say how its embedding starts.
:class:`AmazonTask`
    :class:`~flower_app.models.din.DIN` (embedding 18, attention, BN → 200 → 80 → 2 with
    Dice); sparse tables ``user_emb.weight`` and ``item_emb.weight`` (a client's own user
    row, its target items and its history items). Evaluation: test AUC (the paper's
    Figure 3(c) metric), test loss, train loss on a fixed sample.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np
import torch
from scipy.stats import rankdata
from torch import nn
from torch.nn import functional

from flower_app.datasets.amazon import AmazonCTR
from flower_app.datasets.sent140 import GLOVE_25D_FILE, Sent140
from flower_app.models.din import DIN
from flower_app.models.lstm import SentimentLSTM
from flower_app.registry import FEDSUBAVG_TORCH_DATASETS

__all__ = [
    "METRIC_KEYS",
    "TORCH_DATASETS",
    "AmazonTask",
    "Sent140Task",
    "TorchSubmodelTask",
    "auc",
    "load_torch_task",
    "sent140_embedding_init",
]

#: how the Sent140 LSTM's embedding may start (``fsa-embedding-init``)
EMBEDDING_INITS = ("random", "glove", "planted")

#: what :meth:`TorchSubmodelTask.evaluate` returns (Sent140: accuracy; Amazon: AUC)
METRIC_KEYS = ("train-loss", "test-loss", "test-accuracy", "test-auc")

#: samples evaluated per forward pass
EVAL_CHUNK = 2048


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Return the ROC AUC of ``scores`` for binary ``labels`` (ties half); NaN if one class."""
    labels = np.asarray(labels).astype(bool)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    ranks = rankdata(np.asarray(scores, dtype=np.float64))
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


class TorchSubmodelTask(ABC):
    """A federated task on a torch model with sparse embedding tables (see the module doc).

    Parameters
    ----------
    data : Sent140 or AmazonCTR
        The federated dataset: its ``name``, ``n_clients``, ``train_ptr`` and ``stats()``
        are the task's.
    sparse_keys : tuple of str
        The model's sparse tables (state_dict keys).
    eval_samples : int, optional
        Training samples in the fixed train-loss sample (10,000).
    eval_seed : int, optional
        Seed of that sample.
    """

    def __init__(
        self, data: Sent140 | AmazonCTR, sparse_keys: tuple[str, ...],
        eval_samples: int = 10_000, eval_seed: int = 0,
    ) -> None:  # fmt: skip
        self.data = data
        self.name, self.sparse_keys = data.name, tuple(sparse_keys)
        self.eval_samples, self.eval_seed = int(eval_samples), int(eval_seed)
        self._eval_idx: np.ndarray | None = None

    @property
    def n_clients(self) -> int:
        """Clients N."""
        return self.data.n_clients

    @property
    def train_ptr(self) -> np.ndarray:
        """int64 (N+1,) offsets of each client's training samples (global indices)."""
        return self.data.train_ptr

    @abstractmethod
    def make_model(self) -> nn.Module:
        """Return a freshly initialised model (seed torch's generator first)."""

    @abstractmethod
    def client_rows(self, client: int) -> dict[str, np.ndarray]:
        """Return the sorted int64 rows of each sparse table client ``client`` touches."""

    @abstractmethod
    def batch_loss(self, model: nn.Module, idx: np.ndarray) -> torch.Tensor:
        """Return the mean loss of ``model`` on training samples ``idx`` (global indices)."""

    @abstractmethod
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Return the model's centrally computed metrics (``train-loss`` first)."""

    def stats(self) -> dict[str, float | int]:
        """Return the dataset's Table 1 numbers."""
        return self.data.stats()

    def n_train(self, client: int) -> int:
        """Return client ``client``'s training samples n_c."""
        return int(self.train_ptr[client + 1] - self.train_ptr[client])

    @property
    def n_train_total(self) -> int:
        """All training samples."""
        return int(self.train_ptr[-1])

    def eval_idx(self) -> np.ndarray:
        """Return the fixed sample of training indices the train loss is measured on."""
        if self._eval_idx is None:
            n = self.n_train_total
            rng = np.random.default_rng([int(self.eval_seed), 10_000])
            take = min(int(self.eval_samples), n)
            self._eval_idx = np.sort(rng.choice(n, size=take, replace=False)).astype(np.int64)
        return self._eval_idx


def _chunks(n: int) -> list[slice]:
    return [slice(i, min(i + EVAL_CHUNK, n)) for i in range(0, n, EVAL_CHUNK)]


class Sent140Task(TorchSubmodelTask):
    """Sent140 sentiment classification with the paper's two-layer LSTM.

    Parameters
    ----------
    data : Sent140
        The federated dataset (:func:`~flower_app.datasets.sent140.load_sent140` or the
        stand-in :func:`~flower_app.datasets.sent140.synthetic_sent140`).
    eval_samples, eval_seed : int, optional
        As in :class:`TorchSubmodelTask`.
    embedding_init : numpy.ndarray, optional
        float32 (V+1, 25) values written over the freshly initialised embedding wherever
        they are not NaN (:func:`sent140_embedding_init`); default: PyTorch's rows.
    """

    def __init__(
        self, data: Sent140, eval_samples: int = 10_000, eval_seed: int = 0,
        embedding_init: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        super().__init__(data, (SentimentLSTM.SPARSE_KEY,), eval_samples, eval_seed)
        self.data: Sent140 = data
        self._init: tuple[torch.Tensor, torch.Tensor] | None = None
        if embedding_init is not None:
            table = torch.as_tensor(np.asarray(embedding_init, dtype=np.float32))
            if table.shape != (len(data.vocab) + 1, SentimentLSTM.EMBEDDING_DIM):
                raise ValueError(
                    f"embedding_init has shape {tuple(table.shape)}; the LSTM's embedding is "
                    f"({len(data.vocab) + 1}, {SentimentLSTM.EMBEDDING_DIM})"
                )
            given = ~torch.isnan(table)
            self._init = (given, table[given])

    def make_model(self) -> nn.Module:
        """Return a fresh SentimentLSTM over the task's vocabulary (pre-trained rows written)."""
        model = SentimentLSTM(len(self.data.vocab))
        if self._init is not None:
            given, values = self._init
            with torch.no_grad():
                model.embedding.weight[given] = values
        return model

    def client_rows(self, client: int) -> dict[str, np.ndarray]:
        """Return the client's token rows."""
        return {self.sparse_keys[0]: self.data.client_tokens(client).astype(np.int64)}

    def batch_loss(self, model: nn.Module, idx: np.ndarray) -> torch.Tensor:
        """Cross-entropy of the model on training tweets ``idx``."""
        x = torch.from_numpy(self.data.train_x[idx].astype(np.int64))
        y = torch.from_numpy(self.data.train_y[idx])
        return functional.cross_entropy(model(x), y)

    def _predict(self, model: nn.Module, x: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            parts = [model(torch.from_numpy(x[s].astype(np.int64))) for s in _chunks(len(x))]
        return torch.cat(parts) if parts else torch.zeros(0, 2)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Train loss (fixed sample), test loss and test accuracy."""
        model.eval()
        ev = self.eval_idx()
        train_logits = self._predict(model, self.data.train_x[ev])
        test_logits = self._predict(model, self.data.test_x)
        test_y = torch.from_numpy(self.data.test_y)
        model.train()
        return {
            "train-loss": float(
                functional.cross_entropy(train_logits, torch.from_numpy(self.data.train_y[ev]))
            ),
            "test-loss": float(functional.cross_entropy(test_logits, test_y)),
            "test-accuracy": float((test_logits.argmax(1) == test_y).double().mean()),
        }



class AmazonTask(TorchSubmodelTask):
    """Amazon CTR prediction with the paper's DIN.

    Parameters
    ----------
    data : AmazonCTR
        The federated dataset (:func:`~flower_app.datasets.amazon.build_amazon` or the stand-in
        :func:`~flower_app.datasets.amazon.synthetic_amazon`).
    eval_samples, eval_seed : int, optional
        As in :class:`TorchSubmodelTask`.
    """

    def __init__(self, data: AmazonCTR, eval_samples: int = 10_000, eval_seed: int = 0) -> None:
        super().__init__(data, DIN.SPARSE_KEYS, eval_samples, eval_seed)
        self.data: AmazonCTR = data

    def make_model(self) -> nn.Module:
        """Return a fresh DIN over the task's users and items."""
        return DIN(len(self.data.users), len(self.data.items))

    def client_rows(self, client: int) -> dict[str, np.ndarray]:
        """Return the client's user row and its target and history item rows."""
        s = slice(int(self.train_ptr[client]), int(self.train_ptr[client + 1]))
        d = self.data
        return DIN.submodel_rows(d.train_uid[s], d.train_mid[s], d.train_hist[s])

    def _logits(self, model: nn.Module, uid: np.ndarray, mid: np.ndarray, hist: np.ndarray):
        return model(torch.from_numpy(uid), torch.from_numpy(mid), torch.from_numpy(hist))

    def batch_loss(self, model: nn.Module, idx: np.ndarray) -> torch.Tensor:
        """Cross-entropy of the model on training rows ``idx``."""
        d = self.data
        logits = self._logits(model, d.train_uid[idx], d.train_mid[idx], d.train_hist[idx])
        return functional.cross_entropy(logits, torch.from_numpy(d.train_clk[idx]))

    def _predict(self, model: nn.Module, rows: np.ndarray, split: str) -> torch.Tensor:
        d = self.data
        uid, mid, hist = (getattr(d, f"{split}_{k}") for k in ("uid", "mid", "hist"))
        with torch.no_grad():
            parts = [self._logits(model, uid[rows[s]], mid[rows[s]], hist[rows[s]])
                     for s in _chunks(len(rows))]  # fmt: skip
        return torch.cat(parts) if parts else torch.zeros(0, 2)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Train loss (fixed sample), test loss and test AUC."""
        model.eval()
        d = self.data
        ev = self.eval_idx()
        train_logits = self._predict(model, ev, "train")
        test_logits = self._predict(model, np.arange(d.test_clk.size), "test")
        model.train()
        test_y = torch.from_numpy(d.test_clk)
        score = torch.softmax(test_logits, dim=1)[:, 1].numpy()
        train_y = torch.from_numpy(d.train_clk[ev])
        return {
            "train-loss": float(functional.cross_entropy(train_logits, train_y)),
            "test-loss": float(functional.cross_entropy(test_logits, test_y)),
            "test-auc": auc(d.test_clk, score),
        }



#: datasets of the torch tasks (the app's ``dataset`` key)
TORCH_DATASETS = FEDSUBAVG_TORCH_DATASETS


def sent140_embedding_init(data: Sent140, how: str, data_dir: str = "") -> np.ndarray | None:
    """Return the pre-trained rows ``fsa-embedding-init`` asks for (None for ``random``).

    Parameters
    ----------
    data : Sent140
        The task's data (its vocabulary; the stand-in's planted weights).
    how : str
        ``random`` (None: PyTorch's N(0, 1) rows); ``glove``: each token's vector in
        :data:`GLOVE_25D_FILE` (optionally ``.gz``) in ``data_dir/sent140/`` or ``data_dir/``,
        NaN (kept random) for tokens it lacks; ``planted`` (stand-in only): column 0 of each
        token's row is its weight in the planted sentiment model, the rest NaN.
    data_dir : str, optional
        Folder holding the GloVe file (``glove`` only).

    Returns
    -------
    numpy.ndarray or None
        float32 (V+1, 25); row 0 (padding) is NaN, so it stays zero.

    Raises
    ------
    ValueError
        For another ``how``, ``planted`` on real data.
    DatasetNotFoundError
        For ``glove`` without the GloVe file (the expected paths named).
    """
    from flower_app.datasets.paths import DatasetNotFoundError
    from flower_app.datasets.sent140_features import find_glove, read_glove

    if how == "random":
        return None
    dim = SentimentLSTM.EMBEDDING_DIM
    table = np.full((len(data.vocab) + 1, dim), np.nan, dtype=np.float32)
    if how == "planted":
        if data.planted is None:
            raise ValueError(
                f"fsa-embedding-init = 'planted' needs a stand-in's planted model; {data.name} "
                "has none (use 'glove' or 'random')"
            )
        table[1:, 0] = data.planted[1:]
        return table
    if how != "glove":
        raise ValueError(f"fsa-embedding-init {how!r}: choose one of {EMBEDDING_INITS}")
    root = Path(data_dir).expanduser().resolve()
    path = find_glove(root, GLOVE_25D_FILE)
    if path is None:
        raise DatasetNotFoundError(
            "GloVe 25-D Twitter vectors (fsa-embedding-init = 'glove')",
            [root / "sent140" / GLOVE_25D_FILE, root / GLOVE_25D_FILE],
            "https://nlp.stanford.edu/projects/glove/: glove.twitter.27B.zip, unzip "
            f"{GLOVE_25D_FILE}", data_dir=root,
        )  # fmt: skip
    vectors = read_glove(path, dim, words=data.vocab)
    for k, word in enumerate(data.vocab, start=1):
        if word in vectors:
            table[k] = vectors[word]
    return table


def load_torch_task(
    dataset: str, data_dir: str = "", data_seed: int = 0, num_users: int = 0,
    num_elements: int = 0, embedding_init: str = "random",
) -> TorchSubmodelTask:  # fmt: skip
    """Return the task of ``dataset`` (one of :data:`TORCH_DATASETS`).

    Parameters
    ----------
    dataset : str
        ``sent140`` reads ``data_dir/sent140/`` (Sentiment140's
        ``training.1600000.processed.noemoticon.csv[.gz]`` or LEAF's JSON files:
        :func:`~flower_app.datasets.sent140.find_sent140_files`); ``amazon`` reads
        ``data_dir/amazon/`` (``rating_only.csv``, ``ratings_Electronics.csv`` or
        ``reviews_Electronics_5.json``, + ``meta_Electronics.json`` if present:
        :func:`~flower_app.datasets.amazon.find_amazon_files`);
        the ``synthetic-*`` stand-ins need no files.
    data_dir : str, optional
        Folder holding ``sent140/`` or ``amazon/``.
    data_seed : int, optional
        Train/test split (Sent140), the stand-ins' seed, the train-loss sample.
    num_users, num_elements : int, optional
        Stand-ins only: clients N and vocabulary / items (0 = the paper's sizes: 1,473 clients
        and 30,000 tokens; 1,870 clients and 33,136 items). A smaller N scales the target
        heat dispersion with it (it cannot exceed N).
    embedding_init : str, optional
        Sent140 only: how the LSTM's embedding starts (:func:`sent140_embedding_init`).

    Raises
    ------
    ValueError
        For another dataset name, or ``embedding_init`` other than ``random`` on Amazon;
        FileNotFoundError when the files are missing.
    """
    if embedding_init != "random" and "sent140" not in dataset:
        raise ValueError(
            f"fsa-embedding-init = {embedding_init!r} is for the Sent140 LSTM; {dataset} "
            "starts from its model's own initialisation (use 'random')"
        )
    from flower_app.datasets import amazon, sent140

    if dataset == "synthetic-sent140":
        n = num_users or sent140.PAPER_TABLE1["clients"]
        data = sent140.synthetic_sent140(
            seed=data_seed, n_clients=n, n_samples=round(n * 79050 / 1473),
            vocab_size=num_elements or 30_000,
            target_dispersion=max(2.0, 1451 * n / 1473),
        )  # fmt: skip
        init = sent140_embedding_init(data, embedding_init, data_dir)
        return Sent140Task(data, eval_seed=data_seed, embedding_init=init)
    if dataset == "synthetic-amazon":
        n = num_users or amazon.PAPER_TABLE1["clients"]
        data = amazon.synthetic_amazon(
            seed=data_seed, n_clients=n, n_samples=round(n * 123147 / 1870),
            n_items=num_elements or 33_136, target_dispersion=max(2.0, 232 * n / 1870),
        )  # fmt: skip
        return AmazonTask(data, eval_seed=data_seed)
    root = Path(data_dir).expanduser()
    if dataset == "sent140":
        data = sent140.load_sent140(root / "sent140", split_seed=data_seed)
        init = sent140_embedding_init(data, embedding_init, data_dir)
        return Sent140Task(data, eval_seed=data_seed, embedding_init=init)
    if dataset == "amazon":
        files = amazon.find_amazon_files(root / "amazon")
        categories = amazon.read_metadata(files.meta) if files.meta else None
        return AmazonTask(amazon.build_amazon(files.read(), categories=categories),
                          eval_seed=data_seed)  # fmt: skip
    raise ValueError(f"dataset {dataset!r} is not a torch task: choose one of {TORCH_DATASETS}")
