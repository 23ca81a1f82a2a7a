"""``vflo compare``: every method that can run, on identical splits, across the questions a person brings.

Around one base scenario (one passive party, a random split of the columns, ``base_aligned`` of the active
party's people shared) it varies one thing at a time:

* ``aligned``: the share of the active party's people the passive parties also hold;
* ``passives``: how many passive parties split the other columns;
* ``splits``: how the columns are split: ``random``; ``importance`` (the active party keeps the columns
  that matter least for the label, so its partners hold what matters); ``correlation`` (columns that
  correlate stay with one party, so a party's columns are redundant with each other, not with its
  partners'). This is our own take on VertiBench's importance and correlation splits (Wu et al., 2023),
  written here rather than taken from ``vertibench`` because it must work on any table vflo loads and
  keep the active party's share of columns fixed across splits;
* ``second_hop``: a second passive party that shares people with the first one but none with the active
  party (VFL-ASP's setting); the value is how many people the two passive parties share, as a share of the
  active party's training people. Here the active party holds half the training people (the rest are the
  second hop's), and each method runs with the settings it gives for that layout
  (:meth:`~vflo.methods.base.Method.layout_settings`: SplitNN trains with the first hop alone), or says why
  it cannot;
* ``scored``: whose people are scored: ``aligned`` (people every party holds: collaborative inference) or
  ``active_only`` (people only the active party holds: new people, where only methods that score from the
  active party's features can answer; the others are marked unable);
* partners missing (LASER-VFL's setting, ``missing_passives`` partners, scored ``missing``): ``p_miss``, the
  probability that a partner lacks a training person (each independently), at ``base_absent``; and ``absent``,
  the share of the partners each test person lacks (0.25 of four is one), at ``base_p_miss``. The active party
  holds every person. Local, SplitNN with Local as the fallback for people a partner lacks (``splitnn``),
  SplitNN with party-wise dropout (``plugvfl``), APC-VFL and LASER-VFL answer there
  (:meth:`~vflo.methods.base.Method.layout_settings` with ``"missing"``); the other methods say why not.

The test people are held out first, the same in every cell and repeat: people every party holds (in
second-hop cells: the active party and the first hop) and people only the active party holds, at least
``test_rows`` of each where the dataset allows (never more than ``test_fraction`` of its rows each). The
overlap varies only among the training people, so every cell is scored on the same people.

Each cell is a regular experiment (``repeated_runs``), so every row is what ``vflo run`` records; the report
opens with the answer for the base cell and adds a "which method when" table, both computed from the runs.

A config whose parties read their own files (``[[scenario.parties]]`` with ``file``, as ``vflo run`` takes
them) is compared around the real overlap of those files instead (:mod:`vflo.experiments.compare_own`).

A method whose settings need an optional library this Python lacks (:func:`missing_library`) is left out of
the whole comparison with one line saying how to install it. ``--quick`` (a config's ``[quick]`` table) makes
a comparison short with fewer cells, methods, rows or epochs, never with fewer than ``MIN_REPEATS`` repeats:
every cell still names a best method, a tie, or why it cannot.
"""

from __future__ import annotations

import copy
import importlib
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from vflo import schema
from vflo.data.datasets import Dataset
from vflo.errors import ConfigError
from vflo.experiments.config import parse_config
from vflo.experiments.runner import ExperimentResult, run_experiment
from vflo.methods.base import Layout
from vflo.methods.registry import active_only, get_method, method_names
from vflo.privacy.columns import AttackSettings

if TYPE_CHECKING:
    from vflo.experiments.own_files import OwnFiles

logger = logging.getLogger(__name__)

Split = Literal["random", "importance", "correlation"]
Scored = Literal["aligned", "active_only", "missing"]
#: ``dropped`` and ``without`` are the own-files axes (columns a partner leaves out, a partner left out).
Axis = Literal["aligned", "passives", "split", "second_hop", "p_miss", "absent", "dropped", "without", "epsilon",
               "epsilon_hop"]
#: The privacy axis's cells: ``epsilon`` in the base scenario, ``epsilon_hop`` in the second-hop layout (at
#: ``base_second_hop``), where the methods that need a second hop (VFL-ASP) run.
PRIVATE_AXES = ("epsilon", "epsilon_hop")
#: The names of the passive parties in a second-hop cell.
FIRST_HOP, SECOND_HOP = "passive1", "passive2"


def registered_variants() -> dict[str, dict[str, Any]]:
    """The variants every registered method names for the missing-partner cells: label -> name and settings."""
    return {label: {"name": name, **settings} for name in method_names()
            for label, settings in get_method(name).variants.items()}


