"""The ``flwr`` CLI's connection to a SuperLink: ``python -m flower_app.deploy connection``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["connection_toml"]


def connection_toml(name: str, address: str, root_certificates: Path | None) -> str:
    """Return a ``[superlink.NAME]`` entry for ``$FLWR_HOME/config.toml``.

    Parameters
    ----------
    name : str
        Connection name (``flwr run . NAME``, ``flwr ls NAME``).
    address : str
        ``host:port`` of the SuperLink.
    root_certificates : pathlib.Path or None
        The CA certificate (absolute path); None for ``insecure = true``.

    Returns
    -------
    str
        TOML text.
    """
    lines = [f"[superlink.{name}]", f'address = "{address}"']
    if root_certificates is None:
        lines.append("insecure = true")
    else:
        lines.append(f'root-certificates = "{Path(root_certificates).resolve()}"')
    return "\n".join(lines) + "\n"
