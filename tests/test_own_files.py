"""The parties' own files: configs, the Python API, `vflo holdout`, and every bad case refused before training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import vflo
from vflo.cli import main
from vflo.data.files import TableEncoding, read_table
from vflo.data.partydata import PartyData
from vflo.errors import AlignmentError, ConfigError, DataError, ScenarioError
from vflo.experiments.config import parse_config
from vflo.experiments.runner import run_experiment

REPO = Path(__file__).resolve().parents[1]
HOSPITAL = REPO / "examples/data/hospital.csv"
LAB = REPO / "examples/data/lab.csv"
QUICK = {"lr": 0.01, "batch_size": 16, "max_epochs": 5, "patience": 0}


def own_config(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "own", "seed": 0,
        "scenario": {"parties": [
            {"name": "hospital", "role": "active", "file": str(HOSPITAL), "id_column": "pid",
             "label_column": "outcome", "categorical": ["sex", "ward"]},
            {"name": "lab", "file": str(LAB), "id_column": "pid", "impute": "median"}]},
        "protocol": {"name": "holdout", "test_fraction": 0.25, "test_from": "aligned"},
        "methods": [{"name": "local"}, {"name": "splitnn", "train": QUICK}, {"name": "centralized"}],
    }
    raw.update(changes)
    return raw


def _write(path: Path, raw: dict[str, Any]) -> Path:
    """A TOML file from a dict (tables one level deep, arrays of tables for parties and methods)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return str(v)

    lines = [f"{k} = {value(v)}" for k, v in raw.items() if not isinstance(v, dict | list)]
    for table in ("protocol", "alignment", "report"):
        if table in raw:
            lines += [f"[{table}]", *(f"{k} = {value(v)}" for k, v in raw[table].items())]
    scenario = raw["scenario"]
    lines += ["[scenario]", *(f"{k} = {value(v)}" for k, v in scenario.items() if k not in ("parties", "sweep"))]
    for party in scenario["parties"]:
        lines += ["[[scenario.parties]]", *(f"{k} = {value(v)}" for k, v in party.items())]
    if "sweep" in scenario:
        lines += ["[scenario.sweep]", *(f'"{k}" = {value(v)}' for k, v in scenario["sweep"].items())]
    for method in raw["methods"]:
        lines += ["[[methods]]", *(f"{k} = {value(v)}" for k, v in method.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


# -- reading a party's file -----------------------------------------------------------------------------


def test_a_table_is_read_the_same_from_csv_gz_tsv_and_parquet(tmp_path: Path) -> None:
    frame = pd.read_csv(HOSPITAL, dtype={"pid": str})
    frame.to_csv(tmp_path / "h.csv.gz", index=False)
    frame.to_csv(tmp_path / "h.tsv", sep="\t", index=False)
    frame.to_parquet(tmp_path / "h.parquet")
    tables = [PartyData.from_file(tmp_path / name, party="h", id_column="pid", label_column="outcome",
                                  categorical=["sex", "ward"]) for name in ("h.csv.gz", "h.tsv", "h.parquet")]
    for t in tables[1:]:
        assert np.array_equal(t.ids, tables[0].ids) and np.array_equal(t.X, tables[0].X)
        assert np.array_equal(t.y, tables[0].y)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="cannot tell the format of h.xlsx"):
        (tmp_path / "h.xlsx").write_text("x")
        PartyData.from_file(tmp_path / "h.xlsx", party="h", id_column="pid")


def test_categorical_columns_are_one_hot_and_text_labels_get_codes() -> None:
    data = PartyData.from_file(HOSPITAL, party="hospital", id_column="pid", label_column="outcome",
                               categorical=["sex", "ward"], drop_columns=["stay_days"])
    enc = data.encoding
    assert isinstance(enc, TableEncoding)
    assert data.columns == ("age", "bmi", "sex=F", "sex=M", "ward=cardio", "ward=general", "ward=ortho", "systolic")
    assert set(data.categorical) == {"sex=F", "sex=M", "ward=cardio", "ward=general", "ward=ortho"}
    assert np.all(data.X[:, 2] + data.X[:, 3] == 1)
    assert enc.classes == ("readmitted", "recovered") and enc.task == "binary"
    frame = pd.read_csv(HOSPITAL, dtype={"pid": str})
    assert (np.asarray(enc.classes)[data.y] == frame.outcome.to_numpy()).all()  # type: ignore[index]
    # a category never seen in training scores as all zeros; the encoding holds names, never values
    new = frame.head(3).assign(ward=["icu", "ortho", "cardio"])
    X = enc.features(new)
    assert X[0, 4:7].tolist() == [0.0, 0.0, 0.0] and X[1, 4:7].tolist() == [0.0, 0.0, 1.0]
    assert TableEncoding.from_dict(json.loads(json.dumps(enc.to_dict()))) == enc


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"id_column": "pd"}, DataError, r"ID column 'pd' not in the table \(did you mean 'pid'\?\)"),
    ({"label_column": "outcom"}, DataError, "label column 'outcom' not in the table .*did you mean 'outcome'"),
    ({"categorical": []}, DataError, r"columns \['sex', 'ward'\] hold text; list them under categorical"),
    ({"drop_columns": ["agee"]}, DataError, r"drop_columns 'agee' not in the table \(did you mean 'age'\?\)"),
    ({"task": "regression"}, DataError, "task = 'regression' but label column 'outcome' holds text"),
])
def test_a_bad_table_is_named_with_its_fix(change: dict[str, Any], error: type[Exception], message: str) -> None:
    settings: dict[str, Any] = {"party": "hospital", "id_column": "pid", "label_column": "outcome",
                                "categorical": ["sex", "ward"], **change}
    with pytest.raises(error, match=message):
        PartyData.from_file(HOSPITAL, **settings)


