"""FedCG's direct engine: FedCG (Alg. 1), FedCG+ (Alg. 2) and the discrete greedy (Algs. 3-5).

:func:`run_fedcg_direct` and :func:`run_discrete_greedy_direct` run the servers of
:mod:`flower_app.algorithms.fedcg` with their users' reports computed in the same process,
one "node" holding every user: the same server steps, user streams and rounding as the
Flower strategies, so both engines give the same x and S for the same seed.
:func:`direct_run` is the runner's direct side (:mod:`flower_app.runners.fedcg` holds what
both engines share).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from direct.rounds import DirectRounds
from flower_app.algorithms.fedcg.continuous import (
    FedCGRound,
    FedCGServer,
    UserEntries,
    user_direction_sum,
)
from flower_app.algorithms.fedcg.discrete_greedy import (
    DiscreteGreedyRound,
    DiscreteGreedyServer,
    discrete_report_sum,
    histogram_sum,
    importance_factors,
    participation_probabilities,
)
from flower_app.algorithms.robust.profiles import commit_profiles
from flower_app.config import AppConfig
from flower_app.runners.fedcg import (
    VERIFIED,
    _continuous_extra,
    _discrete_extra,
    _finish,
    _multilinear,
    _open,
    _server,
    verification_server,
    verify_rows,
)
from flower_app.submodular.objectives import MaxRowObjective

__all__ = ["direct_run", "run_discrete_greedy_direct", "run_fedcg_direct"]


def run_fedcg_direct(
    objective: MaxRowObjective,
    server: FedCGServer,
    on_round: Callable[[FedCGRound, np.ndarray], Any] | None = None,
) -> list[int]:
    """Run FedCG / FedCG+ in one process (the direct engine) and round the result.

    Parameters
    ----------
    objective : MaxRowObjective
        All users' rows.
    server : FedCGServer
        Fresh server state.
    on_round : callable, optional
        Called after each round with the record and the new x.

    Returns
    -------
    list of int
        The rounded set S.
    """
    cache: dict[bytes, UserEntries] = {}
    while not server.done:
        users, weights = server.sample()
        key = users.tobytes()
        if key not in cache:
            cache.clear()
            cache[key] = UserEntries.build(objective, users)
        total, sent = user_direction_sum(
            objective, users, weights, server.x, server.matroid, server.local,
            server.seed, server.t + 1, entries=cache[key],
        )  # fmt: skip
        record = server.step(total, float(weights.sum()), users.size, sent)
        if on_round is not None:
            on_round(record, server.x)
    return server.round_solution()


def run_discrete_greedy_direct(
    objective: MaxRowObjective,
    server: DiscreteGreedyServer,
    on_round: Callable[[DiscreteGreedyRound, float], None] | None = None,
    oracle: MaxRowObjective | None = None,
) -> list[int]:
    """Run Algs. 4/5 then Alg. 3 in one process (the direct engine).

    Parameters
    ----------
    objective : MaxRowObjective
        All users' rows (the profiles their reports are computed from).
    server : DiscreteGreedyServer
        Fresh server state.
    on_round : callable, optional
        Called after each round with the record and the true F(S).
    oracle : MaxRowObjective, optional
        The rows F(S) is computed on (default ``objective``).

    Returns
    -------
    list of int
        The selected set in order.
    """
    ids = np.arange(objective.n_users, dtype=np.int64)
    server.set_histogram(histogram_sum(objective))
    w = importance_factors(objective, server.histogram)
    kappa_i = participation_probabilities(w, server.kappa)
    server.expected = float(kappa_i.sum())
    truth = objective if oracle is None else oracle
    current = np.zeros(truth.n_users)
    while not server.done:
        t = len(server.selected) + 1
        node = discrete_report_sum(
            objective, server.selected, server.matroid, kappa_i, server.seed, t, ids
        )
        total, participants, _ = server.accept([node])  # the one in-process node
        record = server.select(total, participants)
        current = truth.update_current(current, record.element)
        if on_round is not None:
            on_round(record, float(current.sum()) / max(truth.n_users, 1))
    return list(server.selected)


def direct_run(cfg: AppConfig, progress: bool = False) -> dict[str, Any]:
    """Run the configured algorithm on the direct engine and write the run folder."""
    exp = _open(cfg, "direct")
    server = _server(cfg, exp.problem, exp.matroid)
    total = server.k if isinstance(server, DiscreteGreedyServer) else server.rounds
    if cfg.get("fedcg-rounding") == VERIFIED and not isinstance(server, DiscreteGreedyServer):
        total += server.matroid.rank
    desc = f"{cfg.algorithm} {cfg.dataset} seed {cfg.seed}"
    rounds = DirectRounds(exp.writer, progress, desc, total)
    log_row = rounds.log
    value = _multilinear(exp)

    def on_continuous(rnd: FedCGRound, x: np.ndarray) -> None:
        log_row(
            {
                "server-round": rnd.server_round,
                "users": rnd.users,
                "draws": rnd.draws,
                "weight": rnd.weight,
                "ids-sent": rnd.ids_sent,
                "step-mass": rnd.step_norm,
                # F̂(x) costs a sort of all entries: every 10th round and the last one
                **(
                    {"multilinear": value(x)}
                    if rnd.server_round % 10 == 0 or rnd.server_round == server.rounds
                    else {}
                ),
            }
        )

    def discrete_row(rnd: DiscreteGreedyRound, objective: float) -> dict[str, Any]:
        return {
            "server-round": rnd.server_round,
            "element": rnd.element,
            "estimate": rnd.estimate,
            "objective": objective,
            "participants": rnd.participants,
            "users": rnd.participants,
            "expected-participants": rnd.expected,
            **rnd.checks,
        }

    def on_discrete(rnd: DiscreteGreedyRound, objective: float) -> None:
        log_row(discrete_row(rnd, objective))

    if isinstance(server, DiscreteGreedyServer):
        # the one in-process node computes every report from the profiles committed at setup
        committed, clipped = commit_profiles(exp.problem.objective, server.report_bound or 0.0)
        selected = run_discrete_greedy_direct(
            committed, server, on_discrete, oracle=exp.problem.objective
        )
        extra = {**_discrete_extra(server), "profile-values-clipped": clipped}
    else:
        selected = run_fedcg_direct(exp.problem.objective, server, on_continuous)
        extra = _continuous_extra(server, exp)
        verify = verification_server(cfg, exp.problem, server)
        if verify is not None:  # verified rounding: the discrete greedy over the top of x
            committed, _ = commit_profiles(exp.problem.objective, verify.report_bound or 0.0)
            log_verify = verify_rows(rounds.log, server.rounds)
            selected = run_discrete_greedy_direct(
                committed, verify, lambda rnd, obj: log_verify(discrete_row(rnd, obj)),
                oracle=exp.problem.objective,
            )  # fmt: skip
    rounds.close()
    return _finish(exp, selected, rounds.history, extra)
