"""Records in and out of the loop: metric records of a round's row, checks of ``initial_arrays``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from flower_app.strategies.errors import InitialArraysError

__all__ = ["check_initial_arrays", "merged_config", "to_metric", "to_metric_record"]


def to_metric(value: Any) -> Any:
    """Turn a value into what a MetricRecord accepts (Python int/float or lists of them)."""
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [to_metric(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [to_metric(v) for v in value]
    return value


def to_metric_record(values: Mapping[str, Any]) -> MetricRecord:
    """Return a MetricRecord of the numeric entries of ``values`` (None and strings dropped)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        value = to_metric(value)
        if isinstance(value, int | float) or (
            isinstance(value, list) and all(isinstance(v, int | float) for v in value)
        ):
            out[key] = value
    return MetricRecord(out)


def check_initial_arrays(
    arrays: ArrayRecord | None, expected: Mapping[str, tuple[tuple[int, ...], str]] | None
) -> None:
    """Check ``initial_arrays`` against the keys, shapes and dtype kinds a strategy needs.

    Parameters
    ----------
    arrays : ArrayRecord or None
        What the user passed to ``start``.
    expected : mapping or None
        key -> (shape, dtype kinds, e.g. ``"f"`` or ``"iu"``); None accepts anything.

    Raises
    ------
    InitialArraysError
        Naming the missing, extra or mis-shaped keys.
    """
    if expected is None:
        return
    got = {} if arrays is None else {k: arrays[k] for k in arrays}
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    if missing or extra:
        raise InitialArraysError(
            f"initial_arrays has keys {sorted(got)}; expected {list(expected)}"
            + (f" (missing {missing})" if missing else "")
            + (f" (unexpected {extra})" if extra else "")
        )
    for key, (shape, kinds) in expected.items():
        a = got[key]
        if tuple(a.shape) != tuple(shape):
            raise InitialArraysError(
                f"initial_arrays['{key}'] has shape {tuple(a.shape)}, expected {tuple(shape)}"
            )
        if np.dtype(a.dtype).kind not in kinds:
            raise InitialArraysError(
                f"initial_arrays['{key}'] has dtype {a.dtype}, expected kind {kinds!r}"
            )


def merged_config(config: ConfigRecord | None, server_round: int, **extra: Any) -> ConfigRecord:
    """Return the user's config with ``server-round`` and the strategy's entries."""
    return ConfigRecord({**dict(config or {}), **extra, "server-round": int(server_round)})
