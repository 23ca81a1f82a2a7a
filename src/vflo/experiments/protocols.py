"""Evaluation protocols: which rows are held out for testing, and how often.

Every protocol holds its test rows out of *every* party's training data: no encoder,
teacher or classifier sees them before scoring. Test rows are chosen among the
active party's rows (stratified by label for classification), either from all of
them (``test_from = 'active'``) or from those aligned with the other parties
(``test_from = 'aligned'``, needed by methods whose inference is collaborative), or from the rows only
the active party holds (``test_from = 'active_only'``: people no other party has seen, as a deployed
active-party-only model meets them).

* ``aligned_holdout`` – classical VFL: train and test on aligned rows only (APC-VFL's
  comparison with SplitNN: a fixed number of aligned test rows).
* ``holdout`` – one train / test split (RAP: 70 / 10 / 20, the 10 being each
  method's own validation split).
* ``active_cv`` – k-fold cross-validation over the active party's rows, repeated. With
  ``transductive = true`` it follows APC-VFL's and VFedTrans's own protocol instead: every
  encoder is trained on all rows once and only the final classifier is cross-validated, so the
  test rows' features (though never their labels) shaped the representation.
* ``repeated_runs`` – N seeded holdout runs, reported with a 95% t-interval (VFL-ASP).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from vflo import schema
from vflo.data.layout import Count, Layout
from vflo.data.scenario import can_stratify
from vflo.errors import ConfigError, ScenarioError, unknown_name

TestFrom = Literal["active", "aligned", "active_only"]
TrainScope = Literal["all", "aligned"]


@dataclass(frozen=True)
class Split:
    """One evaluation: the test IDs and which rows may be used for training."""

    fold: int
    test_ids: np.ndarray
    train_scope: TrainScope


@dataclass(frozen=True, kw_only=True)
class Protocol(ABC):
    name: ClassVar[str]

    @abstractmethod
    def repetitions(self) -> int:
        """How many times the whole evaluation is repeated with a fresh seed."""

    @abstractmethod
    def splits(self, layout: Layout, rng: np.random.Generator) -> list[Split]:
        """The test splits of one repeat."""

    def describe(self) -> str:
        return f"{self.name}: " + ", ".join(f"{k} = {v}" for k, v in schema.to_plain(self).items())

    def split_repeat(self, repeat: int) -> int:
        """Which repeat's layout and test rows ``repeat`` uses: its own, unless the protocol fixes them."""
        return 0 if getattr(self, "fixed_split", False) else repeat


def pool(layout: Layout, test_from: TestFrom) -> tuple[np.ndarray, np.ndarray]:
    """Candidate test IDs and their labels: with held-out test people (test blocks), exactly those."""
    active = layout.active
    held = layout.held_out(test_from)
    if held is not None:
        if len(held) == 0:
            raise ScenarioError(f"test_from = {test_from!r} but the scenario holds out no such test people; add "
                                "them (samples.test_aligned / test_active_only, or a test block)")
        ids = held
    elif test_from == "aligned":
        ids = layout.aligned_ids()
        if len(ids) == 0:
            raise ScenarioError("test_from = 'aligned' but the active party shares no row with the others")
    elif test_from == "active_only":
        ids = layout.ids(active)
        for p in layout.parties:
            if p.name != active:
                ids = np.setdiff1d(ids, layout.ids(p.name))
        if len(ids) == 0:
            raise ScenarioError("test_from = 'active_only' but every row of the active party is also held by "
                                "another party; add rows only the active party holds (a block of its own)")
    else:
        ids = np.sort(layout.ids(active))
    position = {v: i for i, v in enumerate(layout.dataset.ids.tolist())}
    y = layout.dataset.y[np.fromiter((position[v] for v in ids.tolist()), dtype=np.int64, count=len(ids))]
    return ids, y


def draw_test(ids: np.ndarray, y: np.ndarray, n_test: Count, rng: np.random.Generator, stratify: bool,
             what: str) -> np.ndarray:
    from sklearn.model_selection import train_test_split

    size = round(n_test * len(ids)) if isinstance(n_test, float) else int(n_test)
    if size < 1 or size > len(ids):
        raise ScenarioError(
            f"{what} = {n_test} asks for {size} test rows out of {len(ids)} candidates; it must be at least one "
            "and at most all of them"
        )
    if size == len(ids):
        # Every candidate is a test row (e.g. a block of aligned rows kept for testing only).
        return np.sort(ids)
    strat = y if stratify and can_stratify(y, size, len(ids)) else None
    _, test = train_test_split(ids, test_size=size, random_state=int(rng.integers(2**31)), stratify=strat)
    return np.sort(np.asarray(test))