@dataclass(frozen=True, kw_only=True)
class CompareCommon:
    """What the ``[compare]`` table of a simulated split (:class:`CompareSettings`) and of the parties' own files
    (:class:`vflo.experiments.compare_own.OwnCompareSettings`) share: the aligned shares, whose people are scored,
    the test draws and the methods."""

    aligned: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0)
    scored: tuple[Scored, ...] = ("aligned", "active_only")
    repeats: int = 3
    test_rows: int = 50
    test_fraction: float = 0.2
    rows: int | None = None
    methods: tuple[str, ...] = ()
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.test_rows < 1 or not 0 < self.test_fraction < 0.5:
            raise ConfigError("compare.repeats and compare.test_rows must be at least 1, and compare.test_fraction "
                              "(the most of the rows each test set may take) in (0, 0.5)")
        for name in self.methods:
            get_method(name)  # an unknown name fails here, with a "did you mean"


@dataclass(frozen=True, kw_only=True)
class CompareSettings(CompareCommon):
    """The ``[compare]`` table: the axes, the base point, and the methods (empty: every one that can run)."""

    passives: tuple[int, ...] = (1, 2, 4)
    splits: tuple[Split, ...] = ("random", "importance", "correlation")
    second_hop: tuple[float, ...] = (0.25, 0.5, 1.0)
    p_miss: tuple[float, ...] = (0.0, 0.1, 0.5)
    absent: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)
    base_p_miss: float = 0.1
    base_absent: float = 0.5
    missing_passives: int = 4
    #: Extra entries in the missing-partner cells, by label: a method's name and settings (by default the
    #: variants the methods name themselves, e.g. PlugVFL: SplitNN with party-wise dropout).
    missing_variants: dict[str, dict[str, Any]] = field(default_factory=registered_variants)
    base_aligned: float = 0.5
    active_share: float = 0.3
    #: The privacy axis: every passive party protects what it sends with this ε per person, end to end (δ 1e-5;
    #: its side calibrated at setup, as a deployed party's own [privacy] epsilon does), and the label holder
    #: randomises its labels at the same ε where a method sends what they shape (``label_epsilon``), at the base
    #: share. ε = ∞ is the base cell of the aligned axis. These cells and the base cell are attacked (``[attacks]``).
    #: Where ``second_hop`` is not empty, the same ε cells run in the second-hop layout too, at
    #: ``base_second_hop`` (ε = ∞: that second-hop cell), so a method that needs a second hop has its ε cells.
    epsilons: tuple[float, ...] = (1.0, 4.0, 8.0)
    base_second_hop: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.aligned or any(not 0 < a <= 1 for a in self.aligned):
            raise ConfigError(f"compare.aligned: shares of the active party's people in (0, 1], got {self.aligned}")
        if not 0 < self.base_aligned <= 1:
            raise ConfigError(f"compare.base_aligned must be in (0, 1], got {self.base_aligned}")
        if not self.passives or min(self.passives) < 1:
            raise ConfigError(f"compare.passives: counts of passive parties, at least 1, got {self.passives}")
        if not 0 < self.active_share < 1:
            raise ConfigError(f"compare.active_share must be in (0, 1), got {self.active_share}")
        if any(not 0 < e < math.inf for e in self.epsilons):
            raise ConfigError(f"compare.epsilons: budgets per person, each a positive number (ε = ∞ is the base cell, "
                              f"without a budget); got {self.epsilons}")
        if any(not 0 < v <= 1 for v in (*self.second_hop, self.base_second_hop)):
            raise ConfigError(f"compare.second_hop and base_second_hop: people the two passive parties share, as a "
                              f"share of the active party's training people, in (0, 1]; got {self.second_hop} and "
                              f"{self.base_second_hop}")
        if any(not 0 <= v < 1 for v in (*self.p_miss, self.base_p_miss)):
            raise ConfigError(f"compare.p_miss and base_p_miss: the probability that a partner lacks a training "
                              f"person, in [0, 1); got {self.p_miss} and {self.base_p_miss}")
        if any(not 0 <= v <= 1 for v in (*self.absent, self.base_absent)):
            raise ConfigError(f"compare.absent and base_absent: the share of partners a test person lacks, in "
                              f"[0, 1]; got {self.absent} and {self.base_absent}")
        if self.missing_passives < 1:
            raise ConfigError(f"compare.missing_passives: partners in the missing-partner cells, at least 1; got "
                              f"{self.missing_passives}")
        if any(v not in ("aligned", "active_only") for v in self.scored):
            raise ConfigError(f"compare.scored: 'aligned' and/or 'active_only', got {self.scored} (the "
                              "missing-partner cells come with p_miss and absent)")
        for name in self.settings:
            get_method(name)  # an unknown name fails here, with a "did you mean"
        for name, overrides in self.settings.items():
            schema.build(get_method(name).Config, overrides, where=f"compare.settings.{name}")  # bad settings too
        for label, table in self.missing_variants.items():
            if not isinstance(table, dict) or "name" not in table:
                raise ConfigError(f"compare.missing_variants.{label}: a table with the method's name and settings, "
                                  "e.g. { name = 'METHOD', SETTING = VALUE }")
            rest = {k: v for k, v in table.items() if k != "name"}
            schema.build(get_method(str(table["name"])).Config, rest, where=f"compare.missing_variants.{label}")


