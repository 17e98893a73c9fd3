"""Shared fixtures: Flower runs on a runtime this test session starts once, real `flwr run`s
against SuperLinks it owns, and a sweep of every process it started, however it ends.

- ``flower_cli``: ``flower_cli.run(run_config, num_supernodes=...)`` runs the app on Flower's
  simulation engine in this process (:class:`tests.support.inprocess_simulation.
  InProcessSimulation`), its ClientApps in actors of one Ray head per test process
  (``ray_head``, started on first use): no ``flwr`` CLI, SuperLink or Ray start-up per run.
  For the tests that check a strategy, a runner or a ClientApp through Flower.
- ``flwr_cli``: the real ``flwr run . --stream`` against a local SuperLink of this session
  (:class:`flower_app.simulation.LocalSimulation`; ~30 s of start-up per run). Only for tests
  that check the ``flwr run`` command itself; each says why in its docstring.
- Every process started here carries ``FLOWER_APP_PROCESS_TOKEN`` (unique to this pytest run)
  in its environment; a watchdog (:mod:`tests.support.process_sweep`) stops whatever still
  carries it once pytest has exited, however it exited (``tests/test_no_survivors.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
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
# One BLAS/OpenMP thread per process. The test run has two xdist workers on two cores, and
# the Ray actors, SuperLinks and SuperNodes it starts beside them: a second OpenMP (torch),
# MKL or OpenBLAS (numpy, scipy) thread per process only adds threads that spin-wait for
# each other while the other processes hold the cores. Measured on the 2-core machine at load
# 7: tests/test_models_sparse_tasks.py took 105 s and 49 s of CPU with torch's default 2
# threads, 17 s and 11 s with 1. The package's reproducible computations run on one thread
# already (flower_app.algorithms.learning.single_thread; Ray gives each actor 1), so the
# pinned numbers are the same; every process the tests start inherits the setting.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from flower_app.simulation import LocalSimulation  # noqa: E402
from tests.support import process_sweep  # noqa: E402
from tests.support.inprocess_simulation import InProcessSimulation  # noqa: E402
from tests.support.ray_cluster import LoopbackRayCluster  # noqa: E402

#: set by the process that starts the test run (xdist workers inherit it): the PID the
#: watchdog outlives
OWNER_VAR = "FLOWER_APP_PROCESS_OWNER"
#: optional: where the watchdog writes the survivors it stopped
REPORT_VAR = "FLOWER_APP_SWEEP_REPORT"

# the nodes' binary data caches of this test session (and of the SuperNodes it starts) stay
# out of the user's ~/.cache (the watchdog deletes the folder when the run has ended)
_OWN_CACHE = "FLOWER_APP_CACHE" not in os.environ
os.environ.setdefault("FLOWER_APP_CACHE", tempfile.mkdtemp(prefix="flower-app-cache-"))

# no per-example deadline: a test asserts behaviour, never timing (the machine may be busy)
settings.register_profile("flower_app", deadline=None)
settings.load_profile("flower_app")

BIN = Path(sys.executable).parent  # flower-superlink / flower-supernode of this environment
FlowerCLI = LocalSimulation


# the deployment fixtures (the shared edge-device rehearsal, exports, loopback deployment)
from tests.support.deployment import (  # noqa: E402, F401
    Deployment,
    deployment,
    node_export,
    rehearsal,
    rehearsal_pair,
)


def _ray_prefix() -> str:
    """Name prefix of this run's scratch folders in /tmp (its Ray heads', the Ray temp dir of
    its ``flwr run`` simulations, the scheduler's groups file): the watchdog stops the
    processes holding files open in them (:func:`tests.support.process_sweep.run_processes`)
    and deletes them when the run has ended."""
    return Path(process_sweep.scratch_prefix(os.environ[process_sweep.TOKEN_VAR])).name[:-1]


@pytest.fixture(scope="session")
def ray_head() -> Iterator[LoopbackRayCluster]:
    """One Ray head (2 CPUs) per test process, shared by every ``flower_cli`` run."""
    # short root: Ray's socket paths live under it and must fit in 107 characters
    root = Path(tempfile.mkdtemp(prefix=f"{_ray_prefix()}-", dir="/tmp"))
    cluster = LoopbackRayCluster(root, num_nodes=1, num_cpus=2, object_store_mib=256)
    try:
        with cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def flower_cli(
    ray_head: LoopbackRayCluster, tmp_path_factory: pytest.TempPathFactory
) -> InProcessSimulation:
    """Flower simulation runs of this app, in-process, on the session's Ray head."""
    return InProcessSimulation(tmp_path_factory.mktemp("runs"), ray_head.address)


@pytest.fixture(scope="session")
def flwr_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSimulation]:
    """The real ``flwr run . --stream`` against a local SuperLink of this session."""
    cli = LocalSimulation(tmp_path_factory.mktemp("flwr-home"), tmp_path_factory.mktemp("runs"))
    try:
        yield cli
    finally:
        cli.stop()


#: tests that share a session fixture too costly to start twice run in one xdist worker:
#: group name -> the fixtures that put a test in it
SHARED = {
    "ray": ("ray_head", "flower_cli"),  # the Ray head (one per run instead of one per worker)
    "rehearsal": ("rehearsal",),  # the edge-device rehearsal (3 namespaced, limited nodes)
    # its 2-node twin, on another worker: the runs on the nodes' real-data files (one
    # rehearsal running every deploy test in turn took 20 of the 23 minutes of a CI run)
    "rehearsal-pair": ("rehearsal_pair",),
}
#: where the workers tell the scheduler the group of each test (set by the run's first process)
GROUPS_VAR = "FLOWER_APP_XDIST_GROUPS"

