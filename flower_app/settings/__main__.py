"""Command line: ``python -m flower_app.settings --toml | --markdown | --check RUN_CONFIG``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flower_app.settings.declarations import SETTINGS
from flower_app.settings.parse import parse
from flower_app.settings.render import markdown_reference, toml_table, toml_value
from flower_app.settings.setting import ConfigError


def check(run_config: str) -> str:
    """Check a ``--run-config`` string as ``flwr run`` and the app would read it.

    Parameters
    ----------
    run_config : str
        E.g. ``"k=20 dataset='movielens'"`` (Flower's syntax), or a ``.toml`` file.

    Returns
    -------
    str
        One line: the algorithm and the keys that differ from their defaults.

    Raises
    ------
    ConfigError
        Naming the first problem (an unknown key with the closest known one).
    """
    from flwr.common.config import parse_config_args

    given = parse_config_args([run_config])
    values = parse(given)
    changed = [
        f"{key}={toml_value(values[key])}"
        for key in given
        if values[key] != SETTINGS[key].default or key == "algorithm"
    ]
    return f"run_config ok: {', '.join(changed) or 'all defaults'}"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the pyproject table or the markdown reference, or check a run_config string."""
    parser = argparse.ArgumentParser(
        prog="python -m flower_app.settings",
        description="The app's run_config keys, declared in flower_app/settings/declarations.py",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--toml", action="store_true", help="print [tool.flwr.app.config]")
    what.add_argument(
        "--markdown", action="store_true", help="print docs/configuration.md (the reference)"
    )
    what.add_argument(
        "--check",
        metavar="RUN_CONFIG",
        help="check a --run-config string, e.g. \"k=20 dataset='movielens'\"",
    )
    args = parser.parse_args(argv)
    if args.toml:
        sys.stdout.write(toml_table())
    elif args.markdown:
        sys.stdout.write(markdown_reference())
    else:
        try:
            print(check(args.check))
        except (ConfigError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
