"""Scenarios: turn one full dataset into what each party would hold (simulation only).

A scenario decides two things, both seeded:

* **columns** – which feature columns each party owns (explicit names, ``"rest"``,
  or a random / sequential split of the unassigned columns by count or share);
* **rows** – which samples each party holds. Every layout compiles to *blocks*: a
  block is a number of rows held by exactly one set of parties. The simple
  ``overlap`` layout (an active party, ``aligned`` of its rows also held by every
  passive party, optional passive-only rows), the ``misaligned`` layout (a fraction
  aligned, the rest of the active party's rows split evenly between the passive
  parties) and explicit ``blocks`` (e.g. a second-hop chain where one party
  overlaps only another passive party) are all the same thing underneath.

The result is a :class:`Layout` (ground truth: the only object that sees the whole
dataset). An evaluation protocol then picks test IDs and calls
:meth:`Layout.materialize`, which returns one standardised :class:`PartyData` per
party for training and one for serving (the test rows it holds), with the test
labels kept apart for the evaluator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import pandas as pd

from vflo.data.datasets import Dataset, Task
from vflo.data.partydata import PartyData
from vflo.data.preprocessing import Standardizer
from vflo.errors import ConfigError, ScenarioError
from vflo.roles import PartyInfo, Role, active_party

Count = int | float


@dataclass(frozen=True, kw_only=True)
class PartySpec:
    """One party of a scenario.

    ``columns`` is a list of names, ``"rest"`` (every column no other party takes) or
    ``None`` (a share of the unassigned columns, sized by ``n_columns`` or ``share``).
    An empty list makes a label-only party. ``views`` gives the party whole views of a
    multiview dataset instead (e.g. ``["pix"]``, or an image's ``["left"]`` half). ``count = k``
    stands for k alike parties named ``NAME1`` ... ``NAMEk`` (so a sweep can vary how many there are).
    """

    name: str
    role: Role = "passive"
    columns: tuple[str, ...] | Literal["rest"] | None = None
    views: tuple[str, ...] | None = None
    n_columns: int | None = None
    share: float | None = None
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ConfigError(f"party {self.name!r}: count must be at least 1, got {self.count}")
        if self.count > 1 and (self.role == "active" or isinstance(self.columns, tuple) or self.views):
            raise ConfigError(f"party {self.name!r}: count > 1 is for passive parties sized by share or n_columns")
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(
                f"party name {self.name!r} must be non-empty letters, digits, '-' or '_'"
            )
        if self.role not in ("active", "passive"):
            raise ConfigError(
                f"party {self.name!r}: scenario parties hold data, so role must be 'active' or 'passive', "
                f"not {self.role!r} (servers and dealers are added by the methods that need them)"
            )
        if isinstance(self.columns, list):
            object.__setattr__(self, "columns", tuple(self.columns))
        if isinstance(self.columns, str) and self.columns != "rest":
            raise ConfigError(
                f"party {self.name!r}: columns must be a list of column names or 'rest', got {self.columns!r}"
            )
        if isinstance(self.views, list):
            object.__setattr__(self, "views", tuple(self.views))
        given = [k for k in ("columns", "views") if getattr(self, k) is not None]
        if len(given) > 1 or (given and (self.n_columns is not None or self.share is not None)):
            raise ConfigError(f"party {self.name!r}: give one of columns, views or n_columns/share")
        if self.n_columns is not None and self.n_columns < 1:
            raise ConfigError(f"party {self.name!r}: n_columns must be at least 1")
        if self.share is not None and not self.share > 0:
            raise ConfigError(f"party {self.name!r}: share must be positive")


@dataclass(frozen=True, kw_only=True)
class BlockSpec:
    """``rows`` samples (a count, or a fraction of the dataset) held by exactly ``parties``.

    ``name`` (optional) lets a sweep address the block: ``"samples.blocks.p1_a.rows" = [100, 200]``.
    """

    parties: tuple[str, ...]
    rows: Count
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.parties, list):
            object.__setattr__(self, "parties", tuple(self.parties))
        if not self.parties:
            raise ConfigError("a block must name at least one party")


@dataclass(frozen=True, kw_only=True)
class SamplesSpec:
    """Which rows each party holds.

    Counts are integers; floats in (0, 1] are fractions (``aligned`` of the active
    party's rows, ``active`` and block ``rows`` of the dataset after ``total``).
    """

    layout: Literal["overlap", "misaligned", "blocks"] = "overlap"
    total: int | None = None
    active: Count | None = None
    aligned: Count = 1.0
    passive_only: Count = 0
    blocks: tuple[BlockSpec, ...] = ()

    def __post_init__(self) -> None:
        blocks = tuple(b if isinstance(b, BlockSpec) else BlockSpec(**b) for b in self.blocks)
        object.__setattr__(self, "blocks", blocks)
        if self.layout not in ("overlap", "misaligned", "blocks"):
            raise ConfigError(
                f"samples.layout must be 'overlap', 'misaligned' or 'blocks', got {self.layout!r}"
            )
        if self.layout == "blocks" and not blocks:
            raise ConfigError("samples.layout = 'blocks' needs at least one [[scenario.samples.blocks]] entry")
        if self.layout != "blocks" and blocks:
            raise ConfigError("samples.blocks is only read with samples.layout = 'blocks'")
        for name in ("aligned", "passive_only"):
            _check_count(f"samples.{name}", getattr(self, name), allow_zero=True)
        if self.active is not None:
            _check_count("samples.active", self.active, allow_zero=False)
        if self.total is not None and self.total < 1:
            raise ConfigError("samples.total must be a positive number of rows")


def _check_count(name: str, value: Count, *, allow_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a row count or a fraction, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
    if isinstance(value, float) and value > 1.0:
        raise ConfigError(f"{name} = {value}: a float is a fraction and must be at most 1; use an int for a count")


def _resolve_count(name: str, value: Count, of: int) -> int:
    count = round(value * of) if isinstance(value, float) else int(value)
    if count > of:
        raise ScenarioError(
            f"{name} = {value} asks for {count} rows but only {of} exist; lower it or enlarge the pool"
        )
    return count


@dataclass(frozen=True, kw_only=True)
class ScenarioSpec:
    """A full description of how a dataset is split between parties."""

    parties: tuple[PartySpec, ...]
    samples: SamplesSpec = field(default_factory=SamplesSpec)
    feature_split: Literal["random", "sequential", "importance"] = "random"
    unused_columns: Literal["error", "drop"] = "error"
    standardize: bool = True

    def __post_init__(self) -> None:
        given = tuple(p if isinstance(p, PartySpec) else PartySpec(**p) for p in self.parties)
        parties = tuple(
            q for p in given
            for q in ((p,) if p.count == 1 else
                      (replace(p, name=f"{p.name}{i}", count=1) for i in range(1, p.count + 1)))
        )
        object.__setattr__(self, "parties", parties)
        if isinstance(self.samples, dict):
            object.__setattr__(self, "samples", SamplesSpec(**self.samples))
        names = [p.name for p in parties]
        if len(set(names)) != len(names):
            raise ConfigError(f"party names must be unique, got {names}")
        if len(parties) < 1:
            raise ConfigError("a scenario needs at least one party")
        active_party(tuple(PartyInfo(p.name, p.role) for p in parties))
        if sum(1 for p in parties if p.columns == "rest") > 1:
            raise ConfigError("at most one party can take columns = 'rest'")
        if self.feature_split not in ("random", "sequential", "importance"):
            raise ConfigError(
                f"feature_split must be 'random', 'sequential' or 'importance', got {self.feature_split!r}")
        if self.unused_columns not in ("error", "drop"):
            raise ConfigError(f"unused_columns must be 'error' or 'drop', got {self.unused_columns!r}")
        for block in self.samples.blocks:
            unknown = [n for n in block.parties if n not in names]
            if unknown:
                raise ConfigError(f"block names unknown parties {unknown}; parties are {names}")

    @property
    def party_infos(self) -> tuple[PartyInfo, ...]:
        return tuple(PartyInfo(p.name, p.role) for p in self.parties)

    @property
    def active(self) -> str:
        return active_party(self.party_infos).name

    def build(self, dataset: Dataset, seed: int) -> Layout:
        """Assign columns and rows; the same spec, dataset and seed give the same layout."""
        ss = np.random.SeedSequence([seed, 0x5CE])
        col_rng, row_rng, order_rng = (np.random.default_rng(s) for s in ss.spawn(3))
        columns = self._assign_columns(dataset, col_rng)
        n_rows = len(dataset.ids)
        if self.samples.total is not None and self.samples.total > n_rows:
            raise ScenarioError(
                f"samples.total = {self.samples.total} but dataset {dataset.name!r} has {n_rows} rows"
            )
        pool = row_rng.permutation(n_rows)[: self.samples.total or n_rows]
        blocks = self._blocks(len(pool))
        needed = sum(rows for _, rows in blocks)
        if needed > len(pool):
            raise ScenarioError(
                f"the scenario needs {needed} distinct rows but the dataset (after samples.total) has "
                f"{len(pool)}; lower the counts (active, aligned, passive_only or block rows)"
            )
        holders: dict[str, list[np.ndarray]] = {p.name: [] for p in self.parties}
        block_rows: list[tuple[tuple[str, ...], np.ndarray]] = []
        start = 0
        for members, n_rows in blocks:
            chunk = pool[start : start + n_rows]
            start += n_rows
            block_rows.append((members, chunk))
            for name in members:
                holders[name].append(chunk)
        empty = [name for name, chunks in holders.items() if not chunks]
        if empty:
            raise ScenarioError(
                f"parties {empty} would hold no rows; give them aligned, passive_only or block rows"
            )
        rows_by_party = {}
        for name, chunks in holders.items():
            rows = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)
            # Each party keeps its rows in its own random order, so row position reveals nothing.
            rows_by_party[name] = order_rng.permutation(rows)
        return Layout(
            spec=self, dataset=dataset, parties=self.party_infos, columns=columns,
            rows=rows_by_party, blocks=tuple(block_rows), seed=seed,
        )

    # -- columns -----------------------------------------------------------------------------

    def _assign_columns(self, dataset: Dataset, rng: np.random.Generator) -> dict[str, tuple[str, ...]]:
        available = dataset.columns
        owner: dict[str, str] = {}
        assigned: dict[str, tuple[str, ...]] = {}
        for p in self.parties:
            if p.views is not None:
                unknown = [v for v in p.views if v not in dataset.views]
                if unknown:
                    from vflo.errors import did_you_mean

                    choices = list(dataset.views)
                    raise ScenarioError(
                        f"party {p.name!r}: views {unknown} not in dataset {dataset.name!r}"
                        f"{did_you_mean(unknown[0], choices)}; its views are {choices or 'none'}"
                    )
                p = replace(p, columns=tuple(c for v in p.views for c in dataset.views[v]), views=None)
            if isinstance(p.columns, tuple):
                missing = [c for c in p.columns if c not in available]
                if missing:
                    from vflo.errors import did_you_mean

                    hint = did_you_mean(missing[0], available)
                    raise ScenarioError(f"party {p.name!r}: columns {missing} not in the dataset{hint}")
                for c in p.columns:
                    if c in owner:
                        raise ScenarioError(
                            f"column {c!r} is named by both {owner[c]!r} and {p.name!r}; "
                            "each feature belongs to exactly one party"
                        )
                    owner[c] = p.name
                assigned[p.name] = p.columns
        free = [c for c in available if c not in owner]
        if self.feature_split == "random":
            free = [free[i] for i in rng.permutation(len(free))]
        elif self.feature_split == "importance":
            # The most important columns go to the first party listed without explicit columns (VFL-ASP
            # gives them to the second-hop party).
            rank = importance_ranking(dataset)
            free = sorted(free, key=rank.index)
        open_parties = [p for p in self.parties if p.columns is None and p.views is None]
        if open_parties:
            sizes = self._open_sizes(open_parties, len(free), any(p.columns == "rest" for p in self.parties))
            start = 0
            for p, size in zip(open_parties, sizes, strict=True):
                assigned[p.name] = tuple(free[start : start + size])
                start += size
            free = free[start:]
        for p in self.parties:
            if p.columns == "rest":
                assigned[p.name] = tuple(c for c in available if c in set(free))
                free = []
        if free and self.unused_columns == "error":
            raise ScenarioError(
                f"columns {free[:8]}{' ...' if len(free) > 8 else ''} belong to no party; give them to a party, "
                "set columns = 'rest' on one party, or set unused_columns = 'drop'"
            )
        return {p.name: assigned[p.name] for p in self.parties}

    @staticmethod
    def _open_sizes(parties: Sequence[PartySpec], n_free: int, rest_exists: bool) -> list[int]:
        """Parties with ``n_columns`` get exactly that; the others split what is left by ``share``."""
        fixed = sum(p.n_columns or 0 for p in parties)
        if fixed > n_free:
            raise ScenarioError(f"parties ask for {fixed} columns (n_columns) but only {n_free} are unassigned")
        by_share = [i for i, p in enumerate(parties) if p.n_columns is None]
        sizes = [p.n_columns or 0 for p in parties]
        if not by_share:
            return sizes
        if rest_exists and all(parties[i].share is None for i in by_share):
            raise ConfigError("with a 'rest' party, the other open parties need n_columns or share")
        left = n_free - fixed
        shares = [float(parties[i].share or 1.0) for i in by_share]
        total = sum(shares)
        exact = [s / total * left for s in shares]
        split = [math.floor(e) for e in exact]
        # Largest remainder, so the shares add up exactly to the columns left.
        for j in sorted(range(len(split)), key=lambda j: exact[j] - split[j], reverse=True)[: left - sum(split)]:
            split[j] += 1
        for i, n in zip(by_share, split, strict=True):
            sizes[i] = n
        if not rest_exists and min(split) == 0 and left >= len(by_share):
            raise ScenarioError("a party would get no columns; adjust share or n_columns")
        return sizes

    # -- rows ------------------------------------------------------------------------------------

    def _blocks(self, n_pool: int) -> list[tuple[tuple[str, ...], int]]:
        s = self.samples
        active = self.active
        passives = [p.name for p in self.parties if p.role == "passive"]
        everyone = (active, *passives)
        if s.layout == "blocks":
            out = []
            for i, block in enumerate(s.blocks):
                out.append((block.parties, _resolve_count(f"samples.blocks[{i}].rows", block.rows, n_pool)))
            seen = [frozenset(b.parties) for b in s.blocks]
            if len(set(seen)) != len(seen):
                raise ConfigError("two blocks name the same set of parties; merge them into one block")
            return out
        n_active = n_pool if s.active is None else _resolve_count("samples.active", s.active, n_pool)
        n_aligned = _resolve_count("samples.aligned", s.aligned, n_active) if passives else 0
        if s.layout == "misaligned":
            if not passives:
                raise ConfigError("samples.layout = 'misaligned' needs at least one passive party")
            rest = n_active - n_aligned
            share, extra = divmod(rest, len(passives))
            blocks = [(everyone, n_aligned)]
            blocks += [((active, p), share + (1 if i < extra else 0)) for i, p in enumerate(passives)]
            return [b for b in blocks if b[1] > 0]
        blocks = [(everyone, n_aligned), ((active,), n_active - n_aligned)]
        outside = n_pool - n_active
        for p in passives:
            n_only = _resolve_count(f"samples.passive_only ({p})", s.passive_only, outside) if outside else 0
            if isinstance(s.passive_only, int) and s.passive_only > 0 and outside < s.passive_only:
                raise ScenarioError(
                    f"samples.passive_only = {s.passive_only} but only {outside} rows lie outside the active party"
                )
            blocks.append(((p,), n_only))
            outside -= n_only
        return [b for b in blocks if b[1] > 0]


_IMPORTANCE: dict[str, list[str]] = {}


def importance_ranking(dataset: Dataset, *, rows: int = 4000, seed: int = 0) -> list[str]:
    """Columns by permutation importance (most important first) of a random forest, as VFL-ASP ranks them.

    Fitted on at most ``rows`` rows (and scored on as many others) with a fixed seed, so the ranking is a
    property of the dataset; cached per dataset within a process.
    """
    if dataset.name in _IMPORTANCE:
        return _IMPORTANCE[dataset.name]
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from sklearn.inspection import permutation_importance

    rng = np.random.default_rng(seed)
    order = rng.permutation(len(dataset.y))
    fit, score = order[:rows], order[rows : 2 * rows] if len(order) > rows + 50 else order[:rows]
    X = dataset.X.to_numpy(np.float64)
    model = (RandomForestRegressor if dataset.task == "regression" else RandomForestClassifier)(
        n_estimators=100, random_state=seed, n_jobs=1).fit(X[fit], dataset.y[fit])
    result = permutation_importance(model, X[score], dataset.y[score], n_repeats=5, random_state=seed)
    ranking = [dataset.columns[i] for i in np.argsort(-result.importances_mean, kind="stable")]
    _IMPORTANCE[dataset.name] = ranking
    return ranking


@dataclass(frozen=True, eq=False)
class Layout:
    """Ground truth of a built scenario: which dataset rows and columns each party holds."""

    spec: ScenarioSpec
    dataset: Dataset
    parties: tuple[PartyInfo, ...]
    columns: Mapping[str, tuple[str, ...]]
    rows: Mapping[str, np.ndarray]
    blocks: tuple[tuple[tuple[str, ...], np.ndarray], ...]
    seed: int

    @property
    def active(self) -> str:
        return active_party(self.parties).name

    @property
    def task(self) -> Task:
        return self.dataset.task

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
        lines = [f"dataset: {self.dataset.label}", f"seed: {self.seed}", "parties:"]
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
        keep: set[object] | None = None
        if train_scope == "aligned":
            keep = set(self.aligned_ids().tolist()) - test_set
        elif train_scope != "all":
            raise ConfigError(f"train_scope must be 'all' or 'aligned', got {train_scope!r}")
        position = {v: i for i, v in enumerate(ds.ids.tolist())}
        train: dict[str, PartyData] = {}
        serve: dict[str, PartyData] = {}
        for p in self.parties:
            ids = self.ids(p.name)
            is_test = np.fromiter((v in test_set for v in ids.tolist()), dtype=bool, count=len(ids))
            in_scope = ~is_test
            if keep is not None:
                in_scope &= np.fromiter((v in keep for v in ids.tolist()), dtype=bool, count=len(ids))
            cols = tuple(self.columns[p.name])
            pos = np.fromiter((position[v] for v in ids.tolist()), dtype=np.int64, count=len(ids))
            X = ds.X[list(cols)].to_numpy(np.float64)[pos]
            y = ds.y[pos] if p.role == "active" else None
            categorical = tuple(c for c in cols if c in ds.categorical)
            train_data = PartyData(
                party=p.name, ids=ids[in_scope], X=X[in_scope], columns=cols,
                y=None if y is None else y[in_scope], categorical=categorical,
            )
            # Test labels stay with the evaluator: serving rows carry features only.
            serve_data = PartyData(party=p.name, ids=ids[is_test], X=X[is_test], columns=cols, categorical=categorical)
            # A party left with no training rows by this split keeps raw values; methods that need
            # its rows report that themselves.
            if self.spec.standardize and train_data.n_features and train_data.n_samples:
                scaler = Standardizer.for_party(train_data)
                train_data, serve_data = scaler.apply(train_data), scaler.apply(serve_data)
            train[p.name] = train_data
            serve[p.name] = serve_data
        test_pos = np.fromiter((position[v] for v in test_ids.tolist()), dtype=np.int64, count=len(test_ids))
        return FederatedData(
            parties=self.parties, train=train, serve=serve, test_ids=test_ids, test_y=ds.y[test_pos],
            task=ds.task, n_classes=ds.n_classes,
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
    oracle: Oracle

    @property
    def active(self) -> str:
        return active_party(self.parties).name
