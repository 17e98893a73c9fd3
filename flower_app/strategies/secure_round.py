"""A round's train exchange under secure aggregation: the call into the privacy package.

:func:`secure_train` replaces "send the round's train messages, check every reply" by
:func:`flower_app.privacy.secagg_server.secure_sum`, whose exchanges go through the
strategy's :meth:`~flower_app.strategies.base.RoundStrategy.send` (and so through
:func:`~flower_app.strategies.exchange.transmit`). The server receives one summed reply for
the round's surviving nodes; the strategy decodes it as one sender
(:meth:`~flower_app.strategies.base.RoundStrategy.merge_senders`) and aggregates it as it
aggregates replies in the clear.
"""

from __future__ import annotations

from logging import WARNING
from typing import TYPE_CHECKING

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.privacy.secagg_server import key_book, secure_sum
from flower_app.strategies.errors import AllRepliesRejectedError
from flower_app.strategies.replies import CheckedReplies

if TYPE_CHECKING:
    from flower_app.strategies.base import RoundStrategy

__all__ = ["secure_train"]


def secure_train(
    strategy: RoundStrategy, server_round: int, grid: Grid, messages: list[Message]
) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """Run a round's train exchange under secure aggregation and aggregate the sum.

    The summed reply is decoded by the strategy's ``decode_train_reply`` as one sender (see
    ``merge_senders``); if the strategy rejects it, the round fails (a single bad reply
    cannot be singled out of a sum). The protocol's cost (messages, bytes, time) goes into
    the round's metrics.

    Parameters
    ----------
    strategy : RoundStrategy
        The strategy whose round it is (its ``secure_aggregation`` is set).
    server_round : int
        The round.
    grid : Grid
        The ServerApp's grid.
    messages : list of Message
        The round's train messages, one per node.

    Returns
    -------
    tuple of (ArrayRecord or None, MetricRecord or None)
        What the strategy's ``aggregate_accepted`` returned, with the protocol's numbers.

    Raises
    ------
    AllRepliesRejectedError
        If no node's reply could be summed, or the sum was rejected.
    """
    settings = strategy.secure_aggregation
    assert settings is not None
    context = f"round {server_round}"
    expected = {int(m.metadata.dst_node_id) for m in messages}
    outcome = secure_sum(
        lambda msgs: strategy.send(grid, msgs),
        messages,
        settings,
        server_round,
        strategy.secure_public_metrics,
        strategy.secure_transform(),
        keys=key_book(grid),
    )
    checked = CheckedReplies(failed=dict(outcome.failed), bad=outcome.bad)
    checked.missing = len(outcome.failed) - outcome.bad
    strategy.node_privacy.update(outcome.node_privacy)
    for node, reason in sorted(outcome.failed.items()):
        log(WARNING, "%s: node %s left out: %s", context, node, reason)
        if checked.first_error is None:
            checked.first_error = f"node {node}: {reason}"
    for node, reason in sorted(outcome.unmask_rejected.items()):
        log(WARNING, "%s: node %s's unmask reply left out (its reply is in the sum): %s",
            context, node, reason)  # fmt: skip
    if outcome.content is not None and outcome.template is not None:
        strategy.summed_nodes = list(outcome.survivors)
        sender = strategy.merge_senders(strategy.summed_nodes)
        reply = Message(outcome.content, reply_to=outcome.template)
        try:
            checked.accepted.append((sender, strategy.decode_train_reply(sender, reply)))
        except (ValueError, KeyError, TypeError) as err:
            raise AllRepliesRejectedError(
                f"{context}: the securely aggregated sum of {len(outcome.survivors)} "
                f"nodes was rejected: {err} (a single bad reply cannot be singled out "
                "of a sum)"
            ) from err
        finally:
            strategy.forget_summed_sender()
    strategy.expect(expected)
    strategy.enforce_replies(server_round, checked, expected)
    arrays, metrics = strategy.aggregate_accepted(server_round, checked)
    if metrics is not None:
        metrics["bad-replies"] = int(checked.left_out)
        metrics["secagg-nodes"] = len(outcome.survivors)
        metrics["secagg-unmask-rejected"] = len(outcome.unmask_rejected)
        for key, value in outcome.cost.items():
            metrics[key] = value
        if "secagg-bytes-up" in outcome.cost:  # what really went up, not the sum's size
            metrics["bytes-up"] = int(outcome.cost["secagg-bytes-up"])
            metrics["bytes-up-max-client"] = int(outcome.cost["secagg-bytes-up-max-node"])
    return arrays, metrics
