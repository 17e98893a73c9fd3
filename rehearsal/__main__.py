"""Command line: ``python -m rehearsal COMMAND ...`` (from a checkout of the repository).

Commands: ``start`` (a TLS + node-authentication SuperLink and SuperNodes, each a separate
edge device, until Ctrl-C or SIGTERM) and ``drill`` (a failure drill on a running one).
The credentials of a real deployment are the package's: ``python -m flower_app.deploy``.

Examples
--------
::

    python -m rehearsal start --nodes 4 --memory 1G --cpus 0.5 \\
        --export movielens --data-dir /data --out /tmp/rehearsal
    python -m rehearsal drill --out /tmp/rehearsal kill-node 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rehearsal.drills import ACTIONS
from rehearsal.rehearsal import EDGE_DEVICE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rehearsal",
        description="A Flower deployment rehearsed on one machine: TLS + node-authentication "
        "SuperLink and SuperNodes as separate edge devices, and failure drills.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    rehearse = sub.add_parser(
        "start",
        help="start a TLS + node-authentication SuperLink and N SuperNodes, each a separate "
        "edge device (network namespace, own data folder, cgroup memory and CPU limits); "
        "print the flwr run line; stop everything on exit (Ctrl-C, SIGTERM)",
    )
    rehearse.add_argument("--nodes", type=int, default=4, help="SuperNodes (4)")
    rehearse.add_argument("--out", type=Path, required=True, help="working folder")
    rehearse.add_argument(
        "--memory", default=f"{EDGE_DEVICE.memory >> 20}M",
        help=f"memory limit per node, e.g. 512M, 1G ({EDGE_DEVICE.memory >> 20}M)",
    )  # fmt: skip
    rehearse.add_argument(
        "--cpus", type=float, default=EDGE_DEVICE.cpus,
        help=f"CPU quota per node, in cores ({EDGE_DEVICE.cpus:g})",
    )  # fmt: skip
    rehearse.add_argument(
        "--device-name", default=EDGE_DEVICE.name, help="what the limits stand for"
    )
    rehearse.add_argument("--no-limits", action="store_true", help="no cgroup limits")
    rehearse.add_argument(
        "--loopback", action="store_true", help="no network namespaces (every node on 127.0.0.1)"
    )
    data = rehearse.add_mutually_exclusive_group()
    data.add_argument(
        "--export", metavar="DATASET",
        help="export DATASET for the nodes first (python -m flower_app.export)",
    )  # fmt: skip
    data.add_argument(
        "--data", type=Path, metavar="DIR",
        help="an export folder (node-<i>.* + manifest.json) to give the nodes",
    )  # fmt: skip
    rehearse.add_argument("--data-dir", default="", help="dataset root, with --export")
    rehearse.add_argument(
        "--export-options", default="",
        help='more python -m flower_app.export options, e.g. "--num-users 100"',
    )  # fmt: skip
    rehearse.add_argument(
        "--poll-interval", type=float,
        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the nodes (Flower's default: 1 s)",
    )  # fmt: skip
    rehearse.add_argument(
        "--tofu", action="store_true",
        help="no identities: the nodes trust secure-aggregation keys on first use (safe only "
        "if the server relayed keys honestly when the nodes first met; a restarted or new "
        "node is a first meeting again). Default: endorsed keys",
    )  # fmt: skip
    rehearse.add_argument(
        "--run", metavar="RUN_CONFIG",
        help='run this --run-config once (e.g. "k=10 server-data=\'none\'"), print its '
        "status, and stop; without it the federation runs until Ctrl-C or SIGTERM",
    )  # fmt: skip
    drill = sub.add_parser(
        "drill",
        help="a failure drill on a running rehearsal (start, same --out): kill-node N, "
        "restart-node N, kill-superlink, restart-superlink, status",
    )
    drill.add_argument("--out", type=Path, required=True, help="the rehearsal's --out folder")
    drill.add_argument("action", choices=list(ACTIONS), help="what to do")
    drill.add_argument("node", type=int, nargs="?", help="node index (kill-node, restart-node)")
    drill.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for the answer (600)"
    )
    return parser


def _start(args: argparse.Namespace) -> int:
    """Run ``start``; everything started is stopped however this ends."""
    import shlex
    import signal
    import time

    from rehearsal.drills import Control
    from rehearsal.isolation import parse_memory
    from rehearsal.rehearsal import EdgeDevice, Rehearsal

    def _terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _terminate)
    device = None
    if not args.no_limits:
        device = EdgeDevice(args.device_name, parse_memory(args.memory), args.cpus)
    node_env = {}
    if args.poll_interval is not None:
        node_env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(args.poll_interval)
    data: tuple[Path, str] | None = None
    if args.export:
        from flower_app.export import main as export_main
        from flower_app.registry import SUBMODULAR_DATASETS

        folder = args.out / f"export-{args.export}"
        code = export_main(
            ["--dataset", args.export, "--num-partitions", str(args.nodes), "--out", str(folder)]
            + (["--data-dir", args.data_dir] if args.data_dir else [])
            + shlex.split(args.export_options)
        )
        if code != 0:
            return code
        data = (folder, "parquet" if args.export in SUBMODULAR_DATASETS else "npz")
    elif args.data is not None:
        ext = sorted(p.suffix for p in args.data.glob("node-0.*"))
        if not ext:
            print(f"error: {args.data} holds no node-0.* file", file=sys.stderr)
            return 2
        data = (args.data, ext[0].lstrip("."))
    rehearsal = Rehearsal(args.out, args.nodes, device, not args.loopback, node_env,
                          endorsed=not args.tofu)  # fmt: skip
    control: Control | None = None
    try:
        rehearsal.start(data)
        for line in rehearsal.describe():
            print(line)
        print("run it with:")
        print("  " + rehearsal.run_line())
        sys.stdout.flush()
        if args.run is None:
            control = Control(args.out, rehearsal)
            print(f"failure drills: python -m rehearsal drill --out {args.out} "
                  "{kill-node,restart-node} N | {kill-superlink,restart-superlink,status}")
            print("Ctrl-C (or SIGTERM) stops everything", flush=True)
            while True:  # drills run here, in the main thread (restarted processes die with it)
                control.serve()
                time.sleep(0.2)
        from flwr.common.config import parse_config_args  # flwr run's own parser

        config = parse_config_args([args.run])
        print("  " + rehearsal.run_line(config), flush=True)
        run = rehearsal.federation.run(config, timeout=24 * 3600)
        print(run.output[-3000:])
        print(f"status: {run.status} {run.details}".rstrip())
        print(f"run folder: {run.folder}")
        return 0 if run.status == "finished:completed" else 1
    except KeyboardInterrupt:
        return 130
    finally:
        if control is not None:
            control.close()
        print("stopping the rehearsal", file=sys.stderr, flush=True)
        rehearsal.stop()


def _drill(args: argparse.Namespace) -> int:
    """Run ``drill``: 0 done, 1 the drill failed, 2 no rehearsal answers."""
    from rehearsal.drills import DrillError, request

    if ACTIONS[args.action] and args.node is None:
        print(f"error: {args.action} needs a node index", file=sys.stderr)
        return 2
    try:
        ok, lines = request(args.out, args.action, args.node, args.timeout)
    except DrillError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = _parser().parse_args(argv)
    try:
        return _start(args) if args.command == "start" else _drill(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
