"""Verified rounding (``fedcg-rounding = "verified"``): the discrete greedy over the top of x.

The candidates' matroid (hypothesis: feasibility and containment of greedy rounding's set),
the runner on both engines (the same S, its rows after FedCG's), a resume during its
rounds, and a node whose users collude on one useless base in FedCG's rounds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fedcg_dropin import M, N, _grid, _objective, _user_app
from test_node_failures import _CrashingGrid, _whole_then_crashed

from direct import run_direct
from direct.fedcg import run_discrete_greedy_direct, run_fedcg_direct
from flower_app import checkpoint
from flower_app.algorithms.fedcg.continuous import FedCGServer, LocalSteps
from flower_app.algorithms.fedcg.discrete_greedy import DiscreteGreedyServer
from flower_app.config import AppConfig, ConfigError
from flower_app.problems import load_problem
from flower_app.results import CHECKPOINT
from flower_app.runners.fedcg import VERIFY_PHASE, server_run
from flower_app.strategies.discrete_greedy import FedDiscreteGreedyStrategy
from flower_app.strategies.fedcg import FedCGStrategy
from flower_app.strategies.submodular_records import report_arrays
from flower_app.submodular.matroids import PartitionMatroid, UniformMatroid
from flower_app.submodular.rounding import blocks_of, greedy_rounding, verification_matroid
from tests.support.local_grid import LocalGrid

SMALL = {
    "algorithm": "fedcg", "num-users": 40, "num-elements": 50, "k": 4, "seed": 5,
    "fedcg-rounds": 6, "clients-per-round": 0.5, "fedcg-rounding": "verified",
    "dgreedy-kappa": 4.0,
}  # fmt: skip


def _greedy(run: dict) -> dict:
    """``run`` with greedy rounding (and without the κ only verified rounding reads)."""
    return {**{k: v for k, v in run.items() if k != "dgreedy-kappa"}, "fedcg-rounding": "greedy"}


# ----------------------------------------------------------------- the candidates' matroid
@st.composite
def _point(draw) -> tuple[np.ndarray, object]:
    """A point of a uniform or partition matroid's polytope, with ties and zeros."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n = draw(st.integers(1, 40))
    if draw(st.booleans()):
        matroid = UniformMatroid(n, draw(st.integers(1, n)))
        blocks = [(np.arange(n), matroid.rank)]
    else:
        groups = rng.integers(0, draw(st.integers(1, 5)), n)
        caps = rng.integers(0, 4, int(groups.max()) + 1)
        matroid = PartitionMatroid(groups, caps)
        blocks = blocks_of(matroid)
    x = np.zeros(n)
    for elements, cap in blocks:
        values = rng.choice([0.0, 0.25, 0.5, 1.0], elements.size) * rng.random()
        if values.sum() > cap:
            values *= cap / values.sum()
        x[elements] = np.minimum(values, 1.0)
    return x, matroid


@settings(max_examples=150, deadline=None)
@given(_point(), st.integers(1, 4))
def test_the_candidates_matroid_keeps_the_rank_and_greedy_roundings_set(point, factor) -> None:
    """Same rank; a set independent in it is independent in the matroid; greedy rounding's
    set is one of its bases; in each block the open elements are the top factor·c by
    (−x, index)."""
    x, matroid = point
    verify = verification_matroid(x, matroid, factor)
    assert verify.rank == matroid.rank
    chosen = greedy_rounding(x, matroid)
    assert len(chosen) == verify.rank and verify.is_independent(chosen)
    blocks = blocks_of(matroid)
    assert verify.capacities.size == len(blocks) + 1 and verify.capacities[-1] == 0
    for b, (elements, cap) in enumerate(blocks):
        order = elements[np.lexsort((elements, -x[elements]))]
        expected = set(order[: factor * cap].tolist())
        assert set(np.flatnonzero(verify.groups == b).tolist()) == expected
        assert verify.capacities[b] == cap
    # any base of the candidates' matroid is independent in the original
    top = [int(e) for b, (_, cap) in enumerate(blocks)
           for e in np.flatnonzero(verify.groups == b)[::-1][:cap]]  # fmt: skip
    assert verify.is_independent(top) and matroid.is_independent(top)


