"""Methods that learn features for the active party and then fit an ordinary model on them.

Local, Ablation, APC-VFL, VFedTrans and FedSVD all have this shape: a (possibly
federated) representation step, then a classifier on the active party's rows.
Splitting the two lets an evaluation protocol fit the representation once and
cross-validate only the classifier, which is how APC-VFL and VFedTrans report
their results (the *transductive* protocol, see ``active_cv`` with
``transductive = true``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from vflo.methods.base import Method
from vflo.methods.saved import Saved, Saves, estimator
from vflo.nn.estimators import Estimator, EstimatorConfig, make_estimator, training_stats
from vflo.seeding import own_seed
from vflo.spill import Rows

if TYPE_CHECKING:
    from vflo.party.port import Federation


#: The classifier the active party fits on the representation.
CLASSIFIER = Saved("classifier", estimator(lambda at: at.method.new_estimator(at.where)),
                   "its classifier on the representation", attr="estimator_")


class RepresentationMethod(Method):
    """A representation step, then ``classifier`` (an :class:`EstimatorConfig`) on its output."""

    saves: ClassVar[Saves] = Saves(model=(CLASSIFIER,))

    def estimator_config(self) -> EstimatorConfig:
        config = getattr(self.config, "classifier", None)
        if not isinstance(config, EstimatorConfig):  # pragma: no cover - programming error
            raise TypeError(f"{type(self).__name__} must define estimator_config() or a 'classifier' setting")
        return config

    @abstractmethod
    def fit_representation(self, fed: Federation) -> tuple[np.ndarray, Rows]:
        """Learn the representation; return the IDs the classifier trains on and their features (in memory, or
        kept on disk beyond the party's ``[spill]`` limit)."""

    @abstractmethod
    def represent(self, fed: Federation, ids: np.ndarray) -> Rows:
        """Features of serving rows ``ids`` (held by the active party)."""

    def new_estimator(self, fed: Federation) -> Estimator:
        return make_estimator(self.estimator_config(), task=fed.task, n_classes=fed.n_classes,
                              seed=own_seed(fed.rng(self.name, "classifier")))

    def fit(self, fed: Federation) -> None:
        ids, Z = self.fit_representation(fed)
        y = fed.data.subset(ids).require_labels()
        self.estimator_ = self.new_estimator(fed).fit(Z, y)
        self.n_train_ = len(ids)

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return self.estimator_.predict_scores(self.represent(fed, ids))

    def summary_stats(self) -> dict[str, float]:
        """How the classifier trained (``classifier_epochs``, where it trains by epochs)."""
        return training_stats(self.estimator_, "classifier_") if hasattr(self, "estimator_") else {}
