"""Dishonest users against FedSM Alg. 1, FedCG and the discrete greedy: F(S)/F(S_clean).

On MovieLens-1M facility location (6,040 users, 3,706 movies, λ = 5; ``FLOWER_APP_DATA``)
and the direct engine's maths (no Flower), a seeded fraction b of the users is dishonest
(``default_rng([seed, 0xBAD])`` picks them); F is always the true objective over every
user's real ratings, and each attacked run is compared with the clean run of the same
algorithm, seed and k (F(S)/F(S_clean)); the clean run is also compared with centralized
greedy.

The attacks (``max-value`` and ``overflow`` are sent as they are, to show what the checks
refuse; the others take the strongest form that passes every check in force):

``max-value``
    the largest value the server accepts on useless elements (FedSM: 1e140 on every
    useless element; discrete greedy: the largest int64 that cannot wrap the sum; FedCG:
    a base, the most its mass check lets through, i.e. ``collude``).
``promote``
    a believable value (the top rating λ) on every useless element (only those of the
    user's own draw once the draw is checked; at most the remaining budget once budgets
    are kept).
``promote-split``
    the same, the dishonest users split into groups that each promote one useless element,
    sized from the clean greedy's gains to take the last rounds (the best a budgeted
    attacker can do; with one group it is ``promote``).
``suppress``
    honest reports, except zero on the truly best elements (greedy's S for this k).
``overflow``
    discrete greedy: one dishonest user sends 2^63 − 1 on greedy's best elements (the sum
    wraps around, so they are never chosen); the others report honestly.
``collude``
    FedCG: every dishonest user sends the same base of k useless elements every round.
``absent``
    the dishonest users send nothing: the noise floor of F(S)/F(S_clean) for that b (the
    algorithms' own randomness, with the same users missing).

The defences (``--defence``):

``off``
    the server's checks of today (finite, non-negative, ≤ 1e140, int64, FedCG's base mass).
``checks``
    the per-user checks of :mod:`flower_app.algorithms.robust` (range λ, own draw,
    participation coin, overflow-checked sums; refused whole) and the per-user claim
    budget across the run (λ; clipped). Dishonest users still send reports of their
    choice.
``commitment``
    FedSM and the discrete greedy: each user's profile is fixed at setup and the node
    computes every report from it (values above λ clipped at setup): a dishonest user can
    only choose its profile, so its reports are consistent with S across rounds.
``mom``
    FedSM: ``checks``, and the estimate is the median over 5 seeded groups of the round's
    users of each group's own estimate (median of means).
``noise-clamp``
    FedSM's default: ``commitment``, and the server's noise-aware history clamp
    (``fedsm-history-clamp = "noise-aware"``, :mod:`flower_app.algorithms.robust.history`):
    each round's estimate held to the mean of that element's estimates so far plus c
    standard errors of that mean (c = ``--margin``, default the app's
    ``NOISE_AWARE_MARGIN``). With ``absent`` (no profile to commit) the dishonest users send
    nothing: the noise floor under the clamp.
``clamp``
    FedSM: ``commitment``, and the plain mean clamp (``fedsm-history-clamp = "mean"``, c = 0).
``checks+noise-clamp``, ``checks+clamp``
    FedSM: ``checks`` and the history clamp (no commitment).
``node``
    discrete greedy: the dishonest users are one dishonest node; the server checks only its
    sum (``DiscreteGreedyServer.accept``: overflow, participants · max(λ, O_e/κ)), which it
    fills to that bound on the useless elements.
``verify``
    FedCG: verified rounding (the app's ``fedcg-rounding = "verified"``, through the same
    :func:`~flower_app.submodular.rounding.verification_matroid`), the discrete greedy with
    ``checks`` over the 2k elements of largest x instead of greedy rounding.

Usage: a quick look, then the grid recorded in ``docs/benchmarks/robustness.{json,md}``
(about 2.5 h on the shared 2-core machine, most of it FedCG; each pair of FedSM's clamp defences
about 12 min)::

    export FLOWER_APP_DATA=/abs/DATA   # holds ml-1m/
    nice -n 10 .venv/bin/python benchmarks/robustness.py --quick
    B="nice -n 10 .venv/bin/python benchmarks/robustness.py"; R=benchmarks/results
    $B --algorithms fedsm dgreedy --out $R/robust-v2
    $B --algorithms fedcg --attacks collude --out $R/robust-fedcg-v1
    $B --algorithms fedcg --attacks absent --defences off --out $R/robust-fedcg-absent
    # FedCG at the app's default T = 100, b = 20 % (about 17 min), its own table
    $B --algorithms fedcg --attacks collude --fractions 0.2 --fedcg-rounds 100 \\
        --out docs/benchmarks/robustness-fedcg-t100
    $B --algorithms fedsm --defences clamp checks+clamp --out $R/robust-fedsm-clamp
    $B --algorithms fedsm --defences noise-clamp checks+noise-clamp --out $R/robust-fedsm-noise
    $B --report $R/robust-v2.json $R/robust-fedcg-v1.json $R/robust-fedcg-absent.json \\
        $R/robust-fedsm-clamp.json $R/robust-fedsm-noise.json --out docs/benchmarks/robustness
    # the margin c of the noise-aware clamp: every attack but absent, one c per run (~3 min)
    for c in 0 1 2 3 4 5; do $B --algorithms fedsm --defences noise-clamp --margin $c \\
        --attacks promote promote-split suppress --fractions 0.01 0.05 0.1 \\
        --out $R/fedsm-margin-$c; done
    # what the history clamps do to honest FedSM runs (about 8 min)
    $B --clamp-cost --k 5 10 20 30 --seeds 0 1 2 3 4 --out $R/fedsm-clamp-cost
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from flower_app.algorithms.fedcg.continuous import (
    FedCGServer,
    LocalSteps,
    UserEntries,
    user_direction_sum,
)
from flower_app.algorithms.fedcg.discrete_greedy import (
    FIXED_POINT_SCALE,
    DiscreteGreedyServer,
    discrete_report_sum,
    histogram_sum,
    importance_factors,
    participation_probabilities,
)
from flower_app.algorithms.fedsm.core import MAX_REPORT_VALUE, FedSMServer, user_report_sum
from flower_app.algorithms.fedsm.sampling import user_draw
from flower_app.algorithms.robust.budget import ClaimBudget
from flower_app.algorithms.robust.history import NOISE_AWARE_MARGIN, GainHistory
from flower_app.algorithms.robust.node_bounds import discrete_element_bounds
from flower_app.algorithms.robust.reports import ReportTally, refusal_reason
from flower_app.algorithms.robust.sums import ReportOverflowError, checked_int_add
from flower_app.config import AppConfig
from flower_app.problems import load_problem
from flower_app.submodular.greedy import lazy_greedy
from flower_app.submodular.matroids import Matroid, UniformMatroid
from flower_app.submodular.objectives import MaxRowObjective
from flower_app.submodular.rounding import verification_matroid

INT64_MAX = int(np.iinfo(np.int64).max)
#: how many of the least-valued elements count as useless
N_USELESS = 100
#: FedSM's K and d (the recorded reproductions' K = d = 10 %)
FEDSM_K, FEDSM_D = 0.1, 0.1
#: the discrete greedy's κ (the app's default)
DGREEDY_KAPPA = 50.0
#: FedCG's rounds: full participation, exact gradients, greedy rounding
FEDCG_ROUNDS = 20
#: T of this run's FedCG rows (``--fedcg-rounds``; default FEDCG_ROUNDS)
FEDCG_T = [FEDCG_ROUNDS]
#: FedCG's verified rounding: candidates per element of S (the top of x)
VERIFY_CANDIDATES = 2
#: FedSM's median of means (defence ``mom``): groups of the round's users
MOM_GROUPS = 5
#: what the split attacker asks of each group: its claim above the gain it must beat
SPLIT_MARGIN = 1.2
#: the noise-aware clamp's margin c in the defences ``noise-clamp`` (``--margin``)
MARGIN = [NOISE_AWARE_MARGIN]

ATTACKS = {
    "fedsm": ("absent", "max-value", "promote", "promote-split", "suppress"),
    "dgreedy": ("absent", "max-value", "promote", "promote-split", "suppress", "overflow"),
    "fedcg": ("absent", "collude"),
}
DEFENCES = {
    "fedsm": (
        "off", "checks", "mom", "commitment", "clamp", "checks+clamp", "noise-clamp",
        "checks+noise-clamp",
    ),
    "dgreedy": ("off", "node", "checks", "commitment"),
    "fedcg": ("off", "verify"),
}


# ---------------------------------------------------------------------- the instance
@dataclass
class Instance:
    """The true objective, λ, the useless elements and greedy's sets per k."""

    objective: MaxRowObjective
    lam: float
    useless: np.ndarray
    greedy: dict[int, list[int]] = field(default_factory=dict)
    greedy_values: dict[int, list[float]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.objective.n_users

    @property
    def m(self) -> int:
        return self.objective.n_elements


def load_instance(ks: list[int]) -> Instance:
    """MovieLens-1M facility location, its useless elements and greedy's runs."""
    cfg = AppConfig.from_run_config({"algorithm": "fedsm", "dataset": "movielens"})
    obj = load_problem(cfg).objective
    totals = np.asarray(obj.values.sum(axis=0)).ravel()
    useless = np.sort(np.argsort(totals, kind="stable")[:N_USELESS])
    inst = Instance(obj, float(obj.max_singleton), useless)
    for k in ks:
        ref = lazy_greedy(obj, UniformMatroid(obj.n_elements, k), k)
        inst.greedy[k] = [int(e) for e in ref.selected]
        inst.greedy_values[k] = [float(v) for v in ref.values]
    return inst


def dishonest_users(n: int, fraction: float, seed: int) -> np.ndarray:
    """The seeded rule: ``round(fraction · n)`` users drawn by ``default_rng([seed, 0xBAD])``."""
    count = int(round(fraction * n))
    return np.sort(np.random.default_rng([seed, 0xBAD]).choice(n, count, replace=False))


def split_groups(inst: Instance, k: int, n_bad: int) -> int:
    """The split attacker's number of groups z: the most late rounds its budget can take.

    Each group of n_bad / z users claims λ once on its own useless element, i.e. λ·n_bad/(z·n)
    of the mean-form F; it must beat (with :data:`SPLIT_MARGIN`) the honest gain of round
    k − z + 1, which it displaces, z times. z maximises the greedy gain of the last z rounds.
    """
    values = np.asarray(inst.greedy_values[k])
    gains = np.diff(np.r_[0.0, values])
    best, best_loss = 1, -1.0
    for z in range(1, k + 1):
        claim = inst.lam * n_bad / (z * inst.n)
        if claim < SPLIT_MARGIN * gains[k - z]:
            continue
        loss = float(gains[k - z :].sum())
        if loss > best_loss:
            best, best_loss = z, loss
    return best


# ---------------------------------------------------------------------- the attackers
@dataclass
class Attack:
    """Who lies, how, and which checks the lies must pass."""

    name: str
    bad: np.ndarray
    inst: Instance
    k: int
    draw_checked: bool
    budget: ClaimBudget | None
    groups: int = 1
    node_caps: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.is_bad = np.zeros(self.inst.n, dtype=bool)
        self.is_bad[self.bad] = True
        self.group_of = {int(u): j % self.groups for j, u in enumerate(self.bad)}
        self.best = np.asarray(self.inst.greedy[self.k], dtype=np.int64)

    def targets(self, user: int, selected: list[int]) -> np.ndarray:
        """The useless elements this user promotes, outside S."""
        if self.name == "promote-split":
            own = self.inst.useless[self.group_of[int(user)] : self.group_of[int(user)] + 1]
        elif self.name == "collude":
            own = self.inst.useless[: self.k]
        else:
            own = self.inst.useless
        return np.setdiff1d(own, selected)

    def claim(self, user: int) -> float:
        """The largest believable claim left to this user."""
        if self.budget is None:
            return self.inst.lam
        return min(self.inst.lam, float(self.budget.remaining(np.array([user]))[0]))


def poisoned_objective(attack: Attack) -> tuple[MaxRowObjective, int]:
    """The profiles the dishonest users commit to (``commitment``): rows of [0, λ].

    Returns the objective with those rows and how many profile values the node clipped to
    λ (``max-value`` asks for 1e140 on every useless element).
    """
    inst, bad = attack.inst, attack.bad
    true = inst.objective.values.tocoo()
    keep = ~attack.is_bad[true.row]
    rows, cols, vals = [true.row[keep]], [true.col[keep]], [true.data[keep]]
    clipped = 0
    if attack.name in ("max-value", "promote"):
        rows.append(np.repeat(bad, inst.useless.size))
        cols.append(np.tile(inst.useless, bad.size))
        vals.append(np.full(bad.size * inst.useless.size, inst.lam))
        clipped = bad.size * inst.useless.size if attack.name == "max-value" else 0
    elif attack.name == "promote-split":
        rows.append(bad)
        cols.append(inst.useless[np.arange(bad.size) % attack.groups])
        vals.append(np.full(bad.size, inst.lam))
    elif attack.name in ("suppress", "overflow"):
        # overflow: the node computes the report, so the user cannot send 2^63 - 1
        mine = ~keep if attack.name == "overflow" else ~keep & ~np.isin(true.col, attack.best)
        rows.append(true.row[mine])
        cols.append(true.col[mine])
        vals.append(true.data[mine])
    else:
        raise ValueError(f"no profile for the attack {attack.name!r}")
    matrix = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=true.shape,
    )
    return MaxRowObjective(matrix, name="committed profiles"), clipped


