"""run_sim.py: the FedSM sweep CLI (CSV rows and columns, full information, figures, plot)."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from direct import run_direct
from flower_app.config import AppConfig

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_sim", ROOT / "run_sim.py")
run_sim = importlib.util.module_from_spec(_spec)
sys.modules["run_sim"] = run_sim
_spec.loader.exec_module(run_sim)

N_USERS, N_ELEMENTS = 200, 60
CLIENTS = ["0.25", "1.0"]  # K = 50 users, all 200 users
ELEMENTS = ["0.2", "1.0"]  # d = 12 elements, all remaining elements
SEEDS = [0, 1]
KS = [2, 4]
FIGURES = ["objective_vs_k.png", "ratio_vs_k.png", "grid.png"]


def _sweep_argv(out: Path) -> list[str]:
    return [
        "fedsm-sweep",
        "--dataset", "synthetic-facility-location",
        "--num-users", str(N_USERS), "--num-elements", str(N_ELEMENTS),
        "--k", *map(str, KS),
        "--clients", *CLIENTS,
        "--elements", *ELEMENTS,
        "--seeds", *map(str, SEEDS),
        "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    assert run_sim.main(_sweep_argv(out)) == 0
    return out


@pytest.fixture(scope="module")
def sweep(sweep_dir: Path) -> pd.DataFrame:
    return run_sim.read_sweep(sweep_dir / "sweep.csv")


def test_sweep_csv_has_one_row_per_dataset_k_d_seed_and_k(sweep: pd.DataFrame) -> None:
    assert list(sweep.columns) == run_sim.SWEEP_COLUMNS
    assert len(sweep) == len(CLIENTS) * len(ELEMENTS) * len(SEEDS) * len(KS)
    keys = set(zip(sweep["clients-per-round"], sweep["elements-per-client"], sweep["seed"],
                   sweep["k"], strict=True))  # fmt: skip
    assert keys == {(c, e, s, k) for c in CLIENTS for e in ELEMENTS for s in SEEDS for k in KS}
    assert (sweep["dataset"] == "synthetic-facility-location").all()
    assert (sweep["engine"] == "direct").all()
    assert (sweep["n-users"] == N_USERS).all() and (sweep["n-elements"] == N_ELEMENTS).all()
    assert set(sweep["K"]) == {50, 200} and set(sweep["d"]) == {12, 60}
    assert sweep[["objective", "greedy-objective", "ratio", "random-objective"]].notna().all().all()
    assert (sweep["ratio"] == sweep["objective"] / sweep["greedy-objective"]).all()


def test_user_values_and_wall_time_accumulate_up_to_k(sweep: pd.DataFrame) -> None:
    sampled = sweep[sweep["elements-per-client"] == "0.2"]  # d = 12 < |E \ S| every round
    assert (sampled["user-values"] == sampled["K"] * 12 * sampled["k"]).all()
    full = sweep[sweep["elements-per-client"] == "1.0"]  # d = |E \ S| = 60, 59, 58, ...
    for k in KS:
        rows = full[full["k"] == k]
        assert (rows["user-values"] == rows["K"] * sum(N_ELEMENTS - t for t in range(k))).all()
    for _, run in sweep.groupby("run-folder"):
        times = run.sort_values("k")["wall-time"].to_numpy()
        assert (times > 0).all() and (times[:-1] <= times[1:]).all()
        assert (run["wall-time"] <= run["run-wall-time"]).all()


def test_full_information_is_exactly_centralized_greedy(sweep: pd.DataFrame) -> None:
    full = sweep[(sweep["clients-per-round"] == "1.0") & (sweep["elements-per-client"] == "1.0")]
    assert len(full) == len(SEEDS) * len(KS)
    assert (full["ratio"] == 1.0).all()
    assert (full["objective"] == full["greedy-objective"]).all()


def test_random_baseline_depends_on_seed_and_k_only(sweep: pd.DataFrame) -> None:
    per_seed_k = sweep.groupby(["seed", "k"])["random-objective"].nunique()
    assert (per_seed_k == 1).all()
    assert (sweep["random-objective"] <= sweep["greedy-objective"]).all()


def test_one_run_to_max_k_gives_the_runs_to_smaller_k(sweep: pd.DataFrame, tmp_path) -> None:
    cfg = AppConfig.from_run_config({
        "dataset": "synthetic-facility-location", "num-users": N_USERS,
        "num-elements": N_ELEMENTS, "k": KS[0], "clients-per-round": 0.25,
        "elements-per-client": 0.2, "seed": 1, "output-dir": str(tmp_path), "run-name": "short",
    })  # fmt: skip
    short = run_direct(cfg)
    row = sweep[
        (sweep["clients-per-round"] == "0.25") & (sweep["elements-per-client"] == "0.2")
        & (sweep["seed"] == 1) & (sweep["k"] == KS[0])
    ]  # fmt: skip
    assert len(row) == 1
    assert row["objective"].iloc[0] == short["objective"]


def test_table_csv_means_over_seeds(sweep_dir: Path, sweep: pd.DataFrame) -> None:
    table = pd.read_csv(sweep_dir / "table.csv", dtype=str).astype(
        {"k": int, "seeds": int, "ratio-mean": float, "objective-mean": float}
    )
    assert len(table) == len(CLIENTS) * len(ELEMENTS) * len(KS)
    assert (table["seeds"] == len(SEEDS)).all()
    full = table[(table["clients-per-round"] == "1.0") & (table["elements-per-client"] == "1.0")]
    assert (full["ratio-mean"] == 1.0).all()
    some = sweep[(sweep["clients-per-round"] == "0.25") & (sweep["elements-per-client"] == "0.2")
                 & (sweep["k"] == 4)]  # fmt: skip
    mean = table[(table["clients-per-round"] == "0.25") & (table["elements-per-client"] == "0.2")
                 & (table["k"] == 4)]["objective-mean"].iloc[0]  # fmt: skip
    assert mean == pytest.approx(some["objective"].mean())
    markdown = run_sim.markdown_ratio_table(run_sim.make_table(sweep))
    assert markdown.index("**K = 25%**") < markdown.index("**K = 100%**")
    assert markdown.count("| k | d = 20% | d = 100% |") == 2
    full_block = markdown[markdown.index("**K = 100%**") :]
    assert all(line.endswith("| 1.0000 ± 0.0000 |") for line in full_block.splitlines()[4:])


def test_figures_exist_and_plot_regenerates_them(sweep_dir: Path, tmp_path) -> None:
    for name in FIGURES:
        path = sweep_dir / name
        assert path.stat().st_size > 1000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "replot"
    assert run_sim.main(["plot", str(sweep_dir / "sweep.csv"), "--out", str(out)]) == 0
    for name in FIGURES:
        assert (out / name).stat().st_size > 1000
    assert (out / "table.csv").read_text() == (sweep_dir / "table.csv").read_text()
    # a folder works too, and writes next to the CSV
    (sweep_dir / "grid.png").unlink()
    assert run_sim.main(["plot", str(sweep_dir), "--fixed-clients", "1.0"]) == 0
    assert (sweep_dir / "grid.png").stat().st_size > 1000


def test_run_folders_go_to_out_runs(sweep_dir: Path, sweep: pd.DataFrame) -> None:
    folders = set(sweep["run-folder"])
    assert len(folders) == len(CLIENTS) * len(ELEMENTS) * len(SEEDS)
    for folder in folders:
        assert folder.startswith("runs/")
        assert (sweep_dir / folder / "summary.json").is_file()


def test_bad_values_fail_before_any_run(tmp_path, capsys) -> None:
    out = tmp_path / "bad"
    argv = _sweep_argv(out)
    argv[argv.index("--clients") + 1] = "1.5"
    assert run_sim.main(argv) == 2
    assert "clients-per-round" in capsys.readouterr().err
    assert not (out / "runs").exists()
    assert run_sim.main(["plot", str(tmp_path / "nothing")]) == 2


def test_parse_count_keeps_counts_and_fractions_apart() -> None:
    assert run_sim.parse_count("50") == 50 and isinstance(run_sim.parse_count("50"), int)
    assert run_sim.parse_count("1.0") == 1.0 and isinstance(run_sim.parse_count("1.0"), float)
    with pytest.raises(argparse.ArgumentTypeError):
        run_sim.parse_count("ten")
    assert run_sim.spec_label("0.01", "K") == "K = 1%"
    assert run_sim.spec_label("7", "d") == "d = 7"


def test_help_names_both_subcommands() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run_sim.py"), "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "fedsm-sweep" in proc.stdout and "plot" in proc.stdout


@pytest.mark.slow
@pytest.mark.flwr
def test_flower_engine_gives_the_direct_engine_rows(sweep: pd.DataFrame, tmp_path) -> None:
    argv = _sweep_argv(tmp_path)
    for flag, value in (("--clients", "0.25"), ("--elements", "0.2"), ("--seeds", "1")):
        i = argv.index(flag)
        argv[i + 1 : i + 1 + (len(SEEDS) if flag == "--seeds" else 2)] = [value]
    assert run_sim.main([*argv, "--engine", "flower", "--num-supernodes", "3"]) == 0
    flower = run_sim.read_sweep(tmp_path / "sweep.csv")
    direct = sweep[(sweep["clients-per-round"] == "0.25") & (sweep["elements-per-client"] == "0.2")
                   & (sweep["seed"] == 1)]  # fmt: skip
    assert (flower["engine"] == "flower").all()
    assert flower["objective"].tolist() == direct["objective"].tolist()
    assert flower["user-values"].tolist() == direct["user-values"].tolist()
