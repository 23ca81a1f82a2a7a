"""What a dataset is (its rows, task, classes, whether it is a stand-in) and the catalogue datasets register in.

:mod:`vflo.data.datasets` imports every module that registers datasets and looks them up by name; the modules
that define datasets (:mod:`~vflo.data.images`, :mod:`~vflo.data.multiview`, :mod:`~vflo.data.standins` and
``datasets`` itself) register here, so none of them imports the others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import pandas as pd

from vflo.data.datadir import DataFile
from vflo.errors import DataError

Task = Literal["binary", "multiclass", "regression"]


def as_task(text: str) -> Task:
    """``text`` as a task, or the error that names the tasks there are (a task read from a saved model card)."""
    for task in get_args(Task):
        if text == task:
            return task  # type: ignore[no-any-return]  # get_args loses the Literal: each value is one of Task's
    raise DataError(f"unknown task {text!r}: one of {', '.join(map(repr, get_args(Task)))}")


def infer_task(y: np.ndarray) -> Task:
    """The task encoded labels describe where no config says it: floats are a regression target, class codes
    0/1 binary, more codes multiclass. (A raw label column's kind is read in :mod:`vflo.data.files`, from its
    values, before it is encoded.)"""
    if y.dtype.kind == "f":
        return "regression"
    return "binary" if len(y) == 0 or int(y.max()) <= 1 else "multiclass"


@dataclass(frozen=True, eq=False)
class Dataset:
    """A full table before it is split between parties (simulation only).

    ``X`` holds float features with their names, ``y`` int class indices 0..C-1 or float
    targets, ``ids`` one unique ID per row. ``views`` names groups of columns that belong
    together (a multiview dataset's views, an image's halves), so a scenario can give a
    party a whole view.
    """

    name: str
    X: pd.DataFrame
    y: np.ndarray
    ids: np.ndarray
    task: Task
    n_classes: int | None
    standin: bool
    source: str
    standin_for: str | None = None
    views: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    categorical: tuple[str, ...] = ()
    # Class names in code order, where labels were text (or numbers other than 0..C-1) in the source.
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.X) != len(self.y) or len(self.X) != len(self.ids):
            raise DataError(f"dataset {self.name!r}: X, y and ids have different lengths")
        if len(np.unique(self.ids)) != len(self.ids):
            raise DataError(f"dataset {self.name!r}: IDs are not unique")
        unknown = {v: [c for c in cols if c not in self.X.columns] for v, cols in self.views.items()}
        if any(unknown.values()):
            raise DataError(f"dataset {self.name!r}: views name unknown columns {unknown}")

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(str(c) for c in self.X.columns)

    @property
    def label(self) -> str:
        """Display name: stand-ins say so."""
        return f"{self.name} (stand-in for {self.standin_for}, generated data)" if self.standin else self.name


@dataclass(frozen=True)
class DatasetSpec:
    """How to load a dataset, and what it is without loading it."""

    name: str
    task: Task
    n_classes: int | None
    shape: tuple[int, int]
    source: str
    loader: Callable[[Path | str | None], Dataset] = field(repr=False)
    standin_for: str | None = None
    files: tuple[DataFile, ...] = ()
    views: tuple[str, ...] = ()
    needs: str = ""

    @property
    def standin(self) -> bool:
        return self.standin_for is not None


DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    if spec.name in DATASETS:
        raise ValueError(f"dataset {spec.name!r} registered twice")
    DATASETS[spec.name] = spec
    return spec
