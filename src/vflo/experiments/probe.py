"""Representation-quality probe (APC-VFL, Appendix F, Algorithm 1).

Train an autoencoder on one party's features and, after every epoch, cross-validate
a classifier on its representations Z; cross-validate the same classifier once on
the raw features X. When the mean metric on Z comes within ``threshold`` of the one
on X, the representation has kept the information (Eq. 12). It is a design tool for
choosing architectures before any federated run, not part of a federation.
"""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vflo import schema
from vflo.data.catalog import as_task
from vflo.data.datasets import load_dataset
from vflo.data.preprocessing import Standardizer
from vflo.errors import ConfigError, did_you_mean
from vflo.experiments.config import DatasetConfig
from vflo.metrics import check_metric, compute_metrics, default_metric, higher_is_better
from vflo.nn.estimators import EstimatorConfig, make_estimator
from vflo.nn.models import autoencoder
from vflo.nn.train import Callback, TrainConfig, as_tensor, fit_module
from vflo.seeding import derive_seed, numpy_rng, torch_generator


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """Which features, which encoder, and how representations are scored."""

    columns: tuple[str, ...] | None = None
    rows: int | None = None
    encoder: tuple[int, ...] = (64, 128)
    activation: str = "selu"
    folds: int = 5
    metric: str | None = None
    threshold: float = 0.01
    standardize: bool = True
    classifier: EstimatorConfig = field(default_factory=EstimatorConfig)
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_epochs=30, patience=0, validation_fraction=0.0))

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise ConfigError(f"probe.folds must be at least 2, got {self.folds}")
        if self.threshold < 0:
            raise ConfigError("probe.threshold must be non-negative")


@dataclass(frozen=True, kw_only=True)
class ProbeConfig:
    name: str = "probe"
    description: str = ""
    seed: int = 0
    dataset: DatasetConfig
    probe: ProbeSettings = field(default_factory=ProbeSettings)


@dataclass
class ProbeResult:
    config: ProbeConfig
    metric: str
    raw_scores: list[float]
    history: list[dict[str, float]]
    dataset_label: str

    @property
    def raw_mean(self) -> float:
        return float(np.mean(self.raw_scores))

    def first_equivalent_epoch(self) -> int | None:
        """The first epoch whose representations are within ``threshold`` of the raw features (Eq. 12)."""
        sign = 1.0 if higher_is_better(self.metric) else -1.0
        for h in self.history:
            if sign * (self.raw_mean - h["metric_mean"]) <= self.config.probe.threshold:
                return int(h["epoch"])
        return None


def load_probe_config(path: str | Path) -> ProbeConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"probe config {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    raw.setdefault("name", path.stem)
    return schema.build(ProbeConfig, raw)


def _cv_scores(X: np.ndarray, y: np.ndarray, settings: ProbeSettings, metric: str, task: str,
               n_classes: int | None, seed: int) -> list[float]:
    from sklearn.model_selection import StratifiedKFold

    folds = StratifiedKFold(settings.folds, shuffle=True, random_state=seed % (2**31))
    scores = []
    for train, test in folds.split(X, y):
        est = make_estimator(settings.classifier, task=as_task(task), n_classes=n_classes, seed=seed)
        est.fit(X[train], y[train])
        scores.append(compute_metrics(as_task(task), y[test], est.predict_scores(X[test]))[metric])
    return scores


