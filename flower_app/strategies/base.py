"""The contract of a strategy with the round loop, and the loop: ``start()``, written once.

Every strategy of :mod:`flower_app.strategies` subclasses :class:`RoundStrategy`, an abstract
base class: what the loop reads from a strategy is declared on it, as abstract methods
(the three steps every strategy has), methods with a default (the optional steps) and class
attributes with a default (what a strategy says of itself). Nothing else is read.

The steps, as Flower's ``FedAvg`` has them:

``train_messages`` / ``decode_train_reply`` / ``aggregate_accepted`` (abstract)
    the round: messages out, one reply checked (raise to reject it), the accepted replies
    aggregated.
``setup(grid, arrays, num_rounds)``
    work before round 1 (discovery of cohorts, a counting round, the importance protocol);
    returns the number of rounds the protocol will run (the protocol may fix it: FedSM
    Algorithm 1 runs k rounds, whatever ``num_rounds`` says; it says so at construction).
``refresh_nodes(grid)``, ``before_round(server_round, arrays, grid)``
    before each round: the view of the grid (the cohort strategies re-discover which node
    serves which users), then an exchange that must precede sampling (MaxFL's opt-in test,
    FedSubAvg's index sets).
``evaluate_messages`` / ``aggregate_evaluate``
    federated evaluation; return ``[]`` to skip it in a round (the default).
``finalize(arrays)``
    the ``Result.arrays`` of the run (e.g. FedCG's rounding); default: the last arrays.

The loop does the rest, once: ``train_config``/``evaluate_config`` merged into every message
(with ``server-round``), ``evaluate_fn(server_round, arrays)`` at round 0 and after every
round, the :class:`~flwr.serverapp.strategy.Result`, reply checking
(:mod:`~flower_app.strategies.replies`: a bad reply is counted in ``bad-replies`` and left
out, never averaged in), a history of per-round rows (``self.history``) passed to
``on_round`` as each round ends, and the log lines. Its messages go through
:func:`~flower_app.strategies.exchange.transmit` (TTL, poll schedule, replies in send order);
under secure aggregation a round's train exchange is
:func:`~flower_app.strategies.secure_round.secure_train`. Flower's ``configure_*`` /
``aggregate_*`` methods are defined here once, for *other* loops that drive a strategy
(Flower's DP wrappers: :mod:`~flower_app.strategies.external_loop`).

Loud failures: a round in which *every* reply was rejected raises
:class:`AllRepliesRejectedError` carrying the first rejection's reason; a round in which fewer
than ``min_reply_fraction`` of the clients asked were answered for raises
:class:`TooFewRepliesError`; a node whose ClientApp has no handler for a message raises
:class:`MissingHandlerError` naming the decorator to add, as soon as its reply arrives, and
before round 1 for the handlers a run needs only later (``probe_messages``: e.g. MaxFL's
``@app.evaluate("appeal")``, first used after the mandatory rounds).

Node failures: every failed node is recorded with Flower's reason in the round's row
(:mod:`~flower_app.strategies.round_rows`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from logging import INFO
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_app.privacy.secagg_server import SecureAggregation
from flower_app.strategies import external_loop, round_rows
from flower_app.strategies.errors import (
    AllRepliesRejectedError,
    MissingHandlerError,
    TooFewRepliesError,
)
from flower_app.strategies.exchange import transmit
from flower_app.strategies.records import check_initial_arrays, merged_config
from flower_app.strategies.replies import CheckedReplies, check_replies, handler_hint
from flower_app.strategies.secure_round import secure_train

__all__ = ["SUMMED_SENDER", "EvaluateFn", "RoundStrategy"]

#: the sender id of a securely aggregated sum (no node has a negative id)
SUMMED_SENDER = -1

#: Flower's ``evaluate_fn``: ``(server_round, arrays) -> MetricRecord | None``
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
RoundCallback = Callable[[dict[str, Any]], None]


class RoundStrategy(Strategy, ABC):
    """Base of every strategy here: the contract with the loop, and Flower's ``start()``.

    Subclasses implement :meth:`train_messages`, :meth:`decode_train_reply` and
    :meth:`aggregate_accepted`, and override the optional steps they need.

    Parameters
    ----------
    on_round : callable, optional
        Receives each round's row (a dict of the round's metrics) as the round ends, e.g. to
        append it to ``metrics.jsonl``.
    min_reply_fraction : float, optional
        Least fraction of the round's clients (users, in cohort mode) whose replies must be
        accepted; a round below it raises :class:`TooFewRepliesError` instead of going on
        with a different result. Default 0.0: like Flower's ``FedAvg``, a round aggregates
        whatever came (the loss is recorded in the round's ``failed-nodes`` and
        ``users-missing``); a round with no usable reply always fails.
    secure_aggregation : SecureAggregation, optional
        Sum each round's train replies with secure aggregation
        (:mod:`flower_app.privacy`): the server obtains only the sum of the nodes'
        replies; the nodes' ClientApps need
        :func:`~flower_app.privacy.secure_aggregation_mod`. Default None (replies in the
        clear). Strategies whose
        aggregate is not a sum of replies refuse it (``supports_secure_aggregation``).
    checkpoint_fn : callable, optional
        Resumable strategies (``resumable``): called as ``checkpoint_fn(payload)`` after
        every round; ``resume_from(payload)`` before ``start`` continues after that round.
    """

    # ------------------------------------------------------------------ declared attributes
    #: also send ``evaluate_messages(0, ...)`` before round 1 (federated initial evaluation)
    evaluate_initial: bool = False
    #: logged before that round-0 evaluation, which may take long (e.g. MaxFL's solo models)
    initial_evaluation_note: str = ""
    #: the strategy implements :meth:`checkpoint_state` / :meth:`restore_state`
    resumable: bool = False
    #: the round's aggregate is a function of the sum of the train replies (see
    #: :meth:`~flower_app.strategies.RoundStrategy.merge_senders`), so secure aggregation can
    #: replace the replies by their sum
    supports_secure_aggregation: bool = False
    #: metrics of a train reply sent in the clear under secure aggregation (every node
    #: must send the same value, e.g. FedSM's ``num-elements``); all others are summed
    secure_public_metrics: tuple[str, ...] = ()
    #: the protocol's length shows only as it runs: rounds are logged as ``[round t/?]``
    rounds_open_ended: bool = False
    #: rounds ``setup`` is told when another loop drives the strategy (it does not say)
    external_num_rounds: int = 1_000_000
    #: the run's seed (secure aggregation's neighbour ring is seeded with it)
    seed: int = 0

    def __init__(
        self,
        on_round: RoundCallback | None = None,
        min_reply_fraction: float = 0.0,
        secure_aggregation: SecureAggregation | None = None,
        *,
        checkpoint_fn: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if not 0.0 <= float(min_reply_fraction) <= 1.0:
            raise ValueError(f"min_reply_fraction={min_reply_fraction}: expected a value in [0, 1]")
        if secure_aggregation is not None:
            if not isinstance(secure_aggregation, SecureAggregation):
                raise TypeError(
                    "secure_aggregation must be a flower_app.privacy.SecureAggregation, not "
                    f"{type(secure_aggregation).__name__}"
                )
            if not self.supports_secure_aggregation:
                raise ValueError(
                    f"{type(self).__name__} does not support secure aggregation yet: its "
                    "aggregate is not computed from the sum of the replies alone"
                )
        self.secure_aggregation = secure_aggregation
        self.on_round = on_round
        self.min_reply_fraction = float(min_reply_fraction)
        self.history: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.checkpoint_fn = checkpoint_fn
        #: seconds an exchange waits for its replies (``start``'s ``timeout``)
        self.exchange_timeout = 3600.0
        #: the nodes whose replies a secure sum stands for (its survivors)
        self.summed_nodes: list[int] = []
        #: node id -> the privacy figures it last reported (its own ledger)
        self.node_privacy: dict[int, dict[str, Any]] = {}
        #: ``time.perf_counter()`` when the run started
        self.started_at = 0.0
        #: where another loop driving the strategy is (Flower's DP wrappers)
        self.external = external_loop.ExternalLoopState()
        self._expected: set[int] = set()
        self._sent_ids: dict[str, int] = {}
        self._last_checked: CheckedReplies | None = None
        self._skipped: dict[int, tuple[int, str]] = {}
        self._resume: dict[str, Any] | None = None

    # ------------------------------------------------------------------ the steps
    @abstractmethod
    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Return the round's train messages (``config``: the user's ``train_config``)."""

    @abstractmethod
    def decode_train_reply(self, src: int, reply: Message) -> Any:
        """Check one train reply and return its decoded content (raise to reject it)."""

    @abstractmethod
    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the accepted train replies of a round."""

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Prepare the run before round 1; return the number of rounds to run.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        arrays : ArrayRecord
            ``initial_arrays`` (already checked by :meth:`expected_initial_arrays`).
        num_rounds : int
            What the caller asked for.

        Returns
        -------
        int
            Rounds to run (``num_rounds`` unless the protocol fixes its length).
        """
        return num_rounds

    def initial_state(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return the arrays of round 0, after ``setup`` (default: ``initial_arrays``).

        A strategy whose starting point exists only after ``setup`` (e.g. x = 0 of a ground
        set whose size the nodes reported) returns it here; ``evaluate_fn(0, ...)`` and round
        1 receive it.
        """
        return arrays

    def expected_initial_arrays(self) -> Mapping[str, tuple[tuple[int, ...], str]] | None:
        """Return key -> (shape, dtype kinds) that ``initial_arrays`` must have, or None."""
        return None

    def before_round(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> None:
        """Exchange what must precede the round's sampling (default: nothing)."""

    def refresh_nodes(self, grid: Grid) -> None:
        """Before each round, before ``before_round``: update the view of the grid.

        Default: nothing (a plain strategy samples from the grid's current nodes every
        round anyway); the cohort strategies (:mod:`flower_app.strategies.cohort`)
        re-discover which node serves which users.
        """

    def probe_messages(
        self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """Return requests for the handlers the run needs only after round 1 (default none).

        Sent once before round 1, after ``setup``. Each is a real request of its kind (e.g.
        MaxFL's opt-in test of the initial model), so a ClientApp answers it as it will
        later; the replies are discarded. A node without the handler stops the run there
        with :class:`MissingHandlerError` naming the decorator to add.
        """
        return []

    def evaluate_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Return the round's evaluate messages (default none: no federated evaluation)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return None (no federated evaluation by default)."""
        return None

    def finished(self) -> bool:
        """Return True once the protocol has ended, before the rounds ``setup`` returned.

        For protocols whose length shows only as they run (FedSM Algorithm 2 stops when its
        thresholds are used up): ``setup`` returns an upper bound, this says when to stop.
        """
        return False

    def finalize(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return ``Result.arrays`` of the run (default: the last round's arrays)."""
        return arrays

    def round_summary(self, row: dict[str, Any]) -> str:
        """Return the short text of a round's log line (the strategy's key numbers)."""
        return ""

    def summary(self) -> None:
        """Log the strategy's settings (subclasses say more)."""
        log(INFO, "%s", type(self).__name__)

    def sent_users(self, node_id: int) -> int:
        """Return how many clients (users) the round's message to ``node_id`` stands for.

        1 for a plain node; a cohort strategy returns the users it sampled on the node, so that
        ``users-missing`` and ``min_reply_fraction`` count users, not nodes.
        """
        return 1

    def merge_senders(self, nodes: list[int]) -> int:
        """Register the sum of ``nodes``' replies as one sender; return its id.

        Under secure aggregation the server receives one summed reply for the round's
        surviving nodes; :meth:`decode_train_reply` is called on it with the id returned
        here, so the strategy's per-sender bookkeeping (e.g. users sent per node) must
        answer for that id with the survivors' total. A strategy that sets
        ``supports_secure_aggregation`` overrides it (and :meth:`forget_summed_sender`).
        """
        raise NotImplementedError(f"{type(self).__name__} does not sum replies securely")

    def forget_summed_sender(self) -> None:
        """Drop what :meth:`merge_senders` registered, once the sum is decoded."""

    def secure_transform(self) -> dict[str, Any] | None:
        """Return the reply transform the nodes apply under secure aggregation, or None.

        For plain-mode replies that are not sums as they are (MaxFL's trained models):
        ``{"name": <flower_app.privacy.transforms name>, <param>: <value>, ...}``.
        """
        return None

    def check_external_loop(self) -> None:
        """Refuse (raise) or warn when another loop drives the strategy.

        Called once, before ``setup``, when another loop (e.g. one of Flower's
        ``DifferentialPrivacy*`` wrappers) calls ``configure_train`` with a grid. Default:
        accept.
        """

    def checkpoint_state(self) -> Any:
        """Return the server-side state to resume from after a round.

        A resumable strategy (``resumable = True``) returns everything its next round
        depends on besides the arrays (e.g. FedSM's run: S so far, its random generator),
        as a run folder's checkpoint can store it: plain data, numpy arrays and generators,
        and objects of the types registered in :mod:`flower_app.checkpoint_types` (an own
        strategy registers its own with :func:`flower_app.checkpoint.register_type`).
        """
        raise NotImplementedError(f"{type(self).__name__} is not resumable")

    def restore_state(self, state: Any) -> None:
        """Put back what :meth:`checkpoint_state` returned (after ``setup``)."""
        raise NotImplementedError(f"{type(self).__name__} is not resumable")

    # ------------------------------------------------------------------ Flower's Strategy API
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Return the round's train messages to another loop (see :mod:`.external_loop`)."""
        if grid is None:  # called alone (e.g. a unit test that prepared the strategy)
            return self.train_messages(server_round, arrays, config, grid)
        arrays = external_loop.prepare_round(self, server_round, arrays, grid)
        return external_loop.expect_replies(
            self, self.train_messages(server_round, arrays, config, grid)
        )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Return the round's evaluate messages to another loop (see :mod:`.external_loop`)."""
        messages = self.evaluate_messages(server_round, arrays, config, grid)
        return messages if grid is None else external_loop.expect_replies(self, messages)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the replies (bad ones counted, all bad fails) and aggregate the rest."""
        checked = self.check(
            replies, self.decode_train_reply, f"round {server_round}", train_round=server_round
        )
        arrays, metrics = self.aggregate_accepted(server_round, checked)
        if metrics is not None and "bad-replies" not in metrics:
            metrics["bad-replies"] = int(checked.left_out)
        return arrays, metrics

    # ------------------------------------------------------------------ exchanges
    def send(
        self, grid: Grid, messages: Iterable[Message], timeout: float | None = None
    ) -> list[Message]:
        """Send messages through :func:`~flower_app.strategies.exchange.transmit`.

        Remembers whom they went to (the expected senders that :meth:`check` holds the
        replies against) and returns the replies in send order; ``timeout`` defaults to
        ``start``'s.
        """
        delivery = transmit(grid, messages, self.exchange_timeout if timeout is None else timeout)
        self._expected = delivery.expected
        self._sent_ids = delivery.destinations
        return delivery.replies

    def expect(self, nodes: set[int]) -> None:
        """Make ``nodes`` the senders the next :meth:`check` expects (another loop sent)."""
        self._expected = set(nodes)
        self._sent_ids = {}

    def check(
        self,
        replies: Iterable[Message],
        decode: Callable[[int, Message], Any],
        context: str,
        expected: Iterable[int] | None = None,
        all_rejected_fails: bool = True,
        train_round: int | None = None,
    ) -> CheckedReplies:
        """Check replies against the nodes last sent to; fail loudly if none is usable.

        With ``train_round`` (the replies of a round's training exchange), the failed nodes
        are kept for the round's row and ``min_reply_fraction`` is enforced.

        Raises
        ------
        AllRepliesRejectedError
            If ``all_rejected_fails`` and nodes were asked but no reply was accepted.
        TooFewRepliesError
            If ``train_round`` is given and fewer than ``min_reply_fraction`` of the round's
            clients were answered for.
        """
        expected = self._expected if expected is None else {int(n) for n in expected}
        checked = check_replies(replies, decode, expected, context, self._sent_ids)
        self.node_privacy.update(checked.node_privacy)
        if all_rejected_fails and expected and not checked.accepted:
            raise AllRepliesRejectedError(
                f"{context}: all {len(expected)} replies were rejected; first: "
                f"{checked.first_error}"
            )
        if train_round is not None:
            self.enforce_replies(train_round, checked, expected, all_rejected_fails)
        return checked

    def enforce_replies(
        self,
        train_round: int,
        checked: CheckedReplies,
        expected: set[int],
        all_rejected_fails: bool = True,
    ) -> None:
        """Keep a round's checked replies for its row; enforce ``min_reply_fraction``."""
        self._last_checked = checked
        asked = {n: self.sent_users(n) for n in expected}
        accepted = {n for n, _ in checked.accepted}
        answered = sum(asked.get(n, 0) for n in accepted)
        if SUMMED_SENDER in accepted:  # a secure sum stands for its survivors
            answered += sum(asked.get(n, 0) for n in self.summed_nodes)
        total = sum(asked.values()) + sum(u for u, _ in self._skipped.values())
        if total and not answered and all_rejected_fails:
            raise AllRepliesRejectedError(
                f"round {train_round}: no client's reply accepted ({total} asked); "
                f"failed nodes: {self._failed_text(checked)}"
            )
        if total and answered < self.min_reply_fraction * total:
            raise TooFewRepliesError(
                f"round {train_round}: replies for {answered} of {total} clients "
                f"accepted, below min_reply_fraction={self.min_reply_fraction:g}; "
                f"failed nodes: {self._failed_text(checked)}"
            )

    def _failed_text(self, checked: CheckedReplies) -> str:
        reasons = {n: r for n, (_, r) in self._skipped.items()} | checked.failed
        return "; ".join(f"{n}: {r}" for n, r in sorted(reasons.items())) or "none"

    @staticmethod
    def merged_config(config: ConfigRecord | None, server_round: int, **extra: Any) -> ConfigRecord:
        """Return the user's config with ``server-round`` and the strategy's entries."""
        return merged_config(config, server_round, **extra)

    # ------------------------------------------------------------------ the run
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Run the strategy over the grid, as Flower's ``Strategy.start`` does.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        initial_arrays : ArrayRecord, optional
            The starting model (learning strategies: required, its keys come back in
            ``Result.arrays``) or starting point; see the strategy's docstring.
        num_rounds : int, optional
            Rounds to run (default 3); a protocol that fixes its own length says so in its
            docstring and logs the length it runs.
        timeout : float, optional
            Seconds to wait for the replies of one exchange (default 3600).
        train_config, evaluate_config : ConfigRecord, optional
            Entries merged into every train / evaluate message (``server-round`` added).
        evaluate_fn : callable, optional
            ``evaluate_fn(server_round, arrays) -> MetricRecord | None``, called with the
            initial arrays (round 0) and after every round.

        Returns
        -------
        Result
            ``arrays`` (see the strategy), per-round ``train_metrics_clientapp``,
            ``evaluate_metrics_clientapp`` and ``evaluate_metrics_serverapp``.

        Raises
        ------
        InitialArraysError, AllRepliesRejectedError, MissingHandlerError
            See the module docstring.
        """
        check_initial_arrays(initial_arrays, self.expected_initial_arrays())
        arrays = ArrayRecord() if initial_arrays is None else initial_arrays
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        self.exchange_timeout = float(timeout)
        log(INFO, "Starting %s strategy:", type(self).__name__)
        self.summary()
        self.started_at = time.perf_counter()
        total = int(self.setup(grid, arrays, int(num_rounds)))
        arrays = self.initial_state(arrays)
        self._probe_handlers(grid, arrays, evaluate_config)
        result = Result()
        first = 1
        if self._resume is not None:
            first = self._restore(self._resume, result) + 1
            arrays = result.arrays if len(result.arrays) else arrays
            log(INFO, "resuming after round %d of %d", first - 1, total)
        row0: dict[str, Any] = {}
        if self.evaluate_initial and first == 1:
            log(INFO, "[round 0/%d] evaluating the initial model%s", total,
                f": {self.initial_evaluation_note}" if self.initial_evaluation_note else "")
            row0.update(self._evaluate(0, arrays, evaluate_config, grid, result))
        if evaluate_fn is not None and first == 1:
            res = evaluate_fn(0, arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
                row0.update(dict(res))
        if row0:
            self._emit({"server-round": 0, **row0}, total)
        for t in range(first, total + 1):
            if self.finished():
                break
            r0 = time.perf_counter()
            self.refresh_nodes(grid)
            self.before_round(t, arrays, grid)
            messages = list(self.train_messages(t, arrays, train_config, grid))
            if self.secure_aggregation is None:
                new_arrays, metrics = self.aggregate_train(t, self.send(grid, messages))
            else:
                new_arrays, metrics = secure_train(self, t, grid, messages)
            if new_arrays is not None:
                arrays = new_arrays
                result.arrays = new_arrays
            row: dict[str, Any] = {"server-round": t}
            if metrics is not None:
                result.train_metrics_clientapp[t] = metrics
                row.update(dict(metrics))
            self._record_failures(t, row)
            row.update(self._evaluate(t, arrays, evaluate_config, grid, result))
            if evaluate_fn is not None:
                res = evaluate_fn(t, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[t] = res
                    row.update(dict(res))
            row["round-time"] = time.perf_counter() - r0
            self._emit(row, total)
            if self.resumable and self.checkpoint_fn is not None:
                self.checkpoint_fn(
                    {
                        "server-round": t,
                        "arrays": {k: arrays[k].numpy() for k in arrays},
                        "state": self.checkpoint_state(),
                        "history": list(self.history),
                        "failures": list(self.failures),
                    }
                )
        result.arrays = self.finalize(arrays)
        log(INFO, "%s finished in %.2f s", type(self).__name__,
            time.perf_counter() - self.started_at)  # fmt: skip
        return result

    def resume_from(self, payload: dict[str, Any]) -> None:
        """Make the next ``start()`` continue after the checkpoint's round.

        ``start()`` still runs ``setup`` (discovery: node ids may have changed), then
        restores the state, the arrays, the history and the failures of the checkpoint,
        and runs the remaining rounds only.

        Parameters
        ----------
        payload : dict
            What ``checkpoint_fn`` received after the last finished round.
        """
        if not self.resumable:
            raise NotImplementedError(f"{type(self).__name__} is not resumable")
        self._resume = payload

    def failure_summary(self) -> dict[str, Any]:
        """Return what the run lost to node failures, for ``summary.json``.

        See :func:`~flower_app.strategies.round_rows.failure_summary`.
        """
        return round_rows.failure_summary(self.failures)

    def _probe_handlers(self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord) -> None:
        messages = list(self.probe_messages(grid, arrays, config))
        if not messages:
            return
        kinds = sorted({m.metadata.message_type for m in messages})
        for reply in self.send(grid, messages, timeout=min(self.exchange_timeout, 600.0)):
            hint = None
            if reply.has_error():
                hint = handler_hint(str(reply.error.reason), reply.metadata.message_type)
            if hint is not None:
                src = self._sent_ids.get(reply.metadata.reply_to_message_id)
                raise MissingHandlerError(f"before round 1: node {src}: {hint}")
        log(INFO, "before round 1: the nodes answer %s", ", ".join(kinds))

    def _restore(self, payload: dict[str, Any], result: Result) -> int:
        """Restore a checkpoint into the strategy and ``result``; return its round."""
        self.restore_state(payload["state"])
        self.history = list(payload["history"])
        self.failures = list(payload["failures"])
        if payload["arrays"]:
            result.arrays = ArrayRecord({k: Array(v) for k, v in payload["arrays"].items()})
        self._resume = None
        return int(payload["server-round"])

    def _evaluate(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
        result: Result,
    ) -> dict[str, Any]:
        messages = list(self.evaluate_messages(server_round, arrays, config, grid))
        if not messages:
            return {}
        res = self.aggregate_evaluate(server_round, self.send(grid, messages))
        if res is None:
            return {}
        result.evaluate_metrics_clientapp[server_round] = res
        return dict(res)

    def _record_failures(self, server_round: int, row: dict[str, Any]) -> None:
        """Add the round's failed nodes and missing users to its row (and to ``failures``)."""
        checked, self._last_checked = self._last_checked, None
        skipped, self._skipped = self._skipped, {}
        failed = {} if checked is None else checked.failed
        users = {n: self.sent_users(n) for n in failed}
        entries = round_rows.failed_nodes(skipped, failed, users)
        if entries:
            row["failed-nodes"] = entries
        round_rows.node_privacy_row(row, self.node_privacy)
        if not entries:
            return
        missing = sum(f["users"] for f in entries)
        row["failed-nodes"] = entries
        row["users-missing"] = missing
        self.failures.append(
            {"server-round": server_round, "failed-nodes": entries, "users-missing": missing}
        )

    def _emit(self, row: dict[str, Any], total: int) -> None:
        row["wall-time"] = time.perf_counter() - self.started_at
        self.history.append(row)
        t = int(row["server-round"])
        log(
            INFO,
            "[round %d/%s] %s  bad=%s  %.2f s%s",
            t,
            "?" if self.rounds_open_ended else total,
            self.round_summary(row),
            row.get("bad-replies", 0),
            row.get("round-time", 0.0),
            "" if self.rounds_open_ended else round_rows.eta(self.history, t, total),
        )
        if self.on_round is not None:
            self.on_round(row)
