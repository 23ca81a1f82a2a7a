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

The result is a :class:`~vflo.data.layout.Layout` (ground truth: the only object that
sees the whole dataset; :mod:`vflo.data.layout`). An evaluation protocol then picks test
IDs and calls :meth:`~vflo.data.layout.Layout.materialize`, which returns one
standardised :class:`PartyData` per party for training and one for serving (the test
rows it holds), with the test labels kept apart for the evaluator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import numpy as np

from vflo.data.datasets import Dataset, Task
from vflo.data.layout import Count, Layout, resolve_count
from vflo.data.partydata import PartyData
from vflo.errors import ConfigError, ScenarioError
from vflo.roles import PartyInfo, Role, active_party

if TYPE_CHECKING:
    from vflo.data.files import TableEncoding

# A party entry without a role: active if it reads a file with labels, passive otherwise (resolved on creation).
_ROLE_FROM_LABELS = cast("Role", "")


@dataclass(frozen=True, kw_only=True)
class PartySpec:
    """One party of a scenario.

    From a dataset: ``columns`` is a list of names, ``"rest"`` (every column no other party takes)
    or ``None`` (a part of the unassigned columns, sized by ``n_columns`` or ``share``). ``share`` is a
    relative weight: open parties split the unassigned columns in proportion to their shares (two
    parties with share 1 get half each). An empty list makes a label-only party. ``views`` gives the
    party whole views of a multiview dataset instead (e.g. ``["pix"]``, or an image's ``["left"]`` half).
    ``count = k`` stands for k alike parties named ``NAME1`` ... ``NAMEk`` (so a sweep can vary how
    many there are).

    From the party's own table: ``file`` (CSV, .csv.gz, TSV or Parquet, relative to the config file),
    ``id_column``, at the active party ``label_column`` (and optionally ``task``), and optionally
    ``feature_columns`` / ``drop_columns`` and ``categorical`` (one-hot encoded at the owner), and ``impute``
    (missing values filled at the owner from its training rows: ``"mean"``, ``"median"``, ``"most_frequent"``
    or a number) with ``missing_indicator`` (a 0/1 column for each column with gaps).

    ``role`` left out is ``"active"`` for a party that reads its own file with a ``label_column`` (the file
    with the labels is the active party's) and ``"passive"`` otherwise.
    """

    name: str
    role: Role = _ROLE_FROM_LABELS
    columns: tuple[str, ...] | Literal["rest"] | None = None
    views: tuple[str, ...] | None = None
    n_columns: int | None = None
    share: float | None = None
    count: int = 1
    file: str | None = None
    id_column: str | None = None
    label_column: str | None = None
    feature_columns: tuple[str, ...] | None = None
    drop_columns: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    task: Task | None = None
    impute: Literal["mean", "median", "most_frequent"] | float | None = None
    missing_indicator: bool = False

    @property
    def from_file(self) -> bool:
        return self.file is not None

    def _check_file_entry(self) -> None:
        if self.file is None:
            table_keys = [k for k in ("id_column", "label_column", "feature_columns", "task")
                          if getattr(self, k) is not None]
            table_keys += [k for k in ("drop_columns", "categorical", "missing_indicator") if getattr(self, k)]
            table_keys += ["impute"] if self.impute is not None else []
            if table_keys:
                raise ConfigError(f"party {self.name!r}: {table_keys} describe a party's own file; give file = '...'")
            return
        dataset_keys = [k for k in ("columns", "views", "n_columns", "share") if getattr(self, k) is not None]
        if dataset_keys or self.count != 1:
            raise ConfigError(f"party {self.name!r} reads its own file, so {dataset_keys or ['count']} (which split a "
                              "dataset's columns) do not apply: choose its columns with feature_columns or "
                              "drop_columns")
        if not self.id_column:
            raise ConfigError(f"party {self.name!r}: give id_column, the column of {self.file} that holds the IDs")
        if self.role == "active" and not self.label_column:
            raise ConfigError(f"party {self.name!r} is the active party: give label_column, the column of "
                              f"{self.file} that holds the labels")
        if self.role != "active" and (self.label_column or self.task):
            raise ConfigError(f"party {self.name!r} is passive (role = {self.role!r}): only the active party has "
                              "label_column and task; set role = 'active' on the party with the labels")

    def __post_init__(self) -> None:
        if not self.role:
            # Whoever holds the labels is the active party, unless the config says otherwise.
            object.__setattr__(self, "role", "active" if self.file is not None and self.label_column else "passive")
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
        for name in ("feature_columns", "drop_columns", "categorical"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        self._check_file_entry()


@dataclass(frozen=True, kw_only=True)
class BlockSpec:
    """``rows`` samples (a count, or a fraction of the dataset) held by exactly ``parties``.

    ``name`` (optional) lets a sweep address the block: ``"samples.blocks.p1_a.rows" = [100, 200]``.
    ``test = true``: rows held out for testing only, never trained on, drawn before the others (with
    ``samples.test_seed``, so the same in every repeat when it is set); a protocol scores them (people the
    active party holds alone: ``test_from = 'active_only'``; with partners: ``'aligned'``).
    """

    parties: tuple[str, ...]
    rows: Count
    name: str = ""
    test: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.parties, list):
            object.__setattr__(self, "parties", tuple(self.parties))
        if not self.parties:
            raise ConfigError("a block must name at least one party")
        _check_count(f"samples.blocks.{self.name or '/'.join(self.parties)}.rows", self.rows, allow_zero=True)


