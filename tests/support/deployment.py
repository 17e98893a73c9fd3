"""Deployment fixtures: real SuperLinks and SuperNodes, started by the
repository's rehearsal/.

* ``rehearsal`` (session): the edge-device rehearsal the ``deploy`` tests share — a TLS +
  node-authentication SuperLink with a database and 3 SuperNodes, each in its own network
  namespace with the memory and CPU limits of :data:`~rehearsal.rehearsal.EDGE_DEVICE`
  (loopback and no limits where the machine has neither, said once on stderr), each with its
  secure-aggregation identity and the federation's trusted identities (endorsed keys, the
  default). A test gives the nodes their data with ``rehearsal.provision(node_export(...),
  ext)`` (a no-op when they already hold it), so tests on the same data share the running
  nodes.
* ``rehearsal_pair`` (session): the same with 2 SuperNodes, for the runs on the nodes'
  real-data files (none aggregates securely) and the failure drills; on another test worker
  than ``rehearsal`` (``tests/conftest.py``, ``SHARED``), or beside it in one process
  (``-n 0``: each rehearsal's namespaces and cgroups have names of their own).
* ``node_export`` (session): ``node_export(dataset, nodes=3, **options) -> folder`` of
  ``python -m flower_app.export`` for ``nodes`` nodes, made once per session.
* ``deployment`` (module): an insecure SuperLink and 2 SuperNodes on loopback (no TLS, no
  authentication), for ``test_flower_engine.py``.

Everything is stopped by process group (and every namespace and cgroup removed) when the
session ends, however it ends: each process also gets SIGTERM if the test process dies
(``setpriv --pdeathsig``), and Flower's own ``--parent-pid`` takes its children with it.
While the session runs, each rehearsal's supervisor reaps a process that dies and stops what
it left (:mod:`rehearsal.supervisor`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flower_app.export import main as export_main
from flower_app.simulation import FlwrRun, LocalSimulation
from rehearsal import SecureFederation
from rehearsal.processes import (
    ManagedProcess,
    flwr_env,
    free_port,
    start_process,
    superlink_command,
    supernode_command,
    wait_for_listen,
    write_connection,
)
from rehearsal.rehearsal import EDGE_DEVICE, Rehearsal

#: SuperNodes of the shared rehearsal: 3, the fewest SecAgg+ accepts (a 2-node sum would
#: reveal each node's update to the other). Every node costs a ClientApp process per
#: message (Flower's import alone ~2.5 CPU-s, ~6 with torch on this 2-core machine): with
#: 4 nodes the deploy tests were most of CI's CPU
REHEARSAL_NODES = 3
#: SuperNodes of the second rehearsal, ``rehearsal_pair``: the runs on the nodes' real-data
#: files (MovieLens-1M: node failures, the SuperLink killed, FedSubAvg; Fashion-MNIST: MaxFL),
#: none of which aggregates securely: two nodes are a federation, and a third only adds its
#: ClientApp processes (a third of these tests' CPU)
PAIR_NODES = 2


def data_root() -> Path:
    """``$FLOWER_APP_DATA`` (fails the test with how to set it when absent)."""
    root = Path(os.environ.get("FLOWER_APP_DATA", ""))
    if not os.environ.get("FLOWER_APP_DATA") or not (root / "ml-1m" / "ratings.dat").is_file():
        pytest.fail("set FLOWER_APP_DATA to a folder holding ml-1m/ and fashion-mnist/")
    return root


def _rehearsal(tmp_path_factory: pytest.TempPathFactory, nodes: int) -> Iterator[Rehearsal]:
    reh = Rehearsal(tmp_path_factory.mktemp(f"rehearsal-{nodes}"), nodes, EDGE_DEVICE)
    try:
        reh.start(nodes=False)
        yield reh
    finally:
        reh.stop()


@pytest.fixture(scope="session")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    """The shared edge-device rehearsal (3 nodes); nodes start on the first provision."""
    yield from _rehearsal(tmp_path_factory, REHEARSAL_NODES)


@pytest.fixture(scope="session")
def rehearsal_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    """The second rehearsal (2 nodes, :data:`PAIR_NODES`), for the runs on real-data files."""
    yield from _rehearsal(tmp_path_factory, PAIR_NODES)


@pytest.fixture(scope="session")
def node_export(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``node_export(dataset, nodes=3, **options)``: the dataset exported for ``nodes``
    nodes (a rehearsal's :attr:`~rehearsal.rehearsal.Rehearsal.nodes`)."""
    root = tmp_path_factory.mktemp("exports")
    made: dict[tuple, Path] = {}

    def make(dataset: str, nodes: int = REHEARSAL_NODES, **options: Any) -> Path:
        key = (dataset, nodes, tuple(sorted(options.items())))
        if key not in made:
            folder = root / f"{dataset}-{len(made)}"
            args = ["--dataset", dataset, "--num-partitions", str(nodes)]
            for name, value in options.items():
                args += [f"--{name}", str(value)]
            assert export_main([*args, "--out", str(folder)]) == 0
            made[key] = folder
        return made[key]

    return make


