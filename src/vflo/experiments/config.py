"""Experiment configs: one TOML file -> dataset, scenario variants, protocol, methods, report settings.

Everything is validated when the file is read, before anything runs: unknown keys,
unknown datasets, methods and protocols, and every sweep variant's scenario.

Paths such as ``samples.aligned`` or ``parties.hospital.columns`` address a value inside
a table; in a list of tables, a segment selects the entry by its ``name`` (``label`` for
methods) or by its index. They are used by ``[scenario.sweep]`` (each path maps to a
list of values; the variants are their cartesian product) and by ``[quick]``
(overrides applied with ``--quick``; paths start at the top of the file).
"""

from __future__ import annotations

import copy
import itertools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vflo import schema
from vflo.align.engines import DEPLOYED_ALIGNMENT, AlignmentConfig
from vflo.comm.codec import DEFAULT_MAX_BYTES
from vflo.data.datasets import Dataset, Task, get_spec, load_dataset
from vflo.data.layout import Layout
from vflo.data.scenario import ScenarioSpec
from vflo.dp import PrivacyBudget
from vflo.errors import ConfigError, did_you_mean
from vflo.experiments.protocols import Protocol, parse_protocol
from vflo.explorer.select import SelectSettings
from vflo.methods.base import Method
from vflo.methods.registry import active_only, get_method
from vflo.metrics import check_metric, default_metric
from vflo.privacy.columns import AttackSettings

TOP_LEVEL = ("name", "description", "seed", "dataset", "scenario", "protocol", "methods", "alignment", "transport",
             "report", "quick", "privacy", "attacks", "select")