@dataclass(frozen=True, kw_only=True)
class SamplesSpec:
    """Which rows each party holds.

    Counts are integers; floats in (0, 1] are fractions (``aligned`` of the active
    party's rows, ``active`` and block ``rows`` of the dataset after ``total`` and the held-out test rows).

    A fixed test set, independent of the overlap: ``test_aligned`` people every party holds and
    ``test_active_only`` people only the active party holds are held out first (counts, or fractions of the
    dataset after ``total``), drawn with ``test_seed`` (default: the layout's seed), stratified by label; the
    other counts then apply to the rows left. (``blocks`` layout: blocks with ``test = true``.)

    ``layout = "missing"`` (LASER-VFL's setting, any subset of parties holding a person): the active party
    holds every row; each passive party lacks each training person with probability ``p_miss``, independently.
    ``test_rows`` people are held out; each lacks exactly ``test_absent`` of the partners (a share: 0.5 of four
    partners is two, chosen at random per person) or, with ``test_p_miss``, each partner independently with
    that probability (none absent when neither is given). Who lacks whom is drawn with ``test_seed`` for the
    test people and the layout's seed for the others.
    """

    layout: Literal["overlap", "misaligned", "blocks", "missing"] = "overlap"
    total: int | None = None
    active: Count | None = None
    aligned: Count = 1.0
    passive_only: Count = 0
    blocks: tuple[BlockSpec, ...] = ()
    test_aligned: Count = 0
    test_active_only: Count = 0
    test_seed: int | None = None
    p_miss: float = 0.0
    test_rows: Count = 0
    test_absent: float | None = None
    test_p_miss: float | None = None

    def __post_init__(self) -> None:
        blocks = tuple(b if isinstance(b, BlockSpec) else BlockSpec(**b) for b in self.blocks)
        object.__setattr__(self, "blocks", blocks)
        if self.layout not in ("overlap", "misaligned", "blocks", "missing"):
            raise ConfigError(
                f"samples.layout must be 'overlap', 'misaligned', 'blocks' or 'missing', got {self.layout!r}"
            )
        self._check_missing()
        if self.layout == "blocks" and not blocks:
            raise ConfigError("samples.layout = 'blocks' needs at least one [[scenario.samples.blocks]] entry")
        if self.layout != "blocks" and blocks:
            raise ConfigError("samples.blocks is only read with samples.layout = 'blocks'")
        for name in ("aligned", "passive_only", "test_aligned", "test_active_only"):
            _check_count(f"samples.{name}", getattr(self, name), allow_zero=True)
        if self.layout == "blocks" and (self.test_aligned or self.test_active_only):
            raise ConfigError("samples.test_aligned and test_active_only describe the overlap and misaligned "
                              "layouts; with layout = 'blocks', mark test blocks with test = true")
        if self.active is not None:
            _check_count("samples.active", self.active, allow_zero=False)
        if self.total is not None and self.total < 1:
            raise ConfigError("samples.total must be a positive number of rows")


    def _check_missing(self) -> None:
        given = [name for name in ("p_miss", "test_rows", "test_absent", "test_p_miss")
                 if getattr(self, name) not in (0, 0.0, None)]
        if self.layout != "missing":
            if given:
                raise ConfigError(f"samples.{given[0]} is read with samples.layout = 'missing' only")
            return
        wrong = [name for name in ("active", "passive_only", "test_aligned", "test_active_only")
                 if getattr(self, name) not in (0, None)]
        if wrong:
            raise ConfigError(f"samples.{wrong[0]} does not apply to layout = 'missing' (the active party holds every "
                              "row; held-out people are test_rows)")
        for name in ("p_miss", "test_absent", "test_p_miss"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not 0.0 <= value <= 1.0):
                raise ConfigError(f"samples.{name} is a share in [0, 1], got {value!r}")
        if self.p_miss >= 1.0:
            raise ConfigError("samples.p_miss = 1 leaves the partners no training person; give a share below 1")
        if self.test_absent is not None and self.test_p_miss is not None:
            raise ConfigError("give samples.test_absent (a share of partners each test person lacks) or test_p_miss "
                              "(each partner absent with that probability), not both")
        _check_count("samples.test_rows", self.test_rows, allow_zero=True)

    def missing_holders(self, active: str, passives: Sequence[str], n: int, rng: np.random.Generator, *,
                        test: bool) -> list[tuple[tuple[str, ...], int]]:
        """Layout ``missing``: how many of ``n`` people each set of holders has (the active party always)."""
        k = len(passives)
        if test and self.test_absent is not None:
            lacking = round(self.test_absent * k)
            held = np.ones((n, k), dtype=bool)
            for row in held:
                row[rng.choice(k, size=lacking, replace=False)] = False
        else:
            p = (self.test_p_miss or 0.0) if test else self.p_miss
            held = rng.random((n, k)) >= p
        if n == 0:
            return []
        sets, counts = np.unique(held, axis=0, return_counts=True)
        out = [((active, *(q for q, h in zip(passives, row.tolist(), strict=True) if h)), int(c))
               for row, c in zip(list(sets), counts.tolist(), strict=True)]
        return sorted(out, key=lambda b: (-len(b[0]), b[0]))


