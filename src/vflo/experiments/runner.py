"""Run an experiment: every scenario variant x repeat x fold x method, in process.

For each variant and repeat the scenario is built once and every method sees the
same parties, the same rows and the same test split, so methods are compared on
equal terms. Communication columns are read from each run's ledger.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from vflo import __version__
from vflo.data.datasets import Dataset, load_dataset
from vflo.experiments.config import ExperimentConfig, MethodEntry, Variant
from vflo.experiments.protocols import Split
from vflo.federation.simulation import run_method
from vflo.metrics import compute_metrics, metric_names
from vflo.progress import progress_bar
from vflo.seeding import derive_seed, numpy_rng

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

    def environment(self) -> dict[str, str]:
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
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> ExperimentResult:
    """Run everything the config describes; raises on the first failure (no partial result)."""
    dataset = load_dataset(config.dataset.name, data_dir if data_dir is not None else config.dataset.data_dir)
    result = ExperimentResult(config=config, dataset=dataset, started=datetime.now(UTC).isoformat(timespec="seconds"))
    t0 = time.perf_counter()
    repeats = config.protocol.repetitions()
    plan = [(v, r) for v in config.variants for r in range(repeats)]
    with progress_bar(enabled=progress, description=config.name) as bar:
        task = bar.add_task(config.name, total=len(plan) * len(config.methods))
        for variant, repeat in plan:
            layout = variant.spec.build(dataset, seed=derive_seed(config.seed, "layout", repeat))
            splits = config.protocol.splits(layout, numpy_rng(config.seed, "split", repeat))
            for split in splits:
                data = layout.materialize(test_ids=split.test_ids, train_scope=split.train_scope)
                facts = {
                    "aligned": len(layout.aligned_ids()),
                    "active_samples": len(layout.rows[layout.active]),
                    "active_features": len(layout.columns[layout.active]),
                    "n_train_active": data.train[data.active].n_samples,
                    "n_test": len(split.test_ids),
                }
                for entry in config.methods:
                    row, comm = _run_one(config, dataset, variant, repeat, split, entry, data, facts)
                    result.rows.append(row)
                    result.communication.append(comm)
                    if on_row is not None:
                        on_row(row)
                bar.advance(task, len(config.methods) / len(splits))
    result.seconds = time.perf_counter() - t0
    return result


def _run_one(
    config: ExperimentConfig, dataset: Dataset, variant: Variant, repeat: int, split: Split, entry: MethodEntry,
    data: Any, facts: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    seed = derive_seed(config.seed, "method", repeat, split.fold)
    method = entry.instantiate()
    t0 = time.perf_counter()
    out = run_method(method, data, seed=seed, max_message_bytes=config.transport.max_message_bytes)
    wall = time.perf_counter() - t0
    summary = out.ledger.summary()
    by_kind = out.ledger.by_kind()
    align_bytes = sum(v["bytes"] for k, v in by_kind.items() if k.startswith("align."))
    metrics = compute_metrics(data.task, data.test_y, out.scores)
    row: dict[str, Any] = {
        "experiment": config.name,
        "dataset": dataset.name,
        "standin": dataset.standin,
        "variant": variant.label,
        **{path: _plain(value) for path, value in variant.values.items()},
        **facts,
        "repeat": repeat,
        "fold": split.fold,
        "seed": seed,
        "method": entry.label,
        "method_name": entry.method_cls.name,
        "inference": entry.method_cls.inference,
        "simulation_only": entry.method_cls.simulation_only,
        **metrics,
        "comm_bytes": summary.bytes,
        "comm_mb": summary.bytes / 1e6,
        "comm_messages": summary.messages,
        "comm_rounds": summary.rounds,
        "align_bytes": align_bytes,
        "control_bytes": summary.control_bytes,
        "fit_seconds": out.fit_seconds,
        "predict_seconds": out.predict_seconds,
        "wall_seconds": wall,
    }
    logger.info(
        "%s | %s | repeat %d fold %d | %s: %s = %.4f, %d bytes, %d rounds, %.2fs",
        config.name, variant.label, repeat, split.fold, entry.label, config.metric,
        metrics.get(config.metric, float("nan")), summary.bytes, summary.rounds, wall,
    )
    comm = {
        "variant": variant.label, "repeat": repeat, "fold": split.fold, "method": entry.label,
        "by_kind": by_kind, "by_party": out.ledger.by_party(),
    }
    return row, comm
