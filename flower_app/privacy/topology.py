"""Who masks with whom: the neighbour ring of a secure-aggregation session.

A session's nodes mask in pairs with their *neighbours* (SecAgg+'s sparse graph). The ring
is a function of the announced nodes and the neighbourhood size alone
(:func:`ring_neighbours`), so the server sends it and every node recomputes its own place
in it and refuses any other (:mod:`flower_app.privacy.secagg_client`). That check is what
makes "a sum over every announced node, or nothing" hold on the node's side:

* a node's vector carries a pairwise mask with each of its neighbours, made from a key the
  server never learns; a set of vectors sums to something free of pairwise masks only if
  it holds, with every node, all of that node's neighbours;
* the ring over the announced nodes is connected (each node has at least one neighbour on
  either side), so the only such set is the whole announced set: the server can open the
  sum over every announced node or no sum at all. It cannot split a session into small
  groups (say, the target and two colluders) by announcing a ring of its own making;
* and since a node unmasks only after an authenticated share from each of its neighbours,
  an announced node that never submitted (an id padded into the list) leaves its
  neighbours refusing, and the session cannot be opened.

The order around the ring is by SHA-256 of the node id, not by the id itself, so that
neighbours are not the nodes the SuperLink happened to number next to each other, and the
ring is the same every round for the same nodes (each node derives a pairwise key once per
neighbour and run).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["MIN_NODES", "ring_neighbours"]

#: fewest nodes in a secure session and in any neighbourhood (a "sum" of two tells each
#: node the other's reply)
MIN_NODES = 3


def _position(node: int) -> bytes:
    return hashlib.sha256(b"flower_app secagg ring v1|%d" % int(node)).digest()


def ring_neighbours(nodes: Sequence[int], shares: int) -> dict[int, list[int]]:
    """Return each node's neighbourhood (itself included, sorted) in the session's ring.

    Parameters
    ----------
    nodes : sequence of int
        The session's announced nodes (distinct).
    shares : int
        The neighbourhood size: ``len(nodes)`` (every node), or an odd number from
        :data:`MIN_NODES` up.

    Raises
    ------
    ValueError
        For fewer than :data:`MIN_NODES` nodes, or a size that is neither every node nor an
        odd number in ``MIN_NODES..len(nodes)``.
    """
    order = sorted((int(n) for n in nodes), key=_position)
    n = len(order)
    if n < MIN_NODES or len(set(order)) != n:
        raise ValueError(f"a ring needs at least {MIN_NODES} distinct nodes, got {n}")
    if shares == n:
        everyone = sorted(order)
        return {u: list(everyone) for u in order}
    if not (MIN_NODES <= shares < n and shares % 2 == 1):
        raise ValueError(
            f"neighbourhood size {shares} for {n} nodes: every node ({n}) or an odd size in "
            f"{MIN_NODES}..{n - 1}"
        )
    half = shares // 2
    return {
        u: sorted(order[(i + off) % n] for off in range(-half, half + 1))
        for i, u in enumerate(order)
    }
