"""``flower-app``: run a Flower app and exit honestly, stop its local SuperLink, report runs.

``flower-app run [APP] [SUPERLINK] [--run-config ...] [--federation-config ...]``
    Runs ``flwr run APP [SUPERLINK] --stream`` with the same options, streams its log
    (without the messages of :mod:`flower_app.quiet`, and with tracebacks pointing into
    ``APP`` instead of Flower's installed copy of it), then asks the SuperLink for the run's
    final status (``flwr ls --run-id``) and exits 0 only if it is ``finished:completed``:
    ``flwr run --stream`` itself exits 0 when the ServerApp fails.
``flower-app stop``
    Stops the local SuperLink daemon that ``flwr run`` started for this ``FLWR_HOME`` (the
    one whose database lives in ``$FLWR_HOME/local-superlink/``), by PID, and no other.
``flower-app report RUN_DIR [RUN_DIR ...] [--out DIR]``
    Figures and a one-page Markdown summary of run folders (:mod:`flower_app.cli.report`).

``FLWR_HOME`` is Flower's (default ``~/.flwr``), so ``flower-app run`` and ``flwr run`` share
their SuperLink, connections and runs.
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
    run.add_argument("--run-config", default=None, help="as for flwr run")
    run.add_argument("--federation-config", default=None, help="as for flwr run")
    run.add_argument(
        "--keep-noise", action="store_true", help="do not filter flower_app.quiet's messages"
    )
    stop = sub.add_parser("stop", help="stop the local SuperLink of this FLWR_HOME")
    stop.add_argument("--timeout", type=float, default=15.0, help="seconds before SIGKILL")
    report = sub.add_parser("report", help="figures and report.md of run folders")
    report.add_argument("runs", nargs="+", help="run folders (config.json, metrics.jsonl, ...)")
    report.add_argument("--out", default=None, help="output folder (default: the first run's)")
    args = parser.parse_args(argv)
    if args.command == "run":
        from flower_app.cli.run import run_app

        return run_app(
            args.app, args.superlink, args.run_config, args.federation_config,
            filter_noise=not args.keep_noise,
        )  # fmt: skip
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
