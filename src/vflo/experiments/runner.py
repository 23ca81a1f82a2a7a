"""Run an experiment: every scenario variant x repeat x fold x method, in process.

For each variant and repeat the scenario is built once and every method sees the
same parties, the same rows and the same test split, so methods are compared on
equal terms. Communication columns are read from each run's ledger.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.data.datasets import Dataset
from vflo.data.layout import FederatedData, Layout
from vflo.errors import AlignmentError, ConfigError, VfloError
from vflo.experiments.config import ExperimentConfig, MethodEntry, Variant
from vflo.experiments.protocols import ActiveCV, pool
from vflo.experiments.rows import failed_row, majority_columns, majority_warning, ok_row
from vflo.explorer.select import selected
from vflo.federation.session import RunOutput, Session
from vflo.federation.simulation import build_federation, held_by_all, run_method
from vflo.methods.base import Method
from vflo.methods.representation import RepresentationMethod
from vflo.metrics import compute_metrics, metric_names
from vflo.nn.train import CheckpointPlan
from vflo.privacy.columns import attack_columns
from vflo.progress import progress_bar
from vflo.seeding import derive_seed, numpy_rng
from vflo.version import __version__

logger = logging.getLogger(__name__)


@dataclass
class ExperimentResult:
    """Rows (one per variant x repeat x fold x method) and the ledger detail behind them."""

    config: ExperimentConfig
    dataset: Dataset
    rows: list[dict[str, Any]] = field(default_factory=list)
    communication: list[dict[str, Any]] = field(default_factory=list)
    started: str = ""
    seconds: float = 0.0

    @property
    def metrics(self) -> tuple[str, ...]:
        return metric_names(self.dataset.task)

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Rows of methods that failed (the others ran and are in :attr:`rows` too)."""
        return [r for r in self.rows if r.get("status") == "failed"]

    @property
    def exit_code(self) -> int:
        """0 when every method ran; else the exit code of the first failure."""
        failures = self.failures
        return int(failures[0]["exit_code"]) if failures else 0

    def environment(self) -> dict[str, str]:
        return environment()


