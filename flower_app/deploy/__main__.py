"""Command line: ``python -m flower_app.deploy COMMAND ...``.

Commands: ``certs``, ``node-keys``, ``identity-keys``, ``trusted-keys``, ``connection``.
The edge-device rehearsal (a whole federation on one machine, its failure drills) is not
installed with the package: ``python -m rehearsal`` from a checkout of the repository.

Examples
--------
::

    python -m flower_app.deploy certs --out certs --host superlink.example.org --host 192.0.2.10
    python -m flower_app.deploy node-keys --out keys --count 4
    python -m flower_app.deploy identity-keys --out identity --count 1 --prefix edge-01
    python -m flower_app.deploy trusted-keys --out federation.pem identity/*.pub
    python -m flower_app.deploy connection --name edge --address 192.0.2.10:9092 \\
        --root-certificates certs/ca.crt >> ~/.flwr/config.toml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flower_app.deploy.connection import connection_toml
from flower_app.deploy.credentials import (
    make_certificates,
    make_identity_keys,
    make_node_keys,
    write_trusted_keys,
)


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

    ids = sub.add_parser(
        "identity-keys",
        help="secure-aggregation identities (EC P-384, PEM): NAME-i.key (node_config "
        "secagg-identity-key, stays on the node) and NAME-i.pub (goes into trusted-keys)",
    )
    ids.add_argument("--out", type=Path, required=True, help="output folder")
    ids.add_argument("--count", type=int, required=True, help="number of identities")
    ids.add_argument("--prefix", default="identity", help="file name prefix (identity)")
    ids.add_argument("--start", type=int, default=0, help="index of the first identity (0)")

    trusted = sub.add_parser(
        "trusted-keys",
        help="the federation's trusted identities: every node's identity public key in one "
        "PEM file (node_config secagg-trusted-keys on every node)",
    )
    trusted.add_argument("--out", type=Path, required=True, help="the file to write")
    trusted.add_argument("public_keys", type=Path, nargs="+", help="identity public keys (PEM)")

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
            extra = [h for h in ("127.0.0.1", "localhost") if h not in args.host]
            print(f"valid for: {', '.join([*args.host, *extra])}", end="")
            print(" (127.0.0.1: the SuperLink's own superexec)" if extra else "")
        elif args.command == "node-keys":
            for key in make_node_keys(args.out, args.count, args.prefix, args.start):
                print(f"{key.private_key}  {key.public_key}")
        elif args.command == "identity-keys":
            for ident in make_identity_keys(args.out, args.count, args.prefix, args.start):
                print(f"{ident.private_key}  {ident.public_key}")
        elif args.command == "trusted-keys":
            path = write_trusted_keys(args.out, args.public_keys)
            print(f"{path}: {len(args.public_keys)} identities (node_config secagg-trusted-keys)")
        else:
            root = args.root_certificates
            print(connection_toml(args.name, args.address, root), end="")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
