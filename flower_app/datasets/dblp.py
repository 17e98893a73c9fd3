"""DBLP researcher-venue sets from the official ``dblp.xml`` dump, for max coverage.

The FedSM paper (Rafiey, Namani & Charalambides, 2025) builds a bipartite network of
n = 704,738 researchers and m = 2,675 venues: a researcher's set holds every venue where they
published at least one paper between 2018 and 2021. How the authors turned DBLP into that
network is not published; this module rebuilds it from the official dump with the rules
stated in :func:`load_dblp_venue_sets` and reports its own counts beside the paper's
(:func:`summary`).

Files (https://dblp.org/xml/release/): ``<data_dir>/dblp/dblp.xml`` or
``<data_dir>/dblp/dblp.xml.gz``, with ``dblp.dtd`` beside it. The XML uses character entities
(``&uuml;`` ...) that only the DTD defines, so the DTD is loaded and the entities resolved. The
file is several GB: it is parsed as a stream with lxml, clearing each record once read, so
memory stays bounded by the result.

Command line: ``python -m flower_app.datasets.dblp [DATA_DIR] [--years 2018 2021]`` parses
(with a progress bar by bytes read) and prints :func:`summary` as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import logging
import os
import re
import zipfile
import zlib
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import scipy.sparse as sp
from lxml import etree
from tqdm.auto import tqdm

from flower_app.datasets.matrices import VenueSets
from flower_app.datasets.paths import (
    DataFormatError,
    DatasetNotFoundError,
    resolve_data_dir,
)
from flower_app.files import atomic_file

__all__ = [
    "COUNTED_TAGS",
    "DBLP_URL",
    "PAPER_N_RESEARCHERS",
    "PAPER_N_VENUES",
    "PUBLICATION_TAGS",
    "find_dblp_files",
    "load_dblp_venue_sets",
    "main",
    "summary",
]

log = logging.getLogger(__name__)

DBLP_URL = "https://dblp.org/xml/release/"
"""Where the official dumps (``dblp-YYYY-MM-DD.xml.gz``) and ``dblp.dtd`` are published."""

PAPER_N_RESEARCHERS = 704_738
"""Researchers in the FedSM paper's DBLP 2018-2021 network."""

PAPER_N_VENUES = 2_675
"""Venues in the FedSM paper's DBLP 2018-2021 network."""

PUBLICATION_TAGS = (
    "article",
    "inproceedings",
    "proceedings",
    "incollection",
    "book",
    "phdthesis",
    "mastersthesis",
)
"""DBLP record types that describe publications."""

COUNTED_TAGS = ("article", "inproceedings", "incollection")
"""Publication records counted as papers (journal articles, conference and workshop papers,
book chapters). Edited volumes (``proceedings``), whole ``book``\\ s and theses are not papers
in a venue series and are left out."""

_RECORD_TAGS = (*PUBLICATION_TAGS, "www", "person", "data")
_SKIPPED_KEY_PREFIXES = ("homepages/", "persons/")
_SUBDIR = "dblp"
_XML_NAMES = ("dblp.xml", "dblp.xml.gz")
_DTD_NAME = "dblp.dtd"
_CACHE_VERSION = 2  # 2: source fingerprint, string offsets, no venue without researchers
_CHUNK_BYTES = 1 << 20
_FINGERPRINT_BYTES = 1 << 20
_YEAR = re.compile(r"[0-9]+")
_DECLARED_ENCODING = re.compile(
    rb"""^(?:\xef\xbb\xbf)?<\?xml[^>]*?encoding\s*=\s*["']([^"']+)["']"""
)
_LATIN1_NAMES = {"iso-8859-1", "iso8859-1", "iso_8859-1", "latin-1", "latin1", "l1"}
_UTF8_SEQUENCE = re.compile(
    rb"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}"
)


