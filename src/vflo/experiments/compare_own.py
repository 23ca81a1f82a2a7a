"""``vflo compare`` on the parties' own files: what can vary around the real overlap of the files.

The files say who holds whom, so the comparison varies what the parties could change, one thing at a time:

* ``aligned``: fewer shared people: a share of the training people the active party shares with its partners
  stays shared (1.0: the real overlap, the base cell; the others leave every partner, as if it had never
  held them);
* ``without``: a partner left out (with two partners or more): what the others give without it;
* ``dropped``: columns a partner does not bring: that share of each partner's columns, the same columns in every
  repeat (nested: a larger share leaves out the smaller share's columns and more), named in the report.

Every cell scores people every party holds (``aligned``) and people only the active party holds
(``active_only``, where the files have such people), held out of every party's training. Each repeat draws its
own test people (stratified by label), the same in every cell of that repeat: on the real overlap nothing else
varies between repeats but the methods' seeds, and a best method is named only with a spread. Axes that need
every party's columns in one table (re-splitting the columns, more partners than files, a second hop, partners
missing at random) are left out, each with its reason.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vflo import schema
from vflo.data.layout import Layout
from vflo.data.partydata import PartyData
from vflo.data.scenario import ScenarioSpec
from vflo.errors import ConfigError, ScenarioError
from vflo.experiments.compare import (
    MIN_REPEATS,
    Cell,
    CompareCommon,
    Comparison,
    cannot_run,
    check_quick_repeats,
    run_cell,
    unavailable_methods,
    with_fallback,
)
from vflo.experiments.config import TOP_LEVEL, ExperimentConfig, Variant, parse_config
from vflo.experiments.own_files import OwnFiles
from vflo.experiments.runner import ExperimentResult
from vflo.methods.registry import active_only, method_names
from vflo.seeding import numpy_rng

logger = logging.getLogger(__name__)

#: The keys of ``[compare]`` that vary a simulated split of one dataset, and why they cannot vary own files.
POOLED_ONLY = {
    "passives": "more partners than there are files: making partners needs every party's columns in one table",
    "splits": "re-splitting the columns (at random, by importance, by correlation) needs every party's columns in "
              "one table; each party keeps its own",
    "second_hop": "a second-hop partner: who shares people with whom is what the files' IDs say",
    "p_miss": "partners missing at random: who lacks whom is what the files' IDs say",
    "absent": "partners missing at random at scoring: people only the active party holds are scored instead",
}
_DATASET_KEYS = ("base_aligned", "active_share", "base_p_miss", "base_absent", "missing_passives",
                 "missing_variants", *POOLED_ONLY)
#: ``--quick`` on own files, unless ``[quick]`` says otherwise (``"compare.KEY" = ...``).
QUICK = {"repeats": MIN_REPEATS, "aligned": [0.25, 1.0], "rows": 2000}


@dataclass(frozen=True, kw_only=True)
class OwnCompareSettings(CompareCommon):
    """The ``[compare]`` table of a config whose parties read their own files (every key optional).

    ``aligned``: shares of the real overlap's training people kept shared (1.0, the real overlap, always runs);
    ``dropped``: shares of each partner's columns it leaves out; ``without``: each partner left out in turn;
    ``scored``: whose people are scored; ``repeats``: test draws (at least 3 to name a best method); each test
    set holds ``test_rows`` people of its kind, at most ``test_fraction`` of the active party's people and half
    of the people of that kind; ``rows``: a random sample of at most that many of the active party's people
    (partners keep theirs among them, and as large a share of their other people); ``methods``: which run
    (default: the config's ``[[methods]]``, else every method that can); ``settings``: a method's settings,
    over the config's."""

    aligned: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0)
    repeats: int = 5
    dropped: tuple[float, ...] = (0.5,)
    without: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(not 0 < a <= 1 for a in self.aligned):
            raise ConfigError(f"compare.aligned: shares of the real overlap kept shared, in (0, 1]; got "
                              f"{self.aligned}")
        if any(not 0 < d < 1 for d in self.dropped):
            raise ConfigError(f"compare.dropped: shares of each partner's columns it leaves out, in (0, 1); got "
                              f"{self.dropped}")
        if not self.scored or any(v not in ("aligned", "active_only") for v in self.scored):
            raise ConfigError(f"compare.scored: 'aligned' and/or 'active_only', got {self.scored}")
        if self.rows is not None and self.rows < 10:
            raise ConfigError(f"compare.rows: a sample of at least 10 of the active party's people, got {self.rows}")


