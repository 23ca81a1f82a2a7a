"""Generated stand-ins for datasets that cannot be had offline.

A stand-in has the shape and class count of the dataset it stands in for, is fixed by
its seed, and says it is one (``standin = True``) wherever its results appear.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from vflo.data.datasets import Dataset, DatasetSpec, register_dataset

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
