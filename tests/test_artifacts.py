"""Models that outlive the run: save -> load -> predict gives the same scores, each party keeps only its own
part, and every kind of bad artifact is refused with a message that says which."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import vflo
from tests.test_methods import data_for, quick
from vflo.artifacts import ArtifactError, read_part
from vflo.cli import main
from vflo.comm.codec import decode
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.errors import AlignmentError, ConfigError, DataError, MethodError, RemoteError
from vflo.methods.registry import get_method, method_names

REPO = Path(__file__).resolve().parents[1]
DEPLOYABLE = [m for m in method_names() if not get_method(m).simulation_only]


def raw_rows(data: FederatedData) -> dict[str, PartyData]:
    """Each party's raw (unstandardised) rows among the test IDs: what it would bring to score next month."""
    out = {}
    for party, serve in data.serve.items():
        if not serve.n_features and party != data.active:
            continue
        ids = data.test_ids[serve.contains(data.test_ids)]
        out[party] = PartyData(party=party, ids=ids, X=data.oracle.features(ids, party), columns=serve.columns)
    return out


def test_each_party_folder_holds_only_its_own_part(tmp_path: Path) -> None:
    """The message audit's check applied to the saved files: no part holds another party's rows or labels."""
    for name in ("splitnn", "rap", "fedsvd", "apc_vfl_aligned", "entity_augmentation", "vfl_asp"):
        data = data_for(name)
        folder = vflo.fit(quick(name), data, seed=0).save(tmp_path / name)
        parties = sorted(p.name for p in folder.iterdir() if p.is_dir())
        assert set(parties) <= {p.name for p in data.parties} | {"server", "dealer"}
        for party in parties:
            state = decode((folder / party / "state.vflo").read_bytes()).payload
            assert json.loads((folder / party / "manifest.json").read_text())["party"] == party
            for other, table in data.train.items():
                if other == party or not table.n_features:
                    continue
                secret = np.round(np.vstack([table.X, data.serve[other].X]).astype(np.float64), 4)
                rows, columns = {tuple(r) for r in secret}, {tuple(np.sort(c)) for c in secret.T}
                for key, value in state.items():
                    if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.ndim == 2:
                        v = np.round(value.astype(np.float64), 4)
                        assert not any(tuple(r) in rows for r in v), (name, party, key, other)
                        assert not any(tuple(np.sort(c)) in columns for c in v.T), (name, party, key, other)
            if party != data.active:
                labels = data.train[data.active].require_labels()
                assert not any(isinstance(v, np.ndarray) and v.shape == labels.shape and np.array_equal(v, labels)
                               for v in state.values()), (name, party)


@pytest.fixture
def saved_splitnn(tmp_path: Path) -> tuple[Path, FederatedData]:
    data = data_for("splitnn")
    vflo.fit(quick("splitnn"), data, seed=0).save(tmp_path)
    vflo.fit("local", data, seed=0).save(tmp_path)
    return tmp_path, data


def test_a_tampered_or_truncated_file_is_refused(saved_splitnn: tuple[Path, FederatedData]) -> None:
    folder, data = saved_splitnn
    state = folder / "splitnn" / "pas" / "state.vflo"
    blob = bytearray(state.read_bytes())
    blob[-5] ^= 0xFF
    state.write_bytes(bytes(blob))
    # read where the rows are prepared, or at the party when it loads its part: refused either way
    with pytest.raises((ArtifactError, RemoteError), match="altered or truncated after it was saved"):
        vflo.load(folder, "splitnn").predict(raw_rows(data))
    own = folder / "splitnn" / "act" / "state.vflo"
    own.write_bytes(own.read_bytes()[:100])
    with pytest.raises(ArtifactError, match="altered or truncated"):
        vflo.load(folder, "splitnn")