def now_iso() -> str:
    """When a run started, for its results (UTC, to the second)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def environment() -> dict[str, str]:
    """The versions and machine a run used, for its results."""
    import sklearn
    import torch

    return {
        "vflo": __version__, "python": platform.python_version(), "torch": torch.__version__,
        "numpy": np.__version__, "scikit-learn": sklearn.__version__, "platform": platform.platform(),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return json.dumps(list(value))
    return value


def run_experiment(
    config: ExperimentConfig, *, data_dir: str | None = None, progress: bool = False,
    on_row: Callable[[dict[str, Any]], None] | None = None, save: Path | None = None,
    checkpoints: Path | None = None, resume: bool = False,
) -> ExperimentResult:
    """Run everything the config describes; with ``save``, every deployable method's first run (first variant,
    repeat and fold) is saved there, each party's part in its own folder (``SAVE/LABEL/PARTY``). With
    ``checkpoints``, methods whose training keeps checkpoints (``train.checkpoint_every``) keep them there, one
    folder per run (a key from the experiment, method, config, variant, repeat, fold and seed) and one per
    party; ``resume`` continues each such run from its last checkpoint every party holds.

    Problems that concern the whole run (a file, the scenario, rows a collaborative method would need
    to score) are raised before anything trains. A method that fails while running is recorded as a
    failed row (``status``, ``error``, ``exit_code``) and the others go on.
    """
    source = config.load_dataset(data_dir)
    started = now_iso()
    result: ExperimentResult | None = None
    t0 = time.perf_counter()
    protocol = config.protocol
    transductive = isinstance(protocol, ActiveCV) and protocol.transductive
    plan = [(v, r) for v in config.variants for r in range(protocol.repetitions())]
    with progress_bar(enabled=progress, description=config.name) as bar:
        task = bar.add_task(config.name, total=len(plan) * len(config.methods))
        for variant, repeat in plan:
            drawn = protocol.split_repeat(repeat)
            layout = config.layout(variant, derive_seed(config.seed, "layout", drawn), source)
            if result is None:
                result = ExperimentResult(config=config, dataset=layout.dataset, started=started)
            dataset = layout.dataset
            rng = numpy_rng(config.seed, "split", drawn)
            if transductive:
                assert isinstance(protocol, ActiveCV)
                data = _selected(config, layout.materialize(train_scope=protocol.train_scope))
                folds = protocol.fold_ids(*pool(layout, protocol.test_from), rng)
                facts = _facts(layout, data, n_test=len(folds[0]))
                for entry in config.methods:
                    try:
                        rows, comm = _run_transductive(config, dataset, variant, repeat, entry, data, facts, folds)
                    except Exception as exc:  # recorded; the other methods go on
                        seed = derive_seed(config.seed, "method", repeat, 0)
                        rows, comm = [_failure(config, dataset, variant, repeat, 0, seed, entry, facts, exc)], {}
                    _collect(result, rows, comm, on_row)
                    bar.advance(task, 1)
                continue
            splits = protocol.splits(layout, rng)
            for split in splits:
                data = _selected(config, layout.materialize(test_ids=split.test_ids, train_scope=split.train_scope))
                check_scoring_rows(config, data)
                facts = _facts(layout, data, n_test=len(split.test_ids))
                first = variant is config.variants[0] and repeat == 0 and split.fold == 0
                scored: dict[str, np.ndarray] = {}  # each method's test scores, for those that fall back on it
                for entry in config.methods:
                    keep = save if first and not entry.method_cls.simulation_only else None
                    row, comm = _run_one(config, dataset, variant, repeat, split.fold, entry, data, facts, save=keep,
                                         checkpoints=checkpoints, resume=resume, scored=scored)
                    _collect(result, [row], comm, on_row)
                bar.advance(task, len(config.methods) / len(splits))
    assert result is not None
    result.seconds = time.perf_counter() - t0
    return result


def first_split(config: ExperimentConfig, *, repeat: int = 0, source: Dataset | None = None,
                data_dir: str | Path | None = None) -> FederatedData:
    """The data of run ``repeat`` of the config's first variant, its first split, cut as :func:`run_experiment` cuts
    it (``source``: the config's dataset, already loaded; else read from ``data_dir``)."""
    drawn = config.protocol.split_repeat(repeat)
    source = source if source is not None else config.load_dataset(data_dir)
    layout = config.layout(config.variants[0], derive_seed(config.seed, "layout", drawn), source)
    split = config.protocol.splits(layout, numpy_rng(config.seed, "split", drawn))[0]
    return layout.materialize(test_ids=split.test_ids, train_scope=split.train_scope)


def _selected(config: ExperimentConfig, data: FederatedData) -> FederatedData:
    """The run's data with each partner's weak columns dropped, where the config has ``[select]``."""
    return data if config.select is None else selected(data, config.select)


def run_key(*parts: object) -> str:
    """The folder name of one run's checkpoints: the same for the run and its resumption, another for any
    other method, config, variant, repeat, fold or seed."""
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:20]


def check_scoring_rows(config: ExperimentConfig, data: FederatedData) -> None:
    """Before anything trains: every method's settings name parties the run has, and every party a collaborative
    method scores with holds the rows to score."""
    for entry in config.methods:
        method = entry.instantiate()
        method.check_parties(data.parties)
        if entry.fallback is not None:  # the people its partners lack are scored by the fallback
            continue
        for party in method.scoring_parties(data.parties):
            held = held_by_all(data.serve, [party], data.test_ids)
            if not held.all():
                missing = data.test_ids[~held]
                # Test rows already drawn from the shared people: suggesting that again would point nowhere.
                draw = ("" if getattr(config.protocol, "test_from", "") == "aligned" else
                        "draw test rows every party holds (protocol test_from = 'aligned', or aligned_holdout), ")
                raise AlignmentError(
                    f"{entry.label} scores together with {party!r}, which does not hold {len(missing)} of the "
                    f"{len(data.test_ids)} rows to score (e.g. {missing[:5].tolist()}); {draw}give the method a "
                    "fallback (fallback = 'local': an active-only method listed before it), or leave the method out")


