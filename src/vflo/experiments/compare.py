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
* ``scored``: whose people are scored: ``aligned`` (people every party holds: collaborative inference) or
  ``active_only`` (people only the active party holds: new people, where only methods that score from the
  active party's features can answer; the others are marked unable).

Each cell is a regular experiment (``repeated_runs``), so every row is what ``vflo run`` records; the report
adds a "which method when" table computed from the runs.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from vflo import schema
from vflo.data.datasets import Dataset
from vflo.errors import ConfigError
from vflo.experiments.config import parse_config
from vflo.experiments.runner import ExperimentResult, run_experiment
from vflo.methods.registry import get_method, method_names

logger = logging.getLogger(__name__)

Split = Literal["random", "importance", "correlation"]
Scored = Literal["aligned", "active_only"]
#: Methods that need a party layout the comparison does not make, and why.
NEEDS_LAYOUT = {
    "entity_augmentation": "needs a label-only host (the active party holds no columns in its paper's setting)",
    "vfl_asp": "needs a second-hop party that shares no one with the active party",
    "vfl_asp_student": "needs a second-hop party that shares no one with the active party",
}


@dataclass(frozen=True, kw_only=True)
class CompareSettings:
    """The ``[compare]`` table: the axes, the base point, and the methods (empty: every one that can run)."""

    aligned: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0)
    passives: tuple[int, ...] = (1, 2, 4)
    splits: tuple[Split, ...] = ("random", "importance", "correlation")
    scored: tuple[Scored, ...] = ("aligned", "active_only")
    base_aligned: float = 0.5
    active_share: float = 0.3
    repeats: int = 2
    test_fraction: float = 0.2
    rows: int | None = None
    methods: tuple[str, ...] = ()
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.aligned or any(not 0 < a <= 1 for a in self.aligned):
            raise ConfigError(f"compare.aligned: shares of the active party's people in (0, 1], got {self.aligned}")
        if not 0 < self.base_aligned <= 1:
            raise ConfigError(f"compare.base_aligned must be in (0, 1], got {self.base_aligned}")
        if not self.passives or min(self.passives) < 1:
            raise ConfigError(f"compare.passives: counts of passive parties, at least 1, got {self.passives}")
        if not 0 < self.active_share < 1:
            raise ConfigError(f"compare.active_share must be in (0, 1), got {self.active_share}")
        if self.repeats < 1 or not 0 < self.test_fraction < 1:
            raise ConfigError("compare.repeats must be at least 1 and compare.test_fraction in (0, 1)")
        for name in (*self.methods, *self.settings):
            get_method(name)  # an unknown name fails here, with a "did you mean"
        for name, overrides in self.settings.items():
            schema.build(get_method(name).Config, overrides, where=f"compare.settings.{name}")  # bad settings too


@dataclass(frozen=True)
class Cell:
    """One experiment of the comparison: an axis, its value, and whose people are scored."""

    axis: Literal["aligned", "passives", "split"]
    value: Any
    scored: Scored
    passives: int
    split: Split

    @property
    def label(self) -> str:
        return f"{self.axis}={self.value}, scored={self.scored}"


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
    settings: CompareSettings
    results: list[ExperimentResult] = field(default_factory=list)


def load_compare(raw: Mapping[str, Any], *, quick: bool = False) -> tuple[dict[str, Any], CompareSettings]:
    """The base experiment tables (name, seed, dataset) and the compare settings of a compare config; with
    ``quick``, its ``[quick]`` table overrides ``[compare]`` keys (e.g. ``repeats = 1``)."""
    raw = dict(raw)
    known = {"name", "seed", "description", "dataset", "compare", "quick"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"a compare config takes {sorted(known)}, not {unknown}")
    quick_table = raw.pop("quick", None) or {}
    table = dict(raw.pop("compare", None) or {})
    if quick:
        table |= {k.removeprefix("compare."): v for k, v in dict(quick_table).items()}
    return raw, schema.build(CompareSettings, table, where="compare")


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
    out = []
    for scored in settings.scored:
        # Scoring people only the active party holds needs some: all shared leaves none.
        out += [Cell("aligned", a, scored, 1, "random") for a in settings.aligned
                if scored == "aligned" or a < 1.0]
        if scored == "active_only" and settings.base_aligned >= 1.0:
            continue
        out += [Cell("passives", n, scored, n, "random") for n in settings.passives if n != 1]
        out += [Cell("split", s, scored, 1, s) for s in settings.splits if s != "random"]
    return out


def applicable(settings: CompareSettings, task: str, scored: Scored) -> tuple[list[str], dict[str, str]]:
    """The methods that run in a cell, and every other one with the reason."""
    names = list(settings.methods) or method_names()
    run, skipped = [], {}
    for name in names:
        cls = get_method(name)
        if name in NEEDS_LAYOUT:
            skipped[name] = NEEDS_LAYOUT[name]
        elif task not in cls.tasks:
            skipped[name] = f"does not support {task} tasks"
        elif scored == "active_only" and cls.inference != "active_only":
            skipped[name] = "scores together with its partners, who have never seen these people"
        else:
            run.append(name)
    return run, skipped