def find_dblp_files(data_dir: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """Locate the dump and its DTD under ``<data_dir>/dblp/``.

    Parameters
    ----------
    data_dir : str or os.PathLike or None, default None
        Data folder (see :func:`~flower_app.datasets.paths.resolve_data_dir`).

    Returns
    -------
    tuple of pathlib.Path
        ``(xml, dtd)``; ``xml`` is ``dblp.xml`` if present, else ``dblp.xml.gz``.

    Raises
    ------
    DatasetNotFoundError
        If neither XML file or the DTD is there.
    """
    folder = resolve_data_dir(data_dir) / _SUBDIR
    xml = next((folder / name for name in _XML_NAMES if (folder / name).is_file()), None)
    dtd = folder / _DTD_NAME
    if xml is None or not dtd.is_file():
        expected = [folder / _XML_NAMES[1], dtd]
        source = (
            f"{DBLP_URL}: save a release dump as {folder / _XML_NAMES[1]} (or unpack it to "
            f"{folder / _XML_NAMES[0]}) and dblp.dtd beside it. DBLP cannot be downloaded "
            "automatically (several GB)"
        )
        reason = "found no dblp.xml or dblp.xml.gz" if xml is None else "dblp.dtd is missing"
        raise DatasetNotFoundError("DBLP", expected, source, reason, folder.parent)
    return xml, dtd


def load_dblp_venue_sets(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    years: tuple[int, int] = (2018, 2021),
    min_venues_per_researcher: int = 1,
    cache: bool = True,
    progress: bool = False,
) -> VenueSets:
    """Build researcher -> venue sets from the DBLP dump.

    Rules (the file is read exactly as they say, or refused with its file and line):

    * A paper is an ``article``, ``inproceedings`` or ``incollection`` record (see
      :data:`COUNTED_TAGS`); ``proceedings``, ``book``, theses, ``www`` (home pages), ``person``
      and ``data`` records, and keys under ``homepages/`` or ``persons/``, are skipped. Records
      are children of the root ``<dblp>``; a record inside another element is refused.
    * A paper counts when its ``<year>`` lies in ``years`` (inclusive); papers without a year
      (or with an empty ``<year/>``) are skipped. A year that is not written in the digits
      0-9 (``20l9``, ``2_019``, ``+2019``), or two different years in one record, are refused.
    * Its venue is the first two components of its ``key``: ``conf/icml/Smith20`` ->
      ``conf/icml``, ``journals/tit/X`` -> ``journals/tit`` (so arXiv's ``journals/corr`` is a
      venue too). The venue's group is the first component (``conf``, ``journals``, ...). A
      key of fewer than three components (DBLP's ``dblpnote/...`` placeholders) names no
      venue: the record is skipped. A paper without a ``key`` (DBLP's DTD requires one) or
      with an empty first or second component (``conf//X``) is refused.
    * A researcher is an ``<author>`` name as DBLP writes it, surrounding white space removed
      (DBLP disambiguates homonyms with suffixes such as ``0001``); an author listed twice in
      one paper counts once, an empty ``<author/>`` names no one, editors are not authors.
      Their set holds every venue with at least one of their papers; a venue is in the
      network when one of its counted papers has an author.
    * The XML declaration's encoding is used (DBLP: ISO-8859-1, every non-ASCII character
      written as an entity that ``dblp.dtd`` defines; an undefined entity is refused). A file
      declared ISO-8859-1 that holds UTF-8 byte sequences (a UTF-8 re-save) is refused, not
      read as different names (``JÃ¼rgen``).

    Parameters
    ----------
    data_dir : str or os.PathLike or None, default None
        Data folder; the files are read from ``<data_dir>/dblp/``.
    years : tuple of int, default (2018, 2021)
        First and last publication year, inclusive.
    min_venues_per_researcher : int, default 1
        Drop researchers with fewer venues; venues left without researchers are dropped too.
    cache : bool, default True
        Save the parsed sets as ``<data_dir>/dblp/cache/venue-sets-<y0>-<y1>.npz`` and reuse
        that file while it is newer than the XML and records the XML's name, size and a
        SHA-256 of its first and last MiB (a ``.gz`` ends with the CRC of its whole content),
        the years and this cache version. Any other cache file (another release, other
        years, damaged, inconsistent arrays) is ignored with a warning and rebuilt.
    progress : bool, default False
        Show a progress bar by bytes read.

    Returns
    -------
    VenueSets
        Researchers sorted by name (code point order), venues sorted; ``name`` is
        ``"dblp-<y0>-<y1>"``. Researcher names use numpy's variable-width string dtype.

    Raises
    ------
    DatasetNotFoundError
        If ``dblp.xml``/``dblp.xml.gz`` or ``dblp.dtd`` is missing.
    DataFormatError
        If the XML is malformed or a record breaks the rules above: the message names the
        file and the line (an error inside the DTD names ``dblp.dtd``).
    """
    y0, y1 = (int(year) for year in years)
    if y0 > y1:
        raise ValueError(f"years must be (first, last) with first <= last, got {years}")
    if min_venues_per_researcher < 1:
        raise ValueError(f"min_venues_per_researcher must be >= 1, got {min_venues_per_researcher}")
    xml, _ = find_dblp_files(data_dir)
    cache_file = xml.parent / "cache" / f"venue-sets-{y0}-{y1}.npz"
    sets = _read_cache(cache_file, xml, (y0, y1)) if cache else None
    if sets is None:
        sets = _build(_parse(xml, (y0, y1), progress=progress), (y0, y1))
        if cache:
            _write_cache(cache_file, sets, xml, (y0, y1))
    return _filter(sets, min_venues_per_researcher)


def summary(vs: VenueSets) -> dict:
    """Describe venue sets and compare them with the FedSM paper's DBLP network.

    Parameters
    ----------
    vs : VenueSets
        Sets from :func:`load_dblp_venue_sets` (or a synthetic stand-in).

    Returns
    -------
    dict
        JSON-ready: ``name``, ``n_researchers``, ``n_venues``, ``nnz``, ``density``,
        ``mean_/median_/max_venues_per_researcher``, ``max_researchers_per_venue``,
        ``venues_per_group`` and the paper's ``paper_n_researchers`` (704,738) and
        ``paper_n_venues`` (2,675).
    """
    degrees = np.diff(vs.matrix.indptr)
    per_venue = np.bincount(vs.matrix.indices, minlength=vs.n_elements)
    groups, counts = np.unique(np.asarray(vs.element_groups, dtype=str), return_counts=True)
    n_cells = vs.n_users * vs.n_elements
    return {
        "name": vs.name,
        "n_researchers": vs.n_users,
        "n_venues": vs.n_elements,
        "nnz": int(vs.matrix.nnz),
        "density": float(vs.matrix.nnz / n_cells) if n_cells else 0.0,
        "mean_venues_per_researcher": float(degrees.mean()) if len(degrees) else 0.0,
        "median_venues_per_researcher": float(np.median(degrees)) if len(degrees) else 0.0,
        "max_venues_per_researcher": int(degrees.max()) if len(degrees) else 0,
        "max_researchers_per_venue": int(per_venue.max()) if len(per_venue) else 0,
        "venues_per_group": {str(g): int(c) for g, c in zip(groups, counts, strict=True)},
        "paper_n_researchers": PAPER_N_RESEARCHERS,
        "paper_n_venues": PAPER_N_VENUES,
    }


# --------------------------------------------------------------------------- parsing


@dataclass
class _Pairs:
    """Researcher-venue pairs collected while streaming (ids in order of first sight)."""

    researchers: dict[str, int] = field(default_factory=dict)
    venues: dict[str, int] = field(default_factory=dict)
    rows: array = field(default_factory=lambda: array("q"))
    cols: array = field(default_factory=lambda: array("q"))

    def add(self, venue: str, authors: list[str]) -> None:
        """Record that every author in ``authors`` published in ``venue`` (none: no venue)."""
        if not authors:
            return
        col = self.venues.setdefault(venue, len(self.venues))
        for author in authors:
            self.rows.append(self.researchers.setdefault(author, len(self.researchers)))
            self.cols.append(col)


class _RecentLines:
    """The last two chunks fed to the parser, to show the line an XML error points at."""

    def __init__(self) -> None:
        self._chunks: deque[tuple[int, bytes]] = deque(maxlen=2)
        self._next_line = 1

    @property
    def empty(self) -> bool:
        """True while nothing but empty chunks was fed."""
        return not any(chunk for _, chunk in self._chunks)

    def add(self, chunk: bytes) -> None:
        """Remember ``chunk`` and the line number it starts on."""
        self._chunks.append((self._next_line, chunk))
        self._next_line += chunk.count(b"\n")

    def line(self, number: int | None) -> str | None:
        """Return line ``number`` if it lies in the remembered chunks."""
        if number is None or not self._chunks:
            return None
        first = self._chunks[0][0]
        lines = b"".join(chunk for _, chunk in self._chunks).split(b"\n")
        index = number - first
        if 0 <= index < len(lines):
            return lines[index].decode("latin-1", errors="replace")
        return None


def _refuse(xml: Path, element: etree._Element, reason: str) -> DataFormatError:
    """Return a DataFormatError naming ``xml``, the record and its line."""
    return DataFormatError(
        xml, f"<{element.tag} key={element.get('key')!r}> {reason}", line_number=element.sourceline
    )


def _venue_of(element: etree._Element, xml: Path) -> str | None:
    """Return the venue (first two key components) of a counted record, or None to skip it."""
    key = element.get("key")
    if key is None or not key.strip():
        raise _refuse(xml, element, "has no key (DBLP's records all have one, e.g. "
                                    "key=\"conf/icml/Smith20\")")  # fmt: skip
    if key.startswith(_SKIPPED_KEY_PREFIXES):
        return None
    parts = key.split("/")
    if len(parts) < 3:
        return None
    if not parts[0] or not parts[1]:
        raise _refuse(xml, element, "has a key with an empty venue component; expected "
                                    "<group>/<venue>/<name>, e.g. conf/icml/Smith20")  # fmt: skip
    return f"{parts[0]}/{parts[1]}"


def _year_of(element: etree._Element, xml: Path) -> int | None:
    """Return the record's ``<year>`` as int, None if absent or empty; refuse anything else."""
    years: dict[str, etree._Element] = {}
    for year in element.iterfind("year"):
        text = "".join(year.itertext()).strip()
        if text:
            years.setdefault(text, year)
    if not years:
        return None
    for text, year in years.items():
        if not _YEAR.fullmatch(text):
            raise DataFormatError(
                xml,
                f"<{element.tag} key={element.get('key')!r}> has a non-integer "
                f"<year>{text}</year>; expected digits 0-9",
                line_number=year.sourceline,
                line=f"<year>{text}</year>",
            )
    if len(years) > 1:
        raise _refuse(xml, element, f"has {len(years)} different years {sorted(years)}; "
                                    "expected one <year>")  # fmt: skip
    return int(next(iter(years)))


def _authors_of(element: etree._Element) -> list[str]:
    """Return the record's author names (text of its ``<author>`` children), de-duplicated."""
    names = ("".join(author.itertext()).strip() for author in element.iterfind("author"))
    return list(dict.fromkeys(name for name in names if name))


@contextlib.contextmanager
def _open_stream(xml: Path, progress: bool) -> Iterator[tuple[BinaryIO, BinaryIO, tqdm]]:
    """Open ``xml`` (gzip-aware); yield the text stream, the raw file and a progress bar.

    The bar counts raw (for ``.gz``: compressed) bytes, so its total is the file size.
    """
    with open(xml, "rb") as raw, contextlib.ExitStack() as stack:
        stream: BinaryIO = raw
        if xml.suffix == ".gz":
            stream = stack.enter_context(gzip.GzipFile(fileobj=raw))
        bar = stack.enter_context(
            tqdm(
                total=xml.stat().st_size,
                unit="B",
                unit_scale=True,
                desc=f"parse {xml.name}",
                disable=not progress,
            )
        )
        yield stream, raw, bar


class _EncodingCheck:
    """Refuse UTF-8 byte sequences in a file whose XML declaration says ISO-8859-1."""

    def __init__(self) -> None:
        self._latin1: bool | None = None  # unknown until the first chunk
        self._tail = b""
        self._line = 1  # line on which ``self._tail`` starts

    def feed(self, chunk: bytes, xml: Path) -> None:
        """Check ``chunk`` (the file's next bytes, after gzip)."""
        if self._latin1 is None:
            declared = _DECLARED_ENCODING.match(chunk)
            name = declared.group(1).decode("ascii", "replace").lower() if declared else ""
            self._latin1 = name in _LATIN1_NAMES
        if not self._latin1:
            return
        data = self._tail + chunk
        if not chunk.isascii():
            found = _UTF8_SEQUENCE.search(data)
            if found is not None:
                start = data.rfind(b"\n", 0, found.start()) + 1
                stop = data.find(b"\n", found.end())
                raise DataFormatError(
                    xml,
                    "declared encoding ISO-8859-1 but holds UTF-8 byte sequences (e.g. "
                    f"{found.group().decode('utf-8')!r}); save it as ISO-8859-1 (DBLP's "
                    'release is) or declare encoding="UTF-8"',
                    line_number=self._line + data.count(b"\n", 0, found.start()),
                    line=data[start : stop if stop >= 0 else len(data)].decode("latin-1"),
                )
        keep = data[-3:]
        self._line += data.count(b"\n") - keep.count(b"\n")
        self._tail = keep


def _syntax_error(xml: Path, error: etree.LxmlError, recent: _RecentLines) -> DataFormatError:
    """Turn an lxml error into a DataFormatError naming the file (the XML or its DTD)."""
    message = getattr(error, "msg", None) or str(error) or type(error).__name__
    lineno = getattr(error, "lineno", None)
    lineno = lineno if lineno and lineno > 0 else None
    filename = getattr(error, "filename", None)
    if isinstance(filename, bytes | str) and Path(os.fsdecode(filename)).name == _DTD_NAME:
        dtd = xml.parent / _DTD_NAME
        try:
            lines = dtd.read_bytes().split(b"\n")
            shown = lines[lineno - 1].decode("latin-1") if lineno and lineno <= len(lines) else None
        except OSError:
            shown = None
        return DataFormatError(dtd, f"malformed DTD: {message}", line_number=lineno, line=shown)
    if lineno is None and recent.empty:
        return DataFormatError(xml, "the file is empty; expected DBLP's XML")
    return DataFormatError(
        xml, f"malformed XML: {message}", line_number=lineno, line=recent.line(lineno)
    )


def _parse(xml: Path, years: tuple[int, int], *, progress: bool = False) -> _Pairs:
    """Stream ``xml`` and collect the (researcher, venue) pairs of counted papers in ``years``."""
    parser = etree.XMLPullParser(
        events=("end",),
        tag=_RECORD_TAGS,
        load_dtd=True,
        resolve_entities=True,
        huge_tree=True,
        no_network=True,
        base_url=str(xml.parent / "dblp.xml"),
    )
    pairs = _Pairs()
    recent = _RecentLines()
    encoding = _EncodingCheck()
    try:
        with _open_stream(xml, progress) as (stream, raw, bar):
            position = 0
            while chunk := stream.read(_CHUNK_BYTES):
                recent.add(chunk)
                encoding.feed(chunk, xml)
                parser.feed(chunk)
                _consume(parser, pairs, years, xml)
                bar.update(raw.tell() - position)
                position = raw.tell()
            parser.close()
            _consume(parser, pairs, years, xml)
    except etree.LxmlError as error:
        raise _syntax_error(xml, error, recent) from error
    except (OSError, EOFError, zlib.error) as error:  # e.g. a truncated or corrupt .gz
        raise DataFormatError(xml, f"cannot read the file: {error}") from error
    return pairs


def _consume(parser: etree.XMLPullParser, pairs: _Pairs, years: tuple[int, int], xml: Path) -> None:
    """Handle the records the parser has completed, then free them."""
    for _, element in parser.read_events():
        parent = element.getparent()
        if parent is None or parent.tag != "dblp" or parent.getparent() is not None:
            where = "as the root" if parent is None else f"inside <{parent.tag}>"
            raise _refuse(xml, element, f"is {where}; expected every record to be a child of "
                                        "the root <dblp>")  # fmt: skip
        if element.tag in COUNTED_TAGS:
            venue = _venue_of(element, xml)
            year = _year_of(element, xml) if venue else None
            if year is not None and years[0] <= year <= years[1]:
                pairs.add(venue, _authors_of(element))
        element.clear(keep_tail=True)
        if parent is not None:
            while element.getprevious() is not None:
                del parent[0]


# --------------------------------------------------------------------------- building


def _build(pairs: _Pairs, years: tuple[int, int]) -> VenueSets:
    """Turn the collected pairs into sorted, de-duplicated :class:`VenueSets`."""
    names = list(pairs.researchers)
    venues = list(pairs.venues)
    name_rank = _ranks(names)
    venue_rank = _ranks(venues)
    rows = name_rank[np.frombuffer(pairs.rows, dtype=np.int64)]
    cols = venue_rank[np.frombuffer(pairs.cols, dtype=np.int64)]
    matrix = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(venues)))
    matrix.sum_duplicates()
    matrix.data[:] = 1.0
    sorted_venues = np.array(sorted(venues), dtype=str)
    return VenueSets(
        matrix=matrix,
        researchers=np.array(sorted(names), dtype=np.dtypes.StringDType()),
        venues=sorted_venues,
        element_groups=_groups(sorted_venues),
        name=f"dblp-{years[0]}-{years[1]}",
    )


