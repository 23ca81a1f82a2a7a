"""Where RAP loses or gains accuracy against Centralized, one design choice at a time (benchmark, not a test).

    python -m benchmarks.rap_ablation [--rows 50000] [--only NAME ...]

The same MLP (one hidden layer of 128, Adam, RAP's stopping rule) on one 80 / 20 split of each dataset,
outside the protocol, so each of RAP's transforms can be switched on alone. Every figure the RAP report's
preamble quotes is read from what this writes (``runs/bench/rap_ablation.json``):

- ``yearprediction_standin`` and ``houseprice_standin`` (regression): Centralized on the standardised
  features; the label projection alone, [y, y_p] A_Y with y_p ~ N(mean y, (s x std y)²) for s = 1 (the
  paper's), 0.25 and 0, one network of two outputs decoded with A_Y^-1; the feature projection alone, X B
  with one Gaussian B as wide as every feature, as received, standardised per column and PCA-whitened
  (what vflo's RAP server does), and B's condition number;
- ``woc_standin`` (regression): the label projection with an A_Y of condition number about 30 against
  one of at most 2 (``label_max_condition``), pseudo label at the paper's scale;
- ``covertype_standin`` (classification, 44 indicator columns): the standardised original columns
  (Centralized's view), and the projection of the one-hot encoded columns as received and whitened;
- ``credit_default``: the plateau rule (relative change of the loss below 1e-4 for 5 epochs) over 200
  epochs of Centralized's MLP: how often the training and the validation loss change that little, and
  the longest run of such epochs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vflo.data.datasets import load_dataset
from vflo.methods.rap import whiten, whitening
from vflo.metrics import compute_metrics
from vflo.nn.estimators import EstimatorConfig, MLPEstimator, make_estimator
from vflo.nn.train import TrainConfig

TRAIN = TrainConfig(lr=1e-3, batch_size=256, max_epochs=200, patience=5, validation_fraction=0.125, stop="plateau",
                    plateau=1e-4)
CONFIG = EstimatorConfig(model="mlp", hidden=(128,), train=TRAIN)


class Split:
    """One dataset, subsampled and split 80 / 20, with the features standardised on the training rows."""

    def __init__(self, name: str, rows: int, seed: int) -> None:
        ds = load_dataset(name, None)
        self.ds, self.seed = ds, seed
        self.rng = np.random.default_rng(seed)
        idx = self.rng.permutation(len(ds.y))[:rows]
        self.test, self.train = idx[: len(idx) // 5], idx[len(idx) // 5 :]
        self.raw = np.asarray(ds.X, dtype=np.float32)
        self.X = (self.raw - self.raw[self.train].mean(0)) / (self.raw[self.train].std(0) + 1e-9)
        self.y = np.asarray(ds.y, dtype=np.float64 if ds.task == "regression" else np.int64)

    def rmse(self, features: np.ndarray, target: np.ndarray, decode: np.ndarray | None = None) -> float:
        est = make_estimator(CONFIG, task="regression", n_classes=None, seed=self.seed)
        pred = est.fit(features[self.train], target[self.train]).predict_scores(features[self.test])
        if decode is not None:
            pred = (pred @ decode)[:, 0]
        return float(np.sqrt(np.mean((pred - self.y[self.test]) ** 2)))

    def accuracy(self, features: np.ndarray) -> float:
        ds = self.ds
        est = make_estimator(CONFIG, task=ds.task, n_classes=ds.n_classes, seed=self.seed)
        scores = est.fit(features[self.train], self.y[self.train]).predict_scores(features[self.test])
        return compute_metrics(ds.task, self.y[self.test], scores)["accuracy"]

    def gaussian(self, width: int) -> np.ndarray:
        return self.rng.normal(0.0, 1.0 / np.sqrt(width), size=(width, width)).astype(np.float32)

    def label_matrix(self, low: float, high: float) -> np.ndarray:
        """A 2 x 2 N(0, 1) matrix whose condition number lies in [low, high] (redrawn until it does)."""
        for _ in range(100_000):
            A = self.rng.normal(size=(2, 2))
            if low <= np.linalg.cond(A) <= high:
                return A
        raise RuntimeError(f"no label matrix with condition number in [{low}, {high}]")

    def label_projection(self, A: np.ndarray, scale: float) -> float:
        pseudo = self.rng.normal(self.y.mean(), scale * self.y.std(), size=len(self.y))
        return self.rmse(self.X, np.column_stack([self.y, pseudo]) @ A, np.linalg.inv(A))


def regression(split: Split) -> dict[str, float]:
    out: dict[str, float] = {"y_std": float(split.y.std()), "centralized": split.rmse(split.X, split.y)}
    A = np.array([[np.cos(0.7), -np.sin(0.7)], [np.sin(0.7), np.cos(0.7)]])  # well conditioned: isolates y_p
    for scale in (1.0, 0.25, 0.0):
        out[f"label_projection_pseudo_{scale:g}"] = split.label_projection(A, scale)
    B = split.gaussian(split.X.shape[1])
    out["feature_projection_condition"] = float(np.linalg.cond(B))
    XB = split.X @ B
    out["feature_projection"] = split.rmse(XB, split.y)
    out["feature_projection_standardised"] = split.rmse((XB - XB[split.train].mean(0)) / XB[split.train].std(0),
                                                        split.y)
    out["feature_projection_whitened"] = split.rmse(whiten(XB, whitening(XB[split.train])), split.y)
    return out


def label_condition(split: Split) -> dict[str, float]:
    bad, good = split.label_matrix(25.0, 35.0), split.label_matrix(1.0, 2.0)
    return {"centralized": split.rmse(split.X, split.y),
            "label_condition_bad": float(np.linalg.cond(bad)), "label_projection_bad": split.label_projection(bad, 1.0),
            "label_condition_good": float(np.linalg.cond(good)),
            "label_projection_good": split.label_projection(good, 1.0)}


def one_hot_whitening(split: Split) -> dict[str, float]:
    ds = split.ds
    categorical = [ds.columns.index(c) for c in ds.categorical]
    numeric = [i for i in range(len(ds.columns)) if i not in categorical]
    parts = [split.X[:, numeric]]
    for i in categorical:
        codes = split.raw[:, i].astype(np.int64)
        parts.append(np.eye(int(codes.max()) + 1, dtype=np.float32)[codes])
    encoded = np.hstack(parts)
    XB = encoded @ split.gaussian(encoded.shape[1])
    return {"one_hot_columns": float(encoded.shape[1] - len(numeric)),
            "standardised_original": split.accuracy(split.X),
            "projection_whitened": split.accuracy(whiten(XB, whitening(XB[split.train]))),
            "projection_as_received": split.accuracy(XB)}


def plateau_rule(split: Split) -> dict[str, float]:
    ds = split.ds
    est = MLPEstimator(task=ds.task, n_classes=ds.n_classes, hidden=(128,), activation="relu", train=TRAIN,
                       seed=split.seed).fit(split.X[split.train], split.y[split.train])
    out: dict[str, float] = {"epochs": float(len(est.history_)), "stopped_by_rule": float(
        est.history_.stop_reason == "plateau")}
    for key in ("loss", "val_loss"):
        values = np.asarray(est.history_[key])
        change = np.abs(np.diff(values)) / values[:-1]
        flat = "".join("1" if c < TRAIN.plateau else "0" for c in change)
        out[f"{key}_median_change"] = float(np.median(change))
        out[f"{key}_share_below"] = float(np.mean(change < TRAIN.plateau))
        out[f"{key}_longest_run"] = float(max(len(run) for run in flat.split("0")))
    return out


ANALYSES: dict[str, tuple[str, Callable[[Split], dict[str, float]]]] = {
    "yearprediction_standin": ("yearprediction_standin", regression),
    "houseprice_standin": ("houseprice_standin", regression),
    "woc_standin": ("woc_standin", label_condition),
    "covertype_standin": ("covertype_standin", one_hot_whitening),
    "credit_plateau": ("credit_default", plateau_rule),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(ANALYSES), help="run only these analyses")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/rap_ablation.json"))
    args = parser.parse_args(argv)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    from benchmarks.compare_all import commit

    ran = commit()  # each analysis names the code it ran (a file built by several runs holds several)
    for key in args.only or ANALYSES:
        dataset, analysis = ANALYSES[key]
        started = time.perf_counter()
        results[key] = {**analysis(Split(dataset, args.rows, args.seed)), "seconds": time.perf_counter() - started,
                        "commit": ran}
        print(key, json.dumps(results[key], indent=1), flush=True)
        # Written after each analysis, so an interrupted run keeps what finished.
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
