"""``flower-app report``: figures and a one-page Markdown summary of run folders.

A run folder (:class:`flower_app.results.RunWriter`) holds ``config.json``,
``metrics.jsonl`` (one JSON object per round) and, once finished, ``summary.json``. For any
number of runs of any family this writes, into one folder:

``quality.png``
    the family's headline metrics by round: F(S), F(S) over centralized greedy and F̂(x)
    (submodular families), train and test loss, test accuracy (FedSubAvg), accuracy and
    GM-Appeal of seen and unseen clients (MaxFL family); one panel per metric, every run on
    each panel. A run that records F(S) only once, after rounding its last round's point
    (FedCG, FedCG+), shows it as a star at its last round;
``bytes.png``
    bytes up and down per round;
``participants.png``
    users (clients, nodes) taking part in each round;
``report.md``
    a table of every run's final numbers and the figures.

Each run has one colour in every figure, and every figure's legend names each run drawn in
it (a run with no data for a figure is named under it). Rounds are integers on every axis;
counts start at 0; bytes carry their unit.

A metric a run does not record is left out of its panels; a panel no run has is not drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flower_app.results import read_run

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw_figures", "load_run", "run_colors", "run_styles", "write_report"]

#: headline metrics by round, in panel order: key -> (panel title, y-axis label)
QUALITY = {
    "objective": ("F(S), the true objective", "F(S)"),
    "ratio-to-greedy": ("F(S) / centralized greedy at |S|", "ratio to greedy"),
    "multilinear": ("F̂(x), multilinear extension", "F̂(x)"),
    "train-loss": ("train loss", "loss"),
    "test-loss": ("test loss", "loss"),
    "test-accuracy": ("test accuracy", "accuracy"),
    "seen-acc": ("seen clients: accuracy", "accuracy"),
    "seen-gm-appeal": ("seen clients: GM-Appeal", "GM-Appeal"),
    "unseen-acc": ("unseen clients: accuracy", "accuracy"),
    "unseen-gm-appeal": ("unseen clients: GM-Appeal", "GM-Appeal"),
}
BYTES = {
    "bytes-up": ("bytes up (nodes to server)", "bytes per round"),
    "bytes-down": ("bytes down (server to nodes)", "bytes per round"),
}
PARTICIPANTS = {
    "users": ("users", "users per round"),
    "clients": ("clients", "clients per round"),
    "sampled": ("sampled clients", "clients per round"),
    "pool-size": ("opt-in pool", "clients"),
    "nodes": ("nodes", "nodes per round"),
}
#: the PNGs: file name -> (panels, suptitle, kind of y axis)
FIGURES = {
    "quality.png": (QUALITY, "Quality by round", "value"),
    "bytes.png": (BYTES, "Bytes per round", "bytes"),
    "participants.png": (PARTICIPANTS, "Participants per round", "count"),
}
#: quality keys a run may record only in summary.json, after its last round (rounding)
FINAL_ONLY = ("objective", "ratio-to-greedy")
#: summary.json fields shown in the table, when a run has them
SUMMARY_FIELDS = (
    "objective",
    "greedy-objective",
    "ratio-to-greedy",
    "multilinear",
    "train-loss",
    "min-train-loss",
    "test-loss",
    "test-accuracy",
    "bad-replies",
    "degraded",
)


def load_run(folder: str | Path) -> dict[str, Any]:
    """Return a run folder's ``config``, ``rows`` (metrics.jsonl), ``summary`` (or {}) and name.

    Parameters
    ----------
    folder : str or pathlib.Path
        A run folder.

    Returns
    -------
    dict
        ``name``, ``folder``, ``config``, ``rows`` (with ``ratio-to-greedy`` added where
        the summary has the greedy curve) and ``summary``.

    Raises
    ------
    ValueError
        If ``config.json`` is missing, a file is not valid JSON or a row has no
        ``server-round`` (file and line named; :func:`flower_app.results.read_run`).
    """
    run = read_run(folder)
    for number, row in enumerate(run.rows, 1):
        if "server-round" not in row:
            raise ValueError(f"{run.folder / 'metrics.jsonl'}: row {number}: no server-round")
    rows, summary = run.rows, run.summary or {}
    greedy = summary.get("greedy-by-k")  # submodular runs: F of greedy's first k elements
    if isinstance(greedy, list):
        for row in rows:
            size, value = row.get("set-size", row.get("server-round")), row.get("objective")
            usable = isinstance(value, int | float) and isinstance(size, int)
            if usable and 0 < size <= len(greedy) and greedy[size - 1]:
                row["ratio-to-greedy"] = float(value) / float(greedy[size - 1])
    return {"name": run.name, "folder": run.folder, "config": run.config, "rows": rows,
            "summary": summary}  # fmt: skip


def _names(runs: list[dict[str, Any]]) -> list[str]:
    """Each run's folder name; ``parent/name`` where two runs' names are the same."""
    plain = [r["name"] for r in runs]
    return [
        f"{r['folder'].parent.name}/{name}" if plain.count(name) > 1 else name
        for r, name in zip(runs, plain, strict=True)
    ]


def _labels(runs: list[dict[str, Any]]) -> list[str]:
    """``name (algorithm)`` per run, as the legends show them."""
    return [
        f"{name} ({r['config'].get('algorithm', '?')})"
        for r, name in zip(runs, _names(runs), strict=True)
    ]


def run_colors(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Return one colour per run (hex), by its position in ``runs``.

    The same run is the same colour in every figure of a report.

    Parameters
    ----------
    runs : sequence of dict
        Loaded runs (:func:`load_run`), in the order given on the command line.

    Returns
    -------
    list of str
        Colours from matplotlib's ``tab10`` (``tab20`` beyond ten runs, cycling beyond 20).
    """
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps["tab10" if len(runs) <= 10 else "tab20"]
    return [to_hex(cmap(i % cmap.N)) for i in range(len(runs))]


