"""Scoring with whoever is there (``missing = "subset"``): each person scored by the partners that hold them and
answer, the output saying who; a partner that left is absent; methods that cannot do without a partner refuse
and say why."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import vflo
from tests.test_artifacts import raw_rows
from tests.test_laser_vfl import TRAIN, _blocks
from vflo.errors import ConfigError
from vflo.methods.registry import get_method
from vflo.scoring import SavedModel


@pytest.fixture(scope="module")
def laser(tmp_path_factory: pytest.TempPathFactory) -> tuple[SavedModel, dict[str, vflo.PartyData]]:
    together, _ = _blocks()
    model = vflo.fit(get_method("laser_vfl")(train={**TRAIN, "max_epochs": 3}), together, seed=0)
    folder = model.save(tmp_path_factory.mktemp("laser"))
    return vflo.load(folder.parent, "laser_vfl"), raw_rows(together)


def test_a_partner_not_there_is_absent_and_the_output_says_who_scored(
        laser: tuple[SavedModel, dict[str, vflo.PartyData]]) -> None:
    saved, rows = laser
    every = saved.score(rows, missing="subset")
    # With everyone there, "subset" changes nothing but says who scored each row.
    assert np.array_equal(every[saved.score_columns].to_numpy(), saved.predict(rows))
    for pid, by in zip(every["id"], every["scored_by"], strict=True):
        holders = ["a"] + [p for p in ("p1", "p2") if pid in rows[p].ids]
        assert by == "+".join(holders)
    without = saved.score({"a": rows["a"], "p1": rows["p1"]}, missing="subset")
    assert set(without["scored_by"]) == {"a+p1"} and (without["model"] == "laser_vfl").all()
    # The same scores as when p2 holds none of these people but one (x): every other row is scored alike.
    x = rows["p2"].ids[0]
    one = saved.score({**rows, "p2": rows["p2"].subset(np.array([x]))}, missing="subset")
    other = (one["id"] != x).to_numpy()
    cols = saved.score_columns
    # Within float32 rounding: the rows are scored in batches of other sizes (99 and 1 rows against 100), and
    # PyTorch's kernels may sum in another order for another shape or thread count (seen on a loaded machine).
    np.testing.assert_allclose(one.loc[other, cols].to_numpy(), without.loc[other, cols].to_numpy(), rtol=0,
                               atol=1e-6)
    assert "p2" in one.loc[~other, "scored_by"].item() and "p2" not in "".join(without["scored_by"])
    assert not np.allclose(one.loc[~other, cols].to_numpy(), without.loc[~other, cols].to_numpy())


def test_a_partner_that_left_after_training_is_absent_for_the_session(
        laser: tuple[SavedModel, dict[str, vflo.PartyData]], tmp_path: Path) -> None:
    saved, rows = laser
    copy = tmp_path / "models"
    shutil.copytree(saved.folder, copy)
    shutil.rmtree(copy / "laser_vfl" / "p2")  # p2 left, and took its part with it
    left = vflo.load(copy, "laser_vfl")
    frame = left.score(rows, missing="subset")
    expected = saved.score({"a": rows["a"], "p1": rows["p1"]}, missing="subset")
    assert frame.equals(expected)
    with pytest.raises(vflo.VfloError):
        left.score(rows)  # without "subset", a partner that cannot score is an error, as before


def test_methods_that_need_every_partner_refuse_subset_and_say_why(tmp_path: Path) -> None:
    together, _ = _blocks()
    aligned = together  # splitnn scores only people every partner holds
    model = vflo.fit(get_method("splitnn")(train={**TRAIN, "max_epochs": 1}), aligned, seed=0)
    folder = model.save(tmp_path)
    saved = vflo.load(folder.parent, "splitnn")
    with pytest.raises(ConfigError, match="party_dropout"):
        saved.score(raw_rows(together), missing="subset")
    # Each says why in its own terms; those that can say nothing.
    assert "label" in get_method("entity_augmentation")().subset_refusal()
    assert "block" in get_method("rap")().subset_refusal()
    assert get_method("fedsvd")().subset_refusal()
    for able in (get_method("laser_vfl")(), get_method("splitnn")(party_dropout=0.3), get_method("apc_vfl")(),
                 get_method("local")(), get_method("vfl_asp_student")()):
        assert able.subset_refusal() == ""
    assert get_method("vfl_asp")().subset_refusal()


def test_every_collaborative_row_names_its_scorers(laser: tuple[SavedModel, dict[str, vflo.PartyData]]) -> None:
    saved, rows = laser
    frame = saved.score(rows)  # the default policy: laser_vfl still scores with whoever holds the person
    assert frame["scored_by"].str.startswith("a").all() and "scored_by" not in saved.score_columns


def test_the_cli_refuses_a_deadline_without_a_deployment(
        laser: tuple[SavedModel, dict[str, vflo.PartyData]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from vflo.cli import main

    saved, rows = laser
    data = tmp_path / "a.csv"
    rows["a"].to_frame(id_column="id").to_csv(data, index=False)
    code = main(["predict", str(saved.folder), "--method", "laser_vfl", "--data", str(data), "--out",
                 str(tmp_path / "out.csv"), "--missing", "subset", "--deadline", "2"])
    assert code == ConfigError.exit_code and "--deploy" in capsys.readouterr().err
    assert not (tmp_path / "out.csv").exists()


def test_the_active_party_scores_alone_from_its_own_folder(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Every partner gone, only the active party's own part on its host: `vflo predict --missing subset` scores
    every row with the active party alone, as LASER-VFL's own head does."""
    import pandas as pd

    from vflo.cli import main

    examples = Path(__file__).resolve().parents[1] / "examples" / "data"
    hospital = vflo.PartyData.from_file(examples / "hospital.csv", party="hospital", id_column="pid",
                                        label_column="outcome", categorical=["sex", "ward"])
    lab = vflo.PartyData.from_file(examples / "lab.csv", party="lab", id_column="pid", impute="median")
    model = vflo.fit("laser_vfl", vflo.hold_out([hospital, lab], seed=0), train={"max_epochs": 3})
    saved = vflo.load(model.save(tmp_path / "models"))
    own = tmp_path / "host" / "laser_vfl"
    shutil.copytree(saved.folder / "laser_vfl" / "hospital", own / "hospital")
    shutil.copy(saved.folder / "laser_vfl" / "model.json", own / "model.json")
    new = examples / "hospital_new.csv"
    out = tmp_path / "scores.csv"
    assert main(["predict", str(own / "hospital"), "--data", str(new), "--out", str(out), "--missing", "subset"]) == 0
    frame = pd.read_csv(out)
    assert set(frame["scored_by"]) == {"hospital"} and len(frame) == 30
    expected = saved.score(new, missing="subset")
    assert np.allclose(frame[saved.score_columns].to_numpy(), expected[saved.score_columns].to_numpy())
    assert "scored by hospital (30)" in capsys.readouterr().out
    # Without "subset" it says how to score alone.
    assert main(["predict", str(own / "hospital"), "--data", str(new), "--out", str(tmp_path / "x.csv")]) \
        == ConfigError.exit_code
    assert "--missing subset" in capsys.readouterr().err