# ---------------------------------------------------------------------- FedSM Alg. 1
def run_fedsm(inst: Instance, k: int, seed: int, attack: Attack | None, defence: str) -> dict:
    """FedSM Algorithm 1 (K = d = 10 %) with the dishonest users' reports of ``attack``."""
    matroid = UniformMatroid(inst.m, k)
    clamp = defence.endswith("clamp")
    server = FedSMServer(inst.n, matroid, k, FEDSM_K, FEDSM_D, seed=seed)
    if clamp:
        margin = MARGIN[0] if defence.endswith("noise-clamp") else 0.0
        server.history = GainHistory(inst.m, margin)
    tally = ReportTally()
    obj = inst.objective
    committed = defence in ("commitment", "clamp", "noise-clamp")
    if attack is not None and committed and attack.name != "absent":
        obj, clipped = poisoned_objective(attack)
        tally.clipped_values += clipped
        attack = None  # the node computes every report from the committed profile
    checks = defence in ("checks", "mom", "checks+clamp", "checks+noise-clamp")
    groups = MOM_GROUPS if defence == "mom" else 1
    while not server.done:
        users = server.sample_users()
        d, t = server.round_d(), len(server.selected) + 1
        # median of means: the round's users in seeded groups, each summed on its own
        part = np.random.default_rng([seed, t, 0x6D6F6D]).permutation(users.size) % groups
        sums = np.zeros((groups, inst.m))
        arrived = np.zeros(groups, dtype=np.int64)
        claims: list[tuple[int, np.ndarray, np.ndarray]] = []
        pool = np.setdiff1d(np.arange(inst.m), server.selected)
        for g in range(groups):
            mine = users[part == g]
            bad = mine[attack.is_bad[mine]] if attack is not None else mine[:0]
            honest = np.setdiff1d(mine, bad)
            sums[g] = user_report_sum(obj, honest, server.selected, d, seed, t)
            arrived[g] = honest.size
            for u in bad:
                if attack.name == "absent":
                    continue
                draw = np.sort(pool[user_draw(int(u), pool.size, d, seed, t)])
                ids, vals = _fedsm_lie(attack, int(u), draw, server.selected, d, seed, t, checks)
                if checks:
                    reason = refusal_reason(ids, vals, inst.lam, draw)
                    if reason is not None:
                        tally.refuse(reason)
                        continue
                    vals, n_clip = attack.budget.clip(np.full(ids.size, u), vals)
                    tally.clip(n_clip)
                sums[g, ids] += vals
                arrived[g] += 1
                claims.append((int(u), ids, vals))
        if groups == 1:
            total = sums[0]
        else:  # each group's estimate on the scale of the whole round, then the median
            total = np.median(sums * (arrived.sum() / np.maximum(arrived, 1))[:, None], axis=0)
        rec = server.select(total, int(arrived.sum()))
        if checks:
            for u, ids, vals in claims:
                hit = vals[ids == rec.element]
                if hit.size:
                    attack.budget.charge(np.array([u]), hit)
    out = {"selected": list(server.selected), **tally.row()}
    if clamp:
        out["estimates-clamped"] = sum(r.clamped for r in server.rounds)
    return out