def _check_count(name: str, value: Count, *, allow_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a row count or a fraction, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
    if isinstance(value, float) and value > 1.0:
        raise ConfigError(f"{name} = {value}: a float is a fraction and must be at most 1; use an int for a count")


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
        files = [p.from_file for p in parties]
        if any(files) and not all(files):
            raise ConfigError(
                f"parties {[p.name for p in parties if p.from_file]} read their own files but "
                f"{[p.name for p in parties if not p.from_file]} do not: a scenario is built either from every party's "
                "own file or from one dataset")
        if all(files):
            s = self.samples
            if s.layout != "overlap" or s.total is not None or s.active is not None or s.passive_only or s.blocks \
                    or s.test_aligned or s.test_active_only:
                raise ConfigError("with the parties' own files, who holds which person comes from their IDs: of "
                                  "[scenario.samples] only aligned applies (how many of the shared people to keep)")
        if any(p.share is not None for p in parties) and any(p.columns == "rest" for p in parties):
            raise ConfigError(
                "share is a relative weight among the parties sized by share, so beside a 'rest' party it leaves "
                "'rest' nothing; give those parties n_columns instead, or drop 'rest' and give every open party a "
                "share")

    @property
    def from_files(self) -> bool:
        """Whether every party reads its own file (rather than a part of one dataset)."""
        return all(p.from_file for p in self.parties)

    def load_tables(self, base: Path | None = None,
                    cache: dict[tuple[object, ...], tuple[PartyData, TableEncoding]] | None = None,
                    ) -> list[tuple[PartyData, TableEncoding]]:
        """Each party's own file, read and encoded (file paths relative to ``base``); ``cache`` keeps reads."""
        from vflo.data.files import TableEncoding, read_table

        out = []
        for p in self.parties:
            assert p.file is not None and p.id_column is not None
            path = Path(p.file) if base is None or Path(p.file).is_absolute() else base / p.file
            key = (str(path.resolve()), p.name, p.id_column, p.label_column, p.feature_columns, p.drop_columns,
                   p.categorical, p.task, p.impute, p.missing_indicator)
            if cache is not None and key in cache:
                out.append(cache[key])
                continue
            frame = read_table(path, party=p.name, id_column=p.id_column)
            encoding = TableEncoding.fit(frame, party=p.name, id_column=p.id_column, label_column=p.label_column,
                                         feature_columns=p.feature_columns, drop_columns=p.drop_columns,
                                         categorical=p.categorical, task=p.task, impute=p.impute,
                                         missing_indicator=p.missing_indicator)
            table = (PartyData.encoded(frame, encoding), encoding)
            if cache is not None:
                cache[key] = table
            out.append(table)
        return out

    def build_from_tables(self, tables: Sequence[tuple[PartyData, TableEncoding]], seed: int,
                          name: str = "own data") -> Layout:
        """The layout of the parties' own tables; ``samples.aligned`` keeps that many of the shared people."""
        active = next(enc for _, enc in tables if enc.label_column is not None)
        layout = Layout.from_parties([data for data, _ in tables], seed=seed, standardize=self.standardize,
                                     aligned=self.samples.aligned, task=active.task, classes=active.classes,
                                     name=name, source=", ".join(f"{p.name}: {p.file}" for p in self.parties))
        _refuse_empty_parties(layout)
        return layout

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
        n_pool = self.samples.total or n_rows
        tests = self._test_blocks(n_pool, seed)
        held = self._held_out(dataset, sum(n for _, n in tests), seed)
        rest = np.setdiff1d(np.arange(n_rows), held, assume_unique=True)
        pool = rest[row_rng.permutation(len(rest))][: n_pool - len(held)]
        blocks = self._blocks(len(pool), seed)
        needed = sum(rows for _, rows in blocks)
        if needed > len(pool):
            raise ScenarioError(
                f"the scenario needs {needed} distinct rows but the dataset (after samples.total and the held-out "
                f"test rows) has {len(pool)}; lower the counts (active, aligned, passive_only or block rows)"
            )
        holders: dict[str, list[np.ndarray]] = {p.name: [] for p in self.parties}
        test_rows = _deal_blocks(tests, held, holders)
        block_rows = _deal_blocks(blocks, pool, holders)
        empty = [name for name, chunks in holders.items() if not chunks]
        if empty:
            raise ScenarioError(
                f"parties {empty} would hold no rows; give them aligned, passive_only or block rows"
            )
        featureless = [p.name for p in self.parties if p.role != "active" and not columns[p.name]]
        if featureless:
            raise ScenarioError(f"passive parties {featureless} would hold no columns; every party but the label "
                                "holder needs at least one: adjust n_columns, share or columns")
        rows_by_party = {}
        for name, chunks in holders.items():
            rows = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)
            # Each party keeps its rows in its own random order, so row position reveals nothing.
            rows_by_party[name] = order_rng.permutation(rows)
        return Layout(
            standardize=self.standardize, dataset=dataset, parties=self.party_infos, columns=columns,
            rows=rows_by_party, blocks=tuple(block_rows), seed=seed, test_blocks=tuple(test_rows),
        )

    def _test_blocks(self, n_pool: int, seed: int) -> list[tuple[tuple[str, ...], int]]:
        """The held-out test blocks (members, rows), before any other row is dealt."""
        s = self.samples
        if s.layout == "blocks":
            return [(b.parties, resolve_count(f"samples.blocks[{i}].rows", b.rows, n_pool))
                    for i, b in enumerate(s.blocks) if b.test]
        active = self.active
        passives = [p.name for p in self.parties if p.role == "passive"]
        if s.layout == "missing":
            rng = np.random.default_rng(np.random.SeedSequence([s.test_seed if s.test_seed is not None else seed,
                                                                0x7E57, 0xAB5]))
            n_test = resolve_count("samples.test_rows", s.test_rows, n_pool)
            return [b for b in s.missing_holders(active, passives, n_test, rng, test=True) if b[1] > 0]
        everyone = (active, *passives)
        out = [(everyone, resolve_count("samples.test_aligned", s.test_aligned, n_pool)),
               ((active,), resolve_count("samples.test_active_only", s.test_active_only, n_pool))]
        return [b for b in out if b[1] > 0]

    def _held_out(self, dataset: Dataset, n: int, seed: int) -> np.ndarray:
        """``n`` dataset rows for testing, stratified by label where it can be, drawn with ``test_seed``."""
        if n == 0:
            return np.empty(0, dtype=np.int64)
        n_rows = len(dataset.ids)
        if n >= n_rows:
            raise ScenarioError(f"the scenario holds out {n} test rows but the dataset has {n_rows}: leave rows "
                                "to train on (lower test_aligned, test_active_only or the test blocks' rows)")
        rng = np.random.default_rng(np.random.SeedSequence(
            [self.samples.test_seed if self.samples.test_seed is not None else seed, 0x7E57]))
        y = dataset.y
        stratify = y if can_stratify(y, n, n_rows) else None
        from sklearn.model_selection import train_test_split

        _, chosen = train_test_split(np.arange(n_rows), test_size=n, random_state=int(rng.integers(2**31)),
                                     stratify=stratify)
        # Dealt to the test blocks in a random order, so each block is a random share of the stratified draw.
        out: np.ndarray = rng.permutation(np.asarray(chosen, dtype=np.int64))
        return out

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

    def _blocks(self, n_pool: int, seed: int) -> list[tuple[tuple[str, ...], int]]:
        s = self.samples
        active = self.active
        passives = [p.name for p in self.parties if p.role == "passive"]
        everyone = (active, *passives)
        if s.layout == "missing":
            if not passives:
                raise ConfigError("samples.layout = 'missing' needs at least one passive party")
            rng = np.random.default_rng(np.random.SeedSequence([seed, 0xAB5]))
            return [b for b in s.missing_holders(active, passives, n_pool, rng, test=False) if b[1] > 0]
        if s.layout == "blocks":
            out = []
            for i, block in enumerate(s.blocks):
                if not block.test:
                    out.append((block.parties, resolve_count(f"samples.blocks[{i}].rows", block.rows, n_pool)))
            seen = [(frozenset(b.parties), b.test) for b in s.blocks]
            if len(set(seen)) != len(seen):
                raise ConfigError("two blocks name the same set of parties; merge them into one block")
            return out
        n_active = n_pool if s.active is None else resolve_count("samples.active", s.active, n_pool)
        n_aligned = resolve_count("samples.aligned", s.aligned, n_active) if passives else 0
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
            n_only = resolve_count(f"samples.passive_only ({p})", s.passive_only, outside) if outside else 0
            if isinstance(s.passive_only, int) and s.passive_only > 0 and outside < s.passive_only:
                raise ScenarioError(
                    f"samples.passive_only = {s.passive_only} but only {outside} rows lie outside the active party"
                )
            blocks.append(((p,), n_only))
            outside -= n_only
        return [b for b in blocks if b[1] > 0]


def can_stratify(y: np.ndarray, n_test: int, n: int) -> bool:
    """Whether ``n_test`` of ``n`` rows can be drawn stratified by class labels ``y`` (never for regression
    targets): every class needs two rows and a place on both sides."""
    if y.dtype.kind == "f":
        return False
    _, counts = np.unique(y, return_counts=True)
    return bool(counts.min() >= 2 and n_test >= len(counts) and n - n_test >= len(counts))


def _deal_blocks(blocks: Sequence[tuple[tuple[str, ...], int]], rows: np.ndarray,
                 holders: dict[str, list[np.ndarray]]) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """Consecutive runs of ``rows`` to each block, in order; each member party is told its run."""
    out, start = [], 0
    for members, n_rows in blocks:
        chunk = rows[start : start + n_rows]
        start += n_rows
        out.append((members, chunk))
        for name in members:
            holders[name].append(chunk)
    return out


def _refuse_empty_parties(layout: Layout) -> None:
    featureless = [p.name for p in layout.parties if p.role != "active" and not layout.columns[p.name]]
    if featureless:
        raise ScenarioError(f"passive parties {featureless} hold no feature columns; every party but the label "
                            "holder needs at least one: check feature_columns and drop_columns")


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
