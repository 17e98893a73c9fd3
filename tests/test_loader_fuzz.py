"""Every loader reads a file exactly as written or refuses it: fuzzed valid files.

Each test writes a valid file in a loader's documented format, mutates it (a field dropped,
duplicated or emptied, an empty line, ids relabelled to huge integers, the header's case
or spaces, another encoding, CRLF line ends), and reads it with the loader. A reference
reading of the documented format, written here independently, says what the mutated file
holds: ``None`` when the format refuses it. The property, for every loader:

- the reference refuses  -> the loader raises its error (file named);
- the reference reads it -> the loader raises, or gives the same n, m and sample count.

Never a different instance without an error. The unmutated file must be read.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flower_app.datasets.amazon import read_rating_only_csv, read_reviews_json
from flower_app.datasets.dblp import load_dblp_venue_sets
from flower_app.datasets.idx import read_idx, write_idx
from flower_app.datasets.movielens import load_movielens_1m
from flower_app.datasets.own import OwnDataError, load_coverage_sets, load_facility_table
from flower_app.datasets.own_images import load_image_clients
from flower_app.datasets.own_ratings import load_rating_table
from flower_app.datasets.paths import DataFormatError
from flower_app.datasets.sent140 import read_leaf_json, read_sentiment140_csv
from flower_app.node_data import NodeDataError, read_groups

EXAMPLES = settings(max_examples=60)
HUGE = 2**70  # 2**70 and 2**70 + 1 are one float64

Rows = list[list[str]]


# ------------------------------------------------------------------ mutations
@st.composite
def mutate(draw, rows: Rows, header: bool, id_cols: tuple[int, ...]) -> tuple[Rows, str, str]:
    """Return (rows, encoding, kind): the rows changed by one mutation, and how to encode."""
    rows = [list(r) for r in rows]
    first = 1 if header else 0
    kind = draw(st.sampled_from(["none", "drop", "dup", "empty", "blank", "huge", "header",
                                 "space", "encoding"]))  # fmt: skip
    encoding = "utf-8"
    i = draw(st.integers(first, len(rows) - 1))
    j = draw(st.integers(0, len(rows[i]) - 1))
    if kind == "drop":
        del rows[i][j]
    elif kind == "dup":
        rows[i].insert(j, rows[i][j])
    elif kind == "empty":
        rows[i][j] = ""
    elif kind == "blank":
        rows.insert(draw(st.integers(first, len(rows))), [])
    elif kind == "huge" and id_cols:
        col = draw(st.sampled_from(id_cols))
        values = sorted({r[col] for r in rows[first:]})
        a, b = values[0], values[-1]
        relabel = {a: str(HUGE), b: str(HUGE + 1)}  # distinct ids, one float
        for r in rows[first:]:
            r[col] = relabel.get(r[col], r[col])
    elif kind == "header" and header:
        style = draw(st.sampled_from(["upper", "spaces", "swap"]))
        if style == "upper":
            rows[0] = [h.upper() for h in rows[0]]
        elif style == "spaces":
            rows[0] = [f" {h} " for h in rows[0]]
        else:
            rows[0][0], rows[0][1] = rows[0][1], rows[0][0]
    elif kind == "space":
        rows[i][j] = f" {rows[i][j]} "
    elif kind == "encoding":
        encoding = draw(st.sampled_from(["utf-8-sig", "latin-1", "utf-16", "crlf"]))
        if encoding == "latin-1" and id_cols:  # a non-ASCII id, written in latin-1
            rows[i][id_cols[0]] = rows[i][id_cols[0]] + "é"
    return rows, encoding, kind


def render(rows: Rows, sep: str, encoding: str, quote: bool = False) -> bytes:
    out = io.StringIO()
    if quote:
        writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
        for r in rows:
            if r:
                writer.writerow(r)
            else:
                out.write("\n")
    else:
        out.write("".join(sep.join(r) + "\n" for r in rows))
    text = out.getvalue()
    if encoding == "crlf":
        return text.replace("\n", "\r\n").encode()
    return text.encode(encoding)


def check(data: bytes, name: str, load: Callable[[Path], tuple], reference, errors, kind: str):
    """The property of the module docstring, for one mutated file."""
    expected = reference(data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        try:
            got = load(path)
        except errors as err:
            assert name in str(err) or path.parent.name in str(err)  # the file is named
            assert kind != "none", f"the valid file was refused: {err}"
            return
    assert expected is not None, f"{kind}: read {got} where the format refuses the file"
    assert got == expected, f"{kind}: read {got}, the file holds {expected}"


def _decode(data: bytes, encoding: str = "utf-8-sig") -> str | None:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        return None


def _csv(text: str, sep: str = ",") -> list[list[str]] | None:
    try:
        return list(csv.reader(io.StringIO(text, newline=""), delimiter=sep, strict=True))
    except csv.Error:
        return None


def _number(cell: str) -> float | None:
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


ids = st.sampled_from(["word", "int"])


def _label(style: str, k: int, prefix: str) -> str:
    return f"{prefix}{k}" if style == "word" else str(k)


# ------------------------------------------------------------------ own data: tables
TABLE_NAMES = {",": "table.csv", "\t": "table.tsv"}  # the kinds read both, by extension


def _table_reference(data: bytes, columns: list[str], labels: int, sep: str = ","):
    """The named columns of a header CSV's rows, or None: each row as many fields as the
    header, names unique, no empty label cell (the first ``labels`` columns)."""
    text = _decode(data)
    rows = None if text is None else _csv(text, sep)
    if not rows:
        return None
    header = [h.strip() for h in rows[0]]
    if len(set(header)) != len(header) or not set(columns) <= set(header):
        return None
    body = [r for r in rows[1:] if r]
    if not body or any(len(r) != len(header) for r in body):
        return None
    body = [[r[header.index(c)].strip() for c in columns] for r in body]
    if any(not c for r in body for c in r[:labels]):
        return None
    return body


@st.composite
def facility_tables(draw):
    style = draw(ids)
    pairs = draw(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 8)), min_size=2,
                          max_size=25, unique=True))  # fmt: skip
    rows = [["user", "item", "value"]] + [
        [_label(style, u, "u"), _label(style, i, "i"), str(draw(st.integers(0, 5)))]
        for u, i in pairs
    ]
    return draw(mutate(rows, True, (0, 1)))


def _facility_reference(data: bytes, sep: str = ","):
    body = _table_reference(data, ["user", "item", "value"], 2, sep)
    if body is None:
        return None
    values = [_number(r[2]) for r in body]
    pairs = [(r[0], r[1]) for r in body]
    if any(v is None or v < 0 for v in values) or len(set(pairs)) != len(pairs):
        return None
    return (len({u for u, _ in pairs}), len({i for _, i in pairs}), sum(v > 0 for v in values))


@EXAMPLES
@given(facility_tables(), st.sampled_from([",", "\t"]))
def test_facility_table(case, sep) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        inst = load_facility_table(str(path))
        return (len(inst.users), len(inst.items), int(inst.values.nnz))

    check(render(rows, sep, encoding), TABLE_NAMES[sep], load,
          lambda data: _facility_reference(data, sep), OwnDataError, kind)  # fmt: skip


@st.composite
def pair_tables(draw):
    style = draw(ids)
    pairs = draw(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 8)), min_size=2,
                          max_size=25))  # fmt: skip
    rows = [["user", "item"]] + [[_label(style, u, "u"), _label(style, i, "i")] for u, i in pairs]
    return draw(mutate(rows, True, (0, 1)))


def _pairs_reference(data: bytes, sep: str = ","):
    body = _table_reference(data, ["user", "item"], 2, sep)
    if body is None:
        return None
    pairs = {(r[0], r[1]) for r in body}
    return (len({u for u, _ in pairs}), len({i for _, i in pairs}), len(pairs))


@EXAMPLES
@given(pair_tables(), st.sampled_from([",", "\t"]))
def test_coverage_pairs_table(case, sep) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        inst = load_coverage_sets(str(path))
        return (len(inst.users), len(inst.items), int(inst.values.nnz))

    check(render(rows, sep, encoding), TABLE_NAMES[sep], load,
          lambda data: _pairs_reference(data, sep), OwnDataError, kind)  # fmt: skip


@st.composite
def rating_tables(draw):
    style = draw(ids)
    n = draw(st.integers(2, 30))
    rows = [["user", "movie", "genre", "clicked"]] + [
        [_label(style, draw(st.integers(0, 5)), "u"), _label(style, draw(st.integers(0, 9)), "m"),
         draw(st.sampled_from(["drama", "comedy", "noir"])), draw(st.sampled_from(["0", "1"]))]
        for _ in range(n)
    ]  # fmt: skip
    return draw(mutate(rows, True, (0, 1)))


def _rating_reference(data: bytes, sep: str = ","):
    body = _table_reference(data, ["user", "movie", "genre", "clicked"], 3, sep)
    if body is None or any(r[3] not in ("0", "1", "0.0", "1.0", "False", "True", "false",
                                         "true") for r in body):  # fmt: skip
        return None
    return (1 + len({r[1] for r in body}) + len({r[2] for r in body}), len(body))


@EXAMPLES
@given(rating_tables(), st.sampled_from([",", "\t"]))
def test_rating_table(case, sep) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        task = load_rating_table(str(path), "user,movie,genre,clicked")
        return (task.layout.n_params, int(task.train_y.size + task.test_y.size))

    check(render(rows, sep, encoding), TABLE_NAMES[sep], load,
          lambda data: _rating_reference(data, sep), OwnDataError, kind)  # fmt: skip


# ------------------------------------------------------------------ own data: sets file
@st.composite
def set_files(draw):
    style = draw(ids)
    sets = draw(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=5), min_size=1,
                         max_size=12))  # fmt: skip
    rows = [[_label(style, i, "p") for i in s] for s in sets]
    rows, encoding, kind = draw(mutate(rows, False, ()))
    if kind == "huge":  # relabel items: the sets file's ids are its items
        items = sorted({t for r in rows for t in r})
        relabel = {items[0]: str(HUGE), items[-1]: str(HUGE + 1)}
        rows = [[relabel.get(t, t) for t in r] for r in rows]
    if draw(st.booleans()):
        rows.insert(0, ["#", "my", "sets"])
    return rows, encoding, kind, draw(st.sampled_from([" ", ",", ", ", "\t"]))


def _sets_reference(data: bytes):
    text = _decode(data)
    if text is None:
        return None
    sets, blank = [], False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            continue
        if not line:
            blank = True
            continue
        if blank:
            return None  # a blank line between sets
        tokens = line.replace(",", " ").split()
        if not tokens:
            return None
        sets.append(set(tokens))
    if not sets:
        return None
    return (len(sets), len(set().union(*sets)), sum(len(s) for s in sets))


@EXAMPLES
@given(set_files())
def test_coverage_sets_file(case) -> None:
    rows, encoding, kind, sep = case

    def load(path: Path) -> tuple:
        inst = load_coverage_sets(str(path))
        return (len(inst.users), len(inst.items), int(inst.values.nnz))

    check(render(rows, sep, encoding), "sets.txt", load, _sets_reference, OwnDataError, kind)


# ------------------------------------------------------------------ Sentiment140 CSV
@st.composite
def sentiment140_files(draw):
    n = draw(st.integers(1, 15))
    rows = [
        [draw(st.sampled_from(["0", "4"])), str(1000 + k), "Mon Apr 06 22:19:45 PDT 2009",
         "NO_QUERY", f"acct{draw(st.integers(0, 4))}", f"tweet {k}, great!"]
        for k in range(n)
    ]  # fmt: skip
    rows, encoding, kind = draw(mutate(rows, False, (4,)))
    return rows, "latin-1" if encoding == "utf-8" else encoding, kind


def _bom_or(data: bytes, encoding: str) -> str | None:
    """A latin-1 format's text: UTF-8 when the file starts with a byte-order mark."""
    return _decode(data[3:], "utf-8") if data.startswith(b"\xef\xbb\xbf") else data.decode(encoding)


