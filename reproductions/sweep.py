"""The one skeleton of every reproduction: a grid of runs, resumed, named, tabulated, drawn.

Every ``run_sim.py`` command (one module per paper) does the same things, held here once; the
paper's module keeps only what is its own: its grid, the columns of its rows, the numbers of
its tables, the contents of its figures, its options.

1. **Plan**: one :class:`Run` per configuration and seed, named from its parts (:func:`slug`,
   :func:`label_slug`); its run folder is ``<out>/runs/<name>`` (:class:`Sweep`).
2. **Run** on the direct engine (:func:`run_direct_config`), one after the other or in
   ``--jobs`` fresh processes (:meth:`Sweep.execute`: each run is seeded and independent, so
   the results are those of a serial sweep).
3. **Resume**: rerun into the same ``--out``, a command skips the runs it already has, by one
   of two rules. A command whose tables are rebuilt from the run folders (``maxfl``,
   ``fedsubavg``) counts a run done when its folder holds ``summary.json``
   (:meth:`Sweep.finished`); a command that appends one CSV row per run as it finishes
   (``fedcg run``, ``fedsm-modes``) counts it done when its row is in the CSV
   (:func:`csv_keys`). ``fedsm-sweep`` and ``privacy`` run their whole grid each time.
4. **Collect**: rows from the run folders (:func:`flower_app.results.read_run`, the one
   reader of a run folder), written as CSV (:func:`write_csv`, :func:`append_csv`).
5. **Tabulate and draw**: Markdown tables (:func:`markdown_table`, :func:`group_by`) and PNG
   figures (:func:`figure`).

The command-line options every command shares (``--dataset`` offering exactly the datasets
the command can run, ``--seeds``, ``--out``, ``--jobs``, ...) and the exit status of a bad
input (:func:`run_command`) are here too.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower_app.config import ConfigError
from flower_app.registry import ALGORITHMS
from flower_app.settings import help_text

__all__ = [
    "FILE_DATASETS",
    "RUNS",
    "Run",
    "Sweep",
    "add_dataset",
    "add_jobs",
    "add_seeds",
    "add_sizes",
    "append_csv",
    "csv_keys",
    "data_overrides",
    "figure",
    "group_by",
    "label_slug",
    "markdown_table",
    "read_csv",
    "run_command",
    "run_direct_config",
    "runnable_datasets",
    "slug",
    "write_csv",
]

#: the folder of a sweep's run folders, under its ``--out``
RUNS = "runs"
#: dataset kinds read from run_config ``data-file`` (your own data, docs/own-data.md): a
#: command without a ``--data-file`` option cannot run them
FILE_DATASETS = ("facility-location-table", "coverage-sets", "image-clients", "rating-table")


# ----------------------------------------------------------------------------- plan, names
@dataclass(frozen=True)
class Run:
    """One planned run of a sweep.

    Attributes
    ----------
    name : str
        Its run folder's name under ``<out>/runs/`` (its ``run-name``).
    config : dict
        Its run_config (``output-dir`` and ``run-name`` are added by :class:`Sweep`).
    labels : dict
        What identifies it in the sweep's rows (variant, setting, seed, ...).
    """

    name: str
    config: dict[str, Any]
    labels: dict[str, Any] = field(default_factory=dict)


def slug(value: Any) -> str:
    """Return a value as part of a run folder's name: ``0.05`` -> ``0p05``, ``20`` -> ``20``."""
    return str(value).replace(".", "p")


def label_slug(text: str) -> str:
    """Return a free-text label as part of a name: ``"j from 1, no cap"`` -> ``j-from-1--no-cap``.

    Each character that is not a letter or a digit becomes ``-``; the result is lower case,
    without a leading or trailing ``-``.
    """
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").lower()


# ----------------------------------------------------------------------------- run, resume
def run_direct_config(run_config: Mapping[str, Any], progress: bool = False) -> dict[str, Any]:
    """Run one run_config on the direct engine (its run folder written); return its summary.

    The worker of :meth:`Sweep.execute` (a module-level function: a pool's processes import
    it). The direct engine runs the same math as the Flower strategies.
    """
    from direct import run_direct
    from flower_app.config import AppConfig

    return run_direct(AppConfig.from_run_config(dict(run_config)), progress=progress)


