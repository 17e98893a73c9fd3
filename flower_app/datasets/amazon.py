"""Amazon Electronics as FedSubAvg's CTR task reads it (Section 5, Table 1: 1,870 clients).

Official formats, read streaming, gzip or not:

reviews (``reviews_Electronics_5.json[.gz]``, JSON lines)
    ``reviewerID``, ``asin``, ``overall`` (1–5), ``unixReviewTime`` per line.
``rating_only.csv``, ``ratings_<Category>.csv``
    what the authors' code reads: ``uid,item,rating,time`` per line; Amazon's ratings-only
    file ``ratings_Electronics.csv`` (McAuley's 2014 release) has the same columns and no
    header. A first line that names the four columns (any case, e.g. ``uid,item,rating,time``
    or ``userId,productId,Rating,Timestamp``) is read as a header.
metadata (``meta_Electronics.json[.gz]``)
    one product per line, ``asin`` and ``categories`` (a list of category paths; the last
    entry of the first path is the item's category) or ``category`` (a list); the 2014
    files are Python literals rather than strict JSON, and both are accepted.

Federated partition (:func:`build_amazon`), as the authors' pipeline does it (their code;
the paper's text says "more than 40"): click = rating 5; users with **at least 40** ratings;
each user's events sorted by time; the history of an event is the user's earlier *clicked*
items (the last 100); user and item ids remapped to 1..N in sorted order (0 is padding);
rows with time ≤ 1,385,000,000 train, later rows test; one client per user. Feature heat,
per row of the user and item embeddings: ``heat_clients`` counts the clients whose training
rows touch it (uid, target items, history items: Table 1's dispersion) and ``heat_samples``
sums those clients' training sizes (the data-size weighting of Appendix D.4).

Where the files are (:func:`find_amazon_files`, in ``data-dir/amazon/``): exactly one
ratings source, ``rating_only.csv``, ``ratings_<Category>.csv`` or
``reviews_<Category>_5.json`` / ``reviews_<Category>.json`` (each optionally ``.gz``), and
optionally ``meta_<Category>.json``; two sources are refused as ambiguous.

Every error names the file, the line and what was expected.
"""

from __future__ import annotations

import ast
import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_app.datasets.paths import DataFormatError, json_object, open_text
from flower_app.datasets.synthetic import zipf_for_heat

__all__ = [
    "MIN_RATINGS",
    "AmazonCTR",
    "PAPER_TABLE1",
    "Rating",
    "build_amazon",
    "find_amazon_files",
    "read_metadata",
    "read_rating_only_csv",
    "read_reviews_json",
    "synthetic_amazon",
]

#: FedSubAvg's Table 1 row for Amazon
PAPER_TABLE1 = {"clients": 1870, "samples": 123147, "samples-per-client": 66,
                "feature-heat-dispersion": 232}  # fmt: skip
#: the authors' train/test cut (about 2013-11-21)
TIME_CUTOFF = 1_385_000_000
#: the least ratings of a user who becomes a client (the authors' code: at least 40)
MIN_RATINGS = 40
#: the clicked items an event's history keeps (the most recent)
HISTORY = 100


@dataclass(frozen=True)
class Rating:
    """One review: user, item, rating 1–5, unix time."""

    user: str
    item: str
    rating: float
    time: int


