"""FedSMStrategy: federated submodular maximisation by sampled marginal gains.

Rafiey, Namani & Charalambides (2025), "Federated Submodular Maximization: Improved
Communication Rounds and Bit Complexity": Algorithm 1 (k rounds), Algorithm 2 (O(log m)
rounds) and Algorithm 3 (amplification). The math lives in :mod:`flower_app.algorithms`
(:mod:`~flower_app.algorithms.fedsm.modes` ties the modes together,
:mod:`~flower_app.algorithms.fedsm.user` is one user with any utility); this module moves it
over Flower's Message API, on the loop of :class:`~flower_app.strategies.base.RoundStrategy`.

:class:`FedSMRounds` is the round both FedSM strategies share (messages from the round's
plan, the reports' sum, the server step): the public :class:`FedSMStrategy` (one node = one
user) and the runners' :class:`~flower_app.strategies.cohort.fedsm.FedSMCohorts`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.fedsm.checks import report_refusal
from flower_app.algorithms.fedsm.core import decode_report
from flower_app.algorithms.fedsm.modes import MODES, FedSMParams, FedSMRun, RoundPlan
from flower_app.algorithms.robust.reports import ReportTally, merge_tally
from flower_app.privacy.secagg_server import SecureAggregation
from flower_app.strategies.base import SUMMED_SENDER, RoundStrategy
from flower_app.strategies.errors import InitialArraysError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.records import merged_config, to_metric
from flower_app.strategies.replies import CheckedReplies, check_replies, int_metric
from flower_app.strategies.round_rows import warn_fixed_length
from flower_app.strategies.sampling import sample_nodes
from flower_app.strategies.submodular_records import build_matroid, drop_replies, majority_m
from flower_app.submodular.matroids import Matroid

__all__ = [
    "SELECTED_KEY",
    "FedSMRounds",
    "FedSMStrategy",
    "checked_params",
    "decode_report",
    "initial_set",
    "plan_record",
    "selected_record",
]

#: the key of the selected set in ``initial_arrays``, ``Result.arrays`` and ``evaluate_fn``
SELECTED_KEY = "selected"
#: Algorithms 2 and 3 end when the protocol says so; at most this many rounds
MAX_ROUNDS = 100_000


def plan_record(plan: RoundPlan) -> ArrayRecord:
    """Return the named arrays of a plain-mode ``train`` message (see the contract table).

    Parameters
    ----------
    plan : RoundPlan
        The round.

    Returns
    -------
    ArrayRecord
        ``"selected"`` int64 S; Algorithm 2 adds ``"pool"`` int32 X and ``"sequence"``
        int64 a_1..a_r'; amplification adds ``"x-ids"`` int32 and ``"x-values"`` float64.
    """
    arrays: dict[str, np.ndarray] = {SELECTED_KEY: np.asarray(plan.selected, dtype=np.int64)}
    if plan.mode == "alg2":
        arrays["pool"] = plan.pool.astype(np.int32)
        arrays["sequence"] = plan.sequence.astype(np.int64)
    if plan.surrogate != "none" and plan.point is not None:
        nz = np.flatnonzero(plan.point)
        arrays["x-ids"] = nz.astype(np.int32)
        arrays["x-values"] = plan.point[nz].astype(np.float64)
    return ArrayRecord({key: _array(value) for key, value in arrays.items()})


def selected_record(selected: Sequence[int]) -> ArrayRecord:
    """Return S as ``ArrayRecord({"selected": int64 array})``, in the order it was built."""
    return ArrayRecord({SELECTED_KEY: _array(np.asarray(list(selected), dtype=np.int64))})


def _array(value: np.ndarray) -> Array:
    return Array(np.ascontiguousarray(value))


def checked_params(
    params: FedSMParams, k: int, seed: int, secure_aggregation: SecureAggregation | None
) -> FedSMParams:
    """Check k and the seed, log the run's length; return ``params`` with ``dp_secure`` set.

    With shuffle-model DP (``dp_epsilon``), ε against the server is the shuffle bound only if
    the server sees totals (secure aggregation).

    Raises
    ------
    ValueError
        If k is not a positive int or the seed not a non-negative int.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be a positive int")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative int")
    if params.dp_epsilon:
        params = dataclasses.replace(params, dp_secure=secure_aggregation is not None)
    if params.mode == "alg1":
        log(INFO, "FedSM Algorithm 1 runs k=%d communication rounds, one element each; "
            "start(num_rounds=...) is not used", k)  # fmt: skip
    else:
        log(INFO, "FedSM %s ends when its protocol does (Algorithm 2: O(log m) rounds); "
            "start(num_rounds=...) is not used", params.mode)  # fmt: skip
    return params