def _sentiment140_reference(data: bytes):
    text = _bom_or(data, "latin-1")
    rows = None if text is None else _csv(text)
    if rows is None or any("\0" in c for r in rows for c in r):
        return None
    rows = [r for r in rows if r]
    if any(len(r) != 6 or r[0].strip() not in ("0", "4") for r in rows):
        return None
    return (len(rows), len({r[4] for r in rows}))


@EXAMPLES
@given(sentiment140_files())
def test_sentiment140_csv(case) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        tweets = list(read_sentiment140_csv(path))
        return (len(tweets), len({t.user for t in tweets}))

    data = render(rows, ",", encoding, quote=True)
    check(data, "s140.csv", load, _sentiment140_reference, ValueError, kind)


# ------------------------------------------------------------------ LEAF JSON
LEAF_KINDS = ["none", "drop", "dup", "short", "twice", "unlisted", "extra", "bool", "dupkey",
              "huge", "pretty", "latin-1", "utf-16", "bom"]  # fmt: skip


@st.composite
def leaf_files(draw):
    n_users = draw(st.integers(1, 4))
    users = [f"acct{u}" for u in range(n_users)]
    data = {"users": users, "num_samples": [], "user_data": {}}
    for u in users:
        k = draw(st.integers(1, 4))
        data["user_data"][u] = {
            "x": [[str(j), "Mon Apr 06 2009", "NO_QUERY", u, f"tweet {j} café"] for j in range(k)],
            "y": [draw(st.integers(0, 1)) for _ in range(k)],
        }
        data["num_samples"].append(k)
    kind = draw(st.sampled_from(LEAF_KINDS))
    first = data["user_data"][users[0]]
    valid = kind in ("none", "huge", "pretty", "bom")  # a byte-order mark is dropped
    if kind == "drop":
        first["x"][0] = first["x"][0][:4]
    elif kind == "dup":
        first["x"][0].insert(4, first["x"][0][4])
    elif kind == "short":
        data["num_samples"] = data["num_samples"][:-1]
    elif kind == "twice":
        data["users"] = users + [users[0]]
        data["num_samples"] = data["num_samples"] + [data["num_samples"][0]]
    elif kind == "unlisted":
        data["users"], data["num_samples"] = users[1:], data["num_samples"][1:]
    elif kind == "extra":
        data["user_data"]["ghost"] = {"x": [["1", "d", "q", "ghost", "boo"]], "y": [1]}
    elif kind == "bool":
        first["y"][0] = True
    elif kind == "huge":
        big = {u: str(HUGE + k) for k, u in enumerate(users)}
        data = {"users": [big[u] for u in users], "num_samples": data["num_samples"],
                "user_data": {big[u]: v for u, v in data["user_data"].items()}}  # fmt: skip
    text = json.dumps(data, ensure_ascii=False, indent=1 if kind == "pretty" else None)
    if kind == "dupkey":  # the first user's entry given twice in user_data
        block = json.dumps(data["user_data"][users[0]], ensure_ascii=False)
        text = text.replace('"user_data": {', f'"user_data": {{"{users[0]}": {block}, ', 1)
        valid = False
    encoded = {"latin-1": text.encode("latin-1"), "utf-16": text.encode("utf-16"),
               "bom": text.encode("utf-8-sig")}.get(kind, text.encode())  # fmt: skip
    expected = None
    if valid:
        expected = (sum(data["num_samples"]), len(data["users"]))
    return encoded, kind, expected


@EXAMPLES
@given(leaf_files())
def test_leaf_json(case) -> None:
    data, kind, expected = case

    def load(path: Path) -> tuple:
        tweets = list(read_leaf_json(path))
        return (len(tweets), len({t.user for t in tweets}))

    check(data, "all_data_0.json", load, lambda _: expected, ValueError, kind)


# ------------------------------------------------------------------ Amazon
HEADERS = [None, ["uid", "item", "rating", "time"], ["userId", "productId", "Rating", "Timestamp"],
           ["USERID", "PRODUCTID", "RATING", "TIMESTAMP"]]  # fmt: skip


@st.composite
def amazon_csvs(draw):
    style = draw(ids)
    n = draw(st.integers(1, 20))
    rows = [[_label(style, draw(st.integers(0, 5)), "A"), _label(style, draw(st.integers(0, 9)),
             "B00"), f"{draw(st.integers(1, 5))}.0", str(1_300_000_000 + k)]
            for k in range(n)]  # fmt: skip
    header = draw(st.sampled_from(HEADERS))
    rows = ([header] if header else []) + rows
    return draw(mutate(rows, header is not None, (0, 1)))


_HEADER_NAMES = [{"uid", "user", "userid", "user_id", "reviewerid"},
                 {"item", "itemid", "item_id", "productid", "product_id", "asin"},
                 {"rating", "overall", "score"},
                 {"time", "timestamp", "unixreviewtime", "unix_time"}]  # fmt: skip


def _amazon_reference(data: bytes):
    text = _decode(data, "utf-8-sig")  # a byte-order mark is not part of the first user id
    rows = None if text is None else _csv(text)
    if rows is None:
        return None
    if rows and len(rows[0]) == 4 and all(c.strip().lower() in names
                                          for c, names in zip(rows[0], _HEADER_NAMES,
                                                              strict=True)):  # fmt: skip
        rows = rows[1:]
    rows = [r for r in rows if r]
    for r in rows:
        rating, time = (_number(r[2]), _number(r[3])) if len(r) == 4 else (None, None)
        if (len(r) != 4 or not r[0].strip() or not r[1].strip() or rating is None
                or not 1 <= rating <= 5 or time is None or not time.is_integer()):  # fmt: skip
            return None
    return (len(rows), len({r[0].strip() for r in rows}), len({r[1].strip() for r in rows}))


@EXAMPLES
@given(amazon_csvs())
def test_amazon_ratings_csv(case) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        got = list(read_rating_only_csv(path))
        return (len(got), len({r.user for r in got}), len({r.item for r in got}))

    check(render(rows, ",", encoding), "ratings_Electronics.csv", load, _amazon_reference,
          ValueError, kind)  # fmt: skip


