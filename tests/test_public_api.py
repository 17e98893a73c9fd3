"""The public API: strategies and client helpers import from one module each."""

from __future__ import annotations

import subprocess
import sys

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
