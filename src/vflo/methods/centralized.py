"""Centralized: every party's features pooled in one place (the oracle upper bound)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from vflo.data.preprocessing import Standardizer
from vflo.errors import MethodError
from vflo.methods.base import Method, MethodConfig
from vflo.nn.estimators import Estimator, EstimatorConfig, make_estimator, training_stats
from vflo.seeding import own_seed

if TYPE_CHECKING:
    from vflo.party.port import Federation


@dataclass(frozen=True, kw_only=True)
class CentralizedConfig(EstimatorConfig, MethodConfig):
    """``rows = 'active'``: all of the active party's training rows, with every party's features for
    them (the true upper bound). ``rows = 'aligned'``: only rows every party holds. ``model``: by default the
    better of the linear model and the MLP on a validation share of the rows (``'best'``), so that the oracle
    bounds the methods whose server trains an MLP (RAP) as well as the linear ones."""

    model: str = "best"
    rows: Literal["active", "aligned"] = "active"
    standardize: bool = True


class Centralized(Method):
    """Every party's features pooled in one place: the upper bound of APC-VFL, RAP and VFL-ASP.

    Simulation only: no deployment can run it, since it needs raw features from every party.
    Loss: min_θ Σ_i ℓ(f_θ([x_i^1, ..., x_i^K]), y_i) over the chosen rows. With the parties' own
    files the pool holds only what the files hold: a person a party does not have gets that party's
    column means from the training rows (so it is an upper bound only where the overlap is complete).
    """

    name = "centralized"
    Config = CentralizedConfig
    summary = "all features pooled in one place (oracle upper bound; simulation only)"
    paper = "upper bound in APC-VFL, RAP and VFL-ASP"
    inference = "active_only"
    simulation_only = True

    config: CentralizedConfig

    def fit(self, fed: Federation) -> None:
        oracle = fed.oracle
        data = fed.data
        y = data.require_labels()
        ids = data.ids
        if self.config.rows == "aligned":
            keep = oracle.held_by_all(ids)
            if not keep.any():
                raise MethodError("centralized with rows = 'aligned' found no row that every party holds")
            ids, y = ids[keep], y[keep]
        X = oracle.features(ids)
        # Cells no party holds (people missing from a party's own file) are filled with training means.
        self.means_ = np.nan_to_num(np.nanmean(X, axis=0)) if np.isnan(X).any() else None
        X = self._fill(X)
        self.scaler_ = Standardizer.fit(X) if self.config.standardize else None
        self.estimator_: Estimator = make_estimator(
            self.config, task=fed.task, n_classes=fed.n_classes, seed=own_seed(fed.rng("centralized")),
        ).fit(self._scale(X), y)

    def _fill(self, X: np.ndarray) -> np.ndarray:
        missing = np.isnan(X)
        if not missing.any():
            return X
        means = self.means_ if self.means_ is not None else np.zeros(X.shape[1])
        return np.where(missing, means, X)

    def _scale(self, X: np.ndarray) -> np.ndarray:
        X = self._fill(X)
        return X.astype(np.float32) if self.scaler_ is None else self.scaler_.transform(X)

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return self.estimator_.predict_scores(self._scale(fed.oracle.features(ids)))

    def summary_stats(self) -> dict[str, float]:
        stats = training_stats(self.estimator_)
        choice = getattr(self.estimator_, "choice_", "")
        return {**stats, "oracle_is_mlp": float(choice == "mlp")} if choice else stats
