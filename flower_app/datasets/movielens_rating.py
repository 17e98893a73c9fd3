"""The FedSubAvg paper's rating-classification task on MovieLens-1M (Section 5.1, App. D.4).

* label 1 for ratings 4 and 5, 0 for 1–3;
* features: one-hot gender, age, movie, gender × movie and age × movie, into a logistic
  regression (:mod:`flower_app.models.sparse_logreg`);
* one client per user (6,040 on the real data);
* a random 80/20 train/test split of the *samples* (not of the users), drawn with
  ``data-seed``; users left without a training sample are dropped (none on the real data);
* the train loss is measured on 10,000 training samples drawn once, also with ``data-seed``.

Movies are the ones that have at least one rating (3,706 on the real data), so the model has
M = 10 + 10·3,706 = 37,070 rows. A client's submodel S(i) is the set of rows its *training*
samples touch.

``synthetic-movielens-rating`` is a calibrated stand-in with the same tables (for tests and
for machines without the files); see :func:`synthetic_movielens_tables`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pandas is imported where tables are made: a FedSubAvg ClientApp
    import pandas as pd  # reads its node's arrays without it

from flower_app.models.sparse_logreg import AGE_BRACKETS, GENDERS, OneHotLayout

__all__ = [
    "ML1M_AGE_COUNTS",
    "ML1M_MALE",
    "RatingTask",
    "build_rating_task",
    "load_rating_task",
    "synthetic_movielens_tables",
    "task_from_rows",
]

#: users per age bracket in MovieLens-1M (users.dat)
ML1M_AGE_COUNTS = {1: 222, 18: 1103, 25: 2096, 35: 1193, 45: 550, 50: 496, 56: 380}
#: male users in MovieLens-1M (of 6,040)
ML1M_MALE = 4331
_ML1M_USERS = 6040
_ML1M_MOVIES = 3706
#: share of ratings 1..5 in MovieLens-1M
_RATING_SHARE = np.array([0.05616, 0.10753, 0.26114, 0.34890, 0.22626])
POSITIVE_FROM = 4  # ratings >= 4 are positive (Section 5.1)


@dataclass(frozen=True, eq=False)
class RatingTask:
    """The rating task in the arrays every engine works on. Do not modify the arrays.

    Clients are numbered 0..N−1 in ``user_id`` order; client i's training samples are
    ``train_*[train_ptr[i]:train_ptr[i+1]]`` and its submodel rows (sorted) are
    ``sub_rows[sub_ptr[i]:sub_ptr[i+1]]``.

    Attributes
    ----------
    name : str
        ``"movielens-1m-rating"`` or ``"synthetic-movielens-rating"``.
    layout : OneHotLayout
        Row layout of the model.
    user_ids : numpy.ndarray
        Original user id of each client.
    train_rows : numpy.ndarray
        (n_train, 6) int32 model rows of each training sample, grouped by client.
    train_pos : numpy.ndarray
        (n_train, 6) int32 positions of those rows in the client's submodel.
    train_y : numpy.ndarray
        float64 labels of the training samples.
    train_ptr : numpy.ndarray
        int64 (N+1,) offsets of each client's training samples.
    sub_rows : numpy.ndarray
        int32 concatenated submodels S(i).
    sub_ptr : numpy.ndarray
        int64 (N+1,) offsets into ``sub_rows``.
    test_rows, test_y : numpy.ndarray
        The test samples (20%).
    test_client : numpy.ndarray
        int64 client of each test sample (−1 for a user without training samples), so a
        node can evaluate its own users' test samples.
    eval_idx : numpy.ndarray
        Indices of the training samples the train loss is measured on (sorted).
    """

    name: str
    layout: Any  # OneHotLayout for MovieLens; TableLayout for your own table
    user_ids: np.ndarray
    train_rows: np.ndarray
    train_pos: np.ndarray
    train_y: np.ndarray
    train_ptr: np.ndarray
    sub_rows: np.ndarray
    sub_ptr: np.ndarray
    test_rows: np.ndarray
    test_y: np.ndarray
    test_client: np.ndarray
    eval_idx: np.ndarray

    @property
    def n_clients(self) -> int:
        """Number of clients N."""
        return int(self.user_ids.size)

    @property
    def n_params(self) -> int:
        """Model rows M."""
        return self.layout.n_params

    @property
    def n_train(self) -> int:
        """Training samples."""
        return int(self.train_y.size)

    def samples_per_client(self) -> np.ndarray:
        """Return each client's number of training samples n_i (int64)."""
        return np.diff(self.train_ptr)

    def submodel_sizes(self) -> np.ndarray:
        """Return |S(i)| for every client (int64)."""
        return np.diff(self.sub_ptr)

    def submodel(self, client: int) -> np.ndarray:
        """Return client ``client``'s sorted submodel rows S(i) (int32)."""
        return self.sub_rows[self.sub_ptr[client] : self.sub_ptr[client + 1]]

    def stats(self) -> dict[str, float | int]:
        """Return the task's headline numbers (for ``config.json`` and the README)."""
        n_i = self.samples_per_client()
        movies = getattr(self.layout, "n_movies", None)
        return {
            "clients": self.n_clients,
            **({"movies": movies} if movies is not None else {}),
            "params": self.n_params,
            "train-samples": self.n_train,
            "test-samples": int(self.test_y.size),
            "eval-samples": int(self.eval_idx.size),
            "positive-share": float(self.train_y.mean()),
            "train-samples-per-client-mean": float(n_i.mean()),
            "submodel-rows-mean": float(self.submodel_sizes().mean()),
            "submodel-rows-max": int(self.submodel_sizes().max()),
        }


