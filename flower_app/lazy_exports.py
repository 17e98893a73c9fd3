"""Names a package exports but imports on first use (PEP 562).

``flower_app.strategies`` and ``flower_app.clients`` use it: ``import flower_app.clients``
stays light on a node.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, home: Mapping[str, str], names: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return a package's module-level ``__getattr__`` and ``__dir__``.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    home : mapping
        Exported name -> submodule (relative to ``package``) that defines it.
    names : sequence of str
        The package's ``__all__`` (listed by ``dir()`` before they are loaded).

    Returns
    -------
    tuple
        ``(__getattr__, __dir__)``: the first imports the submodule on first use and keeps
        the value in the package, so later look-ups are plain attribute reads.
    """

    def get_attr(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def list_names() -> list[str]:
        return sorted([*vars(sys.modules[package]), *names])

    return get_attr, list_names