def run_probe(config: ProbeConfig, *, data_dir: str | None = None) -> ProbeResult:
    settings = config.probe
    dataset = load_dataset(config.dataset.name, data_dir if data_dir is not None else config.dataset.data_dir)
    if dataset.task == "regression":
        raise ConfigError("the probe cross-validates a classifier; choose a classification dataset")
    metric = settings.metric or default_metric(dataset.task)
    check_metric(metric, dataset.task)
    columns = list(settings.columns) if settings.columns else list(dataset.columns)
    unknown = [c for c in columns if c not in dataset.columns]
    if unknown:
        raise ConfigError(f"probe.columns {unknown} not in the dataset{did_you_mean(unknown[0], dataset.columns)}")
    rng = numpy_rng(config.seed, "probe-rows")
    rows = np.arange(len(dataset.y))
    if settings.rows is not None:
        if settings.rows > len(rows):
            raise ConfigError(f"probe.rows = {settings.rows} but the dataset has {len(rows)} rows")
        rows = np.sort(rng.choice(rows, settings.rows, replace=False))
    X = dataset.X[columns].to_numpy(np.float64)[rows]
    y = dataset.y[rows]
    X = Standardizer.fit(X).transform(X) if settings.standardize else X.astype(np.float32)
    cv_seed = derive_seed(config.seed, "probe-cv")
    raw_scores = _cv_scores(X, y, settings, metric, dataset.task, dataset.n_classes, cv_seed)
    model = autoencoder(X.shape[1], settings.encoder, activation=settings.activation,
                        generator=torch_generator(config.seed, "probe-ae"))
    history: list[dict[str, float]] = []

    class Score(Callback):
        def on_epoch_end(self, epoch: int, logs: Mapping[str, float]) -> bool:
            model.eval()
            import torch

            with torch.no_grad():
                Z = model.encode(as_tensor(X)).numpy()
            model.train()
            scores = _cv_scores(Z, y, settings, metric, dataset.task, dataset.n_classes, cv_seed)
            history.append({"epoch": float(epoch), "loss": float(logs["loss"]),
                            "metric_mean": float(np.mean(scores)), "metric_std": float(np.std(scores)),
                            **{f"fold_{i}": s for i, s in enumerate(scores)}})
            return False

    def loss_fn(module: Any, batch: Mapping[str, Any]) -> Any:
        _, x_hat = module(batch["x"])
        return ((batch["x"] - x_hat) ** 2).mean()

    fit_module(model, loss_fn, {"x": as_tensor(X)}, config=settings.train, rng=numpy_rng(config.seed, "probe-fit"),
               callbacks=[Score()])
    return ProbeResult(config=config, metric=metric, raw_scores=raw_scores, history=history,
                       dataset_label=dataset.label)


def write_probe(result: ProbeResult, out_dir: Path, *, overwrite: bool = False) -> Path:
    """``history.csv``, ``probe.json`` and ``probe.png``, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from vflo.experiments.output import atomic_dir

    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        pd.DataFrame(result.history).to_csv(tmp / "history.csv", index=False)
        summary = {
            "config": schema.to_plain(result.config), "metric": result.metric, "dataset": result.dataset_label,
            "raw_scores": result.raw_scores, "raw_mean": result.raw_mean,
            "first_equivalent_epoch": result.first_equivalent_epoch(), "history": result.history,
        }
        (tmp / "probe.json").write_text(json.dumps(copy.deepcopy(summary), indent=1), encoding="utf-8")
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
        epochs = [h["epoch"] for h in result.history]
        means = np.array([h["metric_mean"] for h in result.history])
        stds = np.array([h["metric_std"] for h in result.history])
        ax1.plot(epochs, means, marker=".", label="representations Z")
        ax1.fill_between(epochs, means - stds, means + stds, alpha=0.2)
        ax1.axhline(result.raw_mean, color="k", linestyle="--", label="raw features X")
        ax1.set_xlabel("epoch")
        ax1.set_ylabel(f"{result.metric} ({result.config.probe.folds}-fold CV)")
        ax1.legend(fontsize=8)
        ax1.set_title(result.dataset_label, fontsize=9)
        ax2.plot(epochs, [h["loss"] for h in result.history], marker=".")
        ax2.set_xlabel("epoch")
        ax2.set_ylabel("reconstruction loss")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(tmp / "probe.png", dpi=120)
        plt.close(fig)
    return out_dir