class Sweep:
    """The runs of one sweep: their folders in ``<out>/runs/``, running them, resuming.

    Parameters
    ----------
    out : str or pathlib.Path
        The sweep's output folder (``--out``).
    """

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        #: the run folders' parent (absolute: the same from any working directory)
        self.runs = (self.out / RUNS).resolve()

    def folder(self, run: Run | str) -> Path:
        """Return the run folder of ``run`` (a :class:`Run` or its name)."""
        return self.runs / (run.name if isinstance(run, Run) else run)

    def run_config(self, run: Run) -> dict[str, Any]:
        """Return the run_config of ``run``, writing its folder under ``<out>/runs/``."""
        return {**run.config, "output-dir": str(self.runs), "run-name": run.name}

    def finished(self, run: Run | str) -> bool:
        """Return whether ``run`` has finished: its folder holds ``summary.json``."""
        return (self.folder(run) / "summary.json").is_file()

    def set_aside(self, run: Run) -> Path | None:
        """Move an earlier folder of ``run`` aside before it runs again; return where to.

        A run folder is never overwritten: an interrupted run (no ``summary.json``) or one
        asked for again keeps its files, renamed ``<name>.previous-<k>`` (said on stderr).
        """
        folder = self.folder(run)
        if not folder.exists() or not any(folder.iterdir()):
            return None
        k = 1
        while folder.with_name(f"{folder.name}.previous-{k}").exists():
            k += 1
        target = folder.with_name(f"{folder.name}.previous-{k}")
        folder.rename(target)
        print(f"{folder}: an earlier run's folder, kept as {target.name}", file=sys.stderr)
        return target

    def execute(
        self,
        runs: Sequence[Run],
        jobs: int = 1,
        worker: Callable[..., dict[str, Any]] = run_direct_config,
        **options: Any,
    ) -> Iterator[tuple[Run, dict[str, Any]]]:
        """Run every run of ``runs``; yield ``(run, summary)`` as each one finishes.

        Parameters
        ----------
        runs : sequence of Run
            The runs to do (the caller has left out those it resumes).
        jobs : int, optional
            1: one after the other, in order; more: that many processes, each started
            fresh (``spawn``: no torch or OpenMP state inherited through ``fork``), the
            runs yielded as they finish.
        worker : callable, optional
            ``worker(run_config, **options) -> summary`` (default :func:`run_direct_config`);
            with ``jobs`` > 1 a module-level function.
        **options
            Passed to ``worker``.

        Yields
        ------
        tuple
            The run and its summary.
        """
        (self.runs).mkdir(parents=True, exist_ok=True)
        for run in runs:
            self.set_aside(run)
        if jobs <= 1:
            for run in runs:
                yield run, worker(self.run_config(run), **options)
            return
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {pool.submit(worker, self.run_config(r), **options): r for r in runs}
            for future in as_completed(futures):
                yield futures[future], future.result()


