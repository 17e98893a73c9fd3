"""``flower-app report`` draws what a reader needs, right: every run, in one colour, named.

The runs are real run folders: FedSM and FedCG on the direct engine (seconds), and a run
resumed after round 3, written by :class:`flower_app.results.RunWriter` in two sessions as a
ServerApp that died and one started with ``resume = true`` write it (the Flower path of the
same resume is ``tests/test_resume.py``, marker ``deploy``). The figures are inspected as
matplotlib draws them (lines, colours, legend texts, tick labels after drawing), the table
as written.
"""

from __future__ import annotations

import time

import pytest
from matplotlib.colors import to_hex

from direct import run_direct
from flower_app.cli.report import (
    draw_figures,
    load_run,
    run_colors,
    run_styles,
    run_times,
    write_report,
)
from flower_app.config import AppConfig
from flower_app.results import RunWriter, run_session

SMALL = {"num-users": 120, "num-elements": 80, "k": 5, "seed": 3}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    ratings = root / "ratings.csv"
    ratings.write_text("customer,product,stars\nann,a,5\nann,b,3\nbob,b,4\ncy,c,2\ncy,a,1\n")
    configs = {
        "fedsm": {"algorithm": "fedsm", **SMALL},
        "fedcg": {"algorithm": "fedcg", "fedcg-rounds": 5, **SMALL},
        "own": {"algorithm": "fedsm", "dataset": "facility-location-table", "k": 2,
                "data-file": str(ratings), "data-columns": "customer,product,stars"},
    }  # fmt: skip
    for name, cfg in configs.items():
        run_direct(AppConfig.from_run_config({**cfg, "output-dir": str(root), "run-name": name}))
    _resumed_run(root / "resumed")
    return root


def _resumed_run(folder) -> None:
    """Write a run folder as a run that died after round 3 and was resumed to round 5 does.

    The first session started 50 s before its last checkpoint and the second 30 s before its
    summary (as a ServerApp's session starts when the SuperLink accepts the run).
    """
    config = {"algorithm": "fedsm", "dataset": "synthetic-facility-location", "seed": 0,
              "engine": "flower", "k": 5, "resume": False}  # fmt: skip
    with run_session(time.time() - 50.0):
        first = RunWriter(folder, config)
        for t in (1, 2, 3):
            first.log_round({"server-round": t, "objective": 1.0 + t, "users": 10, "nodes": 2})
            first.save_checkpoint({"server-round": t, "state": None})
        first.log_round({"server-round": 4, "objective": 9.0})  # after the last checkpoint
    with run_session(time.time() - 30.0):
        second = RunWriter(folder, {**config, "resume": True}, resume=True)
        for t in (4, 5):
            second.log_round({"server-round": t, "objective": 1.0 + t, "users": 10, "nodes": 2})
        second.write_summary({"algorithm": "fedsm", "objective": 6.0, "wall-time": 2.5})


def _loaded(runs, *names):
    return [load_run(runs / name) for name in names]


def _panels(fig):
    return {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}


def test_fedcg_beside_fedsm_is_in_every_panel_it_has_and_in_every_legend(runs) -> None:
    loaded = _loaded(runs, "fedsm", "fedcg")
    colors = run_colors(loaded)
    assert len(set(colors)) == 2
    figures = draw_figures(loaded)
    assert set(figures) == {"quality.png", "bytes.png", "participants.png"}
    quality = _panels(figures["quality.png"])
    # FedCG's rounded F(S) and its ratio (summary.json only) are drawn, at its last round
    fedcg = loaded[1]["summary"]
    for title, key in (("F(S), the true objective", "objective"),
                       ("F(S) / centralized greedy at |S|", "ratio-to-greedy")):  # fmt: skip
        finals = [ln for ln in quality[title].get_lines() if ln.get_gid() == "run-1-final"]
        assert len(finals) == 1
        assert list(finals[0].get_xdata()) == [5]
        assert finals[0].get_ydata()[0] == pytest.approx(fedcg[key])
    # F̂(x): FedCG's own colour, never FedSM's
    multilinear = quality["F̂(x), multilinear extension"].get_lines()
    assert [ln.get_gid() for ln in multilinear] == ["run-1"]
    assert to_hex(multilinear[0].get_color()) == colors[1]
    for name, fig in figures.items():
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        drawn = {ln.get_gid().split("-")[1] for ax in fig.axes for ln in ax.get_lines()}
        for i in drawn:  # every run drawn in a figure is named in its legend
            assert loaded[int(i)]["name"] + " (" in " ".join(legend), (name, legend)
    # FedCG on the direct engine counts no bytes: named under bytes.png, not silently absent
    texts = [t.get_text() for t in figures["bytes.png"].texts]
    assert any("not in this figure" in t and "fedcg (fedcg)" in t for t in texts)


