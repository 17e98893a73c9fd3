"""FedSubAvg's direct engine on the torch tasks (Sent140 LSTM, Amazon DIN): one process.

:func:`run_torch_direct` runs the plain-mode rounds of
:mod:`flower_app.algorithms.fedsubavg.torch_engine` (counting query, K clients sampled by
``random.Random(seed)`` over clients by partition id, their local training, the server's
step by row in client order, the full model evaluated centrally) with that module's pieces,
as :func:`~flower_app.runners.fedsubavg_torch.run_torch_strategy` runs them over a Flower
Grid: same clients, same batches, same float order. :func:`direct_run` is the runner's
direct side (:mod:`flower_app.runners.fedsubavg_torch` holds what both engines share).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from direct.rounds import DirectRounds
from flower_app.algorithms.fedsubavg.core import (
    make_server_update,
    merge_updates,
    resolve_clients_per_round,
)
from flower_app.algorithms.fedsubavg.named import named_heat
from flower_app.algorithms.fedsubavg.torch_engine import (
    TorchRunRows,
    TorchRunSpec,
    load_values,
    local_train,
    model_values,
    run_torch_central,
)
from flower_app.algorithms.fedsubavg.torch_tasks import TorchSubmodelTask
from flower_app.config import AppConfig
from flower_app.runners.fedsubavg_torch import _finish, _open

__all__ = ["direct_run", "run_torch_direct", "sample_clients"]


def sample_clients(rng: random.Random, n_clients: int, k: int) -> list[int]:
    """Return the strategy's plain-mode sample: ``rng.sample`` over clients by partition."""
    return sorted(rng.sample(range(n_clients), k))


def run_torch_direct(
    task: TorchSubmodelTask,
    spec: TorchRunSpec,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run FedSubAvg or a baseline on a torch task in one process; return one row per round.

    Each row: ``server-round``, ``local-train-loss`` (the sampled clients' mean loss over
    their local steps, weighted by ``num-examples`` as the strategy averages it),
    ``clients``, ``bytes-down``/``bytes-up`` (the submodels' payload) and, on evaluated
    rounds, the task's metrics (``train-loss`` on the fixed sample, ``test-loss``,
    ``test-accuracy`` or ``test-auc``). Row 0 evaluates the initial model.
    """
    if spec.algorithm == "central-sgd":
        return run_torch_central(task, spec, on_round)
    k = resolve_clients_per_round(spec.clients_per_round, task.n_clients)
    run = TorchRunRows(task, spec, on_round)
    layout, x = run.layout, run.x0
    rows_of = [task.client_rows(c) for c in range(task.n_clients)]
    heat = named_heat(layout, [(rows_of[c], task.n_train(c)) for c in range(task.n_clients)])
    server = make_server_update(spec.algorithm, x.size, task.n_clients, heat=heat,
                                weighting=spec.weighting, adam=spec.adam)  # fmt: skip
    rng = random.Random(spec.seed)
    local = spec.local
    if spec.algorithm == "fedprox-sub" and local.proximal_mu == 0:
        raise ValueError("fedprox-sub needs local.proximal_mu > 0 (the paper's 0.01)")
    keys = list(layout.keys)
    for t in range(1, spec.rounds + 1):
        start = time.perf_counter()
        parts, losses, down, up = [], [], 0, 0
        for c in sample_clients(rng, task.n_clients, k):
            sent = layout.gather(x, rows_of[c])
            load_values(run.model, sent, rows_of[c])
            loss = local_train(task, run.model, c, local, spec.seed, t)
            losses.append((loss, task.n_train(c)))
            received = model_values(run.model, rows_of[c], keys)
            weight = 1.0 if spec.weighting == "clients" else float(task.n_train(c))
            parts.append(layout.update(sent, received, rows_of[c], weight))
            nbytes = sum(v.nbytes for v in sent.values())
            nbytes += sum(r.nbytes for r in rows_of[c].values())
            down, up = down + nbytes, up + nbytes
        update = merge_updates(parts)
        server.step(x, update, t)
        total = sum(n for _, n in losses)
        row = {
            "server-round": t,
            "local-train-loss": sum(v * n for v, n in losses) / max(total, 1),
            "clients": update.clients,
            "bytes-down": down,
            "bytes-up": up,
            "round-time": time.perf_counter() - start,
        }
        run.add(t, x, row)
    return run.history


def direct_run(cfg: AppConfig, progress: bool = False) -> dict[str, Any]:
    """Run a torch task on the direct engine and write the run folder."""
    started = time.perf_counter()
    spec, task, writer, k = _open(cfg, "direct")
    desc = f"{cfg.algorithm} seed {cfg.seed}"  # the rows: round 0 (x0), then every round
    rounds = DirectRounds(writer, progress, desc, spec.rounds + 1, timed=False)
    history = run_torch_direct(task, spec, rounds.log)
    rounds.close()
    return _finish(cfg, spec, task, writer, k, history, "direct", started)
