"""The public API: strategies and client helpers import from one module each; the package
is all that is installed and shipped."""

from __future__ import annotations

import ast
import inspect
import io
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from flwr.serverapp.strategy import Strategy

import flower_app.clients as clients
import flower_app.strategies as strategies


def test_every_exported_name_resolves():
    for module in (strategies, clients):
        for name in module.__all__:
            assert getattr(module, name) is not None, name
        assert sorted(module.__all__) == sorted(module._HOME)


def test_every_strategy_is_a_flower_strategy_with_the_one_loop():
    for name in strategies.__all__:
        obj = getattr(strategies, name)
        if name.endswith("Strategy"):
            assert issubclass(obj, Strategy) and issubclass(obj, strategies.RoundStrategy)
            # start() is written once, in the base
            assert obj.start is strategies.RoundStrategy.start, name


def test_submodular_imports_do_not_load_torch():
    code = (
        "import sys\n"
        "from flower_app.strategies import FedSMStrategy, FedCGStrategy\n"
        "from flower_app.clients import ScoreTable, fedsm_reply\n"
        "import flower_app.client_app\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


#: the heavy modules each family's ClientApp may import (MaxFL trains torch)
CLIENT_NEEDS = {"fedsm": "", "fedcg": "", "fedsubavg": "", "maxfl": "torch"}


@pytest.mark.parametrize("family", sorted(CLIENT_NEEDS))
def test_a_clientapp_imports_only_what_its_family_needs(family):
    """Flower starts a fresh ``flwr-clientapp`` process for every message on a SuperNode:
    each module imported on the way to ``make_client`` is paid per message per node (torch
    and scipy.stats ~3.4 CPU-s, pandas ~0.3-1, scipy.special ~0.2 on this machine)."""
    code = (
        "import sys\n"
        "import flower_app.client_app\n"
        "from flower_app.registry import load_runner\n"
        "load_runner(sys.argv[1])\n"
        "heavy = ('torch', 'pandas', 'pyarrow', 'scipy.special', 'scipy.stats', 'matplotlib')\n"
        "print(' '.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, family], capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == CLIENT_NEEDS[family]


ROOT = Path(__file__).resolve().parents[1]
#: top-level parts of the repository that are never installed nor shipped in the FAB
NOT_SHIPPED = (
    "benchmarks/", "direct/", "docs/", "examples/", "rehearsal/", "reproductions/", "run_sim.py",
    "tests/",
)


# Flower 1.42's FAB builder uses a pathspec pattern class that pathspec deprecates: not ours
@pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")
def test_the_fab_ships_the_package_only() -> None:
    """What ``flwr run`` packages (Flower's own builder on this checkout): ``flower_app/``,
    never the direct engine, the reproductions, the tests and their harnesses, the benchmarks
    or the docs."""
    from flwr.cli.build import build_fab_from_disk

    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(ROOT))).namelist()
    assert "flower_app/server_app.py" in names and "flower_app/results.py" in names
    assert not [n for n in names if n.startswith(NOT_SHIPPED)]


def test_the_wheel_installs_the_package_only_and_it_imports_nothing_that_is_not() -> None:
    """The wheel holds ``flower_app`` (hatch's ``packages``), and no module of it imports the
    direct engine, the reproductions, the tests' harnesses or Flower's private simulation
    entry point."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["flower_app"]
    outside = ("direct.", "reproductions", "rehearsal", "tests", "run_sim", "benchmarks",
               "flwr.simulation.run_simulation")
    found = []
    for path in sorted((ROOT / "flower_app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names
                      if n == "direct" or n.startswith(outside)]  # fmt: skip
    assert found == []


#: the strategies a user constructs (the public names of flower_app.strategies that Flower can
#: run), without the round loop's base class and the runners' cohort class
PUBLIC_STRATEGIES = [
    name for name in strategies.__all__
    if name not in ("RoundStrategy", "AppealStrategy")
    and isinstance(getattr(strategies, name), type)
    and issubclass(getattr(strategies, name), Strategy)
]  # fmt: skip


def _constructor_arity(cls: type) -> int:
    """Named parameters of ``cls(...)``: its own, plus its parent's when it forwards *args."""
    params = inspect.signature(cls.__init__).parameters.values()
    named = [p for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL,
                                                                       p.VAR_KEYWORD)]  # fmt: skip
    forwards = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
    return len(named) + (_constructor_arity(cls.__mro__[1]) if forwards else 0)


@pytest.mark.parametrize("name", PUBLIC_STRATEGIES)
def test_a_public_strategy_is_constructed_like_fedavg(name: str) -> None:
    """FedAvg-shaped: at most 12 parameters, and no mode flag that makes it another strategy."""
    cls = getattr(strategies, name)
    assert 1 <= _constructor_arity(cls) <= 12
    source = inspect.getsource(inspect.getmodule(cls))
    assert "cohort_mode" not in source and "cohorts_mode" not in source


def test_the_public_strategies_are_the_expected_families() -> None:
    assert {"FedSMStrategy", "FedCGStrategy", "FedDiscreteGreedyStrategy", "MaxFLStrategy",
            "FedSubAvgStrategy", "FedProxSubStrategy", "FedAdamSubStrategy"} <= set(
        PUBLIC_STRATEGIES)  # fmt: skip


def test_every_module_of_the_package_imports_without_the_direct_engine() -> None:
    """``flower_app`` never imports the repository's ``direct/`` (the direct engine imports
    the package, never the reverse): every module imports with ``direct`` made unimportable."""
    code = (
        "import importlib, pkgutil, sys\n"
        "sys.modules['direct'] = None  # any import of direct raises ImportError\n"
        "import flower_app\n"
        "names = [m.name for m in pkgutil.walk_packages(flower_app.__path__, 'flower_app.')\n"
        "         if not m.name.endswith('__main__')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 100
