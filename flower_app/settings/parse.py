"""Validate a whole run_config against the declarations: :func:`parse`."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from flower_app.registry import ALGORITHMS, algorithms_of
from flower_app.settings.declarations import SETTINGS
from flower_app.settings.setting import ConfigError

__all__ = ["defaults", "describe_family", "parse", "problems"]

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


def _unknown(run_config: Mapping[str, Any]) -> list[str]:
    unknown = [key for key in run_config if key not in SETTINGS]
    if not unknown:
        return []
    named = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), SETTINGS, n=1)
        named.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return [
        f"run_config {'key' if len(named) == 1 else 'keys'} {', '.join(named)} "
        f"{'is' if len(named) == 1 else 'are'} not known; every key is listed in {REFERENCE}"
    ]


def _other_families(run_config: Mapping[str, Any], algorithm: str, family: str) -> list[str]:
    foreign = [
        SETTINGS[key]
        for key, value in run_config.items()
        if key in SETTINGS
        and SETTINGS[key].family not in ("common", family)
        and not _same(value, SETTINGS[key].default)
    ]
    if not foreign:
        return []
    return [
        "; ".join(f"run_config '{s.name}' belongs to {describe_family(s.family)}" for s in foreign)
        + f"; this run's algorithm is {algorithm!r} (family {family}): leave "
        + ("it" if len(foreign) == 1 else "them")
        + " at the default"
    ]


def _validated(
    run_config: Mapping[str, Any], family: str | None
) -> tuple[dict[str, Any], list[str]]:
    """Return every key's value (own family and common keys validated) and the problems."""
    values: dict[str, Any] = {}
    found: list[str] = []
    for name, s in SETTINGS.items():
        if name not in run_config or (family is not None and s.family not in ("common", family)):
            values[name] = s.default
            continue
        try:
            values[name] = s.validate(run_config[name])
        except ConfigError as err:
            found.append(str(err))
            values[name] = s.default
    return values, found


def problems(run_config: Mapping[str, Any]) -> list[str]:
    """Return every problem of a run_config, one line each (empty: it is valid).

    The same checks as :func:`parse`, all of them: unknown keys (with the closest known
    one), each invalid value, keys of another family than the algorithm's, a dataset the
    algorithm does not accept. ``flower-app run`` and ``python -m flower_app.settings
    --check`` print these before Flower starts.

    Parameters
    ----------
    run_config : Mapping
        Some or all keys (the others take their defaults).

    Returns
    -------
    list of str
        The problems, in declaration order after the unknown keys.
    """
    found = _unknown(run_config)
    declared = SETTINGS["algorithm"]
    try:
        algorithm = declared.validate(run_config.get("algorithm", declared.default))
    except ConfigError as err:  # without an algorithm, only the common keys can be checked
        values, bad = _validated(run_config, "common")
        return [*found, str(err), *bad]
    family = ALGORITHMS[algorithm].family
    found += _other_families(run_config, algorithm, family)
    values, bad = _validated(run_config, family)
    found += [p for p in bad if not p.startswith("run_config 'algorithm'")]
    dataset_ok = not any(p.startswith("run_config 'dataset'") for p in bad)
    if dataset_ok and values["dataset"] not in ALGORITHMS[algorithm].datasets:
        found.append(
            f"run_config 'dataset' = {values['dataset']!r} does not fit algorithm "
            f"{algorithm!r}; choose one of: " + ", ".join(ALGORITHMS[algorithm].datasets)
        )
    return found


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
        Naming every problem of :func:`problems`, one per line: an unknown key (named with
        the closest known one), a key of another family than the algorithm's with a
        non-default value, an invalid value (naming the key, the value and what is valid)
        or a dataset the algorithm does not accept.
    """
    found = problems(run_config)
    if found:
        raise ConfigError("\n".join(found))
    algorithm = SETTINGS["algorithm"].validate(
        run_config.get("algorithm", SETTINGS["algorithm"].default)
    )
    return _validated(run_config, ALGORITHMS[algorithm].family)[0]