@st.composite
def amazon_reviews(draw):
    n = draw(st.integers(1, 12))
    lines = [{"reviewerID": f"A{draw(st.integers(0, 4))}", "asin": f"B{draw(st.integers(0, 6))}",
              "overall": float(draw(st.integers(1, 5))), "unixReviewTime": 1_300_000_000 + k}
             for k in range(n)]  # fmt: skip
    kind = draw(st.sampled_from(["none", "drop", "dupkey", "blank", "empty", "bom", "null-id",
                                 "bool-id", "list-id", "bool-rating", "text-rating", "null-time",
                                 "bool-time", "float-time", "gzip", "gzip-cut"]))  # fmt: skip
    texts = [json.dumps(obj) for obj in lines]
    i = draw(st.integers(0, n - 1))
    key = draw(st.sampled_from(["reviewerID", "asin"]))
    wrong = {"null-id": (key, None), "bool-id": (key, True), "list-id": (key, ["A1"]),
             "bool-rating": ("overall", True), "text-rating": ("overall", "5.0"),
             "null-time": ("unixReviewTime", None), "bool-time": ("unixReviewTime", True),
             "float-time": ("unixReviewTime", 1.3e9 + 0.5)}  # fmt: skip
    if kind == "drop":
        texts[i] = json.dumps({k: v for k, v in lines[i].items() if k != "asin"})
    elif kind == "dupkey":  # the item given twice, the second different: which one?
        texts[i] = texts[i][:-1] + ', "asin": "OTHER"}'
    elif kind == "blank":
        texts.insert(i, "")
    elif kind == "empty":
        texts[i] = json.dumps({**lines[i], "reviewerID": ""})
    elif kind in wrong:  # null, true, text where an id or a number belongs: refused
        texts[i] = json.dumps({**lines[i], wrong[kind][0]: wrong[kind][1]})
    expected = None
    if kind in ("none", "blank", "bom", "gzip"):
        expected = (n, len({o["reviewerID"] for o in lines}), len({o["asin"] for o in lines}))
    data = ("\n".join(texts) + "\n").encode("utf-8-sig" if kind == "bom" else "utf-8")
    if kind in ("gzip", "gzip-cut"):
        data = gzip.compress(data)
        data = data[: draw(st.integers(10, len(data) - 1))] if kind == "gzip-cut" else data
    return data, kind, expected


@EXAMPLES
@given(amazon_reviews())
def test_amazon_reviews_json_lines(case) -> None:
    data, kind, expected = case

    def load(path: Path) -> tuple:
        got = list(read_reviews_json(path))
        return (len(got), len({r.user for r in got}), len({r.item for r in got}))

    check(data, "reviews_Electronics_5.json", load, lambda _: expected, ValueError, kind)


# ------------------------------------------------------------------ MovieLens-1M
_INT = re.compile(r"-?\d+")


@st.composite
def movielens_ratings(draw):
    pairs = draw(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 8)), min_size=1,
                          max_size=25, unique=True))  # fmt: skip
    rows = [[str(u), str(m), str(draw(st.integers(1, 5))), str(978300760 + k)]
            for k, (u, m) in enumerate(pairs)]  # fmt: skip
    rows, encoding, kind = draw(mutate(rows, False, (0, 1)))
    return rows, "latin-1" if encoding in ("utf-8", "utf-16") else encoding, kind


def _movielens_reference(data: bytes):
    text = _bom_or(data, "latin-1")
    if text is None:
        return None
    rows = [line.rstrip("\r").split("::") for line in text.split("\n")]
    rows = [r for r in rows if r != [""]]
    if not rows:
        return None
    for r in rows:
        if len(r) != 4 or not all(_INT.fullmatch(c.strip()) for c in r):
            return None
        u, m, rating = int(r[0]), int(r[1]), int(r[2])
        if not (1 <= u <= 6 and 1 <= m <= 8 and 1 <= rating <= 5):
            return None  # users.dat / movies.dat list 1..6 and 1..8
    pairs = [(int(r[0]), int(r[1])) for r in rows]
    if len(set(pairs)) != len(pairs):
        return None
    return (len(rows), len({u for u, _ in pairs}), len({m for _, m in pairs}))


@EXAMPLES
@given(movielens_ratings())
def test_movielens_ratings_dat(case) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        folder = path.parent
        (folder / "users.dat").write_text("".join(f"{u}::F::25::1::1234\n" for u in range(1, 7)))
        (folder / "movies.dat").write_text(
            "".join(f"{m}::Film {m} (1999)::Drama\n" for m in range(1, 9))
        )
        ratings = load_movielens_1m(folder.parent, download=False).ratings
        return (len(ratings), ratings["user_id"].nunique(), ratings["movie_id"].nunique())

    def loaded(path: Path) -> tuple:
        (path.parent / "ml-1m").mkdir()
        target = path.parent / "ml-1m" / "ratings.dat"
        target.write_bytes(path.read_bytes())
        return load(target)

    data = b"".join(("::".join(r) + "\n").encode("latin-1") for r in rows)
    if encoding == "crlf":
        data = data.replace(b"\n", b"\r\n")
    elif encoding == "utf-8-sig":  # saved again by an editor that writes a byte-order mark
        data = data.decode("latin-1").encode("utf-8-sig")
    check(data, "ratings.dat", loaded, _movielens_reference, DataFormatError, kind)


# ------------------------------------------------------------------ node files
@st.composite
def group_files(draw):
    m = draw(st.integers(1, 12))
    rows = [["element", "group"]] + [[str(e), draw(st.sampled_from(["a", "b", "c"]))]
                                     for e in draw(st.permutations(range(m)))]  # fmt: skip
    return draw(mutate(rows, True, ()))


def _groups_reference(data: bytes):
    text = _decode(data, "utf-8-sig")
    rows = None if text is None else _csv(text)
    if not rows or [c.strip() for c in rows[0]] != ["element", "group"]:
        return None
    body = rows[1:]
    if any(len(r) != 2 or not _INT.fullmatch(r[0].strip()) for r in body):
        return None
    elements = sorted(int(r[0]) for r in body)
    if elements != list(range(len(body))):
        return None
    return (len(body), len({r[1] for r in body}))


@EXAMPLES
@given(group_files())
def test_element_groups_csv(case) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        groups = read_groups(path)
        return (len(groups), len(set(groups.tolist())))

    check(render(rows, ",", encoding), "element-groups.csv", load, _groups_reference,
          NodeDataError, kind)  # fmt: skip


@EXAMPLES
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.sampled_from(["none", "truncate", "append", "dims", "type", "gzip-cut"]),
)
def test_idx_file(shape, kind) -> None:
    array = np.arange(int(np.prod(shape)), dtype=np.uint8).reshape(shape)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_idx(Path(tmp) / "x-idx3-ubyte", array, compress=kind == "gzip-cut")
        data = path.read_bytes()
        data = {"truncate": data[:-1], "append": data + b"\0", "gzip-cut": data[:-4],
                "dims": data[:3] + bytes([data[3] + 1]) + data[4:],
                "type": data[:2] + b"\x09" + data[3:]}.get(kind, data)  # fmt: skip
        path.write_bytes(data)
        if kind == "none":
            assert read_idx(path).shape == tuple(shape)
        else:
            with pytest.raises(DataFormatError, match="x-idx3-ubyte"):
                read_idx(path)


# ------------------------------------------------------------------ DBLP dblp.xml
DBLP_DTD = """<!ELEMENT dblp (article|inproceedings|proceedings|book|incollection|
                phdthesis|mastersthesis|www|person|data)*>
<!ENTITY uuml   "&#252;" >
<!ENTITY eacute "&#233;" >
"""
# (as written in the XML, as read) -- DBLP writes non-ASCII letters as DTD entities
DBLP_NAMES = [("Alice Smith", "Alice Smith"), ("Bob Jones 0001", "Bob Jones 0001"),
              ("J&uuml;rgen Schmidt", "Jürgen Schmidt"), ("Ren&eacute; Roy", "René Roy"),
              ("Carol White", "Carol White")]  # fmt: skip
DBLP_VENUES = ["conf/icml", "journals/tit", "series/lncs", "journals/corr"]
DBLP_TAGS = ["article", "inproceedings", "incollection", "proceedings", "phdthesis", "www"]
DBLP_KINDS = ["none", "noyear", "emptyyear", "badyear", "hugeyear", "twoyears", "dupauthor",
              "spaceauthor", "emptyauthor", "noauthor", "editor", "nokey", "emptykey",
              "shortkey", "homepage", "duprecord", "nested", "entity", "dtd", "truncate",
              "encoding", "comment", "cdata"]  # fmt: skip
DBLP_ENCODINGS = ["utf-8", "latin-1", "utf-8-in-latin-1", "latin-1-in-utf-8", "utf-16",
                  "no-declaration", "bom-latin-1"]  # fmt: skip


def _draw_records(draw) -> list[dict]:
    records = []
    for k in range(draw(st.integers(1, 8))):
        venue = draw(st.sampled_from(DBLP_VENUES))
        names = draw(st.lists(st.integers(0, len(DBLP_NAMES) - 1), min_size=1, max_size=3,
                              unique=True))  # fmt: skip
        records.append({
            "tag": draw(st.sampled_from(DBLP_TAGS)), "key": f"{venue}/K{k}",
            "authors": [DBLP_NAMES[i][0] for i in names], "editors": [],
            "years": [str(draw(st.integers(2016, 2023)))], "inner": None, "cdata": False,
        })  # fmt: skip
    return records


