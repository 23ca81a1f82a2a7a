"""A built scenario: which rows and columns of one dataset each party holds (:class:`Layout`), what every
party then holds for training and for serving (:class:`FederatedData`) and the evaluator's view of the truth
(:class:`Oracle`). A :class:`~vflo.data.scenario.ScenarioSpec` builds a layout from a full dataset
(simulation); :meth:`Layout.from_parties` builds one from the parties' own tables, where the overlap is
whatever their IDs say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from vflo.data.datasets import Dataset, Task, infer_task
from vflo.data.partydata import PartyData
from vflo.data.preprocessing import Standardizer
from vflo.errors import AlignmentError, ConfigError, DataError, ScenarioError
from vflo.roles import PartyInfo, active_party

if TYPE_CHECKING:
    from vflo.data.files import TableEncoding

#: A number of rows (an int) or a share of them (a float up to 1).
Count = int | float


def resolve_count(name: str, value: Count, of: int) -> int:
    count = round(value * of) if isinstance(value, float) else int(value)
    if count > of:
        raise ScenarioError(
            f"{name} = {value} asks for {count} rows but only {of} exist; lower it or enlarge the pool"
        )
    return count


def _the_active(parties: Sequence[PartyData]) -> PartyData:
    if not parties:
        raise ConfigError("no parties given: pass the active party's table and at least one other")
    names = [p.party for p in parties]
    if len(set(names)) != len(names):
        raise ConfigError(f"party names must be unique, got {names}")
    labelled = [p for p in parties if p.has_labels]
    if len(labelled) != 1:
        raise ConfigError(
            f"exactly one party holds the labels (the active party), but {[p.party for p in labelled] or 'none'} "
            "do; give label_column to the active party only")
    return labelled[0]


def _check_ids_and_columns(parties: Sequence[PartyData]) -> None:
    kinds = {p.party: p.ids.dtype.kind for p in parties if p.n_samples}
    if len({"text" if k == "U" else "number" for k in kinds.values()}) > 1:
        raise DataError(f"the parties' IDs are of different kinds ({kinds}: U is text, i is numbers); IDs must "
                        "match exactly: read every ID column as text (files are read that way)")
    owner: dict[str, str] = {}
    for p in parties:
        for c in p.columns:
            if c in owner:
                raise DataError(f"column {c!r} is in both {owner[c]!r}'s and {p.party!r}'s table; each feature "
                                f"belongs to one party: leave it out of one (drop_columns = [{c!r}])")
            owner[c] = p.party


def _blocks_of(parties: Sequence[PartyInfo], rows: Mapping[str, np.ndarray],
               n: int) -> tuple[tuple[tuple[str, ...], np.ndarray], ...]:
    """Group the rows by the exact set of parties that hold them."""
    held = np.zeros((n, len(parties)), dtype=bool)
    for j, p in enumerate(parties):
        held[rows[p.name], j] = True
    blocks: dict[tuple[str, ...], list[int]] = {}
    for i, flags in enumerate(held):
        blocks.setdefault(tuple(p.name for p, f in zip(parties, flags, strict=True) if f), []).append(i)
    return tuple((members, np.asarray(idx, dtype=np.int64)) for members, idx in blocks.items())


@dataclass(frozen=True, eq=False)
class Layout:
    """Ground truth of a built scenario: which dataset rows and columns each party holds.

    Built from a full dataset by a :class:`ScenarioSpec`, or from the parties' own tables by
    :meth:`from_parties`, where the overlap is whatever their IDs say. Everything downstream
    (protocols, methods, reports) is the same for both.
    """

    standardize: bool
    dataset: Dataset
    parties: tuple[PartyInfo, ...]
    columns: Mapping[str, tuple[str, ...]]
    rows: Mapping[str, np.ndarray]
    blocks: tuple[tuple[tuple[str, ...], np.ndarray], ...]
    seed: int
    encodings: Mapping[str, TableEncoding] = field(default_factory=dict)
    #: Rows held out for testing only (members, dataset rows): no party trains on them, whatever the split.
    test_blocks: tuple[tuple[tuple[str, ...], np.ndarray], ...] = ()

    @property
    def active(self) -> str:
        return active_party(self.parties).name

    def held_out(self, scored: str) -> np.ndarray | None:
        """The IDs of the held-out test people of a kind (``'active_only'``: only the active party holds them;
        ``'aligned'``: the active party and partners), all of them for ``'active'``; None without test blocks."""
        if not self.test_blocks:
            return None
        active = self.active
        rows = [r for members, r in self.test_blocks if active in members and
                (scored == "active" or (len(members) == 1) == (scored == "active_only"))]
        picked = np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
        return np.sort(self.dataset.ids[picked])

    def held_out_ids(self) -> np.ndarray:
        """Every held-out test ID (empty without test blocks)."""
        rows = [r for _, r in self.test_blocks]
        return np.sort(self.dataset.ids[np.concatenate(rows)]) if rows else self.dataset.ids[:0]

    @property
    def task(self) -> Task:
        return self.dataset.task

    @classmethod
    def from_parties(
        cls, parties: Sequence[PartyData], *, seed: int = 0, standardize: bool = True, aligned: Count | None = None,
        task: Task | None = None, classes: Sequence[str] = (), name: str = "own data",
        source: str = "the parties' own tables",
    ) -> Layout:
        """A layout whose rows are the parties' own: who holds which person is what their IDs say.

        The active party is the one with labels. ``aligned`` (a count, or a fraction of the real overlap)
        keeps only that many of the people the active party shares with the others, drawn with ``seed``:
        the others leave every passive party, to ask "what if we shared fewer people?".
        """
        parties = list(parties)
        active = _the_active(parties)
        infos = tuple(PartyInfo(p.party, "active" if p is active else "passive") for p in parties)
        _check_ids_and_columns(parties)
        passive_ids: set[object] = set().union(*(set(p.ids.tolist()) for p in parties if p is not active))
        shared = sorted(set(active.ids.tolist()) & passive_ids)
        if len(parties) > 1 and not shared:
            raise AlignmentError(
                f"the active party {active.party!r} shares no ID with {[p.party for p in parties if p is not active]}: "
                f"its IDs look like {active.ids[:3].tolist()} and theirs like "
                f"{[p.ids[:3].tolist() for p in parties if p is not active]}; check the ID columns (same column, "
                "same format: leading zeros, spaces, case)")
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0xF1E5]))
        if aligned is not None and shared:
            keep = resolve_count("samples.aligned", aligned, len(shared))
            dropped = set(np.asarray(shared, dtype=object)[rng.permutation(len(shared))[keep:]].tolist())
            parties = [p if p is active else p.subset(p.ids[~np.isin(p.ids, list(dropped))]) for p in parties]
        all_ids = np.asarray(sorted(set().union(*(set(p.ids.tolist()) for p in parties))))
        position = {v: i for i, v in enumerate(all_ids.tolist())}
        columns = {p.party: p.columns for p in parties}
        # The pooled table: a cell a party does not hold (a person it lacks) stays NaN.
        pooled = np.full((len(all_ids), sum(len(c) for c in columns.values())), np.nan)
        rows: dict[str, np.ndarray] = {}
        start = 0
        for p in parties:
            pos = np.fromiter((position[v] for v in p.ids.tolist()), dtype=np.int64, count=p.n_samples)
            rows[p.party] = pos
            pooled[pos, start : start + p.n_features] = p.X.astype(np.float64)
            start += p.n_features
        X = pd.DataFrame(pooled, columns=[c for cols in columns.values() for c in cols])
        y_active = active.require_labels()
        if active.encoding is not None:
            task = task or active.encoding.task
            classes = classes or active.encoding.classes
        if task is None:
            task = infer_task(y_active)
        regression = task == "regression"
        y = np.full(len(all_ids), np.nan if regression else -1, dtype=np.float64 if regression else np.int64)
        y[rows[active.party]] = y_active
        n_classes = None if regression else max(len(classes), int(y_active.max()) + 1, 2)
        dataset = Dataset(name=name, X=X, y=y, ids=all_ids, task=task, n_classes=n_classes, standin=False,
                          source=source, categorical=tuple(c for p in parties for c in p.categorical),
                          classes=tuple(classes))
        encodings = {p.party: p.encoding for p in parties if p.encoding is not None}
        return cls(standardize=standardize, dataset=dataset, parties=infos, columns=columns, rows=rows,
                   blocks=_blocks_of(infos, rows, len(all_ids)), seed=seed, encodings=encodings)

    def ids(self, party: str) -> np.ndarray:
        ids: np.ndarray = self.dataset.ids[self.rows[party]]
        return ids

    def aligned_ids(self) -> np.ndarray:
        """IDs the active party shares with every passive party that overlaps it at all."""
        active = self.active
        mine = set(self.rows[active].tolist())
        partners = [p.name for p in self.parties if p.name != active and mine & set(self.rows[p.name].tolist())]
        common = mine
        for p in partners:
            common &= set(self.rows[p].tolist())
        if not partners:
            common = set()
        return np.sort(self.dataset.ids[np.fromiter(common, dtype=np.int64, count=len(common))])

    def overlap_matrix(self) -> pd.DataFrame:
        names = [p.name for p in self.parties]
        sets = {n: set(self.rows[n].tolist()) for n in names}
        data = [[len(sets[a] & sets[b]) for b in names] for a in names]
        return pd.DataFrame(data, index=names, columns=names)

    def describe(self) -> str:
        classes = f", classes {list(self.dataset.classes)} (codes 0..{len(self.dataset.classes) - 1})" \
            if self.dataset.classes else ""
        lines = [f"dataset: {self.dataset.label}", f"task: {self.dataset.task}{classes}", f"seed: {self.seed}",
                 "parties:"]
        for p in self.parties:
            cols = self.columns[p.name]
            shown = ", ".join(cols[:8]) + (f", ... ({len(cols)} in all)" if len(cols) > 8 else "")
            lines.append(f"  {p.name} ({p.role}): {len(self.rows[p.name])} samples, {len(cols)} columns [{shown}]")
        lines.append(f"aligned with the active party: {len(self.aligned_ids())}")
        lines.append("overlap matrix (shared samples):")
        lines.append(self.overlap_matrix().to_string())
        return "\n".join(lines)

    def materialize(
        self, *, test_ids: np.ndarray | None = None, train_scope: Literal["all", "aligned"] = "all",
    ) -> FederatedData:
        """Per-party training and serving data with ``test_ids`` held out from every party."""
        ds = self.dataset
        test_ids = np.asarray([] if test_ids is None else test_ids, dtype=ds.ids.dtype)
        active = self.active
        active_ids = set(self.ids(active).tolist())
        stray = [t for t in test_ids.tolist() if t not in active_ids]
        if stray:
            raise ScenarioError(f"test IDs {stray[:5]} are not held by the active party {active!r}")
        test_set = set(test_ids.tolist())
        # Held-out test people are never trained on, whichever of them this split scores.
        unseen = test_set | set(self.held_out_ids().tolist())
        keep: set[object] | None = None
        if train_scope == "aligned":
            keep = set(self.aligned_ids().tolist()) - unseen
        elif train_scope != "all":
            raise ConfigError(f"train_scope must be 'all' or 'aligned', got {train_scope!r}")
        position = {v: i for i, v in enumerate(ds.ids.tolist())}
        train: dict[str, PartyData] = {}
        serve: dict[str, PartyData] = {}
        scalers: dict[str, Standardizer] = {}
        for p in self.parties:
            ids = self.ids(p.name)
            is_test = np.fromiter((v in test_set for v in ids.tolist()), dtype=bool, count=len(ids))
            in_scope = ~np.fromiter((v in unseen for v in ids.tolist()), dtype=bool, count=len(ids))
            if keep is not None:
                in_scope &= np.fromiter((v in keep for v in ids.tolist()), dtype=bool, count=len(ids))
            cols = tuple(self.columns[p.name])
            pos = np.fromiter((position[v] for v in ids.tolist()), dtype=np.int64, count=len(ids))
            X = ds.X[list(cols)].to_numpy(np.float64)[pos]
            y = ds.y[pos] if p.role == "active" else None
            categorical = tuple(c for c in cols if c in ds.categorical)
            encoding = self.encodings.get(p.name)
            train_data = PartyData(
                party=p.name, ids=ids[in_scope], X=X[in_scope], columns=cols,
                y=None if y is None else y[in_scope], categorical=categorical, encoding=encoding,
            )
            # Test labels stay with the evaluator: serving rows carry features only.
            serve_data = PartyData(party=p.name, ids=ids[is_test], X=X[is_test], columns=cols, categorical=categorical,
                                   encoding=encoding)
            # A party left with no training rows by this split keeps raw values; methods that need
            # its rows report that themselves.
            if self.standardize and train_data.n_features and train_data.n_samples:
                scaler = Standardizer.for_party(train_data)
                scalers[p.name] = scaler
                train_data, serve_data = scaler.apply(train_data), scaler.apply(serve_data)
            train[p.name] = train_data
            serve[p.name] = serve_data
        test_pos = np.fromiter((position[v] for v in test_ids.tolist()), dtype=np.int64, count=len(test_ids))
        return FederatedData(
            parties=self.parties, train=train, serve=serve, test_ids=test_ids, test_y=ds.y[test_pos],
            task=ds.task, n_classes=ds.n_classes, scalers=scalers, encodings=dict(self.encodings), classes=ds.classes,
            oracle=Oracle(self, {name: frozenset(d.ids.tolist()) for name, d in train.items()},
                          {name: frozenset(d.ids.tolist()) for name, d in serve.items()}),
        )


@dataclass(frozen=True, eq=False)
class Oracle:
    """Simulation-only access to the pooled features of any row (for the Centralized upper bound).

    It exists so the oracle baseline is explicit: the federation hands it only to
    methods marked ``simulation_only``, and no deployment has one.
    """

    layout: Layout
    train_ids: Mapping[str, frozenset[object]]
    serve_ids: Mapping[str, frozenset[object]] = field(default_factory=dict)

    def columns(self) -> tuple[str, ...]:
        return tuple(c for p in self.layout.parties for c in self.layout.columns[p.name])

    def held_by_all(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` every data party holds among its training rows."""
        sets = [s for name, s in self.train_ids.items() if self.layout.columns[name]]
        return np.fromiter((all(v in s for s in sets) for v in np.asarray(ids).tolist()), dtype=bool,
                           count=len(ids))

    def features(self, ids: np.ndarray, party: str | None = None) -> np.ndarray:
        """Raw (unscaled) features of ``ids``: every party's columns in party order, or one party's."""
        ds = self.layout.dataset
        position = {v: i for i, v in enumerate(ds.ids.tolist())}
        pos = np.fromiter((position[v] for v in np.asarray(ids).tolist()), dtype=np.int64, count=len(ids))
        columns = self.columns() if party is None else self.layout.columns[party]
        return ds.X[list(columns)].to_numpy(np.float64)[pos]


