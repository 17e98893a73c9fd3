"""Torch on one thread: the clients' local training of MaxFL and of FedSubAvg's torch tasks.

Local training runs inside :func:`single_thread`, so that a client's result does not depend
on the process's thread count (Ray's actors run on one thread; the direct engine in a
process with many), and several clients trained side by side do not oversubscribe the cores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["single_thread"]


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread inside the block (reproducible sums, no oversubscription)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