def _lines(path: Path) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (gzip or not; a byte-order mark dropped).

    A damaged gzip stream or bytes that are not UTF-8 raise a ``ValueError`` naming the file
    (:func:`~flower_app.datasets.paths.open_text`).
    """
    with open_text(path) as fh:
        yield from fh


def _fail(path: Path, line: int, what: object, expected: str) -> DataFormatError:
    """Return the error of a line that does not have the format (the file and line named)."""
    return DataFormatError(path, f"{what}; expected {expected}", line_number=line)


def _id(obj: dict, key: str) -> str:
    """Return an id field as text: a string, or an integer written as one; refuse the rest."""
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f"{key} is {json.dumps(value)}, not a string id")
    text = str(value)
    if not text.strip():
        raise ValueError(f"{key} is empty")
    return text


def _number(obj: dict, key: str) -> float:
    """Return a number field; refuse a boolean, null or text where a number belongs."""
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{key} is {json.dumps(value)}, not a number")
    return float(value)


def read_reviews_json(path: str | Path) -> Iterator[Rating]:
    """Yield the reviews of a JSON-lines file.

    Raises
    ------
    ValueError
        Naming the file and the line, for a line that is not JSON or lacks a field, an id
        that is not a string (``null``, ``true``, a list), a rating or time that is not a
        number (``true`` is not 1), a rating outside 1..5 or a time in fractions of seconds.
    """
    path = Path(path)
    fields = ("reviewerID", "asin", "overall", "unixReviewTime")
    expected = ("JSON lines with " + ", ".join(fields) + " (ids strings, overall a number "
                "1-5, unixReviewTime whole seconds)")  # fmt: skip
    for line_no, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=json_object)
            if not isinstance(obj, dict):
                raise TypeError(f"a JSON {type(obj).__name__}, not an object")
            rating, time = _number(obj, "overall"), _number(obj, "unixReviewTime")
            if not 1 <= rating <= 5:
                raise ValueError(f"overall {rating:g} is outside 1..5")
            if not time.is_integer():
                raise ValueError("unixReviewTime is not whole seconds")
            review = Rating(_id(obj, "reviewerID"), _id(obj, "asin"), rating, int(time))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise _fail(path, line_no, f"{type(err).__name__} {err}", expected) from None
        yield review


#: header names of the four columns of a ratings CSV (compared lower-case)
_HEADER_NAMES = (
    {"uid", "user", "userid", "user_id", "reviewerid"},
    {"item", "itemid", "item_id", "productid", "product_id", "asin"},
    {"rating", "overall", "score"},
    {"time", "timestamp", "unixreviewtime", "unix_time"},
)


def _is_header(row: list[str]) -> bool:
    return len(row) == 4 and all(
        cell.strip().lower() in names for cell, names in zip(row, _HEADER_NAMES, strict=True)
    )


def read_rating_only_csv(path: str | Path) -> Iterator[Rating]:
    """Yield the ratings of ``rating_only.csv`` or ``ratings_<Category>.csv``.

    Columns user, item, rating, time; an optional first line naming them (any case) is a
    header.

    Raises
    ------
    ValueError
        Naming the file and the line, for another number of fields, an empty id or a bad
        number (a rating outside 1..5, a time that is not whole unix seconds).
    """
    path = Path(path)
    expected = "CSV lines uid,item,rating,time (rating 1-5, time unix seconds; header optional)"
    reader = csv.reader(_lines(path))
    for row in reader:
        line_no = reader.line_num
        if not row:
            continue  # an empty line holds no record
        if line_no == 1 and _is_header(row):
            continue
        if len(row) != 4:
            raise _fail(path, line_no, f"{len(row)} fields", expected)
        user, item = row[0].strip(), row[1].strip()
        try:
            rating, time = float(row[2]), float(row[3])
        except ValueError:
            rating = time = float("nan")
        if not user or not item or not 1 <= rating <= 5 or not time.is_integer():
            raise _fail(path, line_no, repr(row), expected)
        yield Rating(user, item, rating, int(time))


def _category(obj: dict) -> str | None:
    """Return a product's category (see the module docstring), None without one."""
    cats = obj.get("categories")
    if cats is not None and cats != []:
        if not isinstance(cats, list) or not all(isinstance(c, list) for c in cats):
            raise TypeError(f"categories is {json.dumps(cats)[:80]}, not a list of lists")
        path = cats[0]
        if path:
            if not all(isinstance(c, str) for c in path):
                raise TypeError(f"categories[0] is {json.dumps(path)[:80]}, not names")
            return path[-1]
    names = obj.get("category")
    if names is None or names == []:
        return None
    if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
        raise TypeError(f"category is {json.dumps(names)[:80]}, not a list of names")
    return names[-1]