def _collect(result: ExperimentResult, rows: list[dict[str, Any]], comm: dict[str, Any],
             on_row: Callable[[dict[str, Any]], None] | None) -> None:
    result.rows.extend(rows)
    if comm:
        result.communication.append(comm)
    if on_row is not None:
        for row in rows:
            on_row(row)


def _facts(layout: Layout, data: FederatedData, *, n_test: int) -> dict[str, Any]:
    return {
        # People the active party shares, held-out test people left out (they are scored, never trained on).
        "aligned": len(np.setdiff1d(layout.aligned_ids(), layout.held_out_ids())),
        "active_samples": len(layout.rows[layout.active]),
        "active_features": len(layout.columns[layout.active]),
        "n_train_active": data.train[data.active].n_samples,
        "n_test": n_test,
        # [select]: each party's columns dropped by its own thresholds, "party: a, b; ..." (names only).
        **({"dropped_columns": "; ".join(f"{p}: {', '.join(c)}" for p, c in data.dropped.items())}
           if data.dropped else {}),
    }


def _context(config: ExperimentConfig, dataset: Dataset, variant: Variant, repeat: int, fold: int, seed: int,
             facts: dict[str, Any]) -> dict[str, Any]:
    """What a simulated run's row says before the method's columns: which experiment, data, variant and run."""
    return {"experiment": config.name, "dataset": dataset.name, "standin": dataset.standin, "variant": variant.label,
            **{path: _plain(value) for path, value in variant.values.items()}, **facts, "repeat": repeat,
            "fold": fold, "seed": seed}


