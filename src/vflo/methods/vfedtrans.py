"""VFedTrans (Huang et al. 2023): FedSVD representations of the aligned rows, distilled locally."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from vflo.errors import ConfigError, MethodError
from vflo.methods.base import MethodConfig
from vflo.methods.fedsvd import FedSVDProtocol, FedSVDSettings
from vflo.methods.representation import CLASSIFIER
from vflo.methods.saved import INTEGER, Saved, Saves, autoencoder
from vflo.nn.distill import DistillLoss, Reduction, fit_autoencoder
from vflo.nn.estimators import EstimatorConfig
from vflo.nn.train import TrainConfig

if TYPE_CHECKING:
    from vflo.party.port import Federation


@dataclass(frozen=True, kw_only=True)
class VFedTransConfig(MethodConfig):
    """``hidden``: encoder widths before the latent, whose width is fixed by the federated
    representation (the number of singular vectors: VFedTrans's embedding constraint).
    ``target``: ``'u'`` the left singular vectors (as the original code), ``'us'`` U Σ.
    ``distill_weight``: weight of the L1 (``distill = 'mae'``) pull toward the target; ``reduction``
    as in APC-VFL (norms summed over dimensions, or averaged)."""

    hidden: tuple[int, ...] = (64,)
    activation: str = "selu"
    target: Literal["u", "us"] = "u"
    distill: DistillLoss = "mae"
    distill_weight: float = 1e-3
    reduction: Reduction = "sum"
    rank: int = 0
    fedsvd: FedSVDSettings = field(default_factory=FedSVDSettings)
    train: TrainConfig = field(default_factory=TrainConfig)
    classifier: EstimatorConfig = field(default_factory=EstimatorConfig)

    def __post_init__(self) -> None:
        if self.distill_weight < 0:
            raise ConfigError(f"distill_weight must be non-negative, got {self.distill_weight}")
        if self.rank < 0:
            raise ConfigError(f"rank must be 0 (all) or positive, got {self.rank}")


class VFedTrans(FedSVDProtocol):
    """VFedTrans: Huang et al., "Vertical Federated Knowledge Transfer via Representation
    Distillation for Healthcare Collaboration Networks" (2023), with FedSVD as its federated
    representation learner.

    1. FedSVD over the aligned rows of all parties gives the active party U (its rows of the
       joined matrix's left singular vectors) through a dealer and a server (five exchanges);
    2. the active party trains an autoencoder on all of its rows with
       L(x_i) = ||x_i - f(g(x_i))||² + w · 1[i aligned] · |u_i - g(x_i)|₁  (w = 1e-3);
    3. a classifier is fitted on g(X_A). Prediction needs the active party's features only.
    """

    name = "vfedtrans"
    Config = VFedTransConfig
    summary = "FedSVD representations of aligned rows distilled into a local autoencoder (dealer + server)"
    paper = "Huang et al. 2023, VFedTrans"
    quick: ClassVar[Mapping[str, Any]] = {"train": {"max_epochs": 2, "patience": 0, "batch_size": 64}}
    inference = "active_only"
    saves: ClassVar[Saves] = Saves(model=(
        Saved("latent", INTEGER, "its width", attr="latent_width_"),
        Saved("ae", autoencoder(lambda at: (*at.method.config.hidden, at.method.latent_width_),
                                lambda at: at.method.config.activation), "its autoencoder", attr="autoencoder_"),
        CLASSIFIER))
    # It scores from the active party alone and keeps no right factors: the SVD's exchange, without its scoring.

    config: VFedTransConfig

    def fit_representation(self, fed: Federation) -> tuple[np.ndarray, np.ndarray]:
        data = fed.data
        if data.n_features == 0:
            raise MethodError("vfedtrans needs features at the active party; it has none")
        passives = fed.names("passive")
        if not passives:
            raise MethodError("vfedtrans needs at least one passive party")
        alignment = fed.align(data.ids, passives)
        if len(alignment.ids) == 0:
            raise MethodError("vfedtrans needs rows shared by every party; none are")
        svd = self.federated_svd(fed, alignment, rank=self.config.rank)
        target = svd.U if self.config.target == "u" else svd.U * svd.S
        width = target.shape[1]
        targets = np.zeros((data.n_samples, width), dtype=np.float32)
        targets[data.positions(alignment.ids)] = target
        self.autoencoder_ = fit_autoencoder(
            data.X, (*self.config.hidden, width), activation=self.config.activation, train=self.config.train,
            generator=fed.torch_generator("vfedtrans-ae"), rng=fed.rng("vfedtrans-ae"), target=targets,
            target_mask=np.isin(data.ids, alignment.ids), weight=self.config.distill_weight,
            distill=self.config.distill, reduction=self.config.reduction,
        )
        self.n_aligned_ = len(alignment.ids)
        self.latent_width_ = width
        return data.ids, self.autoencoder_.encode(data.X)

    def represent(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return self.autoencoder_.encode(fed.serving.subset(ids).X)

    def summary_stats(self) -> dict[str, float]:
        return {**super().summary_stats(), **self.autoencoder_.history.summary()}