@dataclass(frozen=True, eq=False)
class FederatedData:
    """What a run hands out: per-party training data, per-party serving rows, held-back test labels."""

    parties: tuple[PartyInfo, ...]
    train: Mapping[str, PartyData]
    serve: Mapping[str, PartyData]
    test_ids: np.ndarray
    test_y: np.ndarray
    task: Task
    n_classes: int | None
    # The pooled rows, for the simulation-only baselines (Centralized, Single); None for parties' own tables
    # brought together without a pooled copy (those baselines then refuse to run).
    oracle: Oracle | None
    # What each party did to its raw table before training: standardisation fitted on its training rows, and
    # how its file was read (where it came from one). Both are the party's own and stay with its model part.
    scalers: Mapping[str, Standardizer] = field(default_factory=dict)
    encodings: Mapping[str, TableEncoding] = field(default_factory=dict)
    classes: tuple[str, ...] = ()
    #: Per party, the columns of its table it dropped by its own selection (``[select]``, :mod:`vflo.explorer.select`):
    #: gone from its rows, its standardisation and the pooled baselines' columns; its saved parts read without them.
    dropped: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def active(self) -> str:
        return active_party(self.parties).name

    def without(self, dropped: Mapping[str, Sequence[str]]) -> FederatedData:
        """The same split, each party without the columns ``dropped`` names for it: from its training and serving
        rows, from its standardisation, and from the pooled rows the simulation-only baselines read."""
        gone = {p: tuple(c) for p, c in dropped.items() if len(c)}
        if not gone:
            return self

        def scaler(party: str, fitted: Standardizer) -> Standardizer:
            keep = np.asarray([c not in gone[party] for c in self.train[party].columns], dtype=bool)
            return Standardizer(mean_=fitted.mean_[keep], scale_=fitted.scale_[keep])

        oracle = self.oracle
        if oracle is not None:
            columns = {p: tuple(c for c in cs if c not in gone.get(p, ())) for p, cs in oracle.layout.columns.items()}
            oracle = replace(oracle, layout=replace(oracle.layout, columns=columns))
        return replace(self, train={p: d.without(gone[p]) if p in gone else d for p, d in self.train.items()},
                       serve={p: d.without(gone[p]) if p in gone else d for p, d in self.serve.items()},
                       scalers={p: scaler(p, s) if p in gone else s for p, s in self.scalers.items()},
                       oracle=oracle, dropped={**self.dropped, **gone})
