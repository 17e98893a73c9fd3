"""``server-data = "none"``: a ServerApp of the submodular families that reads no client data.

With the default ``server-data = "full"`` the server loads the instance too, for what the
algorithms never use (true F(S) per round, the centralized-greedy reference, a partition
matroid's element groups). With ``"none"``:

- n, m (and λ = max f_i({e}) for FedSM Algorithm 2) come from the nodes' ``query.cohort``
  replies (:func:`probe_instance`), waiting until their cohorts cover all users;
- the matroid comes from configuration (:func:`remote_matroid`): uniform of rank ``k``, or
  a partition matroid over the ``element-groups`` CSV given to the server (public metadata
  of the ground set, written by ``python -m flower_app.export``);
- the objective of the final set is a federated evaluation, Σ f_i(S) over the nodes
  (:func:`federated_objective`), and no per-round objective is recorded;
- there is no greedy reference; ``summary.json`` says so (``server-data``,
  ``greedy-reference``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.config import AppConfig, ConfigError
from flower_app.strategies.cohort.base import CohortStrategy
from flower_app.strategies.discovery import CohortQueries, DiscoveryError, cohort_of
from flower_app.strategies.exchange import exchange
from flower_app.strategies.replies import float_metric, int_metric

__all__ = [
    "RemoteProblem",
    "evaluator",
    "federated_objective",
    "probe_instance",
    "remote_matroid",
]


@dataclass(frozen=True)
class RemoteProblem:
    """What the server knows of an instance it does not hold: sizes from the nodes.

    Attributes
    ----------
    name : str
        The dataset name.
    n_users, n_elements : int
        n and m, as the nodes report them.
    max_singleton : float
        λ = max over the nodes' reported max_{e,i} f_i({e}).
    objective : None
        No objective: the server cannot evaluate F (kept so code can test for it).
    """

    name: str
    n_users: int
    n_elements: int
    max_singleton: float
    objective: None = None


def probe_instance(
    grid: Grid,
    dataset: str,
    timeout: float,
    poll: float = 0.5,
    query_timeout: float = 120.0,
    retry_after: float = 5.0,
) -> RemoteProblem:
    """Ask the nodes for n, m and λ until their cohorts cover all users.

    Nodes whose query failed or went unanswered are asked again
    (:class:`~flower_app.strategies.discovery.CohortQueries`).

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    dataset : str
        The run's dataset name (recorded).
    timeout : float
        Seconds to wait (``discovery-timeout``).
    poll : float, optional
        Seconds between looks for newly registered nodes.
    query_timeout, retry_after : float, optional
        Seconds one query waits; seconds before a failed or silent node is asked again.

    Returns
    -------
    RemoteProblem
        The sizes every node agrees on.

    Raises
    ------
    DiscoveryError
        If nodes disagree on n or m, or the users are not covered in time.
    """
    queries = CohortQueries(grid, timeout, query_timeout, retry_after, group_id="probe")
    ranges: dict[int, tuple[int, int]] = {}
    sizes: tuple[int, int] | None = None
    lam = 0.0
    while True:
        for src, (total, elements, first, count, singleton) in queries.poll(_decode_probe):
            if sizes is None:
                sizes = (total, elements)
            elif (total, elements) != sizes:
                raise DiscoveryError(
                    f"node {src} holds an instance with {total} users and {elements} "
                    f"elements, another node {sizes[0]} and {sizes[1]}: the nodes' files "
                    "come from different exports"
                )
            lam = max(lam, singleton)
            if count > 0:
                ranges[src] = (first, count)
        covered = sum(c for _, c in ranges.values())
        if sizes is not None and covered >= sizes[0]:
            break
        if queries.expired():
            failed = queries.failing()
            raise DiscoveryError(
                f"after {timeout:.0f} s the nodes that answered serve {covered} of "
                f"{'?' if sizes is None else sizes[0]} users; start the missing SuperNodes or "
                "raise discovery-timeout" + (f" (failing: {failed})" if failed else "")
            )
        time.sleep(poll)
    n, m = sizes
    log(INFO, "server-data = none: the nodes hold n=%d users, m=%d elements", n, m)
    return RemoteProblem(name=dataset, n_users=n, n_elements=m, max_singleton=lam)


def _decode_probe(src: int, reply: Message) -> tuple[int, int, int, int, float]:
    """Return a probe reply's cohort and λ_i = max f_i({e}) (finite, >= 0; 0 if absent)."""
    total, elements, first, count = cohort_of(reply)
    props = reply.content.config_records["properties"]
    singleton = float_metric({"max-singleton": props.get("max-singleton", 0.0)},
                             "max-singleton", low=0.0)  # fmt: skip
    return total, elements, first, count, singleton