def rows(folder: Path) -> list[dict]:
    """The complete rows of a run folder's ``metrics.jsonl`` so far."""
    path = folder / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


class BackgroundRun:
    """``federation.run(config)`` in a thread (a test kills things meanwhile).

    Attributes
    ----------
    folder : pathlib.Path
        The run folder (on the SuperLink's machine).
    run : FlwrRun or None
        The outcome, once the thread ended without an exception.
    error : BaseException or None
        What the thread raised (e.g. the SuperLink was killed under ``flwr run``).
    """

    def __init__(self, federation: SecureFederation, config: dict, timeout: float = 1800) -> None:
        self.folder = federation.cli.output_dir / config["run-name"]
        self.run: FlwrRun | None = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.run = federation.run(config, timeout=timeout)
            except BaseException as err:  # noqa: BLE001 - reported by the test
                self.error = err

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def wait_for_round(self, server_round: int, timeout: float = 900) -> None:
        """Wait until ``server_round`` has a row; fail at once (with the log) if the run ended."""
        deadline = time.monotonic() + timeout
        while not any(r.get("server-round", 0) >= server_round for r in rows(self.folder)):
            if not self.thread.is_alive():
                log = self.error or (self.run and f"{self.run.status}\n{self.run.output[-4000:]}")
                pytest.fail(f"the run ended before round {server_round} did:\n{log}")
            if time.monotonic() > deadline:
                pytest.fail(f"round {server_round} did not end in {timeout} s")
            time.sleep(0.1)

    def wait_for_loss(self, node_id: int, timeout: float = 900) -> int:
        """Wait until a round records ``node_id`` in its ``failed-nodes``; return that round.

        Read from the run folder in this process: for a SIGKILLed node this is the moment
        the SuperLink gave up on it (its ``Node Unavailable`` error, once it lists the node
        offline), without a ``flwr supernode ls`` process (~1.5 CPU-s) every 2 s meanwhile.
        """
        deadline = time.monotonic() + timeout
        while True:
            for r in rows(self.folder):
                if node_id in {f.get("node-id") for f in r.get("failed-nodes", [])}:
                    return int(r["server-round"])
            if not self.thread.is_alive():
                pytest.fail(f"the run ended without losing node {node_id}")
            if time.monotonic() > deadline:
                pytest.fail(f"no round lost node {node_id} in {timeout} s")
            time.sleep(0.2)

    def result(self, timeout: float = 1800) -> FlwrRun:
        """Wait for the run and return it (fails with the thread's exception)."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the run did not end in {timeout} s"
        if self.run is None:
            pytest.fail(f"flwr run raised: {self.error!r}")
        return self.run


class Deployment:
    """An insecure SuperLink and SuperNodes on loopback (deployment mode, no simulation).

    Parameters
    ----------
    root : pathlib.Path
        Working folder.
    num_nodes : int
        SuperNodes.
    node_config : callable, optional
        ``node_config(p)``: node p's ``--node-config`` entries, a mapping or the string as
        typed (default: its partition).
    """

    def __init__(self, root: Path, num_nodes: int, node_config=None) -> None:
        self.root = root
        self.port = free_port()
        self.cli = LocalSimulation(root / "home", root / "runs")
        self.cli.env.pop("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT")
        write_connection(self.cli.home, "loopback", f"127.0.0.1:{self.port}", None)
        self.procs: list[ManagedProcess] = []
        cmd = superlink_command(None, None, self.port, node_auth=False)
        env = flwr_env(root / "superlink-home")
        self.procs.append(start_process("superlink", cmd, root, env, die_with_parent=True))
        wait_for_listen(self.procs[0], self.port)
        for p in range(num_nodes):
            config = node_config(p) if node_config else {"partition-id": p, "num-partitions": num_nodes}  # noqa: E501
            raw = config if isinstance(config, str) else None  # a --node-config string as is
            cmd = supernode_command(
                f"127.0.0.1:{self.port}", None, None, {} if raw else config, free_port()
            )
            if raw is not None:
                cmd[cmd.index("--node-config") + 1] = raw
            env = flwr_env(root / f"node-{p}")
            self.procs.append(
                start_process(f"supernode-{p}", cmd, root, env, die_with_parent=True)
            )

    def run(self, run_config: dict, timeout: float = 600) -> FlwrRun:
        """``flwr run . loopback`` (the ServerApp waits for the nodes' cohorts)."""
        return self.cli.run(run_config, num_supernodes=None, timeout=timeout)

    def stop(self) -> None:
        """Stop the SuperNodes, then the SuperLink (each by its process group)."""
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """An insecure SuperLink and 2 SuperNodes on loopback."""
    dep = Deployment(tmp_path_factory.mktemp("deployment"), num_nodes=2)
    try:
        yield dep
    finally:
        dep.stop()


__all__ = [
    "PAIR_NODES",
    "REHEARSAL_NODES",
    "BackgroundRun",
    "rows",
    "Deployment",
    "SecureFederation",
    "data_root",
    "deployment",
    "node_export",
    "rehearsal",
    "rehearsal_pair",
]
