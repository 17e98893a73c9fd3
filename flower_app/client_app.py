"""ClientApp: run_config picks the algorithm's runner, node_config the node's partition.

The runner returns a NumPyClient, driven here through the Message-API adapter; the same
``client_fn`` also serves legacy apps: ``ClientApp(client_fn=client_fn)``.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp

from flower_app.clients.adapter import handle_evaluate, handle_query, handle_train
from flower_app.config import AppConfig
from flower_app.registry import load_runner

__all__ = ["app", "client_fn", "make_client"]


def make_client(context: Context) -> NumPyClient:
    """Build this node's NumPyClient from its run_config and node_config."""
    cfg = AppConfig.from_run_config(context.run_config)
    return load_runner(cfg.algorithm).make_client(cfg, context)


def client_fn(context: Context) -> Client:
    """Legacy entry point: ``ClientApp(client_fn=client_fn)``."""
    return make_client(context).to_client()


app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Answer with ``client.get_properties`` (e.g. discovery)."""
    return handle_query(msg, context, make_client)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Answer with ``client.fit``: one round of the algorithm on this node."""
    return handle_train(msg, context, make_client)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Answer with ``client.evaluate``."""
    return handle_evaluate(msg, context, make_client)
