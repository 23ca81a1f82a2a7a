"""Local: the active party alone (the baseline every federated method must beat)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from vflo.errors import ConfigError, MethodError
from vflo.methods.base import Layout, MethodConfig
from vflo.methods.representation import RepresentationMethod
from vflo.nn.estimators import EstimatorConfig, training_stats

if TYPE_CHECKING:
    from vflo.party.port import Federation


@dataclass(frozen=True, kw_only=True)
class LocalConfig(EstimatorConfig, MethodConfig):
    """The active party's model: ``model`` is 'auto' (default: logistic, or ridge for regression), 'logistic',
    'linear', 'mlp' or a scikit-learn name.

    ``rows = 'all'`` (default) trains on every labelled row the active party holds; ``'aligned'`` only on
    those it shares with the ``partners`` (all passive parties if empty), as the VFL-ASP authors' LOCAL does.
    Finding them is an alignment exchange (reported apart); the model itself still sends nothing.
    """

    rows: Literal["all", "aligned"] = "all"
    partners: tuple[str, ...] = ()


class Local(RepresentationMethod):
    """The active party alone, on its own features and all of its own labelled rows.

    The *Local* / *LOCAL* baseline of APC-VFL (Irureta et al.), VFL-ASP and RAP (Zhang et al.).
    No message is sent. Loss: min_θ Σ_{i ∈ D_A} ℓ(f_θ(x_i^A), y_i), ℓ the logistic / cross-entropy
    loss (or squared error for regression). Its representation is the raw features.
    """

    name = "local"
    floor = True
    Config = LocalConfig
    summary = "active party alone on its own features (the baseline to beat)"
    paper = "baseline in APC-VFL, VFL-ASP and RAP"
    inference = "active_only"

    config: LocalConfig

    @classmethod
    def layout_settings(cls, layout: Layout, *, first_hop: str = "", second_hop: str = "") -> dict[str, Any] | str:
        return {}  # the active party alone: any layout

    def estimator_config(self) -> EstimatorConfig:
        return self.config

    def fit_representation(self, fed: Federation) -> tuple[np.ndarray, np.ndarray]:
        data = fed.data
        if self.config.rows == "all":
            return data.ids, data.X
        partners = list(self.config.partners) or fed.names("passive")
        unknown = [p for p in partners if p not in fed.names("passive")]
        if unknown:
            raise ConfigError(f"local: partners {unknown} are not passive parties ({fed.names('passive')})")
        ids = fed.align(data.ids, partners).ids
        if len(ids) == 0:
            raise MethodError(f"local with rows = 'aligned' found no training row shared with {partners}")
        return ids, data.subset(ids).X

    def represent(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return fed.serving.subset(ids).X

    def summary_stats(self) -> dict[str, float]:
        return training_stats(self.estimator_)