def _ranks(items: list[str]) -> np.ndarray:
    """Return each item's position in sorted order (items are distinct)."""
    order = sorted(range(len(items)), key=items.__getitem__)
    ranks = np.empty(len(items), dtype=np.int64)
    ranks[np.asarray(order, dtype=np.int64)] = np.arange(len(items), dtype=np.int64)
    return ranks


def _groups(venues: np.ndarray) -> np.ndarray:
    """Return the first key component of each venue (``conf``, ``journals``, ...)."""
    return np.array([venue.split("/", 1)[0] for venue in venues.tolist()], dtype=str)


def _filter(sets: VenueSets, min_venues: int) -> VenueSets:
    """Drop researchers with fewer than ``min_venues`` venues and venues left empty."""
    if min_venues <= 1:
        return sets
    keep_rows = np.flatnonzero(np.diff(sets.matrix.indptr) >= min_venues)
    matrix = sets.matrix[keep_rows]
    keep_cols = np.flatnonzero(np.bincount(matrix.indices, minlength=matrix.shape[1]))
    matrix = matrix[:, keep_cols].tocsr()
    matrix.sort_indices()
    return VenueSets(
        matrix=matrix,
        researchers=sets.researchers[keep_rows],
        venues=sets.venues[keep_cols],
        element_groups=sets.element_groups[keep_cols],
        name=sets.name,
    )