@st.composite
def dblp_files(draw):
    """A small dblp.xml as a list of records (dicts), one mutation, the file's bytes."""
    records = _draw_records(draw)
    kind = draw(st.sampled_from(DBLP_KINDS))
    r = records[draw(st.integers(0, len(records) - 1))]
    dtd, encoding, cut = DBLP_DTD, "latin-1", None
    if kind in ("noyear", "emptyyear"):
        r["years"] = [] if kind == "noyear" else [""]
    elif kind == "badyear":
        arabic = "&#x662;&#x660;&#x661;&#x669;"  # 2019 in Arabic-Indic digits: int() reads it
        r["years"] = [draw(st.sampled_from(["20l9", "2_019", "+2019", "2019.0", arabic, "-1"]))]
    elif kind == "hugeyear":
        r["years"] = [str(HUGE)]
    elif kind == "twoyears":
        r["years"] = r["years"] + [draw(st.sampled_from([r["years"][0], "2017", "2020"]))]
    elif kind == "dupauthor":
        r["authors"] = r["authors"] + [r["authors"][0]]
    elif kind == "spaceauthor":
        r["authors"][0] = f"  {r['authors'][0]}\n"
    elif kind == "emptyauthor":
        r["authors"] = r["authors"] + [draw(st.sampled_from(["", "  "]))]
    elif kind == "noauthor":
        r["authors"] = []
    elif kind == "editor":
        r["editors"], r["authors"] = r["authors"], []
    elif kind == "nokey":
        r["key"] = draw(st.sampled_from([None, "", " "]))
    elif kind == "emptykey":
        r["key"] = draw(st.sampled_from(["conf//K", "/icml/K", "//K"]))
    elif kind == "shortkey":
        r["key"] = draw(st.sampled_from(["dblpnote/error", "conf", "journals/tit"]))
    elif kind == "homepage":
        r["key"] = "homepages/12/345"
    elif kind == "duprecord":
        records.append(dict(r))
    elif kind == "nested":  # a record inside another one
        inner = dict(r, inner=None, key=f"{r['key']}x")
        outer = records[draw(st.integers(0, len(records) - 1))]
        outer["inner"] = inner
    elif kind == "entity":  # not defined in the DTD
        r["authors"] = r["authors"] + ["Bj&oslash;rn Borg"]
    elif kind == "dtd":  # the DTD lacks one of the entities
        dtd = DBLP_DTD.replace(
            draw(st.sampled_from(['<!ENTITY uuml   "&#252;" >\n', '<!ENTITY eacute "&#233;" >\n'])),
            "",
        )
    elif kind == "encoding":
        encoding = draw(st.sampled_from(DBLP_ENCODINGS))
    cdata = kind == "cdata"
    text = _dblp_text(records, encoding, cdata, kind == "comment")
    data = _dblp_bytes(text, encoding)
    if kind == "truncate":  # cut before the end of </dblp>
        cut = draw(st.integers(0, data.rindex(b"</dblp>") + 6))
        data = data[:cut]
    return records, kind, encoding, dtd, data, draw(st.booleans())


def _dblp_record(r: dict, cdata: bool) -> str:
    key = "" if r["key"] is None else f' key="{r["key"]}"'
    wrap = (lambda s: f"<![CDATA[{s}]]>" if "&" not in s else s) if cdata else (lambda s: s)
    lines = [f'<{r["tag"]} mdate="2022-01-01"{key}>']
    lines += [f"<author>{wrap(a)}</author>" for a in r["authors"]]
    lines += [f"<editor>{e}</editor>" for e in r["editors"]]
    lines += ["<title>A <i>title</i>.</title>"]
    lines += [f"<year>{y}</year>" for y in r["years"]]
    if r["inner"] is not None:
        lines.append(_dblp_record(r["inner"], cdata))
    lines.append(f"</{r['tag']}>")
    return "\n".join(lines)


def _dblp_text(records: list[dict], encoding: str, cdata: bool, comment: bool) -> str:
    body = "\n".join(_dblp_record(r, cdata) for r in records)
    if comment:
        body = "<!-- a comment -->\n<?pi data?>\n" + body
    if encoding != "latin-1":  # non-ASCII names written as characters, not entities
        body = body.replace("&uuml;", "ü").replace("&eacute;", "é")
    declared = {"utf-8": "UTF-8", "latin-1-in-utf-8": "UTF-8", "utf-16": "UTF-16"}.get(
        encoding, "ISO-8859-1"
    )
    head = "" if encoding == "no-declaration" else (
        f'<?xml version="1.0" encoding="{declared}"?>\n')  # fmt: skip
    return f'{head}<!DOCTYPE dblp SYSTEM "dblp.dtd">\n<dblp>\n{body}\n</dblp>\n'


def _dblp_bytes(text: str, encoding: str) -> bytes:
    codec = {"utf-8": "utf-8", "utf-8-in-latin-1": "utf-8", "no-declaration": "utf-8",
             "utf-16": "utf-16", "latin-1": "latin-1", "latin-1-in-utf-8": "latin-1",
             "bom-latin-1": "latin-1"}[encoding]  # fmt: skip
    data = text.encode(codec)
    return b"\xef\xbb\xbf" + data if encoding == "bom-latin-1" else data


def _dblp_reference(records, kind, encoding, dtd, data) -> set[tuple[str, str]] | None:
    """The (researcher, venue) pairs the module docstring's rules give, or None (refused)."""
    if kind == "truncate" or (kind == "nested"):
        return None
    non_ascii = not data.isascii()
    if encoding in ("utf-8-in-latin-1", "latin-1-in-utf-8") and non_ascii:
        return None  # the bytes contradict the declared encoding
    if encoding == "bom-latin-1":
        return None  # a UTF-8 byte-order mark in a file declared ISO-8859-1
    used = {e for r in records for a in r["authors"] + r["editors"]
            for e in re.findall(r"&(\w+);", a)}  # fmt: skip
    if not used <= set(re.findall(r"<!ENTITY (\w+)", dtd)):
        return None
    decoded = dict(DBLP_NAMES)
    pairs = set()
    for r in records:
        if r["tag"] not in ("article", "inproceedings", "incollection"):
            continue
        key = r["key"]
        if key is None or not key.strip():
            return None
        parts = key.split("/")
        if key.startswith("homepages/") or len(parts) < 3:
            continue
        if not parts[0] or not parts[1]:
            return None
        years = {y.strip() for y in r["years"] if y.strip()}
        if any(not re.fullmatch("[0-9]+", y) for y in years) or len(years) > 1:
            return None
        if not years or not 2018 <= int(years.pop()) <= 2021:
            continue
        for a in r["authors"]:
            name = decoded.get(a.strip(), a.strip())
            if name:
                pairs.add((name, f"{parts[0]}/{parts[1]}"))
    return pairs


def _write_dblp_case(folder: Path, data: bytes, dtd: str, gz: bool) -> Path:
    (folder / "dblp").mkdir(parents=True, exist_ok=True)
    (folder / "dblp" / "dblp.dtd").write_text(dtd, encoding="latin-1")
    xml = folder / "dblp" / ("dblp.xml.gz" if gz else "dblp.xml")
    xml.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return xml


def _dblp_pairs(vs) -> set[tuple[str, str]]:
    coo = vs.matrix.tocoo()
    names, venues = vs.researchers.tolist(), vs.venues.tolist()
    assert sorted(set(names)) == names and sorted(set(venues)) == venues
    assert (np.diff(vs.matrix.indptr) > 0).all(), "a researcher without venues"
    assert (np.bincount(vs.matrix.indices, minlength=len(venues)) > 0).all(), "an empty venue"
    return {(names[i], venues[j]) for i, j in zip(coo.row, coo.col, strict=True)}


@EXAMPLES
@given(dblp_files())
def test_dblp_xml(case) -> None:
    records, kind, encoding, dtd, data, gz = case
    expected = _dblp_reference(records, kind, encoding, dtd, data)
    with tempfile.TemporaryDirectory() as tmp:
        xml = _write_dblp_case(Path(tmp), data, dtd, gz)
        try:
            got = _dblp_pairs(load_dblp_venue_sets(tmp, cache=False))
        except DataFormatError as err:
            assert err.path.name in (xml.name, "dblp.dtd"), err  # the file is named
            assert err.line_number is not None or (gz and kind == "truncate") or not data, err
            assert expected is None, f"{kind}/{encoding}: refused a valid file: {err}"
            return
    assert expected is not None, f"{kind}/{encoding}: read {got} where the rules refuse the file"
    assert got == expected, f"{kind}/{encoding}: read {got}, the file holds {expected}"


CACHE_KINDS = ["none", "truncate", "flip", "garbage", "empty", "other-years", "other-file",
               "old-version", "drop-array", "index-range", "unsorted-names",
               "empty-venue"]  # fmt: skip


