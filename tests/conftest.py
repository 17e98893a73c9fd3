"""Shared fixtures: real `flwr run`s against SuperLinks this test session owns."""

from __future__ import annotations

import os
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

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from flower_app.simulation import LocalSimulation  # noqa: E402

# the nodes' binary data caches of this test session (and of the SuperNodes it starts) stay
# out of the user's ~/.cache
os.environ.setdefault("FLOWER_APP_CACHE", tempfile.mkdtemp(prefix="flower-app-cache-"))

# no per-example deadline: a test asserts behaviour, never timing (the machine may be busy)
settings.register_profile("flower_app", deadline=None)
settings.load_profile("flower_app")

BIN = Path(sys.executable).parent  # flower-superlink / flower-supernode of this environment
FlowerCLI = LocalSimulation


# the deployment fixtures (the shared edge-device rehearsal, exports, loopback deployment)
from tests.deployment import Deployment, deployment, node_export, rehearsal  # noqa: E402, F401


@pytest.fixture(scope="session")
def flower_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerCLI]:
    cli = FlowerCLI(tmp_path_factory.mktemp("flwr-home"), tmp_path_factory.mktemp("runs"))
    try:
        yield cli
    finally:
        cli.stop()


#: pyproject's ``addopts`` marker expression (keep in sync with ``[tool.pytest.ini_options]``).
#: ``long``: ``flwr run`` tests of 30-80 s each on the 2-core CI machine that repeat a path
#: the default suite already runs once per strategy family; off by default so that the
#: default suite stays under 8 minutes, on in CI.
DEFAULT_MARKEXPR = "not realdata and not slow and not deploy and not long"


def pytest_configure(config: pytest.Config) -> None:
    """With FLOWER_APP_REALDATA=1 (CI), also run the tests marked ``realdata``, ``deploy``
    and ``long``."""
    if os.environ.get("FLOWER_APP_REALDATA") == "1" and config.option.markexpr == DEFAULT_MARKEXPR:
        config.option.markexpr = "not slow"