def default_quick(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``--quick`` without a ``[quick]`` table: one repetition of whatever the protocol repeats (its ``repeats``,
    or ``runs`` for repeated_runs)."""
    from dataclasses import fields

    from vflo.experiments.protocols import PROTOCOLS

    table = raw.get("protocol")
    name = table.get("name", "aligned_holdout") if isinstance(table, Mapping) else "aligned_holdout"
    protocol = PROTOCOLS.get(str(name))
    names = {f.name for f in fields(protocol)} if protocol is not None else set()
    key = "runs" if "runs" in names else "repeats" if "repeats" in names else None
    named = {} if isinstance(table, Mapping) and "name" in table else {"protocol.name": name}
    return {**named, f"protocol.{key}": 1} if key else {}


@dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    name: str
    data_dir: str | None = None


@dataclass(frozen=True, kw_only=True)
class TransportConfig:
    max_message_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if self.max_message_bytes < 1024:
            raise ConfigError("transport.max_message_bytes must be at least 1024")


@dataclass(frozen=True, kw_only=True)
class ReportConfig:
    """``metric``: the headline metric (default: accuracy or rmse). ``x``: the sweep path on the plots' x axis."""

    metric: str | None = None
    x: str | None = None


@dataclass(frozen=True)
class MethodEntry:
    """A method with its settings, and the label that names it in results."""

    label: str
    method_cls: type[Method]
    config: Any
    #: The label of an active-only method listed before this one: it scores the test people this method's
    #: partners do not hold (``fallback = "local"``: "SplitNN + active-only fallback").
    fallback: str | None = None

    def instantiate(self) -> Method:
        return self.method_cls(self.config)


@dataclass(frozen=True)
class Variant:
    """One point of the scenario sweep."""

    label: str
    values: Mapping[str, Any]
    spec: ScenarioSpec


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """A parsed, validated experiment. ``dataset`` is None when every party reads its own file; then
    ``base_dir`` is where relative file paths start (the config file's folder)."""

    name: str
    description: str
    seed: int
    dataset: DatasetConfig | None
    task: Task
    variants: tuple[Variant, ...]
    sweep_paths: tuple[str, ...]
    protocol: Protocol
    methods: tuple[MethodEntry, ...]
    transport: TransportConfig
    report: ReportConfig
    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)
    #: ``[privacy]``: the budget every passive party protects what it sends with, as a deployed party's own
    #: ``[privacy]`` does (None: no budget, nothing leaves the process).
    privacy: PrivacyBudget | None = None
    #: ``[attacks]``: every run is attacked from the messages that crossed in it, and its row gets the attack
    #: columns (:mod:`vflo.privacy.columns`); None: no attack.
    attacks: AttackSettings | None = None
    #: ``[select]``: before each run trains, every partner drops its weak columns by these thresholds, found by
    #: exploring the run's training people privately (:mod:`vflo.explorer.select`); None: every column kept.
    select: SelectSettings | None = None
    raw: Mapping[str, Any] = field(repr=False)
    quick: bool = False
    base_dir: Path | None = None
    #: The parties' tables read so far, by what was read (files are read once per experiment, not once per run).
    table_cache: dict[tuple[object, ...], Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def metric(self) -> str:
        return self.report.metric or default_metric(self.task)

    @property
    def from_files(self) -> bool:
        return self.dataset is None

    def load_dataset(self, data_dir: str | Path | None = None) -> Dataset | None:
        """The dataset the scenarios split (None when the parties bring their own files)."""
        if self.dataset is None:
            return None
        return load_dataset(self.dataset.name, data_dir if data_dir is not None else self.dataset.data_dir)

    def layout(self, variant: Variant, seed: int, dataset: Dataset | None) -> Layout:
        """Who holds which rows and columns in ``variant``: a split of ``dataset``, or the parties' own files."""
        if self.dataset is None:
            tables = own_tables(variant.spec, self.base_dir, self.table_cache)
            return variant.spec.build_from_tables(tables, seed, name=self.name)
        if dataset is None:
            raise ConfigError(f"experiment {self.name!r} splits dataset {self.dataset.name!r}; load it first")
        return variant.spec.build(dataset, seed=seed)


def own_tables(spec: ScenarioSpec, base: Path | None, cache: dict[tuple[object, ...], Any]) -> list[Any]:
    """:meth:`ScenarioSpec.load_tables`, a refusal of missing values saying where an experiment config fills them
    (each party's entry under [[scenario.parties]], not a deployed party's [data] table)."""
    from vflo.data.files import MissingValuesError

    try:
        return spec.load_tables(base, cache)
    except MissingValuesError as exc:
        raise exc.placed("experiment") from None


# -- paths ----------------------------------------------------------------------------------------


def _select(container: Any, segment: str, path: str, create: bool) -> tuple[Any, Any]:
    """The child of ``container`` named by ``segment``: (parent, key) for setting it."""
    if isinstance(container, list):
        # An entry is named by its label (its name when it has none); by its name alone only where that is
        # unambiguous: `methods.splitnn` beside a labelled SplitNN `plug` is the unlabelled one.
        labels = [str(it.get("label", it.get("name"))) if isinstance(it, dict) else None for it in container]
        if segment in labels:
            return container, labels.index(segment)
        by_name = [i for i, it in enumerate(container) if isinstance(it, dict) and it.get("name") == segment]
        if len(by_name) == 1:
            return container, by_name[0]
        if by_name:
            raise ConfigError(f"path {path!r}: {len(by_name)} entries are {segment!r}: name one by its label, "
                              f"one of {[labels[i] for i in by_name]}")
        if segment.isdigit() and int(segment) < len(container):
            return container, int(segment)
        names = [n for n in labels if n is not None]
        raise ConfigError(f"path {path!r}: no entry {segment!r}{did_you_mean(segment, names)}; entries: {names}")
    if isinstance(container, dict):
        if segment not in container and not create:
            raise ConfigError(f"path {path!r}: no key {segment!r}{did_you_mean(segment, container)}")
        return container, segment
    raise ConfigError(f"path {path!r}: {segment!r} is inside a value, not a table")


def _segments(node: Any, remaining: list[str]) -> tuple[str, list[str]]:
    """The next key: the longest run of segments that names an existing key (sweep keys contain dots)."""
    if isinstance(node, dict):
        for k in range(len(remaining), 1, -1):
            joined = ".".join(remaining[:k])
            if joined in node:
                return joined, remaining[k:]
    return remaining[0], remaining[1:]


def set_path(root: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` inside nested tables, creating missing keys (the schema then checks them)."""
    node: Any = root
    remaining = path.split(".")
    while True:
        seg, remaining = _segments(node, remaining)
        parent, key = _select(node, seg, path, create=True)
        if not remaining:
            parent[key] = copy.deepcopy(value)
            return
        if isinstance(parent, dict) and key not in parent:
            parent[key] = {}
        node = parent[key]


# -- parsing -----------------------------------------------------------------------------------------


def load_config(path: str | Path, *, quick: bool = False) -> ExperimentConfig:
    """Read and validate an experiment TOML file.

    ``[scenario.sweep]`` axes combine as a cartesian product; ``[scenario.zip]`` axes (lists of
    equal length) vary together, e.g. how many one-feature clients and how many others.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return parse_config(raw, quick=quick, default_name=path.stem, base_dir=path.parent)


def parse_config(
    raw_in: Mapping[str, Any], *, quick: bool = False, default_name: str = "experiment",
    base_dir: str | Path | None = None,
) -> ExperimentConfig:
    """Validate an experiment given as a mapping (a TOML file's tables, or a dict in Python).

    Party files named in the scenario are read now, relative to ``base_dir`` (default: the current folder),
    so a missing file or column fails here, before anything trains."""
    raw = copy.deepcopy(dict(raw_in))
    for key in raw:
        if key not in TOP_LEVEL:
            raise ConfigError(f"unknown key {key!r}{did_you_mean(key, TOP_LEVEL)}; valid keys: {', '.join(TOP_LEVEL)}")
    quick_table = raw.pop("quick", None)
    if quick_table is not None and not isinstance(quick_table, dict):
        raise ConfigError("[quick] must be a table of path = value overrides")
    if quick:
        for qpath, value in (quick_table if quick_table is not None else default_quick(raw)).items():
            set_path(raw, qpath, value)

    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ConfigError("name must be a non-empty string")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ConfigError("description must be a string")

    variants, sweep_paths = _variants(raw.get("scenario"))
    base = Path(base_dir) if base_dir is not None else Path()
    tables: dict[tuple[object, ...], Any] = {}
    dataset: DatasetConfig | None = None
    if variants[0].spec.from_files:
        if raw.get("dataset") is not None:
            raise ConfigError("the scenario's parties read their own files, so there is no dataset to split: remove "
                              "[dataset]")
        encodings = [enc for _, enc in own_tables(variants[0].spec, base, tables)]
        task: Task = next(enc.task for enc in encodings if enc.task is not None)
    else:
        dataset = schema.build(DatasetConfig, raw.get("dataset"), where="dataset")
        task = get_spec(dataset.name).task
    protocol = parse_protocol(raw.get("protocol"))
    methods = _methods(raw.get("methods"))
    transport = schema.build(TransportConfig, raw.get("transport"), where="transport")
    alignment = schema.build(AlignmentConfig, raw.get("alignment"), where="alignment")
    privacy = None if raw.get("privacy") is None else schema.build(PrivacyBudget, raw["privacy"], where="privacy")
    attacks = None if raw.get("attacks") is None else schema.build(AttackSettings, raw["attacks"], where="attacks")
    select = None if raw.get("select") is None else schema.build(SelectSettings, raw["select"], where="select")
    report = schema.build(ReportConfig, raw.get("report"), where="report")
    if report.metric is not None:
        check_metric(report.metric, task)
    if report.x is not None and report.x not in sweep_paths:
        raise ConfigError(f"report.x = {report.x!r} is not a sweep path; sweep paths: {list(sweep_paths)}")
    if getattr(protocol, "transductive", False):
        from vflo.methods.representation import RepresentationMethod

        lacking = [e.label for e in methods if not issubclass(e.method_cls, RepresentationMethod)]
        if lacking:
            raise ConfigError(
                f"the transductive protocol cross-validates a classifier on a learned representation, and {lacking} "
                "have none; run them with transductive = false, or in a config of their own")
    source = f"dataset {dataset.name!r}" if dataset is not None else "the parties' files"
    for entry in methods:
        if task not in entry.method_cls.tasks:
            raise ConfigError(f"method {entry.label!r} does not support {task} tasks ({source})")
    return ExperimentConfig(
        name=name, description=description, seed=seed, dataset=dataset, task=task, variants=variants,
        sweep_paths=sweep_paths, protocol=protocol, methods=methods, transport=transport, report=report,
        alignment=alignment, privacy=privacy, attacks=attacks, select=select, raw=raw, quick=quick, base_dir=base,
        table_cache=tables,
    )


@dataclass(frozen=True, kw_only=True)
class DeploymentExperiment:
    """The parts of an experiment config a deployment uses: the data is the parties' own, not a scenario's."""

    name: str
    seed: int
    methods: tuple[MethodEntry, ...]
    alignment: AlignmentConfig
    transport: TransportConfig
    metric: str | None
    # The config as written (results.json keeps it, as a simulated run's does).
    raw: dict[str, Any] = field(default_factory=dict)


def deployed_alignment(table: Any) -> AlignmentConfig:
    """``[alignment]`` of a deployed run: what the config gives over
    :data:`~vflo.federation.coordinator.DEPLOYED_ALIGNMENT`."""
    if table is None:
        table = {}
    if isinstance(table, dict):
        table = {"method": DEPLOYED_ALIGNMENT.method, "engine": DEPLOYED_ALIGNMENT.engine, **table}
    alignment: AlignmentConfig = schema.build(AlignmentConfig, table, where="alignment")
    return alignment


def load_deployment_experiment(path: str | Path) -> DeploymentExperiment:
    """Read an experiment config for ``vflo run --deploy``: methods, alignment, transport, seed and name.

    ``[dataset]``, ``[scenario]`` and ``[protocol]`` describe simulations and are ignored: in a deployment
    every party brings its own data and the active party its own test rows.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    for key in raw:
        if key not in TOP_LEVEL:
            raise ConfigError(f"unknown key {key!r}{did_you_mean(key, TOP_LEVEL)}; valid keys: {', '.join(TOP_LEVEL)}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    report = schema.build(ReportConfig, raw.get("report"), where="report")
    return DeploymentExperiment(
        name=str(raw.get("name", path.stem)), seed=seed, methods=_methods(raw.get("methods")),
        alignment=deployed_alignment(raw.get("alignment")),
        transport=schema.build(TransportConfig, raw.get("transport"), where="transport"), metric=report.metric,
        raw=raw,
    )


def _variants(table: Any) -> tuple[tuple[Variant, ...], tuple[str, ...]]:
    if not isinstance(table, dict):
        raise ConfigError("[scenario] is required: it names the parties and how rows are shared")
    base = dict(table)
    sweep = base.pop("sweep", {}) or {}
    zipped = base.pop("zip", {}) or {}
    if not isinstance(sweep, dict) or not isinstance(zipped, dict):
        raise ConfigError("[scenario.sweep] and [scenario.zip] must map paths to lists of values")
    for p, values in (sweep | zipped).items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"scenario sweep {p!r} must be a non-empty list of values")
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        raise ConfigError(f"[scenario.zip] lists must have the same length, got {sorted(lengths)}")
    overlap = set(sweep) & set(zipped)
    if overlap:
        raise ConfigError(f"{sorted(overlap)} appear in both [scenario.sweep] and [scenario.zip]")
    paths = (*sweep, *zipped)
    zip_rows = list(zip(*zipped.values(), strict=True)) if zipped else [()]
    short = _short_paths(paths)
    variants = []
    for combo in (a + b for a in itertools.product(*sweep.values()) for b in zip_rows):
        variant_raw = copy.deepcopy(base)
        for p, value in zip(paths, combo, strict=True):
            set_path(variant_raw, p, value)
        values = dict(zip(paths, combo, strict=True))
        label = ", ".join(f"{short[p]}={_short(v)}" for p, v in values.items()) or "default"
        spec = schema.build(ScenarioSpec, variant_raw, where="scenario")
        variants.append(Variant(label=label, values=values, spec=spec))
    return tuple(variants), paths


def _short_paths(paths: tuple[str, ...]) -> dict[str, str]:
    """Each path's shortest dotted suffix that no other path ends with (``rows`` twice -> ``p1_a.rows``)."""
    out = {}
    for path in paths:
        parts = path.split(".")
        for k in range(1, len(parts) + 1):
            suffix = ".".join(parts[-k:])
            if not any(o != path and (o == suffix or o.endswith("." + suffix)) for o in paths):
                break
        out[path] = suffix
    return out


def _short(value: Any) -> str:
    if isinstance(value, list | tuple):
        return f"[{len(value)} items]"
    return str(value)


def _methods(table: Any) -> tuple[MethodEntry, ...]:
    if not isinstance(table, list) or not table:
        raise ConfigError("at least one [[methods]] entry is required, e.g. [[methods]] name = 'local'")
    entries: list[MethodEntry] = []
    for i, item in enumerate(table):
        if isinstance(item, str):
            item = {"name": item}  # methods = ["local", "splitnn"]: each with its default settings
        if not isinstance(item, dict) or "name" not in item:
            raise ConfigError(f"methods[{i}] needs a name: a [[methods]] table with name = '...', or a method's "
                              "name in methods = ['NAME', ...] (vflo methods lists them)")
        settings = dict(item)
        name = settings.pop("name")
        label = settings.pop("label", name)
        fallback = settings.pop("fallback", None)
        cls = get_method(name)
        config = schema.build(cls.Config, settings, where=f"methods.{label}")
        if fallback is not None:
            _check_fallback(str(label), cls, fallback, entries)
        entries.append(MethodEntry(label=str(label), method_cls=cls, config=config,
                                   fallback=None if fallback is None else str(fallback)))
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"method labels must be unique, got {labels}; give repeated methods a label = '...'")
    return tuple(entries)


def _check_fallback(label: str, cls: type[Method], fallback: object, before: list[MethodEntry]) -> None:
    """A fallback names an active-only method listed earlier, for a method that scores with partners."""
    if cls.inference == "active_only":
        raise ConfigError(f"methods.{label}.fallback: {cls.name} scores from the active party alone and needs no "
                          "fallback; remove it")
    earlier = {e.label: e for e in before}
    if fallback not in earlier:
        raise ConfigError(f"methods.{label}.fallback = {fallback!r}: name the label of an active-only method listed "
                          f"before it (listed before: {sorted(earlier) or 'none'}), e.g. one of {active_only()}")
    if earlier[str(fallback)].method_cls.inference != "active_only":
        raise ConfigError(f"methods.{label}.fallback = {fallback!r}: the fallback scores the people a partner lacks, "
                          f"so it must score from the active party alone ({', '.join(active_only())})")



