"""The app's run_config keys, each declared once, and their validation.

Every key (kebab-case, as Flower's ``--run-config`` requires) is a :class:`Setting` in
:mod:`flower_app.settings.declarations`: type, default, valid range or choices, family
(``"common"`` or an algorithm family of :mod:`flower_app.registry`) and a one-line help.
From the declarations come:

- :func:`parse`: the validation of a whole run_config (unknown keys, keys of another family,
  values), used by :meth:`flower_app.config.AppConfig.from_run_config`. A runner reads its
  family's keys validated and typed with ``cfg.get("fsa-lr")``; only checks that involve
  several keys or the data stay in the runner;
- :func:`problems`: every problem of a run_config, one line each (what ``flower-app run``
  and ``--check`` print before Flower starts; :mod:`flower_app.settings.overrides` reads the
  ``--run-config`` strings as ``flwr run`` does and names their syntax errors);
- :func:`defaults`: key -> default, of one family or all;
- ``python -m flower_app.settings --toml`` / ``--markdown``: the ``[tool.flwr.app.config]``
  table of ``pyproject.toml`` and ``docs/configuration.md`` (tests check both are in sync);
  ``--check RUN_CONFIG`` checks a ``--run-config`` string before ``flwr run``.
"""

from __future__ import annotations

from flower_app.settings.declarations import MATROIDS, SETTINGS
from flower_app.settings.parse import defaults, describe_family, parse, problems
from flower_app.settings.render import markdown_reference, toml_table
from flower_app.settings.setting import ConfigError, Setting

__all__ = [
    "MATROIDS",
    "SETTINGS",
    "ConfigError",
    "Setting",
    "defaults",
    "describe_family",
    "help_text",
    "markdown_reference",
    "parse",
    "problems",
    "toml_table",
]


def help_text(key: str) -> str:
    """Return the one-line help of run_config ``key``, ready for argparse (``%`` escaped)."""
    return SETTINGS[key].help.replace("%", "%%")
