"""Command line: ``python -m flower_app.deploy {certs,node-keys,connection} ...``.

Examples
--------
::

    python -m flower_app.deploy certs --out certs --host superlink.example.org --host 192.0.2.10
    python -m flower_app.deploy node-keys --out keys --count 4
    python -m flower_app.deploy connection --name edge --address 192.0.2.10:9092 \\
        --root-certificates certs/ca.crt >> ~/.flwr/config.toml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flower_app.deploy.credentials import make_certificates, make_node_keys
from flower_app.deploy.processes import connection_toml


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flower_app.deploy",
        description="Credentials for a Flower deployment with TLS and SuperNode authentication.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    certs = sub.add_parser(
        "certs",
        help="a self-signed CA (ca.crt, ca.key) and a server certificate "
        "(server.pem, server.key) for the SuperLink",
    )
    certs.add_argument("--out", type=Path, required=True, help="output folder")
    certs.add_argument(
        "--host",
        action="append",
        required=True,
        help="host name or IP address SuperNodes and the flwr CLI use to reach the SuperLink "
        "(repeat for several)",
    )
    certs.add_argument("--days", type=int, default=365, help="validity in days (default 365)")

    keys = sub.add_parser(
        "node-keys", help="SuperNode key pairs (EC P-384, OpenSSH): NAME-i and NAME-i.pub"
    )
    keys.add_argument("--out", type=Path, required=True, help="output folder")
    keys.add_argument("--count", type=int, required=True, help="number of key pairs")
    keys.add_argument("--prefix", default="supernode", help="file name prefix (supernode)")
    keys.add_argument("--start", type=int, default=0, help="index of the first pair (0)")

    conn = sub.add_parser(
        "connection", help="print a [superlink.NAME] entry for $FLWR_HOME/config.toml"
    )
    conn.add_argument("--name", required=True, help="connection name (flwr run . NAME)")
    conn.add_argument("--address", required=True, help="SuperLink host:port")
    conn.add_argument(
        "--root-certificates", type=Path, help="CA certificate (omit for insecure = true)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "certs":
            paths = make_certificates(args.out, args.host, days=args.days)
            print(f"CA certificate      {paths.ca_cert}  (SuperNodes: --root-certificates)")
            print(f"CA key              {paths.ca_key}  (keep offline)")
            print(f"server certificate  {paths.server_cert}  (SuperLink: --ssl-certfile)")
            print(f"server key          {paths.server_key}  (SuperLink: --ssl-keyfile)")
            print(f"valid for: {', '.join(args.host)}")
        elif args.command == "node-keys":
            for key in make_node_keys(args.out, args.count, args.prefix, args.start):
                print(f"{key.private_key}  {key.public_key}")
        else:
            root = args.root_certificates
            print(connection_toml(args.name, args.address, root), end="")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
