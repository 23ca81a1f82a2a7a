"""Metrics computed from scores: accuracy, F1 (binary, micro, macro, weighted), AUC, RMSE, MAE."""

from __future__ import annotations

import numpy as np

from vflo.data.datasets import Task
from vflo.errors import ConfigError, unknown_name

CLASSIFICATION_METRICS = ("accuracy", "f1_binary", "f1_micro", "f1_macro", "f1_weighted", "roc_auc")
REGRESSION_METRICS = ("rmse", "mae", "r2")


def metric_names(task: Task) -> tuple[str, ...]:
    if task == "regression":
        return REGRESSION_METRICS
    if task == "binary":
        return CLASSIFICATION_METRICS
    return tuple(m for m in CLASSIFICATION_METRICS if m not in ("f1_binary", "roc_auc"))


def default_metric(task: Task) -> str:
    return "rmse" if task == "regression" else "accuracy"


def higher_is_better(metric: str) -> bool:
    return metric not in ("rmse", "mae")


def check_metric(metric: str, task: Task) -> None:
    names = metric_names(task)
    if metric not in names:
        raise ConfigError(unknown_name(f"metric for a {task} task", metric, names))


def compute_metrics(task: Task, y_true: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """Every metric for ``task`` from true labels and predicted scores."""
    from sklearn import metrics as skm

    y_true = np.asarray(y_true)
    if task == "regression":
        pred = np.asarray(scores, dtype=np.float64).reshape(-1)
        err = pred - y_true.astype(np.float64)
        return {
            "rmse": float(np.sqrt(np.mean(err**2))),
            "mae": float(np.mean(np.abs(err))),
            "r2": float(skm.r2_score(y_true, pred)) if len(y_true) > 1 else float("nan"),
        }
    proba = np.asarray(scores, dtype=np.float64)
    if proba.ndim != 2:
        raise ValueError(f"classification scores must be (n, classes), got shape {proba.shape}")
    pred = proba.argmax(axis=1)
    out = {
        "accuracy": float(skm.accuracy_score(y_true, pred)),
        "f1_micro": float(skm.f1_score(y_true, pred, average="micro", zero_division=0)),
        "f1_macro": float(skm.f1_score(y_true, pred, average="macro", zero_division=0)),
        "f1_weighted": float(skm.f1_score(y_true, pred, average="weighted", zero_division=0)),
    }
    if task == "binary":
        out["f1_binary"] = float(skm.f1_score(y_true, pred, average="binary", zero_division=0))
        out["roc_auc"] = (
            float(skm.roc_auc_score(y_true, proba[:, 1])) if len(np.unique(y_true)) == 2 else float("nan")
        )
    return out