def remote_matroid(cfg: AppConfig, n_elements: int):  # noqa: ANN201 - a Matroid
    """Build the constraint from configuration alone (no client data).

    Parameters
    ----------
    cfg : AppConfig
        ``matroid``, ``k``, ``partition-capacity`` and, for a partition matroid,
        ``element-groups`` (the CSV of the export, given to the server).
    n_elements : int
        m, as the nodes report it.

    Returns
    -------
    Matroid
        Uniform of rank k, or the partition matroid over the groups file.

    Raises
    ------
    ConfigError
        If k does not fit (:func:`~flower_app.problems.config_matroid`), or a partition
        matroid has no groups file.
    """
    from flower_app.node_data import NodeDataError, read_groups
    from flower_app.problems import config_matroid

    name = f"the nodes' {cfg.dataset}"
    if cfg.matroid == "uniform":
        return config_matroid(cfg, name, n_elements)
    if not cfg.element_groups:
        raise ConfigError(
            "matroid = 'partition' with server-data = 'none' needs run_config "
            "'element-groups': the element-groups.csv of python -m flower_app.export (the "
            "server reads no node's data, so it cannot learn the groups from them)"
        )
    try:
        groups = read_groups(cfg.element_groups, n_elements)
    except NodeDataError as err:
        raise ConfigError(f"run_config 'element-groups': {err}") from None
    return config_matroid(cfg, name, n_elements, groups)


def federated_objective(
    grid: Grid,
    node_ids: Iterable[int],
    selected: Sequence[int],
    n_users: int,
    timeout: float,
    server_round: int = 0,
) -> float | None:
    """Return F(S) = Σ_nodes Σ_i f_i(S) / n by one ``evaluate`` exchange, or None.

    Every node answers with its cohort's ``objective-sum`` (the cohort-mode evaluate
    contract of :class:`~flower_app.strategies.cohort.fedsm.FedSMCohorts`). None (logged) when a
    node fails or the users that answered are not all n.
    """
    sel = np.asarray(list(selected), dtype=np.int64)
    messages = [
        Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({"selected": Array(sel)}),
                    "config": ConfigRecord({"server-round": int(server_round)}),
                }
            ),
            dst_node_id=int(node),
            message_type=MessageType.EVALUATE,
        )
        for node in node_ids
    ]
    n_nodes = len(messages)

    def decode(src: int, reply: Message) -> tuple[float, int]:
        metrics = reply.content.metric_records["metrics"]
        users = int_metric(metrics, "num-examples", low=0)
        return float_metric(metrics, "objective-sum"), users

    checked = exchange(grid, messages, decode, "federated evaluation", timeout)
    if checked.left_out:
        log(WARNING, "federated evaluation: %d of %d nodes' replies left out (first: %s); "
            "no F(S)", checked.left_out, n_nodes, checked.first_error)  # fmt: skip
        return None
    total = sum(value for _, (value, _) in checked.accepted)
    users = sum(count for _, (_, count) in checked.accepted)
    if users != n_users:
        log(WARNING, "federated evaluation: %d of %d users answered; no F(S)", users, n_users)
        return None
    return total / max(n_users, 1)


def evaluator(
    grid: Grid, strategy: CohortStrategy, n_users: int, timeout: float
) -> Callable[[Sequence[int]], float | None]:
    """Return ``S -> F(S)`` by federated evaluation over the nodes the strategy discovered."""

    def evaluate(selected: Sequence[int]) -> float | None:
        cohorts = strategy.cohorts
        if cohorts is None:
            return None
        return federated_objective(grid, cohorts.node_ids, selected, n_users, timeout)

    return evaluate
