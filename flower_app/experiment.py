"""One experiment, either engine: config -> problem -> run -> run folder.

The ServerApp (:mod:`flower_app.server_app`) runs a family's server step over Flower; the
direct engine (the repository's ``direct/``, not installed) runs the same step in-process.
Both write the same run folder through :func:`open_run` and :func:`finish_run`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from flower_app.config import AppConfig
from flower_app.problems import SubmodularProblem, build_matroid, load_problem
from flower_app.results import ResumeError, RunWriter
from flower_app.submodular.greedy import SelectionResult, lazy_greedy
from flower_app.submodular.matroids import Matroid

if TYPE_CHECKING:
    from flower_app.server_data import RemoteProblem

__all__ = [
    "Experiment",
    "check_remote_resume",
    "cohort_options",
    "finish_run",
    "open_remote_run",
    "open_run",
    "remote_checkpoint_fn",
    "serve_rounds",
    "summary_line",
]


@dataclass
class Experiment:
    """Everything a run needs, built and validated before any round.

    Attributes
    ----------
    cfg : AppConfig
        The run configuration.
    problem : SubmodularProblem
        The instance.
    matroid : Matroid
        The constraint.
    writer : RunWriter
        The run folder.
    reference : SelectionResult or None
        Centralized greedy on the same instance (the ratio's denominator); None when the
        server holds no data (``server-data = "none"``).

    Notes
    -----
    With ``server-data = "none"`` :attr:`problem` is a
    :class:`~flower_app.server_data.RemoteProblem` (sizes from the nodes, no objective).
    """

    cfg: AppConfig
    problem: SubmodularProblem | RemoteProblem
    matroid: Matroid
    writer: RunWriter
    reference: SelectionResult | None
    engine: str
    started: float

    @property
    def remote(self) -> bool:
        """True when the server holds no client data (no objective, no greedy reference)."""
        return self.problem.objective is None


def _run_config(
    cfg: AppConfig,
    engine: str,
    problem: SubmodularProblem | RemoteProblem,
    matroid: Matroid,
    detail: dict[str, Any],
) -> dict[str, Any]:
    """Return config.json of a run: the configuration, the engine and the instance's sizes.

    ``detail`` is what the instance adds between its sizes and its matroid (the nnz of
    the data the server holds, or where the sizes came from).
    """
    return {
        **cfg.to_dict(),
        "engine": engine,
        "instance": {
            "name": problem.name,
            "n-users": problem.n_users,
            "n-elements": problem.n_elements,
            **detail,
            "matroid": repr(matroid),
        },
    }


def open_run(
    cfg: AppConfig,
    engine: str,
    check: Callable[[SubmodularProblem, Matroid], object] | None = None,
) -> Experiment:
    """Load the instance, build the matroid, run the greedy reference, open the run folder.

    Parameters
    ----------
    cfg : AppConfig
        Validated configuration.
    engine : str
        ``"flower"`` or ``"direct"`` (recorded in config.json).
    check : callable, optional
        Validates the algorithm's own parameters against the instance (raises).

    Returns
    -------
    Experiment
        Ready to run; raises before any round on any configuration or data problem.
    """
    problem = load_problem(cfg)
    matroid = build_matroid(cfg, problem)
    if check is not None:  # before anything is written or any message is sent
        check(problem, matroid)
    reference = lazy_greedy(problem.objective, matroid, cfg.k)
    detail = {"nnz": int(problem.objective.values.nnz)}
    writer = RunWriter(
        cfg.run_folder(), _run_config(cfg, engine, problem, matroid, detail), resume=cfg.resume
    )
    return Experiment(cfg, problem, matroid, writer, reference, engine, time.perf_counter())


def open_remote_run(
    cfg: AppConfig,
    problem: RemoteProblem,
    engine: str,
    check: Callable[[RemoteProblem, Matroid], object] | None = None,
) -> Experiment:
    """Open a run whose server holds no client data (``server-data = "none"``).

    Parameters
    ----------
    cfg : AppConfig
        Validated configuration.
    problem : RemoteProblem
        Sizes reported by the nodes (:func:`~flower_app.server_data.probe_instance`).
    engine : str
        Recorded in config.json.
    check : callable, optional
        Validates the algorithm's own parameters (raises).

    Returns
    -------
    Experiment
        With the matroid from configuration and no greedy reference.
    """
    from flower_app.server_data import remote_matroid

    matroid = remote_matroid(cfg, problem.n_elements)
    if check is not None:
        check(problem, matroid)
    detail = {"source": "reported by the nodes (server-data = none)"}
    writer = RunWriter(
        cfg.run_folder(), _run_config(cfg, engine, problem, matroid, detail), resume=cfg.resume
    )
    check_remote_resume(writer, problem)
    return Experiment(cfg, problem, matroid, writer, None, engine, time.perf_counter())


def remote_checkpoint_fn(
    writer: RunWriter,
    problem: RemoteProblem,
    extra: Callable[[], dict[str, Any]] | None = None,
) -> Callable[[dict[str, Any]], None]:
    """Return a strategy's ``checkpoint_fn`` for a run without server data.

    The checkpoint holds the strategy's payload (its round, state, arrays, history), plus
    what the server learnt from the nodes instead of reading data (``remote-problem``: n,
    m and λ as they reported them) and ``extra()`` (e.g. round-0 metrics of a federated
    evaluation that a resumed run does not redo). Never client data.
    """

    def save(payload: dict[str, Any]) -> None:
        writer.save_checkpoint(
            {**payload, "remote-problem": asdict(problem), **(extra() if extra else {})}
        )

    return save


def cohort_options(
    cfg: AppConfig,
    writer: RunWriter,
    checkpoint_fn: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Return what every cohort strategy takes from the run's configuration and folder.

    Parameters
    ----------
    cfg : AppConfig
        ``min-reply-fraction``, ``secure-aggregation``, ``discovery-timeout``,
        ``node-return-wait``.
    writer : RunWriter
        The run folder: its rows (``on_round``) and, by default, its checkpoint.
    checkpoint_fn : callable, optional
        Another checkpoint writer (a run without server data adds what the nodes reported).

    Returns
    -------
    dict
        Keyword arguments of :class:`~flower_app.strategies.cohort.CohortStrategy`.
    """
    return {
        "on_round": writer.log_round,
        "min_reply_fraction": cfg.min_reply_fraction,
        "secure_aggregation": cfg.secure,
        "checkpoint_fn": writer.save_checkpoint if checkpoint_fn is None else checkpoint_fn,
        "discovery_timeout": cfg.discovery_timeout,
        "node_return_wait": cfg.node_return_wait,
    }


def serve_rounds(
    strategy: Any, grid: Any, writer: RunWriter, cfg: AppConfig, num_rounds: int, **start: Any
) -> Any:
    """Run a cohort strategy's rounds for a run folder; return :meth:`start`'s result.

    It resumes from the folder's checkpoint when there is one, runs ``num_rounds`` with the
    configured ``round-timeout`` (``start``: more arguments of ``strategy.start``), and
    records the nodes that failed in ``summary.json``.
    """
    if writer.checkpoint is not None:
        strategy.resume_from(writer.checkpoint)
    result = strategy.start(grid=grid, num_rounds=num_rounds, timeout=cfg.round_timeout, **start)
    writer.record_failures(strategy.failure_summary())
    return result


def check_remote_resume(writer: RunWriter, problem: RemoteProblem) -> None:
    """Refuse to resume when the nodes now report another instance than the checkpoint's.

    Raises
    ------
    ResumeError
        If the checkpoint has no ``remote-problem`` (it was written by a run with server
        data) or the nodes' n, m or λ differ from it (their data changed).
    """
    if writer.checkpoint is None:
        return
    saved = writer.checkpoint.get("remote-problem")
    now = asdict(problem)
    if saved != now:
        raise ResumeError(
            f"resume: the nodes now report {now}, the interrupted run's checkpoint "
            f"{saved}: resume only on the nodes (and node files) the run started on"
        )


def finish_run(
    exp: Experiment,
    selected: list[int],
    history: list[dict[str, Any]],
    objective: float | None = None,
) -> dict:
    """Write ``summary.json`` and return it.

    Parameters
    ----------
    exp : Experiment
        The open run.
    selected : list of int
        Final S in order.
    history : list of dict
        Per-round rows (with ``objective``).
    objective : float, optional
        F(S) by federated evaluation, when the server holds no data (``exp.remote``);
        otherwise F(S) is computed from the instance and this is ignored.

    Returns
    -------
    dict
        The summary: final objective, greedy's, their ratio, the per-k curves, totals.
        Without server data: the federated F(S) (None if it failed), no greedy entries
        (None) and ``greedy-reference = "off"``.
    """
    if not exp.remote:
        objective = exp.problem.objective.mean_value(selected)
    ref = exp.reference
    greedy_value = None if ref is None else ref.value
    summary = {
        "algorithm": exp.cfg.algorithm,
        "dataset": exp.problem.name,
        "engine": exp.engine,
        "seed": exp.cfg.seed,
        "k": exp.cfg.k,
        "selected": [int(e) for e in selected],
        "objective": objective,
        "greedy-objective": greedy_value,
        "ratio-to-greedy": (
            objective / greedy_value
            if objective is not None and greedy_value is not None and greedy_value > 0
            else None
        ),
        "objective-by-k": [row.get("objective") for row in history],
        "greedy-by-k": None if ref is None else ref.values,
        "greedy-selected": None if ref is None else ref.selected,
        **_item_labels(exp, selected, None if ref is None else ref.selected),
        "server-data": exp.cfg.server_data,
        "greedy-reference": "off" if ref is None else "on",
        "objective-source": "federated evaluation" if exp.remote else "server oracle",
        "rounds": len(history),
        "user-values": sum(int(row.get("user-values", 0)) for row in history),
        "bytes-up": sum(int(row.get("bytes-up", 0)) for row in history),
        "bytes-down": sum(int(row.get("bytes-down", 0)) for row in history),
        "wall-time": time.perf_counter() - exp.started,
        "run-folder": str(exp.writer.folder),
    }
    exp.writer.write_summary(summary)
    return summary


def _item_labels(
    exp: Experiment, selected: list[int], greedy: list[int] | None
) -> dict[str, Any]:
    """``selected-items`` (and names) for your own data's item labels; {} for built-ins."""
    labels = getattr(exp.problem, "item_labels", None)
    if not labels:
        return {}
    names = getattr(exp.problem, "item_names", None)
    out: dict[str, Any] = {"selected-items": [labels[int(e)] for e in selected]}
    if names:
        out["selected-names"] = [names[int(e)] for e in selected]
    if greedy is not None:
        out["greedy-selected-items"] = [labels[int(e)] for e in greedy]
    return out


def summary_line(summary: dict) -> str:
    """Return the one-line result printed at the end of a run."""
    ratio = summary["ratio-to-greedy"]
    head = (
        f"{summary['algorithm']} on {summary['dataset']} (k={summary['k']}, "
        f"seed={summary['seed']}, {summary['engine']} engine): "
    )
    objective = summary["objective"]
    value = "n/a" if objective is None else f"{objective:.6g}"
    if summary["greedy-objective"] is None:  # server-data = none
        return (
            f"{head}F(S) = {value} (federated evaluation; no greedy reference: the server "
            f"holds no data); results in {summary['run-folder']}"
        )
    return (
        f"{head}F(S) = {value}, centralized greedy "
        f"{summary['greedy-objective']:.6g}, ratio {ratio:.4f}; results in {summary['run-folder']}"
    )