def test_factor_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="factor=0"):
        verification_matroid(np.zeros(3), UniformMatroid(3, 1), 0)


def test_the_public_strategies_compose_into_verified_rounding() -> None:
    """What a ServerApp of your own does: FedCGStrategy, then FedDiscreteGreedyStrategy over
    the candidates' matroid of its x; the same S as the direct engine's x and greedy, and
    only candidates in it."""
    obj = _objective()
    app = _user_app(obj)
    matroid = UniformMatroid(M, 3)
    fedcg = FedCGStrategy(k=3, seed=7).start(_grid(app), num_rounds=4)
    verify = verification_matroid(fedcg.arrays["x"].numpy(), matroid)
    greedy = FedDiscreteGreedyStrategy(
        k=3, groups=verify.groups, capacities=verify.capacities.tolist(), kappa=2.0, seed=7
    )
    chosen = greedy.start(_grid(app), num_rounds=3).arrays["selected"].numpy().tolist()
    server = FedCGServer(N, matroid, 4, 0.0, LocalSteps(), 1.0, seed=7, rounding="greedy")
    run_fedcg_direct(obj, server)
    direct = DiscreteGreedyServer(N, verification_matroid(server.x, matroid), 3, 2.0, seed=7)
    assert chosen == run_discrete_greedy_direct(obj, direct)
    assert set(chosen) <= set(np.flatnonzero(verify.groups == 0).tolist())


