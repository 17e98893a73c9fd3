"""DBLP venue sets from small dblp.xml / dblp.xml.gz files written in the official format."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from flower_app.datasets import dblp
from flower_app.datasets.dblp import DBLP_URL, load_dblp_venue_sets, main, summary
from flower_app.datasets.paths import DataFormatError, DatasetNotFoundError

DTD = """<!-- tiny excerpt of dblp.dtd -->
<!ENTITY % titlecontents "#PCDATA|sub|sup|i|tt">
<!ELEMENT dblp (article|inproceedings|proceedings|book|incollection|
                phdthesis|mastersthesis|www|person|data)*>
<!ENTITY uuml   "&#252;" ><!-- small u, dieresis or umlaut mark -->
<!ENTITY eacute "&#233;" ><!-- small e, acute accent -->
<!ENTITY ouml   "&#246;" >
"""

RECORDS = """\
<article mdate="2020-01-01" key="journals/tit/Schmidt18">
<author>J&uuml;rgen Schmidt</author>
<author>Alice Smith</author>
<title>On <i>Codes</i>.</title>
<year>2018</year>
<journal>IEEE Trans. Inf. Theory</journal>
</article>
<inproceedings mdate="2020-01-01" key="conf/icml/SmithJ19">
<author>Alice Smith</author>
<author orcid="0000-0001-0000-0000">Bob Jones</author>
<title>Learning.</title>
<year>2019</year>
<booktitle>ICML</booktitle>
</inproceedings>
<inproceedings mdate="2021-01-01" key="conf/icml/Smith20">
<author>Alice Smith</author>
<title>More learning.</title>
<year>2020</year>
</inproceedings>
<incollection mdate="2021-01-01" key="series/lncs/White21">
<author>Carol White</author>
<author>Carol White</author>
<title>A chapter.</title>
<year>2021</year>
</incollection>
<article mdate="2017-05-05" key="journals/tit/Old17">
<author>Dan Old</author>
<title>Too early.</title>
<year>2017</year>
</article>
<inproceedings mdate="2022-05-05" key="conf/nips/New22">
<author>Eve New</author>
<title>Too late.</title>
<year>2022</year>
</inproceedings>
<proceedings mdate="2019-05-05" key="conf/icml/2019">
<editor>Ed Itor</editor>
<title>Proceedings of ICML 2019.</title>
<year>2019</year>
</proceedings>
<www mdate="2019-05-05" key="homepages/12/345">
<author>Alice Smith</author>
<title>Home Page</title>
</www>
<phdthesis mdate="2020-05-05" key="phd/Frank20">
<author>Frank Th&eacute;se</author>
<title>A thesis.</title>
<year>2020</year>
</phdthesis>
<article mdate="2020-05-05" key="journals/tit/NoYear">
<author>Gina Noyear</author>
<title>Undated.</title>
</article>
<article mdate="2020-05-05" key="homepages/99/1">
<author>Hal Home</author>
<year>2020</year>
</article>
"""

EXPECTED_RESEARCHERS = ["Alice Smith", "Bob Jones", "Carol White", "Jürgen Schmidt"]
EXPECTED_VENUES = ["conf/icml", "journals/tit", "series/lncs"]
EXPECTED_MATRIX = [[1, 1, 0], [1, 0, 0], [0, 0, 1], [0, 1, 0]]


def xml_text(records: str = RECORDS) -> str:
    return (
        '<?xml version="1.0" encoding="ISO-8859-1"?>\n'
        '<!DOCTYPE dblp SYSTEM "dblp.dtd">\n'
        f"<dblp>\n{records}</dblp>\n"
    )


def write_dblp(data_dir: Path, *, gz: bool = False, records: str = RECORDS) -> Path:
    folder = data_dir / "dblp"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dblp.dtd").write_text(DTD, encoding="latin-1")
    payload = xml_text(records).encode("latin-1")
    if gz:
        target = folder / "dblp.xml.gz"
        target.write_bytes(gzip.compress(payload))
    else:
        target = folder / "dblp.xml"
        target.write_bytes(payload)
    return target


@pytest.mark.parametrize("gz", [False, True], ids=["xml", "xml.gz"])
def test_parses_venue_sets(tmp_path, gz):
    write_dblp(tmp_path, gz=gz)
    vs = load_dblp_venue_sets(tmp_path, cache=False)
    assert vs.name == "dblp-2018-2021"
    assert vs.researchers.tolist() == EXPECTED_RESEARCHERS
    assert vs.venues.tolist() == EXPECTED_VENUES
    assert vs.element_groups.tolist() == ["conf", "journals", "series"]
    assert vs.matrix.dtype == np.float64 and vs.matrix.has_canonical_format
    assert vs.matrix.toarray().tolist() == EXPECTED_MATRIX
    assert (vs.n_users, vs.n_elements) == (4, 3)


def test_entity_is_resolved_from_the_dtd(tmp_path):
    write_dblp(tmp_path)
    vs = load_dblp_venue_sets(tmp_path, cache=False)
    assert "Jürgen Schmidt" in vs.researchers.tolist()


def test_year_window_and_min_venues(tmp_path):
    write_dblp(tmp_path)
    early = load_dblp_venue_sets(tmp_path, years=(2017, 2017), cache=False)
    assert early.name == "dblp-2017-2017"
    assert early.researchers.tolist() == ["Dan Old"]
    assert early.venues.tolist() == ["journals/tit"]
    busy = load_dblp_venue_sets(tmp_path, min_venues_per_researcher=2, cache=False)
    assert busy.researchers.tolist() == ["Alice Smith"]
    assert busy.venues.tolist() == ["conf/icml", "journals/tit"]
    assert busy.element_groups.tolist() == ["conf", "journals"]
    assert busy.matrix.toarray().tolist() == [[1, 1]]


def test_cache_is_written_and_reused(tmp_path, monkeypatch):
    xml = write_dblp(tmp_path, gz=True)
    first = load_dblp_venue_sets(tmp_path)
    cache_file = tmp_path / "dblp" / "cache" / "venue-sets-2018-2021.npz"
    assert cache_file.is_file()

    def refuse(*args, **kwargs):
        raise AssertionError("parsed although the cache is fresh")

    monkeypatch.setattr(dblp, "_parse", refuse)
    again = load_dblp_venue_sets(tmp_path)
    assert again.researchers.tolist() == first.researchers.tolist()
    assert again.venues.tolist() == first.venues.tolist()
    assert again.element_groups.tolist() == first.element_groups.tolist()
    assert (again.matrix != first.matrix).nnz == 0
    assert load_dblp_venue_sets(tmp_path, min_venues_per_researcher=2).n_users == 1

    future = time.time() + 10
    os.utime(xml, (future, future))
    with pytest.raises(AssertionError, match="parsed although"):
        load_dblp_venue_sets(tmp_path)


def test_no_cache_writes_nothing(tmp_path):
    write_dblp(tmp_path)
    load_dblp_venue_sets(tmp_path, cache=False)
    assert not (tmp_path / "dblp" / "cache").exists()


def test_missing_files(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        load_dblp_venue_sets(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "dblp" / "dblp.xml.gz") in message
    assert str(tmp_path / "dblp" / "dblp.dtd") in message
    assert DBLP_URL in message


def test_missing_dtd(tmp_path):
    write_dblp(tmp_path)
    (tmp_path / "dblp" / "dblp.dtd").unlink()
    with pytest.raises(DatasetNotFoundError, match="dblp.dtd is missing"):
        load_dblp_venue_sets(tmp_path)


def test_malformed_xml_reports_line(tmp_path):
    broken = RECORDS.replace("<year>2020</year>\n</inproceedings>", "<year>2020</year>\n</inpro>")
    write_dblp(tmp_path, records=broken)
    with pytest.raises(DataFormatError) as info:
        load_dblp_venue_sets(tmp_path, cache=False)
    lines = xml_text(broken).split("\n")
    bad_line = lines.index("</inpro>") + 1
    message = str(info.value)
    assert f"dblp.xml, line {bad_line}:" in message
    assert "'</inpro>'" in message


def test_undefined_entity_is_an_error(tmp_path):
    write_dblp(tmp_path, records=RECORDS.replace("Bob Jones", "Bob J&oslash;nes"))
    with pytest.raises(DataFormatError, match="oslash"):
        load_dblp_venue_sets(tmp_path, cache=False)


def test_non_integer_year(tmp_path):
    records = RECORDS.replace("<year>2019</year>", "<year>20l9</year>")
    write_dblp(tmp_path, records=records)
    with pytest.raises(DataFormatError, match="non-integer") as info:
        load_dblp_venue_sets(tmp_path, cache=False)
    bad_line = xml_text(records).split("\n").index("<year>20l9</year>") + 1
    assert f"line {bad_line}:" in str(info.value)


def test_truncated_gzip(tmp_path):
    xml = write_dblp(tmp_path, gz=True)
    xml.write_bytes(xml.read_bytes()[:-20])
    with pytest.raises(DataFormatError, match="dblp.xml.gz"):
        load_dblp_venue_sets(tmp_path, cache=False)


def test_summary(tmp_path):
    write_dblp(tmp_path)
    stats = summary(load_dblp_venue_sets(tmp_path, cache=False))
    assert stats["n_researchers"] == 4
    assert stats["n_venues"] == 3
    assert stats["nnz"] == 5
    assert stats["mean_venues_per_researcher"] == pytest.approx(1.25)
    assert stats["median_venues_per_researcher"] == 1.0
    assert stats["max_venues_per_researcher"] == 2
    assert stats["venues_per_group"] == {"conf": 1, "journals": 1, "series": 1}
    assert stats["paper_n_researchers"] == 704_738
    assert stats["paper_n_venues"] == 2_675
    json.dumps(stats)


def test_cli(tmp_path, capsys):
    write_dblp(tmp_path)
    assert main([str(tmp_path), "--no-cache"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["n_researchers"] == 4
    assert main([str(tmp_path / "elsewhere")]) == 1
    assert "dblp.dtd" in capsys.readouterr().out
