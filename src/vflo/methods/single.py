"""Single: the best one party alone (simulation only), RAP's lower reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vflo.data.preprocessing import Standardizer
from vflo.errors import MethodError
from vflo.methods.base import Method, MethodConfig
from vflo.metrics import compute_metrics, default_metric, higher_is_better
from vflo.nn.estimators import Estimator, EstimatorConfig, make_estimator, training_stats
from vflo.nn.train import split_validation
from vflo.seeding import own_seed

if TYPE_CHECKING:
    from vflo.party.port import Federation


@dataclass(frozen=True, kw_only=True)
class SingleConfig(EstimatorConfig, MethodConfig):
    """The model each party trains on its own columns; ``validation_fraction`` picks the best party."""

    validation_fraction: float = 0.125


class Single(Method):
    """Single (Zhang et al., RAP, Section 4.1): every party trains the same model on its own features
    alone, as if it held the labels, min_θ Σ ℓ(f(x^m; θ), y); the party whose model scores best on a
    validation split is reported. Simulation only (a passive party has no labels in reality). The
    paper picks the best party on the test set; here a validation split picks it, so the test set stays
    unseen. Each party trains on the labelled rows it holds itself, and only parties that hold every
    row to score are candidates: with partial overlap a party cannot score people it does not have.
    """

    name = "single"
    Config = SingleConfig
    summary = "the best single party on its own columns (simulation only)"
    paper = "baseline in Zhang et al., RAP"
    inference = "active_only"
    simulation_only = True

    config: SingleConfig

    def fit(self, fed: Federation) -> None:
        oracle = fed.oracle
        data = fed.data
        y_all = data.require_labels()
        to_score = oracle.serve_ids.get(data.party, frozenset())
        parties = [p.name for p in fed.parties if p.holds_data and oracle.layout.columns.get(p.name)
                   and to_score <= oracle.serve_ids.get(p.name, frozenset())]
        if not parties:
            raise MethodError("single needs at least one party with features that holds every row to score")
        metric = default_metric(fed.task)
        best: tuple[float, str, Estimator, Standardizer] | None = None
        for party in parties:
            held = np.fromiter((v in oracle.train_ids[party] for v in data.ids.tolist()), dtype=bool,
                               count=data.n_samples)
            if not held.any():
                continue
            ids, y = data.ids[held], y_all[held]
            train, val = split_validation(len(y), self.config.validation_fraction, fed.rng("single-validation"))
            X = oracle.features(ids, party)
            scaler = Standardizer.fit(X[train])
            est = make_estimator(self.config, task=fed.task, n_classes=fed.n_classes,
                                 seed=own_seed(fed.rng("single", party)))
            est.fit(scaler.transform(X[train]), y[train])
            scores = est.predict_scores(scaler.transform(X[val])) if len(val) else None
            score = compute_metrics(fed.task, y[val], scores)[metric] if scores is not None else 0.0
            key = score if higher_is_better(metric) else -score
            if best is None or key > best[0]:
                best = (key, party, est, scaler)
        if best is None:
            raise MethodError("single found no party that holds labelled training rows")
        _, self.party_, self.estimator_, self.scaler_ = best

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return self.estimator_.predict_scores(self.scaler_.transform(fed.oracle.features(ids, self.party_)))

    def summary_stats(self) -> dict[str, float]:
        return training_stats(self.estimator_)