def read_metadata(path: str | Path) -> dict[str, str]:
    """Return item → category from a metadata file (JSON or Python-literal lines).

    A product listed twice with the same category is read once; with another category the
    file is refused (which one would be a guess).

    Raises
    ------
    ValueError
        Naming the file and the line, for a line that cannot be parsed, has no ``asin``, an
        ``asin`` that is not a string, a ``category`` that is not a list of names, or a
        product listed again with another category (both lines named).
    """
    path = Path(path)
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    expected = ("one product per line with asin (a string) and categories (a list of lists "
                "of names) or category (a list of names)")  # fmt: skip
    for line_no, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=json_object)
        except json.JSONDecodeError:
            try:
                obj = ast.literal_eval(line)
            except (ValueError, SyntaxError):
                raise _fail(path, line_no, "neither JSON nor a Python literal",
                            "one product per line") from None  # fmt: skip
        except ValueError as err:  # a key twice (json_object)
            raise DataFormatError(path, str(err), line_number=line_no) from None
        if not isinstance(obj, dict) or "asin" not in obj:
            raise _fail(path, line_no, "no 'asin'", expected)
        try:
            asin, category = _id(obj, "asin"), _category(obj)
        except (TypeError, ValueError) as err:
            raise _fail(path, line_no, err, expected) from None
        if asin in seen and out.get(asin) != category:
            raise ValueError(
                f"{path}, lines {seen[asin]} and {line_no}: product {asin!r} is listed twice "
                f"with different categories ({out.get(asin)!r}, {category!r}); keep one"
            )
        seen.setdefault(asin, line_no)
        if category is not None:
            out[asin] = category
    return out


@dataclass(frozen=True)
class AmazonFiles:
    """The ratings file of ``data-dir/amazon/`` and its metadata (or None)."""

    ratings: Path
    meta: Path | None

    def read(self) -> Iterator[Rating]:
        """Yield the ratings with the reader of the file's format."""
        if self.ratings.name.startswith("reviews_"):
            return read_reviews_json(self.ratings)
        return read_rating_only_csv(self.ratings)


def _one(folder: Path, pattern: str) -> list[Path]:
    return sorted(p for p in folder.glob(pattern) if p.name.endswith((".csv", ".json", ".gz")))


def find_amazon_files(folder: str | Path) -> AmazonFiles:
    """Return the ratings source and metadata of ``folder`` (see the module docstring).

    Raises
    ------
    FileNotFoundError
        Naming the files looked for, when there is no ratings file.
    ValueError
        When there are several ratings sources, or several metadata files and none of the
        ratings file's category.
    """
    folder = Path(folder)
    sources = [
        *_one(folder, "rating_only.csv*"),
        *_one(folder, "ratings_*.csv*"),
        *_one(folder, "reviews_*.json*"),
    ]
    if not sources:
        raise FileNotFoundError(
            f"amazon: none of rating_only.csv, ratings_<Category>.csv (e.g. "
            f"ratings_Electronics.csv), reviews_<Category>_5.json (each optionally .gz) in "
            f"{folder}"
        )
    if len(sources) > 1:
        raise ValueError(f"{folder}: several ratings files ({', '.join(p.name for p in sources)}"
                         "); keep one")  # fmt: skip
    ratings = sources[0]
    stem = ratings.name.split(".")[0]
    category = stem.removeprefix("ratings_").removeprefix("reviews_").removesuffix("_5")
    metas = _one(folder, "meta_*.json*")
    own = [p for p in metas if p.name.split(".")[0] == f"meta_{category}"]
    if len(metas) > 1 and not own:
        raise ValueError(f"{folder}: several metadata files ({', '.join(p.name for p in metas)}"
                         f") and none named meta_{category}.json; keep one")  # fmt: skip
    return AmazonFiles(ratings, (own or metas or [None])[0])


