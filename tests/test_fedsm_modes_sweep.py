"""The reproduction CLI of FedSM Algorithm 2 and amplification, on a tiny synthetic instance."""

from __future__ import annotations

import csv

from reproductions.fedsm_modes import main


def _rows(path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_alg2_curve_and_amplification_write_tables_and_figures(tmp_path) -> None:
    common = ["--dataset", "synthetic-facility-location", "--num-users", "120"]
    common += ["--num-elements", "40", "--seeds", "0", "1"]
    out = tmp_path / "alg2"
    assert main(["alg2-curve", *common, "--k", "8", "--settings", "1.0:60", "--out", str(out)]) == 0
    runs = _rows(out / "runs.csv")
    assert len(runs) == 2 and all(int(r["set-size"]) <= 8 for r in runs)
    curve = _rows(out / "curve.csv")
    assert sum(int(r["seed"]) == 0 for r in curve) == int(runs[0]["rounds"])
    for name in ("alg2-objective.png", "alg2-size.png", "alg2-by-k.png", "alg2.md", "by-k.csv"):
        assert (out / name).exists()
    # a second call resumes: nothing is run twice
    assert main(["alg2-curve", *common, "--k", "8", "--settings", "1.0:60", "--out", str(out)]) == 0
    assert len(_rows(out / "runs.csv")) == 2
    amp = tmp_path / "amp"
    args = ["amplification", *common, "--k", "5", "--eta", "0.5", "--clients", "0.2"]
    assert main([*args, "--elements", "0.2", "--out", str(amp)]) == 0
    rows = _rows(amp / "amplification.csv")
    assert len(rows) == 2 * 5
    budget = {r["method"]: int(r["user-values"]) for r in rows if r["seed"] == "0"}
    amplified = [v for m, v in budget.items() if m.startswith("Alg. 3")]
    assert all(v == budget["Alg. 1 (K, d/η) - equal total budget"] for v in amplified)
    assert (amp / "amplification.md").exists() and (amp / "amplification.png").exists()