# -- experiments on the parties' files ---------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [
    {"name": "holdout", "test_fraction": 0.25, "test_from": "aligned"},
    {"name": "aligned_holdout", "test_rows": 20, "repeats": 1},
    {"name": "repeated_runs", "runs": 2, "test_fraction": 0.2, "test_from": "aligned"},
    {"name": "active_cv", "folds": 3, "repeats": 1, "test_from": "aligned"},
])
def test_every_protocol_runs_on_the_files(protocol: dict[str, Any]) -> None:
    result = run_experiment(parse_config(own_config(protocol=protocol)))
    frame = pd.DataFrame(result.rows)
    assert (frame.status == "ok").all() and set(frame.method) == {"local", "splitnn", "centralized"}
    assert result.dataset.classes == ("readmitted", "recovered")
    # the test rows are the active party's labelled rows that the lab also holds
    assert (frame.aligned == 100).all()


def test_a_sweep_caps_the_real_overlap() -> None:
    raw = own_config()
    raw["scenario"]["sweep"] = {"samples.aligned": [30, 1.0]}
    cfg = parse_config(raw)
    layouts = [cfg.layout(v, 0, None) for v in cfg.variants]
    assert [len(layout.aligned_ids()) for layout in layouts] == [30, 100]
    small, full = layouts
    assert len(small.rows["lab"]) == 120 - 70 and len(small.rows["hospital"]) == 150  # the lab loses 70 shared
    assert set(small.aligned_ids().tolist()) < set(full.aligned_ids().tolist())


def test_the_party_with_the_labels_is_active_unless_the_config_says_otherwise() -> None:
    """A newcomer's config names files and a label column but no roles, and lists methods by name."""
    raw = own_config(methods=["local", "centralized"])
    for party in raw["scenario"]["parties"]:
        party.pop("role", None)
    cfg = parse_config(raw)
    assert {p.name: p.role for p in cfg.variants[0].spec.parties} == {"hospital": "active", "lab": "passive"}
    assert [m.label for m in cfg.methods] == ["local", "centralized"]
    raw["scenario"]["parties"][0]["role"] = "passive"
    with pytest.raises(ConfigError, match="set role = 'active' on the party with the labels"):
        parse_config(raw)
    with pytest.raises(ConfigError,
                       match=r"methods\[0\] needs a name.*methods = \['NAME', \.\.\.\] \(vflo methods lists them\)"):
        parse_config(own_config(methods=[{"train": QUICK}]))


