"""Sentiment140 as FedSubAvg's sentiment task reads it (Section 5, Table 1: 1,473 clients).

Official formats, read streaming (one line or one user at a time), gzip or not:

``training.1600000.processed.noemoticon.csv``
    Sentiment140's file: latin-1, no header, six quoted fields per line: polarity (0
    negative, 4 positive; 2 neutral appears only in the test file and is refused), tweet
    id, date, query, user, text.
LEAF's Sent140 JSON (``all_data_*.json``, several files)
    ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[id, date,
    query, user, text], ...], "y": [0 or 1, ...]}}}``: every user listed once in ``users``
    and in ``user_data``, ``num_samples`` one count per user.

Where the files are (:func:`find_sent140_files`, in ``data-dir/sent140/``): LEAF's data
folder as its scripts leave it (``train/*.json`` and ``test/*.json`` after its split:
LEAF's train/test split is kept; else ``all_data/*.json``), LEAF JSON files put directly in
the folder (every ``*.json[.gz]``, all read), or Sentiment140's CSV. Tweets from both the CSV
and LEAF JSON, or from ``all_data/`` and loose JSON files, are refused as ambiguous, and so is
a user with tweets in two files of one group (a second copy of a file would double every
user's tweets; LEAF writes each user into one file of ``all_data/``, ``train/``, ``test/``).

Federated partition (:func:`build_sent140`), as the paper builds it: one client per Twitter
account with **more than 40** samples; a random 80/20 split of all samples into train and
test (``split_seed``), or LEAF's own split when its ``train/`` and ``test/`` files are
read; the vocabulary is every token of the training samples, id 0 is the padding / unknown
token. Tokens
(:func:`tokenize`): lower-cased text, URLs → ``<url>``, @mentions → ``<user>``, then runs of
letters, digits and apostrophes, and each other non-space character on its own (so ``"!"`` and
``":("`` count). A tweet becomes its first ``max_len`` (default 25, LEAF's) token ids. A
client's feature set (its submodel's embedding rows) is the tokens of its training tweets;
the feature heat n_m is the number of clients whose training tweets contain token m.

Every error names the file and the line (CSV) or the user (JSON) and what was expected.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from flower_app.datasets.paths import DataFormatError, json_object, open_text
from flower_app.datasets.synthetic import zipf_for_heat

__all__ = [
    "CSV_NAME",
    "GLOVE_25D_FILE",
    "PAPER_TABLE1",
    "Sent140",
    "Tweet",
    "account_tweets",
    "build_sent140",
    "find_sent140_files",
    "load_sent140",
    "synthetic_sent140",
    "read_leaf_json",
    "read_sentiment140_csv",
    "tokenize",
]

#: FedSubAvg's Table 1 row for Sent140
PAPER_TABLE1 = {"clients": 1473, "samples": 79050, "samples-per-client": 54,
                "feature-heat-dispersion": 1451}  # fmt: skip

_URL = re.compile(r"https?://\S+|www\.\S+")
_MENTION = re.compile(r"@\w+")
_TOKEN = re.compile(r"<url>|<user>|[a-z0-9']+|[^\sa-z0-9']")
#: least tweets of an account that becomes a client ("more than 40")
MIN_SAMPLES = 41
#: share of the stand-in's tokens that carry a sentiment weight (:func:`synthetic_sent140`)
WEIGHTED_SHARE = 0.1
#: GloVe file of ``fsa-embedding-init = "glove"`` (Twitter GloVe, 25-D: the paper's size)
GLOVE_25D_FILE = "glove.twitter.27B.25d.txt"
#: Sentiment140's file name (optionally ``.gz``)
CSV_NAME = "training.1600000.processed.noemoticon.csv"
_CSV_FORMAT = (
    'Sentiment140 CSV lines: "polarity","id","date","query","user","text" with polarity 0 or '
    "4 (latin-1, no header)"
)


_LEAF_FORMAT = (
    'LEAF JSON {"users": [...], "num_samples": [...], "user_data": {user: '
    '{"x": [[id, date, query, user, text], ...], "y": [0 or 1, ...]}}}'
)


@dataclass(frozen=True)
class Tweet:
    """One sample: its author (the client), its label (1 positive) and its text.

    ``test`` is LEAF's split when the sample comes from its ``train/`` (False) or ``test/``
    (True) files, None otherwise (the task then splits at random).
    """

    user: str
    label: int
    text: str
    test: bool | None = None


def tokenize(text: str) -> list[str]:
    """Return the tokens of a tweet (see the module docstring)."""
    text = _MENTION.sub(" <user> ", _URL.sub(" <url> ", text.lower()))
    return _TOKEN.findall(text)


def read_sentiment140_csv(path: str | Path) -> Iterator[Tweet]:
    """Yield the tweets of Sentiment140's CSV, one line at a time.

    Raises
    ------
    ValueError
        Naming the file and the line, for a line with another number of fields or a
        polarity other than 0 or 4.
    """
    path = Path(path)
    with open_text(path, "latin-1") as fh:
        reader = csv.reader(fh)

        def fail(what: object) -> DataFormatError:
            return DataFormatError(path, f"{what}; expected {_CSV_FORMAT}",
                                   line_number=reader.line_num)  # fmt: skip

        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                raise fail(err) from None
            if not row:
                continue  # an empty line holds no record
            if len(row) != 6:
                raise fail(f"{len(row)} fields")
            polarity = row[0].strip()
            if polarity not in ("0", "4"):
                raise fail(f"polarity {polarity!r}")
            yield Tweet(row[4], 1 if polarity == "4" else 0, row[5])


def read_leaf_json(path: str | Path, test: bool | None = None) -> Iterator[Tweet]:
    """Yield the tweets of one LEAF Sent140 JSON file, user by user.

    Parameters
    ----------
    path : str or pathlib.Path
        The file (``.json`` or ``.json.gz``).
    test : bool or None, optional
        LEAF's split of the file (``train/``: False, ``test/``: True), given to each tweet.

    Raises
    ------
    ValueError
        Naming the file (and the user) for missing keys, a user listed twice or missing
        from ``users`` or ``user_data``, ``num_samples`` of another length or count than
        the samples, a sample other than 5 strings, or a label other than 0/1.
    """
    path = Path(path)
    try:
        with open_text(path, "utf-8") as fh:
            data = json.load(fh, object_pairs_hook=json_object)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}, line {err.lineno}: not JSON ({err.msg}); expected "
                         f"{_LEAF_FORMAT}") from None  # fmt: skip
    except DataFormatError as err:  # not UTF-8, or a damaged .gz (the file is named)
        raise ValueError(f"{err}; expected {_LEAF_FORMAT}") from None
    except ValueError as err:  # a key twice (json_object)
        raise ValueError(f"{path}: {err}; expected {_LEAF_FORMAT}") from None

    def fail(what: str) -> ValueError:
        return ValueError(f"{path}: {what}; expected {_LEAF_FORMAT}")

    if not isinstance(data, dict) or not {"users", "user_data"} <= set(data):
        raise fail("missing 'users' or 'user_data'")
    users, user_data = data["users"], data["user_data"]
    if not isinstance(users, list) or not isinstance(user_data, dict):
        raise fail("'users' is not a list or 'user_data' not an object")
    if len(set(map(str, users))) != len(users):
        twice = next(u for u in users if users.count(u) > 1)
        raise fail(f"user {twice!r} is listed twice in 'users'")
    extra = sorted(set(user_data) - set(map(str, users)))
    if extra:
        raise fail(f"user {extra[0]!r} is in 'user_data' but not in 'users'")
    counts = data.get("num_samples")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
        got = len(counts) if isinstance(counts, list) else type(counts).__name__
        raise fail(f"'num_samples' has {got} entries for {len(users)} users")
    for k, user in enumerate(users):
        block = user_data.get(user)
        if not isinstance(block, dict) or "x" not in block or "y" not in block:
            raise fail(f"user {user!r} has no x/y in user_data")
        xs, ys = block["x"], block["y"]
        count = None if counts is None else counts[k]
        if (
            not isinstance(xs, list)
            or not isinstance(ys, list)
            or len(xs) != len(ys)
            or (count is not None and (type(count) is not int or count != len(ys)))
        ):
            raise fail(
                f"user {user!r} has {len(xs)} x, {len(ys)} y, num_samples {count!r}"
            )
        for x, y in zip(xs, ys, strict=True):
            if (
                type(y) is not int
                or y not in (0, 1)
                or not isinstance(x, list)
                or len(x) != 5
                or not all(isinstance(field, str) for field in x)
            ):
                raise fail(f"user {user!r}: sample {x!r} -> {y!r}")
            yield Tweet(str(user), y, x[4], test)


@dataclass(frozen=True)
class Sent140Files:
    """Where Sent140's tweets are: one CSV, or LEAF JSON files (with LEAF's split or not).

    Attributes
    ----------
    csv : pathlib.Path or None
        Sentiment140's CSV.
    json : tuple of pathlib.Path
        LEAF files without a split (``all_data/`` or loose in the folder).
    train, test : tuple of pathlib.Path
        LEAF's ``train/`` and ``test/`` files (its split).
    """

    csv: Path | None = None
    json: tuple[Path, ...] = ()
    train: tuple[Path, ...] = ()
    test: tuple[Path, ...] = ()

    @property
    def paths(self) -> tuple[Path, ...]:
        """Every file that will be read."""
        return (*([self.csv] if self.csv else []), *self.json, *self.train, *self.test)

    def tweets(self) -> Iterator[Tweet]:
        """Yield the tweets of every LEAF file (the CSV is read by its own reader).

        Raises
        ------
        ValueError
            Naming both files, when a user has tweets in two files of one group (``all_data``
            or loose files, ``train/``, ``test/``): a second copy of a file would double
            every user's tweets, and LEAF writes each user into one file of each group.
        """
        for group, test in ((self.json, None), (self.train, False), (self.test, True)):
            seen: dict[str, Path] = {}
            for path in group:
                mine: set[str] = set()
                for tweet in read_leaf_json(path, test=test):
                    if tweet.user not in mine:
                        other = seen.setdefault(tweet.user, path)
                        if other != path:
                            raise ValueError(
                                f"{other} and {path}: user {tweet.user!r} has tweets in both "
                                "(a copy of a file, or one user split over two); LEAF "
                                "writes every user into one file: keep one copy"
                            )
                        mine.add(tweet.user)
                    yield tweet


def _jsons(folder: Path) -> tuple[Path, ...]:
    return tuple(sorted([*folder.glob("*.json"), *folder.glob("*.json.gz")]))


def find_sent140_files(folder: str | Path) -> Sent140Files:
    """Return the tweet files of ``folder`` (``data-dir/sent140``; see the module docstring).

    Raises
    ------
    FileNotFoundError
        Naming the files looked for, when there are none.
    ValueError
        When the folder holds two sources (the CSV and LEAF JSON, the CSV and its ``.gz``,
        or LEAF's ``all_data/`` and loose JSON files) or only one half of LEAF's split.
    """
    folder = Path(folder)
    csv_files = [folder / CSV_NAME, folder / f"{CSV_NAME}.gz"]
    present = [p for p in csv_files if p.is_file()]
    if len(present) > 1:
        raise ValueError(f"{folder}: both {present[0].name} and {present[1].name}; keep one "
                         "copy of Sentiment140's CSV")  # fmt: skip
    csv_file = present[0] if present else None
    loose, all_data = _jsons(folder), _jsons(folder / "all_data")
    train, test = _jsons(folder / "train"), _jsons(folder / "test")
    if bool(train) != bool(test):
        have, lack = ("train", "test") if train else ("test", "train")
        raise ValueError(
            f"{folder}: LEAF's {have}/ has JSON files but {lack}/ has none; put both "
            "halves of LEAF's split there, or its all_data/ instead"
        )
    if loose and all_data:
        raise ValueError(f"{folder}: LEAF JSON files both in the folder and in all_data/; "
                         "keep one copy")  # fmt: skip
    leaf = train or loose or all_data
    if csv_file is not None and leaf:
        raise ValueError(f"{folder}: both Sentiment140's CSV ({csv_file.name}) and LEAF JSON "
                         f"files ({leaf[0].name}, ...); keep one source")  # fmt: skip
    if train:
        return Sent140Files(train=train, test=test)
    if leaf:
        return Sent140Files(json=leaf)
    if csv_file is not None:
        return Sent140Files(csv=csv_file)
    raise FileNotFoundError(
        f"sent140: none of {csv_files[0]}[.gz], {folder}/all_data/*.json (LEAF), "
        f"{folder}/train/*.json + test/*.json (LEAF's split), {folder}/*.json"
    )


@dataclass(frozen=True, eq=False)
class Sent140:
    """The federated sentiment task: token-id sequences per client, a vocabulary, heat.

    Clients are numbered 0..N−1 in sorted account order; client i's training tweets are
    rows ``train_ptr[i]:train_ptr[i+1]`` of ``train_x`` (test likewise), padded with 0.

    Attributes
    ----------
    name : str
        ``sent140`` or ``synthetic-sent140``.
    users : tuple of str
        The accounts.
    vocab : tuple of str
        Token of every id ≥ 1 (id 0: padding and unknown tokens).
    train_x, test_x : numpy.ndarray
        int32 (n, max_len) token ids.
    train_y, test_y : numpy.ndarray
        int64 labels (1 positive).
    train_ptr, test_ptr : numpy.ndarray
        int64 (N+1,) offsets of each client's samples.
    heat : numpy.ndarray
        int64 (V+1,) clients whose training tweets contain each token (n_m; id 0 excluded:
        0).
    planted : numpy.ndarray or None
        Stand-in only: float64 (V+1,) weight of each token in the planted sentiment model
        (:func:`synthetic_sent140`; id 0: 0), for diagnoses. None for real data.
    """

    name: str
    users: tuple[str, ...]
    vocab: tuple[str, ...]
    train_x: np.ndarray
    train_y: np.ndarray
    train_ptr: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    test_ptr: np.ndarray
    heat: np.ndarray
    planted: np.ndarray | None = None

    @property
    def n_clients(self) -> int:
        """Clients N."""
        return len(self.users)

    def client_tokens(self, client: int) -> np.ndarray:
        """Return the sorted token ids of a client's training tweets (its embedding rows)."""
        rows = self.train_x[self.train_ptr[client] : self.train_ptr[client + 1]]
        ids = np.unique(rows)
        return ids[ids > 0]

    def dispersion(self) -> float:
        """Feature heat dispersion n_max / n_min over the tokens in the vocabulary."""
        n = self.heat[1:]
        n = n[n > 0]
        return float(n.max() / n.min()) if n.size else 0.0

    def stats(self) -> dict[str, float | int]:
        """Return the Table 1 numbers: clients, samples, samples per client, dispersion."""
        samples = int(self.train_y.size + self.test_y.size)
        return {
            "clients": self.n_clients,
            "samples": samples,
            "samples-per-client": samples / max(self.n_clients, 1),
            "vocabulary": len(self.vocab),
            "feature-heat-dispersion": self.dispersion(),
            "positive-share": float(np.mean(np.concatenate([self.train_y, self.test_y]))),
        }


def load_sent140(path: str | Path, split_seed: int = 0) -> Sent140:
    """Read Sentiment140's CSV or LEAF JSON into the task, in bounded memory.

    ``path`` is a folder (``data-dir/sent140``: every file :func:`find_sent140_files`
    finds), Sentiment140's CSV, or one LEAF JSON file. The CSV is read twice: once to count
    each account's tweets, then keeping only the tweets of accounts with more than 40 (so
    the 1.6 million tweets are never all held).
    """
    path = Path(path)
    if path.is_dir():
        files = find_sent140_files(path)
    elif path.name.endswith((".json", ".json.gz")):
        files = Sent140Files(json=(path,))
    else:
        files = Sent140Files(csv=path)
    return build_sent140(account_tweets(files, MIN_SAMPLES), split_seed=split_seed)


def account_tweets(files: Sent140Files, min_tweets: int) -> Iterator[Tweet]:
    """Yield the tweets of ``files``: every LEAF tweet, or the CSV's of busy accounts.

    Sentiment140's CSV is read twice: once to count each account's tweets, then keeping the
    tweets of accounts with at least ``min_tweets`` (its 1.6 million tweets are never all
    held). LEAF's files hold only such accounts' tweets already.
    """
    if files.csv is None:
        return files.tweets()
    counts = Counter(t.user for t in read_sentiment140_csv(files.csv))
    return (t for t in read_sentiment140_csv(files.csv) if counts[t.user] >= min_tweets)


def synthetic_sent140(
    seed: int = 0,
    n_clients: int = PAPER_TABLE1["clients"],
    n_samples: int = PAPER_TABLE1["samples"],
    vocab_size: int = 30_000,
    target_dispersion: float = PAPER_TABLE1["feature-heat-dispersion"],
    weight_std: float = 1.5,
) -> Sent140:
    """Return the calibrated stand-in ``synthetic-sent140`` (made from ``seed``, in memory).

    Every client has more than 40 tweets (41 + Poisson, the paper's mean of 54 per client),
    tweets of 4–20 tokens. Token popularity is Zipf-like, p_v ∝ v^(−s), with the most popular
    token's probability chosen so that it appears in the training tweets of about
    ``target_dispersion`` clients, and s so that the probabilities sum to 1 over
    ``vocab_size`` tokens; the rarest tokens occur in one client, so n_max / n_min lands at
    the paper's dispersion (measured: :meth:`Sent140.dispersion`). Labels come from a planted
    linear sentiment model: a share :data:`WEIGHTED_SHARE` (10 %) of the tokens carry a weight
    N(0, ``weight_std``²) (1.5²) and every account a bias N(0, 0.5²); a tweet is positive with
    probability σ(Σ weights + bias) (with the defaults that model's accuracy is 0.716, its
    loss 0.531, data seed 0). The vocabulary size is ours (the paper does not give it);
    that share and ``weight_std`` are ours too, and only diagnoses change the latter.
    """
    rng = np.random.default_rng([int(seed), 1400])
    per_client = 41 + rng.poisson(max(n_samples / n_clients - 41, 0.0), size=n_clients)
    lengths = rng.integers(4, 21, size=int(per_client.sum()))
    owner = np.repeat(np.arange(n_clients), per_client)
    tokens_per_client = np.bincount(owner, weights=lengths, minlength=n_clients) * 0.8
    # the top token's probability: expected clients containing it = target_dispersion
    probs = zipf_for_heat(tokens_per_client, target_dispersion, vocab_size, p_top_min=1e-6)
    weighted = rng.random(vocab_size) < WEIGHTED_SHARE
    weight = np.where(weighted, rng.normal(0, weight_std, vocab_size), 0.0)
    bias = rng.normal(0, 0.5, n_clients)
    flat = rng.choice(vocab_size, size=int(lengths.sum()), p=probs)
    ptr = np.concatenate([[0], np.cumsum(lengths)])
    score = np.add.reduceat(weight[flat], ptr[:-1]) + bias[owner]
    labels = (rng.random(score.size) < 1.0 / (1.0 + np.exp(-score))).astype(int)
    users = [f"user{c:05d}" for c in range(n_clients)]
    words = np.array([f"w{v}" for v in range(vocab_size)])
    tweets = (
        Tweet(users[owner[i]], int(labels[i]), " ".join(words[flat[ptr[i] : ptr[i + 1]]]))
        for i in range(score.size)
    )
    task = build_sent140(tweets, name="synthetic-sent140", split_seed=seed)
    planted = np.zeros(len(task.vocab) + 1)
    planted[1:] = weight[[int(t[1:]) for t in task.vocab]]
    return replace(task, planted=planted)


def build_sent140(
    tweets: Iterable[Tweet],
    name: str = "sent140",
    min_samples: int = MIN_SAMPLES,
    test_fraction: float = 0.2,
    split_seed: int = 0,
    max_len: int = 25,
) -> Sent140:
    """Build the federated task from tweets (see the module docstring).

    Parameters
    ----------
    tweets : iterable of Tweet
        From :func:`read_sentiment140_csv` or :func:`read_leaf_json`.
    name : str, optional
        Task name.
    min_samples : int, optional
        Least samples an account needs to be a client (default 41: "more than 40").
    test_fraction : float, optional
        Share of the samples in the test set (default 0.2), drawn at random; when every
        tweet carries LEAF's split (``Tweet.test``), that split is kept instead (with
        ``test_fraction`` = 0 every sample is a training sample either way).
    split_seed : int, optional
        Seed of the train/test split (default 0).
    max_len : int, optional
        Tokens kept per tweet (default 25).

    Raises
    ------
    ValueError
        If no account has ``min_samples`` samples.
    """
    by_user: dict[str, list[tuple[int, list[str], bool | None]]] = {}
    for tweet in tweets:
        by_user.setdefault(tweet.user, []).append(
            (tweet.label, tokenize(tweet.text), tweet.test)
        )
    users = tuple(sorted(u for u, s in by_user.items() if len(s) >= min_samples))
    if not users:
        raise ValueError(f"no account has {min_samples} or more samples")
    labels = [label for u in users for label, _, _ in by_user[u]]
    tokens = [toks[:max_len] for u in users for _, toks, _ in by_user[u]]
    given = [flag for u in users for _, _, flag in by_user[u]]
    owner = np.repeat(np.arange(len(users)), [len(by_user[u]) for u in users])
    n = len(labels)
    is_test = np.zeros(n, dtype=bool)
    if test_fraction > 0 and given and all(flag is not None for flag in given):
        is_test[:] = given  # LEAF's own split
    elif test_fraction > 0 and any(flag is not None for flag in given):
        raise ValueError("some tweets carry LEAF's train/test split and others do not")
    else:
        rng = np.random.default_rng([int(split_seed), 140])
        is_test[rng.permutation(n)[: int(round(test_fraction * n))]] = True
    counts = Counter(t for i in np.flatnonzero(~is_test) for t in tokens[i])
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    vocab = tuple(ranked)
    index = {t: k + 1 for k, t in enumerate(vocab)}
    x = np.zeros((n, max_len), dtype=np.int32)
    for i, toks in enumerate(tokens):
        ids = [index.get(t, 0) for t in toks]
        x[i, : len(ids)] = ids
    y = np.asarray(labels, dtype=np.int64)

    def part(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = np.flatnonzero(mask)  # already grouped by client (owner is non-decreasing)
        ptr = np.zeros(len(users) + 1, dtype=np.int64)
        np.cumsum(np.bincount(owner[idx], minlength=len(users)), out=ptr[1:])
        return x[idx], y[idx], ptr

    train_x, train_y, train_ptr = part(~is_test)
    test_x, test_y, test_ptr = part(is_test)
    heat = np.zeros(len(vocab) + 1, dtype=np.int64)
    for c in range(len(users)):
        ids = np.unique(train_x[train_ptr[c] : train_ptr[c + 1]])
        heat[ids[ids > 0]] += 1
    return Sent140(name, users, vocab, train_x, train_y, train_ptr, test_x, test_y,
                   test_ptr, heat)  # fmt: skip