# --------------------------------------------------------------------------- cache


def _encode_strings(items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pack strings into one UTF-8 byte array and their end offsets (any characters allowed)."""
    encoded = [item.encode("utf-8") for item in items.tolist()]
    ends = np.cumsum([len(item) for item in encoded], dtype=np.int64)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), ends


def _decode_strings(blob: np.ndarray, ends: np.ndarray, count: int) -> list[str]:
    """Inverse of :func:`_encode_strings`; ValueError unless it holds ``count`` strings."""
    if blob.dtype != np.uint8 or blob.ndim != 1 or ends.shape != (count,):
        raise ValueError("corrupt string table")
    if count and (ends[-1] != blob.size or np.any(np.diff(ends) < 0) or ends[0] < 0):
        raise ValueError("corrupt string table")
    if not count and blob.size:
        raise ValueError("corrupt string table")
    data = blob.tobytes()
    starts = [0, *ends[:-1].tolist()] if count else []
    return [data[a:b].decode("utf-8") for a, b in zip(starts, ends.tolist(), strict=True)]


def _fingerprint(xml: Path) -> np.ndarray:
    """SHA-256 of the file's first and last MiB and its size, as 32 bytes."""
    digest = hashlib.sha256()
    size = xml.stat().st_size
    with open(xml, "rb") as fh:
        digest.update(size.to_bytes(8, "little"))
        digest.update(fh.read(_FINGERPRINT_BYTES))
        fh.seek(max(size - _FINGERPRINT_BYTES, 0))
        digest.update(fh.read(_FINGERPRINT_BYTES))
    return np.frombuffer(digest.digest(), dtype=np.uint8)


def _write_cache(path: Path, sets: VenueSets, xml: Path, years: tuple[int, int]) -> None:
    """Save ``sets`` atomically as ``path``; warn (do not fail) if that is impossible."""
    researchers, researcher_ends = _encode_strings(sets.researchers)
    venues, venue_ends = _encode_strings(sets.venues)
    try:
        with atomic_file(path) as out:
            np.savez_compressed(
                out,
                version=np.int64(_CACHE_VERSION),
                years=np.asarray(years, dtype=np.int64),
                source_name=np.frombuffer(xml.name.encode(), dtype=np.uint8),
                source_size=np.int64(xml.stat().st_size),
                source_fingerprint=_fingerprint(xml),
                shape=np.asarray(sets.matrix.shape, dtype=np.int64),
                indptr=sets.matrix.indptr.astype(np.int64),
                indices=sets.matrix.indices.astype(np.int32),
                researchers=researchers,
                researcher_ends=researcher_ends,
                venues=venues,
                venue_ends=venue_ends,
            )
    except OSError as error:
        log.warning("could not write the DBLP cache %s: %s", path, error)


def _cached_matrix(stored: np.lib.npyio.NpzFile) -> sp.csr_matrix:
    """Return the cache's researcher x venue matrix; ValueError unless canonical 0/1 sets."""
    shape = stored["shape"]
    if shape.shape != (2,) or shape.dtype.kind not in "iu" or np.any(shape < 0):
        raise ValueError(f"bad shape {shape!r}")
    n_rows, n_cols = (int(v) for v in shape)
    indptr, indices = stored["indptr"], stored["indices"]
    if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
        raise ValueError("non-integer index arrays")
    if indptr.shape != (n_rows + 1,) or indices.ndim != 1 or indptr[0] != 0:
        raise ValueError("index arrays do not match the shape")
    if indptr[-1] != indices.size or np.any(np.diff(indptr) < 1):
        raise ValueError("a researcher without venues, or a bad row pointer")
    if indices.size and (indices.min() < 0 or indices.max() >= n_cols):
        raise ValueError("a venue index out of range")
    matrix = sp.csr_matrix(
        (np.ones(indices.size), indices.astype(np.int32), indptr.astype(np.int64)),
        shape=(n_rows, n_cols),
    )
    if not matrix.has_canonical_format:  # sorted, no repeated venue in a row
        raise ValueError("unsorted or repeated venues in a row")
    if np.any(np.bincount(matrix.indices, minlength=n_cols) == 0):
        raise ValueError("a venue without researchers")
    return matrix


def _read_cache(path: Path, xml: Path, years: tuple[int, int]) -> VenueSets | None:
    """Load the cache if it exists, is newer than ``xml`` and matches it; else None.

    A cache that cannot be read, or whose arrays are not a consistent researcher-venue
    network, is ignored with a warning (the caller parses the XML and rewrites it).
    """
    try:
        if path.stat().st_mtime_ns <= xml.stat().st_mtime_ns:
            return None
        with np.load(path, allow_pickle=False) as stored:
            if (
                int(stored["version"]) != _CACHE_VERSION
                or tuple(stored["years"].tolist()) != years
                or stored["source_name"].tobytes().decode() != xml.name
                or int(stored["source_size"]) != xml.stat().st_size
                or not np.array_equal(stored["source_fingerprint"], _fingerprint(xml))
            ):
                log.warning("ignoring the DBLP cache %s: made for another file, years or "
                            "version", path)  # fmt: skip
                return None
            matrix = _cached_matrix(stored)
            n_rows, n_cols = matrix.shape
            researchers = _decode_strings(stored["researchers"], stored["researcher_ends"], n_rows)
            venues = _decode_strings(stored["venues"], stored["venue_ends"], n_cols)
        if researchers != sorted(set(researchers)) or venues != sorted(set(venues)):
            raise ValueError("names not sorted and distinct")
        if any(venue.count("/") != 1 or venue.startswith("/") or venue.endswith("/")
               for venue in venues):  # fmt: skip
            raise ValueError("a venue that is not <group>/<name>")
    except FileNotFoundError:
        return None
    except (OSError, EOFError, KeyError, ValueError, TypeError, AttributeError,
            zipfile.BadZipFile, zlib.error, UnicodeDecodeError) as error:  # fmt: skip
        log.warning("ignoring unreadable DBLP cache %s: %s", path, error)
        return None
    return VenueSets(
        matrix=matrix,
        researchers=np.array(researchers, dtype=np.dtypes.StringDType()),
        venues=np.array(venues, dtype=str),
        element_groups=_groups(np.array(venues, dtype=str)),
        name=f"dblp-{years[0]}-{years[1]}",
    )


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """Parse the DBLP dump and print :func:`summary` as JSON.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status: 0 on success, 1 if the files are missing or malformed.
    """
    parser = argparse.ArgumentParser(
        prog="python -m flower_app.datasets.dblp",
        description="Build DBLP researcher-venue sets and print their statistics.",
    )
    parser.add_argument("data_dir", nargs="?", default=None, help="data folder (holds dblp/)")
    parser.add_argument("--years", nargs=2, type=int, default=(2018, 2021), metavar=("Y0", "Y1"))
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    args = parser.parse_args(argv)
    try:
        sets = load_dblp_venue_sets(
            args.data_dir, years=tuple(args.years), cache=not args.no_cache, progress=True
        )
    except (DatasetNotFoundError, DataFormatError) as error:
        print(f"error: {error}")
        return 1
    print(json.dumps(summary(sets), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