# --------------------------------------------------------------------------- the runner
def _rows(summary: dict) -> list[dict]:
    text = (Path(summary["run-folder"]) / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize(("secure", "server_data"), [(False, "full"), (True, "full"),
                                                    (False, "none")])  # fmt: skip
def test_both_engines_choose_the_same_set_after_fedcgs_rounds(
    tmp_path, secure, server_data
) -> None:
    """3 in-process nodes (secure aggregation off and on; a server without the data) and
    the direct engine: the same S, chosen among the 2k elements of largest x; k rows of
    phase "verified-rounding" after FedCG's T, each naming its element; greedy rounding
    of the same x differs."""
    run = {**SMALL, "output-dir": str(tmp_path), "secure-aggregation": secure}
    flower_run = {**run, "server-data": server_data}
    flower = server_run(LocalGrid(3, flower_run), AppConfig.from_run_config(flower_run))
    direct = run_direct(AppConfig.from_run_config({**run, "run-name": "direct"}))
    assert flower["selected"] == direct["selected"]
    assert flower["objective"] == pytest.approx(direct["objective"])
    assert flower["rounding"] == "verified" and flower["rounds"] == 6 + 4
    for summary in (flower, direct):
        rows = _rows(summary)
        assert [r["server-round"] for r in rows if r["server-round"] > 0] == list(range(1, 11))
        verified = [r for r in rows if r.get("phase") == VERIFY_PHASE]
        assert [r["element"] for r in verified] == summary["selected"]
    plain = run_direct(
        AppConfig.from_run_config(_greedy({**run, "run-name": "greedy"}))
    )
    assert plain["multilinear"] == direct["multilinear"]  # the same x
    assert direct["objective"] >= plain["objective"]
    assert direct["selected"] != plain["selected"]  # this instance: verification changes S


def test_a_run_that_died_in_verification_resumes_to_the_same_set(tmp_path) -> None:
    """The ServerApp dies in verified rounding's second greedy round; FedCG's checkpoint
    (round T) stays, and the resumed run redoes no FedCG round, redoes the verification
    and ends with the uninterrupted run's S and rows."""
    base = {**SMALL, "clients-per-round": 1.0, "output-dir": str(tmp_path)}
    # train exchanges: FedCG's 6 rounds, the histogram, the importance factors, then greedy
    runner, nodes, whole, cfg, folder = _whole_then_crashed(
        base, lambda nodes, cfg: _CrashingGrid(nodes, cfg, 6 + 2 + 2)
    )
    assert checkpoint.read_checkpoint(folder / CHECKPOINT)["server-round"] == 6
    grid = _CrashingGrid(nodes, {**cfg, "resume": True}, 99)
    resumed = runner.server_run(grid, AppConfig.from_run_config({**cfg, "resume": True}))
    assert resumed["resumed-from-round"] == 6
    assert grid.trains == 2 + 4  # the verification only
    assert resumed["selected"] == whole["selected"]
    rows = _rows(resumed)
    assert [r["server-round"] for r in rows if r["server-round"] > 0] == list(range(1, 11))
    assert [r["element"] for r in rows if "element" in r] == whole["selected"]


def test_what_verified_rounding_would_leave_unused_is_refused(tmp_path) -> None:
    """A rounding for ``fed-discrete-greedy`` (no x to round), a κ for FedCG without
    verified rounding, and an unknown rounding are refused by name before anything runs."""
    with pytest.raises(ConfigError, match="'fedcg-rounding' = 'verified'.*would ignore it"):
        AppConfig.from_run_config({**SMALL, "algorithm": "fed-discrete-greedy",
                                   "clients-per-round": 1.0})  # fmt: skip
    with pytest.raises(ConfigError, match="'dgreedy-kappa' = 4.0.*now 'greedy'"):
        AppConfig.from_run_config({**SMALL, "fedcg-rounding": "greedy"})
    with pytest.raises(ConfigError, match="verified"):
        AppConfig.from_run_config({**SMALL, "fedcg-rounding": "verify"})
    assert AppConfig.from_run_config({**SMALL, "algorithm": "fedcg-plus"}).k == 4


# ------------------------------------------------------------------------- the attack
def _colluding_node(useless: np.ndarray, k: int):
    """Node 0's users all send the same base (the k elements nobody values) in every FedCG
    round: the most its mass check lets through; in the verification they answer from
    their real values (a node that lies there is bounded per round, not across rounds)."""

    def tamper(msg: Message, reply: Message) -> Message:
        if msg.metadata.dst_node_id != 1000 or msg.metadata.message_type != "train.direction":
            return reply
        record = reply.content.array_records["arrays"]
        parts = report_arrays(record)  # [values] or [ids, values], positional
        users = float(parts[-1].sum()) / k
        lie = np.full(useless.size, users, dtype=parts[-1].dtype)
        if len(parts) == 2:
            arrays = [useless.astype(parts[0].dtype), lie]
        else:
            arrays = [np.zeros_like(parts[0])]
            arrays[0][useless] = lie
        out = ArrayRecord({str(i): Array(a) for i, a in enumerate(arrays)})
        content = RecordDict({"arrays": out, **dict(reply.content.metric_records.items())})
        return Message(content, reply_to=msg)

    return tamper


def test_colluders_take_greedy_roundings_set_but_not_the_verified_one(tmp_path) -> None:
    """A third of the users (one node of three) send a base of the k least valued elements
    in every round: greedy rounding takes some of them and loses value against the clean
    run; verified rounding keeps at least the clean greedy rounding's F(S)."""
    base = {**SMALL, "clients-per-round": 1.0, "output-dir": str(tmp_path)}
    problem = load_problem(AppConfig.from_run_config(base))
    worth = np.asarray(problem.objective.values.sum(axis=0)).ravel()
    useless = np.argsort(worth, kind="stable")[: base["k"]]
    results = {}
    for rounding in ("greedy", "verified"):
        for attacked in (False, True):
            run = {**base, "fedcg-rounding": rounding, "run-name": f"{rounding}-{attacked}"}
            run = _greedy(run) if rounding == "greedy" else run
            grid = LocalGrid(3, run)
            if attacked:
                grid.tamper = _colluding_node(useless, base["k"])
            results[rounding, attacked] = server_run(grid, AppConfig.from_run_config(run))
    assert set(results["greedy", True]["selected"]) & set(useless.tolist())
    assert results["greedy", True]["multilinear"] < results["greedy", False]["multilinear"]
    clean = results["greedy", False]["objective"]
    assert results["greedy", True]["objective"] < clean
    assert results["verified", True]["objective"] >= clean
    assert results["verified", False]["objective"] >= clean
