"""Own files with gaps: missing values are filled at their owner, from its training rows, and the same way in
rows scored later (issue 26, part 6; the walk of issue 30 on files with missing values)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import vflo
from tests.test_own_files import HOSPITAL, LAB, QUICK, _write, own_config
from vflo.cli import main
from vflo.data.files import TableEncoding, read_table
from vflo.data.partydata import PartyData
from vflo.errors import DataError


def _gappy(tmp_path: Path) -> Path:
    lab = pd.read_csv(LAB)
    lab.loc[lab.index % 7 == 0, "crp"] = None
    lab.loc[lab.index % 11 == 3, "ldl"] = None
    path = tmp_path / "lab.csv"
    lab.to_csv(path, index=False)
    return path


def test_gaps_are_refused_naming_the_column_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"column 'crp' has 18 missing values; fill them here, at their owner: "
                                        r"impute = 'mean'"):
        PartyData.from_file(_gappy(tmp_path), party="lab", id_column="pid")


@pytest.mark.parametrize("rule", ["mean", "median", "most_frequent", 0.5])
def test_each_rule_fills_from_the_training_rows_and_keeps_its_fills(tmp_path: Path, rule: str | float) -> None:
    path = _gappy(tmp_path)
    frame = read_table(path, party="lab", id_column="pid")
    data = PartyData.from_file(path, party="lab", id_column="pid", impute=rule, missing_indicator=True)
    assert np.isfinite(data.X).all()
    crp = pd.to_numeric(frame["crp"]).dropna()
    expected = {"mean": crp.mean(), "median": crp.median(), "most_frequent": crp.mode().iloc[0]}.get(str(rule), 0.5)
    column = data.columns.index("crp")
    assert np.allclose(data.X[frame["crp"].isna().to_numpy(), column], expected)
    assert data.columns[column + 1] == "crp=missing"
    assert data.X[:, column + 1].sum() == frame["crp"].isna().sum()
    encoding = data.encoding
    assert isinstance(encoding, TableEncoding)
    again = TableEncoding.from_dict(encoding.to_dict())  # saved with a model part, applied when scoring
    assert again == encoding and np.array_equal(again.features(frame).astype(data.X.dtype), data.X)


def test_two_party_files_with_gaps_run_end_to_end_and_a_saved_model_scores_alike(tmp_path: Path) -> None:
    lab = _gappy(tmp_path)
    raw = own_config(methods=[{"name": "splitnn", "train": QUICK}, {"name": "apc_vfl", "train": {"max_epochs": 2}},
                              {"name": "entity_augmentation", "train": {"max_epochs": 2}}])
    raw["scenario"]["parties"][1] = {"name": "lab", "file": str(lab), "id_column": "pid", "impute": "median",
                                     "missing_indicator": True}
    config = _write(tmp_path / "own.toml", raw)
    out, models = tmp_path / "results", tmp_path / "models"
    assert main(["run", str(config), "--out", str(out), "--save", str(models)]) == 0
    rows = pd.read_csv(out / "results.csv")
    assert set(rows.status) == {"ok"} and set(rows.method) == {"splitnn", "apc_vfl", "entity_augmentation"}
    # New rows with gaps of their own, scored with the lab's fills from training (saved with its part); Entity
    # Augmentation's host (the hospital) holds columns of its own.
    hospital = pd.read_csv(HOSPITAL, dtype={"pid": str}).drop(columns=["outcome"])
    lab_rows = pd.read_csv(lab, dtype={"pid": str})
    shared = sorted(set(hospital.pid) & set(lab_rows.pid))[:20]
    new_lab = lab_rows[lab_rows.pid.isin(shared)].copy()
    new_lab.loc[new_lab.index[:5], "crp"] = None
    (tmp_path / "h.csv").write_text(hospital[hospital.pid.isin(shared)].to_csv(index=False))
    (tmp_path / "l.csv").write_text(new_lab.to_csv(index=False))
    for label in ("splitnn", "entity_augmentation"):
        model = vflo.load(models, label)
        scores = model.score({"hospital": tmp_path / "h.csv", "lab": tmp_path / "l.csv"})
        assert len(scores) == 20 and np.isfinite(scores[model.score_columns].to_numpy()).all()
