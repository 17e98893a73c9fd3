"""Shared fixtures: real `flwr run`s against SuperLinks this test session owns."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

# torch picks its CPU kernels (AVX-512, AVX2, ...) by the machine; sums in another order change
# the last bits of a model, and the pinned model digests were recorded with AVX2 kernels. Every
# process of the test session (flwr run, its Ray actors, SuperNodes) inherits this setting, so
# the pins hold on AVX2 and AVX-512 machines alike (README "Reproducibility"). torch's matrix
# products go through MKL, which dispatches (and blocks its sums) by the processor model on its
# own: MKL_CBWR=AVX2,STRICT asks it for the AVX2 code path with a fixed summation order (without
# it, an AVX-512 machine with avx512_fp16 gave other MaxFL digests than the one before it).
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
os.environ.setdefault("MKL_CBWR", "AVX2,STRICT")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from flower_app.simulation import FlwrRun, LocalSimulation  # noqa: E402

# the nodes' binary data caches of this test session (and of the SuperNodes it starts) stay
# out of the user's ~/.cache
os.environ.setdefault("FLOWER_APP_CACHE", tempfile.mkdtemp(prefix="flower-app-cache-"))

# no per-example deadline: a test asserts behaviour, never timing (the machine may be busy)
settings.register_profile("flower_app", deadline=None)
settings.load_profile("flower_app")

BIN = Path(sys.executable).parent  # flower-superlink / flower-supernode of this environment
FlowerCLI = LocalSimulation


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Deployment:
    """A real SuperLink and SuperNodes (deployment mode, no simulation) on loopback."""

    def __init__(self, root: Path, num_nodes: int, node_config=None) -> None:
        """``node_config(p)``: node p's ``--node-config`` string (default: its partition)."""
        self.root = root
        self.port = _free_port()
        self.procs: list[subprocess.Popen] = []
        home = root / "home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self.cli = FlowerCLI(home, root / "runs")
        self.cli.env.pop("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT")
        self._start(
            "superlink", [str(BIN / "flower-superlink"), "--insecure", "--port", str(self.port)]
        )
        for p in range(num_nodes):
            node_home = root / f"node-{p}"
            node_home.mkdir()
            self._start(
                f"supernode-{p}",
                [
                    str(BIN / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(_free_port()),
                    "--node-config",
                    (
                        f"partition-id={p} num-partitions={num_nodes}"
                        if node_config is None
                        else node_config(p)
                    ),
                ],
                FLWR_HOME=str(node_home),
            )

    def _start(self, name: str, cmd: list[str], **env: str) -> None:
        log = (self.root / f"{name}.log").open("w")
        self.procs.append(
            subprocess.Popen(
                cmd,
                env={**self.cli.env, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        time.sleep(1.0)

    def run(self, run_config: dict, timeout: float = 600) -> FlwrRun:
        return self.cli.run(run_config, num_supernodes=None, timeout=timeout)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    dep = Deployment(tmp_path_factory.mktemp("deployment"), num_nodes=3)
    try:
        yield dep
    finally:
        dep.stop()


@pytest.fixture(scope="session")
def flower_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerCLI]:
    cli = FlowerCLI(tmp_path_factory.mktemp("flwr-home"), tmp_path_factory.mktemp("runs"))
    try:
        yield cli
    finally:
        cli.stop()


#: pyproject's ``addopts`` marker expression (keep in sync with ``[tool.pytest.ini_options]``)
DEFAULT_MARKEXPR = "not realdata and not slow and not deploy and not long"

#: ``flwr run`` tests of 33-76 s each on the 2-core CI machine (idle, 2026-11) that repeat a
#: path the default suite already runs once per strategy family (FedSM: the node-split test
#: with 2 nodes, Algorithm 2, the top-k example; FedCG: the first config; MaxFL and FedSubAvg
#: (linear and LSTM): their engine-equality tests). Marked ``long``: off by default so that
#: the default suite stays under 8 minutes, on in CI (FLOWER_APP_REALDATA=1).
LONG_TESTS = frozenset(
    {
        "test_cli.py::test_run_exits_honestly_and_stop_stops_only_its_own_superlink",
        "test_flower_engine.py::test_real_superlink_and_supernodes_on_loopback",
        "test_flower_engine.py::test_flwr_run_on_20_supernodes_writes_run_folder",
        "test_flower_engine.py::test_same_set_whatever_the_split_of_users_over_nodes[16]",
        "test_flower_engine.py::test_same_set_whatever_the_split_of_users_over_nodes[40]",
        "test_fedsm_modes_flower.py::test_flower_and_direct_engines_agree[amplified-alg1-exact]",
        "test_fedsm_modes_flower.py::test_flower_and_direct_engines_agree[amplified-alg2-sampled]",
        "test_fedsm_sampling.py::test_flwr_run_with_batched_draws_gives_the_direct_engines_set",
        "test_fedcg_flower.py::test_flwr_run_gives_the_direct_engine_result[config1-7]",
        "test_fedcg_flower.py::test_flwr_run_gives_the_direct_engine_result[config2-5]",
        "test_fedsubavg_torch.py::test_flwr_run_equals_the_direct_engine[amazon]",
        "test_fedsubavg_flwr.py::test_flwr_run_with_k_above_n_fails_before_round_1",
        "test_examples_fedsubavg.py::test_recsys_example_runs_with_flwr_run_and_the_loss_goes_down",
        "test_own_data.py::test_flwr_run_on_your_own_table",
        "test_own_data_learning.py::test_flwr_run_on_your_own_rating_table",
        "test_own_data_learning.py::test_flwr_run_on_your_own_images",
        "test_secure_aggregation.py::test_flwr_run_with_secure_aggregation_selects_the_plain_set",
        "test_ray_cluster.py::test_run_attached_to_a_two_raylet_cluster_uses_both_raylets",
    }
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests in :data:`LONG_TESTS` ``long`` (before ``-m`` selects)."""
    found = set()
    for item in items:
        key = f"{item.path.name}::{item.name}"
        if key in LONG_TESTS:
            item.add_marker(pytest.mark.long)
            found.add(key)
    if len(items) > 800 and found != LONG_TESTS:  # a whole-suite run: every name must exist
        raise pytest.UsageError(f"LONG_TESTS names tests that do not exist: {LONG_TESTS - found}")


def pytest_configure(config: pytest.Config) -> None:
    """With FLOWER_APP_REALDATA=1 (CI), also run the tests marked ``realdata``, ``deploy``
    and ``long``."""
    if os.environ.get("FLOWER_APP_REALDATA") == "1" and config.option.markexpr == DEFAULT_MARKEXPR:
        config.option.markexpr = "not slow"
