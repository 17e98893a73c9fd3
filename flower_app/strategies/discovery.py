"""Discovery: learn which node serves which users before the first round, and again later.

Simulation starts the ServerApp before every virtual SuperNode has registered, and node ids
say nothing about partitions; so the server asks every node it sees for its cohort
(``query.cohort`` → ``get_properties``) until the cohorts cover all n users exactly once.

Re-discovery (:func:`refresh_cohorts`, before every round): a node that left the grid's node
list (Flower marks a SuperNode offline when its heartbeats stop) is *offline* and its users
are skipped (recorded as missing); a node that (re)joined under a new node id is asked for
its cohort, and if it serves exactly the users of an offline node it takes that node's place.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.strategies.errors import MissingHandlerError
from flower_app.strategies.exchange import exchange, messages_to
from flower_app.strategies.replies import CheckedReplies

__all__ = [
    "COHORT_QUERY",
    "CohortMap",
    "CohortQueries",
    "DiscoveryError",
    "cohort_of",
    "discover_cohorts",
    "group_for_round",
    "refresh_cohorts",
    "wait_for_mapped_nodes",
]


class DiscoveryError(RuntimeError):
    """Nodes did not announce a consistent, complete split of the users in time."""


@dataclass(frozen=True)
class CohortMap:
    """Nodes and the contiguous user ranges they serve, sorted by first user.

    Attributes
    ----------
    node_ids : numpy.ndarray
        Node ids (Python ints in an object array: they may exceed int64).
    firsts : numpy.ndarray
        First global user of each node's cohort (int64, sorted).
    counts : numpy.ndarray
        Cohort sizes (int64).
    n_elements : int
        Ground-set size the nodes reported (-1: not known).
    offline : frozenset of int
        Mapped nodes that have left the grid's node list (their users are skipped).
    asked : frozenset of int
        Every node id that answered a cohort query (it is not asked again; a node whose
        query failed or went unanswered is).
    """

    node_ids: np.ndarray
    firsts: np.ndarray
    counts: np.ndarray
    n_elements: int = -1
    offline: frozenset[int] = frozenset()
    asked: frozenset[int] = frozenset()

    def group(self, users: np.ndarray) -> dict[int, np.ndarray]:
        """Split sorted global user ids by the node that serves them.

        Parameters
        ----------
        users : numpy.ndarray
            Sorted global user indices.

        Returns
        -------
        dict
            node id -> the users it serves (non-empty groups only, in node order).
        """
        slot = np.searchsorted(self.firsts, users, side="right") - 1
        bounds = np.flatnonzero(np.diff(slot)) + 1
        return {
            int(self.node_ids[s[0]]): u
            for s, u in zip(np.split(slot, bounds), np.split(users, bounds), strict=True)
            if u.size
        }

    def cohort_of(self, node_id: int) -> tuple[int, int] | None:
        """Return ``(first user, count)`` of a mapped node, or None."""
        for n, f, c in zip(self.node_ids, self.firsts, self.counts, strict=True):
            if int(n) == int(node_id):
                return int(f), int(c)
        return None


#: the message type of discovery: a ClientApp answers it with ``@app.query("cohort")``
COHORT_QUERY = f"{MessageType.QUERY}.cohort"


def _query_nodes(
    grid: Grid,
    node_ids: list[int],
    timeout: float,
    decode: Callable[[int, Message], Any],
    group_id: str = "discovery",
) -> CheckedReplies:
    """Send ``query.cohort`` to ``node_ids`` through the exchange; return the checked replies."""
    content = RecordDict({"config": ConfigRecord({"kind": "cohort"})})
    msgs = messages_to(node_ids, content, COHORT_QUERY, group_id)
    return exchange(grid, msgs, decode, group_id, timeout)


class CohortQueries:
    """Ask the online nodes for their cohort; ask again whoever failed or stayed silent.

    A node whose query fails (an error reply: Flower's "node unavailable" when a heartbeat
    came late on a loaded machine, a ClientApp that crashed) or that does not answer within
    ``query_timeout`` is asked again ``retry_after`` s later, until ``timeout`` has passed:
    one lost message must not cost the whole discovery timeout. A node that answered is
    not asked again; a node without a cohort handler raises :class:`MissingHandlerError`.

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    timeout : float
        Seconds from now until :meth:`expired`.
    query_timeout : float, optional
        Seconds one query waits for its replies.
    retry_after : float, optional
        Seconds before a node whose query failed or went unanswered is asked again.
    group_id : str, optional
        The messages' group id (``discovery``, ``probe``).
    """

    def __init__(
        self,
        grid: Grid,
        timeout: float,
        query_timeout: float = 120.0,
        retry_after: float = 5.0,
        group_id: str = "discovery",
    ) -> None:
        self.grid, self.group_id = grid, group_id
        self.query_timeout, self.retry_after = float(query_timeout), float(retry_after)
        self.deadline = time.monotonic() + float(timeout)
        self.answered: set[int] = set()
        self.retry_at: dict[int, float] = {}
        self.reasons: dict[int, str] = {}
        self.errors: dict[int, str] = {}  # each node's last error reply, kept past timeouts
        #: replies left out so far (error replies and malformed ones)
        self.left_out = 0

    def expired(self) -> bool:
        """Return whether ``timeout`` has passed."""
        return time.monotonic() > self.deadline

    def poll(self, decode: Callable[[int, Message], Any]) -> list[tuple[int, Any]]:
        """Query the online nodes that have not answered and are not waiting for a retry.

        Parameters
        ----------
        decode : callable
            ``decode(src, reply) -> value``; raises ``ValueError`` / ``KeyError`` /
            ``TypeError`` to reject a malformed reply (left out and counted in
            :attr:`left_out`; that node is not asked again).

        Returns
        -------
        list of (int, Any)
            Node id and decoded value of every accepted reply, in send order.
        """
        now = time.monotonic()
        ask = [
            int(n)
            for n in self.grid.get_node_ids()
            if int(n) not in self.answered and self.retry_at.get(int(n), 0.0) <= now
        ]
        if not ask:
            return []
        wait = max(min(self.deadline - now, self.query_timeout), 1.0)
        try:
            checked = _query_nodes(self.grid, ask, wait, decode, self.group_id)
        except MissingHandlerError as err:
            raise MissingHandlerError(
                f"{err} (a cohort strategy needs every node to say which users it serves; a "
                "node that is one client needs a public strategy of flower_app.strategies)"
            ) from None
        self.left_out += checked.bad
        for src, reason in checked.errors.items():
            self.errors[src] = reason
            self._retry(src, reason)
        for src in checked.silent:
            self._retry(src, f"no reply in {wait:.0f} s")
        for src in set(ask) - set(checked.errors) - set(checked.silent):
            self.answered.add(src)  # accepted, or malformed (not asked again)
            self.reasons.pop(src, None)
            self.errors.pop(src, None)
        return checked.accepted

    def _retry(self, node: int, reason: str) -> None:
        log(WARNING, "%s: node %s failed (asked again in %g s): %s",
            self.group_id, node, self.retry_after, reason)  # fmt: skip
        self.reasons[node] = reason
        self.retry_at[node] = time.monotonic() + self.retry_after

    def failing(self) -> str:
        """Return the nodes whose last query failed, with the reasons ("" if none).

        A node whose last query went unanswered but that replied with an error before
        (e.g. its ClientApp refused its data file) is listed with that error too: a
        query cut short by the deadline must not hide the cause.
        """
        parts = []
        for node, reason in sorted(self.reasons.items()):
            error = self.errors.get(node)
            if error is not None and error != reason:
                reason = f"{reason}; its last error: {error}"
            parts.append(f"node {node}: {reason}")
        return "; ".join(parts)


def discover_cohorts(
    grid: Grid,
    n_users: int,
    n_elements: int,
    timeout: float = 300.0,
    poll_interval: float = 0.5,
    query_timeout: float = 120.0,
    retry_after: float = 5.0,
) -> CohortMap:
    """Ask nodes for their cohorts until all users are covered exactly once.

    Nodes whose query failed or went unanswered are asked again (:class:`CohortQueries`);
    a malformed reply is logged and left out (that node is not asked again).

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    n_users, n_elements : int
        The server's view of the instance; every node must report the same.
    timeout : float
        Seconds to wait for a complete split.
    poll_interval : float
        Seconds between looks for newly registered nodes.
    query_timeout : float
        Seconds one query waits for its replies before the silent nodes are asked again.
    retry_after : float
        Seconds before a node whose query failed or went unanswered is asked again.

    Returns
    -------
    CohortMap
        Node for every user.

    Raises
    ------
    DiscoveryError
        On inconsistent instances, overlapping cohorts, or a split still incomplete at the
        timeout (the message says how many users are covered by how many nodes).
    """
    queries = CohortQueries(grid, timeout, query_timeout, retry_after)
    known: dict[int, tuple[int, int]] = {}
    while True:
        for src, (total, elements, first, count) in queries.poll(_decode_cohort):
            if total != n_users or elements != n_elements:
                raise DiscoveryError(
                    f"node {src} loaded an instance with {total} users and "
                    f"{elements} elements; the server has {n_users} and "
                    f"{n_elements}: server and nodes must use the same dataset and data-dir"
                )
            if count > 0:
                known[src] = (first, count)
        covered = _coverage(known, n_users)
        if covered == n_users:
            break
        if queries.expired():
            failing = queries.failing()
            raise DiscoveryError(
                f"after {timeout:.0f} s the {len(known)} nodes that answered serve {covered} of "
                f"{n_users} users; start the missing SuperNodes (num-partitions must match) "
                "or raise discovery-timeout" + (f" (failing: {failing})" if failing else "")
            )
        time.sleep(poll_interval)
    order = sorted(known, key=lambda n: known[n][0])
    log(INFO, "discovery: %d nodes serve %d users", len(order), n_users)
    return CohortMap(
        node_ids=np.array(order, dtype=object),
        firsts=np.array([known[n][0] for n in order], dtype=np.int64),
        counts=np.array([known[n][1] for n in order], dtype=np.int64),
        n_elements=int(n_elements),
        asked=frozenset(queries.answered),
    )


def refresh_cohorts(grid: Grid, cohorts: CohortMap, timeout: float = 30.0) -> CohortMap:
    """Mark mapped nodes that left the grid offline; let a returning node take its place.

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid (``get_node_ids`` lists the online nodes).
    cohorts : CohortMap
        The current map.
    timeout : float
        Seconds to wait for the cohort replies of newly seen nodes.

    Returns
    -------
    CohortMap
        The same object when nothing changed; otherwise a map whose ``offline`` holds the
        mapped nodes not online, and in which a new node serving exactly an offline node's
        users (same ``first-user`` and ``num-users``) has replaced it.
    """
    online = {int(n) for n in grid.get_node_ids()}
    mapped = [int(n) for n in cohorts.node_ids]
    offline = {n for n in mapped if n not in online}
    new = sorted(n for n in online if n not in mapped and n not in cohorts.asked)
    if not new and offline == set(cohorts.offline):
        return cohorts
    node_ids = list(mapped)
    if new and offline:
        where = {
            (int(f), int(c)): i
            for i, (f, c) in enumerate(zip(cohorts.firsts, cohorts.counts, strict=True))
        }
        checked = _query_nodes(grid, new, timeout, _decode_cohort, "re-discovery")
        # a node whose query failed or went unanswered is asked again before the next round
        answered = set(new) - set(checked.errors) - set(checked.silent)
        for src, (total, elements, first, count) in checked.accepted:
            i = where.get((first, count))
            consistent = total == int(cohorts.counts.sum()) and (
                cohorts.n_elements < 0 or elements == cohorts.n_elements
            )
            if i is not None and node_ids[i] in offline and consistent:
                log(
                    INFO,
                    "re-discovery: node %s serves users [%d, %d) of offline node %s: it takes "
                    "its place",
                    src,
                    first,
                    first + count,
                    node_ids[i],
                )
                offline.discard(node_ids[i])
                node_ids[i] = src
        new = sorted(answered)
    else:
        new = []  # nothing to replace: a new node is asked once there is
    for n in offline - set(cohorts.offline):
        log(WARNING, "node %s is offline: its users are skipped until it comes back", n)
    return CohortMap(
        node_ids=np.array(node_ids, dtype=object),
        firsts=cohorts.firsts,
        counts=cohorts.counts,
        n_elements=cohorts.n_elements,
        offline=frozenset(offline),
        asked=cohorts.asked | frozenset(new),
    )


def wait_for_mapped_nodes(
    grid: Grid, cohorts: CohortMap, timeout: float, poll_interval: float = 1.0
) -> set[int]:
    """Wait up to ``timeout`` s until every mapped node is in the grid's node list again.

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid (``get_node_ids`` lists the online nodes).
    cohorts : CohortMap
        The current map (its ``node_ids`` are waited for).
    timeout : float
        Seconds to wait at most.
    poll_interval : float
        Seconds between looks at the grid.

    Returns
    -------
    set of int
        The mapped nodes still not online (empty when all are back).
    """
    mapped = {int(n) for n in cohorts.node_ids}
    deadline = time.monotonic() + timeout
    missing = mapped - {int(n) for n in grid.get_node_ids()}
    if missing:
        log(INFO, "waiting up to %g s for node(s) %s to be back online", timeout, sorted(missing))
    while missing and time.monotonic() < deadline:
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
        missing = mapped - {int(n) for n in grid.get_node_ids()}
    if missing:
        log(WARNING, "node(s) %s not back after %g s: their users are skipped", sorted(missing),
            timeout)  # fmt: skip
    return missing


def cohort_of(reply: Message) -> tuple[int, int, int, int]:
    """Return a cohort reply's (n-users-total, n-elements, first-user, num-users).

    Raises
    ------
    KeyError, ValueError
        If a key is missing or a value is not an int (or is negative).
    """
    props = reply.content.config_records["properties"]
    out = []
    for key in ("n-users-total", "n-elements", "first-user", "num-users"):
        value = props[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"'{key}' = {value!r}: expected an int >= 0")
        out.append(value)
    return out[0], out[1], out[2], out[3]


def _decode_cohort(src: int, reply: Message) -> tuple[int, int, int, int]:
    return cohort_of(reply)


def _coverage(known: dict[int, tuple[int, int]], n_users: int) -> int:
    """Return users covered; raise on overlapping cohorts."""
    ranges = sorted(known.values())
    for (f0, c0), (f1, _) in zip(ranges, ranges[1:], strict=False):
        if f0 + c0 > f1:
            raise DiscoveryError(
                f"two nodes claim overlapping users [{f0}, {f0 + c0}) and [{f1}, ...): "
                "every SuperNode needs a distinct partition-id"
            )
    return sum(c for _, c in ranges if c > 0)


def group_for_round(
    cohorts: CohortMap, users: np.ndarray, least_nodes: int | None = None
) -> tuple[dict[int, np.ndarray], dict[int, tuple[int, str]]]:
    """Split a round's sorted users by the node serving them, skipping offline nodes.

    Parameters
    ----------
    cohorts : CohortMap
        The current map.
    users : numpy.ndarray
        The round's sampled users, sorted.
    least_nodes : int, optional
        Under secure aggregation, the least number of nodes a sum needs: when the users sit
        on fewer, other online nodes are added with no users (they reply zeros; the server
        learns the same sum over the sampled users, e.g. K = 2 users on one node).

    Returns
    -------
    groups : dict of int to numpy.ndarray
        Node id -> its users (in node order).
    skipped : dict of int to (int, str)
        Offline nodes that served sampled users: their user count and the reason.
    """
    groups = cohorts.group(users)
    offline = "node offline (left the SuperLink's node list; not sent)"
    skipped = {
        node: (int(groups.pop(node).size), offline)
        for node in [n for n in groups if n in cohorts.offline]
    }
    if least_nodes is not None:
        idle = [int(n) for n in cohorts.node_ids
                if int(n) not in groups and int(n) not in cohorts.offline]  # fmt: skip
        for node in idle[: max(0, least_nodes - len(groups))]:
            groups[node] = np.zeros(0, dtype=np.asarray(users).dtype)
        order = {int(n): i for i, n in enumerate(cohorts.node_ids)}
        groups = dict(sorted(groups.items(), key=lambda item: order[item[0]]))
    return groups, skipped
