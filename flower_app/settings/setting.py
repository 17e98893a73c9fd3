"""One run_config key (:class:`Setting`) and the single validator of each of its types.

A validator takes the declaration and a given value, returns the typed value (an int given
as ``2.0`` becomes ``2``, a float given as ``1`` becomes ``1.0``) and raises
:class:`ConfigError` naming the key, the value and what would be valid.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from flower_app.algorithms.common.counts import reciprocal_steps

__all__ = ["INT64", "VALIDATORS", "ConfigError", "Kind", "Setting"]

#: the types a key can have; ``count`` is an int count (>= 1) or a float fraction in (0, 1]
Kind = Literal["int", "float", "count", "choice", "bool", "str"]


class ConfigError(ValueError):
    """An invalid run_config: says which key, what was given and what is valid.

    Parameters
    ----------
    message : str
        The problem; several problems are given one per line (see :attr:`problems`).
    """

    @property
    def problems(self) -> list[str]:
        """Return the problems, one line each."""
        return [line for line in str(self).splitlines() if line.strip()]


@dataclass(frozen=True)
class Setting:
    """One run_config key, declared once (see :mod:`flower_app.settings.declarations`).

    Attributes
    ----------
    name : str
        The key, kebab-case as Flower's ``--run-config`` requires.
    kind : {"int", "float", "count", "choice", "bool", "str"}
        Its type.
    default : Any
        Its value when not given (also the value in ``[tool.flwr.app.config]``).
    family : str
        ``"common"`` or the algorithm family that reads it (see :mod:`flower_app.registry`).
    help : str
        One line for the reference table and the command-line help.
    ge, gt, le, lt : float, optional
        Bounds of an int or float: >=, >, <=, <.
    choices : tuple of str
        The values a ``choice`` accepts.
    reciprocal_integer : bool
        A float whose inverse must be an integer (e.g. η = 0.1, 0.2, 0.25).
    """

    name: str
    kind: Kind
    default: Any
    family: str
    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    reciprocal_integer: bool = False

    def __post_init__(self) -> None:
        """Refuse an inconsistent declaration (a bug, found at import)."""
        bounded = any(b is not None for b in (self.ge, self.gt, self.le, self.lt))
        if (
            self.kind not in VALIDATORS
            or (self.kind == "choice") != bool(self.choices)
            or (bounded and self.kind not in ("int", "float"))
            or (self.reciprocal_integer and self.kind != "float")
            or (self.ge is not None and self.gt is not None)
            or (self.le is not None and self.lt is not None)
        ):
            raise ValueError(f"inconsistent declaration of run_config {self.name!r}")
        value = self.validate(self.default)
        if type(value) is not type(self.default):
            raise ValueError(f"run_config {self.name!r}: default of the wrong type")

    def validate(self, value: Any) -> Any:
        """Return ``value`` typed, or raise :class:`ConfigError` naming the key."""
        return VALIDATORS[self.kind](self, value)

    @property
    def type_name(self) -> str:
        """Return the type as the reference table shows it."""
        return {"count": "int or float", "choice": "str"}.get(self.kind, self.kind)

    @property
    def valid(self) -> str:
        """Return what is valid, in words (``"> 0"``, ``"[0, 1)"``, ``"alg1, alg2"``)."""
        if self.kind == "count":
            return "int >= 1 (a count) or float in (0, 1] (a fraction)"
        if self.kind == "choice":
            return ", ".join(self.choices)
        if self.kind == "bool":
            return "true, false"
        low = ("[", self.ge) if self.ge is not None else ("(", self.gt)
        high = ("]", self.le) if self.le is not None else (")", self.lt)
        if self.reciprocal_integer:
            return f"{self._range(low, high)}, 1/x an integer"
        return self._range(low, high)

    def _range(self, low: tuple[str, float | None], high: tuple[str, float | None]) -> str:
        if low[1] is not None and high[1] is not None:
            return f"{low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
        if low[1] is not None:
            return f"{'>=' if low[0] == '[' else '>'} {_num(low[1])}"
        if high[1] is not None:
            return f"{'<=' if high[0] == ']' else '<'} {_num(high[1])}"
        return {"int": "any integer", "float": "any number"}.get(self.kind, "any string")


def _num(bound: float) -> str:
    return f"{bound:g}"


def _given(setting: Setting, value: Any) -> str:
    return f"run_config '{setting.name}' = {value!r}"


def _check_bounds(setting: Setting, value: float) -> None:
    for bound, fails, relation in (
        (setting.ge, lambda b: value < b, ">="),
        (setting.gt, lambda b: value <= b, ">"),
        (setting.le, lambda b: value > b, "<="),
        (setting.lt, lambda b: value >= b, "<"),
    ):
        if bound is not None and fails(bound):
            raise ConfigError(f"{_given(setting, value)}: must be {relation} {_num(bound)}")


#: Flower's run_config holds 64-bit signed integers (a larger one fails in Flower itself)
INT64 = (-(2**63), 2**63 - 1)


def validate_int(setting: Setting, value: Any) -> int:
    """Return an integer within the bounds (``2.0`` is read as ``2``) and 64 bits."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{_given(setting, value)}: expected an integer")
    if not INT64[0] <= value <= INT64[1]:
        raise ConfigError(f"{_given(setting, value)}: beyond the 64-bit integers Flower's "
                          f"run_config holds (|value| < 2**63)")  # fmt: skip
    _check_bounds(setting, value)
    return value


def validate_float(setting: Setting, value: Any) -> float:
    """Return a float within the bounds (an int is read as a float; NaN is refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigError(f"{_given(setting, value)}: expected a number")
    value = float(value)
    _check_bounds(setting, value)
    if setting.reciprocal_integer and reciprocal_steps(value) is None:
        raise ConfigError(f"{_given(setting, value)}: 1/x must be an integer (e.g. 0.1, 0.2, "
                          "0.25)")  # fmt: skip
    return value


def validate_count(setting: Setting, value: Any) -> int | float:
    """Return an int count >= 1 or a float fraction in (0, 1], unchanged."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            f"{_given(setting, value)}: expected a float fraction in (0, 1] or an integer count"
        )
    if isinstance(value, float) and not 0.0 < value <= 1.0:
        raise ConfigError(
            f"{_given(setting, value)}: a float is a fraction and must lie in (0, 1]; "
            "write an integer (e.g. 50) for an absolute count"
        )
    if isinstance(value, int) and value < 1:
        raise ConfigError(f"{_given(setting, value)}: a count must be >= 1")
    return value


def validate_choice(setting: Setting, value: Any) -> str:
    """Return one of the declared choices."""
    if isinstance(value, bool) or str(value) not in setting.choices:
        raise ConfigError(
            f"{_given(setting, value)} is not known; choose one of: {', '.join(setting.choices)}"
        )
    return str(value)


def validate_bool(setting: Setting, value: Any) -> bool:
    """Return a bool (TOML ``true``/``false``; no 0/1 or strings)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{_given(setting, value)}: expected true or false")
    return value


def validate_str(setting: Setting, value: Any) -> str:
    """Return a string (a number is kept as text: Flower reads ``run-name=2024`` as an int)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"{_given(setting, value)}: expected a string")
    return str(value)


#: the one validator of each kind
VALIDATORS: dict[str, Callable[[Setting, Any], Any]] = {
    "int": validate_int,
    "float": validate_float,
    "count": validate_count,
    "choice": validate_choice,
    "bool": validate_bool,
    "str": validate_str,
}