# ----------------------------------------------------------------------------- CSV
def write_csv(
    path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None
) -> None:
    """Write ``rows`` to ``path`` with a header (``columns``, default: the first row's keys)."""
    columns = list(columns) if columns is not None else list(rows[0])
    with Path(path).open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def append_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """Append ``rows`` to ``path``, its header first if the file is new.

    Keys not in ``columns`` are left out.
    """
    path = Path(path)
    new = not path.exists()
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    """Return the rows of a CSV file as text (none if the file does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def csv_keys(path: Path, columns: Sequence[str]) -> set[tuple[str, ...]]:
    """Return the ``columns`` of every row already in ``path``, as text: the runs done."""
    return {tuple(row[c] for c in columns) for row in read_csv(path)}


# ----------------------------------------------------------------------------- tables, figures
def group_by(rows: Iterable[Mapping[str, Any]], key: str | Sequence[str]) -> dict[Any, list]:
    """Return the rows by their value of ``key``, in the order each group first appears.

    ``key`` a column name: the groups are keyed by its value; a sequence of names: by the
    tuple of their values.
    """
    groups: dict[Any, list[Any]] = {}
    for row in rows:
        value = row[key] if isinstance(key, str) else tuple(row[k] for k in key)
        groups.setdefault(value, []).append(row)
    return groups


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Return the lines of a Markdown table: the header, its rule, one line per row.

    An empty header cell is written ``| |``; cells are written with ``str``.
    """
    head = "|" + "".join(f" {h} |" if h else " |" for h in header)
    lines = [head, "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def pyplot() -> Any:
    """Return ``matplotlib.pyplot`` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def figure(
    path: Path,
    nrows: int = 1,
    ncols: int = 1,
    *,
    dpi: int,
    rect: tuple[float, float, float, float] | None = None,
    **subplots: Any,
) -> Iterator[tuple[Any, Any]]:
    """Draw one PNG: yield ``(figure, axes)``, then lay it out, save it to ``path``, close it.

    Parameters
    ----------
    path : pathlib.Path
        The PNG to write (only if the drawing raised nothing).
    nrows, ncols : int, optional
        The grid of axes (``matplotlib.pyplot.subplots``).
    dpi : int
        Resolution of the PNG.
    rect : tuple of float, optional
        ``tight_layout``'s rectangle (room for a figure legend).
    **subplots
        More arguments of ``subplots`` (``figsize``, ``sharex``, ``squeeze``, ...).
    """
    plt = pyplot()
    fig, axes = plt.subplots(nrows, ncols, **subplots)
    try:
        yield fig, axes
        fig.tight_layout(**({} if rect is None else {"rect": rect}))
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------- options
def runnable_datasets(
    algorithm: str, data_file: bool = False, exclude: Iterable[str] = ()
) -> tuple[str, ...]:
    """Return the datasets a command of ``algorithm`` can run, in the registry's order.

    Parameters
    ----------
    algorithm : str
        An algorithm of :data:`flower_app.registry.ALGORITHMS` (its family's datasets).
    data_file : bool, optional
        Whether the command has a ``--data-file`` option (else :data:`FILE_DATASETS` are
        left out).
    exclude : iterable of str, optional
        Datasets the command cannot run for another reason (say why where it is called).

    Returns
    -------
    tuple of str
        The ``--dataset`` choices.
    """
    skip = set(exclude) | (set() if data_file else set(FILE_DATASETS))
    return tuple(d for d in ALGORITHMS[algorithm].datasets if d not in skip)


def add_dataset(
    parser: argparse.ArgumentParser,
    choices: Sequence[str],
    default: str | None = None,
    data_dir_default: str = "",
    data_dir_note: str = "",
) -> None:
    """Add ``--dataset`` and ``--data-dir``.

    ``choices`` are :func:`runnable_datasets` of the command; without a default the option
    is required.
    """
    note = f" (default: {default})" if default is not None else ""
    parser.add_argument("--dataset", default=default, required=default is None,
                        choices=list(choices), help=help_text("dataset") + note)  # fmt: skip
    parser.add_argument("--data-dir", default=data_dir_default,
                        help=help_text("data-dir") + data_dir_note)  # fmt: skip


def add_sizes(parser: argparse.ArgumentParser) -> None:
    """Add ``--num-users`` and ``--num-elements`` (0: the dataset's default)."""
    parser.add_argument("--num-users", type=int, default=0, help=help_text("num-users"))
    parser.add_argument("--num-elements", type=int, default=0, help=help_text("num-elements"))


def add_seeds(parser: argparse.ArgumentParser, default: Sequence[int] = (0, 1, 2)) -> None:
    """Add ``--seeds`` (algorithm seeds, one run each)."""
    text = " ".join(map(str, default))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(default),
                        help=f"algorithm seeds (default: {text})")  # fmt: skip


def add_jobs(parser: argparse.ArgumentParser, what: str = "runs in parallel processes") -> None:
    """Add ``--jobs`` (processes for the runs; at least 1: :func:`run_command` checks)."""
    parser.add_argument("--jobs", type=int, default=1, help=f"{what} (>= 1, default 1)")


def data_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Return the run_config entries of ``--data-dir``, ``--num-users`` and ``--num-elements``.

    Only the options given (non-empty, non-zero): the others keep their run_config default.
    """
    given = {
        "data-dir": args.data_dir,
        "num-users": args.num_users,
        "num-elements": args.num_elements,
    }
    return {key: value for key, value in given.items() if value}


def run_command(
    parser: argparse.ArgumentParser,
    command: Callable[[argparse.Namespace], Any],
    argv: Sequence[str] | None,
) -> int:
    """Parse ``argv`` and run ``command(args)``; return the exit status.

    ``--jobs`` below 1 is a usage error (the parser's, exit 2). A configuration, file or
    value error is printed as ``<prog> [<subcommand>]: error: ...`` on stderr, with exit
    status 2, without a traceback: a bad option fails before the first run (the commands
    check every configuration first).
    """
    args = parser.parse_args(argv)
    if getattr(args, "jobs", 1) < 1:
        parser.error("--jobs must be >= 1")
    try:
        command(args)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        name = " ".join([parser.prog, *([args.command] if getattr(args, "command", "") else [])])
        print(f"{name}: error: {err}", file=sys.stderr)
        return 2
    return 0
