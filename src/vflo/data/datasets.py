"""Datasets by name, with the metadata results need: task, classes, real or stand-in.

A stand-in is generated data shaped like a dataset that cannot be had offline
(MIMIC-III needs credentials). Its name ends in ``_standin`` and every table,
report and plot that shows its results says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

# Datasets defined in their own modules register in the catalogue when imported here, before any lookup.
from vflo.data import images, multiview, standins  # noqa: F401
from vflo.data.catalog import DATASETS, Dataset, DatasetSpec, Task, infer_task, register_dataset
from vflo.data.datadir import DataFile, locate
from vflo.errors import ConfigError, unknown_name

# What a dataset is lives in vflo.data.catalog; it is named here too, where every dataset is found.
__all__ = ["Dataset", "DatasetSpec", "Task", "dataset_specs", "get_spec", "infer_task", "load_dataset",
           "register_dataset"]


def dataset_specs() -> dict[str, DatasetSpec]:
    return dict(DATASETS)


def get_spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise ConfigError(unknown_name("dataset", name, DATASETS)) from None


def load_dataset(name: str, data_dir: str | Path | None = None) -> Dataset:
    """Load a dataset by name; files are read from the data directory and checksum-verified."""
    return get_spec(name).loader(data_dir)


# --- scikit-learn datasets --------------------------------------------------------------------


def _sklearn(name: str, loader: str, task: Task, source: str) -> Callable[..., Dataset]:
    """A loader for scikit-learn's bundled dataset ``loader`` (imported when the dataset is loaded, not before)."""

    def load(_data_dir: Path | str | None) -> Dataset:
        from sklearn import datasets as skd

        bunch = getattr(skd, loader)(as_frame=True)
        frame: pd.DataFrame = bunch.data.astype(np.float64)
        if task == "regression":
            target = np.asarray(bunch.target, dtype=np.float64)
            return Dataset(name=name, X=frame.reset_index(drop=True), y=target, ids=np.arange(len(target)),
                           task=task, n_classes=None, standin=False, source=source)
        y = np.asarray(bunch.target, dtype=np.int64)
        return Dataset(
            name=name, X=frame.reset_index(drop=True), y=y, ids=np.arange(len(y), dtype=np.int64),
            task=task, n_classes=int(y.max()) + 1, standin=False, source=source,
        )

    return load


def _register_sklearn() -> None:
    register_dataset(DatasetSpec(
        name="breast_cancer", task="binary", n_classes=2, shape=(569, 30),
        source="Breast Cancer Wisconsin (Diagnostic), Wolberg et al. 1995, via scikit-learn",
        loader=_sklearn("breast_cancer", "load_breast_cancer", "binary",
                        "Breast Cancer Wisconsin (Diagnostic), via scikit-learn"),
    ))
    register_dataset(DatasetSpec(
        name="wine", task="multiclass", n_classes=3, shape=(178, 13),
        source="UCI Wine, via scikit-learn",
        loader=_sklearn("wine", "load_wine", "multiclass", "UCI Wine, via scikit-learn"),
    ))
    register_dataset(DatasetSpec(
        name="digits", task="multiclass", n_classes=10, shape=(1797, 64),
        source="UCI optical digits 8x8, via scikit-learn",
        loader=_sklearn("digits", "load_digits", "multiclass", "UCI optical digits 8x8, via scikit-learn"),
    ))
    register_dataset(DatasetSpec(
        name="diabetes", task="regression", n_classes=None, shape=(442, 10),
        source="Diabetes (Efron et al. 2004, disease progression after one year), via scikit-learn",
        loader=_sklearn("diabetes", "load_diabetes", "regression",
                        "Diabetes (Efron et al. 2004), via scikit-learn"),
    ))


# --- files from the data directory ---------------------------------------------------------------

CREDIT_FILE = DataFile(
    name="UCI_Credit_Card.csv.gz",
    sha256="1913d5f7d57f217b7e7c24d45a703d6ea3e023b4636e7cefce834b7896bbc380",
    description="the UCI 'default of credit card clients' table (ID, X1..X23, Y; 30000 rows)",
    alternatives=(("UCI_Credit_Card.csv", "023eb2c3ad9efd15e7869616fa50a0143f25223105c7069ba632431530afdb61"),),
)
PARKINSONS_FILE = DataFile(
    name="parkinsons.data",
    sha256="742c51c827d62e5d6b2dc8c092ce48fe275d932d8c651752436b681ab903341d",
    description="the UCI Parkinsons voice table (name, 22 features, status; 195 rows)",
)


def _load_credit(data_dir: Path | str | None) -> Dataset:
    path = locate(CREDIT_FILE, data_dir)
    frame = pd.read_csv(path)
    features = frame[[f"X{i}" for i in range(1, 24)]].astype(np.float64)
    return Dataset(
        name="credit_default", X=features, y=frame["Y"].to_numpy(np.int64),
        ids=frame["ID"].to_numpy(np.int64), task="binary", n_classes=2, standin=False,
        source="UCI default of credit card clients, Yeh & Lien 2009",
    )


def _load_parkinsons(data_dir: Path | str | None) -> Dataset:
    path = locate(PARKINSONS_FILE, data_dir)
    frame = pd.read_csv(path)
    y = frame["status"].to_numpy(np.int64)
    features = frame.drop(columns=["name", "status"]).astype(np.float64)
    return Dataset(
        name="parkinsons", X=features, y=y, ids=frame["name"].to_numpy().astype(str), task="binary",
        n_classes=2, standin=False, source="UCI Parkinsons (195-row voice set), Little et al. 2008",
    )


register_dataset(DatasetSpec(
    name="credit_default", task="binary", n_classes=2, shape=(30000, 23),
    source="UCI default of credit card clients (Yeh & Lien 2009); file from the data directory",
    loader=_load_credit, files=(CREDIT_FILE,),
))
register_dataset(DatasetSpec(
    name="parkinsons", task="binary", n_classes=2, shape=(195, 22),
    source="UCI Parkinsons (Little et al. 2008), 195 rows; file from the data directory",
    loader=_load_parkinsons, files=(PARKINSONS_FILE,),
))
_register_sklearn()

