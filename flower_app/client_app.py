"""ClientApp: node_config -> the node's cohort of users -> the algorithm's NumPyClient.

The same ``client_fn`` also serves legacy apps: ``ClientApp(client_fn=client_fn)``.
"""

from __future__ import annotations

from functools import lru_cache

from flwr.app import Context, Message
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp

from flower_app.clients.adapter import handle_evaluate, handle_query, handle_train
from flower_app.clients.cohorts import cohort_range
from flower_app.clients.submodular import SubmodularClient
from flower_app.config import AppConfig
from flower_app.problems import load_problem
from flower_app.submodular.objectives import MaxRowObjective

__all__ = ["app", "client_fn", "make_client"]


def _partition(context: Context) -> tuple[int, int]:
    node_config = context.node_config
    if "partition-id" not in node_config or "num-partitions" not in node_config:
        raise ValueError(
            "node_config needs 'partition-id' and 'num-partitions' (start a SuperNode with "
            '--node-config "partition-id=0 num-partitions=2"; simulation sets them itself)'
        )
    return int(node_config["partition-id"]), int(node_config["num-partitions"])


def make_client(context: Context) -> NumPyClient:
    """Build the NumPyClient for this node from its run_config and node_config.

    Parameters
    ----------
    context : Context
        The node's context: ``run_config`` picks the algorithm and dataset,
        ``node_config`` the partition.

    Returns
    -------
    NumPyClient
        A :class:`~flower_app.clients.submodular.SubmodularClient` over the node's cohort.
    """
    cfg = AppConfig.from_run_config(context.run_config)
    partition_id, num_partitions = _partition(context)
    return _cohort_client(cfg, partition_id, num_partitions)


@lru_cache(maxsize=64)
def _cohort_client(cfg: AppConfig, partition_id: int, num_partitions: int) -> SubmodularClient:
    problem = load_problem(cfg)
    first, count = cohort_range(problem.n_users, partition_id, num_partitions)
    rows = problem.objective.values[first : first + count]
    cohort = MaxRowObjective(rows, name=f"{problem.name}[{first}:{first + count}]")
    return SubmodularClient(cohort, first, problem.n_users, partition_id, num_partitions)


def client_fn(context: Context) -> Client:
    """Legacy entry point: ``ClientApp(client_fn=client_fn)``."""
    return make_client(context).to_client()


app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Discovery: report the node's cohort."""
    return handle_query(msg, context, make_client)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of the algorithm on the node's sampled users."""
    return handle_train(msg, context, make_client)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Objective of a set over the node's users."""
    return handle_evaluate(msg, context, make_client)
