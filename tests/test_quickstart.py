"""The quickstart config runs end to end (its --quick twin, to keep the suite fast)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tests.conftest import REPO
from vflo.cli import main
from vflo.experiments.config import load_config


def test_quickstart_config_matches_the_issue() -> None:
    cfg = load_config(REPO / "configs" / "quickstart.toml")
    assert cfg.dataset.name == "breast_cancer"
    active = cfg.variants[0].spec.parties[0]
    assert active.role == "active" and set(active.columns) == {  # type: ignore[arg-type]
        "worst compactness", "concave points error", "smoothness error", "mean texture", "worst fractal dimension"}
    assert cfg.variants[0].spec.samples.active == 500
    assert [v.spec.samples.aligned for v in cfg.variants] == [100, 250]
    assert [m.label for m in cfg.methods] == ["local", "splitnn", "apc_vfl", "rap", "centralized"]


def test_quickstart_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "qs"
    assert main(["run", str(REPO / "configs" / "quickstart.toml"), "--quick", "--out", str(out)]) == 0
    rows = pd.read_csv(out / "results.csv")
    assert set(rows.method) == {"local", "splitnn", "apc_vfl", "rap", "centralized"}
    assert set(rows.aligned) == {100, 250}
    means = rows.groupby("method").accuracy.mean()
    # the lab's 25 features matter: federating beats the hospital alone
    assert means["splitnn"] > means["local"]
    assert (rows[rows.method == "splitnn"].comm_bytes > 0).all()
    # the one-shot methods train in one round, SplitNN in hundreds or more
    assert (rows[rows.method.isin(["apc_vfl", "rap"])].fit_rounds == 1).all()
    assert (rows[rows.method == "splitnn"].fit_rounds > 100).all()
