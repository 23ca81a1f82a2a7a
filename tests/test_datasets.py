from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from vflo.data.datadir import ENV_VAR, resolve_data_dir
from vflo.data.datasets import dataset_specs, load_dataset
from vflo.errors import ConfigError, DataFileError


@pytest.mark.parametrize(("name", "shape", "classes"), [
    ("breast_cancer", (569, 30), 2), ("wine", (178, 13), 3), ("digits", (1797, 64), 10),
])
def test_sklearn_datasets(name: str, shape: tuple[int, int], classes: int) -> None:
    """(diabetes, the one regression set, is checked below.)"""
    ds = load_dataset(name)
    assert ds.X.shape == shape and ds.n_classes == classes and not ds.standin
    assert set(np.unique(ds.y)) == set(range(classes))
    assert dataset_specs()[name].shape == shape


def test_breast_cancer_has_the_apc_vfl_column_names() -> None:
    cols = load_dataset("breast_cancer").columns
    for c in ("worst compactness", "concave points error", "smoothness error", "mean texture",
              "worst fractal dimension"):
        assert c in cols


def test_credit_and_parkinsons_from_the_data_directory(data_dir: Path) -> None:
    credit = load_dataset("credit_default", data_dir)
    assert credit.X.shape == (30000, 23) and credit.columns[0] == "X1" and int(credit.y.sum()) == 6636
    park = load_dataset("parkinsons", data_dir)
    assert park.X.shape == (195, 22) and int(park.y.sum()) == 147
    assert park.ids.dtype.kind == "U"


def test_missing_file_says_what_to_put_where(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"UCI_Credit_Card.csv.gz not found in .*Put the UCI") as err:
        load_dataset("credit_default", tmp_path)
    assert "SHA-256 1913d5f7" in str(err.value)


def test_corrupt_file_fails_its_checksum(tmp_path: Path, data_dir: Path) -> None:
    bad = tmp_path / "parkinsons.data"
    shutil.copy(data_dir / "parkinsons.data", bad)
    with bad.open("a") as fh:
        fh.write("tampered\n")
    with pytest.raises(DataFileError, match="fails its checksum"):
        load_dataset("parkinsons", tmp_path)


def test_data_dir_resolution_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert resolve_data_dir() == tmp_path
    assert resolve_data_dir("/elsewhere") == Path("/elsewhere")
    monkeypatch.delenv(ENV_VAR)
    assert resolve_data_dir() == Path("~/.vflo/data").expanduser()


def test_standin_says_it_is_one() -> None:
    ds = load_dataset("mimic3_los_standin")
    assert ds.X.shape == (58976, 15) and ds.n_classes == 4 and ds.standin
    assert "stand-in" in ds.label and "NOT real data" in ds.source
    again = load_dataset("mimic3_los_standin")
    assert np.array_equal(ds.X.to_numpy(), again.X.to_numpy())


def test_unknown_dataset_has_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"unknown dataset 'breast_cancr' \(did you mean 'breast_cancer'\?\)"):
        load_dataset("breast_cancr")


def test_handwritten_has_six_views() -> None:
    ds = load_dataset("handwritten")
    assert ds.X.shape == (2000, 649) and ds.n_classes == 10
    assert {k: len(v) for k, v in ds.views.items()} == {"fou": 76, "fac": 216, "kar": 64, "pix": 240, "zer": 47,
                                                        "mor": 6}


def test_mnist5000_has_left_and_right_halves() -> None:
    ds = load_dataset("mnist5000")
    assert ds.X.shape == (5000, 784) and set(np.unique(ds.y)) == set(range(10))
    assert len(ds.views["left"]) == len(ds.views["right"]) == 392 and float(ds.X.to_numpy().max()) <= 1.0
    assert ds.views["left"][:2] == ("px_0_0", "px_0_1") and ds.views["right"][0] == "px_0_14"


def test_fashion_mnist_loads_or_says_how_to_install(tmp_path: Path) -> None:
    from vflo.data.images import FASHION

    if all(f.elsewhere()[0].joinpath(f.name).is_file() for f in FASHION.values()):  # type: ignore[union-attr]
        ds = load_dataset("fashion_mnist")
        assert ds.X.shape == (70000, 784) and ds.n_classes == 10
    else:  # pragma: no cover - where the Debian package is not installed
        with pytest.raises(DataFileError, match="apt-get install dataset-fashion-mnist"):
            load_dataset("fashion_mnist", tmp_path)


def test_a_party_can_take_whole_views() -> None:
    from vflo.data.scenario import PartySpec, ScenarioSpec
    from vflo.errors import ScenarioError

    ds = load_dataset("handwritten")
    spec = ScenarioSpec(parties=(PartySpec(name="host", role="active", columns=()),
                                 *(PartySpec(name=v, views=(v,)) for v in ds.views)))
    layout = spec.build(ds, seed=0)
    assert layout.columns["pix"] == ds.views["pix"]
    bad = ScenarioSpec(parties=(PartySpec(name="host", role="active", columns=()),
                                PartySpec(name="g", views=("pixx",))), unused_columns="drop")
    with pytest.raises(ScenarioError, match=r"views \['pixx'\] not in dataset 'handwritten' \(did you mean 'pix'\?\)"):
        bad.build(ds, seed=0)


def test_diabetes_is_a_regression_dataset() -> None:
    ds = load_dataset("diabetes")
    assert ds.X.shape == (442, 10) and ds.task == "regression" and ds.n_classes is None and ds.y.dtype == np.float64
