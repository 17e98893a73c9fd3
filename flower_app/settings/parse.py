"""Validate a whole run_config against the declarations: :func:`parse`."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from flower_app.registry import ALGORITHMS, algorithms_of
from flower_app.settings.declarations import SETTINGS
from flower_app.settings.setting import ConfigError

__all__ = ["defaults", "describe_family", "parse"]

#: where the keys are documented (named in error messages)
REFERENCE = "docs/configuration.md"


def defaults(family: str | None = None) -> dict[str, Any]:
    """Return the declared keys and their defaults: of one family, of ``"common"``, or all.

    Parameters
    ----------
    family : str, optional
        ``"common"``, a family of :data:`flower_app.registry.FAMILIES`, or None for every key.

    Returns
    -------
    dict
        Key -> default, in declaration order.
    """
    return {name: s.default for name, s in SETTINGS.items() if family is None or s.family == family}


def describe_family(family: str) -> str:
    """Return ``"fedsubavg (algorithm = fedsubavg, fedavg-sub, ...)"`` for messages and docs."""
    return f"{family} (algorithm = {', '.join(algorithms_of(family))})"


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    return bool(value == default)


def _refuse_unknown(run_config: Mapping[str, Any]) -> None:
    unknown = [key for key in run_config if key not in SETTINGS]
    if not unknown:
        return
    named = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), SETTINGS, n=1)
        named.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    raise ConfigError(
        f"run_config {'key' if len(named) == 1 else 'keys'} {', '.join(named)} "
        f"{'is' if len(named) == 1 else 'are'} not known; every key is listed in {REFERENCE}"
    )


def _refuse_other_families(run_config: Mapping[str, Any], algorithm: str, family: str) -> None:
    foreign = [
        SETTINGS[key]
        for key, value in run_config.items()
        if SETTINGS[key].family not in ("common", family)
        and not _same(value, SETTINGS[key].default)
    ]
    if foreign:
        raise ConfigError(
            "; ".join(
                f"run_config '{s.name}' belongs to {describe_family(s.family)}" for s in foreign
            )
            + f"; this run's algorithm is {algorithm!r} (family {family}): leave "
            + ("it" if len(foreign) == 1 else "them")
            + " at the default"
        )


def parse(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a run_config and return every key's typed value.

    Parameters
    ----------
    run_config : Mapping
        Flower's ``context.run_config`` (every key of ``[tool.flwr.app.config]``) or a plain
        dict of some keys (the others take their defaults).

    Returns
    -------
    dict
        Every declared key -> its validated value (keys of the algorithm's own family and the
        common keys as given, the other families' at their defaults), in declaration order.

    Raises
    ------
    ConfigError
        For an unknown key (named with the closest known one), a key of another family than
        the algorithm's with a non-default value, an invalid value (naming the key, the value
        and what is valid) or a dataset the algorithm does not accept.
    """
    _refuse_unknown(run_config)
    declared = SETTINGS["algorithm"]
    algorithm = declared.validate(run_config.get("algorithm", declared.default))
    family = ALGORITHMS[algorithm].family
    _refuse_other_families(run_config, algorithm, family)
    values = {
        name: s.validate(run_config.get(name, s.default)) if s.family in ("common", family)
        else s.default
        for name, s in SETTINGS.items()
    }  # fmt: skip
    if values["dataset"] not in ALGORITHMS[algorithm].datasets:
        raise ConfigError(
            f"run_config 'dataset' = {values['dataset']!r} does not fit algorithm "
            f"{algorithm!r}; choose one of: " + ", ".join(ALGORITHMS[algorithm].datasets)
        )
    return values
