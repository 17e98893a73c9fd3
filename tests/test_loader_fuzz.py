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
import io
import json
import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flower_app.datasets.amazon import read_rating_only_csv, read_reviews_json
from flower_app.datasets.idx import read_idx, write_idx
from flower_app.datasets.movielens import load_movielens_1m
from flower_app.datasets.own import OwnDataError, load_coverage_sets, load_facility_table
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
def _table_reference(data: bytes, columns: list[str], labels: int):
    """The named columns of a header CSV's rows, or None: each row as many fields as the
    header, names unique, no empty label cell (the first ``labels`` columns)."""
    text = _decode(data)
    rows = None if text is None else _csv(text)
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


def _facility_reference(data: bytes):
    body = _table_reference(data, ["user", "item", "value"], 2)
    if body is None:
        return None
    values = [_number(r[2]) for r in body]
    pairs = [(r[0], r[1]) for r in body]
    if any(v is None or v < 0 for v in values) or len(set(pairs)) != len(pairs):
        return None
    return (len({u for u, _ in pairs}), len({i for _, i in pairs}), sum(v > 0 for v in values))


@EXAMPLES
@given(facility_tables())
def test_facility_table(case) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        inst = load_facility_table(str(path))
        return (len(inst.users), len(inst.items), int(inst.values.nnz))

    check(render(rows, ",", encoding), "table.csv", load, _facility_reference, OwnDataError,
          kind)  # fmt: skip


@st.composite
def pair_tables(draw):
    style = draw(ids)
    pairs = draw(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 8)), min_size=2,
                          max_size=25))  # fmt: skip
    rows = [["user", "item"]] + [[_label(style, u, "u"), _label(style, i, "i")] for u, i in pairs]
    return draw(mutate(rows, True, (0, 1)))


def _pairs_reference(data: bytes):
    body = _table_reference(data, ["user", "item"], 2)
    if body is None:
        return None
    pairs = {(r[0], r[1]) for r in body}
    return (len({u for u, _ in pairs}), len({i for _, i in pairs}), len(pairs))


@EXAMPLES
@given(pair_tables())
def test_coverage_pairs_table(case) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        inst = load_coverage_sets(str(path))
        return (len(inst.users), len(inst.items), int(inst.values.nnz))

    check(render(rows, ",", encoding), "pairs.csv", load, _pairs_reference, OwnDataError, kind)


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


def _rating_reference(data: bytes):
    body = _table_reference(data, ["user", "movie", "genre", "clicked"], 3)
    if body is None or any(r[3] not in ("0", "1", "0.0", "1.0", "False", "True", "false",
                                         "true") for r in body):  # fmt: skip
        return None
    return (1 + len({r[1] for r in body}) + len({r[2] for r in body}), len(body))


@EXAMPLES
@given(rating_tables())
def test_rating_table(case) -> None:
    rows, encoding, kind = case

    def load(path: Path) -> tuple:
        task = load_rating_table(str(path), "user,movie,genre,clicked")
        return (task.layout.n_params, int(task.train_y.size + task.test_y.size))

    check(render(rows, ",", encoding), "ratings.csv", load, _rating_reference, OwnDataError,
          kind)  # fmt: skip


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
    return rows, "latin-1" if encoding in ("utf-8", "utf-8-sig") else encoding, kind


def _sentiment140_reference(data: bytes):
    rows = _csv(data.decode("latin-1"))
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
    valid = kind in ("none", "huge", "pretty")
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
    text = _decode(data, "utf-8")
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
    kind = draw(st.sampled_from(["none", "drop", "dupkey", "blank", "empty"]))
    texts = [json.dumps(obj) for obj in lines]
    i = draw(st.integers(0, n - 1))
    if kind == "drop":
        texts[i] = json.dumps({k: v for k, v in lines[i].items() if k != "asin"})
    elif kind == "dupkey":  # the item given twice, the second different: which one?
        texts[i] = texts[i][:-1] + ', "asin": "OTHER"}'
    elif kind == "blank":
        texts.insert(i, "")
    elif kind == "empty":
        texts[i] = json.dumps({**lines[i], "reviewerID": ""})
    expected = None
    if kind in ("none", "blank"):
        expected = (n, len({o["reviewerID"] for o in lines}), len({o["asin"] for o in lines}))
    return ("\n".join(texts) + "\n").encode(), kind, expected


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
    return rows, "latin-1" if encoding in ("utf-8", "utf-8-sig", "utf-16") else encoding, kind


def _movielens_reference(data: bytes):
    rows = [line.rstrip("\r").split("::") for line in data.decode("latin-1").split("\n")]
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
    check(data, "ratings.dat", loaded, _movielens_reference, DataFormatError, kind)


# ------------------------------------------------------------------ node files
@st.composite
def group_files(draw):
    m = draw(st.integers(1, 12))
    rows = [["element", "group"]] + [[str(e), draw(st.sampled_from(["a", "b", "c"]))]
                                     for e in draw(st.permutations(range(m)))]  # fmt: skip
    return draw(mutate(rows, True, ()))


def _groups_reference(data: bytes):
    text = _decode(data, "utf-8")
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