#: per-run marker and line style (by position, with the colour), so that runs whose curves
#: coincide (e.g. two runs with the same users per round) stay distinguishable
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
_LINES = ("-", "--", "-.", ":")


def run_styles(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return each run's ``color``, ``marker``, ``linestyle`` and sizes, the same in every figure.

    Earlier runs are drawn with larger markers and wider lines, so a later run drawn on top of
    the same values (e.g. the same users per round) leaves the earlier one visible around it.

    Parameters
    ----------
    runs : sequence of dict
        Loaded runs (:func:`load_run`), in the order given on the command line.

    Returns
    -------
    list of dict
        Matplotlib keyword arguments per run.
    """
    return [
        {"color": color, "marker": _MARKERS[i % len(_MARKERS)],
         "linestyle": _LINES[(i // len(_MARKERS) + i) % len(_LINES)],
         "markersize": max(3.0, 7.0 - 1.5 * i), "linewidth": max(1.0, 2.6 - 0.6 * i)}
        for i, color in enumerate(run_colors(runs))
    ]  # fmt: skip


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _series(run: dict[str, Any], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in run["rows"]:
        value = _numeric(row.get(key))
        if value is not None:
            xs.append(int(row["server-round"]))
            ys.append(value)
    return xs, ys


def _final_point(run: dict[str, Any], key: str) -> tuple[int, float] | None:
    """Return ``(last round, summary's value of key)`` for a run that records it only after.

    FedCG records F(S) of the rounded set once, in ``summary.json``; None for a run that has
    the metric by round (or not at all).
    """
    if key not in FINAL_ONLY or _series(run, key)[0] or not run["rows"]:
        return None
    value = _numeric(run["summary"].get(key))
    if value is None:
        return None
    return max(int(r["server-round"]) for r in run["rows"]), value


def _round_range(runs: list[dict[str, Any]]) -> tuple[float, float]:
    rounds = [int(r["server-round"]) for run in runs for r in run["rows"]] or [1]
    lo, hi = min(rounds), max(rounds)
    pad = 0.5 if hi - lo < 20 else 0.02 * (hi - lo)
    return lo - pad, hi + pad


def _draw(
    runs: list[dict[str, Any]],
    labels: list[str],
    styles: list[dict[str, str]],
    panels: dict[str, tuple[str, str]],
    title: str,
    kind: str,
) -> Figure | None:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import EngFormatter, MaxNLocator

    present = [
        key for key in panels if any(_series(r, key)[0] or _final_point(r, key) for r in runs)
    ]
    if not present:
        return None
    cols = min(3, len(present))
    nrows = math.ceil(len(present) / cols)
    fig = Figure(figsize=(5.2 * cols, 3.5 * nrows + 0.9))
    axes = fig.subplots(nrows, cols, squeeze=False)
    xlim = _round_range(runs)
    drawn: set[int] = set()
    finals = False
    for ax, key in zip(axes.flat, present, strict=False):
        top = 0.0
        for i, run in enumerate(runs):
            xs, ys = _series(run, key)
            if xs:
                style = dict(styles[i])
                if len(xs) > 60:  # a long curve: the line alone
                    style["marker"] = None
                ax.plot(xs, ys, gid=f"run-{i}", **style)
                drawn.add(i)
                top = max(top, *ys)
            final = _final_point(run, key)
            if final is not None:
                ax.plot([final[0]], [final[1]], color=styles[i]["color"], marker="*", markersize=12,
                        linestyle="none", gid=f"run-{i}-final")  # fmt: skip
                drawn.add(i)
                finals = True
                top = max(top, final[1])
        name, ylabel = panels[key]
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("server round")
        ax.set_ylabel(ylabel)
        ax.set_xlim(*xlim)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if kind == "count":  # counts: integers from 0 (no "1.95 nodes")
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylim(0, max(1.0, top * 1.08))
        elif kind == "bytes":
            ax.yaxis.set_major_formatter(EngFormatter(unit="B"))
            ax.set_ylim(0, max(1.0, top * 1.08))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.set_visible(False)
    handles = [Line2D([], [], label=labels[i], **styles[i]) for i in sorted(drawn)]
    if finals:
        handles.append(
            Line2D(
                [],
                [],
                color="dimgray",
                marker="*",
                markersize=10,
                linestyle="none",
                label="F(S) of the rounded set, after the last round",
            )  # fmt: skip
        )
    legend_rows = math.ceil(len(handles) / 4)
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8,
               frameon=False)  # fmt: skip
    missing = [labels[i] for i in range(len(runs)) if i not in drawn]
    if missing:
        fig.text(0.01, 0.005, "not in this figure (no such metric): " + ", ".join(missing),
                 fontsize=7, color="dimgray")  # fmt: skip
    fig.suptitle(title)
    bottom = (0.25 * legend_rows + 0.25 * bool(missing) + 0.1) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 0.97))
    return fig


def draw_figures(runs: Sequence[dict[str, Any]]) -> dict[str, Figure]:
    """Draw the report's figures of loaded runs (without saving them).

    Parameters
    ----------
    runs : sequence of dict
        Loaded runs (:func:`load_run`).

    Returns
    -------
    dict
        PNG file name (``quality.png``, ``bytes.png``, ``participants.png``) -> matplotlib
        ``Figure``, for the figures any run has data for. Run ``i`` has the style
        ``run_styles(runs)[i]`` (colour, marker, line style) and its lines the ``gid``
        ``"run-<i>"`` in every figure.
    """
    runs = list(runs)
    labels, styles = _labels(runs), run_styles(runs)
    out = {}
    for name, (panels, title, kind) in FIGURES.items():
        fig = _draw(runs, labels, styles, panels, title, kind)
        if fig is not None:
            out[name] = fig
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _dataset(config: dict[str, Any]) -> str:
    """Return the dataset as a user named it: the file of your own data, else the folder."""
    name = str(config.get("dataset", "?"))
    data_file = config.get("data-file") or ""
    if data_file:
        return f"{name}: `{Path(str(data_file)).name}`"
    data_dir = config.get("data-dir") or ""
    return f"{name} (`{data_dir}`)" if data_dir else name


def _seconds(value: Any) -> str:
    value = _numeric(value)
    if value is None:
        return "–"
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def _run_time(summary: dict[str, Any]) -> str:
    cell = _seconds(summary.get("run-wall-time"))
    sessions = summary.get("run-sessions")
    if isinstance(sessions, int) and sessions > 1:
        cell += f" ({sessions} sessions, resumed after round {summary.get('resumed-from-round')})"
    return cell


def run_times(run: dict[str, Any]) -> dict[str, float | None]:
    """Return a run's times, each measuring one thing (seconds; None: not recorded).

    ``run``: the whole run (``summary.json``'s ``run-wall-time``: every session of a
    resumed run). ``start-up``: before the strategy started (loading the data, the greedy
    reference), this session. ``discovery``: the strategy's start before round 1 (under
    ``flwr run``: nodes registering, discovery of their users, round 0's evaluation; the
    summary's ``wall-time`` less the rounds), this session. ``rounds``: the rounds
    themselves (the sum of the rows' ``round-time``, every session; without it, as on the
    direct engine, the summary's ``wall-time``).

    Parameters
    ----------
    run : dict
        :func:`load_run`'s run.
    """
    summary, rows = run["summary"], run["rows"]
    total, strategy = _numeric(summary.get("run-wall-time")), _numeric(summary.get("wall-time"))
    resumed = _numeric(summary.get("resumed-from-round")) or 0
    timed = [r for r in rows if _numeric(r.get("server-round")) and r["server-round"] >= 1]
    times = [_numeric(r.get("round-time")) for r in timed]
    if timed and all(t is not None for t in times):
        rounds = float(sum(times))  # type: ignore[arg-type]
        session = sum(t for r, t in zip(timed, times, strict=True)
                      if r["server-round"] > resumed)  # type: ignore[misc]  # fmt: skip
        discovery = None if strategy is None else max(0.0, strategy - session)
    else:
        rounds, discovery = strategy, None
    start_up = None
    if total is not None and strategy is not None and not resumed:
        start_up = max(0.0, total - strategy)
    return {"run": total, "start-up": start_up, "discovery": discovery, "rounds": rounds}


def write_report(runs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """Write the figures and ``report.md`` of ``runs`` into ``out``; return ``report.md``.

    Parameters
    ----------
    runs : sequence of path
        Run folders.
    out : path, optional
        Output folder (default: the first run's folder).

    Returns
    -------
    pathlib.Path
        The written ``report.md``.

    Raises
    ------
    ValueError
        For a folder that is not a run folder or holds malformed files.
    """
    loaded = [load_run(folder) for folder in runs]
    if not loaded:
        raise ValueError("no run folders given")
    folder = Path(out) if out is not None else loaded[0]["folder"]
    folder.mkdir(parents=True, exist_ok=True)
    figures = draw_figures(loaded)
    for name, fig in figures.items():
        fig.savefig(folder / name, dpi=110)
    fields = [f for f in SUMMARY_FIELDS if any(f in r["summary"] for r in loaded)]
    head = ["run", "algorithm", "dataset", "engine", "seed", "rounds", *fields,
            "run time", "start-up", "discovery", "rounds time"]  # fmt: skip
    lines = [
        "# Run report",
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    for run, label in zip(loaded, _names(loaded), strict=True):
        cfg, summary = run["config"], run["summary"]
        rounds = max((int(r["server-round"]) for r in run["rows"]), default=0)
        cells = [_cell(c) for c in (label, cfg.get("algorithm"))]
        cells += [_dataset(cfg)]
        cells += [_cell(c) for c in (cfg.get("engine"), cfg.get("seed"), rounds)]
        cells += [_cell(summary.get(f)) for f in fields]
        times = run_times(run)
        cells += [_run_time(summary), *(_seconds(times[k]) for k in ("start-up", "discovery",
                                                                      "rounds"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "*run time*: from the start of the run (the SuperLink accepting it under `flwr run`, "
        "the call under the direct engine) to its summary; for a resumed run, every session "
        "up to its last checkpoint. It holds the three columns after it: *start-up*, before "
        "the strategy starts (loading the data, the greedy reference; – after a resume); "
        "*discovery*, the strategy's start before round 1 (under `flwr run`: the nodes "
        "registering, the discovery of their users, round 0's evaluation; – on the direct "
        "engine, which has none); *rounds time*, the rounds themselves (each row's "
        "`round-time`, every session; on the direct engine the strategy's whole time).",
    ]
    unfinished = [label for r, label in zip(loaded, _names(loaded), strict=True)
                  if not r["summary"]]  # fmt: skip
    if unfinished:
        lines += ["", f"Not finished (no summary.json): {', '.join(unfinished)}."]
    for name in figures:
        lines += ["", f"![{name[:-4]}]({name})"]
    report = folder / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report
