"""Sent140 as the MaxFL paper uses it: one 200-D average-pooled GloVe vector per tweet.

MaxFL's Sent140 (Cho et al., TMLR 2024, Appendix D.1): clients are Twitter accounts with at
least 50 tweets (308 seen and 619 unseen), 2 classes, and the model is an MLP on "the 200-D
average-pooled pre-trained GloVe embedding" of the tweet. This module makes those feature rows;
:mod:`flower_app.runners.maxfl` splits them into clients (60/40 per client, label flips) with
:func:`~flower_app.datasets.federated.federation_from_clients`.

Pipeline (our choices where the paper is silent):

* Tweets are read and tokenised by :mod:`flower_app.datasets.sent140`
  (:func:`~flower_app.datasets.sent140.build_sent140`: lower case, URLs → ``<url>``,
  @mentions → ``<user>``, which are also GloVe-Twitter's tokens for them). We build the
  task with ``min_samples=50``, ``test_fraction=0`` (every tweet kept, so every token has an
  id; MaxFL re-splits each client 60/40) and up to :data:`MAX_TOKENS` tokens per tweet.
  :func:`tweet_features` therefore takes a :class:`~flower_app.datasets.sent140.Sent140` (the
  token ids ``build_sent140`` makes) and an embedding table indexed by token id.
* A tweet's feature is the mean of the vectors of its tokens that have one (tokens missing
  from GloVe are skipped); a tweet with none gets the zero vector.
* Real data: Sentiment140's CSV or LEAF's JSON files in ``data-dir/sent140/`` (as
  :mod:`flower_app.datasets.sent140` reads them) and the GloVe file :data:`GLOVE_FILE`
  (optionally gzipped) in ``data-dir/sent140/`` or ``data-dir/``; only the vectors of the
  tweets' tokens are kept in memory.
* Stand-in ``synthetic-sent140`` (:func:`synthetic_sent140_features`): the accounts of
  :func:`~flower_app.datasets.sent140.synthetic_sent140` with at least 50 tweets, each token
  embedded by a seeded random N(0, 1/200) vector in place of GloVe. A random linear embedding
  keeps the planted linear sentiment model (the mean of the tokens' weights is a linear
  function of the pooled vector, up to the embedding's ~200-D projection), so the task stays
  learnable; its accuracies are a stand-in's, not the paper's Sent140 numbers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_app.datasets.images import LabelledImages
from flower_app.datasets.paths import DataFormatError, DatasetNotFoundError, open_text
from flower_app.datasets.sent140 import (
    CSV_NAME,
    PAPER_TABLE1,
    Sent140,
    account_tweets,
    build_sent140,
    find_sent140_files,
    synthetic_sent140,
)

__all__ = [
    "DIM",
    "GLOVE_FILE",
    "MAX_TOKENS",
    "MIN_TWEETS",
    "SENT140_VECTORS",
    "TweetFeatures",
    "find_glove",
    "iter_glove",
    "load_sent140_features",
    "read_glove",
    "synthetic_sent140_features",
    "tweet_features",
]

#: GloVe file the real ``sent140`` dataset needs (Twitter GloVe, 200-D)
GLOVE_FILE = "glove.twitter.27B.200d.txt"
#: embedding size (the paper's 200-D)
DIM = 200
#: least tweets of an account to be a client ("all clients have at least 50 samples")
MIN_TWEETS = 50
#: tokens kept per tweet (a tweet has at most 140 characters)
MAX_TOKENS = 140
#: the stand-in's token vectors (``maxfl-sent140-vectors``; see synthetic_sent140_features)
SENT140_VECTORS = ("random", "planted")
_CSV_NAME = CSV_NAME
_SOURCE = (
    "Sentiment140 (http://help.sentiment140.com/for-students: training.1600000.processed."
    "noemoticon.csv) or LEAF's Sent140 JSON in sent140/, and GloVe "
    "(https://nlp.stanford.edu/projects/glove/: glove.twitter.27B.zip, unzip "
    f"{GLOVE_FILE})"
)


@dataclass(frozen=True, eq=False)
class TweetFeatures:
    """Average-pooled tweet embeddings with their labels and accounts.

    Attributes
    ----------
    features : numpy.ndarray
        float32 (n, dim): one pooled vector per tweet.
    labels : numpy.ndarray
        int64 (n,): 1 positive, 0 negative.
    clients : numpy.ndarray
        int64 (n,): the tweet's account, 0..n_clients−1 (index into ``users``).
    users : tuple of str
        The accounts kept (each with at least ``MIN_TWEETS`` tweets).
    """

    features: np.ndarray
    labels: np.ndarray
    clients: np.ndarray
    users: tuple[str, ...]

    @property
    def n_clients(self) -> int:
        """Accounts kept."""
        return len(self.users)

    def as_labelled(self, name: str, data_seed: int) -> tuple[LabelledImages, np.ndarray]:
        """Return the rows as a 2-class dataset and a client id per row, accounts shuffled.

        The accounts are numbered in an order drawn from ``data_seed``, so the first
        ``n_seen`` client ids (the seen clients) are a random subset of the accounts.

        Parameters
        ----------
        name : str
            Dataset name.
        data_seed : int
            Seed of the account order.

        Returns
        -------
        tuple
            :class:`LabelledImages` with float32 feature rows, and int64 client ids.
        """
        order = np.random.default_rng([int(data_seed), 140, 50]).permutation(self.n_clients)
        return LabelledImages(name, self.features, self.labels, 2), order[self.clients]


# ---------------------------------------------------------------------- GloVe
def iter_glove(path: str | Path, dim: int) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (word, vector) of a GloVe text file, one line at a time.

    The official format: ``word v1 ... v_dim`` per line, separated by single spaces, utf-8;
    gzip-compressed files are read as such. Blank lines are skipped.

    Parameters
    ----------
    path : str or pathlib.Path
        The file.
    dim : int
        Values expected after each word.

    Yields
    ------
    tuple
        The word and its float32 (dim,) vector.

    Raises
    ------
    DataFormatError
        Naming the file and the line, for a line with another number of values or a value
        that is not a number.
    """
    path = Path(path)
    with open_text(path, "utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            fields = line.rstrip("\r\n").rstrip(" ").split(" ")
            if fields == [""]:
                continue
            if len(fields) - 1 != dim:
                raise DataFormatError(
                    path, f"{len(fields) - 1} values after the word; expected {dim} "
                    f"(GloVe text format: word v1 ... v{dim})", line_number=line_no, line=line,
                )  # fmt: skip
            try:
                vector = np.asarray(fields[1:], dtype=np.float32)
            except ValueError:
                raise DataFormatError(
                    path, f"a value is not a number; expected word v1 ... v{dim}",
                    line_number=line_no, line=line,
                ) from None  # fmt: skip
            yield fields[0], vector


def read_glove(
    path: str | Path, dim: int, words: Collection[str] | None = None
) -> dict[str, np.ndarray]:
    """Return the vectors of a GloVe text file (streamed; see :func:`iter_glove`).

    Parameters
    ----------
    path : str or pathlib.Path
        The file (plain or gzip).
    dim : int
        The vectors' size.
    words : collection of str, optional
        Keep only these words (default: all); the rest of the file is never held.

    Returns
    -------
    dict
        word → float32 (dim,) vector (the first line of a repeated word wins).

    Raises
    ------
    DataFormatError
        For a malformed line or a wrong dimension (file and line named).
    """
    keep = None if words is None else set(words)
    out: dict[str, np.ndarray] = {}
    for word, vector in iter_glove(path, dim):
        if (keep is None or word in keep) and word not in out:
            out[word] = vector
    return out


# ---------------------------------------------------------------------- pooling
def tweet_features(
    task: Sent140, table: np.ndarray, known: np.ndarray | None = None
) -> TweetFeatures:
    """Average-pool each tweet's token vectors; keep accounts with :data:`MIN_TWEETS` tweets.

    Parameters
    ----------
    task : Sent140
        Token ids per tweet as :func:`~flower_app.datasets.sent140.build_sent140` makes them;
        each account's training rows then its test rows are used (all its tweets).
    table : numpy.ndarray
        (V+1, dim) vector of each token id (row 0, padding / unknown, is never used).
    known : numpy.ndarray, optional
        bool (V+1,): ids that have a vector (default: every id ≥ 1).

    Returns
    -------
    TweetFeatures
        float32 pooled vectors, labels and account indices (accounts renumbered 0..).

    Raises
    ------
    ValueError
        If the table does not cover the vocabulary or no account has MIN_TWEETS tweets.
    """
    n_ids = len(task.vocab) + 1
    if table.ndim != 2 or table.shape[0] != n_ids:
        raise ValueError(f"embedding table {table.shape}; expected ({n_ids}, dim)")
    has = np.ones(n_ids, dtype=bool) if known is None else np.asarray(known, dtype=bool).copy()
    has[0] = False
    sizes = np.diff(task.train_ptr) + np.diff(task.test_ptr)
    kept = np.flatnonzero(sizes >= MIN_TWEETS)
    if kept.size == 0:
        raise ValueError(f"no account of {task.name} has {MIN_TWEETS} or more tweets")

    def all_rows(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        """Each kept account's training rows, then its test rows."""
        tr, te = task.train_ptr, task.test_ptr
        return np.concatenate(
            [b for c in kept for b in (train[tr[c] : tr[c + 1]], test[te[c] : te[c + 1]])]
        )

    ids = all_rows(task.train_x, task.test_x)
    labels = all_rows(task.train_y, task.test_y).astype(np.int64)
    clients = np.repeat(np.arange(kept.size, dtype=np.int64), sizes[kept])
    features = _pool(ids, np.asarray(table, dtype=np.float32), has)
    return TweetFeatures(features, labels, clients, tuple(task.users[c] for c in kept))


def _pool(ids: np.ndarray, table: np.ndarray, has: np.ndarray, chunk: int = 512) -> np.ndarray:
    """Return the mean vector of each row's tokens that have one (zeros if none)."""
    out = np.zeros((ids.shape[0], table.shape[1]), dtype=np.float32)
    for start in range(0, ids.shape[0], chunk):
        block = ids[start : start + chunk]
        mask = has[block]
        summed = np.einsum("nl,nld->nd", mask.astype(np.float32), table[block])
        counts = mask.sum(axis=1, keepdims=True)
        out[start : start + chunk] = summed / np.maximum(counts, 1)
    return out


# ---------------------------------------------------------------------- real data
def load_sent140_features(data_dir: str | Path, dim: int = DIM) -> TweetFeatures:
    """Read real Sent140 and GloVe from ``data_dir`` and return the pooled features.

    Tweets: ``data_dir/sent140/training.1600000.processed.noemoticon.csv[.gz]`` (read twice:
    counting each account's tweets, then keeping those with ≥ 50), else every LEAF
    ``data_dir/sent140/*.json[.gz]``. Vectors: :data:`GLOVE_FILE` (or ``.gz``) in
    ``data_dir/sent140/`` or ``data_dir/``, keeping only the tweets' tokens.

    Raises
    ------
    DatasetNotFoundError
        Naming the expected tweet and GloVe files when one is missing.
    DataFormatError, ValueError
        For malformed files (file and line named).
    """
    root = Path(data_dir).expanduser().resolve()
    folder = root / "sent140"
    glove = find_glove(root, GLOVE_FILE)
    try:
        files = find_sent140_files(folder)
    except FileNotFoundError:
        files = None
    if glove is None or files is None:
        expected = [folder / _CSV_NAME, folder / "all_data_*.json (LEAF)", root / GLOVE_FILE]
        raise DatasetNotFoundError("Sent140 with GloVe (MaxFL)", expected, _SOURCE, data_dir=root)
    # every LEAF file: LEAF's train/test split is merged (MaxFL splits each client)
    task = build_sent140(account_tweets(files, MIN_TWEETS), min_samples=MIN_TWEETS,
                         test_fraction=0.0, max_len=MAX_TOKENS)  # fmt: skip
    vectors = read_glove(glove, dim, words=task.vocab)
    table = np.zeros((len(task.vocab) + 1, dim), dtype=np.float32)
    known = np.zeros(len(task.vocab) + 1, dtype=bool)
    for k, word in enumerate(task.vocab, start=1):
        if word in vectors:
            table[k], known[k] = vectors[word], True
    return tweet_features(task, table, known)


def find_glove(root: Path, name: str) -> Path | None:
    """Return the GloVe file ``name`` (or ``name.gz``) in ``root/sent140/`` or ``root/``.

    Returns
    -------
    pathlib.Path or None
        The first of those four paths that is a file, None when none is.
    """
    paths = (d / n for d in (root / "sent140", root) for n in (name, f"{name}.gz"))
    return next((p for p in paths if p.is_file()), None)


# ---------------------------------------------------------------------- stand-in
def synthetic_sent140_features(
    data_seed: int = 0, n_clients: int = PAPER_TABLE1["clients"], dim: int = DIM,
    vectors: str = "random",
) -> TweetFeatures:  # fmt: skip
    """Return the stand-in ``synthetic-sent140`` for MaxFL (made from ``data_seed``).

    The accounts of :func:`~flower_app.datasets.sent140.synthetic_sent140` (``n_clients``
    accounts, default its calibrated 1,473, 41 + Poisson tweets each, the paper's mean of 54)
    with at least 50 tweets — about 86 %, so about 1,270 ≥ 927 = 308 + 619 accounts qualify
    — and every token embedded by a seeded random N(0, 1/200) vector (variance 1/dim) in
    place of GloVe (see the module docstring: the planted linear signal is kept; the numbers
    are a stand-in's). The generator's own 80/20 split only decides which rare tokens get an
    id: a token seen only in its test tweets is unknown (id 0) and skipped by the pooling.

    Parameters
    ----------
    data_seed : int, optional
        Seed of the tweets and of the embedding.
    n_clients : int, optional
        Accounts generated (before the ≥ 50 filter).
    dim : int, optional
        Embedding size (default 200).
    vectors : str, optional
        ``random`` (default): the N(0, 1/dim) vectors above. ``planted``: the same vectors
        with coordinate 0 replaced by each token's weight in the stand-in's planted sentiment
        model (:attr:`~flower_app.datasets.sent140.Sent140.planted`), so a tweet's feature 0
        is the mean planted weight of its tokens: the best case of a pre-trained embedding
        whose vectors carry sentiment, as GloVe's do (setting ``maxfl-sent140-vectors``).

    Returns
    -------
    TweetFeatures
        The pooled features.

    Raises
    ------
    ValueError
        For ``vectors`` other than ``random`` or ``planted``.
    """
    if vectors not in SENT140_VECTORS:
        raise ValueError(f"vectors {vectors!r}: choose one of {SENT140_VECTORS}")
    n = int(n_clients)
    paper = PAPER_TABLE1  # the calibration, scaled to n accounts
    samples = round(n * paper["samples"] / paper["clients"])
    dispersion = max(2.0, paper["feature-heat-dispersion"] * n / paper["clients"])
    task = synthetic_sent140(seed=data_seed, n_clients=n, n_samples=samples,
                             target_dispersion=dispersion)  # fmt: skip
    vocab_size = 1 + max(int(w[1:]) for w in task.vocab)
    rng = np.random.default_rng([int(data_seed), 140, dim])
    embedding = rng.normal(0.0, np.sqrt(1.0 / dim), size=(vocab_size, dim)).astype(np.float32)
    table = np.zeros((len(task.vocab) + 1, dim), dtype=np.float32)
    table[1:] = embedding[[int(w[1:]) for w in task.vocab]]
    if vectors == "planted":
        table[1:, 0] = task.planted[1:]
    return tweet_features(task, table)
