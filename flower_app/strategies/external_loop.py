"""Another loop drives a strategy: Flower's DP wrappers around the strategies here.

Flower's ``DifferentialPrivacy*`` strategies wrap a strategy (``self.strategy``), run
Flower's own ``Strategy.start`` loop and call only the wrapped strategy's
``configure_train`` / ``aggregate_train`` / ``configure_evaluate`` /
``aggregate_evaluate``, sending the messages themselves. The strategies' own loop
(:meth:`~flower_app.strategies.base.RoundStrategy.start`) never calls those four: it calls the
strategy's steps (``train_messages``, ``evaluate_messages``, ...) directly. So a call of
``configure_train`` or ``configure_evaluate`` with a grid *is* another loop driving the
strategy, and :class:`~flower_app.strategies.base.RoundStrategy` answers it with
:func:`prepare_round` and :func:`expect_replies`:

- before the first round, the strategy's ``check_external_loop`` (refuse or warn: e.g.
  FedSubAvg with sparse tables refuses, MaxFL warns that the wrappers' noise is FedAvg's),
  the ``initial_arrays`` check, ``setup`` (told ``external_num_rounds`` rounds, as the
  wrapper does not say) and ``initial_state``; secure aggregation is refused (the other
  loop would send every reply in the clear);
- before each round, the re-discovery of cohorts and ``before_round``;
- the destinations of the messages that ``configure_train`` **and** ``configure_evaluate``
  return become the senders the next ``aggregate_*`` call expects (without it, the evaluate
  replies of nodes not trained in the round were rejected as "reply from a node that was
  not sent anything").

Called without a grid (a unit test that prepared the strategy itself), ``configure_*``
return the step's messages and nothing else happens.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flwr.app import ArrayRecord, Message
from flwr.serverapp import Grid

from flower_app.strategies.records import check_initial_arrays

if TYPE_CHECKING:
    from flower_app.strategies.base import RoundStrategy

__all__ = ["ExternalLoopState", "expect_replies", "prepare_round"]


@dataclass
class ExternalLoopState:
    """Where another loop driving the strategy is (see :mod:`.external_loop`)."""

    setup_done: bool = False
    prepared_round: int = 0


def prepare_round(
    strategy: RoundStrategy, server_round: int, arrays: ArrayRecord, grid: Grid
) -> ArrayRecord:
    """Run ``setup`` once and ``before_round`` once per round for another loop.

    Parameters
    ----------
    strategy : RoundStrategy
        The driven strategy.
    server_round : int
        The round the other loop is configuring.
    arrays : ArrayRecord
        The arrays it passed (``initial_arrays`` in round 1).
    grid : Grid
        The ServerApp's grid.

    Returns
    -------
    ArrayRecord
        The arrays of the round (after ``initial_state`` in round 1).

    Raises
    ------
    RuntimeError
        If the strategy has ``secure_aggregation`` (the other loop sends replies in the
        clear).
    """
    state = strategy.external
    if strategy.secure_aggregation is not None:
        raise RuntimeError(
            f"{type(strategy).__name__} with secure_aggregation must run its own start(): "
            "another loop (e.g. a Flower DP wrapper) sends each reply in the clear"
        )
    if not state.setup_done:
        strategy.check_external_loop()
        check_initial_arrays(arrays, strategy.expected_initial_arrays())
        strategy.started_at = time.perf_counter()
        strategy.setup(grid, arrays, strategy.external_num_rounds)
        arrays = strategy.initial_state(arrays)
        state.setup_done = True
    if state.prepared_round != server_round:
        state.prepared_round = server_round
        strategy.refresh_nodes(grid)
        strategy.before_round(server_round, arrays, grid)
    return arrays


def expect_replies(strategy: RoundStrategy, messages: Iterable[Message]) -> list[Message]:
    """Remember the messages' destinations as the senders the next ``aggregate_*`` expects."""
    messages = list(messages)
    strategy.expect({int(m.metadata.dst_node_id) for m in messages})
    return messages
