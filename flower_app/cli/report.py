"""``flower-app report``: figures and a one-page Markdown summary of run folders.

A run folder (:class:`flower_app.results.RunWriter`) holds ``config.json``,
``metrics.jsonl`` (one JSON object per round) and, once finished, ``summary.json``. For any
number of runs of any family this writes, into one folder:

``quality.png``
    the family's headline metrics by round: F(S) and F̂(x) (submodular families), train
    and test loss, test accuracy (FedSubAvg), accuracy and GM-Appeal of seen and unseen
    clients (MaxFL family); one panel per metric, every run on each panel;
``bytes.png``
    bytes up and down per round;
``participants.png``
    users (clients, nodes) taking part in each round;
``report.md``
    a table of every run's final numbers and the figures.

A metric a run does not record is left out of its panels; a panel no run has is not drawn.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["load_run", "write_report"]

#: headline metrics by round, in panel order (a key -> its axis label)
QUALITY = {
    "objective": "F(S) (true objective)",
    "ratio-to-greedy": "F(S) / centralized greedy at |S|",
    "multilinear": "F̂(x) (multilinear)",
    "train-loss": "train loss",
    "test-loss": "test loss",
    "test-accuracy": "test accuracy",
    "seen-acc": "seen clients: accuracy",
    "seen-gm-appeal": "seen clients: GM-Appeal",
    "unseen-acc": "unseen clients: accuracy",
    "unseen-gm-appeal": "unseen clients: GM-Appeal",
}
BYTES = {"bytes-up": "bytes up", "bytes-down": "bytes down"}
PARTICIPANTS = {
    "users": "users",
    "clients": "clients",
    "sampled": "sampled clients",
    "pool-size": "opt-in pool",
    "nodes": "nodes",
}
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
    "wall-time",
)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (is {path.parent} a run folder?)") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: line {err.lineno}: not JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def load_run(folder: str | Path) -> dict[str, Any]:
    """Return a run folder's ``config``, ``rows`` (metrics.jsonl), ``summary`` (or {}) and name.

    Raises
    ------
    ValueError
        If ``config.json`` is missing or a file is not valid JSON (file and line named).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder")
    config = _read_json(folder / "config.json")
    rows: list[dict[str, Any]] = []
    metrics = folder / "metrics.jsonl"
    if metrics.exists():
        for number, line in enumerate(metrics.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{metrics}: line {number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict) or "server-round" not in row:
                raise ValueError(f"{metrics}: line {number}: expected an object with server-round")
            rows.append(row)
    summary = _read_json(folder / "summary.json") if (folder / "summary.json").exists() else {}
    greedy = summary.get("greedy-by-k")  # submodular runs: F of greedy's first k elements
    if isinstance(greedy, list):
        for row in rows:
            size, value = row.get("set-size", row.get("server-round")), row.get("objective")
            usable = isinstance(value, int | float) and isinstance(size, int)
            if usable and 0 < size <= len(greedy) and greedy[size - 1]:
                row["ratio-to-greedy"] = float(value) / float(greedy[size - 1])
    return {"name": folder.name, "folder": folder, "config": config, "rows": rows,
            "summary": summary}  # fmt: skip


def _label(run: dict[str, Any]) -> str:
    algorithm = run["config"].get("algorithm", "?")
    return f"{run['name']} ({algorithm})"


def _series(run: dict[str, Any], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in run["rows"]:
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(float(value)):
            xs.append(int(row["server-round"]))
            ys.append(float(value))
    return xs, ys


def _figure(runs: list[dict[str, Any]], keys: dict[str, str], path: Path, title: str) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(_series(r, k)[0] for r in runs)]
    if not present:
        return False
    cols = min(3, len(present))
    nrows = math.ceil(len(present) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, present, strict=False):
        for run in runs:
            xs, ys = _series(run, key)
            if xs:
                ax.plot(xs, ys, marker="." if len(xs) <= 60 else None, label=_label(run))
        ax.set_title(keys[key])
        ax.set_xlabel("server round")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08 + 0.02 * (len(labels) // 3), 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_report(runs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """Write the figures and ``report.md`` of ``runs`` into ``out``; return ``report.md``.

    Parameters
    ----------
    runs : sequence of path
        Run folders.
    out : path, optional
        Output folder (default: the first run's folder).

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
    figures = []
    for name, keys, title in (
        ("quality.png", QUALITY, "Quality by round"),
        ("bytes.png", BYTES, "Bytes per round"),
        ("participants.png", PARTICIPANTS, "Participants per round"),
    ):
        if _figure(loaded, keys, folder / name, title):
            figures.append(name)
    fields = [f for f in SUMMARY_FIELDS if any(f in r["summary"] for r in loaded)]
    lines = [
        "# Run report",
        "",
        "| run | algorithm | dataset | engine | seed | rounds | "
        + " | ".join(fields)
        + (" |" if fields else "|"),
        "|---" * (6 + len(fields)) + "|",
    ]
    for run in loaded:
        cfg, summary = run["config"], run["summary"]
        rounds = max((int(r["server-round"]) for r in run["rows"]), default=0)
        cells = [run["name"], cfg.get("algorithm"), cfg.get("dataset"), cfg.get("engine"),
                 cfg.get("seed"), rounds]  # fmt: skip
        cells += [summary.get(f) for f in fields]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    unfinished = [r["name"] for r in loaded if not r["summary"]]
    if unfinished:
        lines += ["", f"Not finished (no summary.json): {', '.join(unfinished)}."]
    for name in figures:
        lines += ["", f"![{name[:-4]}]({name})"]
    report = folder / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report