def test_scenario_prints_the_real_overlap_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scenario", str(REPO / "configs/examples/own_files.toml")]) == 0
    out = capsys.readouterr().out
    assert "task: binary, classes ['readmitted', 'recovered']" in out
    assert "hospital       150  100" in out and "lab            100  120" in out


def test_text_labels_and_their_mapping_reach_the_results(tmp_path: Path) -> None:
    config = _write(tmp_path / "own.toml", own_config(methods=[{"name": "local"}]))
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 0
    results = json.loads((tmp_path / "out/results.json").read_text())
    assert results["dataset"]["classes"] == ["readmitted", "recovered"]
    assert "0 = readmitted, 1 = recovered" in (tmp_path / "out/report.md").read_text()


def test_one_failing_method_keeps_the_others(tmp_path: Path) -> None:
    # APC-VFL asked for a latent narrower than the lab's five columns fails at the lab; the others still run and
    # are written (Entity Augmentation among them: its host holds features of its own).
    config = _write(tmp_path / "own.toml", own_config(methods=[
        {"name": "local"}, {"name": "apc_vfl", "passive_encoder": [2], "train": QUICK},
        {"name": "entity_augmentation", "train": QUICK}, {"name": "centralized"}]))
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2  # the failure's own code: a setting
    frame = pd.read_csv(tmp_path / "out/results.csv")
    assert dict(zip(frame.method, frame.status, strict=True)) == {
        "local": "ok", "apc_vfl": "failed", "entity_augmentation": "ok", "centralized": "ok"}
    assert "encoder's latent is only 2 wide" in (tmp_path / "out/report.md").read_text()


# -- bad cases: a clear error, its exit code, no output ----------------------------------------------------


