"""Read ``--run-config`` strings as ``flwr run`` does, naming every problem.

Flower (``flwr.common.config.parse_config_args``) finds ``key=value`` pairs with a regular
expression, reads them together as TOML and merges several ``--run-config`` options (a later
one wins). It refuses a whole string with one generic message when any value is not TOML
(``k=abc``: a string needs quotes) or a key repeats (``k=20 k=30``), and it silently skips
text that is not a pair (``k = 20``, with spaces). :func:`read_overrides` reads the same
pairs into the same values and says, per pair, what is wrong.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flower_app.settings.setting import ConfigError

__all__ = ["PAIR", "read_overrides"]

#: Flower's pattern of one ``key=value`` pair (flwr/common/config.py, parse_config_args)
PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")

_HINT = (
    "not a TOML value (a string needs quotes: {key}='{raw}'; booleans are true/false, "
    "numbers as 20 or 0.5)"
)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _read_toml_file(path: str) -> dict[str, Any]:
    file = Path(path).expanduser()
    try:
        with file.open("rb") as fh:
            return _flatten(tomllib.load(fh))
    except OSError as err:
        raise ConfigError(f"--run-config {path}: cannot read it ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--run-config {path}: not TOML ({err})") from None


def _read_one(text: str) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    seen: dict[str, str] = {}
    found: list[str] = []
    for match in PAIR.finditer(text):
        key, raw = match.group(1), match.group(2)
        try:
            value = _flatten(tomllib.loads(f"{key} = {raw}"))
        except tomllib.TOMLDecodeError:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", key):
                found.append(f"run_config key {key!r} (in {match.group(0)!r}): not a valid key; "
                             "keys are letters, digits, '-' and '_'")  # fmt: skip
            else:
                found.append(f"run_config '{key}' = {raw}: " + _HINT.format(key=key, raw=raw))
            continue
        if key in seen:
            found.append(
                f"run_config '{key}' is given twice in one --run-config ({seen[key]} and {raw}); "
                "give it once"
            )
            continue
        seen[key] = raw
        values.update(value)
    rest = PAIR.sub(" ", text).strip()
    if rest:
        found.append(
            f"--run-config text {rest!r} is not key=value (no spaces around '='); "
            "flwr run would silently ignore it"
        )
    if not found and seen:
        try:  # what Flower does with the whole string (e.g. 'a=1 a.b=2' conflict)
            tomllib.loads("\n".join(f"{k} = {v}" for k, v in PAIR.findall(text)))
        except tomllib.TOMLDecodeError as err:
            found.append(f"--run-config {text!r}: not valid as a whole ({err})")
    return values, found


def read_overrides(texts: Sequence[str] | None) -> dict[str, Any]:
    """Return the values of ``--run-config`` options, as ``flwr run`` reads them.

    Parameters
    ----------
    texts : sequence of str or None
        The options' values, e.g. ``["k=20 dataset='movielens'"]``, or one ``.toml`` file.
        Several options are merged; a later one wins for a key both give.

    Returns
    -------
    dict
        Key -> TOML-typed value (dotted keys of a nested table flattened, as Flower does).

    Raises
    ------
    ConfigError
        Naming every problem, one per line: a value that is not TOML (``k=abc``), a key
        given twice in one option (``k=20 k=30``), text that is not a pair (``k = 20``), an
        unreadable ``.toml`` file.
    """
    if not texts:
        return {}
    if len(texts) == 1 and texts[0].endswith(".toml"):
        return _read_toml_file(texts[0])
    values: dict[str, Any] = {}
    found: list[str] = []
    for text in texts:
        if text.endswith(".toml"):
            found.append(f"--run-config {text}: a .toml file cannot be given with key=value pairs")
            continue
        more, bad = _read_one(text)
        values.update(more)
        found += bad
    if found:
        raise ConfigError("\n".join(found))
    return values