def test_a_part_from_another_version_or_another_training_is_refused(
    saved_splitnn: tuple[Path, FederatedData], tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder, data = saved_splitnn
    manifest = folder / "local" / "act" / "manifest.json"
    raw = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**raw, "vflo": "0.0.9"}))
    with pytest.raises(ArtifactError, match="saved by vflo 0.0.9; this is vflo"):
        vflo.load(folder, "local")
    # the passive party's part from another training run of the same method
    other = tmp_path_factory.mktemp("other")
    vflo.fit(quick("splitnn"), data, seed=1).save(other)
    shutil.rmtree(folder / "splitnn" / "pas")
    shutil.copytree(other / "splitnn" / "pas", folder / "splitnn" / "pas")
    with pytest.raises((ArtifactError, RemoteError), match="comes from another training"):
        vflo.load(folder, "splitnn").predict(raw_rows(data))


def test_a_part_swapped_after_saving_is_noticed(saved_splitnn: tuple[Path, FederatedData]) -> None:
    folder, data = saved_splitnn
    manifest = folder / "splitnn" / "pas" / "manifest.json"
    raw = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**raw, "created": "2000-01-01"}))  # same model id, another manifest
    with pytest.raises(ArtifactError, match="not the one this model was saved with"):
        vflo.load(folder, "splitnn").predict(raw_rows(data))


def test_rows_with_other_columns_are_refused(saved_splitnn: tuple[Path, FederatedData]) -> None:
    folder, data = saved_splitnn
    rows = raw_rows(data)[data.active]
    renamed = PartyData(party=rows.party, ids=rows.ids, X=rows.X,
                        columns=tuple(f"x{i}" for i in range(rows.n_features)))
    with pytest.raises(DataError, match=r"columns that differ from those its model was trained on \(missing \['f0'"):
        vflo.load(folder, "local").predict(renamed)


def test_rows_a_partner_lacks_under_each_policy(saved_splitnn: tuple[Path, FederatedData]) -> None:
    folder, data = saved_splitnn
    rows = raw_rows(data)
    lab = rows["pas"]
    lacking = lab.ids[:7]
    rows["pas"] = lab.subset(lab.ids[7:])
    model = vflo.load(folder, "splitnn")
    with pytest.raises(AlignmentError, match=r"do not hold 7 of the 60 rows to score"):
        model.score(rows)
    with pytest.raises(ConfigError, match="needs a fallback"):
        model.score(rows, missing="active_only")
    with pytest.raises(ConfigError, match="needs a fallback"):  # a collaborative fallback is no fallback
        model.score(rows, missing="active_only", fallback=model)
    local = vflo.load(folder, "local")
    frame = model.score(rows, missing="active_only", fallback=local).set_index("id")
    assert (frame.loc[lacking, "model"] == "local").all() and (frame.drop(lacking)["model"] == "splitnn").all()
    alone = local.score(rows[data.active]).set_index("id")
    assert np.array_equal(frame.loc[lacking, ["class_0", "class_1"]].to_numpy(),
                          alone.loc[lacking, ["class_0", "class_1"]].to_numpy())


def test_oracle_baselines_cannot_be_saved(tmp_path: Path) -> None:
    data = data_for("centralized")
    with pytest.raises(MethodError, match="oracle baseline .* only in simulation"):
        vflo.fit("centralized", data).save(tmp_path)


