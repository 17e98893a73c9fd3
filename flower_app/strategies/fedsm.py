"""FedSMStrategy: federated submodular maximisation by sampled marginal gains.

Rafiey, Namani & Charalambides (2025), "Federated Submodular Maximization: Improved
Communication Rounds and Bit Complexity": Algorithm 1 (k rounds), Algorithm 2 (O(log m)
rounds) and Algorithm 3 (amplification). The math lives in :mod:`flower_app.algorithms`
(:mod:`~flower_app.algorithms.fedsm.modes` ties the modes together,
:mod:`~flower_app.algorithms.fedsm.user` is one user with any utility); this module moves it
over Flower's Message API, on the loop of :class:`~flower_app.strategies.base.RoundStrategy`.
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

from flower_app.algorithms.fedsm.core import decode_report
from flower_app.algorithms.fedsm.modes import MODES, FedSMParams, FedSMRun, RoundPlan
from flower_app.privacy.secagg_server import SecureAggregation
from flower_app.strategies.base import SUMMED_SENDER, RoundCallback, RoundStrategy
from flower_app.strategies.discovery import CohortMap, discover_cohorts
from flower_app.strategies.errors import InitialArraysError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.records import to_metric
from flower_app.strategies.replies import CheckedReplies, check_replies, int_metric
from flower_app.strategies.round_rows import warn_fixed_length
from flower_app.strategies.sampling import sample_nodes
from flower_app.strategies.submodular_records import build_matroid, drop_replies, majority_m
from flower_app.submodular.matroids import Matroid

__all__ = [
    "SELECTED_KEY",
    "FedSMStrategy",
    "decode_report",
    "plan_arrays",
    "plan_record",
    "selected_record",
]

#: the key of the selected set in ``initial_arrays``, ``Result.arrays`` and ``evaluate_fn``
SELECTED_KEY = "selected"
#: Algorithms 2 and 3 end when the protocol says so; at most this many rounds
MAX_ROUNDS = 100_000


def plan_arrays(plan: RoundPlan, node_users: np.ndarray) -> list[np.ndarray]:
    """Return the arrays of a cohort-mode ``train`` message: S, users, [X, a], [x ids, x values].

    Parameters
    ----------
    plan : RoundPlan
        The round.
    node_users : numpy.ndarray
        The node's sampled users.

    Returns
    -------
    list of numpy.ndarray
        ``[S int64, users int64]``, then ``[X int32, a int64]`` for Algorithm 2, then
        ``[ids int32, values float64]`` of the non-zero coordinates of x for amplification.
    """
    arrays = [np.asarray(plan.selected, dtype=np.int64), node_users.astype(np.int64)]
    if plan.mode == "alg2":
        arrays += [plan.pool.astype(np.int32), plan.sequence.astype(np.int64)]
    if plan.surrogate != "none" and plan.point is not None:
        nz = np.flatnonzero(plan.point)
        arrays += [nz.astype(np.int32), plan.point[nz].astype(np.float64)]
    return arrays


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


class FedSMStrategy(RoundStrategy):
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

    Two client modes:

    * **plain** (default): one node is one client (user) i with its own utility f_i, e.g.
      a ClientApp whose ``@app.train()`` returns
      :func:`flower_app.clients.fedsm_reply`. Before round 1 the strategy waits for
      ``min_available_nodes`` nodes; the n nodes connected then are the users (user id =
      position of the node in the order of its ``partition-id``, if its node_config has
      one, then of its node id), and one ``train`` exchange with
      ``stage="setup"`` learns m (every node's ``num-elements`` must agree), λ and, with
      ``capacities``, the elements' groups. Each round samples K of the n users.
    * **cohort** (``cohorts=True``): a node serves many users (this package's simulation,
      ``num-partitions``); ``n_users`` and ``matroid`` are given, a ``query.cohort``
      discovery maps users to nodes, and each node reports the sum over its sampled users.
      The runners use it; the numbers are the same as the direct engine's.

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
        Group of every element (plain mode; default: from the setup replies, which must all
        carry the same ``element-groups``: ``fedsm_reply(..., groups=...)``).
    seed : int, optional
        Seed of all randomness: the server's generator, the users' streams (default 0).
    min_available_nodes : int, optional
        Plain mode: nodes to wait for before the setup exchange (default 2); the nodes
        connected then are the n users.
    federated_evaluation : bool, optional
        After the last round, ask every node for f_i(S) (an ``evaluate`` message; the ClientApp
        needs ``@app.evaluate()``, e.g. :func:`~flower_app.clients.fedsm_evaluate`); F(S) goes to
        ``Result.evaluate_metrics_clientapp`` and the last row's ``objective`` (default False).
        The nodes are asked once before round 1 too, for f_i(∅), so that a ClientApp
        without the handler fails then, not after the run.
    cohorts : bool, optional
        Cohort mode (default False: plain mode).
    n_users : int, optional
        Cohort mode: users n over all nodes (required there).
    matroid : Matroid, optional
        Cohort mode: the constraint, built by the caller (required there; ``capacities``
        and ``groups`` are for plain mode).
    params : FedSMParams, optional
        All parameters of the mode (ε, τ, levels, η, surrogate, ...); when given it
        replaces ``mode``, ``clients_per_round`` and ``elements_per_client``. Its ``rng``
        (``"per-user"`` default, or ``"batched"``: all users' draws at once, support-
        proportional, same law; :mod:`flower_app.algorithms.fedsm.sampling`) is sent to the
        nodes with every round.
    lam : float, optional
        λ = max_{e,i} f_i({e}) for Algorithm 2's default threshold (cohort mode; plain mode
        takes the largest ``max-singleton`` of the setup replies). Default 0.
    progress_fn : callable, optional
        ``progress_fn(run) -> float``: an experiment oracle's F of the run's state, recorded
        as each round's ``objective`` (never used to decide).
    discovery_timeout : float, optional
        Cohort mode: seconds to wait until the cohorts cover all users (default 300).
    on_round : callable, optional
        Receives each round's row (e.g. to append it to ``metrics.jsonl``).
    min_reply_fraction : float, optional
        Least fraction of a round's clients whose replies must arrive and be accepted, else
        the run stops with ``TooFewRepliesError`` (default 0.0: aggregate what came; the
        failed nodes are recorded per round).
    secure_aggregation : SecureAggregation, optional
        Sum each round's reports with secure aggregation (:mod:`flower_app.privacy`; the
        nodes' ClientApps need ``secure_aggregation_mod``, this package's has it). Nodes
        then report densely; the server learns only Σ of the reports, of ``num-examples``,
        ``user-values`` and ``positive-entries`` (``num-elements`` travels in the clear).
        Marginal gains that are integers (e.g. ratings) are summed exactly, so S is the
        plain run's. Plain mode's setup exchange (m, λ_i, f_i(S₀)) and the federated
        evaluation are not covered. Default None.

    Notes
    -----
    Message contract (one table, both modes; the user's ``train_config`` /
    ``evaluate_config`` entries are merged into every ``"config"``, the strategy's entries
    win on a clash):

    ============  ==========  ===============================================================
    message       mode        records (name: key dtype (shape))
    ============  ==========  ===============================================================
    ``train``     plain       ``"arrays"``: ``selected`` int64 (\|S₀\|,). ``"config"``:
    (setup)                   ``stage="setup"``, ``server-round=0``, ``seed`` int.
    reply         plain       ``"metrics"``: ``num-examples`` = 1, ``num-elements`` int m,
                              ``max-singleton`` float λ_i, ``objective`` float f_i(S₀),
                              ``partition-id`` int (optional: orders the users);
                              ``"arrays"``: empty, or ``element-groups`` int64 (m,).
    ``train``     plain       ``"arrays"``: ``selected`` int64 (\|S\|,) (T inside an
    (round t)                 amplification step); Alg. 2 adds ``pool`` int32 X (\|X\|,),
                              ``sequence`` int64 a_1..a_r' (r',); amplification adds
                              ``x-ids`` int32, ``x-values`` float64 (non-zeros of x).
                              ``"config"``: ``stage="round"``, ``server-round`` t,
                              ``user-id``, ``d``, ``seed`` int, ``mode`` str ``alg1``/
                              ``alg2``; Alg. 2 adds ``j-from`` int; amplification adds
                              ``surrogate`` str, ``eta`` float, ``samples`` int;
                              ``FedSMParams(rng="batched")`` adds ``rng`` str.
    reply         plain       ``"arrays"``: ``ids`` int32 + ``values`` float64 (sparse) or
                              ``values`` float64 (L,) (dense), L = m (Alg. 1) or \|X\|·r'
                              (Alg. 2: pair (e, j) at pos_X(e)·r' + j − j-from).
                              ``"metrics"``: ``num-examples`` = 1, ``num-elements`` = m,
                              ``user-values``, ``positive-entries`` int.
    ``evaluate``  plain       ``"arrays"``: ``selected``; ``"config"``: ``server-round``.
    reply         plain       ``"metrics"``: ``objective`` float f_i(S), ``num-examples`` = 1.
    ``query.``    cohort      ``"config"``: ``kind="cohort"``; reply ``"properties"``:
    ``cohort``                ``partition-id``, ``num-partitions``, ``first-user``,
                              ``num-users``, ``n-users-total``, ``n-elements`` int.
    ``train``     cohort      ``"arrays"`` by position: ``"0"`` int64 S, ``"1"`` int64 the
                              node's sampled user ids; Alg. 2 ``"2"`` int32 X, ``"3"`` int64
                              a; amplification then int32 ids, float64 values of x.
                              ``"config"``: as plain mode's round, without ``stage`` and
                              ``user-id``.
    reply         cohort      ``"arrays"``: ``"0"`` int32 ids, ``"1"`` float64 values
                              (sparse) or ``"0"`` float64 (L,) (dense), summed over the
                              node's users; ``"metrics"``: ``num-examples`` = users sent,
                              ``user-values``, ``positive-entries``.
    ``evaluate``  cohort      ``"arrays"``: ``selected``; reply ``"metrics"``:
                              ``objective-sum`` Σ_i f_i(S), ``num-examples``, ``loss``.
    ============  ==========  ===============================================================

    ``initial_arrays``: None, an empty ArrayRecord (S₀ = ∅, the paper's), or
    ``{"selected": int64 (s,)}``, a starting set (Algorithms 1 and 2). ``Result.arrays``
    and the ``evaluate_fn(server_round, arrays)`` argument (rounds 0..T) hold S the same way.
    A reply with an error, a malformed report, a wrong ``num-elements`` or a count that
    does not match the users it was sent is logged, counted in ``bad-replies`` and left
    out; the estimate is then scaled by the users whose reports arrived; a round in which
    all are left out fails the run.

    Resumable: with ``checkpoint_fn`` set, the run's state goes out after every round, and
    ``resume_from(payload)`` before ``start`` continues after that round with the same
    result as an uninterrupted run (the random generator is part of the state).
    """

    resumable = True
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
        cohorts: bool = False,
        n_users: int | None = None,
        matroid: Matroid | None = None,
        params: FedSMParams | None = None,
        lam: float = 0.0,
        progress_fn: Callable[[FedSMRun], float] | None = None,
        discovery_timeout: float = 300.0,
        on_round: RoundCallback | None = None,
        min_reply_fraction: float = 0.0,
        secure_aggregation: SecureAggregation | None = None,
    ) -> None:
        super().__init__(
            on_round=on_round,
            min_reply_fraction=min_reply_fraction,
            secure_aggregation=secure_aggregation,
        )
        if params is None:
            if mode not in MODES:
                raise ValueError(f"mode={mode!r}: choose one of {', '.join(MODES)}")
            params = FedSMParams(mode, clients_per_round, elements_per_client)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} must be a positive int")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a non-negative int")
        if params.dp_epsilon:  # ε against the server: shuffle bound only if it sees totals
            params = dataclasses.replace(params, dp_secure=secure_aggregation is not None)
        self.params, self.k, self.seed = params, k, seed
        self.capacities, self.groups = capacities, None if groups is None else list(groups)
        self.min_available_nodes = int(min_available_nodes)
        self.federated_evaluation = bool(federated_evaluation)
        self.cohort_mode = bool(cohorts)
        self.lam = float(lam)
        self.progress_fn = progress_fn
        self.discovery_timeout = float(discovery_timeout)
        self.cohorts: CohortMap | None = None
        self.nodes: list[int] = []  # plain mode: node of user u is nodes[u]
        self.n_elements: int | None = None
        self.run: FedSMRun | None = None
        self.n_users = n_users
        self.matroid = matroid
        if self.cohort_mode:
            if n_users is None or matroid is None:
                raise ValueError("cohort mode needs n_users and matroid")
            self.n_elements = matroid.n_elements
            self.run = FedSMRun(n_users, matroid, k, params, lam, seed=seed)
        elif n_users is not None or matroid is not None:
            raise ValueError(
                "n_users and matroid are for cohort mode (cohorts=True); plain mode learns n "
                "from the grid and m from the nodes' replies (use capacities= for a partition "
                "matroid)"
            )
        self._sent: dict[int, int] = {}
        self._sent_users: dict[int, np.ndarray] = {}  # node -> the users it reports for
        self._plan: RoundPlan | None = None
        self._down: dict[str, int] = {}
        self._started = False
        if params.mode == "alg1":
            log(
                INFO,
                "FedSM Algorithm 1 runs k=%d communication rounds, one element each; "
                "start(num_rounds=...) is not used",
                k,
            )
        else:
            log(
                INFO,
                "FedSM %s ends when its protocol does (Algorithm 2: O(log m) rounds); "
                "start(num_rounds=...) is not used",
                params.mode,
            )

    @property
    def server(self) -> Any:
        """The current inner server (Algorithm 1's :class:`FedSMServer` in mode alg1)."""
        return self._require_run().inner

    def _require_run(self) -> FedSMRun:
        if self.run is None:
            raise RuntimeError("the run is not set up yet: call start()")
        return self.run

    # ------------------------------------------------------------------ setup
    def summary(self) -> None:
        """Log the strategy's settings."""
        p = self.params
        log(
            INFO,
            "FedSMStrategy(%s, %s mode): n=%s users, m=%s elements, k=%d, K=%s users/round, "
            "d=%s per user, matroid=%s, seed=%d%s",
            p.mode,
            "cohort" if self.cohort_mode else "plain",
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

    def _new_run(self, initial: list[int]) -> None:
        """Start the server state (n, m and λ known) from the starting set S₀ = ``initial``."""
        assert self.n_users is not None and self.matroid is not None
        self.run = FedSMRun(
            self.n_users, self.matroid, self.k, self.params, self.lam, seed=self.seed,
            initial=initial,
        )  # fmt: skip

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Discover cohorts (cohort mode) or learn n, m, λ (plain mode); return the rounds."""
        initial = _initial_set(arrays)
        self._started = True
        if self.cohort_mode:
            assert self.n_users is not None and self.matroid is not None
            if initial:
                self._new_run(initial)
            self.cohorts = discover_cohorts(
                grid, self.n_users, self.matroid.n_elements, timeout=self.discovery_timeout
            )
        else:
            self._setup_plain(grid, initial)
        run = self._require_run()
        if self.params.mode == "alg1":
            rounds = self.k - len(initial)
            warn_fixed_length("FedSM Algorithm 1", num_rounds, rounds, "k − |S₀| elements")
            return rounds
        log(INFO, "FedSM %s: rounds end with the protocol (num_rounds not used)", run.params.mode)
        self.rounds_open_ended = True  # logged as [round t/?], without an ETA
        return MAX_ROUNDS

    def _setup_plain(self, grid: Grid, initial: list[int]) -> None:
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
        self._new_run(initial)
        log(
            INFO,
            "setup: n=%d users (nodes), m=%d elements, λ=%.6g, matroid=%s",
            self.n_users,
            m,
            self.lam,
            self.matroid,
        )

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

    def finished(self) -> bool:
        """Return True once the protocol has ended (Algorithms 2 and 3 end by themselves)."""
        return self._require_run().done

    # ------------------------------------------------------------------ rounds
    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Plan the round and build one ``train`` message per node with a sampled user."""
        run = self._require_run()
        if self.cohort_mode and self.cohorts is None:
            raise RuntimeError("discovery has not run: call start()")
        plan = self._plan = run.plan()
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
        messages, self._sent, self._sent_users = [], {}, {}
        self._down = {"bytes": 0, "values": 0, "bytes-max": 0, "values-max": 0}
        if self.cohort_mode:
            assert self.cohorts is not None
            groups = self.group_users(plan.users)
            self._sent_users = {int(n): np.asarray(u, np.int64) for n, u in groups.items()}
            targets = [
                (node, ArrayRecord(plan_arrays(plan, users)), int(users.size), entries)
                for node, users in groups.items()
            ]
        else:
            record = plan_record(plan)
            self._sent_users = {self.nodes[int(u)]: np.array([u], np.int64) for u in plan.users}
            targets = [
                (self.nodes[int(u)], record, 1, {"stage": "round", "user-id": int(u), **entries})
                for u in plan.users
            ]
        for node_id, record, count, extra in targets:
            nbytes, nvalues = record.count_bytes(), plan.values_down(count)
            self._down["bytes"] += nbytes
            self._down["values"] += nvalues
            self._down["bytes-max"] = max(self._down["bytes-max"], nbytes)
            self._down["values-max"] = max(self._down["values-max"], nvalues)
            self._sent[node_id] = count
            merged = self.merged_config(config, plan.server_round, **extra)
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

    def decode_train_reply(self, src: int, reply: Message) -> tuple[np.ndarray, int, int, int, int]:
        """Check one report; return (dense report, users, bytes, values, positive entries)."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("aggregate_train() without configure_train()")
        record = reply.content.array_records["arrays"]
        metrics = reply.content.metric_records["metrics"]
        if self.cohort_mode:
            keys = ["0", "1"] if "1" in record else ["0"]
        else:
            if int_metric(metrics, "num-elements") != self.n_elements:
                raise ValueError(
                    f"num-elements={metrics['num-elements']}, the run has m={self.n_elements}"
                )
            keys = ["ids", "values"] if "ids" in record else ["values"]
        if set(record.keys()) != set(keys):
            raise ValueError(f"report arrays {sorted(record.keys())}: expected {keys}")
        ndarrays = [record[key].numpy() for key in keys]
        report = decode_report(ndarrays, plan.report_size)
        n_ex = int_metric(metrics, "num-examples")
        if n_ex != self._sent[src]:
            raise ValueError(f"reports for {n_ex} users, {self._sent[src]} were sent")
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

    def checkpoint_state(self) -> FedSMRun:
        """Return the run (S so far, the mode's server state, its random generator)."""
        return self._require_run()

    def restore_state(self, state: FedSMRun) -> None:
        """Continue from a checkpointed run (after ``setup``'s discovery)."""
        if not isinstance(state, FedSMRun):
            raise TypeError(f"a FedSM checkpoint holds a FedSMRun, not {type(state).__name__}")
        self.run = state

    def sent_users(self, node_id: int) -> int:
        """Return the users sampled on ``node_id`` this round (1 in plain mode)."""
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

    # ------------------------------------------------------------------ evaluation
    def probe_messages(
        self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """Plain mode with federated evaluation: f_i(∅) from every node before round 1.

        The ``evaluate`` message is otherwise first sent after the last round: a ClientApp
        without ``@app.evaluate()`` now fails before round 1, not at the end.
        """
        if self.cohort_mode or not self.federated_evaluation or not self.nodes:
            return []
        content = RecordDict(
            {"arrays": selected_record([]), "config": self.merged_config(config, 0)}
        )
        return messages_to(self.nodes, content, MessageType.EVALUATE)

    def evaluate_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask every node for its f_i(S) (plain) or Σ f_i(S) (cohort).

        During a run only after the last round, and only with ``federated_evaluation``.
        """
        if self._started and not (self.federated_evaluation and self.finished()):
            return []
        if self.cohort_mode:
            nodes = [] if self.cohorts is None else [int(n) for n in self.cohorts.node_ids]
        else:
            nodes = list(self.nodes)
        selected = arrays if SELECTED_KEY in arrays else _positional_selected(arrays)
        content = RecordDict(
            {"arrays": selected, "config": self.merged_config(config, server_round)}
        )
        self._expected = set(nodes)
        return messages_to(nodes, content, MessageType.EVALUATE)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return F(S) = Σ f_i(S) / n, or None if a node failed (logged)."""
        key = "objective-sum" if self.cohort_mode else "objective"

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


def _initial_set(arrays: ArrayRecord | None) -> list[int]:
    """Return S₀ from ``initial_arrays`` (None or empty: ∅)."""
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


def _positional_selected(arrays: ArrayRecord) -> ArrayRecord:
    """Accept S given as the first positional array (the legacy cohort contract)."""
    if len(arrays) == 0:
        return selected_record([])
    first = next(iter(arrays.keys()))
    return ArrayRecord({SELECTED_KEY: arrays[first]})


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.6g}"