def experiment_tables(base: Mapping[str, Any], settings: CompareSettings, cell: Cell, columns: list[list[str]],
                      methods: Sequence[str]) -> dict[str, Any]:
    """The experiment a cell runs, as the tables of a config file."""
    parties = [{"name": "active", "role": "active", "columns": columns[0]}]
    parties += [{"name": f"passive{i + 1}", "role": "passive", "columns": cols} for i, cols in enumerate(columns[1:])]
    aligned = cell.value if cell.axis == "aligned" else settings.base_aligned
    samples: dict[str, Any] = {"aligned": float(aligned)}
    if settings.rows is not None:
        samples["total"] = settings.rows
    raw = copy.deepcopy(dict(base))
    raw["name"] = f"{base.get('name', 'compare')}: {cell.label}"
    raw["scenario"] = {"parties": parties, "samples": samples}
    raw["protocol"] = {"name": "repeated_runs", "runs": settings.repeats, "test_fraction": settings.test_fraction,
                       "test_from": cell.scored}
    raw["methods"] = [{"name": m, **settings.settings.get(m, {})} for m in methods]
    return raw


def compare(raw: Mapping[str, Any], *, data_dir: str | None = None, quick: bool = False,
            on_cell: Callable[[Cell, int, int], None] | None = None) -> Comparison:
    """Run every cell of a compare config (the tables of its TOML file)."""
    base, settings = load_compare(raw, quick=quick)
    seed = int(base.get("seed", 0))
    probe = parse_config({**base, "scenario": {"parties": [{"name": "a", "role": "active", "share": 1.0}]},
                          "methods": [{"name": "local"}]})
    dataset = probe.load_dataset(data_dir)
    if dataset is None:  # pragma: no cover - a compare config always names a dataset
        raise ConfigError("a compare config needs a [dataset]")
    task = probe.task
    started = time.perf_counter()
    frames: list[pd.DataFrame] = []
    skipped_all: dict[str, str] = {}
    results: list[ExperimentResult] = []
    plan = cells(settings)
    for k, cell in enumerate(plan):
        if on_cell is not None:
            on_cell(cell, k, len(plan))
        methods, skipped = applicable(settings, task, cell.scored)
        for name, why in skipped.items():
            skipped_all.setdefault(f"{name} ({cell.scored})", why)
        if not methods:
            continue
        try:
            columns = column_split(dataset, cell.split, cell.passives, settings.active_share, seed)
            config = parse_config(experiment_tables(base, settings, cell, columns, methods))
            result = run_experiment(config, data_dir=data_dir)
        except Exception as exc:  # a scenario a cell cannot make (e.g. too few shared people): recorded, go on
            logger.warning("compare: %s could not run: %s", cell.label, exc)
            frames.append(pd.DataFrame([{"method": m, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
                                        for m in methods]).assign(axis=cell.axis, value=str(cell.value),
                                                                  scored=cell.scored))
            continue
        results.append(result)
        frame = pd.DataFrame(result.rows).assign(axis=cell.axis, value=str(cell.value), scored=cell.scored,
                                                 passives=cell.passives, split=cell.split)
        frames.append(frame)
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    metric = results[0].config.metric if results else "accuracy"
    return Comparison(name=str(base.get("name", "compare")), dataset=dataset, task=task, metric=metric, rows=rows,
                      skipped=skipped_all, seconds=time.perf_counter() - started, settings=settings,
                      results=results)


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


def which_method(comparison: Comparison, table: pd.DataFrame) -> pd.DataFrame:
    """Per (axis, value, scored): the best deployable method by mean metric, and every method whose mean is
    within the best one's standard deviation (a tie); oracles are left out, and a cell with fewer than
    ``MIN_TEST_ROWS`` test rows or fewer than ``MIN_REPEATS`` runs names none."""
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
        margin = float(best[f"{metric}_std"])
        close = candidates[(candidates[metric] >= best[metric] - margin) if better
                           else (candidates[metric] <= best[metric] + margin)]
        ties = [m for m in close["method"] if m != best["method"]]
        if float(best["test_rows"]) < MIN_TEST_ROWS or int(best["runs"]) < MIN_REPEATS:
            why = ("too few test rows to tell" if float(best["test_rows"]) < MIN_TEST_ROWS else
                   f"{int(best['runs'])} run(s): no spread to tell by (at least {MIN_REPEATS} needed)")
            out.append({"axis": axis, "value": value, "scored": scored, "best": why,
                        metric: float("nan"), "std": float("nan"), "ties": "", "test_rows": float(best["test_rows"])})
            continue
        out.append({"axis": axis, "value": value, "scored": scored, "best": best["method"],
                    metric: float(best[metric]), "std": margin, "ties": ", ".join(ties),
                    "test_rows": float(best["test_rows"])})
    return pd.DataFrame(out)