def initial_set(arrays: ArrayRecord | None) -> list[int]:
    """Return S₀ from ``initial_arrays`` (None or empty: ∅).

    Raises
    ------
    InitialArraysError
        Unless the record is empty or holds ``"selected"``, a 1-D integer array.
    """
    if arrays is None or len(arrays) == 0:
        return []
    keys = list(arrays.keys())
    if keys != [SELECTED_KEY]:
        raise InitialArraysError(
            f"initial_arrays has keys {keys}; FedSM takes an empty ArrayRecord or "
            f"{{'{SELECTED_KEY}': int64 array}} (a starting set)"
        )
    sel = np.asarray(arrays[SELECTED_KEY].numpy())
    if sel.ndim != 1 or (sel.size and sel.dtype.kind not in "iu"):
        raise InitialArraysError(
            f"initial_arrays['{SELECTED_KEY}'] must be a 1-D integer array, got {sel.dtype} "
            f"{sel.shape}"
        )
    return [int(e) for e in sel]


class FedSMRounds:
    """FedSM's round, shared by :class:`FedSMStrategy` and the runners' ``FedSMCohorts``.

    A mixin for a :class:`~flower_app.strategies.base.RoundStrategy`: the round's messages
    from the plan of :class:`~flower_app.algorithms.fedsm.modes.FedSMRun` (each strategy
    says where they go and what they carry), the report checks both contracts share, the
    sum of the reports and the server step with the round's row, the final set and the
    bookkeeping of a secure sum.
    """

    k: int
    seed: int
    n_users: int | None
    federated_evaluation: bool
    run: FedSMRun | None
    summed_nodes: list[int]
    rounds_open_ended: bool
    _expected: set[int]
    #: ``progress_fn(run) -> float``: an experiment oracle recorded as ``objective``
    progress_fn: Callable[[FedSMRun], float] | None = None
    #: the declared range λ a report is held to (None: not checked)
    report_bound: float | None = None

    def _init_round_state(self) -> None:
        self._sent: dict[int, int] = {}  # node -> users its message stands for
        self._sent_users: dict[int, np.ndarray] = {}  # node -> the users it reports for
        self._plan: RoundPlan | None = None
        self._down: dict[str, int] = {}
        self._started = False
        self._refused = ReportTally()

    @property
    def server(self) -> Any:
        """The current inner server (Algorithm 1's :class:`FedSMServer` in mode alg1)."""
        return self._require_run().inner

    def _require_run(self) -> FedSMRun:
        if self.run is None:
            raise RuntimeError("the run is not set up yet: call start()")
        return self.run

    def finished(self) -> bool:
        """Return True once the protocol has ended (Algorithms 2 and 3 end by themselves)."""
        return self._require_run().done

    def _rounds_to_run(self, initial: list[int], num_rounds: int) -> int:
        """Return the rounds ``setup`` announces: k − \\|S₀\\| (Algorithm 1) or open-ended."""
        run = self._require_run()
        if run.params.mode == "alg1":
            rounds = self.k - len(initial)
            warn_fixed_length("FedSM Algorithm 1", num_rounds, rounds, "k − |S₀| elements")
            return rounds
        log(INFO, "FedSM %s: rounds end with the protocol (num_rounds not used)", run.params.mode)
        self.rounds_open_ended = True  # logged as [round t/?], without an ETA
        return MAX_ROUNDS

    def _plan_round(self) -> tuple[RoundPlan, dict[str, Any]]:
        """Plan the next round; return the plan and the config entries every message gets."""
        plan = self._plan = self._require_run().plan()
        entries: dict[str, Any] = {"d": plan.d, "seed": self.seed, "mode": plan.mode}
        if plan.mode == "alg2":
            entries["j-from"] = plan.j_from
        if plan.rng != "per-user":  # absent means per-user: default messages unchanged
            entries["rng"] = plan.rng
        if plan.surrogate != "none":
            entries.update(surrogate=plan.surrogate, eta=plan.eta, samples=plan.samples)
        if plan.dp_bits:  # shuffle-model DP: k bits, λ and every element's flip probability
            assert plan.dp_flip is not None
            entries.update(
                {"dp-bits": plan.dp_bits, "dp-lam": plan.dp_lam,
                 "dp-flip": [float(v) for v in plan.dp_flip]}
            )  # fmt: skip
        return plan, entries

    def _round_messages(
        self,
        plan: RoundPlan,
        targets: list[tuple[int, ArrayRecord, int, dict[str, Any]]],
        config: ConfigRecord,
        server_round: int,
    ) -> list[Message]:
        """Return one ``train`` message per ``(node, arrays, users, entries)``; count bytes."""
        messages = []
        self._sent = {}
        self._down = {"bytes": 0, "values": 0, "bytes-max": 0, "values-max": 0}
        for node_id, record, count, extra in targets:
            nbytes, nvalues = record.count_bytes(), plan.values_down(count)
            self._down["bytes"] += nbytes
            self._down["values"] += nvalues
            self._down["bytes-max"] = max(self._down["bytes-max"], nbytes)
            self._down["values-max"] = max(self._down["values-max"], nvalues)
            self._sent[node_id] = count
            merged = merged_config(config, plan.server_round, **extra)
            messages.append(
                Message(
                    RecordDict({"arrays": record, "config": merged}),
                    dst_node_id=node_id,
                    message_type=MessageType.TRAIN,
                    group_id=str(server_round),
                )
            )
        self._expected = set(self._sent)
        return messages

    def merge_senders(self, nodes: list[int]) -> int:
        """Register a secure sum as one sender that was sent the survivors' users."""
        self._sent[SUMMED_SENDER] = sum(int(self._sent.get(n, 0)) for n in nodes)
        return SUMMED_SENDER

    def forget_summed_sender(self) -> None:
        """Drop the summed sender's entry once the sum is decoded."""
        self._sent.pop(SUMMED_SENDER, None)

    def _decode_report(
        self, src: int, reply: Message, keys: list[str]
    ) -> tuple[np.ndarray, int, int, int, int]:
        """Check a report with arrays ``keys``; return (report, users, bytes, values, positive)."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("aggregate_train() without configure_train()")
        record = reply.content.array_records["arrays"]
        metrics = reply.content.metric_records["metrics"]
        if set(record.keys()) != set(keys):
            raise ValueError(f"report arrays {sorted(record.keys())}: expected {keys}")
        ndarrays = [record[key].numpy() for key in keys]
        report = decode_report(ndarrays, plan.report_size)
        n_ex = int_metric(metrics, "num-examples")
        if n_ex != self._sent[src]:
            raise ValueError(f"reports for {n_ex} users, {self._sent[src]} were sent")
        users = self._sent_users.get(src)
        one = int(users[0]) if users is not None and users.size == 1 else None
        reason = report_refusal(report, plan, n_ex, self.report_bound, self.seed, one)
        if reason is not None:
            self._refused.refuse(reason)
            raise ValueError(f"report refused ({reason}): more than {n_ex} honest users send")
        values = sum(int(a.size) for a in ndarrays)
        positive = int_metric(metrics, "positive-entries", 0)
        return report, n_ex, record.count_bytes(), values, positive

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sum the accepted reports and apply the server step of the current mode."""
        run, plan = self._require_run(), self._plan
        assert plan is not None
        total, users = np.zeros(plan.report_size), 0
        up = {"bytes": 0, "values": 0, "bytes-max": 0, "values-max": 0, "positive": 0}
        for _, (report, n_ex, nbytes, nvalues, positive) in checked.accepted:
            total += report
            users += n_ex
            up["bytes"] += nbytes
            up["values"] += nvalues
            up["bytes-max"] = max(up["bytes-max"], nbytes)
            up["values-max"] = max(up["values-max"], nvalues)
            up["positive"] += positive
        senders = [n for n, _ in checked.accepted]
        if SUMMED_SENDER in senders:  # a secure sum stands for its survivors
            senders = [n for n in senders if n != SUMMED_SENDER] + list(self.summed_nodes)
        empty = np.zeros(0, np.int64)
        arrived = np.concatenate([empty] + [self._sent_users.get(n, empty) for n in senders])
        row = run.update(total, users, arrived=arrived if plan.dp_bits else None)
        row.update(merge_tally(row, self._refused))
        self._refused = ReportTally()
        self._plan = None
        nodes = max(len(self._sent), 1)
        row.update(
            {
                "nodes": len(self._sent),
                "values-up": up["values"],
                "values-up-per-client": up["values"] / max(len(checked.accepted), 1),
                "values-up-max-client": up["values-max"],
                "bytes-up": up["bytes"],
                "bytes-up-max-client": up["bytes-max"],
                "positive-entries": up["positive"],
                "values-down": self._down["values"],
                "values-down-per-client": self._down["values"] / nodes,
                "bytes-down": self._down["bytes"],
                "bytes-down-max-client": self._down["bytes-max"],
                "bad-replies": checked.left_out,
            }
        )
        if self.progress_fn is not None:
            row["objective"] = float(self.progress_fn(run))
        metrics = MetricRecord({key: to_metric(v) for key, v in row.items()})
        return selected_record(run.selected), metrics

    def finalize(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return the final S (amplification: the rounded set) as ``{"selected": int64}``."""
        return selected_record(self._require_run().selected)

    def sent_users(self, node_id: int) -> int:
        """Return the users sampled on ``node_id`` this round (1 for a plain node)."""
        return int(self._sent.get(node_id, 1))

    def round_summary(self, row: dict[str, Any]) -> str:
        """Return the round's log line: ``+e -> |S|=s/k  F=...  users=..``, nodes and bytes."""
        objective = _fmt(row.get("objective"))
        if row.get("server-round", 0) == 0:
            return f"F={objective}"
        return (
            f"+{row.get('elements-added', 0)} -> |S|={row.get('set-size', 0)}/{self.k}  "
            f"F={objective}  users={row.get('users', 0)} nodes={row.get('nodes', 0)}  "
            f"up={row.get('bytes-up', 0)} B down={row.get('bytes-down', 0)} B"
        )

    def _evaluate_content(
        self, arrays: ArrayRecord, config: ConfigRecord, server_round: int
    ) -> RecordDict | None:
        """Return the ``evaluate`` content with S, or None when no evaluation is due.

        During a run only after the last round, and only with ``federated_evaluation``.
        """
        if self._started and not (self.federated_evaluation and self.finished()):
            return None
        selected = arrays if SELECTED_KEY in arrays else _positional_selected(arrays)
        return RecordDict({"arrays": selected, "config": merged_config(config, server_round)})

    def _objective(
        self, server_round: int, replies: Iterable[Message], key: str
    ) -> MetricRecord | None:
        """Return F(S) = Σ ``key`` / n over the replies, or None if a node failed (logged)."""

        def decode(src: int, reply: Message) -> tuple[float, int]:
            metrics = reply.content.metric_records["metrics"]
            return float(metrics[key]), int(metrics["num-examples"])

        checked = check_replies(replies, decode, self._expected, f"evaluate {server_round}")
        if checked.left_out:
            log(WARNING, "evaluate %d: %d nodes failed; no F(S)", server_round, checked.left_out)
            return None
        total = sum(v for _, (v, _) in checked.accepted)
        users = sum(c for _, (_, c) in checked.accepted)
        if users != self.n_users:
            return None
        return MetricRecord({"objective": total / max(users, 1)})


class FedSMStrategy(FedSMRounds, RoundStrategy):
    r"""Federated submodular maximisation: pick S, \|S\| ≤ k, maximising F = (1/n) Σ_i f_i.

    Algorithm 1 (``mode="alg1"``, default): each communication round t the server samples K
    users uniformly without replacement (its own ``numpy.random.Generator`` seeded by
    ``seed``) and sends them S; each sampled user draws d distinct elements of E ∖ S from its
    own stream ``default_rng([seed, t, user])`` and reports f_i(e | S) for them; the server
    scales the sum by \|E ∖ S\| / (dK) (Eq. 3) and adds the feasible element with the largest
    estimate. **Algorithm 1 runs k rounds, one element each: ``start(num_rounds=...)`` is
    not used** (logged when it differs). Algorithm 2 (``mode="alg2"``) adds blocks of
    elements in O(log m) rounds; amplification (``mode="amplified"``) runs 1/η steps of
    Algorithm 1 or 2 on a surrogate and rounds; both end when the protocol says so.

    One node is one client (user) i with its own utility f_i, e.g. a ClientApp whose
    ``@app.train()`` returns :func:`flower_app.clients.fedsm_reply`. Before round 1 the
    strategy waits for ``min_available_nodes`` nodes; the n nodes connected then are the
    users (user id = position of the node in the order of its ``partition-id``, if its
    node_config has one, then of its node id), and one ``train`` exchange with
    ``stage="setup"`` learns m (every node's ``num-elements`` must agree), λ and, with
    ``capacities``, the elements' groups. Each round samples K of the n users. (This app's
    simulations, where a node serves many users, run
    :class:`~flower_app.strategies.cohort.fedsm.FedSMCohorts`: the same rounds, the same
    numbers.)

    Parameters
    ----------
    k : int, optional
        Largest \|S\| (default 10); Algorithm 1 runs k − \|S₀\| rounds.
    clients_per_round : int or float, optional
        K: users per round, a count or a fraction of n (default 0.1; at least 1). It plays
        the role of FedAvg's ``fraction_train``.
    elements_per_client : int or float, optional
        d: elements each sampled user reports, a count or a fraction of m (default 0.1;
        capped at \|E ∖ S\|); Algorithm 2: pairs per user (int cap, or fraction of \|X\|·r').
    mode : str, optional
        ``"alg1"`` (default), ``"alg2"`` or ``"amplified"``.
    capacities : int or mapping, optional
        None (default): the uniform matroid \|S\| ≤ k. Otherwise a partition matroid: at most
        ``capacities[g]`` elements of group g (an int: the same for every group; a group
        missing from the mapping has capacity 0). Element e's group is ``groups[e]``.
    groups : sequence of int, optional
        Group of every element (default: from the setup replies, which must all carry the
        same ``element-groups``: ``fedsm_reply(..., groups=...)``).
    seed : int, optional
        Seed of all randomness: the server's generator, the users' streams (default 0).
    min_available_nodes : int, optional
        Nodes to wait for before the setup exchange (default 2); the nodes connected then
        are the n users.
    federated_evaluation : bool, optional
        After the last round, ask every node for f_i(S) (an ``evaluate`` message; the ClientApp
        needs ``@app.evaluate()``, e.g. :func:`~flower_app.clients.fedsm_evaluate`); F(S) goes to
        ``Result.evaluate_metrics_clientapp`` and the last row's ``objective`` (default False).
        The nodes are asked once before round 1 too, for f_i(∅), so that a ClientApp
        without the handler fails then, not after the run.
    params : FedSMParams, optional
        All parameters of the mode (ε, τ, levels, η, surrogate, ...); when given it
        replaces ``mode``, ``clients_per_round`` and ``elements_per_client``. Its ``rng``
        (``"per-user"`` default, or ``"batched"``: all users' draws at once, support-
        proportional, same law; :mod:`flower_app.algorithms.fedsm.sampling`) is sent to the
        nodes with every round. Its ``history_clamp`` (Algorithm 1; default
        ``"noise-aware"``) holds each round's estimates to the mean of their earlier ones
        plus 3 standard errors (``"mean"``: to the mean; ``"off"``: the paper's estimate
        as it is; :mod:`flower_app.algorithms.robust.history`), a deviation from the paper
        against dishonest users; the rows then count ``estimates-clamped``.
    secure_aggregation : SecureAggregation, optional
        Sum each round's reports with secure aggregation (:mod:`flower_app.privacy`; the
        nodes' ClientApps need ``secure_aggregation_mod``). Nodes then report densely; the
        server learns only Σ of the reports, of ``num-examples``, ``user-values`` and
        ``positive-entries`` (``num-elements`` travels in the clear). Marginal gains that
        are integers (e.g. ratings) are summed exactly, so S is the run's in the clear. The
        setup exchange (m, λ_i, f_i(S₀)) and the federated evaluation are not covered.
        Default None.
    report_bound : float, optional
        The largest value one user may report on one element, your utilities' declared
        range (e.g. the top rating; 1 for coverage). Default: the largest λ_i the nodes
        announced at setup (a dishonest node may announce more: pass the range you know).
        Algorithm 1's reports are held to it: a user's report above it, or off its own
        draw (recomputed from the seed), is refused and counted (``refused-range``,
        ``refused-draw``, ``reports-refused``); a secure sum above it per user is clipped
        (``values-clipped``). See docs/strategies/fedsm.md, "Dishonest users and nodes".

    Notes
    -----
    Message contract (the user's ``train_config`` / ``evaluate_config`` entries are merged
    into every ``"config"``, the strategy's entries win on a clash):

    ============  ===================================================================
    message       records (name: key dtype (shape))
    ============  ===================================================================
    ``train``     ``"arrays"``: ``selected`` int64 (\|S₀\|,). ``"config"``:
    (setup)       ``stage="setup"``, ``server-round=0``, ``seed`` int.
    reply         ``"metrics"``: ``num-examples`` = 1, ``num-elements`` int m,
                  ``max-singleton`` float λ_i, ``objective`` float f_i(S₀),
                  ``partition-id`` int (optional: orders the users);
                  ``"arrays"``: empty, or ``element-groups`` int64 (m,).
    ``train``     ``"arrays"``: ``selected`` int64 (\|S\|,) (T inside an amplification
    (round t)     step); Alg. 2 adds ``pool`` int32 X (\|X\|,), ``sequence`` int64
                  a_1..a_r' (r',); amplification adds ``x-ids`` int32, ``x-values``
                  float64 (non-zeros of x). ``"config"``: ``stage="round"``,
                  ``server-round`` t, ``user-id``, ``d``, ``seed`` int, ``mode`` str
                  ``alg1``/``alg2``; Alg. 2 adds ``j-from`` int; amplification adds
                  ``surrogate`` str, ``eta`` float, ``samples`` int;
                  ``FedSMParams(rng="batched")`` adds ``rng`` str.
    reply         ``"arrays"``: ``ids`` int32 + ``values`` float64 (sparse) or
                  ``values`` float64 (L,) (dense), L = m (Alg. 1) or \|X\|·r' (Alg. 2:
                  pair (e, j) at pos_X(e)·r' + j − j-from). ``"metrics"``:
                  ``num-examples`` = 1, ``num-elements`` = m, ``user-values``,
                  ``positive-entries`` int.
    ``evaluate``  ``"arrays"``: ``selected``; ``"config"``: ``server-round``.
    reply         ``"metrics"``: ``objective`` float f_i(S), ``num-examples`` = 1.
    ============  ===================================================================

    ``initial_arrays``: None, an empty ArrayRecord (S₀ = ∅, the paper's), or
    ``{"selected": int64 (s,)}``, a starting set (Algorithms 1 and 2). ``Result.arrays``
    and the ``evaluate_fn(server_round, arrays)`` argument (rounds 0..T) hold S the same way.
    A reply with an error, a malformed report, a wrong ``num-elements`` or a count that
    does not match the users it was sent is logged, counted in ``bad-replies`` and left
    out; the estimate is then scaled by the users whose reports arrived; a round in which
    all are left out fails the run.
    """

    supports_secure_aggregation = True
    secure_public_metrics = ("num-elements",)

    def __init__(
        self,
        k: int = 10,
        clients_per_round: int | float = 0.1,
        elements_per_client: int | float = 0.1,
        mode: str = "alg1",
        capacities: int | Mapping[int, int] | None = None,
        groups: Sequence[int] | None = None,
        seed: int = 0,
        min_available_nodes: int = 2,
        federated_evaluation: bool = False,
        *,
        params: FedSMParams | None = None,
        secure_aggregation: SecureAggregation | None = None,
        report_bound: float | None = None,
    ) -> None:
        super().__init__(secure_aggregation=secure_aggregation)
        if report_bound is not None and not (np.isfinite(report_bound) and report_bound > 0):
            raise ValueError(f"report_bound={report_bound!r} must be positive")
        self._declared_bound = report_bound
        if params is None:
            if mode not in MODES:
                raise ValueError(f"mode={mode!r}: choose one of {', '.join(MODES)}")
            params = FedSMParams(mode, clients_per_round, elements_per_client)
        self.params = checked_params(params, k, seed, secure_aggregation)
        self.k, self.seed = k, seed
        self.capacities, self.groups = capacities, None if groups is None else list(groups)
        self.min_available_nodes = int(min_available_nodes)
        self.federated_evaluation = bool(federated_evaluation)
        self.lam = 0.0
        self.nodes: list[int] = []  # the node of user u is nodes[u]
        self.n_users: int | None = None
        self.n_elements: int | None = None
        self.matroid: Matroid | None = None
        self.run: FedSMRun | None = None
        self._init_round_state()

    # ------------------------------------------------------------------ setup
    def summary(self) -> None:
        """Log the strategy's settings."""
        p = self.params
        log(
            INFO,
            "FedSMStrategy(%s): n=%s users, m=%s elements, k=%d, K=%s users/round, "
            "d=%s per user, matroid=%s, seed=%d%s",
            p.mode,
            self.n_users if self.n_users is not None else "from the grid",
            self.n_elements if self.n_elements is not None else "from the replies",
            self.k,
            p.clients_per_round,
            p.elements_per_client,
            self.matroid if self.matroid is not None else self._matroid_text(),
            self.seed,
            "" if p.mode == "alg1" else f", {p}",
        )

    def _matroid_text(self) -> str:
        if self.capacities is None:
            return f"uniform(k={self.k})"
        return f"partition(capacities={self.capacities})"

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Learn n, m and λ from the setup exchange; return the rounds to run."""
        initial = initial_set(arrays)
        self._started = True
        nodes = sample_nodes(
            grid,
            random.Random(self.seed),
            1.0,
            self.min_available_nodes,
            self.min_available_nodes,
            timeout=self.exchange_timeout,
        )
        sel = np.asarray(initial, dtype=np.int64)
        messages = []
        for node in nodes:
            config = {"stage": "setup", "seed": self.seed}
            content = RecordDict(
                {
                    "arrays": selected_record(sel),
                    "config": self.merged_config(None, 0, **config),
                }
            )
            messages.append(
                Message(content, dst_node_id=node, message_type=MessageType.TRAIN, group_id="0")
            )
        replies = self.send(grid, messages)
        checked = self.check(replies, _decode_setup, "setup")
        m = majority_m(checked, lambda value: value[0])
        drop_replies(
            checked,
            lambda _, value: None if value[0] == m else f"num-elements={value[0]}, most have {m}",
            "setup",
        )
        order = {
            node: (0, pid, node) if pid is not None else (1, 0, node)
            for node, (_, _, _, pid) in checked.accepted
        }
        # user u = the u-th node by partition-id (when the nodes have one), then by node id
        self.nodes = sorted(order, key=order.__getitem__)
        self.n_users, self.n_elements = len(self.nodes), m
        self.lam = max(lam_i for _, (_, lam_i, _, _) in checked.accepted)
        reported = [g for _, (_, _, g, _) in checked.accepted if g is not None]
        self.matroid = self._build_matroid(m, reported)
        bound = self._declared_bound or (self.lam if self.lam > 0 else None)
        self.report_bound = bound
        self.run = FedSMRun(
            self.n_users, self.matroid, self.k, self.params, self.lam, seed=self.seed,
            initial=initial, report_bound=bound,
        )  # fmt: skip
        log(
            INFO,
            "setup: n=%d users (nodes), m=%d elements, λ=%.6g, matroid=%s",
            self.n_users,
            m,
            self.lam,
            self.matroid,
        )
        return self._rounds_to_run(initial, num_rounds)

    def _build_matroid(self, m: int, reported: list[np.ndarray]) -> Matroid:
        if self.capacities is None:
            return build_matroid(m, self.k)
        if self.groups is not None:
            groups = np.asarray(self.groups, dtype=np.int64)
        elif reported:
            groups = reported[0]
            if any(g.shape != groups.shape or not np.array_equal(g, groups) for g in reported):
                raise ValueError("setup: the nodes report different element-groups")
        else:
            raise ValueError(
                "capacities need the elements' groups: pass groups= to FedSMStrategy or "
                "groups= to fedsm_reply on the nodes"
            )
        return build_matroid(m, self.k, groups, self.capacities)

    # ------------------------------------------------------------------ rounds
    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Plan the round and send S to the node of every sampled user."""
        plan, entries = self._plan_round()
        record = plan_record(plan)
        self._sent_users = {self.nodes[int(u)]: np.array([u], np.int64) for u in plan.users}
        targets = [
            (self.nodes[int(u)], record, 1, {"stage": "round", "user-id": int(u), **entries})
            for u in plan.users
        ]
        return self._round_messages(plan, targets, config, server_round)

    def decode_train_reply(self, src: int, reply: Message) -> tuple[np.ndarray, int, int, int, int]:
        """Check one report; return (dense report, users, bytes, values, positive entries)."""
        record = reply.content.array_records["arrays"]
        metrics = reply.content.metric_records["metrics"]
        if int_metric(metrics, "num-elements") != self.n_elements:
            raise ValueError(
                f"num-elements={metrics['num-elements']}, the run has m={self.n_elements}"
            )
        keys = ["ids", "values"] if "ids" in record else ["values"]
        return self._decode_report(src, reply, keys)

    # ------------------------------------------------------------------ evaluation
    def probe_messages(
        self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """With federated evaluation: f_i(∅) from every node before round 1.

        The ``evaluate`` message is otherwise first sent after the last round: a ClientApp
        without ``@app.evaluate()`` now fails before round 1, not at the end.
        """
        if not self.federated_evaluation or not self.nodes:
            return []
        content = RecordDict(
            {"arrays": selected_record([]), "config": self.merged_config(config, 0)}
        )
        return messages_to(self.nodes, content, MessageType.EVALUATE)

    def evaluate_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask every node for its f_i(S) (after the last round, with federated evaluation)."""
        content = self._evaluate_content(arrays, config, server_round)
        if content is None:
            return []
        self._expected = set(self.nodes)
        return messages_to(self.nodes, content, MessageType.EVALUATE)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return F(S) = Σ f_i(S) / n, or None if a node failed (logged)."""
        return self._objective(server_round, replies, "objective")


def _decode_setup(src: int, reply: Message) -> tuple[int, float, np.ndarray | None, int | None]:
    metrics = reply.content.metric_records["metrics"]
    m = metrics["num-elements"]
    if isinstance(m, float) or int_metric(metrics, "num-elements") < 1:
        raise ValueError(f"num-elements={m!r}: expected a positive int")
    if int_metric(metrics, "num-examples") != 1:
        raise ValueError("a plain-mode node is one user: num-examples must be 1")
    lam = float(metrics.get("max-singleton", 0.0))
    if not np.isfinite(lam) or lam < 0:
        raise ValueError(f"max-singleton={lam}: expected a finite value >= 0")
    groups = None
    arrays = reply.content.array_records.get("arrays")
    if arrays is not None and "element-groups" in arrays:
        groups = np.asarray(arrays["element-groups"].numpy(), dtype=np.int64)
        if groups.shape != (int(m),) or (groups < 0).any():
            raise ValueError("element-groups must hold one group id >= 0 per element")
    pid = None if "partition-id" not in metrics else int_metric(metrics, "partition-id")
    return int(m), lam, groups, pid


def _positional_selected(arrays: ArrayRecord) -> ArrayRecord:
    """Accept S given as the first positional array (the legacy cohort contract)."""
    if len(arrays) == 0:
        return selected_record([])
    first = next(iter(arrays.keys()))
    return ArrayRecord({SELECTED_KEY: arrays[first]})


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.6g}"