def build_rating_task(
    ratings: pd.DataFrame,
    users: pd.DataFrame,
    name: str,
    split_seed: int = 0,
    test_fraction: float = 0.2,
    eval_samples: int = 10_000,
) -> RatingTask:
    """Build the task from MovieLens-style tables.

    Parameters
    ----------
    ratings : pandas.DataFrame
        Columns ``user_id``, ``movie_id``, ``rating`` (1..5).
    users : pandas.DataFrame
        Columns ``user_id``, ``gender`` (``"F"``/``"M"``), ``age`` (a code of
        :data:`~flower_app.models.sparse_logreg.AGE_BRACKETS`).
    name : str
        Task name.
    split_seed : int, optional
        Seed of the train/test split and of the train-loss sample (default 0).
    test_fraction : float, optional
        Share of samples in the test set (default 0.2).
    eval_samples : int, optional
        Training samples the train loss is measured on (default 10,000; all if fewer).

    Returns
    -------
    RatingTask
        The task.

    Raises
    ------
    ValueError
        On unknown genders or age codes, users missing from ``users``, or bad fractions.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction} must lie in [0, 1)")
    user_col = ratings["user_id"].to_numpy(np.int64)
    movie_ids, movie = np.unique(ratings["movie_id"].to_numpy(np.int64), return_inverse=True)
    layout = OneHotLayout(int(movie_ids.size))
    table = users.set_index("user_id")
    missing = ~np.isin(user_col, table.index.to_numpy(np.int64))
    if missing.any():
        raise ValueError(f"ratings of user {int(user_col[missing][0])} who is not in users")
    gender_of = table["gender"].map({g: k for k, g in enumerate(GENDERS)})
    age_of = table["age"].map({a: k for k, a in enumerate(AGE_BRACKETS)})
    if gender_of.isna().any() or age_of.isna().any():
        raise ValueError(f"users need gender in {GENDERS} and age in {AGE_BRACKETS}")
    g = gender_of.reindex(user_col).to_numpy(np.int64)
    a = age_of.reindex(user_col).to_numpy(np.int64)
    rows = layout.rows(g, a, movie)
    y = (ratings["rating"].to_numpy(np.int64) >= POSITIVE_FROM).astype(np.float64)
    return task_from_rows(rows, y, user_col, layout, name, split_seed, test_fraction, eval_samples)


def task_from_rows(
    rows: np.ndarray,
    y: np.ndarray,
    user_col: np.ndarray,
    layout: Any,
    name: str,
    split_seed: int = 0,
    test_fraction: float = 0.2,
    eval_samples: int = 10_000,
) -> RatingTask:
    """Build a task from every sample's model rows, label and user (any one-hot layout).

    Parameters
    ----------
    rows : numpy.ndarray
        (n, F) int model rows each sample touches (row 0 the bias).
    y : numpy.ndarray
        float64 labels 0/1.
    user_col : numpy.ndarray
        int64 user of each sample (one client per user, in sorted order).
    layout : object
        The row layout (``n_params``, ``blocks()``).
    name, split_seed, test_fraction, eval_samples
        As for :func:`build_rating_task`.
    """
    rng = np.random.default_rng([int(split_seed), 20220])  # split stream
    n = y.size
    is_test = np.zeros(n, dtype=bool)
    is_test[rng.permutation(n)[: int(round(test_fraction * n))]] = True
    train = np.flatnonzero(~is_test)
    train = train[np.argsort(user_col[train], kind="stable")]  # grouped by client
    user_ids, client = np.unique(user_col[train], return_inverse=True)
    n_clients = int(user_ids.size)
    train_ptr = np.zeros(n_clients + 1, dtype=np.int64)
    np.cumsum(np.bincount(client, minlength=n_clients), out=train_ptr[1:])
    train_rows = rows[train]

    m = layout.n_params
    keys = client[:, None].astype(np.int64) * m + train_rows
    pairs = np.unique(keys)
    sub_rows = (pairs % m).astype(np.int32)
    sub_ptr = np.searchsorted(pairs, np.arange(n_clients + 1, dtype=np.int64) * m)
    train_pos = (np.searchsorted(pairs, keys) - sub_ptr[client][:, None]).astype(np.int32)

    n_eval = min(int(eval_samples), train.size)
    eval_idx = np.sort(rng.choice(train.size, size=n_eval, replace=False))
    test = np.flatnonzero(is_test)
    test_client = np.searchsorted(user_ids, user_col[test])
    known = test_client < n_clients
    known[known] = user_ids[test_client[known]] == user_col[test][known]
    test_client = np.where(known, test_client, -1).astype(np.int64)
    return RatingTask(
        name=name,
        layout=layout,
        user_ids=user_ids,
        train_rows=train_rows.astype(np.int32),
        train_pos=train_pos,
        train_y=y[train],
        train_ptr=train_ptr,
        sub_rows=sub_rows,
        sub_ptr=sub_ptr.astype(np.int64),
        test_rows=rows[test].astype(np.int32),
        test_y=y[test],
        test_client=test_client,
        eval_idx=eval_idx,
    )


def synthetic_movielens_tables(
    n_users: int = _ML1M_USERS, n_movies: int = _ML1M_MOVIES, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Generate ``ratings`` and ``users`` tables calibrated to MovieLens-1M.

    Calibration (published MovieLens-1M statistics; everything else is an assumption):

    * gender M with probability 4,331 / 6,040; age brackets in the proportions of
      ``users.dat`` (:data:`ML1M_AGE_COUNTS`);
    * ratings per user = 20 + a lognormal with median 76 and mean 145.6 (MovieLens-1M: at
      least 20 per user, median 96, mean 165.6), capped at ``n_movies``;
    * movies drawn without replacement by a lognormal popularity (σ = 1.5, Zipf-like);
    * a rating is positive with probability σ(0.3 + q_j + e_{g,j} + e_{a,j}), with movie
      quality q_j ~ N(0, 0.9²) and gender × movie, age × movie effects ~ N(0, 0.35²) — so the
      logistic model is well specified and about 57% of the ratings are positive (57.5% in
      MovieLens-1M); positive ratings are 4 or 5, negative ones 1–3, in MovieLens-1M's
      proportions.

    Parameters
    ----------
    n_users : int, optional
        Users (default 6,040).
    n_movies : int, optional
        Movies (default 3,706).
    seed : int, optional
        Seed; the same arguments give the same tables.

    Returns
    -------
    tuple of pandas.DataFrame
        ``(ratings, users)`` with the columns :func:`build_rating_task` reads.
    """
    import pandas as pd

    if n_users < 1 or n_movies < 1:
        raise ValueError("n_users and n_movies must be >= 1")
    rng = np.random.default_rng([int(seed), 4331])
    gender = np.where(rng.random(n_users) < ML1M_MALE / _ML1M_USERS, "M", "F")
    ages = np.array(list(ML1M_AGE_COUNTS))
    p_age = np.array(list(ML1M_AGE_COUNTS.values()), dtype=float)
    age_idx = rng.choice(ages.size, size=n_users, p=p_age / p_age.sum())
    counts = 20 + np.floor(rng.lognormal(np.log(76.0), 1.14, size=n_users)).astype(np.int64)
    counts = np.minimum(counts, n_movies)
    log_pop = rng.normal(0.0, 1.5, size=n_movies)
    quality = rng.normal(0.0, 0.9, size=n_movies)
    e_gender = rng.normal(0.0, 0.35, size=(2, n_movies))
    e_age = rng.normal(0.0, 0.35, size=(ages.size, n_movies))
    users_col, movies_col, ratings_col = [], [], []
    for u in range(n_users):
        keys = log_pop + rng.gumbel(size=n_movies)  # Gumbel top-k = weighted, no replacement
        movies = np.sort(np.argpartition(-keys, counts[u] - 1)[: counts[u]])
        g = int(gender[u] == "M")
        z = 0.3 + quality[movies] + e_gender[g, movies] + e_age[age_idx[u], movies]
        positive = rng.random(movies.size) < 1.0 / (1.0 + np.exp(-z))
        hi = rng.choice([4, 5], size=movies.size, p=_RATING_SHARE[3:] / _RATING_SHARE[3:].sum())
        lo = rng.choice([1, 2, 3], size=movies.size, p=_RATING_SHARE[:3] / _RATING_SHARE[:3].sum())
        users_col.append(np.full(movies.size, u + 1))
        movies_col.append(movies + 1)
        ratings_col.append(np.where(positive, hi, lo))
    ratings = pd.DataFrame(
        {
            "user_id": np.concatenate(users_col),
            "movie_id": np.concatenate(movies_col),
            "rating": np.concatenate(ratings_col),
        }
    )
    users = pd.DataFrame(
        {"user_id": np.arange(1, n_users + 1), "gender": gender, "age": ages[age_idx]}
    )
    return ratings, users


