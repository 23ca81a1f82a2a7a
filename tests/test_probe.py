"""The representation-quality probe (APC-VFL, Appendix F)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO
from vflo import schema
from vflo.cli import main
from vflo.errors import ConfigError
from vflo.experiments.probe import ProbeConfig, load_probe_config, run_probe


def test_probe_scores_representations_every_epoch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "probe.toml"
    config.write_text(
        'name = "p"\n[dataset]\nname = "wine"\n[probe]\nencoder = [16, 32]\nfolds = 3\n'
        'train = { batch_size = 32, max_epochs = 4, patience = 0, validation_fraction = 0.0 }\n'
    )
    out = tmp_path / "out"
    assert main(["probe", str(config), "--out", str(out)]) == 0
    assert "accuracy on raw features" in capsys.readouterr().out
    history = pd.read_csv(out / "history.csv")
    assert list(history.epoch) == [0, 1, 2, 3] and {"loss", "metric_mean", "fold_0", "fold_2"} <= set(history)
    summary = json.loads((out / "probe.json").read_text())
    assert len(summary["raw_scores"]) == 3 and (out / "probe.png").exists()


def test_probe_config_in_the_repository_parses() -> None:
    config = load_probe_config(REPO / "configs" / "probes" / "breast_active.toml")
    assert config.probe.encoder == (64, 128) and len(config.probe.columns or ()) == 5


def test_probe_bad_input() -> None:
    bad = schema.build(ProbeConfig, {"dataset": {"name": "wine"}, "probe": {"columns": ["alcohl"]}})
    with pytest.raises(ConfigError, match="did you mean 'alcohol'"):
        run_probe(bad)
    with pytest.raises(ConfigError, match="folds must be at least 2"):
        schema.build(ProbeConfig, {"dataset": {"name": "wine"}, "probe": {"folds": 1}})