#: seconds the longest work units (a file, or a group of :data:`SHARED`) took in CI's pytest
#: (FLOWER_APP_REALDATA=1, -n 3) of 2026-11-26 21:19, load 10-16 (docs/testing.md; the two
#: rehearsal groups: estimates for their split of 6b0cbde): they are handed out first,
#: longest first, so that the workers end together (xdist's own order, and a table that
#: listed only the rehearsals and the Ray group, left the 5-7 minute
#: test_reproduction_pins.py for the end, run alone); a unit not listed comes after them, in
#: collection order. This order ended CI's three workers within 22 s of each other
#: (2026-11-27 04:35, idle: the pair's group 640 s, the pins 316, the Ray group 216)
LONGEST: dict[str, float] = {
    "rehearsal-pair": 700.0,  # the deploy tests on the nodes' real-data files
    "rehearsal": 400.0,  # the other deploy tests (synthetic files, SecAgg+, the guide, its drills)
    "ray": 566.0,  # the tests on the run's Ray head
    "test_reproduction_pins.py": 415.0,
    "test_docs_blocks.py": 246.0,
    "test_cli_preflight.py": 143.0,
    "test_flower_engine.py": 138.0,
    "test_cli.py": 133.0,
    "test_resume.py": 128.0,
    "test_dp_against_server.py": 103.0,
    "test_examples_fmnist_maxfl.py": 101.0,
    "test_deploy_guide.py": 150.0,
    "test_examples_fedsubavg.py": 78.0,
}


def _group(item: pytest.Item) -> str | None:
    """The :data:`SHARED` group of ``item`` (None: its file is its unit)."""
    for group, fixtures in SHARED.items():
        if any(name in item.fixturenames for name in fixtures):
            return group
    return None


@pytest.hookimpl(trylast=True)  # after deselection: order what runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the tests longest unit first; an xdist worker also writes each test's group
    for the scheduler (:func:`pytest_xdist_make_scheduler`)."""
    first = {unit: i for i, unit in enumerate(sorted(LONGEST, key=LONGEST.__getitem__,
                                                            reverse=True))}  # fmt: skip
    items.sort(key=lambda item: first.get(_group(item) or item.path.name, len(first)))
    groups_file = os.environ.get(GROUPS_VAR)
    if groups_file and os.environ.get("PYTEST_XDIST_WORKER"):
        groups = {item.nodeid: g for item in items if (g := _group(item)) is not None}
        tmp = Path(f"{groups_file}.{os.environ['PYTEST_XDIST_WORKER']}")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, groups_file)  # every worker writes the same


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201 - xdist's type
    """``--dist loadgroup`` (pyproject's ``addopts``): file by file, as ``--dist loadfile``,
    except that the tests of a :data:`SHARED` group are one unit, in the collection's order
    (longest unit first). Other ``--dist`` modes: xdist's own scheduling.

    (xdist's own ``loadgroup`` reads ``xdist_group`` marks from a suffix it appends to each
    test's node id, which pytest 9.2 no longer lets a plugin change: the workers write the
    groups to a file instead.)
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    groups_file = Path(os.environ[GROUPS_VAR])

    class FilesAndGroups(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker has collected (and written it) by now
                self.groups = json.loads(groups_file.read_text()) if groups_file.exists() else {}
            return self.groups.get(nodeid) or nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # keep the collection's order
    return FilesAndGroups(config, log)


#: pyproject's ``addopts`` marker expression (keep in sync with ``[tool.pytest.ini_options]``).
#: ``long``: tests that start Flower processes of their own (a SuperLink, Ray) for a path the
#: default suite checks more cheaply; off by default, on in CI.
DEFAULT_MARKEXPR = "not realdata and not slow and not deploy and not long"


def pytest_configure(config: pytest.Config) -> None:
    """Mark this run's processes (and start the watchdog that sweeps them when the run
    ends); with FLOWER_APP_REALDATA=1 (CI), also run the tests marked ``realdata``,
    ``deploy`` and ``long``."""
    if OWNER_VAR not in os.environ:  # the run's first process (not an xdist worker)
        os.environ.setdefault(process_sweep.TOKEN_VAR, process_sweep.new_token())
        os.environ[OWNER_VAR] = str(os.getpid())
        scratch = tempfile.mkdtemp(prefix=f"{_ray_prefix()}-run-", dir="/tmp")
        os.environ[GROUPS_VAR] = str(Path(scratch) / "xdist-groups.json")
        # the Ray instances that `flwr run` simulations of this run start (Flower calls
        # ray.init without a temp dir) keep their session folders here, not in the machine's
        # shared /tmp/ray: the watchdog finds their agents by the files they hold open there
        # (their environment may not show the token: process_sweep's docstring)
        os.environ["RAY_TMPDIR"] = scratch
        report = os.environ.get(REPORT_VAR)
        process_sweep.spawn_reaper(
            os.environ[process_sweep.TOKEN_VAR],
            os.getpid(),
            Path(report) if report else None,
            remove=[f"/tmp/{_ray_prefix()}-*"]
            + ([os.environ["FLOWER_APP_CACHE"]] if _OWN_CACHE else []),
        )
    if os.environ.get("FLOWER_APP_REALDATA") == "1" and config.option.markexpr == DEFAULT_MARKEXPR:
        config.option.markexpr = "not slow"