@dataclass(frozen=True, eq=False)
class AmazonCTR:
    """The federated CTR task: one row per event, clients by user.

    Rows are grouped by client (client c = user id c + 1 ... in the remapped ids, clients
    0..N−1); client c's training rows are ``train_ptr[c]:train_ptr[c+1]`` (test likewise).

    Attributes
    ----------
    name : str
        ``amazon`` or ``synthetic-amazon``.
    users, items : tuple of str
        Original ids of user 1..N and item 1..M (id 0 is padding).
    item_category : numpy.ndarray
        int64 (M+1,) category id of each item (0: unknown / padding).
    categories : tuple of str
        Name of category 1..C.
    train_uid, train_mid, train_clk, train_time : numpy.ndarray
        int64 per training row (uid 1..N, item 1..M, click 0/1, unix time).
    train_hist : numpy.ndarray
        int64 (n, 100) the earlier clicked items, most recent last, left-padded with 0.
    train_ptr : numpy.ndarray
        int64 (N+1,) client offsets into the training rows.
    test_uid, test_mid, test_clk, test_time, test_hist, test_ptr : numpy.ndarray
        The same for the test rows.
    heat_clients : numpy.ndarray
        int64 (N + M + 2,) clients touching each embedding row: rows 0..N are users
        (0 padding), rows N+1..N+M+1 items (N+1 padding).
    heat_samples : numpy.ndarray
        int64, same rows: Σ of those clients' training sizes (Appendix D.4's weights).
    """

    name: str
    users: tuple[str, ...]
    items: tuple[str, ...]
    item_category: np.ndarray
    categories: tuple[str, ...]
    train_uid: np.ndarray
    train_mid: np.ndarray
    train_clk: np.ndarray
    train_time: np.ndarray
    train_hist: np.ndarray
    train_ptr: np.ndarray
    test_uid: np.ndarray
    test_mid: np.ndarray
    test_clk: np.ndarray
    test_time: np.ndarray
    test_hist: np.ndarray
    test_ptr: np.ndarray
    heat_clients: np.ndarray
    heat_samples: np.ndarray

    @property
    def n_clients(self) -> int:
        """Clients N (users)."""
        return len(self.users)

    def dispersion(self) -> float:
        """Feature heat dispersion n_max / n_min over the touched user and item rows."""
        n = self.heat_clients[self.heat_clients > 0]
        return float(n.max() / n.min()) if n.size else 0.0

    def stats(self) -> dict[str, float | int]:
        """Return the Table 1 numbers (samples = training + test rows)."""
        samples = int(self.train_clk.size + self.test_clk.size)
        return {
            "clients": self.n_clients,
            "samples": samples,
            "samples-per-client": samples / max(self.n_clients, 1),
            "items": len(self.items),
            "feature-heat-dispersion": self.dispersion(),
            "click-share": float(np.mean(np.concatenate([self.train_clk, self.test_clk]))),
        }


def build_amazon(
    ratings: Iterable[Rating],
    name: str = "amazon",
    categories: dict[str, str] | None = None,
) -> AmazonCTR:
    """Build the federated CTR task (see the module docstring).

    Raises
    ------
    ValueError
        If no user has :data:`MIN_RATINGS` ratings.
    """
    users_col, items_col, rating_col, time_col = [], [], [], []
    for r in ratings:
        users_col.append(r.user)
        items_col.append(r.item)
        rating_col.append(r.rating)
        time_col.append(r.time)
    user_raw = np.asarray(users_col)
    uniq_u, u_inv, u_count = np.unique(user_raw, return_inverse=True, return_counts=True)
    keep = u_count[u_inv] >= MIN_RATINGS
    if not keep.any():
        raise ValueError(f"no user has {MIN_RATINGS} or more ratings")
    users = tuple(str(u) for u in uniq_u[u_count >= MIN_RATINGS])
    item_raw = np.asarray(items_col)[keep]
    items_arr, mid = np.unique(item_raw, return_inverse=True)
    items = tuple(str(i) for i in items_arr)
    uid = np.searchsorted(np.asarray(users), user_raw[keep]) + 1
    mid = mid + 1
    clk = (np.asarray(rating_col)[keep] >= 5).astype(np.int64)
    time = np.asarray(time_col, dtype=np.int64)[keep]
    order = np.lexsort((np.arange(uid.size), time, uid))  # by user, then time (stable)
    uid, mid, clk, time = uid[order], mid[order], clk[order], time[order]
    hist = np.zeros((uid.size, HISTORY), dtype=np.int64)
    start = 0
    for end in np.flatnonzero(np.diff(np.append(uid, -1))) + 1:
        clicked: list[int] = []
        for row in range(start, end):
            recent = clicked[-HISTORY:]
            if recent:
                hist[row, HISTORY - len(recent) :] = recent
            if clk[row]:
                clicked.append(int(mid[row]))
        start = end
    cat_names = sorted(set((categories or {}).values()))
    cat_id = {c: k + 1 for k, c in enumerate(cat_names)}
    item_category = np.zeros(len(items) + 1, dtype=np.int64)
    for k, item in enumerate(items):
        item_category[k + 1] = cat_id.get((categories or {}).get(item, ""), 0)
    is_train = time <= TIME_CUTOFF
    n = len(users)

    def part(mask: np.ndarray) -> tuple[np.ndarray, ...]:
        idx = np.flatnonzero(mask)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(uid[idx] - 1, minlength=n), out=ptr[1:])
        return uid[idx], mid[idx], clk[idx], time[idx], hist[idx], ptr

    train = part(is_train)
    test = part(~is_train)
    heat_clients = np.zeros(n + len(items) + 2, dtype=np.int64)
    heat_samples = np.zeros_like(heat_clients)
    t_uid, t_mid, _, _, t_hist, t_ptr = train
    for c in range(n):
        lo, hi = int(t_ptr[c]), int(t_ptr[c + 1])
        if hi == lo:
            continue
        touched = np.unique(np.concatenate([t_mid[lo:hi], t_hist[lo:hi].ravel()]))
        rows = np.concatenate([[c + 1], n + 1 + touched[touched > 0]])
        heat_clients[rows] += 1
        heat_samples[rows] += hi - lo
    return AmazonCTR(name, users, items, item_category, tuple(cat_names), *train, *test,
                     heat_clients, heat_samples)  # fmt: skip


