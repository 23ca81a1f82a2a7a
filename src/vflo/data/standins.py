"""Generated stand-ins for datasets that cannot be had offline.

A stand-in has the shape and class count of the dataset it stands in for, is fixed by
its seed, and says it is one (``standin = True``) wherever its results appear.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from vflo.data.catalog import Dataset, DatasetSpec, register_dataset

# The 15 MIMIC-III length-of-stay features after Huang et al.'s preprocessing, as named by APC-VFL.
MIMIC3_COLUMNS = (
    "Age", "NumCalouts", "NumDiagnosis", "NumProcs", "NumCPTevents", "NumInput", "NumLabs",
    "NumMicroLabs", "NumNotes", "NumOutput", "NumRx", "NumProcEvents", "NumTransfers",
    "NumChartEvents", "TotalNumInteract",
)


def classification_standin(
    *, name: str, standin_for: str, n_samples: int, columns: tuple[str, ...], n_classes: int,
    n_informative: int, weights: tuple[float, ...] | None, class_sep: float, flip_y: float, seed: int,
) -> Callable[[Path | str | None], Dataset]:
    """Loader for a generated classification stand-in; the data is fixed by ``seed``."""

    def load(_data_dir: Path | str | None) -> Dataset:
        from sklearn.datasets import make_classification

        X, y = make_classification(
            n_samples=n_samples, n_features=len(columns), n_informative=n_informative,
            n_redundant=max(0, (len(columns) - n_informative) // 2), n_classes=n_classes,
            n_clusters_per_class=2, weights=list(weights) if weights else None, class_sep=class_sep,
            flip_y=flip_y, shuffle=True, random_state=seed,
        )
        return Dataset(
            name=name, X=pd.DataFrame(X, columns=list(columns)), y=y.astype(np.int64),
            ids=np.arange(n_samples, dtype=np.int64), task="binary" if n_classes == 2 else "multiclass",
            n_classes=n_classes, standin=True, standin_for=standin_for,
            source=f"generated stand-in for {standin_for} (make_classification, seed {seed}); NOT real data",
        )

    return load


register_dataset(DatasetSpec(
    name="mimic3_los_standin", task="multiclass", n_classes=4, shape=(58976, 15),
    source="generated stand-in for MIMIC-III length of stay (58976 x 15, 4 classes); NOT real data",
    standin_for="MIMIC-III length of stay",
    loader=classification_standin(
        name="mimic3_los_standin", standin_for="MIMIC-III length of stay", n_samples=58976,
        columns=MIMIC3_COLUMNS, n_classes=4, n_informative=8, weights=(0.35, 0.3, 0.2, 0.15),
        class_sep=0.8, flip_y=0.05, seed=20160524,
    ),
))


def regression_standin(
    *, name: str, standin_for: str, n_samples: int, n_features: int, n_informative: int, scale: float,
    offset: float, noise: float, seed: int,
) -> Callable[[Path | str | None], Dataset]:
    """Loader for a generated regression stand-in: a nonlinear target of a few informative features."""

    def load(_data_dir: Path | str | None) -> Dataset:
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(n_samples, n_features))
        w = rng.normal(size=n_informative)
        signal = X[:, :n_informative] @ w + 0.5 * np.tanh(X[:, 0] * X[:, 1]) + 0.3 * X[:, 2] ** 2
        signal = (signal - signal.mean()) / signal.std()
        y = offset + scale * (signal + noise * rng.normal(size=n_samples))
        perm = rng.permutation(n_features)
        columns = [f"f{i}" for i in range(n_features)]
        return Dataset(
            name=name, X=pd.DataFrame(X[:, perm], columns=columns), y=y.astype(np.float64),
            ids=np.arange(n_samples, dtype=np.int64), task="regression", n_classes=None, standin=True,
            standin_for=standin_for, source=f"generated stand-in for {standin_for} (seed {seed}); NOT real data",
        )

    return load


def covertype_standin_loader(seed: int = 1998, n_samples: int = 581_012) -> Callable[[Path | str | None], Dataset]:
    """10 numerical columns and 44 binary indicator columns (4 wilderness areas, 40 soil types), 7 classes."""

    def load(_data_dir: Path | str | None) -> Dataset:
        from sklearn.datasets import make_classification

        X_num, y = make_classification(n_samples=n_samples, n_features=10, n_informative=7, n_redundant=2,
                                       n_classes=7, n_clusters_per_class=2, class_sep=1.2, flip_y=0.03,
                                       random_state=seed)
        rng = np.random.default_rng(seed)
        # Each class prefers a few wilderness areas and soil types, so the indicators carry signal.
        wild_pref = rng.dirichlet(np.ones(4) * 0.5, size=7)
        soil_pref = rng.dirichlet(np.ones(40) * 0.2, size=7)
        wild = np.empty(n_samples, dtype=np.int64)
        soil = np.empty(n_samples, dtype=np.int64)
        for c in range(7):
            rows = np.flatnonzero(y == c)
            wild[rows] = rng.choice(4, size=len(rows), p=wild_pref[c])
            soil[rows] = rng.choice(40, size=len(rows), p=soil_pref[c])
        indicators = np.zeros((n_samples, 44))
        indicators[np.arange(n_samples), wild] = 1.0
        indicators[np.arange(n_samples), 4 + soil] = 1.0
        columns = [f"num{i}" for i in range(10)] + [f"wilderness{i}" for i in range(4)]
        columns += [f"soil{i}" for i in range(40)]
        return Dataset(
            name="covertype_standin", X=pd.DataFrame(np.hstack([X_num, indicators]), columns=columns),
            y=y.astype(np.int64), ids=np.arange(n_samples, dtype=np.int64), task="multiclass", n_classes=7,
            standin=True, standin_for="Covertype", categorical=tuple(columns[10:]),
            source=f"generated stand-in for Covertype (10 numeric + 44 binary indicator columns, seed {seed}); "
                   "NOT real data",
        )

    return load


def _numbered(n: int) -> tuple[str, ...]:
    return tuple(f"f{i}" for i in range(n))


register_dataset(DatasetSpec(
    name="susy_standin", task="binary", n_classes=2, shape=(1_000_000, 18), standin_for="SUSY",
    source="generated stand-in for SUSY (1M x 18, binary); NOT real data",
    loader=classification_standin(name="susy_standin", standin_for="SUSY", n_samples=1_000_000,
                                  columns=_numbered(18), n_classes=2, n_informative=8, weights=(0.54, 0.46),
                                  class_sep=0.7, flip_y=0.15, seed=2014),
))
register_dataset(DatasetSpec(
    name="higgs_standin", task="binary", n_classes=2, shape=(1_000_000, 28), standin_for="HIGGS",
    source="generated stand-in for HIGGS (1M x 28, binary); NOT real data",
    loader=classification_standin(name="higgs_standin", standin_for="HIGGS", n_samples=1_000_000,
                                  columns=_numbered(28), n_classes=2, n_informative=10, weights=(0.47, 0.53),
                                  class_sep=0.5, flip_y=0.2, seed=2012),
))
register_dataset(DatasetSpec(
    name="covertype_standin", task="multiclass", n_classes=7, shape=(581_012, 54), standin_for="Covertype",
    source="generated stand-in for Covertype (581012 x 54, 44 categorical indicators, 7 classes); NOT real data",
    loader=covertype_standin_loader(),
))
register_dataset(DatasetSpec(
    name="yearprediction_standin", task="regression", n_classes=None, shape=(515_345, 90),
    standin_for="YearPredictionMSD", source="generated stand-in for YearPredictionMSD (515345 x 90); NOT real data",
    loader=regression_standin(name="yearprediction_standin", standin_for="YearPredictionMSD", n_samples=515_345,
                              n_features=90, n_informative=20, scale=10.0, offset=1998.0, noise=0.8, seed=2011),
))
register_dataset(DatasetSpec(
    name="houseprice_standin", task="regression", n_classes=None, shape=(500_000, 11), standin_for="HousePricing",
    source="generated stand-in for HousePricing (500000 x 11); NOT real data",
    loader=regression_standin(name="houseprice_standin", standin_for="HousePricing", n_samples=500_000,
                              n_features=11, n_informative=6, scale=0.5, offset=12.0, noise=0.15, seed=2016),
))
register_dataset(DatasetSpec(
    name="woc_standin", task="regression", n_classes=None, shape=(50_000, 20), standin_for="WOC",
    source="generated stand-in for WOC (50000 x 20); NOT real data",
    loader=regression_standin(name="woc_standin", standin_for="WOC", n_samples=50_000, n_features=20,
                              n_informative=10, scale=200.0, offset=1000.0, noise=0.45, seed=2020),
))