@dataclass(frozen=True)
class Cell:
    """One experiment of the comparison: an axis, its value, and whose people are scored."""

    axis: Axis
    value: Any
    scored: Scored
    passives: int
    #: ``"own"``: the parties' own columns, as their files have them.
    split: Split | Literal["own"]

    @property
    def label(self) -> str:
        return f"{self.axis}={self.value}, scored={self.scored}"

    @property
    def layout(self) -> Layout:
        if self.scored == "missing":
            return "missing"
        return "second_hop" if self.axis in ("second_hop", "epsilon_hop") else "star"


@dataclass
class Comparison:
    """Every cell's rows, with the axes as columns; what was skipped and why; the time it took."""

    name: str
    dataset: Dataset
    task: str
    metric: str
    rows: pd.DataFrame
    skipped: dict[str, str]
    seconds: float
    settings: CompareCommon
    results: list[ExperimentResult] = field(default_factory=list)
    #: Held-out test people of each kind (the same in every cell and repeat).
    test_people: int = 0
    #: The settings methods ran with in second-hop cells (their own, from ``Method.layout_settings``).
    second_hop_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The cell the report answers first (axis and value, as the rows spell them): the base scenario.
    base: dict[str, str] = field(default_factory=dict)
    #: Methods left out of every cell because an optional library they need is not installed: name -> the line.
    unavailable: dict[str, str] = field(default_factory=dict)
    #: Axes that did not run, with why (on the parties' own files, those that need one pooled table).
    left_out: dict[str, str] = field(default_factory=dict)
    #: On the parties' own files: what the comparison varied around (`~vflo.experiments.own_files.OwnFiles`).
    own: OwnFiles | None = None

    @property
    def base_cell(self) -> dict[str, str]:
        """The base cell's axis and value: ``base``, or the aligned share the settings name as the base."""
        if self.base or not isinstance(self.settings, CompareSettings):
            return self.base
        return {"axis": "aligned", "value": str(float(self.settings.base_aligned))}

    @property
    def base_hop_cell(self) -> dict[str, str]:
        """The second-hop cell the privacy axis's second-hop ε cells read against (ε = ∞); empty on own files."""
        if not isinstance(self.settings, CompareSettings):
            return {}
        return {"axis": "second_hop", "value": str(float(self.settings.base_second_hop))}


def load_compare(raw: Mapping[str, Any], *, quick: bool = False) -> tuple[dict[str, Any], CompareSettings]:
    """The base experiment tables (name, seed, dataset) and the compare settings of a compare config; with
    ``quick``, its ``[quick]`` table overrides ``[compare]`` keys (e.g. ``aligned = [0.1, 1.0]``)."""
    raw = dict(raw)
    known = {"name", "seed", "description", "dataset", "compare", "quick", "attacks"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"a compare config takes {sorted(known)}, not {unknown} (a config whose "
                          "[[scenario.parties]] read their own files takes scenario, methods and the rest of "
                          "vflo run's tables)")
    if raw.get("attacks") is not None:  # a wrong attacker's setting is named before any cell runs
        schema.build(AttackSettings, raw["attacks"], where="attacks")
    quick_table = raw.pop("quick", None) or {}
    table = dict(raw.pop("compare", None) or {})
    if quick:
        table |= {k.removeprefix("compare."): v for k, v in dict(quick_table).items()}
        check_quick_repeats(table.get("repeats", CompareSettings.repeats))
    return raw, schema.build(CompareSettings, table, where="compare")


def check_quick_repeats(repeats: object) -> None:
    """``--quick`` answers every cell, so it never runs fewer repeats than a best method needs."""
    if isinstance(repeats, int) and repeats < MIN_REPEATS:
        raise ConfigError(f"[quick] repeats = {repeats}: a quick comparison still names a best method in every "
                          f"cell, which takes a spread over at least {MIN_REPEATS} repeats; set repeats = "
                          f"{MIN_REPEATS} or more in [quick] (or leave it out), and make it quicker with fewer "
                          "cells, methods, rows or epochs")