def _row(config: ExperimentConfig, dataset: Dataset, variant: Variant, repeat: int, fold: int, seed: int,
         entry: MethodEntry, method: Method, facts: dict[str, Any], metrics: dict[str, float], out: RunOutput,
         wall: float, labels: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    """A finished run's row; ``labels``: the training rows' and the test rows' labels (a classification run is
    compared with always answering the training rows' most frequent class)."""
    row = ok_row(entry.label, method, out, metrics, wall=wall,
                 context=_context(config, dataset, variant, repeat, fold, seed, facts))
    logger.info(
        "%s | %s | repeat %d fold %d | %s: %s = %.4f, %d bytes, %d rounds, %.2fs",
        config.name, variant.label, repeat, fold, entry.label, config.metric,
        metrics.get(config.metric, float("nan")), row["comm_bytes"], row["comm_rounds"], wall,
    )
    train_y, test_y = labels
    if dataset.task != "regression" and len(train_y) and "accuracy" in row:
        row |= majority_columns(train_y, test_y, out.scores)
        if row["no_better_than_majority"]:
            logger.warning("%s | %s | repeat %d fold %d | %s", config.name, variant.label, repeat, fold,
                           majority_warning(entry.label, row, n_train=len(train_y), n_test=len(test_y),
                                            class_names=dataset.classes))
    return row


def _comm(variant: Variant, repeat: int, fold: int, entry: MethodEntry, ledger: Ledger) -> dict[str, Any]:
    return {"variant": variant.label, "repeat": repeat, "fold": fold, "method": entry.label,
            "by_kind": ledger.by_kind(), "by_party": ledger.by_party()}


def _failure(config: ExperimentConfig, dataset: Dataset, variant: Variant, repeat: int, fold: int, seed: int,
             entry: MethodEntry, facts: dict[str, Any], exc: Exception) -> dict[str, Any]:
    if isinstance(exc, VfloError):
        # Said once: the command prints each failure when the run ends (and the results record it).
        logger.info("%s | %s | repeat %d fold %d | %s failed: %s", config.name, variant.label, repeat, fold,
                    entry.label, exc)
    else:
        logger.exception("%s: %s failed with an unexpected error (a bug: please report it)", config.name, entry.label)
    return failed_row(entry.label, entry.method_cls, exc,
                      context=_context(config, dataset, variant, repeat, fold, seed, facts))


def _run_one(
    config: ExperimentConfig, dataset: Dataset, variant: Variant, repeat: int, fold: int, entry: MethodEntry,
    data: FederatedData, facts: dict[str, Any], *, save: Path | None = None, checkpoints: Path | None = None,
    resume: bool = False, scored: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One method's run on one split; its test scores go into ``scored`` (by label), where a later method with
    ``fallback`` finds them."""
    seed = derive_seed(config.seed, "method", repeat, fold)
    t0 = time.perf_counter()
    scored = {} if scored is None else scored
    try:
        if entry.fallback is not None and entry.fallback not in scored:
            raise ConfigError(f"{entry.label} falls back on {entry.fallback}, which failed in this run; see its row")
        method = entry.instantiate()
        plan = None
        if checkpoints is not None and method.checkpointed:
            key = run_key(config.name, entry.label, method.config_json(), variant.label, repeat, fold, seed)
            plan = (checkpoints, CheckpointPlan(run=key, resume=resume))
        budgets = {} if config.privacy is None else {p.name: config.privacy for p in data.parties
                                                     if p.role == "passive"}
        seen: list[Message] = []
        out = run_method(method, data, seed=seed, max_message_bytes=config.transport.max_message_bytes,
                         alignment=config.alignment, save=None if save is None else (save, entry.label),
                         checkpoint=plan, fallback=None if entry.fallback is None else scored[entry.fallback],
                         budgets=budgets, observers=() if config.attacks is None else (seen.append,))
        attacked = {} if config.attacks is None else attack_columns(seen, data, config.attacks, seed=seed)
        del seen
    except Exception as exc:  # one method failing must not discard the others' results
        return _failure(config, dataset, variant, repeat, fold, seed, entry, facts, exc), {}
    scored[entry.label] = out.scores
    wall = time.perf_counter() - t0
    metrics = compute_metrics(data.task, data.test_y, out.scores)
    train_y = data.train[data.active].y
    row = _row(config, dataset, variant, repeat, fold, seed, entry, method, facts, metrics, out, wall,
               labels=(np.empty(0) if train_y is None else train_y, data.test_y)) | attacked
    return row, _comm(variant, repeat, fold, entry, out.ledger)


def _run_transductive(
    config: ExperimentConfig, dataset: Dataset, variant: Variant, repeat: int, entry: MethodEntry,
    data: FederatedData, facts: dict[str, Any], folds: list[np.ndarray],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Fit the representation once on every row, then cross-validate only the classifier."""
    seed = derive_seed(config.seed, "method", repeat, 0)
    method = entry.instantiate()
    if not isinstance(method, RepresentationMethod):
        raise ConfigError(
            f"the transductive protocol cross-validates a classifier on a learned representation, and "
            f"{entry.label!r} ({method.name}) has none; run it with transductive = false"
        )
    fed, _ = build_federation(data, method, seed=seed, max_message_bytes=config.transport.max_message_bytes,
                              alignment=config.alignment)
    session = Session(fed)
    session.start(method)
    ids, Z = session.train(method.fit_representation)
    represent_seconds = session.fit_seconds
    y = fed.data.subset(ids).require_labels()
    rows = []
    for fold, test_ids in enumerate(folds):
        t1 = time.perf_counter()
        test = np.isin(ids, test_ids)
        if not test.any():
            continue
        estimator = method.new_estimator(fed).fit(Z[~test], y[~test])
        t2 = time.perf_counter()
        scores = estimator.predict_scores(Z[test])
        t3 = time.perf_counter()
        metrics = compute_metrics(data.task, y[test], scores)
        out = RunOutput(scores=scores, ledger=fed.transport.ledger, fit_seconds=represent_seconds + t2 - t1,
                        predict_seconds=t3 - t2, rounds=fed.rounds, fit_entries=len(fed.transport.ledger), stats={})
        rows.append(_row(config, dataset, variant, repeat, fold, seed, entry, method,
                         {**facts, "n_test": int(test.sum())}, metrics, out, represent_seconds + t3 - t1,
                         labels=(y[~test], y[test])))
    ledger, _ = session.finish()
    return rows, _comm(variant, repeat, 0, entry, ledger)
