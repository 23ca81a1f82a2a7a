"""Local: the active party alone (the baseline every federated method must beat)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflo.federation.coordinator import Federation
from vflo.methods.base import Method, MethodConfig
from vflo.nn.estimators import Estimator, EstimatorConfig, make_estimator
from vflo.seeding import derive_seed


@dataclass(frozen=True, kw_only=True)
class LocalConfig(EstimatorConfig, MethodConfig):
    """The active party's model: ``model`` is 'logistic' (default), 'linear' or 'mlp'."""


class Local(Method):
    """The active party alone, on its own features and all of its own labelled rows.

    The *Local* / *LOCAL* baseline of APC-VFL (Irureta et al.), VFL-ASP and RAP (Zhang et al.).
    No message is sent. Loss: min_θ Σ_{i ∈ D_A} ℓ(f_θ(x_i^A), y_i), ℓ the logistic / cross-entropy
    loss (or squared error for regression).
    """

    name = "local"
    Config = LocalConfig
    summary = "active party alone on its own features (the baseline to beat)"
    paper = "baseline in APC-VFL, VFL-ASP and RAP"
    inference = "active_only"

    config: LocalConfig

    def fit(self, fed: Federation) -> None:
        data = fed.data
        y = data.require_labels()
        self.estimator_: Estimator = make_estimator(
            self.config, task=fed.task, n_classes=fed.n_classes, seed=derive_seed(fed.seed, "local"),
        ).fit(data.X, y)

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return self.estimator_.predict_scores(fed.serving.subset(ids).X)

