from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vflo.data.partydata import PartyData
from vflo.data.preprocessing import Standardizer
from vflo.errors import DataError, DataFileError


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"pid": ["a", "b", "c"], "age": [30, 40, 50], "bmi": [20.5, 22.0, 31.0], "y": [0, 1, 1]})


def test_from_frame_reads_ids_features_and_labels() -> None:
    data = PartyData.from_frame(_frame(), party="hospital", id_column="pid", label_column="y")
    assert data.columns == ("age", "bmi")
    assert data.X.dtype == np.float32 and data.X.shape == (3, 2)
    assert data.y is not None and data.y.tolist() == [0, 1, 1]
    assert data.ids.tolist() == ["a", "b", "c"]
    assert data.subset(["c", "a"]).X[:, 0].tolist() == [50.0, 30.0]


def test_arrays_are_read_only_so_no_party_can_alter_another_copy() -> None:
    data = PartyData.from_frame(_frame(), party="p", id_column="pid")
    with pytest.raises(ValueError, match="read-only"):
        data.X[0, 0] = 1.0


def test_many_text_ids_are_checked_without_a_hash_index_and_indexed_on_first_lookup(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vflo.data import partydata

    monkeypatch.setattr(partydata, "INDEX_LATER_FROM", 3)
    for ids in (np.array(["a", "b", "b", "c"]), np.array(["c", "b", "a", "b"])):  # sorted, then not
        with pytest.raises(DataError, match=r"duplicate sample IDs \['b'\]"):
            PartyData(party="p", ids=ids, X=np.zeros((4, 1)), columns=("x",))
    rows = PartyData(party="p", ids=np.array(["d", "a", "c", "b"]), X=np.arange(4.0)[:, None], columns=("x",))
    assert rows._index is None
    assert rows.subset(["c", "d"]).X.ravel().tolist() == [2.0, 0.0] and rows._index is not None


def test_duplicate_ids_are_refused_with_the_ids_named() -> None:
    with pytest.raises(DataError, match=r"duplicate sample IDs \[5\].*drop or merge"):
        PartyData(party="p", ids=[5, 5, 6], X=np.zeros((3, 1)), columns=("a",))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_infinite_values_are_refused(bad: float) -> None:
    X = np.zeros((3, 2))
    X[1, 1] = bad
    with pytest.raises(DataError, match=r"NaN or infinite feature values \(columns \['b'\]\); impute"):
        PartyData(party="p", ids=[1, 2, 3], X=X, columns=("a", "b"))


def test_non_numeric_feature_columns_are_named() -> None:
    frame = _frame().assign(city=["x", "y", "z"])
    with pytest.raises(DataError, match=r"columns \['city'\] hold text; list them under categorical"):
        PartyData.from_frame(frame, party="p", id_column="pid", label_column="y")


def test_missing_label_column_at_the_active_party() -> None:
    with pytest.raises(DataError, match="label column 'outcome' not in the table .*the active party must"):
        PartyData.from_frame(_frame(), party="p", id_column="pid", label_column="outcome")


def test_missing_id_column() -> None:
    with pytest.raises(DataError, match="ID column 'id' not in the table"):
        PartyData.from_frame(_frame(), party="p", id_column="id")


def test_labels_required_where_a_step_needs_them() -> None:
    data = PartyData(party="bank", ids=[1], X=np.zeros((1, 1)), columns=("a",))
    with pytest.raises(DataError, match="party 'bank' has no labels"):
        data.require_labels()


def test_unknown_ids_are_reported() -> None:
    data = PartyData(party="p", ids=[1, 2], X=np.zeros((2, 1)), columns=("a",))
    assert data.contains([2, 3]).tolist() == [True, False]
    with pytest.raises(DataError, match=r"holds no sample with ID \[3\]"):
        data.positions([3])


def test_shape_mismatches_are_refused() -> None:
    with pytest.raises(DataError, match="2 IDs but 3 feature rows"):
        PartyData(party="p", ids=[1, 2], X=np.zeros((3, 1)), columns=("a",))
    with pytest.raises(DataError, match="1 column names for 2 feature columns"):
        PartyData(party="p", ids=[1], X=np.zeros((1, 2)), columns=("a",))


def test_label_only_party_has_zero_columns() -> None:
    host = PartyData(party="host", ids=[1, 2], X=np.zeros((2, 0)), columns=(), y=[0, 1])
    assert host.n_features == 0 and host.has_labels


def test_a_header_only_file_is_a_party_with_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    _frame().iloc[:0].to_csv(path, index=False)
    data = PartyData.from_file(path, party="p", id_column="pid", feature_columns=["age", "bmi"])
    assert data.n_samples == 0 and data.X.shape == (0, 2) and data.columns == ("age", "bmi")


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".parquet"])
def test_from_file_reads_csv_gzip_and_parquet(tmp_path: Path, suffix: str) -> None:
    frame = _frame()
    path = tmp_path / f"party{suffix}"
    if suffix == ".parquet":
        frame.to_parquet(path)
    elif suffix == ".csv.gz":
        with gzip.open(path, "wt") as fh:
            frame.to_csv(fh, index=False)
    else:
        frame.to_csv(path, index=False)
    data = PartyData.from_file(path, party="p", id_column="pid", label_column="y")
    assert data.n_samples == 3 and data.columns == ("age", "bmi")


def test_from_file_missing_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="does not exist"):
        PartyData.from_file(tmp_path / "nope.csv", party="p", id_column="pid")
    odd = tmp_path / "data.xlsx"
    odd.write_text("x")
    with pytest.raises(DataFileError, match="cannot tell the format"):
        PartyData.from_file(odd, party="p", id_column="pid")


def test_standardizer_centres_on_fitted_rows_only() -> None:
    X = np.array([[1.0, 5.0], [3.0, 5.0]])
    scaler = Standardizer.fit(X)
    assert np.allclose(scaler.transform(X), [[-1.0, 0.0], [1.0, 0.0]])
    assert np.allclose(scaler.transform(np.array([[5.0, 6.0]])), [[3.0, 1.0]])
