"""ClientApp: run_config picks the algorithm's runner, node_config the node's partition.

The runner returns a NumPyClient; :func:`~flower_app.clients.adapter.numpy_client_app`
routes every message type the strategies send (``query.cohort``, ``train``,
``evaluate.appeal``, ...) to its methods.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.client import NumPyClient

from flower_app.clients.adapter import numpy_client_app
from flower_app.config import AppConfig
from flower_app.quiet import quiet_flower_logs
from flower_app.registry import load_runner

__all__ = ["app", "make_client"]


def make_client(context: Context) -> NumPyClient:
    """Build this node's NumPyClient from its run_config and node_config."""
    cfg = AppConfig.from_run_config(context.run_config)
    return load_runner(cfg.algorithm).make_client(cfg, context)


quiet_flower_logs()  # e.g. each Ray actor's "Manually terminating" at the end of a run
app = numpy_client_app(make_client)
