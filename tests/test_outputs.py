"""Nothing lost: --overwrite replaces only what vflo wrote into a folder (issue 30, part 2). The user's walk had
`vflo holdout --overwrite` delete the CA, every private key and lab.toml kept in the split folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vflo.errors import ConfigError
from vflo.experiments.output import MANIFEST, atomic_dir, check_out_dir


def _write(out: Path, names: list[str], *, overwrite: bool) -> None:
    with atomic_dir(out, overwrite=overwrite) as tmp:
        for name in names:
            (tmp / name).write_text(name)


def test_overwrite_replaces_only_what_vflo_wrote(tmp_path: Path) -> None:
    out = tmp_path / "split"
    _write(out, ["hospital_train.csv", "lab_train.csv"], overwrite=False)
    assert json.loads((out / MANIFEST).read_text()) == ["hospital_train.csv", "lab_train.csv"]
    _write(out, ["hospital_train.csv"], overwrite=True)  # only its own outputs there: replaced
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "hospital_train.csv"]
    # The user keeps their keys and config beside the outputs: --overwrite now refuses, and deletes nothing.
    (out / "certs").mkdir()
    (out / "certs" / "lab.key").write_text("secret")
    (out / "lab.toml").write_text("name = 'lab'")
    with pytest.raises(ConfigError, match=r"it also holds \['certs', 'lab.toml'\], which vflo did not write"):
        _write(out, ["hospital_train.csv"], overwrite=True)
    assert (out / "certs" / "lab.key").read_text() == "secret" and (out / "lab.toml").is_file()


def test_a_folder_vflo_never_wrote_is_not_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="is not empty; choose another --out or pass --overwrite"):
        check_out_dir(out, overwrite=False)
    with pytest.raises(ConfigError, match="notes.txt"):
        check_out_dir(out, overwrite=True)
    saved = tmp_path / "models"
    (saved / "splitnn").mkdir(parents=True)
    (saved / "splitnn" / "model.json").write_text("{}")
    check_out_dir(saved, overwrite=True)  # saved models are vflo's own outputs


def test_split_reports_rows_and_gaps_and_overwrite_keeps_the_users_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    import pandas as pd

    from tests.test_own_files import HOSPITAL, LAB
    from vflo.cli import main

    lab = pd.read_csv(LAB)
    lab.loc[[0, 5, 9], "crp"] = None
    gappy = tmp_path / "lab.csv"
    lab.to_csv(gappy, index=False)
    out = tmp_path / "cut"
    args = ["holdout", str(HOSPITAL), str(gappy), "--parties", "hospital,lab", "--id-column", "pid",
            "--label-column", "outcome", "--test", "0.25", "--out", str(out)]
    assert main(args) == 0
    said = capsys.readouterr().out
    assert "test rows: 25 of the 100 people every party holds (--test 0.25, --test-from aligned)" in said, said
    assert "lab_train.csv (" in said and "rows; missing values in crp:" in said
    assert "hospital_train.csv (" in said and "some files have missing values" in said
    # The walk in the issue: keys and the lab's config kept in the split folder, then --overwrite.
    (out / "certs").mkdir()
    (out / "certs" / "lab.key").write_text("secret")
    (out / "lab.toml").write_text("name = 'lab'")
    assert main([*args, "--overwrite"]) == 2
    assert "which vflo did not write there" in capsys.readouterr().err
    assert (out / "certs" / "lab.key").read_text() == "secret" and (out / "lab.toml").is_file()
    (out / "certs" / "lab.key").unlink()
    (out / "certs").rmdir()
    (out / "lab.toml").unlink()
    assert main([*args, "--overwrite", "--seed", "1"]) == 0  # only its own outputs there: replaced


def test_a_party_names_the_file_that_holds_missing_values(tmp_path: Path) -> None:
    import pandas as pd

    from tests.test_own_files import LAB
    from vflo.deploy import DataConfig, load_party_data
    from vflo.errors import DataError

    lab = pd.read_csv(LAB).fillna(0.0)  # the example's own gaps (ferritin) filled: only the serving file has one
    lab.to_csv(tmp_path / "train.csv", index=False)
    lab.loc[[3], "ldl"] = None
    lab.to_csv(tmp_path / "serve.csv", index=False)
    config = DataConfig(file=str(tmp_path / "train.csv"), id_column="pid", serve_file=str(tmp_path / "serve.csv"))
    with pytest.raises(DataError, match=r"serve.csv: party 'lab': column 'ldl' has 1 missing values; fill them"):
        load_party_data("lab", config)
