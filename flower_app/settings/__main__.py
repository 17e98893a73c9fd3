"""Command line: ``python -m flower_app.settings --toml | --markdown | --check RUN_CONFIG``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flower_app.settings.declarations import SETTINGS
from flower_app.settings.overrides import read_overrides
from flower_app.settings.parse import parse
from flower_app.settings.render import markdown_reference, toml_table, toml_value
from flower_app.settings.setting import ConfigError


def check(run_config: str) -> str:
    """Check a ``--run-config`` string as ``flwr run`` and the app would read it.

    The same checks as ``flower-app run`` makes before Flower starts: the string's syntax,
    unknown keys (with the closest known one), every value, another family's keys, keys
    that do not go together, the data files and the keys against the instance
    (:func:`flower_app.datasets.check.check_data`; the federation's size is not known here).

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
        Naming every problem, one per line.
    """
    from flower_app.config import AppConfig
    from flower_app.datasets.check import data_problems

    given = read_overrides([run_config])
    found = AppConfig.problems(given)
    if not found:
        found = data_problems(AppConfig.from_run_config(given))
    if found:
        raise ConfigError("\n".join(found))
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
        except ConfigError as err:
            for problem in err.problems:
                print(f"error: {problem}", file=sys.stderr)
            return 2
        except (OSError, ValueError) as err:  # e.g. an unreadable data file
            print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