@st.composite
def dblp_caches(draw):
    records = _draw_records(draw)
    data = _dblp_bytes(_dblp_text(records, "latin-1", False, False), "latin-1")
    kind = draw(st.sampled_from(CACHE_KINDS))
    return records, data, draw(st.booleans()), kind, draw(st.randoms())


def _resave(path: Path, change: Callable[[dict], None]) -> None:
    """Rewrite the cache .npz with some arrays changed (a well-formed file, wrong content)."""
    with np.load(path) as stored:
        arrays = {k: stored[k] for k in stored.files}
    change(arrays)
    mtime = path.stat().st_mtime_ns
    with open(path, "wb") as out:
        np.savez_compressed(out, **arrays)
    os.utime(path, ns=(mtime, mtime))


def _add_empty_venue(arrays: dict) -> None:
    arrays["shape"] = arrays["shape"] + [0, 1]
    arrays["venues"] = np.append(arrays["venues"], np.frombuffer(b"z/z", dtype=np.uint8))
    arrays["venue_ends"] = np.append(arrays["venue_ends"], arrays["venue_ends"][-1:] + 3)


def _other_file(data: bytes) -> bytes:
    """The same bytes but one letter of one author's name: same size, other researchers."""
    at = data.index(b"<author>") + len(b"<author>")
    return data[:at] + (b"Q" if data[at : at + 1] != b"Q" else b"R") + data[at + 1 :]


@settings(max_examples=20)
@given(dblp_caches())
def test_dblp_cache(case) -> None:
    """A cache that does not match its dblp.xml (damaged, other file or years, older layout,
    inconsistent arrays) is rebuilt from the XML: the result is always the XML's."""
    records, data, gz, kind, rnd = case
    if kind == "other-file" and b"<author>" not in data:
        kind = "none"
    with tempfile.TemporaryDirectory() as tmp:
        xml = _write_dblp_case(Path(tmp), data, DBLP_DTD, gz)
        cache = xml.parent / "cache" / "venue-sets-2018-2021.npz"
        load_dblp_venue_sets(tmp)
        assert cache.is_file()
        before = xml.stat().st_mtime_ns
        blob = cache.read_bytes()
        if kind == "truncate":
            cache.write_bytes(blob[: rnd.randrange(len(blob))])
        elif kind == "flip":
            at = rnd.randrange(len(blob))
            cache.write_bytes(blob[:at] + bytes([blob[at] ^ 0xFF]) + blob[at + 1 :])
        elif kind == "garbage":
            cache.write_bytes(rnd.randbytes(rnd.randrange(1, 600)))
        elif kind == "empty":
            cache.write_bytes(b"")
        elif kind == "other-years":  # another window's cache under this name
            load_dblp_venue_sets(tmp, years=(2016, 2023))
            (xml.parent / "cache" / "venue-sets-2016-2023.npz").replace(cache)
        elif kind == "other-file":  # dblp.xml replaced by one of the same size and mtime
            new = _other_file(data)
            xml.write_bytes(gzip.compress(new, mtime=0) if gz else new)
            os.utime(xml, ns=(before, before))
            data = new
        elif kind == "old-version":
            _resave(cache, lambda a: a.update(version=np.int64(1)))
        elif kind == "drop-array":
            drop = rnd.choice(["indptr", "indices", "researchers", "venue_ends", "shape"])
            _resave(cache, lambda a: a.pop(drop))
        elif kind == "index-range":
            _resave(cache, lambda a: a.update(indices=a["indices"] + a["shape"][1]))
        elif kind == "unsorted-names":
            _resave(cache, lambda a: a.update(researcher_ends=a["researcher_ends"][::-1]))
        elif kind == "empty-venue":  # a venue "z/z" no researcher published in
            _resave(cache, _add_empty_venue)
        expected = _dblp_pairs(load_dblp_venue_sets(tmp, cache=False))
        if kind != "other-file":
            assert expected == _dblp_reference(records, "none", "latin-1", DBLP_DTD, data)
        assert _dblp_pairs(load_dblp_venue_sets(tmp)) == expected, kind
        assert _dblp_pairs(load_dblp_venue_sets(tmp)) == expected, f"{kind}: rewritten cache"


# ------------------------------------------------------------------ own images (.npz)
NPZ_KINDS = ["none", "compressed", "drop", "rename", "extra", "y-short", "y-2d", "y-float",
             "y-bool", "y-negative", "y-huge", "y-one-class", "x-over", "x-nan", "x-int16",
             "x-int64", "x-bigendian", "x-ndim", "x-width0", "x-none", "client-short",
             "client-float", "client-single", "client-huge", "client-negative",
             "client-big-ids", "object", "truncate", "flip", "empty", "npy"]  # fmt: skip