def missing_library(name: str, settings: Mapping[str, Any]) -> str | None:
    """The line that says how to install the optional library method ``name`` needs with ``settings`` and this
    Python lacks; None when it can run. (Homomorphic encryption, as SecureBoost's ``he`` settings ask for it,
    needs SecretFlow's HEU, the ``he`` extra.)"""
    from vflo.trees.crypto import HESettings

    config = schema.build(get_method(name).Config, dict(settings), where=f"compare.settings.{name}")
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, HESettings) and value.scheme != "plaintext" and not _importable("heu"):
            return (f"{name} left out: its homomorphic encryption ({f.name}.scheme = {value.scheme!r}) needs "
                    "SecretFlow's HEU, not installed here; pip install 'vflo[he]' to compare it")
    return None


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def unavailable_methods(tables: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Of the comparison's methods (label -> table with ``name`` and settings), those an optional library they
    need is missing for, each with its one line, said once in the log."""
    out = {}
    for label, table in tables.items():
        line = missing_library(str(table.get("name", label)),
                               {k: v for k, v in table.items() if k not in ("name", "label", "fallback")})
        if line is not None:
            out[label] = line
            logger.warning("compare: %s", line)
    return out


def column_split(dataset: Dataset, split: Split, passives: int, active_share: float, seed: int) -> list[list[str]]:
    """The active party's columns, then each passive party's, for ``split``."""
    columns = list(dataset.columns)
    if len(columns) < passives + 1:
        raise ConfigError(f"{dataset.name} has {len(columns)} columns: too few for {passives} passive parties")
    n_active = min(max(1, round(active_share * len(columns))), len(columns) - passives)
    rng = np.random.default_rng(seed)
    X = dataset.X.to_numpy(dtype=np.float64)
    sample = rng.choice(len(X), size=min(len(X), 3000), replace=False)
    if split == "random":
        order = [columns[i] for i in rng.permutation(len(columns))]
        return _deal(order, n_active, passives)
    if split == "importance":
        from sklearn.feature_selection import mutual_info_classif, mutual_info_regression

        scorer = mutual_info_regression if dataset.task == "regression" else mutual_info_classif
        importance = scorer(X[sample], dataset.y[sample], random_state=seed)
        order = [columns[i] for i in np.argsort(importance, kind="stable")]  # least important first
        return _deal(order, n_active, passives)
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    corr = np.nan_to_num(np.corrcoef(X[sample].T), nan=0.0)
    distance = np.clip(1.0 - np.abs(corr), 0.0, None)
    np.fill_diagonal(distance, 0.0)
    tree = linkage(squareform(distance, checks=False), method="average")
    clusters = fcluster(tree, t=passives + 1, criterion="maxclust")
    # Columns of one cluster stay together: order by cluster, then deal in that order.
    order = [columns[i] for i in sorted(range(len(columns)), key=lambda i: (clusters[i], i))]
    return _deal(order, n_active, passives)


def _deal(order: list[str], n_active: int, passives: int) -> list[list[str]]:
    active, rest = order[:n_active], order[n_active:]
    shares = np.array_split(np.arange(len(rest)), passives)
    return [active, *[[rest[i] for i in part] for part in shares]]


def cells(settings: CompareSettings) -> list[Cell]:
    """The comparison's cells; the base share always among the aligned axis's, since the report answers it first."""
    out = []
    aligned = sorted({*settings.aligned, settings.base_aligned})
    hop_epsilons = settings.epsilons if settings.second_hop else ()
    # ε = ∞ in the second-hop layout is its cell at the base share, so that cell always runs with the ε cells.
    hops = sorted({*settings.second_hop, *((settings.base_second_hop,) if hop_epsilons else ())})
    for scored in settings.scored:
        out += [Cell("aligned", a, scored, 1, "random") for a in aligned]
        out += [Cell("passives", n, scored, n, "random") for n in settings.passives if n != 1]
        out += [Cell("split", s, scored, 1, s) for s in settings.splits if s != "random"]
        out += [Cell("second_hop", v, scored, 2, "random") for v in hops]
        out += [Cell("epsilon", e, scored, 1, "random") for e in settings.epsilons]
        out += [Cell("epsilon_hop", e, scored, 2, "random") for e in hop_epsilons]
    n = settings.missing_passives
    out += [Cell("p_miss", v, "missing", n, "random") for v in settings.p_miss]
    out += [Cell("absent", v, "missing", n, "random") for v in settings.absent]
    return out


def held_out_people(settings: CompareSettings, n_rows: int) -> int:
    """Held-out test people of each kind: ``test_rows``, or half of ``test_fraction`` of the rows when that is
    more, and never more than ``test_fraction`` of the rows (a small dataset keeps rows to train on)."""
    return min(max(settings.test_rows, round(settings.test_fraction * n_rows / 2)),
               int(settings.test_fraction * n_rows))


def cannot_run(name: str, task: str, cell: Cell, settings: Mapping[str, Any] | None = None) -> dict[str, Any] | str:
    """The settings method ``name`` gives itself for the cell's layout, or why it cannot run in the cell (with
    ``settings``, the comparison's own for it)."""
    cls = get_method(name)
    own = cls.layout_settings(cell.layout, first_hop=FIRST_HOP, second_hop=SECOND_HOP)
    if isinstance(own, str):
        return own
    if task not in cls.tasks:
        return f"does not support {task} tasks"
    if cell.scored == "active_only" and cls.inference != "active_only" and not cls.any_subset:
        return "scores together with its partners, who have never seen these people"
    if cell.axis in PRIVATE_AXES:
        # The label holder protects what its labels shape (gradients) at the same ε; shared settings a protecting
        # partner needs (no IDs in the clear) are set too.
        own = {**own, **cls.private_settings(float(cell.value))}
        parties = (FIRST_HOP, SECOND_HOP) if cell.layout == "second_hop" else (FIRST_HOP,)
        why = cls.private_refusal(cell.layout) or unprotected(name, {**(settings or {}), **own}, parties)
        if why:
            return why
    return own


def unprotected(name: str, settings: Mapping[str, Any] | None = None,
                parties: Collection[str] = (FIRST_HOP,)) -> str:
    """Why method ``name`` (with ``settings``) cannot run where every passive party (``parties``, by name: a
    method may give each its own side) protects what it sends with a budget ("" where it can: it sends nothing
    from them, or calibrates their side)."""
    cls = get_method(name)
    if cls.simulation_only:
        return "pools every party's raw features: no budget applies to it"
    method = cls(**{k: v for k, v in (settings or {}).items() if k not in ("label", "fallback", "name")})
    if method.handler_table() and any(method.protected("passive", 1.0, rows=1000, party=p) is None
                                      for p in parties):
        return ("cannot protect what a passive party sends under a privacy budget: its side "
                f"{method.unprotectable('passive')}")
    return ""


def applicable(settings: CompareSettings, task: str, cell: Cell, *,
               unavailable: Collection[str] = ()) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The methods that run in a cell with their settings, and every other one with the reason (methods in
    ``unavailable`` are left out, said once elsewhere)."""
    names = [n for n in (list(settings.methods) or method_names()) if n not in unavailable]
    run, skipped = {}, {}
    for name in names:
        own = cannot_run(name, task, cell, settings.settings.get(name))
        if isinstance(own, str):
            skipped[name] = own
        else:
            run[name] = {**settings.settings.get(name, {}), **own}
    if cell.layout == "missing":
        for label, table in settings.missing_variants.items():
            base = str(table["name"])
            if base in names and label not in unavailable and task in get_method(base).tasks:
                run[label] = {**settings.settings.get(base, {}), **table, "label": label}
        run, skipped = with_fallback(run, skipped)
    return run, skipped


def with_fallback(run: dict[str, dict[str, Any]],
                   skipped: dict[str, str]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Missing-partner cells: the fallbacks methods name (``fallback = NAME``, an active-only method scoring the
    test people a partner lacks) first; a method whose fallback is not in the comparison cannot run there."""
    absent = {m: str(t["fallback"]) for m, t in run.items() if "fallback" in t and t["fallback"] not in run}
    skipped |= {m: f"scores the people a partner lacks with {f}, which is not in this comparison"
                for m, f in absent.items()}
    run = {m: t for m, t in run.items() if m not in absent}
    first = {str(t["fallback"]) for t in run.values() if "fallback" in t}
    return {**{m: t for m, t in run.items() if m in first}, **{m: t for m, t in run.items() if m not in first}}, skipped


def experiment_tables(base: Mapping[str, Any], settings: CompareSettings, cell: Cell, columns: list[list[str]],
                      methods: Mapping[str, Mapping[str, Any]], n_rows: int) -> dict[str, Any]:
    """The experiment a cell runs, as the tables of a config file: the test people held out first (drawn with
    the comparison's seed, so the same in every cell and repeat), the overlap among the rest."""
    parties = [{"name": "active", "role": "active", "columns": columns[0]}]
    parties += [{"name": f"passive{i + 1}", "role": "passive", "columns": cols} for i, cols in enumerate(columns[1:])]
    aligned = cell.value if cell.axis == "aligned" else settings.base_aligned
    n = settings.rows or n_rows
    tests = held_out_people(settings, n)
    seed = int(base.get("seed", 0))
    samples: dict[str, Any]
    if cell.layout == "missing":
        p_miss = cell.value if cell.axis == "p_miss" else settings.base_p_miss
        absent = cell.value if cell.axis == "absent" else settings.base_absent
        # As many test people as the other cells score (both kinds together), each lacking a share of the partners.
        samples = {"layout": "missing", "test_rows": 2 * tests, "test_seed": seed, "p_miss": float(p_miss),
                   "test_absent": float(absent)}
    elif cell.layout == "second_hop":
        # The active party holds half of the training people; the two passive parties share up to as many
        # people again, whom the active party does not hold.
        own = (n - 2 * tests) // 2
        shared = round(aligned * own)
        hop = settings.base_second_hop if cell.axis == "epsilon_hop" else float(cell.value)
        samples = {"layout": "blocks", "test_seed": seed, "blocks": [
            {"parties": ["active", FIRST_HOP], "rows": tests, "test": True},
            {"parties": ["active"], "rows": tests, "test": True},
            {"parties": ["active", FIRST_HOP], "rows": shared},
            {"parties": ["active"], "rows": own - shared},
            {"parties": [FIRST_HOP, SECOND_HOP], "rows": round(hop * own)}]}
    else:
        samples = {"aligned": float(aligned), "test_aligned": tests, "test_active_only": tests, "test_seed": seed}
    if settings.rows is not None:
        samples["total"] = settings.rows
    raw = copy.deepcopy(dict(base))
    raw["name"] = f"{base.get('name', 'compare')}: {cell.label}"
    raw["scenario"] = {"parties": parties, "samples": samples}
    test_from = "active" if cell.scored == "missing" else cell.scored  # every held-out person, whoever holds them
    raw["protocol"] = {"name": "repeated_runs", "runs": settings.repeats, "test_from": test_from}
    if cell.axis in PRIVATE_AXES:
        raw["privacy"] = {"epsilon": float(cell.value), "delta": 1e-5}
    attackers = raw.pop("attacks", None)
    if settings.epsilons and (cell.axis in PRIVATE_AXES or base_of_privacy(settings, cell)):
        # What leaks at each ε, and at ε = ∞ (the base cells) to read it against: the attack columns ([attacks]
        # says what the attackers know; the other cells are not attacked).
        raw["attacks"] = attackers or {}
    # A method's table may name another method and a label (an entry of its own, e.g. PlugVFL's SplitNN).
    raw["methods"] = [{"name": m, **dict(table)} for m, table in methods.items()]
    return raw


def base_of_privacy(settings: CompareSettings, cell: Cell) -> bool:
    """Whether a cell is ε = ∞ of the privacy axis: the base cell, or the second-hop cell its ε cells run at."""
    if cell.axis == "aligned":
        return float(cell.value) == settings.base_aligned
    return cell.axis == "second_hop" and float(cell.value) == settings.base_second_hop


def reads_own_files(raw: Mapping[str, Any]) -> bool:
    """Whether a config's parties read their own files (``[[scenario.parties]]`` with ``file``)."""
    scenario = raw.get("scenario")
    parties = scenario.get("parties") if isinstance(scenario, Mapping) else None
    return isinstance(parties, list) and any(isinstance(p, Mapping) and "file" in p for p in parties)


def compare(raw: Mapping[str, Any], *, data_dir: str | None = None, quick: bool = False,
            on_cell: Callable[[Cell, int, int], None] | None = None) -> Comparison:
    """Run every cell of a compare config (the tables of its TOML file) on a named dataset. A config whose parties
    read their own files is compared around their real overlap by
    :func:`vflo.experiments.compare_own.compare_own` (``vflo compare`` picks the one the config needs)."""
    if reads_own_files(raw):
        raise ConfigError("this config's parties read their own files: compare them with "
                          "vflo.experiments.compare_own.compare_own (vflo compare does)")
    base, settings = load_compare(raw, quick=quick)
    seed = int(base.get("seed", 0))
    probe = parse_config({**base, "scenario": {"parties": [{"name": "a", "role": "active", "share": 1.0}]},
                          "methods": [{"name": active_only()[0]}]})
    dataset = probe.load_dataset(data_dir)
    if dataset is None:  # pragma: no cover - a compare config always names a dataset
        raise ConfigError("a compare config needs a [dataset]")
    task = probe.task
    started = time.perf_counter()
    unavailable = unavailable_methods({n: {"name": n, **settings.settings.get(n, {})}
                                       for n in (list(settings.methods) or method_names())})
    frames: list[pd.DataFrame] = []
    skipped_all: dict[str, str] = {}
    results: list[ExperimentResult] = []
    plan = cells(settings)
    hop_settings: dict[str, dict[str, Any] | str] = {}
    for k, cell in enumerate(plan):
        if on_cell is not None:
            on_cell(cell, k, len(plan))
        methods, skipped = applicable(settings, task, cell, unavailable=unavailable)
        where = {"second_hop": f"{cell.scored}, second hop", "missing": "partners missing"}.get(cell.layout,
                                                                                                   cell.scored)
        for name, why in skipped.items():
            skipped_all.setdefault(f"{name} ({where})", why)
        if cell.layout == "second_hop":
            hop_settings |= {m: get_method(m).layout_settings("second_hop", first_hop=FIRST_HOP,
                                                                 second_hop=SECOND_HOP) for m in methods}
        if not methods:
            continue

        def build(cell: Cell = cell, methods: dict[str, dict[str, Any]] = methods) -> Any:
            split: Split = "random" if cell.split == "own" else cell.split
            columns = column_split(dataset, split, cell.passives, settings.active_share, seed)
            return parse_config(experiment_tables(base, settings, cell, columns, methods, len(dataset.ids)))

        frame, result = run_cell(cell, methods, build, data_dir=data_dir)
        frames.append(frame)
        if result is not None:
            results.append(result)
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    metric = results[0].config.metric if results else "accuracy"
    return Comparison(name=str(base.get("name", "compare")), dataset=dataset, task=task, metric=metric, rows=rows,
                      skipped=skipped_all, seconds=time.perf_counter() - started, settings=settings,
                      results=results, test_people=held_out_people(settings, settings.rows or len(dataset.ids)),
                      second_hop_settings={m: v for m, v in hop_settings.items() if isinstance(v, dict) and v},
                      base={"axis": "aligned", "value": str(float(settings.base_aligned))}, unavailable=unavailable)


def run_cell(cell: Cell, methods: Collection[str], build: Callable[[], Any], *,
             data_dir: str | None = None) -> tuple[pd.DataFrame, ExperimentResult | None]:
    """One cell's rows, its axes as columns: the experiment ``build()`` makes, run; a cell that cannot be made
    or run (e.g. too few shared people) gives a failed row per method, and the comparison goes on."""
    where: dict[str, Any] = {"axis": cell.axis, "value": str(cell.value), "scored": cell.scored,
                             "passives": cell.passives, "split": cell.split}
    try:
        result = run_experiment(build(), data_dir=data_dir)
    except Exception as exc:  # recorded, go on
        logger.warning("compare: %s could not run: %s", cell.label, exc)
        return pd.DataFrame([{"method": m, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
                             for m in methods]).assign(**where), None
    return pd.DataFrame(result.rows).assign(**where), result


def summary(comparison: Comparison) -> pd.DataFrame:
    """Mean and standard deviation of the metric, bytes, rounds and time per (axis, value, scored, method)."""
    rows = comparison.rows
    if rows.empty or "status" not in rows:
        return pd.DataFrame()
    ok = rows[rows["status"] == "ok"]
    metric = comparison.metric
    grouped = ok.groupby(["axis", "value", "scored", "method"], sort=False)
    out = grouped.agg(**{metric: (metric, "mean"), f"{metric}_std": (metric, "std"), "fit_bytes": ("fit_bytes", "mean"),
                         "fit_rounds": ("fit_rounds", "mean"), "wall_seconds": ("wall_seconds", "mean"),
                         "simulation_only": ("simulation_only", "first"), "inference": ("inference", "first"),
                         "runs": (metric, "size"), "test_rows": ("n_test", "mean")}).reset_index()
    # One run has no spread: its std stays unknown (NaN, printed "one run, no spread"), never a zero.
    return out


#: A cell scored on fewer test rows than this names no best method: one or two rows cannot tell methods apart.
MIN_TEST_ROWS = 20
# A best method needs a spread to be told apart by: fewer runs than this name none.
MIN_REPEATS = 3
#: Two methods differ when a paired t-test over the repeats gives p below this (two-sided).
ALPHA = 0.05


@dataclass(frozen=True)
class Paired:
    """Method ``a`` against ``b`` in one cell, paired by repeat (the same test people, layout and seeds)."""

    a: str
    b: str
    mean_a: float
    mean_b: float
    std_a: float
    std_b: float
    runs: int
    p: float

    def verdict(self, higher_is_better: bool) -> Literal["ahead of", "behind", "not clearly different from"]:
        """``a`` ahead of, behind, or not clearly different from ``b`` (paired t-test at ``ALPHA``; fewer than
        ``MIN_REPEATS`` pairs decide nothing)."""
        if self.runs < MIN_REPEATS or not self.p < ALPHA:
            return "not clearly different from"
        return "ahead of" if (self.mean_a > self.mean_b) == higher_is_better else "behind"

    def sentence(self, metric: str, higher_is_better: bool) -> str:
        if self.runs < MIN_REPEATS:
            return (f"{self.a} {self.mean_a:.3f} against {self.b} {self.mean_b:.3f} ({metric}) over {self.runs} "
                    f"run(s): too few to tell (a paired test needs at least {MIN_REPEATS})")
        test = (f"paired t-test p = {self.p:.3g}" if not math.isnan(self.p) else
                "the difference is the same in every run: no spread to test by")
        return (f"{self.a} {self.mean_a:.3f} ± {self.std_a:.3f} against {self.b} {self.mean_b:.3f} ± {self.std_b:.3f} "
                f"({metric}) over {self.runs} paired runs ({test}): {self.a} {self.verdict(higher_is_better)} "
                f"{self.b}")


def paired_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of a paired t-test over the repeats. Identical pairs differ by nothing (1.0). A difference
    that does not vary (two methods that land on the same scores in every repeat, as deterministic ones on fixed
    test people do) has no spread to test by (NaN): it could be one test row, so it decides nothing."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) < 2:
        return float("nan")
    if np.allclose(d, d[0], rtol=0.0, atol=1e-12):
        return 1.0 if abs(d[0]) <= 1e-12 else float("nan")
    from scipy.stats import ttest_rel

    return float(ttest_rel(a, b).pvalue)


def paired(rows: pd.DataFrame, metric: str, cell: Mapping[str, Any], a: str, b: str) -> Paired | None:
    """``a`` against ``b`` in the cell ``cell`` (axis, value, scored) from the comparison's rows, or None where
    either did not run there."""
    ok = rows[(rows["status"] == "ok")] if "status" in rows else rows
    for key, value in cell.items():
        ok = ok[ok[key].astype(str) == str(value)]
    runs = {m: ok[ok["method"] == m].assign(pair=lambda f: f["repeat"].astype(str) + "/" + f["fold"].astype(str))
            .set_index("pair")[metric] for m in (a, b)}
    common = sorted(set(runs[a].index) & set(runs[b].index))
    if not common:
        return None
    x, y = runs[a].loc[common].to_numpy(float), runs[b].loc[common].to_numpy(float)
    return Paired(a, b, float(x.mean()), float(y.mean()), _std(x), _std(y), len(common), paired_p(x, y))


def _std(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")


def which_method(comparison: Comparison, table: pd.DataFrame) -> pd.DataFrame:
    """Per (axis, value, scored): the best deployable method by mean metric, and every method a paired t-test
    over the repeats cannot tell from it (p >= ``ALPHA``: a tie); oracles are left out, and a cell with fewer
    than ``MIN_TEST_ROWS`` test rows or fewer than ``MIN_REPEATS`` runs names none."""
    metric = comparison.metric
    from vflo.metrics import higher_is_better

    better = higher_is_better(metric)
    out = []
    for (axis, value, scored), group in table.groupby(["axis", "value", "scored"], sort=False):
        candidates = group[~group["simulation_only"].astype(bool)]
        if candidates.empty:
            continue
        position = int(np.argmax(candidates[metric].to_numpy()) if better else np.argmin(candidates[metric].to_numpy()))
        best = candidates.iloc[position]
        row = {"axis": axis, "value": value, "scored": scored, "test_rows": float(best["test_rows"])}
        if float(best["test_rows"]) < MIN_TEST_ROWS or int(best["runs"]) < MIN_REPEATS:
            why = ("too few test rows to tell" if float(best["test_rows"]) < MIN_TEST_ROWS else
                   f"{int(best['runs'])} run(s): no spread to tell by (at least {MIN_REPEATS} needed)")
            out.append({**row, "best": why, metric: float("nan"), "std": float("nan"), "ties": ""})
            continue
        where = {"axis": axis, "value": value, "scored": scored}
        ties = []
        for other in candidates["method"]:
            if other == best["method"]:
                continue
            test = paired(comparison.rows, metric, where, str(best["method"]), str(other))
            if test is not None and test.verdict(better) == "not clearly different from":
                ties.append(str(other))
        out.append({**row, "best": best["method"], metric: float(best[metric]), "std": float(best[f"{metric}_std"]),
                    "ties": ", ".join(ties)})
    return pd.DataFrame(out)


@dataclass(frozen=True)
class Answer:
    """The answer for one cell (the user's own situation: the base cell), computed from its rows: the best
    deployable method, what it costs, the runner-up and what the paired test says between them, the methods it
    cannot be told from, and the best oracle's score for scale; or why no method can be named."""

    cell: dict[str, str]
    why_none: str = ""
    best: str = ""
    mean: float = math.nan
    std: float = math.nan
    runs: int = 0
    test_rows: float = 0.0
    fit_bytes: float = 0.0
    fit_rounds: float = 0.0
    runner_up: Paired | None = None
    ties: tuple[str, ...] = ()
    #: Of the methods tied with the best, the one that sends the least in training, when that is not the best:
    #: (method, its training bytes, its rounds).
    cheaper: tuple[str, float, float] | None = None
    oracle: tuple[str, float] | None = None


def answer(comparison: Comparison, table: pd.DataFrame, scored: str) -> Answer | None:
    """The answer for the base cell scored ``scored``; None where that cell did not run."""
    from vflo.metrics import higher_is_better

    metric, cell = comparison.metric, {**comparison.base_cell, "scored": scored}
    if table.empty or not cell.get("axis"):
        return None
    here = table[(table["axis"] == cell["axis"]) & (table["value"].astype(str) == cell["value"])
                 & (table["scored"] == scored)]
    if here.empty:
        return None
    better = higher_is_better(metric)
    oracles = here[here["simulation_only"].astype(bool)].sort_values(metric, ascending=not better)
    oracle = (str(oracles.iloc[0]["method"]), float(oracles.iloc[0][metric])) if len(oracles) else None
    verdict = which_method(comparison, here)
    if verdict.empty:
        return Answer(cell, why_none="no deployable method ran in this cell", oracle=oracle)
    row = verdict.iloc[0]
    if math.isnan(float(row[metric])):  # which_method names none here: its text says why
        return Answer(cell, why_none=str(row["best"]), oracle=oracle, test_rows=float(row["test_rows"]))
    candidates = here[~here["simulation_only"].astype(bool)]
    name = str(row["best"])
    best = candidates[candidates["method"].astype(str) == name].iloc[0]
    others = candidates[candidates["method"].astype(str) != name].sort_values(metric, ascending=not better,
                                                                               kind="stable")
    runner = paired(comparison.rows, metric, cell, name, str(others.iloc[0]["method"])) if len(others) else None
    ties = tuple(t for t in str(row["ties"]).split(", ") if t)
    tied = candidates[candidates["method"].astype(str).isin(ties)]
    cheaper = None
    if len(tied):
        low = tied.sort_values(["fit_bytes", "fit_rounds"]).iloc[0]
        if (float(low["fit_bytes"]), float(low["fit_rounds"])) < (float(best["fit_bytes"]), float(best["fit_rounds"])):
            cheaper = (str(low["method"]), float(low["fit_bytes"]), float(low["fit_rounds"]))
    return Answer(cell, best=name, mean=float(best[metric]), std=float(best[f"{metric}_std"]), runs=int(best["runs"]),
                  test_rows=float(best["test_rows"]), fit_bytes=float(best["fit_bytes"]),
                  fit_rounds=float(best["fit_rounds"]), runner_up=runner, ties=ties, cheaper=cheaper, oracle=oracle)