def load_own(raw: Mapping[str, Any], *, quick: bool = False) -> OwnCompareSettings:
    """The compare settings of a ``vflo run`` config whose parties read their own files: its optional
    ``[compare]`` table and, with ``quick``, :data:`QUICK` and the ``"compare.KEY"`` entries of ``[quick]`` (its
    other entries are ``vflo run``'s)."""
    unknown = sorted(set(raw) - {*TOP_LEVEL, "compare"})
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown}: a config whose parties read their own files takes "
                          f"{sorted({*TOP_LEVEL, 'compare'})}")
    table = dict(raw.get("compare") or {})
    if quick:
        quick_table = raw.get("quick") or {}
        table |= QUICK | {k.removeprefix("compare."): v for k, v in dict(quick_table).items()
                          if k.startswith("compare.")}
        check_quick_repeats(table["repeats"])
    pooled = [k for k in table if k in _DATASET_KEYS]
    if pooled:
        why = POOLED_ONLY.get(pooled[0], "it describes a simulated split of one dataset")
        raise ConfigError(f"compare.{pooled[0]} does not apply to the parties' own files ({why}); leave it out: "
                          "own files vary aligned (shares of the real overlap), dropped and without")
    return schema.build(OwnCompareSettings, table, where="compare")


def method_tables(raw: Mapping[str, Any], settings: OwnCompareSettings) -> dict[str, dict[str, Any]]:
    """label -> table (``name``, settings, ``label``/``fallback`` where given) of the methods compared:
    ``compare.methods``, else the config's ``[[methods]]``, else every registered method."""
    def own(label: str, table: Mapping[str, Any]) -> dict[str, Any]:
        return {**table, **settings.settings.get(label, {})}

    if settings.methods:
        return {n: own(n, {"name": n}) for n in settings.methods}
    listed = raw.get("methods") or []
    if not isinstance(listed, list):
        raise ConfigError("[[methods]] must be a list of tables, each with name = '...'")
    out: dict[str, dict[str, Any]] = {}
    for item in listed:
        table = {"name": item} if isinstance(item, str) else dict(item)
        if "name" not in table:
            raise ConfigError("every [[methods]] entry needs name = '...' (vflo methods lists them)")
        label = str(table.get("label", table["name"]))
        out[label] = own(label, table)
    return out or {n: own(n, {"name": n}) for n in method_names()}