@lru_cache(maxsize=4)
def load_rating_task(
    dataset: str,
    data_dir: str = "",
    data_seed: int = 0,
    num_users: int = 0,
    num_movies: int = 0,
) -> RatingTask:
    """Load the task by dataset name (cached per process: one copy per Ray actor).

    Parameters
    ----------
    dataset : str
        ``"movielens-rating"`` (the real MovieLens-1M under ``data_dir``) or
        ``"synthetic-movielens-rating"``.
    data_dir : str, optional
        Data folder ("" = ``$FLOWER_APP_DATA`` or the default cache folder).
    data_seed : int, optional
        Seed of the split, of the train-loss sample and of the synthetic tables.
    num_users, num_movies : int, optional
        Size of the synthetic stand-in (0 = MovieLens-1M's 6,040 and 3,706).

    Returns
    -------
    RatingTask
        The task.

    Raises
    ------
    ValueError
        For an unknown dataset name.
    FileNotFoundError
        If the real files are missing (the message says where to put them).
    """
    if dataset == "movielens-rating":
        from flower_app.datasets.movielens import load_movielens_1m

        ml = load_movielens_1m(data_dir or None)
        return build_rating_task(ml.ratings, ml.users, "movielens-1m-rating", data_seed)
    if dataset == "synthetic-movielens-rating":
        ratings, users = synthetic_movielens_tables(
            num_users or _ML1M_USERS, num_movies or _ML1M_MOVIES, seed=data_seed
        )
        return build_rating_task(ratings, users, "synthetic-movielens-rating", data_seed)
    raise ValueError(
        f"dataset {dataset!r} is not a rating task; use 'movielens-rating' or "
        "'synthetic-movielens-rating'"
    )