@st.composite
def npz_files(draw):
    """Valid image-clients arrays (each client >= 2 images), then one mutation."""
    k = draw(st.integers(0, 3))  # clients (0: no client array)
    n = draw(st.integers(4, 12)) if k == 0 else 2 * k + draw(st.integers(0, 4))
    shape = (n, *draw(st.sampled_from([(3,), (2, 3), (4, 1)])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pixels = rng.integers(0, 256, shape).astype(np.uint8)
    style = draw(st.sampled_from(["uint8", "k/255 float32", "k/255 float64", "any float"]))
    x = {"uint8": pixels, "k/255 float32": pixels.astype(np.float32) / np.float32(255),
         "k/255 float64": pixels / 255.0, "any float": rng.random(shape)}[style]  # fmt: skip
    y = np.concatenate([[0, 1], rng.integers(0, 4, n - 2)]).astype(np.int64)
    arrays = {"x": x, "y": y}
    if k:
        arrays["client"] = np.concatenate([np.repeat(np.arange(k), 2),
                                           rng.integers(0, k, n - 2 * k)])  # fmt: skip
    kind = draw(st.sampled_from(NPZ_KINDS))
    change = {
        "drop": lambda a: a.pop(draw(st.sampled_from(sorted(a)))),
        "rename": lambda a: a.update(
            {
                draw(st.sampled_from(["clients", "X", "labels"])): a.pop(
                    draw(st.sampled_from(sorted(a)))
                )
            }
        ),
        "extra": lambda a: a.update(meta=np.arange(3)),
        "y-short": lambda a: a.update(y=a["y"][:-1]),
        "y-2d": lambda a: a.update(y=a["y"][:, None]),
        "y-float": lambda a: a.update(y=a["y"].astype(float)),
        "y-bool": lambda a: a.update(y=a["y"] > 0),
        "y-negative": lambda a: a["y"].__setitem__(-1, -1),
        "y-huge": lambda a: a.update(y=a["y"].astype(np.uint64) + np.uint64(2**64 - 5)),
        "y-one-class": lambda a: a.update(y=np.zeros(n, np.int64)),
        "x-over": lambda a: a.update(
            x=a["x"] * 1.5 + 0.01 if a["x"].dtype.kind == "f" else a["x"].astype(np.int16) + 1
        ),
        "x-nan": lambda a: a.update(
            x=np.where(np.arange(a["x"].size).reshape(shape) == 0, np.nan, a["x"] / 255.0)
        ),
        "x-int16": lambda a: a.update(
            x=(a["x"] * (255 if a["x"].dtype.kind == "f" else 1)).astype(np.int16)
        ),
        "x-int64": lambda a: a.update(
            x=(a["x"] * (255 if a["x"].dtype.kind == "f" else 1)).astype(np.int64)
        ),
        "x-bigendian": lambda a: a.update(x=a["x"].astype(a["x"].dtype.newbyteorder(">"))),
        "x-ndim": lambda a: a.update(
            x=draw(st.sampled_from([a["x"].reshape(n, 1, 1, -1), a["x"].reshape(-1)]))
        ),
        "x-width0": lambda a: a.update(x=np.zeros((n, 0), np.uint8)),
        "x-none": lambda a: a.update(x=np.zeros((0, 3), np.uint8), y=np.zeros(0, np.int64)),
        "client-short": lambda a: a.update(client=np.zeros(n - 1, np.int64)),
        "client-float": lambda a: a.update(client=np.zeros(n) + 0.5),
        "client-single": lambda a: a.update(client=np.arange(n)),
        "client-huge": lambda a: a.update(
            client=np.repeat(np.array([2**64 - 1, 3], np.uint64), [2, n - 2])
        ),
        "client-negative": lambda a: a.update(client=np.repeat([-1, 3], [2, n - 2])),
        "client-big-ids": lambda a: a.update(client=np.repeat([2**62, 2**62 + 1], [2, n - 2])),
    }
    if kind in change:
        change[kind](arrays)
    return arrays, kind, draw(st.randoms())


def _npz_reference(arrays: dict, kind: str):
    """(N, D, C, client sizes in sorted id order) the documented format gives, or None."""
    if kind in ("object", "truncate", "flip", "empty", "npy"):
        return None  # not an .npz of named numeric arrays
    if {"x", "y"} - set(arrays) or set(arrays) - {"x", "y", "client"}:
        return None
    x, y = arrays["x"], arrays["y"]
    if x.ndim not in (2, 3) or x.size == 0:
        return None
    if x.dtype.kind == "f":  # 8-bit pixels saved as floats k/255, nothing else: no rounding
        if not np.isfinite(x).all() or x.min() < 0 or x.max() > 1:
            return None
        if np.abs(x * 255.0 - np.rint(x * 255.0)).max() > 1e-3:
            return None
    elif x.dtype.kind not in "iu" or x.min() < 0 or x.max() > 255:
        return None
    n = x.shape[0]
    for name in ("y", "client"):
        a = arrays.get(name, np.zeros(n, np.int64))
        if a.shape != (n,) or a.dtype.kind not in "iu" or any(int(v) < 0 or int(v) >= 2**63
                                                              for v in a):  # fmt: skip
            return None
    if int(y.max()) + 1 < 2:
        return None
    sizes = ()
    if "client" in arrays:
        ids = [int(v) for v in arrays["client"]]
        sizes = tuple(ids.count(u) for u in sorted(set(ids)))
        if min(sizes) < 2:
            return None
    return (n, int(np.prod(x.shape[1:])), int(y.max()) + 1, sizes, tuple(int(v) for v in y))


@EXAMPLES
@given(npz_files())
def test_own_images_npz(case) -> None:
    arrays, kind, rnd = case
    expected = _npz_reference(arrays, kind)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shop-images.npz"
        save = np.savez_compressed if kind == "compressed" else np.savez
        if kind == "object":
            np.savez(path, x=np.array([arrays["x"][0], "a"], dtype=object), y=arrays["y"])
        elif kind == "npy":
            with open(path, "wb") as out:
                np.save(out, arrays["x"])
        else:
            save(path, **arrays)
        blob = path.read_bytes()
        if kind == "truncate":
            path.write_bytes(blob[: rnd.randrange(len(blob))])
        elif kind == "flip":  # a byte of an array's data: the zip's CRC-32 no longer matches
            at = blob.index(b"PK\x01\x02") - 1 - rnd.randrange(8)
            path.write_bytes(blob[:at] + bytes([blob[at] ^ 0x5A]) + blob[at + 1 :])
        elif kind == "empty":
            path.write_bytes(b"")
        try:
            got = load_image_clients.__wrapped__(str(path))
        except OwnDataError as err:
            assert str(path) in str(err), err  # the file is named
            assert expected is None, f"{kind}: refused a valid file: {err}"
            return
    assert expected is not None, f"{kind}: read a file the format refuses"
    sizes = tuple(np.bincount(got.clients).tolist()) if got.clients is not None else ()
    assert got.n_clients == len(sizes)
    images = got.data.images
    assert (images.shape[0], images.shape[1], got.data.n_classes, sizes,
            tuple(got.data.labels.tolist())) == expected, kind  # fmt: skip
    x = arrays["x"]
    if kind == "none":  # the pixels as written: uint8 as they are, k/255 floats as k
        written = np.rint(x * 255.0) if x.dtype.kind == "f" else x
        assert np.array_equal(images, written.reshape(len(images), -1).astype(np.uint8))


# ------------------------------------------------------------------ own images (IDX pair)
IDX_PAIR_KINDS = ["none", "gz", "labels-missing", "labels-gz-only", "labels-short",
                  "labels-long", "labels-2d", "images-1d", "images-4d", "images-2d",
                  "images-empty", "one-class", "no-images-in-name", "labels-cut"]  # fmt: skip


@EXAMPLES
@given(
    st.integers(2, 9),
    st.sampled_from([(2, 3), (1, 4)]),
    st.sampled_from(IDX_PAIR_KINDS),
    st.integers(0, 2**32 - 1),
)
def test_own_images_idx_pair(n, hw, kind, seed) -> None:
    """An IDX images file and the labels file beside it: read as they are (N images of
    H*W pixels, labels 0..C-1) or refused naming one of the two files."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, *hw))
    y = np.concatenate([[0, 1], rng.integers(0, 3, n - 2)])
    expected = (n, hw[0] * hw[1], int(y.max()) + 1, tuple(y.tolist()))
    images_name, labels_name = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"
    if kind == "labels-short":
        y, expected = y[:-1], None
    elif kind == "labels-long":
        y, expected = np.append(y, 1), None
    elif kind == "labels-2d":
        y, expected = y[:, None], None
    elif kind == "images-1d":
        x, expected = x.reshape(-1), None
    elif kind == "images-4d":
        x, expected = x[..., None], None
    elif kind == "images-2d":  # (N, D): read as N images of D pixels
        x = x.reshape(n, -1)
    elif kind == "images-empty":
        x, y, expected = x[:0], y[:0], None
    elif kind == "one-class":
        y, expected = np.zeros_like(y), None
    elif kind == "no-images-in-name":
        images_name, expected = "t10k-pictures-idx3-ubyte", None
    elif kind in ("labels-missing", "labels-gz-only", "labels-cut"):
        expected = None
    gz = kind == "gz"
    with tempfile.TemporaryDirectory() as tmp:
        suffix = ".gz" if gz else ""
        images = write_idx(Path(tmp) / f"{images_name}{suffix}", x, compress=gz)
        labels = Path(tmp) / f"{labels_name}{suffix}"
        if kind == "labels-gz-only":  # only labels.gz beside plain images: not the pair's name
            labels = labels.with_name(labels.name + ".gz")
        if kind != "labels-missing":
            write_idx(labels, y, compress=gz or kind == "labels-gz-only")
        if kind == "labels-cut":
            labels.write_bytes(labels.read_bytes()[:-1])
        try:
            got = load_image_clients.__wrapped__(str(images))
        except OwnDataError as err:
            assert str(images) in str(err) or str(labels) in str(err), err  # a file is named
            assert expected is None, f"{kind}: refused a valid pair: {err}"
            return
    assert expected is not None, f"{kind}: read a pair the format refuses"
    assert got.clients is None and got.n_clients == 0
    data = got.data
    assert (*data.images.shape, data.n_classes, tuple(data.labels.tolist())) == expected, kind


# ------------------------------------------------------------------ own data: item names
@st.composite
def item_name_files(draw):
    style = draw(ids)
    items = draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))
    rows = [["item", "name"]] + [[_label(style, i, "p"), f"Product {i}"] for i in items]
    return (style, *draw(mutate(rows, True, (0,))))


def _names_reference(data: bytes) -> dict[str, str] | None:
    """item -> name, or None: header exactly item,name; two fields a row; items unique."""
    text = _decode(data)
    rows = None if text is None else _csv(text)
    if not rows or [h.strip() for h in rows[0]] != ["item", "name"]:
        return None
    names: dict[str, str] = {}
    for r in rows[1:]:
        if not r:
            continue
        if len(r) != 2 or not r[0].strip() or r[0].strip() in names:
            return None
        names[r[0].strip()] = r[1].strip()
    return names


@EXAMPLES
@given(item_name_files())
def test_item_names_csv(case) -> None:
    style, rows, encoding, kind = case
    data = render(rows, ",", encoding)
    expected = _names_reference(data)
    with tempfile.TemporaryDirectory() as tmp:
        sets = Path(tmp) / "sets.txt"  # every item 0..7 in the instance, in sorted order
        sets.write_text("".join(f"{_label(style, i, 'p')}\n" for i in range(8)))
        path = Path(tmp) / "names.csv"
        path.write_bytes(data)
        try:
            inst = load_coverage_sets(str(sets), item_names=str(path))
        except OwnDataError as err:
            assert str(path) in str(err), err  # the file is named
            assert re.search(r"line \d+|byte \d+", str(err)), err  # and where
            assert kind != "none", f"the valid file was refused: {err}"
            assert expected is None, f"{kind}: refused a valid file: {err}"
            return
    assert expected is not None, f"{kind}: read a names file the format refuses"
    assert inst.item_names == tuple(expected.get(i, "") for i in inst.items), kind


# ------------------------------------------------------------------ own data: parquet tables
PARQUET_KINDS = ["none", "null", "empty-label", "nan", "inf", "negative", "dup-pair", "rename",
                 "drop-column", "extra-column", "list-cells", "cut", "no-rows", "bool-value",
                 "text-value", "spaces"]  # fmt: skip


def _parquet_labels(draw, prefix: str, k: list[int]):
    style = draw(st.sampled_from(["str", "int64", "uint64", "category", "float"]))
    if style == "str":
        return [f"{prefix}{v}" for v in k]
    if style == "int64":
        return np.asarray(k, dtype=np.int64)
    if style == "uint64":  # ids above 2**63: distinct, read exactly
        return np.asarray([2**64 - 1 - v for v in k], dtype=np.uint64)
    if style == "category":
        return pd.Categorical([f"{prefix}{v}" for v in k])
    return np.asarray(k, dtype=np.float64) + 0.5


@st.composite
def parquet_tables(draw):
    pairs = draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7)), min_size=2,
                          max_size=20, unique=True))  # fmt: skip
    frame = pd.DataFrame({
        "user": _parquet_labels(draw, "u", [u for u, _ in pairs]),
        "item": _parquet_labels(draw, "i", [i for _, i in pairs]),
        "value": np.asarray([draw(st.integers(0, 5)) for _ in pairs],
                            dtype=draw(st.sampled_from([np.int64, np.float64]))),
    })  # fmt: skip
    kind = draw(st.sampled_from(PARQUET_KINDS))
    row = draw(st.integers(0, len(frame) - 1))
    col = draw(st.sampled_from(["user", "item", "value"]))
    if kind == "null":  # (pyarrow writes no object column of ints above 2**63)
        frame[col] = frame[col].astype("UInt64" if frame[col].dtype == np.uint64 else object)
        frame.loc[row, col] = None
    elif kind == "empty-label":
        label = col if col != "value" else "user"
        frame[label] = frame[label].astype(str)
        frame.loc[row, label] = draw(st.sampled_from(["", "  "]))
    elif kind in ("nan", "inf", "negative"):
        frame["value"] = frame["value"].astype(np.float64)
        frame.loc[row, "value"] = {"nan": np.nan, "inf": np.inf, "negative": -1.0}[kind]
    elif kind == "dup-pair":
        frame = pd.concat([frame, frame.iloc[[row]]], ignore_index=True)
    elif kind == "rename":
        frame = frame.rename(columns={col: col.upper()})
    elif kind == "drop-column":
        frame = frame.drop(columns=col)
    elif kind == "extra-column":
        frame["note"] = "x"
    elif kind == "list-cells":
        frame[col] = [[int(v) % 3, 7] for v in range(len(frame))]
    elif kind == "no-rows":
        frame = frame.iloc[:0]
    elif kind == "bool-value":
        frame["value"] = frame["value"] > 0
    elif kind == "text-value":  # numbers written as text: read as the numbers
        frame["value"] = frame["value"].astype(str)
    elif kind == "spaces":
        frame["user"] = [f" {v} " for v in frame["user"].astype(str)]
    return frame, kind, draw(st.integers(0, 2**32 - 1))


def _parquet_reference(frame: pd.DataFrame, kind: str, coverage: bool):
    """(n, m, nnz) the documented rules give for the frame written, or None."""
    columns = ["user", "item"] if coverage else ["user", "item", "value"]
    if kind == "cut" or not set(columns) <= set(frame.columns) or frame.empty:
        return None
    cells = {c: frame[c].tolist() for c in columns}
    if any(v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))
           or isinstance(v, list) for c in columns for v in cells[c]):  # fmt: skip
        return None
    labels = [[str(v).strip() for v in cells[c]] for c in ("user", "item")]
    if any(not t for col in labels for t in col):
        return None
    pairs = list(zip(*labels, strict=True))
    if coverage:
        return (len(set(labels[0])), len(set(labels[1])), len(set(pairs)))
    values = [None if isinstance(v, bool | np.bool_) else _number(str(v)) for v in cells["value"]]
    if any(v is None or v < 0 for v in values) or len(set(pairs)) != len(pairs):
        return None
    return (len(set(labels[0])), len(set(labels[1])), sum(v > 0 for v in values))


@settings(max_examples=30)
@given(parquet_tables(), st.booleans())
def test_parquet_tables(case, coverage) -> None:
    frame, kind, seed = case
    expected = _parquet_reference(frame, kind, coverage)
    load = load_coverage_sets if coverage else load_facility_table
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "table.parquet"
        frame.to_parquet(path)
        if kind == "cut":
            blob = path.read_bytes()
            path.write_bytes(blob[: np.random.default_rng(seed).integers(len(blob))])
        try:
            inst = load(str(path))
        except OwnDataError as err:
            assert str(path) in str(err), err  # the file is named
            assert expected is None, f"{kind}: refused a valid table: {err}"
            return
    assert expected is not None, f"{kind}: read a table the format refuses"
    assert (len(inst.users), len(inst.items), int(inst.values.nnz)) == expected, kind


def test_preflight_check_names_the_item_names_and_element_groups_files(tmp_path) -> None:
    """The data check reads 'item-names' and 'element-groups' headers (a BOM dropped, as
    their loaders do), and names a missing file or a wrong header with the header it
    expects."""
    from flower_app.config import AppConfig
    from flower_app.datasets.check import data_problems

    table, names, groups = (tmp_path / f for f in ("t.csv", "names.csv", "groups.csv"))
    table.write_text("user,item,value\n0,0,1.0\n1,1,2.0\n")
    names.write_text("\ufeffitem,name\n0,a\n", encoding="utf-8")
    groups.write_text("element,group\n0,x\n1,y\n")

    def problems(item_names: str) -> list[str]:
        return data_problems(AppConfig.from_run_config(
            {"algorithm": "fedsm", "dataset": "facility-location-table", "data-file": str(table),
             "item-names": item_names, "element-groups": str(groups), "k": 2}
        ))  # fmt: skip

    assert problems(str(names)) == []
    groups.write_text("\ufeffelement,group\n0,x\n1,y\n", encoding="utf-8")  # a BOM: dropped
    assert problems(str(names)) == []
    groups.write_text("elements,group\n0,x\n")
    assert problems(str(names)) == [
        f"{groups}: line 1: 'elements,group'; expected the header 'element,group'"
    ]
    groups.write_text("element,group\n0,x\n")
    assert problems(str(tmp_path / "none.csv")) == [
        f"run_config 'item-names': {tmp_path / 'none.csv'} not found"
    ]
    names.write_text("id,label\n")
    assert problems(str(names)) == [f"{names}: line 1: 'id,label'; expected the header 'item,name'"]


def test_preflight_check_refuses_npz_arrays_the_loader_refuses(tmp_path) -> None:
    """`flower-app run`'s data check (before Flower starts) refuses a misspelt 'clients' array
    as the loader does, instead of letting the run fail after Flower has started."""
    from flower_app.config import AppConfig
    from flower_app.datasets.check import data_problems

    path = tmp_path / "shop-images.npz"
    x, y = np.zeros((4, 3), np.uint8), np.array([0, 1, 0, 1])
    for extra, refused in (({}, False), ({"client": np.array([0, 0, 1, 1])}, False),
                           ({"clients": np.array([0, 0, 1, 1])}, True)):  # fmt: skip
        np.savez(path, x=x, y=y, **extra)
        cfg = AppConfig.from_run_config(
            {"algorithm": "maxfl", "dataset": "image-clients", "data-file": str(path)}
        )
        problems = data_problems(cfg)
        assert bool(problems) == refused, problems
        if refused:
            assert "['clients']" in problems[0] and str(path) in problems[0]
            with pytest.raises(OwnDataError, match=r"\['clients'\] are not among"):
                load_image_clients.__wrapped__(str(path))


def test_preflight_check_of_a_large_npz_reads_its_array_names_as_the_loader(
    tmp_path, monkeypatch
) -> None:
    """Above FULL_READ_BYTES the check reads only the archive's names, with the loader's rule
    (x and y, optionally client, nothing else) and the loader's message."""
    from flower_app.config import AppConfig
    from flower_app.datasets import check

    monkeypatch.setattr(check, "FULL_READ_BYTES", 0)
    path = tmp_path / "big.npz"
    cfg = AppConfig.from_run_config(
        {"algorithm": "maxfl", "dataset": "image-clients", "data-file": str(path)}
    )
    for arrays, message in (({"x": 0, "y": 0, "client": 0}, None),
                            ({"x": 0}, "arrays ['x'] lack ['y']"),
                            ({"x": 0, "y": 0, "clients": 0}, "arrays ['clients'] are not among")):
        np.savez(path, **{k: np.zeros(2) for k in arrays})  # fmt: skip
        problems = check.data_problems(cfg)
        if message is None:
            assert problems == []
        else:
            assert len(problems) == 1 and problems[0].startswith(f"{path}: {message}"), problems


# ------------------------------------------------------------------ folders of several files
LEAF_FOLDER_KINDS = ["none", "copy", "copy-gz", "split-user", "train-test", "train-twice",
                     "bom", "gzip-cut"]  # fmt: skip


@st.composite
def leaf_folders(draw):
    """LEAF's Sent140 folder: files of distinct users, then one change across the files."""
    n_files = draw(st.integers(1, 3))
    files = []
    for f in range(n_files):
        users = [f"acct{f}_{u}" for u in range(draw(st.integers(1, 3)))]
        data = {"users": users, "num_samples": [], "user_data": {}}
        for u in users:
            k = draw(st.integers(1, 3))
            data["user_data"][u] = {
                "x": [[str(j), "Mon Apr 06 2009", "NO_QUERY", u, f"tweet {j}"] for j in range(k)],
                "y": [draw(st.integers(0, 1)) for _ in range(k)],
            }
            data["num_samples"].append(k)
        files.append(data)
    kind = draw(st.sampled_from(LEAF_FOLDER_KINDS))
    tweets = sum(sum(d["num_samples"]) for d in files)
    users = sum(len(d["users"]) for d in files)
    layout = {f"all_data/all_data_{f}.json": json.dumps(d).encode() for f, d in enumerate(files)}
    expected: tuple | None = (tweets, users)
    first = "all_data/all_data_0.json"
    if kind == "copy":  # a second copy of a file: every user of it twice
        layout["all_data/all_data_0 (copy).json"] = layout[first]
        expected = None
    elif kind == "copy-gz":  # the file and its compressed copy
        layout[first + ".gz"] = gzip.compress(layout[first])
        expected = None
    elif kind == "split-user":  # one user's tweets in two files
        extra = files[0]["users"][0]
        block = {"x": [["9", "d", "q", extra, "again"]], "y": [1]}
        layout["all_data/all_data_9.json"] = json.dumps(
            {"users": [extra], "num_samples": [1], "user_data": {extra: block}}
        ).encode()
        expected = None
    elif kind in ("train-test", "train-twice"):  # LEAF's split: a user in train/ and test/
        layout = {}
        for f, d in enumerate(files):
            layout[f"train/all_data_{f}_train_9.json"] = json.dumps(d).encode()
            layout[f"test/all_data_{f}_test_9.json"] = json.dumps(d).encode()
        expected = (2 * tweets, users)
        if kind == "train-twice":
            layout["train/all_data_0_train_9 (copy).json"] = layout["train/all_data_0_train_9.json"]
            expected = None
    elif kind == "bom":
        layout[first] = b"\xef\xbb\xbf" + layout[first]
    elif kind == "gzip-cut":
        packed = gzip.compress(layout.pop(first))
        layout[first + ".gz"] = packed[: draw(st.integers(10, len(packed) - 1))]
        expected = None
    return layout, kind, expected


@EXAMPLES
@given(leaf_folders())
def test_leaf_folder_is_read_exactly_or_refused_naming_both_files(case) -> None:
    """A user seen in two files of one group (a copy of a file, a user split over two) is
    refused naming both files; LEAF's train/ and test/ hold the same users, as written."""
    from flower_app.datasets.sent140 import find_sent140_files

    layout, kind, expected = case
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "sent140"
        for name, data in layout.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        try:
            tweets = list(find_sent140_files(folder).tweets())
        except ValueError as err:
            assert expected is None, f"{kind}: refused a valid folder: {err}"
            if kind in ("copy", "copy-gz", "split-user", "train-twice"):
                assert str(err).count(str(folder)) >= 2, err  # both files named
            else:
                assert "all_data_0.json.gz" in str(err), err
            return
    assert expected is not None, f"{kind}: read a folder that holds a user twice"
    assert (len(tweets), len({t.user for t in tweets})) == expected, kind


def test_a_bom_on_a_headerless_ratings_csv_keeps_every_client(tmp_path) -> None:
    """The first user id of a headerless ratings_<Category>.csv saved with a byte-order
    mark is the same user as on the other lines: two users at 40 ratings stay two clients."""
    from flower_app.datasets.amazon import build_amazon, find_amazon_files

    folder = tmp_path / "amazon"
    folder.mkdir()
    lines = [f"A{u},B{k % 7},5.0,{1_300_000_000 + k}" for u in (1, 2) for k in range(40)]
    (folder / "ratings_Electronics.csv").write_bytes(("\n".join(lines) + "\n").encode("utf-8-sig"))
    files = find_amazon_files(folder)
    task = build_amazon(files.read())
    assert task.users == ("A1", "A2") and task.n_clients == 2


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"asin": null, "categories": [["Electronics"]]}', "asin is null, not a string id"),
        ('{"asin": true, "categories": [["Electronics"]]}', "asin is true, not a string id"),
        ('{"asin": "B1", "category": "Electronics"}', "category is \"Electronics\", not a list"),
        ('{"asin": "B1", "categories": [[null]]}', "categories\\[0\\] is \\[null\\], not names"),
        ('{"asin": "B1", "categories": "Electronics"}', 'categories is "Electronics", not a list'),
    ],
)
def test_amazon_metadata_refuses_nulls_and_strings_where_lists_and_ids_belong(
    tmp_path, line, match
) -> None:
    from flower_app.datasets.amazon import read_metadata

    path = tmp_path / "meta_Electronics.json"
    path.write_text('{"asin": "B0", "categories": [["Electronics", "Cameras"]]}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}, line 2: {match}"):
        read_metadata(path)


def test_amazon_metadata_product_listed_twice(tmp_path) -> None:
    from flower_app.datasets.amazon import read_metadata

    path = tmp_path / "meta_Electronics.json"
    same = '{"asin": "B1", "category": ["Electronics", "Cameras"]}\n'
    path.write_text(same + '{"asin": "B2", "category": ["Phones"]}\n' + same)
    assert read_metadata(path) == {"B1": "Cameras", "B2": "Phones"}  # the same record again
    path.write_text(same + '{"asin": "B1", "category": ["Electronics", "Phones"]}\n')
    with pytest.raises(ValueError, match=r"lines 1 and 2: product 'B1' is listed twice"):
        read_metadata(path)


@pytest.mark.parametrize("columns", ["user,item,value,extra", "user,item"])
def test_data_columns_naming_more_or_fewer_columns_is_refused(tmp_path, columns) -> None:
    """An extra data-columns name is refused, not ignored (by the loader and before Flower)."""
    from flower_app.config import AppConfig
    from flower_app.datasets.check import data_problems

    table = tmp_path / "t.csv"
    table.write_text("user,item,value,extra\n0,0,1.0,x\n1,1,2.0,y\n")
    with pytest.raises(OwnDataError, match=f"'data-columns' = '{columns}': .* expected 3"):
        load_facility_table(str(table), columns)
    cfg = AppConfig.from_run_config({"dataset": "facility-location-table", "k": 2,
                                     "data-file": str(table), "data-columns": columns})  # fmt: skip
    [problem] = data_problems(cfg)
    assert f"'data-columns' = '{columns}'" in problem and "expected 3" in problem
    # coverage pairs: two names (the default user,item,value reads user,item)
    assert load_coverage_sets(str(table)).values.shape == (2, 2)
    with pytest.raises(OwnDataError, match="expected 2 comma-separated names"):
        load_coverage_sets(str(table), "user,item,extra")


@pytest.mark.parametrize("what", ["leaf", "sent140-csv", "glove", "amazon-reviews"])
def test_a_truncated_gzip_file_is_named_at_load_and_before_flower(tmp_path, what) -> None:
    """A .gz that ends early (an interrupted download) is refused naming the file, never a
    bare EOFError; the check before Flower reads a small one to its end."""
    from flower_app.config import AppConfig
    from flower_app.datasets.amazon import read_reviews_json
    from flower_app.datasets.check import data_problems
    from flower_app.datasets.sent140 import CSV_NAME
    from flower_app.datasets.sent140_features import iter_glove

    rows = [["4", str(k), "d", "NO_QUERY", f"acct{k % 2}", f"tweet {k} " * 20] for k in range(90)]
    text = {
        "leaf": json.dumps({"users": ["a"], "num_samples": [60], "user_data": {"a": {
            "x": [[str(k), "d", "q", "a", f"tweet {k} " * 20] for k in range(60)],
            "y": [1] * 60}}}),
        "sent140-csv": "".join(",".join(f'"{c}"' for c in r) + "\n" for r in rows),
        "glove": "".join(f"w{k} " + " ".join(["0.5"] * 25) + "\n" for k in range(200)),
        "amazon-reviews": "".join(json.dumps({"reviewerID": f"A{k % 2}", "asin": f"B{k}",
                                              "overall": 5.0, "unixReviewTime": 1_300_000_000})
                                  + "\n" for k in range(200)),
    }[what]  # fmt: skip
    name = {"leaf": "sent140/all_data_0.json.gz", "sent140-csv": f"sent140/{CSV_NAME}.gz",
            "glove": "sent140/glove.twitter.27B.25d.txt.gz",
            "amazon-reviews": "amazon/reviews_Electronics_5.json.gz"}[what]  # fmt: skip
    path = tmp_path / name
    path.parent.mkdir(parents=True)
    packed = gzip.compress(text.encode())
    path.write_bytes(packed[: len(packed) // 2])
    read = {"leaf": lambda: list(read_leaf_json(path)),
            "sent140-csv": lambda: list(read_sentiment140_csv(path)),
            "glove": lambda: list(iter_glove(path, 25)),
            "amazon-reviews": lambda: list(read_reviews_json(path))}[what]  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*gzip data ends early"):
        read()
    if what == "glove":
        return
    run = {"algorithm": "fedsubavg", "dataset": "amazon" if what.startswith("amazon") else
           "sent140", "data-dir": str(tmp_path)}  # fmt: skip
    [problem] = data_problems(AppConfig.from_run_config(run))
    assert str(path) in problem and "gzip data ends early" in problem


def test_a_float_image_is_kept_exactly_or_refused(tmp_path) -> None:
    """8-bit pixels saved as floats k/255 are read back as the same pixels; any other float
    is refused naming the file and a value (never rounded to 8 bits without a word)."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (6, 4, 4)).astype(np.uint8)
    y, path = np.array([0, 1, 0, 1, 0, 1]), tmp_path / "imgs.npz"
    for x in (pixels.astype(np.float32) / np.float32(255), pixels / 255.0):
        np.savez(path, x=x, y=y)
        got = load_image_clients.__wrapped__(str(path))
        assert np.array_equal(got.data.images, pixels.reshape(6, -1))
    np.savez(path, x=pixels / 255.0 + 1e-3, y=y)  # a quarter step off: 8 bits would round it
    with pytest.raises(OwnDataError, match=re.escape(str(path)) + ": array x holds floats that"):
        load_image_clients.__wrapped__(str(path))