def own_files(spec: ScenarioSpec, tables: Sequence[tuple[PartyData, Any]], settings: OwnCompareSettings,
              seed: int) -> OwnFiles:
    """What the comparison varies, from the parties' tables as their files hold them."""
    parties = [data for data, _ in tables]
    encodings = {data.party: enc for data, enc in tables}
    active = next(p for p in parties if p.has_labels)
    partners = tuple(p.party for p in parties if p is not active)
    sample = _sample(parties, active, settings.rows, seed)
    kept = [p.subset(sample[p.party]) for p in parties] if sample is not None else parties
    active_kept = next(p for p in kept if p.party == active.party)
    held = [p.contains(active_kept.ids) for p in kept if p.party != active.party]
    every = np.logical_and.reduce(held) if held else np.zeros(active_kept.n_samples, dtype=bool)
    alone = ~np.logical_or.reduce(held) if held else np.ones(active_kept.n_samples, dtype=bool)
    assert active_kept.y is not None
    pools = {"aligned": (active_kept.ids[every], active_kept.y[every]),
             "active_only": (active_kept.ids[alone], active_kept.y[alone])}
    limit = int(settings.test_fraction * active_kept.n_samples)
    tests = {kind: min(settings.test_rows, limit, len(ids) // 2) for kind, (ids, _) in pools.items()}
    if tests["aligned"] < 1:
        raise ScenarioError(f"the files share {len(pools['aligned'][0])} people among all {len(parties)} parties "
                            f"({', '.join(p.party for p in parties)}): too few to hold some out for testing and "
                            "train on the rest; check the ID columns, or compare on files that share more people")
    columns = {p.name: tuple(encodings[p.name].columns) for p in spec.parties}
    order = {q: [columns[q][i] for i in numpy_rng(seed, "compare dropped columns", q).permutation(len(columns[q]))]
             for q in partners}
    dropped = {share: {q: tuple(order[q][:min(len(order[q]) - 1, round(share * len(order[q])))]) for q in partners}
               for share in settings.dropped}
    return OwnFiles(active=active.party, partners=partners, files={p.name: str(p.file) for p in spec.parties},
                    people={p.party: p.n_samples for p in kept}, columns=columns, sample=sample,
                    active_rows=active.n_samples, pools=pools, tests=tests, dropped=dropped)


def _sample(parties: Sequence[PartyData], active: PartyData, rows: int | None,
            seed: int) -> dict[str, np.ndarray] | None:
    """party -> the IDs it keeps when the active party keeps a random ``rows`` of its people: a partner keeps
    those it holds, and as large a share of its other people."""
    if rows is None or rows >= active.n_samples:
        return None
    rng = numpy_rng(seed, "compare sample")
    chosen = np.sort(active.ids[rng.permutation(active.n_samples)[:rows]])
    out = {active.party: chosen}
    for p in parties:
        if p is active:
            continue
        mine = p.contains(chosen)
        others = p.ids[~active.contains(p.ids)]
        extra = others[rng.permutation(len(others))[: round(len(others) * rows / active.n_samples)]]
        out[p.party] = np.concatenate([chosen[mine], np.sort(extra)])
    return out


def keep_shared(parties: Sequence[PartyData], active: str, share: float, tests: Mapping[str, np.ndarray],
                seed: int) -> list[PartyData]:
    """The parties with only ``share`` of the active party's shared training people left at the partners (the
    test people stay where they are)."""
    if share >= 1.0:
        return list(parties)
    mine = next(p for p in parties if p.party == active)
    held_out = np.concatenate(list(tests.values()))
    candidates = mine.ids[~np.isin(mine.ids, held_out)]
    shared = candidates[np.logical_or.reduce([p.contains(candidates) for p in parties if p.party != active])]
    rng = numpy_rng(seed, "compare shared people")
    gone = shared[rng.permutation(len(shared))[round(share * len(shared)):]]
    return [p if p.party == active else p.subset(p.ids[~np.isin(p.ids, gone)]) for p in parties]


def with_test_people(layout: Layout, tests: Mapping[str, np.ndarray]) -> Layout:
    """``layout`` with the test people held out as test blocks: scored exactly, never trained on."""
    position = {v: i for i, v in enumerate(layout.dataset.ids.tolist())}
    everyone = tuple(p.name for p in layout.parties)
    blocks = []
    for kind, members in (("aligned", everyone), ("active_only", (layout.active,))):
        ids = tests.get(kind)
        if ids is not None and len(ids):
            blocks.append((members, np.fromiter((position[v] for v in ids.tolist()), dtype=np.int64,
                                                count=len(ids))))
    return replace(layout, test_blocks=tuple(blocks))


@dataclass(frozen=True, kw_only=True)
class OwnCellConfig(ExperimentConfig):
    """A cell's experiment on the parties' own files: the files' layout with ``share`` of the shared training
    people kept, the ``rows`` sample, and the repeat's test people held out."""

    files: OwnFiles
    share: float = 1.0
    #: The comparison's name: the data's in every cell's rows.
    data_name: str = "own data"

    def layout(self, variant: Variant, seed: int, dataset: Any) -> Layout:
        tables = variant.spec.load_tables(self.base_dir, self.table_cache)
        parties = self.files.keep([data for data, _ in tables])
        tests = self.files.test_people(seed)
        parties = keep_shared(parties, self.files.active, self.share, tests, seed)
        layout = Layout.from_parties(parties, seed=seed, standardize=variant.spec.standardize, name=self.data_name,
                                     source=", ".join(f"{p}: {f}" for p, f in self.files.files.items()))
        return with_test_people(layout, tests)


def cells(settings: OwnCompareSettings, files: OwnFiles) -> tuple[list[Cell], dict[str, str]]:
    """The cells, and the axes left out with why."""
    left_out = dict(POOLED_ONLY)
    scored = [s for s in settings.scored if files.tests[s] > 0]
    if "active_only" in settings.scored and "active_only" not in scored:
        left_out["people only the active party holds"] = (
            f"the files have {len(files.pools['active_only'][0])} such people: too few to score")
    n = len(files.partners)
    out = []
    for kind in scored:
        out += [Cell("aligned", a, kind, n, "own") for a in sorted({*settings.aligned, 1.0})]
        if settings.without and n > 1:
            out += [Cell("without", q, kind, n - 1, "own") for q in files.partners]
        out += [Cell("dropped", d, kind, n, "own") for d in settings.dropped
                if any(files.dropped[d].values())]
    if settings.without and n == 1:
        left_out["without"] = (f"a partner left out: with one partner ({files.partners[0]}) that leaves the active "
                               "party alone; the people only it holds are scored where its partner is absent")
    if settings.dropped and not any(any(files.dropped[d].values()) for d in settings.dropped):
        left_out["dropped"] = "columns a partner leaves out: every partner has a single column"
    return out, left_out


def _cell_tables(raw: Mapping[str, Any], cell: Cell, files: OwnFiles) -> dict[str, Any]:
    """The scenario table for a cell: the config's, a partner left out or some of the partners' columns."""
    scenario = copy.deepcopy(dict(raw["scenario"]))
    parties = scenario["parties"]
    if cell.axis == "without":
        scenario["parties"] = [p for p in parties if p["name"] != cell.value]
    elif cell.axis == "dropped":
        for p in parties:
            gone = files.dropped[float(cell.value)].get(p["name"], ())
            if not gone:
                continue
            if p.get("feature_columns") is not None:
                p["feature_columns"] = [c for c in p["feature_columns"] if c not in gone]
            else:
                p["drop_columns"] = [*p.get("drop_columns", []), *gone]
            p["categorical"] = [c for c in p.get("categorical", []) if c not in gone]
    return scenario


def cell_config(raw: Mapping[str, Any], cell: Cell, files: OwnFiles, methods: Mapping[str, Mapping[str, Any]],
                settings: OwnCompareSettings, base_dir: str | Path | None) -> OwnCellConfig:
    """A cell's experiment: the config's parties (a partner left out, or some of its columns), ``repeated_runs``
    scoring the cell's kind of test people, the cell's methods."""
    metric = (raw.get("report") or {}).get("metric")
    tables = {"name": f"{raw.get('name', 'compare')}: {cell.label}", "seed": int(raw.get("seed", 0)),
              "scenario": _cell_tables(raw, cell, files),
              "protocol": {"name": "repeated_runs", "runs": settings.repeats, "test_from": cell.scored},
              "methods": [dict(t) for t in methods.values()], **({"report": {"metric": metric}} if metric else {})}
    config = parse_config(tables, base_dir=base_dir)
    return OwnCellConfig(**{f.name: getattr(config, f.name) for f in fields(ExperimentConfig)}, files=files,
                         share=float(cell.value) if cell.axis == "aligned" else 1.0,
                         data_name=str(raw.get("name", "own data")))


def compare_own(raw: Mapping[str, Any], *, base_dir: str | Path | None = None, quick: bool = False,
                on_cell: Callable[[Cell, int, int], None] | None = None) -> Comparison:
    """Every cell of a comparison on the parties' own files (a ``vflo run`` config's tables, paths relative
    to ``base_dir``)."""
    settings = load_own(raw, quick=quick)
    name, seed = str(raw.get("name", "compare")), int(raw.get("seed", 0))
    scenario = dict(raw.get("scenario") or {})
    ignored = [k for k in ("sweep", "zip", "samples") if scenario.pop(k, None)]
    if ignored:
        logger.info("compare: [scenario] %s are vflo run's; the comparison varies its own axes around the files' "
                    "real overlap", ", ".join(ignored))
    real = parse_config({"name": name, "seed": seed, "scenario": scenario, "methods": [{"name": active_only()[0]}]},
                        base_dir=base_dir)
    spec = real.variants[0].spec
    tables = spec.load_tables(real.base_dir, real.table_cache)
    files = own_files(spec, tables, settings, seed)
    full = Layout.from_parties(files.keep([data for data, _ in tables]), seed=seed, name=name,
                               source=", ".join(f"{p}: {f}" for p, f in files.files.items()))
    entries = method_tables(raw, settings)
    unavailable = unavailable_methods(entries)
    plan, left_out = cells(settings, files)
    started = time.perf_counter()
    frames: list[pd.DataFrame] = []
    skipped_all: dict[str, str] = {}
    results: list[ExperimentResult] = []
    cell_raw = {**raw, "scenario": scenario}
    for k, cell in enumerate(plan):
        if on_cell is not None:
            on_cell(cell, k, len(plan))
        run: dict[str, dict[str, Any]] = {}
        skipped: dict[str, str] = {}
        for label, table in entries.items():
            if label in unavailable:
                continue
            own = cannot_run(str(table["name"]), real.task, cell)
            if isinstance(own, str):
                skipped[label] = own
            else:
                run[label] = {**table, **own}
        run, skipped = with_fallback(run, skipped)
        for label, why in skipped.items():
            skipped_all.setdefault(f"{label} ({cell.scored})", why)
        if not run:
            continue

        def build(cell: Cell = cell, run: dict[str, dict[str, Any]] = run) -> OwnCellConfig:
            return cell_config(cell_raw, cell, files, run, settings, base_dir)

        frame, result = run_cell(cell, run, build)
        frames.append(frame)
        if result is not None:
            results.append(result)
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    metric = results[0].config.metric if results else real.metric
    return Comparison(name=name, dataset=full.dataset, task=real.task, metric=metric, rows=rows,
                      skipped=skipped_all, seconds=time.perf_counter() - started, settings=settings,
                      results=results, test_people=files.tests["aligned"], base={"axis": "aligned", "value": "1.0"},
                      unavailable=unavailable, left_out=left_out, own=files)