def test_train_once_score_later_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`vflo run --save` on the own-files example, then `vflo predict` of new people from the hospital's file."""
    config = REPO / "configs/examples/own_files.toml"
    models = tmp_path / "models"
    assert main(["run", str(config), "--quick", "--out", str(tmp_path / "results"), "--save", str(models)]) == 0
    saved = {p.name for p in models.iterdir() if not p.name.startswith(".")}  # (.vflo-outputs: what vflo wrote)
    assert saved == {"local", "splitnn", "apc_vfl", "rap"}  # not the oracle
    assert {p.name for p in (models / "splitnn").iterdir() if p.is_dir()} == {"hospital", "lab"}
    new = pd.read_csv(REPO / "examples/data/hospital.csv", dtype={"pid": str}).drop(columns=["outcome"]).head(40)
    new.to_csv(tmp_path / "next_month.csv", index=False)
    out = tmp_path / "scores.csv"
    assert main(["predict", str(models), "--method", "apc_vfl", "--data", str(tmp_path / "next_month.csv"),
                 "--out", str(out)]) == 0
    scores = pd.read_csv(out, dtype={"id": str})
    assert list(scores.columns) == ["pid", "readmitted", "recovered", "prediction", "model", "scored_by"]
    assert len(scores) == 40
    assert np.allclose(scores[["readmitted", "recovered"]].sum(axis=1), 1.0)
    part = read_part(models / "apc_vfl" / "hospital", party="hospital")
    assert part.manifest["preprocessing"]["encoding"]["classes"] == ["readmitted", "recovered"]
    # a collaborative method needs its partners: without --deploy it says so
    assert main(["predict", str(models), "--method", "splitnn", "--data", str(tmp_path / "next_month.csv"),
                 "--out", str(tmp_path / "s2.csv")]) == ConfigError.exit_code
    assert "scores collaboratively: give --deploy" in capsys.readouterr().err
    # a file without one of the training columns
    new.drop(columns=["bmi"]).to_csv(tmp_path / "broken.csv", index=False)
    assert main(["predict", str(models), "--method", "local", "--data", str(tmp_path / "broken.csv"),
                 "--out", str(tmp_path / "s3.csv")]) == DataError.exit_code
    assert "feature columns 'bmi' not in the table" in capsys.readouterr().err


class NotScikitLearn:
    """A type from outside scikit-learn, as a crafted artifact would name to run its own code."""


def test_a_scikit_learn_model_is_saved_without_pickle_and_foreign_types_are_refused(tmp_path: Path) -> None:
    import skops.io as sio

    from vflo.nn.estimators import EstimatorConfig, make_estimator

    data = data_for("rap")
    rap = get_method("rap")(estimator={"model": "RandomForestClassifier", "params": {"n_estimators": 5,
                                                                                     "random_state": 0}})
    model = vflo.fit(rap, data, seed=0)
    expected = model.predict()
    model.save(tmp_path)
    assert np.array_equal(vflo.load(tmp_path).predict(raw_rows(data)), expected)
    estimator = make_estimator(EstimatorConfig(model="RandomForestClassifier"), task="binary", n_classes=2, seed=0)
    crafted = {"skops": np.frombuffer(sio.dumps([NotScikitLearn()]), dtype=np.uint8)}
    with pytest.raises(ConfigError, match="not scikit-learn's; refused"):
        estimator.set_state(crafted)


@pytest.mark.parametrize("name", ["splitnn", "apc_vfl", "rap"])
def test_scoring_in_batches_gives_the_same_scores(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vflo.scoring

    data = data_for(name)
    model = vflo.fit(quick(name), data, seed=0)
    model.save(tmp_path)
    saved = vflo.load(tmp_path)
    rows = raw_rows(data)
    whole = saved.predict(rows if not saved.active_only else rows[data.active])
    monkeypatch.setattr(vflo.scoring, "SCORE_BATCH", 7)
    batched = saved.score(rows if not saved.active_only else rows[data.active])
    assert len(batched) == len(whole)
    assert np.allclose(batched[saved.score_columns].to_numpy(), whole, rtol=0, atol=1e-6)


def test_predict_takes_the_save_folder_a_methods_folder_or_the_partys_own(tmp_path: Path) -> None:
    """On the hospital's own host: the save folder, the method's folder (``DIR/LABEL``) or its own part
    (``DIR/LABEL/hospital``) all score; the output names each row's class beside the probabilities."""
    data = data_for("local")
    model = vflo.fit(quick("local"), data, seed=0)
    model.save(tmp_path)
    rows = raw_rows(data)[data.active]
    expected = vflo.load(tmp_path).score(rows)
    for where in (tmp_path / "local", tmp_path / "local" / data.active):
        assert vflo.load(where).score(rows).equals(expected)
    probabilities = expected[vflo.load(tmp_path).score_columns].to_numpy()
    names = np.asarray(vflo.load(tmp_path).score_columns)
    assert list(expected["prediction"]) == list(names[probabilities.argmax(axis=1)])
