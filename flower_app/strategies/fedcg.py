"""FedCGStrategy (FedCG Alg. 1, FedCG+ Alg. 2), and the message contract of the ICML 2024 paper.

The contract below also covers FedDiscreteGreedyStrategy (Algs. 3-5), which lives in
``flower_app.strategies.discrete_greedy``.

Rafiey (ICML 2024), "Decomposable Submodular Maximization in Federated Setting". The math
lives in :mod:`flower_app.algorithms.fedcg.continuous` and
:mod:`flower_app.algorithms.fedcg.discrete_greedy`; this module moves it over Flower's
Message API on :class:`~flower_app.strategies.base.RoundStrategy`.

One node is one client i with its own utility f_i (its ClientApp uses the helpers of
``flower_app.clients.fedcg``); nodes are sampled from ``grid.get_node_ids()`` like Flower's
``FedAvg``; the ground-set size m comes from the replies (metric ``n-elements``; the most
common value among the first round's replies is taken and replies with another m are left
out), or from ``initial_arrays["x"]`` / ``groups``. (This app's simulations, where a node
serves many users, run the cohort classes of :mod:`flower_app.strategies.cohort.fedcg`.)
:class:`FedCGRounds` is FedCG's round both classes share.

Message contract. Requests carry ``"arrays"`` (ArrayRecord) and ``"config"`` (ConfigRecord:
the user's ``train_config``, ``server-round`` and the entries below); replies carry
``"arrays"`` and ``"metrics"`` (MetricRecord).

=====================  ==============================  ======================================
message type           request                         reply
=====================  ==============================  ======================================
``train.direction``    ``"x"`` float64 (m,) [#x]_;     ``"values"`` float64 (m,), or ``"ids"``
(FedCG, each round)    config ``seed``,                int32 + ``"values"`` float64: the sum
                       ``local-steps``, ``gradient``,  of the τ LMO vertices; metrics
                       ``gradient-samples``,           ``num-examples``, ``ids-sent``,
                       ``fill-base`` (0/1) [#m]_       ``n-elements`` (m)
``train.histogram``    no arrays                       ``"values"`` float64 (m,) or sparse:
(discrete, setup)                                      Σ_i O_i, O_i = (f_i({j}))_j; metrics
                                                       ``num-examples``, ``n-elements``
``train.importance``   ``"histogram"`` float64 O       no arrays; metrics ``num-examples``,
(discrete, setup)      (m,); config ``kappa``          ``expected-participants`` (Σ κ_i),
                                                       ``max-w``
``train.discrete``     ``"selected"`` int64 S;         ``"values"`` int64 (m,) or ``"ids"``
(discrete, each        config ``seed``, ``kappa``      int32 + ``"values"`` int64: Σ Δ_i in
round)                 [#m]_                           2^-20 units; metrics ``participants``,
                                                       ``num-examples``, ``n-elements``
``evaluate``           ``"selected"`` int64 S (the     metrics ``objective`` (f_i(S), float
(FedCG, after          final rounding; ∅ once before   ≥ 0), ``num-examples`` (1)
round T [#e]_)         round 1); config: the user's
                       ``evaluate_config`` +
                       ``server-round``
=====================  ==============================  ======================================

.. [#x] shape (0,) = the zero vector while the server does not know m yet (round 1).
.. [#e] with ``federated_evaluation=True`` (the default, as ``FedAvg`` evaluates by default):
   F(S) = mean f_i(S) over the nodes goes to ``Result.evaluate_metrics_clientapp[T]``
   (``objective``, ``nodes``) and the last round's row; the ClientApp answers with
   :func:`~flower_app.clients.fedcg_evaluate` (``add_fedcg_handlers`` registers it).
.. [#m] config ``matroid-k`` (rank of the uniform matroid; 0 for a partition matroid) and,
   for a partition matroid, arrays ``"matroid-groups"`` int64 (m,) and
   ``"matroid-capacities"`` int64 (G,).

``Result.arrays`` and the arrays given to ``evaluate_fn(server_round, arrays)``: FedCG
``"x"`` float64 (m,) and ``"selected"`` int64 (after round T the configured rounding;
before, the greedy rounding of the current x, as a preview); discrete greedy
``"selected"`` int64 (S in order). At round 0 ``evaluate_fn`` gets ``initial_arrays`` as
given.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common import log
from flwr.serverapp import Grid

from flower_app.algorithms.fedcg.continuous import ROUNDINGS, FedCGServer, LocalSteps
from flower_app.algorithms.fedsm.core import check_report, decode_report
from flower_app.privacy.secagg_server import SecureAggregation
from flower_app.strategies.base import SUMMED_SENDER, RoundStrategy
from flower_app.strategies.errors import InitialArraysError
from flower_app.strategies.exchange import messages_to
from flower_app.strategies.records import merged_config
from flower_app.strategies.replies import CheckedReplies, int_metric
from flower_app.strategies.sampling import sample_nodes
from flower_app.strategies.submodular_records import (
    build_matroid,
    check_common,
    drop_replies,
    matroid_entries,
    named_record,
    reply_parts,
    report_arrays,
    reported_n_elements,
    resolve_m,
    train_message,
)
from flower_app.submodular.rounding import check_in_polytope, greedy_rounding

__all__ = ["FedCGRounds", "FedCGStrategy", "initial_x", "start_at"]

#: relative tolerance of the checks on a reply's mass and weight
TOL = 1e-6


def initial_x(arrays: ArrayRecord) -> np.ndarray | None:
    """Return x₀ of ``initial_arrays`` (None: x starts at 0).

    ``initial_arrays`` is empty or has ``"x"`` float64 (m,) (and optionally ``"selected"``,
    ignored: the keys of ``Result.arrays``).

    Raises
    ------
    InitialArraysError
        On other keys, or an ``"x"`` that is not a finite float vector.
    """
    keys = set(arrays)
    if not keys <= {"x", "selected"} or (keys and "x" not in keys):
        raise InitialArraysError(
            f"initial_arrays has keys {sorted(keys)}; expected none (x = 0) or 'x' "
            "float64 (m,) (and optionally 'selected')"
        )
    if "x" not in keys:
        return None
    x0 = np.asarray(arrays["x"].numpy())
    if x0.ndim != 1 or x0.dtype.kind != "f" or not np.all(np.isfinite(x0)):
        raise InitialArraysError("initial_arrays['x'] must be a finite float vector")
    return x0


def start_at(server: FedCGServer, x0: np.ndarray) -> None:
    """Start ``server`` from x0, checked to lie in (1 − η·T)·P so that x_T stays in P.

    Raises
    ------
    InitialArraysError
        If x0 has another size than m, or lies outside (1 − η·T)·P.
    """
    m = server.matroid.n_elements
    if x0.shape != (m,):
        raise InitialArraysError(f"initial_arrays['x'] has shape {x0.shape}; m is {m}")
    room = 1.0 - server.eta * server.rounds
    if np.any(x0 != 0):
        try:
            if room <= TOL:
                raise ValueError("η·T = 1 leaves no room")
            check_in_polytope(x0 / room, server.matroid)
        except ValueError as err:
            raise InitialArraysError(
                f"initial_arrays['x'] must lie in (1 − η·T)·P = {room:.3g}·P so that x "
                f"stays in the matroid polytope: {err}"
            ) from err
    server.x = x0.astype(np.float64).copy()


class FedCGRounds:
    """FedCG's round, shared by :class:`FedCGStrategy` and the runners' ``FedCGCohorts``.

    A mixin for a :class:`~flower_app.strategies.base.RoundStrategy`: the config every
    direction request carries, the checks of a reply's mass, the sum of the directions and
    the server step x ← x + η·Σ c_i Δ_i / Σ c_i with the round's row, the rounded set, and
    the bookkeeping of a secure sum. ``self._sent`` maps a node to the (users, weight) its
    message stands for.
    """

    seed: int
    rounding: str
    local: LocalSteps
    server: FedCGServer | None
    selected: list[int] | None
    summed_nodes: list[int]
    _expected: set[int]
    #: ``objective_fn(x) -> float``: an oracle recorded as ``multilinear``
    objective_fn: Callable[[np.ndarray], float] | None = None
    #: call ``objective_fn`` every this many rounds and after the last
    evaluate_every: int = 1

    def _init_round_state(self) -> None:
        self.selected = None
        self._sent: dict[int, tuple[int, float]] = {}
        self._bytes_down = 0
        self._draws = 0

    def _config(self, config: ConfigRecord, server_round: int, **extra: Any) -> ConfigRecord:
        local = self.local
        return merged_config(
            config, server_round, seed=self.seed, **{
                "local-steps": local.steps,
                "gradient": local.gradient,
                "gradient-samples": local.samples,
                "fill-base": int(local.fill_base),
            }, **extra,
        )  # fmt: skip

    def _sent_messages(self, messages: list[Message]) -> list[Message]:
        """Count the round's download bytes; the nodes sent to are the expected senders."""
        self._bytes_down = sum(m.content.array_records["arrays"].count_bytes() for m in messages)
        self._expected = set(self._sent)
        return messages

    def merge_senders(self, nodes: list[int]) -> int:
        """Under secure aggregation: the summed reply stands for the nodes' users and weight."""
        sent = [self._sent[n] for n in nodes if n in self._sent]
        self._sent[SUMMED_SENDER] = (sum(n for n, _ in sent), float(sum(w for _, w in sent)))
        return SUMMED_SENDER

    def forget_summed_sender(self) -> None:
        """Drop the summed sender's entry once the sum is decoded."""
        self._sent.pop(SUMMED_SENDER, None)

    def _check_mass(self, vec: np.ndarray, weight: float) -> None:
        assert self.server is not None
        tau, rank = self.local.steps, self.server.matroid.rank
        if vec.max(initial=0.0) > tau * weight * (1 + TOL):
            raise ValueError(
                f"a coordinate exceeds τ·Σc = {tau * weight:g}: not a sum of τ vertices"
            )
        mass, full = float(vec.sum()), tau * rank * weight
        if mass > full * (1 + TOL) + TOL or (
            self.local.fill_base and abs(mass - full) > TOL * max(1.0, full)
        ):
            raise ValueError(f"total mass {mass:g} is not that of τ bases ({full:g})")

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sum the valid updates and take the server step (x ← x + η·Σ c_i Δ_i / Σ c_i)."""
        server = self.server
        assert server is not None
        m = server.matroid.n_elements
        total, weight, users, ids_sent, bytes_up = np.zeros(m), 0.0, 0, 0, 0
        for _, (vec, n_ex, w, nbytes, ids, _m) in checked.accepted:
            total += vec
            weight += w
            users += n_ex
            bytes_up += nbytes
            ids_sent += ids
        rnd = server.step(total, weight, users, ids_sent)
        values: dict[str, Any] = {
            "users": users,
            "draws": int(self._draws),
            "nodes": len(self._sent),
            "weight": float(weight),
            "ids-sent": ids_sent,
            "step-mass": rnd.step_norm,
            "bytes-down": int(self._bytes_down),
            "bytes-up": bytes_up,
            "bad-replies": checked.left_out,
        }
        last = server.done
        if self.objective_fn is not None and (server_round % self.evaluate_every == 0 or last):
            values["multilinear"] = float(self.objective_fn(server.x))
        return self._arrays(), MetricRecord(values)

    def _arrays(self) -> ArrayRecord:
        """``{"x", "selected"}``: the final rounding once the last round is done."""
        server = self.server
        assert server is not None
        if server.done and self.selected is None:
            self.selected = server.round_solution()
        chosen = self.selected if server.done else greedy_rounding(server.x, server.matroid)
        return named_record(x=server.x.copy(), selected=np.asarray(chosen, dtype=np.int64))

    def sent_users(self, node_id: int) -> int:
        """Return the users sampled on ``node_id`` this round (1 for a plain node)."""
        return int(self._sent[node_id][0]) if node_id in self._sent else 1

    def round_summary(self, row: dict[str, Any]) -> str:
        """Return the users, nodes and F̂(x) of a round."""
        if "users" not in row:
            return ""
        text = f"users={row.get('users', 0)} nodes={row.get('nodes', 0)}"
        if "multilinear" in row:
            text += f"  F^(x)={row['multilinear']:.6g}"
        return text

    def _summary(self, name: str, matroid: Any, eta: Any) -> None:
        local = self.local
        log(INFO, "%s(%s): %s, eta=%s, tau=%d, gradient=%s, rounding=%s, seed=%d", name,
            "FedCG" if local.steps == 1 else "FedCG+", matroid, eta, local.steps,
            local.gradient, self.rounding, self.seed)  # fmt: skip


class FedCGStrategy(FedCGRounds, RoundStrategy):
    """Federated continuous greedy: FedCG (τ = 1, Alg. 1) and FedCG+ (τ > 1, Alg. 2).

    Each round the server sends x to the round's clients; each takes τ local
    continuous-greedy steps from x (gradient of its multilinear extension, LMO over the
    matroid) and replies with the sum of its τ vertices; the server sets
    x ← x + η Σ c_i Δ_i / Σ c_i (here c_i = 1). After round T, x is rounded without the
    objective (Remark 4.4). T is ``num_rounds`` of
    :meth:`~flower_app.strategies.RoundStrategy.start`. Message contract: the table of
    :mod:`flower_app.strategies.fedcg`.

    Parameters
    ----------
    k : int, optional
        Cardinality bound of the uniform matroid (default 10); with ``groups``, the
        default capacity of each block.
    groups : sequence of int, optional
        Block of every element (length m): a partition matroid (m is then known).
    capacities : int, sequence or mapping, optional
        Block capacities of the partition matroid (see
        ``flower_app.strategies.submodular_records.build_matroid``).
    eta : float, optional
        Server step η with η·T ≤ 1; 0 (default) means 1/T.
    local : LocalSteps, optional
        The clients' local computation
        (:class:`~flower_app.algorithms.fedcg.continuous.LocalSteps`): τ = ``steps`` (1 is
        FedCG, τ > 1 FedCG+), the ``gradient`` (``"exact"``, or ``"sampled"`` from
        ``samples`` sets: Appendix C.3) and ``fill_base`` (complete each LMO answer to a
        base with random zero-gradient elements). Default ``LocalSteps()``: FedCG, exact
        gradients, bases completed.
    rounding : str, optional
        Final rounding, ``"greedy"`` (default) or ``"pipage"``. Verified rounding (the
        discrete greedy over the elements of largest x, which colluding users cannot steer
        as they steer greedy rounding) is a second strategy after this one:
        :class:`~flower_app.strategies.FedDiscreteGreedyStrategy` over
        :func:`~flower_app.submodular.rounding.verification_matroid` of ``Result.arrays["x"]``.
    fraction_train : float, optional
        Fraction of connected nodes sampled per round (default 1.0: all, FedCG's full
        participation with uniform weights).
    min_train_nodes : int, optional
        Least nodes per round (default 2).
    min_available_nodes : int, optional
        Least connected nodes before a round starts (default 2).
    seed : int, optional
        Seeds the node sampler (``random.Random(seed)``), the server's generator
        (rounding) and the clients' streams (``default_rng([seed, round, user_id])``).
    federated_evaluation : bool, optional
        After round T, ask every node for f_i(S) of the final set (an ``evaluate``
        message); F(S), their mean, is ``Result.evaluate_metrics_clientapp[T]
        ["objective"]``, as ``FedAvg``'s Result carries its evaluation (default True; the
        ClientApp needs ``@app.evaluate()``, which
        :func:`~flower_app.clients.add_fedcg_handlers` registers, and is asked once before
        round 1 with S = ∅ so that a missing handler stops the run there).
    secure_aggregation : SecureAggregation, optional
        Sum each round's direction reports with secure aggregation
        (:mod:`flower_app.privacy`): nodes report densely, the server learns Σ Δ_i, the
        users and ``ids-sent`` (``n-elements`` in the clear); the checks below apply to
        the sum. Fixed point: 2^-25 per coordinate and node (f = 24). Default None.

    Notes
    -----
    A reply with an error, a malformed or non-finite report, another m, a coordinate above
    τ, or a total mass that is not that of τ bases (τ r; at most that without base
    completion) is counted in ``bad-replies`` and left out; the step is normalised by the
    clients whose replies arrived.
    """

    supports_secure_aggregation = True
    secure_public_metrics = ("n-elements",)

    def __init__(
        self,
        k: int = 10,
        groups: Sequence[int] | np.ndarray | None = None,
        capacities: int | Sequence[int] | Mapping[int, int] | None = None,
        eta: float = 0.0,
        local: LocalSteps | None = None,
        rounding: str = "greedy",
        fraction_train: float = 1.0,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        seed: int = 0,
        federated_evaluation: bool = True,
        *,
        secure_aggregation: SecureAggregation | None = None,
    ) -> None:
        super().__init__(secure_aggregation=secure_aggregation)
        check_common(k, seed, min_available_nodes)
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding={rounding!r}: choose one of {', '.join(ROUNDINGS)}")
        if not 0.0 < fraction_train <= 1.0:
            raise ValueError(f"fraction_train={fraction_train} must be in (0, 1]")
        if not np.isfinite(eta) or eta < 0:
            raise ValueError(f"eta={eta!r} must be >= 0 (0 selects 1/T)")
        self.local = LocalSteps() if local is None else local
        self.k, self.groups, self.capacities = k, groups, capacities
        self.eta, self.rounding, self.seed = float(eta), rounding, int(seed)
        self.fraction_train = float(fraction_train)
        self.min_train_nodes = int(min_train_nodes)
        self.min_available_nodes = int(min_available_nodes)
        self.federated_evaluation = bool(federated_evaluation)
        self.server: FedCGServer | None = None
        self._node_rng = random.Random(self.seed)
        self._rounds = 0
        self._x0: np.ndarray | None = None
        self._init_round_state()

    def summary(self) -> None:
        """Log the strategy's settings."""
        s = self.server
        eta = "1/T" if self.eta == 0 and s is None else (s.eta if s else self.eta)
        self._summary("FedCGStrategy", s.matroid if s is not None else f"k={self.k}", eta)

    def _build_server(self, n_elements: int, n_users: int) -> FedCGServer:
        matroid = build_matroid(n_elements, self.k, self.groups, self.capacities)
        server = FedCGServer(
            max(1, n_users), matroid, self._rounds, self.eta, self.local, 1.0,
            seed=self.seed, rounding=self.rounding,
        )  # fmt: skip
        if self._x0 is not None:
            start_at(server, self._x0)
        return server

    def setup(self, grid: Grid, arrays: ArrayRecord, num_rounds: int) -> int:
        """Check ``initial_arrays`` (empty, or ``"x"``: x₀); return T = ``num_rounds``."""
        self._x0 = initial_x(arrays)
        self.selected = None
        self._rounds = int(num_rounds)
        if self._rounds < 1:
            return 0
        self.server = None
        self._node_rng = random.Random(self.seed)
        m = self._x0.size if self._x0 is not None else None
        if m is None and self.groups is not None:
            m = len(self.groups)
        if m is not None:
            self.server = self._build_server(m, len(grid.get_node_ids()))
        return self._rounds

    # ------------------------------------------------------------------ round
    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample the round's nodes like ``FedAvg``; send each x (and the matroid)."""
        self._sent, self._bytes_down = {}, 0
        nodes = sample_nodes(
            grid, self._node_rng, self.fraction_train, self.min_train_nodes,
            self.min_available_nodes, timeout=self.exchange_timeout,
        )  # fmt: skip
        self._draws = len(nodes)
        if self.server is None:  # m not known yet: x = 0 travels as an empty vector
            x = np.zeros(0)
            entries: dict[str, Any] = {"matroid-k": int(self.k)}
            extra: dict[str, np.ndarray | None] = {}
        else:
            x = self.server.x.astype(np.float64)
            entries, extra = matroid_entries(self.server.matroid)
        cfg = self._config(config, server_round, **entries)
        arrays = named_record(x=x, **extra)
        for node in nodes:
            self._sent[node] = (1, 1.0)
        return self._sent_messages([train_message(n, arrays, cfg, "direction") for n in nodes])

    def decode_train_reply(self, src: int, reply: Message) -> tuple:
        """Decode one direction report: ``(vector, users, weight, bytes, ids, m)``."""
        record, metrics, nbytes = reply_parts(reply)
        if self.server is None:
            # m is only a claim until the majority fixes it: check, densify in _resolve_m
            m = reported_n_elements(metrics)
            parts = report_arrays(record)
            check_report(parts, m)
            n_ex, weight = self._sent[src]
            return parts, n_ex, weight, nbytes, int_metric(metrics, "ids-sent", 0), m
        m = self.server.matroid.n_elements
        if reported_n_elements(metrics) != m:
            raise ValueError(f"reply for m={metrics['n-elements']}; the run has m={m}")
        vec = decode_report(report_arrays(record), m)
        n_ex, weight = self._sent[src]
        self._check_mass(vec, weight)
        return vec, n_ex, weight, nbytes, int_metric(metrics, "ids-sent", 0), m

    def _resolve_m(self, server_round: int, checked: CheckedReplies, grid_nodes: int) -> None:
        """First replies: fix m and the matroid; leave out the others."""
        context = f"round {server_round}"
        m = resolve_m(checked, lambda value: value[5], "reply", context)
        self.server = self._build_server(m, grid_nodes)

        def keep(src: int, value: tuple) -> str | None:
            try:
                self._check_mass(value[0], value[2])
            except ValueError as err:
                return str(err)
            return None

        drop_replies(checked, keep, context)

    def aggregate_accepted(
        self, server_round: int, checked: CheckedReplies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Fix m on the first round's replies, then take the server step."""
        if self.server is None:
            self._resolve_m(server_round, checked, len(self._sent))
        return super().aggregate_accepted(server_round, checked)

    # ------------------------------------------------------------------ evaluation
    def _evaluate_messages(
        self, grid: Grid, selected: np.ndarray, config: ConfigRecord, server_round: int
    ) -> list[Message]:
        content = RecordDict(
            {
                "arrays": named_record(selected=np.asarray(selected, dtype=np.int64)),
                "config": self.merged_config(config, server_round),
            }
        )
        nodes = sorted(int(n) for n in grid.get_node_ids())
        return messages_to(nodes, content, MessageType.EVALUATE, f"evaluate-{server_round}")

    def probe_messages(
        self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """With federated evaluation: f_i(∅) from every node, so a missing handler fails now."""
        if not self.federated_evaluation or self._rounds < 1:
            return []
        return self._evaluate_messages(grid, np.zeros(0, np.int64), config, 0)

    def evaluate_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """After round T: ask every node for f_i(S) of the final set."""
        server = self.server
        if not self.federated_evaluation or server is None or not server.done:
            return []
        if "selected" in arrays:
            selected = arrays["selected"].numpy()
        else:
            selected = self._arrays()["selected"].numpy()
        return self._evaluate_messages(grid, selected, config, server_round)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return F(S) = mean f_i(S) over the nodes that answered (and how many did)."""

        def decode(src: int, reply: Message) -> float:
            value = float(reply.content.metric_records["metrics"]["objective"])
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"objective = {value}: expected a finite f_i(S) >= 0")
            return value

        checked = self.check(replies, decode, f"round {server_round} (evaluate)",
                             all_rejected_fails=False)  # fmt: skip
        if not checked.accepted:
            return None
        values = [v for _, v in checked.accepted]
        return MetricRecord({"objective": float(np.mean(values)), "nodes": len(values)})

    def finalize(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return ``{"x", "selected"}`` of the run (the last round already rounded x)."""
        if self.server is None or self._rounds == 0:
            return arrays
        return self._arrays()
