"""Scoring with whoever answers, over gRPC with mutual TLS: a partner killed while rows are being scored is absent
from the next batch on, within the deadline, the output says so, and the scores are those of the same missing
pattern in one process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.e2e.conftest import in_one_folder, start_federation, train_and_save, write_deploy
from tests.test_laser_vfl import TRAIN, _blocks
from vflo.cli import main
from vflo.methods.registry import get_method

pytestmark = pytest.mark.slow
SETTINGS: dict[str, dict[str, Any]] = {"laser_vfl": {"train": {**TRAIN, "max_epochs": 3}},
                                       "secureboost": {"n_trees": 3, "max_depth": 3, "n_bins": 8}}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_partner_killed_during_scoring_is_absent_for_the_rest(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    together, _ = _blocks()
    cls = get_method(name)
    federation = start_federation(tmp_path / "fed", together, {}, proposals=[cls(**SETTINGS[name])])
    try:
        train_and_save(federation, cls(**SETTINGS[name]), tmp_path / "models", name)
        deploy = write_deploy(federation.deploy, tmp_path / "deploy.toml")
        # Four batches of 25 rows; p2 is killed once the first has been scored.
        monkeypatch.setattr("vflo.scoring.SCORE_BATCH", 25)
        batches: list[int] = []
        predict_by = cls.predict_by

        def then_kill(self, fed, ids):  # type: ignore[no-untyped-def]
            out = predict_by(self, fed, ids)
            batches.append(len(ids))
            if len(batches) == 1:
                federation.processes["p2"].kill()
                federation.processes["p2"].wait(timeout=10)
            return out

        monkeypatch.setattr(cls, "predict_by", then_kill)
        out = tmp_path / "scores.csv"
        started = time.monotonic()
        assert main(["predict", str(tmp_path / "models"), "--method", name, "--data",
                     str(federation.deploy.test_file), "--deploy", str(deploy), "--missing", "subset",
                     "--deadline", "5", "--out", str(out)]) == 0
        elapsed = time.monotonic() - started
        assert batches == [25, 25, 25, 25]
        assert elapsed < 3 * 5 + 30  # three batches without p2, each within the deadline, and start-up
        printed = capsys.readouterr().out
        assert "scored by a+p1 (75), a+p1+p2 (25)" in printed
        frame = pd.read_csv(out, dtype={"id": str})
        assert list(frame["scored_by"]) == ["a+p1+p2"] * 25 + ["a+p1"] * 75

        # The same scores in one process, for the same pattern: every part in one folder.
        saved = in_one_folder(tmp_path / "models", federation, name, ("p1", "p2"), tmp_path / "here")
        monkeypatch.setattr(cls, "predict_by", predict_by)
        rows = {"a": federation.deploy.test_file, **{p: federation.directory / f"{p}_serve.csv" for p in ("p1", "p2")}}
        everyone = saved.score(rows, missing="subset")
        without = saved.score({p: rows[p] for p in ("a", "p1")}, missing="subset")
        cols = saved.score_columns
        expected = np.vstack([everyone[cols].to_numpy()[:25], without[cols].to_numpy()[25:]])
        assert np.allclose(frame[cols].to_numpy(), expected, atol=1e-6)
        assert (frame["id"].to_numpy() == everyone[saved.id_column].astype(str).to_numpy()).all()

        # p2 stays away: the next session goes on without it from the start (its part never loads).
        again = tmp_path / "again.csv"
        assert main(["predict", str(tmp_path / "models"), "--method", name, "--data",
                     str(federation.deploy.test_file), "--deploy", str(deploy), "--missing", "subset",
                     "--deadline", "5", "--out", str(again)]) == 0
        later = pd.read_csv(again, dtype={"id": str})
        assert set(later["scored_by"]) == {"a+p1"}
        assert np.allclose(later[cols].to_numpy(), without[cols].to_numpy(), atol=1e-6)
        # Without "subset" the same session is an error that names the partner.
        assert main(["predict", str(tmp_path / "models"), "--method", name, "--data",
                     str(federation.deploy.test_file), "--deploy", str(deploy), "--out", str(tmp_path / "x.csv")]) == 4
        assert "'p2'" in capsys.readouterr().err and not (tmp_path / "x.csv").exists()
    finally:
        federation.stop()
