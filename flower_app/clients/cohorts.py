"""Which users a node serves: the dataset's users split into contiguous cohorts.

A node is not a user: with P = ``num-partitions`` nodes, node p serves
the users of the p-th of P contiguous, near-equal blocks (the split of
``numpy.array_split``), one user per node when P = n.
"""

from __future__ import annotations

__all__ = ["cohort_range"]


def cohort_range(n_users: int, partition_id: int, num_partitions: int) -> tuple[int, int]:
    """Return ``(first_user, num_users)`` of a node's cohort.

    Parameters
    ----------
    n_users : int
        Users in the dataset.
    partition_id : int
        The node's partition, 0..num_partitions−1.
    num_partitions : int
        Number of nodes the users are split over.

    Returns
    -------
    tuple of int
        First global user index and the cohort size (0 when there are more nodes than users).

    Raises
    ------
    ValueError
        If the partition id is out of range.
    """
    if num_partitions < 1 or not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id {partition_id} is out of range for num-partitions {num_partitions}"
        )
    size, extra = divmod(n_users, num_partitions)
    first = partition_id * size + min(partition_id, extra)
    return first, size + (1 if partition_id < extra else 0)
