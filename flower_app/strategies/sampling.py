"""Node sampling as Flower's ``FedAvg`` does it, with the strategies' seeded generators."""

from __future__ import annotations

import random
import time

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from flower_app.strategies.errors import NotEnoughNodesError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.records import merged_config

__all__ = ["fedavg_evaluate_messages", "sample_nodes"]


def sample_nodes(
    grid: Grid,
    rng: random.Random,
    fraction: float,
    min_nodes: int,
    min_available: int,
    timeout: float = 300.0,
    poll_interval: float = 0.5,
) -> list[int]:
    """Sample nodes as Flower's ``FedAvg`` does, with a seeded ``random.Random``.

    Waits until at least ``max(min_nodes, min_available)`` nodes are connected, then draws
    ``max(int(fraction · available), min_nodes)`` of them without replacement from the
    sorted node ids (node ids are 64-bit: sampled with Python's ``random``, never numpy).

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    rng : random.Random
        The strategy's node sampler.
    fraction : float
        Fraction of available nodes, in (0, 1].
    min_nodes : int
        Least number of nodes to sample.
    min_available : int
        Least number of connected nodes before sampling.
    timeout : float
        Seconds to wait for enough nodes.
    poll_interval : float
        Seconds between looks at the grid.

    Returns
    -------
    list of int
        The sampled node ids.

    Raises
    ------
    NotEnoughNodesError
        If not enough nodes connected within ``timeout``.
    """
    need = max(int(min_nodes), int(min_available), 1)
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= need:
            break
        if time.monotonic() > deadline:
            raise NotEnoughNodesError(
                f"{len(nodes)} nodes connected after {timeout:.0f} s; the strategy needs "
                f"{need} (min_available_nodes / min_train_nodes)"
            )
        time.sleep(poll_interval)
    count = min(len(nodes), max(int(fraction * len(nodes)), int(min_nodes), 1))
    return sorted(rng.sample(nodes, count))


def fedavg_evaluate_messages(
    grid: Grid,
    rng: random.Random,
    server_round: int,
    arrays: ArrayRecord,
    config: ConfigRecord,
    group: str,
    fractions: tuple[float, int, int],
    timeout: float,
) -> list[Message]:
    """Return ``evaluate`` messages as Flower's ``FedAvg`` sends them.

    The model and the user's ``evaluate_config`` (plus ``server-round``) go to a sample of
    the connected nodes (:func:`sample_nodes`): ``fraction_evaluate`` of them, at least
    ``min_evaluate_nodes``, once ``min_available_nodes`` are connected. No message when
    ``fraction_evaluate`` is 0.

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    rng : random.Random
        The strategy's evaluation sampler (its own stream, so that evaluating does not
        change which nodes train).
    server_round : int
        The round (0: the initial model).
    arrays : ArrayRecord
        The model every sampled node evaluates.
    config : ConfigRecord
        The user's ``evaluate_config``.
    group : str
        Prefix of the messages' group id, ``<group>-<server_round>``.
    fractions : tuple of (float, int, int)
        ``(fraction_evaluate, min_evaluate_nodes, min_available_nodes)``.
    timeout : float
        Seconds to wait for enough nodes.

    Returns
    -------
    list of Message
        One ``evaluate`` message per sampled node (none if ``fraction_evaluate`` is 0).
    """
    fraction, least, available = float(fractions[0]), int(fractions[1]), int(fractions[2])
    if fraction <= 0:
        return []
    nodes = sample_nodes(grid, rng, fraction, least, available, timeout)
    content = RecordDict({"arrays": arrays, "config": merged_config(config, server_round)})
    return messages_to(nodes, content, MessageType.EVALUATE, f"{group}-{server_round}")
