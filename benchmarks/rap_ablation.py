"""Where RAP loses accuracy against Centralized on regression (benchmark, not a test).

    python benchmarks/rap_ablation.py [--datasets yearprediction_standin houseprice_standin] [--rows 50000]

The same MLP (one hidden layer of 128, Adam, RAP's stopping rule) on one 80 / 20 split, trained on:
1. the standardised features and y (Centralized);
2. the label projection alone: [y, y_p] A_Y with y_p ~ N(mean, std x scale) for scale 1 (the paper's) and 0,
   one network with two outputs, decoded with A_Y^-1;
3. the feature projection alone: X B with one Gaussian B (as wide as all features), then the same
   after per-column standardisation, and after PCA whitening (what vflo's RAP server does).
Writes runs/bench/rap_ablation.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from vflo.data.datasets import load_dataset
from vflo.methods.rap import whiten, whitening
from vflo.nn.estimators import EstimatorConfig, make_estimator
from vflo.nn.train import TrainConfig

CONFIG = EstimatorConfig(model="mlp", hidden=(128,), train=TrainConfig(
    lr=1e-3, batch_size=256, max_epochs=200, patience=5, validation_fraction=0.125, stop="plateau", plateau=1e-4))


def one_dataset(name: str, rows: int, seed: int) -> dict[str, float]:
    ds = load_dataset(name)
    rng = np.random.default_rng(seed)
    X = np.asarray(ds.X, dtype=np.float32)
    y = np.asarray(ds.y, dtype=np.float64)
    idx = rng.permutation(len(y))[:rows]
    test, train = idx[: rows // 5], idx[rows // 5 :]
    X = (X - X[train].mean(0)) / (X[train].std(0) + 1e-9)

    def rmse(features: np.ndarray, target: np.ndarray, decode: np.ndarray | None = None) -> float:
        est = make_estimator(CONFIG, task="regression", n_classes=None, seed=seed).fit(features[train], target[train])
        pred = est.predict_scores(features[test])
        if decode is not None:
            pred = (pred @ decode)[:, 0]
        return float(np.sqrt(np.mean((pred - y[test]) ** 2)))

    out: dict[str, float] = {"y_std": float(y.std())}
    t0 = time.perf_counter()
    out["centralized"] = rmse(X, y)
    A = np.array([[np.cos(0.7), -np.sin(0.7)], [np.sin(0.7), np.cos(0.7)]])
    for scale in (1.0, 0.0):
        pseudo = rng.normal(y.mean(), scale * y.std(), size=len(y))
        out[f"label projection, pseudo std x {scale:g}"] = rmse(X, np.column_stack([y, pseudo]) @ A, np.linalg.inv(A))
    width = X.shape[1]
    B = rng.normal(0.0, 1.0 / np.sqrt(width), size=(width, width)).astype(np.float32)
    out["feature projection: condition number"] = float(np.linalg.cond(B))
    XB = X @ B
    out["feature projection"] = rmse(XB, y)
    out["feature projection, standardised"] = rmse((XB - XB[train].mean(0)) / XB[train].std(0), y)
    out["feature projection, whitened"] = rmse(whiten(XB, whitening(XB[train])), y)
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["yearprediction_standin", "houseprice_standin"])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/rap_ablation.json"))
    args = parser.parse_args(argv)
    results = {}
    for name in args.datasets:
        results[name] = one_dataset(name, args.rows, args.seed)
        print(name, json.dumps(results[name], indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