def synthetic_amazon(
    seed: int = 0,
    n_clients: int = PAPER_TABLE1["clients"],
    n_samples: int = PAPER_TABLE1["samples"],
    n_items: int = 33_136,
    target_dispersion: float = PAPER_TABLE1["feature-heat-dispersion"],
    n_categories: int = 50,
) -> AmazonCTR:
    """Return the calibrated stand-in ``synthetic-amazon`` (made from ``seed``).

    Users have at least 40 ratings (40 + Poisson, the paper's mean of 66), spread over
    2012–2014 so that about a fifth fall after the cut; item popularity is Zipf-like with the
    most popular item's probability chosen so that about ``target_dispersion`` clients touch
    it (a user row is touched by one client, so n_max / n_min lands at the paper's
    dispersion); 33,136 items as in the authors' code. A user clicks (rates 5) with
    probability σ(a_u + b_i + 0.8·[the item's category is among the user's last clicks']):
    a learnable signal for the history attention of DIN.
    """
    rng = np.random.default_rng([int(seed), 2022])
    per_user = 40 + rng.poisson(max(n_samples / n_clients - 40, 0.0), size=n_clients)
    # a client's touched items are the items of its training rows (its history holds its own
    # earlier clicks): 80 % of its ratings fall before the cut with the times drawn below
    touches = per_user * (TIME_CUTOFF - 1_325_000_000) / (1_400_000_000 - 1_325_000_000)
    probs = zipf_for_heat(touches, target_dispersion, n_items, p_top_min=1e-7)
    item_cat = rng.integers(0, n_categories, size=n_items)
    user_bias = rng.normal(-0.3, 0.8, n_clients)
    item_bias = rng.normal(0.0, 0.8, n_items)
    taste = rng.integers(0, n_categories, size=(n_clients, 3))
    rows: list[Rating] = []
    for u in range(n_clients):
        k = int(per_user[u])
        items = rng.choice(n_items, size=k, p=probs)
        times = np.sort(rng.integers(1_325_000_000, 1_400_000_000, size=k))
        liked = np.isin(item_cat[items], taste[u])
        p = 1.0 / (1.0 + np.exp(-(user_bias[u] + item_bias[items] + 0.8 * liked)))
        five = rng.random(k) < p
        rows.extend(
            Rating(f"U{u:05d}", f"I{int(i):06d}", 5.0 if f else float(rng.integers(1, 5)), int(t))
            for i, f, t in zip(items, five, times, strict=True)
        )
    cats = {f"I{i:06d}": f"cat{int(item_cat[i])}" for i in range(n_items)}
    return build_amazon(rows, name="synthetic-amazon", categories=cats)