def _refused(tmp_path: Path, raw: dict[str, Any], code: int, message: str,
             capsys: pytest.CaptureFixture[str]) -> None:
    config = _write(tmp_path / "bad.toml", raw)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == code
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_rows_a_collaborative_method_cannot_score(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = own_config(protocol={"name": "holdout", "test_fraction": 0.3, "test_from": "active"})
    _refused(tmp_path, raw, AlignmentError.exit_code, "splitnn scores together with 'lab', which does not hold", capsys)


def test_files_whose_ids_never_match(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = pd.read_csv(LAB, dtype={"pid": str})
    lab["pid"] = "L" + lab["pid"]
    lab.to_csv(tmp_path / "lab.csv", index=False)
    raw = own_config()
    raw["scenario"]["parties"][1]["file"] = str(tmp_path / "lab.csv")
    _refused(tmp_path, raw, AlignmentError.exit_code, "shares no ID with ['lab']", capsys)


def test_a_party_left_without_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = own_config()
    raw["scenario"]["parties"][1]["feature_columns"] = []
    _refused(tmp_path, raw, ScenarioError.exit_code, "passive parties ['lab'] hold no feature columns", capsys)


def test_a_negative_count_inside_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = own_config()
    raw["scenario"]["sweep"] = {"samples.aligned": [50, -20]}
    _refused(tmp_path, raw, ConfigError.exit_code, "samples.aligned must be non-negative, got -20", capsys)


def test_an_unknown_key_in_a_party_file_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = own_config()
    raw["scenario"]["parties"][1]["id_colum"] = "pid"
    _refused(tmp_path, raw, ConfigError.exit_code, "unknown key 'scenario.parties[1].id_colum' (did you mean "
             "'id_column'?)", capsys)


def test_file_and_dataset_parties_do_not_mix() -> None:
    raw = own_config()
    raw["scenario"]["parties"][1] = {"name": "lab", "columns": "rest"}
    with pytest.raises(ConfigError, match="a scenario is built either from every party's own file or from one"):
        parse_config(raw)
    with pytest.raises(ConfigError, match="there is no dataset to split: remove \\[dataset\\]"):
        parse_config(own_config(dataset={"name": "wine"}))


# -- the Python API ---------------------------------------------------------------------------------------------


def test_the_api_gives_the_numbers_of_an_experiment_with_the_same_seed() -> None:
    hospital = PartyData.from_file(HOSPITAL, party="hospital", id_column="pid", label_column="outcome",
                                   categorical=["sex", "ward"])
    lab = PartyData.from_file(LAB, party="lab", id_column="pid", impute="median")
    split = vflo.hold_out([hospital, lab], test=0.25, seed=3)
    assert not set(split.test_ids.tolist()) & set(split.train["lab"].ids.tolist())
    assert not set(split.test_ids.tolist()) & set(split.train["hospital"].ids.tolist())
    model = vflo.fit("splitnn", split, seed=3, train=QUICK)
    metrics = vflo.evaluate(model, split)
    result = run_experiment(parse_config({**own_config(methods=[{"name": "splitnn", "train": QUICK}]), "seed": 3}))
    assert metrics["accuracy"] == pytest.approx(result.rows[0]["accuracy"])
    assert metrics["comm_bytes"] == result.rows[0]["fit_bytes"]
    assert model.classes == ("readmitted", "recovered") and model.predict().shape == (len(split.test_ids), 2)
    assert vflo.evaluate(vflo.fit("single", split))["accuracy"] > 0  # oracle baselines work on user data
    with pytest.raises(ConfigError, match="exactly one party holds the labels"):
        vflo.hold_out([lab, PartyData.from_file(LAB, party="lab2", id_column="pid", impute="median")])
    with pytest.warns(DeprecationWarning, match="vflo.split is now vflo.hold_out"):
        former = vflo.split([hospital, lab], test=0.25, seed=3)
    assert np.array_equal(former.test_ids, split.test_ids)  # the same function under its former name


# -- vflo holdout ------------------------------------------------------------------------------------------------


def test_holdout_cuts_files_that_never_overlap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cut"
    assert main(["holdout", str(HOSPITAL), str(LAB), "--parties", "hospital,lab", "--id-column", "pid",
                 "--label-column", "outcome", "--test", "20", "--out", str(out)]) == 0
    read = {name: read_table(out / f"{name}.csv", party="x", id_column="pid") for name in
            ("hospital_train", "hospital_serve", "hospital_test", "lab_train", "lab_serve")}
    test = set(read["hospital_test"].pid)
    assert len(test) == 20 and "outcome" not in read["hospital_serve"] and "outcome" in read["hospital_test"]
    assert not test & set(read["hospital_train"].pid) and not test & set(read["lab_train"].pid)
    assert set(read["lab_serve"].pid) == test == set(read["hospital_serve"].pid)  # aligned test rows by default
    assert len(read["hospital_train"]) + 20 == 150 and len(read["lab_train"]) + 20 == 120
    assert main(["holdout", str(HOSPITAL), "--parties", "hospital", "--id-column", "pid", "--label-column",
                 "outcome", "--out", str(tmp_path / "one")]) == 2
    # Its former name still works, and says it is the former one.
    assert main(["split", str(HOSPITAL), str(LAB), "--parties", "hospital,lab", "--id-column", "pid",
                 "--label-column", "outcome", "--test", "20", "--out", str(tmp_path / "former")]) == 0
    assert "vflo split is now vflo holdout" in " ".join(capsys.readouterr().err.split())
    assert (tmp_path / "former" / "hospital_test.csv").read_text() == (out / "hospital_test.csv").read_text()