def test_a_run_has_one_colour_and_style_in_every_png(runs) -> None:
    loaded = _loaded(runs, "fedsm", "fedcg", "resumed")
    styles = run_styles(loaded)
    assert len({(s["color"], s["marker"], s["linestyle"]) for s in styles}) == 3
    seen: dict[str, set[tuple[str, str, str]]] = {}
    for fig in draw_figures(loaded).values():
        for ax in fig.axes:
            for line in ax.get_lines():
                run, *final = line.get_gid().split("-")[1:]
                style = (to_hex(line.get_color()), line.get_marker(), line.get_linestyle())
                seen.setdefault(run, set()).add(style[:1] if final else style)
        for handle, text in zip(fig.legends[0].legend_handles, fig.legends[0].get_texts(),
                                strict=True):  # fmt: skip
            for i, run in enumerate(loaded):
                if text.get_text().startswith(run["name"] + " ("):
                    assert to_hex(handle.get_color()) == styles[i]["color"]
                    assert handle.get_marker() == styles[i]["marker"]
    # one (colour, marker, line style) per run over all PNGs; its final star has its colour
    for i, style in enumerate(styles):
        lines = {s for s in seen[str(i)] if len(s) == 3}
        assert lines == {(style["color"], style["marker"], _mpl_linestyle(style["linestyle"]))}
        assert {s[0] for s in seen[str(i)]} == {style["color"]}


def _mpl_linestyle(style: str) -> str:
    from matplotlib.lines import Line2D

    return Line2D([], [], linestyle=style).get_linestyle()


def test_rounds_and_counts_are_integers_every_axis_is_labelled_and_bytes_have_units(
    runs,
) -> None:
    figures = draw_figures(_loaded(runs, "fedsm"))  # one 5-round run
    for name, fig in figures.items():
        fig.canvas.draw()
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            assert ax.get_xlabel() == "server round" and ax.get_ylabel(), (name, ax.get_title())
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)
    participants = _panels(figures["participants.png"])["users"]
    assert participants.get_ylim()[0] == 0  # a count starts at 0 ...
    labels = [t.get_text() for t in participants.get_yticklabels()]
    assert labels and all(label.lstrip("−-").isdigit() for label in labels), labels  # no 1.95
    for ax in _panels(figures["bytes.png"]).values():
        assert ax.get_ylabel() == "bytes per round"
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert labels and all(label.endswith("B") for label in labels), labels


def test_report_md_names_the_data_file_and_the_whole_wall_time_of_a_resumed_run(
    runs, tmp_path
) -> None:
    report = write_report([runs / n for n in ("fedsm", "fedcg", "own", "resumed")], tmp_path)
    lines = report.read_text().splitlines()
    head = [c.strip() for c in lines[2].strip("|").split("|")]
    rows = {}
    for line in lines[4:8]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    assert rows["own"]["dataset"] == "facility-location-table: `ratings.csv`"
    assert rows["fedsm"]["dataset"] == "synthetic-facility-location"
    # the resumed run: both sessions (50 s up to its checkpoint + 30 s), not the rounds' 2.5 s
    resumed = rows["resumed"]
    seconds = float(resumed["run time"].split(" s")[0])
    assert 80.0 <= seconds < 80.0 + 60.0
    assert "(2 sessions, resumed after round 3)" in resumed["run time"]
    assert resumed["rounds time"] == "2.50 s"
    # a direct run's run time holds loading the data and the greedy reference too
    summary = load_run(runs / "fedsm")["summary"]
    assert summary["run-wall-time"] >= summary["wall-time"] and summary["run-sessions"] == 1
    for png in ("quality.png", "bytes.png", "participants.png"):
        assert f"![{png[:-4]}]({png})" in lines
        assert (tmp_path / png).stat().st_size > 10_000


def test_the_time_columns_say_what_they_measure(tmp_path) -> None:
    """Under flwr run the strategy's time holds discovery before round 1: the rounds column
    sums the rounds' own time (1.1 s), discovery is apart (31.2 s), start-up too."""
    folder = tmp_path / "flwr-run"
    config = {"algorithm": "fedsm", "dataset": "synthetic-facility-location", "seed": 0,
              "engine": "flower", "k": 2}  # fmt: skip
    with run_session(time.time() - 40.0):
        writer = RunWriter(folder, config)
        for t, seconds in ((1, 0.5), (2, 0.6)):
            writer.log_round({"server-round": t, "objective": t, "round-time": seconds})
        writer.write_summary({"algorithm": "fedsm", "objective": 2.0, "wall-time": 32.3})
    times = run_times(load_run(folder))
    assert times["rounds"] == pytest.approx(1.1) and times["discovery"] == pytest.approx(31.2)
    assert 7.0 <= times["start-up"] < 7.0 + 60.0 and times["run"] >= 40.0
    report = write_report([folder], tmp_path / "out").read_text().splitlines()
    head = [c.strip() for c in report[2].strip("|").split("|")]
    row = dict(zip(head, [c.strip() for c in report[4].strip("|").split("|")], strict=True))
    assert row["rounds time"] == "1.10 s" and row["discovery"] == "31.2 s"