def _fedsm_lie(
    attack: Attack, user: int, draw: np.ndarray, selected: list[int], d: int, seed: int,
    t: int, checks: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """One dishonest FedSM user's report ``(ids, values)``."""
    if attack.name == "suppress":
        vec = user_report_sum(attack.inst.objective, np.array([user]), selected, d, seed, t)
        vec[attack.best] = 0.0
        ids = np.flatnonzero(vec)
        return ids, vec[ids]
    ids = attack.targets(user, selected)
    if attack.name == "max-value":
        return ids, np.full(ids.size, MAX_REPORT_VALUE)
    if checks:  # only its own draw, at most its remaining budget
        ids = np.intersect1d(ids, draw)
    return ids, np.full(ids.size, attack.claim(user))


# ---------------------------------------------------------------------- discrete greedy
def run_dgreedy(
    inst: Instance, k: int, seed: int, attack: Attack | None, defence: str,
    matroid: Matroid | None = None,
) -> dict:
    """The discrete greedy (κ = 50) with the dishonest users' reports of ``attack``."""
    matroid = UniformMatroid(inst.m, k) if matroid is None else matroid
    server = DiscreteGreedyServer(inst.n, matroid, k, DGREEDY_KAPPA, seed=seed)
    tally = ReportTally()
    obj = inst.objective
    if attack is not None and defence == "commitment":
        obj, clipped = poisoned_objective(attack)
        tally.clipped_values += clipped
        attack = None
    checks = defence == "checks"
    node = defence == "node"  # the dishonest users are one node; the server checks its sum
    bad = attack.bad if attack is not None else np.zeros(0, dtype=np.int64)
    honest = np.setdiff1d(np.arange(inst.n), bad)
    hobj = MaxRowObjective(obj.values[honest], name="honest")
    # Algs. 4/5: dishonest users send λ on the useless elements (raising their bounds)
    histogram = histogram_sum(obj, honest)
    if attack is not None and attack.name not in ("suppress", "absent"):
        histogram[inst.useless] += inst.lam * bad.size
    elif attack is not None:
        histogram += histogram_sum(obj, bad)
    server.set_histogram(histogram)
    if node:
        server.report_bound = inst.lam
    if node and attack is not None:
        # a node that conforms claims, per participant, the most the server's bound allows
        attack.node_caps = discrete_element_bounds(histogram, inst.lam, server.kappa)
    kappa_h = participation_probabilities(importance_factors(hobj, histogram), server.kappa)
    server.expected = float(kappa_h.sum()) + bad.size  # dishonest users claim κ_i = 1
    scale = FIXED_POINT_SCALE
    slack = (k + 1) / scale  # one fixed-point unit of rounding per round
    while not server.done:
        t = len(server.selected) + 1
        total, participants = discrete_report_sum(
            hobj, server.selected, matroid, kappa_h, seed, t, honest
        )
        claims = []
        feasible = matroid.feasible_mask(server.selected)
        node_sum, node_count = np.zeros(inst.m, dtype=np.int64), 0
        for j, u in enumerate(bad):
            vec = _dgreedy_lie(attack, int(u), j, server.selected, feasible, checks)
            if vec is None:
                continue
            if node:
                with np.errstate(over="ignore"):
                    node_sum = node_sum + vec
                node_count += 1
                continue
            if checks:
                try:
                    checked_int_add(total, vec)
                except ReportOverflowError:
                    tally.refuse("overflow")
                    continue
                ids = np.flatnonzero(vec)
                raw = vec[ids] / scale  # κ_i = 1: the report is the raw claim
                reason = refusal_reason(ids, raw, inst.lam + slack)
                if reason is not None:
                    tally.refuse(reason)
                    continue
                raw, n_clip = attack.budget.clip(np.full(ids.size, u), raw)
                tally.clip(n_clip)
                vec = np.zeros(inst.m, dtype=np.int64)
                vec[ids] = np.floor(raw * scale).astype(np.int64)
                total = checked_int_add(total, vec)
                claims.append((int(u), ids, raw))
            else:
                with np.errstate(over="ignore"):
                    total = total + vec  # today's int64 sum wraps around silently
            participants += 1
        if node:
            if attack is not None and attack.name == "overflow":
                node_sum[attack.best] = INT64_MAX
            total, participants, node_tally = server.accept(
                [(total, participants), (node_sum, node_count)]
            )
            for reason, count in node_tally.refused.items():
                tally.refuse(reason, count)
        rec = server.select(total, participants)
        if checks:
            for u, ids, raw in claims:
                hit = raw[ids == rec.element]
                if hit.size:
                    attack.budget.charge(np.array([u]), hit)
    return {"selected": list(server.selected), **tally.row()}


def _dgreedy_lie(
    attack: Attack, user: int, index: int, selected: list[int], feasible: np.ndarray,
    checks: bool,
) -> np.ndarray | None:
    """One dishonest discrete-greedy user's fixed-point report (it always takes part)."""
    m = attack.inst.m
    vec = np.zeros(m, dtype=np.int64)
    if attack.name == "absent":
        return None
    if attack.name in ("suppress", "overflow"):
        obj = attack.inst.objective
        current = obj.user_values(selected, np.array([user]))
        _, elem, gain = obj.positive_gain_entries(current, np.array([user]))
        keep = feasible[elem]
        vec[elem[keep]] = np.rint(gain[keep] * FIXED_POINT_SCALE).astype(np.int64)
        if attack.name == "suppress":
            vec[attack.best] = 0
        elif index == 0:  # one node: the largest int64 on greedy's best elements
            vec[attack.best] = INT64_MAX
        return vec
    ids = attack.targets(user, selected)
    ids = ids[feasible[ids]]
    if attack.name == "max-value":
        # the largest value that cannot wrap the sum, whatever the honest users add
        vec[ids] = (INT64_MAX // 2) // max(attack.bad.size, 1)
        return vec
    if attack.node_caps is not None:
        vec[ids] = np.floor(attack.node_caps[ids] * FIXED_POINT_SCALE).astype(np.int64)
    else:
        vec[ids] = int(np.floor(attack.claim(user) * FIXED_POINT_SCALE))
    return vec


# ---------------------------------------------------------------------- FedCG
def run_fedcg(inst: Instance, k: int, seed: int, attack: Attack | None, defence: str) -> dict:
    """FedCG (T = 20 or ``--fedcg-rounds``, full participation, exact gradients, greedy
    rounding) with colluders."""
    matroid = UniformMatroid(inst.m, k)
    local = LocalSteps()
    server = FedCGServer(inst.n, matroid, FEDCG_T[0], 0.0, local, 1.0, seed=seed,
                         rounding="greedy")  # fmt: skip
    bad = attack.bad if attack is not None else np.zeros(0, dtype=np.int64)
    honest = np.setdiff1d(np.arange(inst.n), bad)
    entries = UserEntries.build(inst.objective, honest)
    base = inst.useless[:k]
    tally = ReportTally()
    while not server.done:
        total, sent = user_direction_sum(
            inst.objective, honest, np.ones(honest.size), server.x, matroid, local, seed,
            server.t + 1, entries=entries,
        )  # fmt: skip
        weight = float(inst.n)
        if bad.size and attack.name == "absent":
            weight = float(honest.size)
        elif bad.size:
            total[base] += float(bad.size)  # each colluder: one base, the same k elements
            sent += bad.size * k
        server.step(total, weight, inst.n, sent)
    if defence != "verify":
        return {"selected": server.round_solution(), **tally.row()}
    # verified rounding (the app's fedcg-rounding = "verified"): the discrete greedy, with
    # the per-user checks and budgets, over the VERIFY_CANDIDATES·k elements of largest x
    restricted = verification_matroid(server.x, matroid, VERIFY_CANDIDATES)
    return run_dgreedy(inst, k, seed, attack, "checks", matroid=restricted)


#: the defences each algorithm's page recommends (the worst case over attacks is shown):
#: FedSM's commitment alone, with the default noise-aware clamp, and with the mean clamp
CHOSEN = {
    "fedsm": ("commitment", "noise-clamp", "clamp"), "dgreedy": ("checks",), "fedcg": ("verify",)
}
#: what identifies a row
CELL = ("algorithm", "attack", "fraction", "k", "seed", "defence")
TITLES = {
    "fedsm": "FedSM Algorithm 1",
    "dgreedy": "Federated discrete greedy",
    "fedcg": "FedCG (greedy rounding)",
}
RUNNERS: dict[str, Callable[..., dict]] = {
    "fedsm": run_fedsm,
    "dgreedy": run_dgreedy,
    "fedcg": run_fedcg,
}


# ---------------------------------------------------------------------- the grid
def one_run(
    inst: Instance, algorithm: str, attack: str | None, fraction: float, k: int, seed: int,
    defence: str,
) -> dict[str, Any]:
    """Run one cell; return its row (F(S), the counts)."""
    runner = RUNNERS[algorithm]
    att = None
    if attack is not None:
        bad = dishonest_users(inst.n, fraction, seed)
        budgeted = ("checks", "mom", "verify", "checks+clamp", "checks+noise-clamp")
        budget = ClaimBudget(inst.n, inst.lam) if defence in budgeted else None
        groups = split_groups(inst, k, bad.size) if attack == "promote-split" else 1
        att = Attack(attack, bad, inst, k, draw_checked=defence != "off", budget=budget,
                     groups=groups)  # fmt: skip
    t0 = time.perf_counter()
    out = runner(inst, k, seed, att, defence)
    return {
        "algorithm": algorithm,
        "attack": attack or "clean",
        "fraction": fraction if attack else 0.0,
        "k": k,
        "seed": seed,
        "defence": defence,
        "groups": att.groups if att is not None else 0,
        **({"margin": MARGIN[0]} if defence.endswith("noise-clamp") else {}),
        **({"fedcg-rounds": FEDCG_T[0]} if FEDCG_T[0] != FEDCG_ROUNDS and algorithm == "fedcg"
           else {}),
        "objective": inst.objective.mean_value(out.pop("selected")),
        "seconds": time.perf_counter() - t0,
        **out,
    }


def rows_json(rows: list[dict[str, Any]]) -> str:
    """The rows as JSON, one per line, floats to 6 significant digits (seconds to 0.1),
    the refusal reasons that did not occur left out."""

    def short(row: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in row.items():
            if key.startswith("refused-") and not value:
                continue
            if isinstance(value, float):
                value = round(value, 1) if key == "seconds" else float(f"{value:.6g}")
            out[key] = value
        return out

    return "[\n" + ",\n".join(json.dumps(short(r)) for r in rows) + "\n]\n"


def _fedcg_rounds(rows: list[dict[str, Any]]) -> str:
    """FedCG's T in ``rows`` (rows of the default T do not name it)."""
    rounds = sorted(
        {r.get("fedcg-rounds", FEDCG_ROUNDS) for r in rows if r["algorithm"] == "fedcg"}
    )
    return " / ".join(str(t) for t in rounds) or str(FEDCG_ROUNDS)


def markdown(rows: list[dict[str, Any]], source: str = "robustness.json") -> str:
    """Tables of F(S)/F(S_clean) (min and mean over seeds) and of the clean runs; ``source``
    names the rows' JSON file."""
    out: list[str] = [
        "# Robustness: dishonest users against the submodular strategies",
        "",
        f"Generated by `benchmarks/robustness.py` (the rows: `{source}`). MovieLens-1M "
        "facility location (6,040 users, 3,706 movies, λ = 5), direct engine maths; a "
        "seeded fraction b of the users is dishonest; F is the true objective over every "
        "user's real ratings. FedSM Algorithm 1 at K = d = 10 %, the discrete greedy at "
        f"κ = 50, FedCG with T = {_fedcg_rounds(rows)} full-participation rounds and greedy "
        "rounding. The "
        "attacks, the defences and what the numbers mean: the script's docstring and "
        "[FedSM's](../strategies/fedsm.md#dishonest-users-and-nodes) and "
        "[FedCG's](../strategies/fedcg.md#dishonest-users-and-nodes) threat models.",
        "",
    ]
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    for algorithm in algorithms:
        mine = [r for r in rows if r["algorithm"] == algorithm]
        ks = sorted({r["k"] for r in mine})
        fractions = sorted({r["fraction"] for r in mine if r["attack"] != "clean"})
        out.append(f"## {TITLES.get(algorithm, algorithm)}\n")
        out.append("Clean runs, F(S)/greedy (mean over seeds):\n")
        out.append("| defence | " + " | ".join(f"k = {k}" for k in ks) + " |")
        out.append("|---|" + "---:|" * len(ks))
        for defence in dict.fromkeys(r["defence"] for r in mine):
            cells = []
            for k in ks:
                vals = [r["ratio-to-greedy"] for r in mine
                        if r["attack"] == "clean" and r["defence"] == defence and r["k"] == k]
                cells.append(f"{np.mean(vals):.4f}" if vals else "-")
            out.append(f"| {defence} | " + " | ".join(cells) + " |")
        out.append("")
        out.append(
            "F(S)/F(S_clean), worst seed (mean over seeds); refused / clipped reports "
            "summed over seeds:\n"
        )
        head = [f"b = {f:.0%}, k = {k}" for k in ks for f in fractions]
        out.append("| defence | attack | " + " | ".join(head) + " | refused | clipped |")
        out.append("|---|---|" + "---:|" * (len(head) + 2))
        for defence in dict.fromkeys(r["defence"] for r in mine):
            for attack in dict.fromkeys(r["attack"] for r in mine if r["attack"] != "clean"):
                cells, refused, clipped = [], 0, 0
                for k in ks:
                    for f in fractions:
                        sel = [r for r in mine if r["defence"] == defence
                               and r["attack"] == attack and r["k"] == k and r["fraction"] == f]
                        if not sel:
                            cells.append("-")
                            continue
                        vals = [r["ratio-to-clean"] for r in sel]
                        cells.append(f"{min(vals):.3f} ({np.mean(vals):.3f})")
                        refused += sum(r["reports-refused"] for r in sel)
                        clipped += sum(r["values-clipped"] for r in sel)
                out.append(f"| {defence} | {attack} | " + " | ".join(cells)
                           + f" | {refused} | {clipped} |")
        out.append("")
        for chosen in CHOSEN.get(algorithm, ()):
            if not any(r["defence"] == chosen for r in mine):
                continue
            out.append(
                f"Worst over every attack (absent excluded) and seed, defence `{chosen}`:\n"
            )
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---:|" * len(head))
            cells = []
            for k in ks:
                for f in fractions:
                    vals = [r["ratio-to-clean"] for r in mine if r["defence"] == chosen
                            and r["attack"] not in ("clean", "absent")
                            and r["k"] == k and r["fraction"] == f]  # fmt: skip
                    cells.append(f"{min(vals):.3f}" if vals else "-")
            out.append("| " + " | ".join(cells) + " |")
            out.append("")
    return "\n".join(out)


#: the (K, d) of FedSM's honest runs with and without the history clamps (``--clamp-cost``)
CLAMP_COST_GRID = ((0.1, 0.1), (0.01, 0.1), (0.1, 0.4), (0.01, 0.4))
#: the runs compared: the paper's estimate, the default noise-aware clamp, the mean clamp
CLAMP_COST_RUNS = (("paper", "off"), ("noise-aware", "noise-aware"), ("clamp", "mean"))


def clamp_cost(inst: Instance, ks: list[int], seeds: list[int]) -> list[dict[str, Any]]:
    """Honest FedSM runs with and without the history clamps: F(S)/greedy per (K, d, k, seed)."""
    rows = []
    for big_k, d in CLAMP_COST_GRID:
        for k in ks:
            for seed in seeds:
                row: dict[str, Any] = {"K": big_k, "d": d, "k": k, "seed": seed}
                for key, clamp in CLAMP_COST_RUNS:
                    server = FedSMServer(inst.n, UniformMatroid(inst.m, k), k, big_k, d, seed=seed,
                                         history_clamp=clamp)  # fmt: skip
                    while not server.done:
                        users, t = server.sample_users(), len(server.selected) + 1
                        total = user_report_sum(
                            inst.objective, users, server.selected, server.round_d(), seed, t
                        )
                        server.select(total, users.size)
                    value = inst.objective.mean_value(list(server.selected))
                    row[key] = value / inst.greedy_values[k][-1]
                rows.append(row)
            mine = [r for r in rows if (r["K"], r["d"], r["k"]) == (big_k, d, k)]
            parts = [f"K={big_k} d={d} k={k}: paper {np.mean([r['paper'] for r in mine]):.4f}"]
            for key, _ in CLAMP_COST_RUNS[1:]:
                diff = [r[key] - r["paper"] for r in mine]
                parts.append(f"{key} {np.mean([r[key] for r in mine]):.4f} mean diff "
                             f"{np.mean(diff):+.4f} worst seed {min(diff):+.4f}")  # fmt: skip
            print("; ".join(parts), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run the grid and write the rows (JSON) and tables (Markdown)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algorithms", nargs="+", default=list(RUNNERS))
    ap.add_argument("--attacks", nargs="+", default=None, help="default: every one")
    ap.add_argument("--defences", nargs="+", default=None, help="default: every one")
    ap.add_argument("--fractions", nargs="+", type=float, default=[0.01, 0.05, 0.1, 0.2])
    ap.add_argument("--k", nargs="+", type=int, default=[10, 30])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--quick", action="store_true", help="k = 10, seed 0, b = 5 %%")
    ap.add_argument(
        "--clamp-cost", action="store_true",
        help="only FedSM's honest runs with and without the history clamps, over --k, --seeds "
        "and CLAMP_COST_GRID's (K, d); rows to --out.json",
    )
    ap.add_argument(
        "--margin", type=float, default=NOISE_AWARE_MARGIN,
        help="c of the noise-clamp defences (default: the app's, %(default)s)",
    )
    ap.add_argument(
        "--fedcg-rounds", type=int, default=FEDCG_ROUNDS,
        help="T of FedCG's runs (default %(default)s; the app's default fedcg-rounds is 100)",
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/robustness"))
    ap.add_argument(
        "--report", nargs="*", type=Path, default=None,
        help="only write --out's tables, from --out.json or from these JSON files (joined)",
    )
    args = ap.parse_args(argv)
    if args.report is not None:
        sources = args.report or [args.out.with_suffix(".json")]
        keyed = {}
        for src in sources:  # a cell measured twice (e.g. a clean run): the last one
            for row in json.loads(src.read_text()):
                cell = tuple(row[key] for key in CELL)
                keyed[cell] = row
        rows = list(keyed.values())
        args.out.with_suffix(".json").write_text(rows_json(rows))
        args.out.with_suffix(".md").write_text(markdown(rows, args.out.with_suffix(".json").name))
        return
    if args.quick:
        args.k, args.seeds, args.fractions = [10], [0], [0.05]
    MARGIN[0] = args.margin
    FEDCG_T[0] = args.fedcg_rounds
    inst = load_instance(args.k)
    if args.clamp_cost:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(rows_json(clamp_cost(inst, args.k, args.seeds)))
        return
    rows: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for algorithm in args.algorithms:
        defences = [d for d in DEFENCES[algorithm] if args.defences is None or d in args.defences]
        attacks = [a for a in ATTACKS[algorithm] if args.attacks is None or a in args.attacks]
        for k in args.k:
            greedy_value = inst.greedy_values[k][-1]
            for seed in args.seeds:
                for defence in defences:
                    clean = one_run(inst, algorithm, None, 0.0, k, seed, defence)
                    clean["ratio-to-greedy"] = clean["objective"] / greedy_value
                    clean["ratio-to-clean"] = 1.0
                    rows.append(clean)
                    for attack in attacks:
                        if attack == "absent" and defence == "commitment":
                            continue  # no profile to commit: the same as off
                        for fraction in args.fractions:
                            row = one_run(inst, algorithm, attack, fraction, k, seed, defence)
                            row["ratio-to-greedy"] = row["objective"] / greedy_value
                            row["ratio-to-clean"] = row["objective"] / clean["objective"]
                            rows.append(row)
                            print(
                                f"{algorithm:8s} k={k:2d} seed={seed} {defence:10s} "
                                f"{attack:13s} b={fraction:.2f} "
                                f"F/F_clean={row['ratio-to-clean']:.4f} "
                                f"refused={row['reports-refused']} "
                                f"clipped={row['values-clipped']} ({row['seconds']:.1f} s)",
                                flush=True,
                            )
    args.out.with_suffix(".json").write_text(rows_json(rows))
    args.out.with_suffix(".md").write_text(markdown(rows, args.out.with_suffix(".json").name))


if __name__ == "__main__":
    main()