@dataclass(frozen=True, kw_only=True)
class AlignedHoldout(Protocol):
    name: ClassVar[str] = "aligned_holdout"
    test_rows: Count = 50
    train_scope: TrainScope = "aligned"
    repeats: int = 5
    stratify: bool = True

    def repetitions(self) -> int:
        return self.repeats

    def splits(self, layout: Layout, rng: np.random.Generator) -> list[Split]:
        _refuse_test_blocks(layout, self.name)
        ids, y = pool(layout, "aligned")
        return [Split(0, draw_test(ids, y, self.test_rows, rng, self.stratify, "test_rows"), self.train_scope)]


@dataclass(frozen=True, kw_only=True)
class _SingleSplit(Protocol):
    """One stratified test split per repeat."""

    test_fraction: Count = 0.2
    test_from: TestFrom = "active"
    train_scope: TrainScope = "all"
    stratify: bool = True

    def splits(self, layout: Layout, rng: np.random.Generator) -> list[Split]:
        ids, y = pool(layout, self.test_from)
        if layout.test_blocks:  # the scenario fixed its test people: every one of them is scored
            return [Split(0, ids, self.train_scope)]
        return [Split(0, draw_test(ids, y, self.test_fraction, rng, self.stratify, "test_fraction"), self.train_scope)]


@dataclass(frozen=True, kw_only=True)
class Holdout(_SingleSplit):
    name: ClassVar[str] = "holdout"
    repeats: int = 1

    def repetitions(self) -> int:
        return self.repeats


@dataclass(frozen=True, kw_only=True)
class RepeatedRuns(_SingleSplit):
    """``fixed_split = true``: every run keeps the first run's layout and test rows and differs only in the
    methods' seeds (initial weights, batches), as the VFL-ASP authors' code runs; the interval then reflects
    initialisation alone."""

    name: ClassVar[str] = "repeated_runs"
    runs: int = 20
    fixed_split: bool = False

    def repetitions(self) -> int:
        return self.runs


@dataclass(frozen=True, kw_only=True)
class ActiveCV(Protocol):
    name: ClassVar[str] = "active_cv"
    folds: int = 10
    repeats: int = 5
    test_from: TestFrom = "active"
    train_scope: TrainScope = "all"
    stratify: bool = True
    transductive: bool = False

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise ConfigError(f"protocol.folds must be at least 2, got {self.folds}")

    def repetitions(self) -> int:
        return self.repeats

    def splits(self, layout: Layout, rng: np.random.Generator) -> list[Split]:
        _refuse_test_blocks(layout, self.name)
        ids, y = pool(layout, self.test_from)
        return [Split(i, test, self.train_scope) for i, test in enumerate(self.fold_ids(ids, y, rng))]

    def fold_ids(self, ids: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        """The test IDs of each fold (stratified by label where every class has enough rows)."""
        from sklearn.model_selection import KFold, StratifiedKFold

        if len(ids) < self.folds:
            raise ScenarioError(f"{self.folds} folds need at least {self.folds} rows, the pool has {len(ids)}")
        seed = int(rng.integers(2**31))
        if self.stratify and y.dtype.kind != "f" and np.unique(y, return_counts=True)[1].min() >= self.folds:
            folds = StratifiedKFold(self.folds, shuffle=True, random_state=seed).split(ids, y)
        else:
            folds = KFold(self.folds, shuffle=True, random_state=seed).split(ids)
        return [np.sort(ids[test]) for _, test in folds]


def _refuse_test_blocks(layout: Layout, protocol: str) -> None:
    if layout.test_blocks:
        raise ConfigError(f"protocol {protocol} draws its own test rows, but the scenario holds out fixed test "
                          "people (samples.test_aligned / test_active_only or test blocks); use holdout or "
                          "repeated_runs, which score exactly those")


PROTOCOLS: dict[str, type[Protocol]] = {
    p.name: p for p in (AlignedHoldout, Holdout, ActiveCV, RepeatedRuns)
}


def parse_protocol(raw: Mapping[str, Any] | None) -> Protocol:
    """A protocol from its config table: ``name`` plus that protocol's settings."""
    table = dict(raw or {"name": "aligned_holdout"})
    name = table.pop("name", None)
    if not isinstance(name, str):
        raise ConfigError(f"protocol.name is required; choose one of {sorted(PROTOCOLS)}")
    if name not in PROTOCOLS:
        raise ConfigError(unknown_name("protocol", name, PROTOCOLS))
    protocol = schema.build(PROTOCOLS[name], table, where="protocol")
    if protocol.repetitions() < 1:
        raise ConfigError(f"protocol {name}: the number of repeats (or runs) must be at least 1")
    return protocol
