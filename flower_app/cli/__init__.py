"""``flower-app``: run a Flower app and exit honestly, stop its local SuperLink, report runs.

``flower-app run [APP] [SUPERLINK] [--run-config ...] [--federation-config ...]``
    First checks the whole run_config in-process (the ``--run-config`` syntax, unknown keys
    with the closest known one, every value, another family's keys, the data files): a
    problem prints one line each and exits 2 within seconds, before anything of Flower
    starts. Then runs ``flwr run APP [SUPERLINK] --stream`` with the same options on this
    ``FLWR_HOME``'s own local SuperLink ports (chosen once, kept in
    ``$FLWR_HOME/flower-app-ports.json``), streams its log (without the messages of
    :mod:`flower_app.quiet`, repeated errors counted, tracebacks kept for the full log in
    ``$FLWR_HOME/flower-app-logs/`` and pointing into ``APP``), asks the SuperLink for the
    run's final status (``flwr ls --run-id``) and exits 0 only if it is
    ``finished:completed`` (``flwr run --stream`` itself exits 0 when the ServerApp fails);
    a failure ends with one line: its cause, where it was raised, and the log's path.
``flower-app stop``
    Stops the local SuperLink daemon that ``flwr run`` started for this ``FLWR_HOME`` (the
    one whose database lives in ``$FLWR_HOME/local-superlink/``), by PID, and no other.
``flower-app ports``
    Prints ``export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=... FLWR_LOCAL_CONTROL_API_PORT=...``
    with this ``FLWR_HOME``'s ports, so that a plain ``flwr run`` (``eval "$(flower-app
    ports)"``) uses this home's SuperLink too; and, on stderr, every SuperLink using this
    home's database (PID and ports), with a warning when there are several (a plain ``flwr
    run`` without those ports starts a second one on the same database).
``flower-app report RUN_DIR [RUN_DIR ...] [--out DIR]``
    Figures and a one-page Markdown summary of run folders (:mod:`flower_app.cli.report`).

``FLWR_HOME`` is Flower's (default ``~/.flwr``), so ``flower-app run`` and ``flwr run`` share
connections and runs (a plain ``flwr run`` shares the SuperLink after ``flower-app ports``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flower-app`` console script; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="flower-app",
        description="Run the flower_app Flower app and exit non-zero when the run fails; "
        "stop the local SuperLink it started; make figures and a summary of run folders.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="flwr run --stream, then exit with the run's real status")
    run.add_argument("app", nargs="?", default=".", help="the Flower app (default: .)")
    run.add_argument("superlink", nargs="?", default=None, help="SuperLink connection name")
    run.add_argument("--run-config", "-c", action="append", help="as for flwr run")
    run.add_argument("--federation-config", action="append", help="as for flwr run")
    run.add_argument(
        "--keep-noise", action="store_true", help="do not filter flower_app.quiet's messages"
    )
    run.add_argument(
        "--full-log", action="store_true", help="also show tracebacks (always in the log file)"
    )
    stop = sub.add_parser("stop", help="stop the local SuperLink of this FLWR_HOME")
    stop.add_argument("--timeout", type=float, default=15.0, help="seconds before SIGKILL")
    sub.add_parser("ports", help="print export lines of this FLWR_HOME's SuperLink ports")
    report = sub.add_parser("report", help="figures and report.md of run folders")
    report.add_argument("runs", nargs="+", help="run folders (config.json, metrics.jsonl, ...)")
    report.add_argument("--out", default=None, help="output folder (default: the first run's)")
    args = parser.parse_args(argv)
    if args.command == "run":
        from flower_app.cli.run import run_app

        return run_app(
            args.app, args.superlink, args.run_config, args.federation_config,
            filter_noise=not args.keep_noise, full_log=args.full_log,
        )  # fmt: skip
    if args.command == "ports":
        from flower_app.cli.run import PORT_ENV, local_ports, superlinks_report

        ports, _ = local_ports()
        print("export " + " ".join(f"{name}={ports[key]}" for name, key in PORT_ENV.items()))
        for line in superlinks_report():  # on stderr: eval "$(flower-app ports)" stays clean
            print(f"flower-app ports: {line}", file=sys.stderr)
        return 0
    if args.command == "stop":
        from flower_app.cli.run import stop_local_superlink

        return stop_local_superlink(timeout=args.timeout)
    from flower_app.cli.report import write_report

    try:
        out = write_report(args.runs, args.out)
    except (OSError, ValueError) as err:
        print(f"flower-app report: {err}", file=sys.stderr)
        return 1
    print(f"report: {out}")
    return 0
