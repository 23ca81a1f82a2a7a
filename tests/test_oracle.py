"""The Centralized oracle bounds what it is compared with: the better of the linear model and the MLP on a
validation share of its rows (issue 26, part 5), for classification and regression."""

from __future__ import annotations

import numpy as np
import pytest

from vflo.methods.registry import get_method
from vflo.nn.estimators import BestEstimator, EstimatorConfig, make_estimator
from vflo.nn.train import TrainConfig


def _rows(kind: str, n: int = 600) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 4)).astype(np.float32)
    signal = X @ np.array([1.0, -2.0, 0.5, 0.0]) if kind == "linear" else 3 * np.sin(2 * X[:, 0]) * X[:, 1]
    return X, (signal + 0.1 * rng.normal(size=n)).astype(np.float64)


@pytest.mark.parametrize(("kind", "chosen"), [("linear", "linear"), ("nonlinear", "mlp")])
def test_the_best_of_linear_and_mlp_is_chosen_on_held_out_rows(kind: str, chosen: str) -> None:
    X, y = _rows(kind)
    config = EstimatorConfig(model="best", hidden=(32,), train=TrainConfig(max_epochs=150, patience=20))
    best = make_estimator(config, task="regression", n_classes=None, seed=0).fit(X, y)
    assert isinstance(best, BestEstimator) and best.choice_ == chosen
    assert best.losses_[chosen] <= min(best.losses_.values())
    again = make_estimator(config, task="regression", n_classes=None, seed=0).set_state(best.get_state())
    assert np.allclose(again.predict_scores(X), best.predict_scores(X))


def test_classification_and_the_centralized_default() -> None:
    X, y = _rows("nonlinear")
    labels = (y > np.median(y)).astype(np.int64)
    best = make_estimator(EstimatorConfig(model="best", train=TrainConfig(max_epochs=100)), task="binary",
                          n_classes=2, seed=0).fit(X, labels)
    assert best.choice_ in ("logistic", "mlp") and best.predict_scores(X).shape == (len(X), 2)  # type: ignore[attr-defined]
    assert get_method("centralized")().config.model == "best"  # type: ignore[attr-defined]
    assert get_method("centralized")(model="logistic").config.model == "logistic"  # type: ignore[attr-defined]
