"""FedSVD (Chai et al. 2022) as a baseline: a classifier on the federated principal components.

The masked-SVD exchange itself (dealer, server, masks) lives in :mod:`vflo.methods.masked_svd`,
shared with VFedTrans and VFL-ASP; this module adds what is FedSVD's own: the coordinator's
side, every party's right factor for scoring, and the classifier on U Σ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from vflo.errors import ConfigError, MethodError, ProtocolError
from vflo.methods.base import MethodConfig
from vflo.methods.masked_svd import V_BLOCK, FedSVDSettings, MaskedSVD, RightFactors, SVDPart, SVDResult
from vflo.methods.representation import CLASSIFIER, RepresentationMethod
from vflo.methods.saved import ARRAY, INTEGER, PARTY_NAMES, Saved, Saves
from vflo.nn.estimators import EstimatorConfig
from vflo.party.port import Alignment

if TYPE_CHECKING:
    from vflo.party.port import Federation

__all__ = ["FedSVD", "FedSVDConfig", "FedSVDProtocol", "FedSVDSettings"]


class FedSVDProtocol(MaskedSVD, RepresentationMethod):
    """The masked SVD with a mask per party's columns, driven by the coordinator over its aligned rows."""

    def svd_settings(self) -> FedSVDSettings:
        settings = getattr(self.config, "fedsvd", None)
        assert isinstance(settings, FedSVDSettings)
        return settings

    def federated_svd(self, fed: Federation, alignment: Alignment, *, rank: int = 0, right: bool = False) -> SVDResult:
        """Run the exchange over the aligned rows; the active party's block rides on the solve request."""
        passives = list(alignment.held)
        widths = {fed.party: fed.data.n_features, **{p: alignment.widths[p] for p in passives}}
        return self.masked_svd(fed, fed.ctx, alignment.ids, {p: alignment.selector(p) for p in passives},
                               widths=widths, rank=rank, right=right)


@dataclass(frozen=True, kw_only=True)
class FedSVDConfig(MethodConfig):
    """``rank``: singular vectors kept (0 = all). The classifier sees U Σ of the aligned rows."""

    rank: int = 0
    fedsvd: FedSVDSettings = field(default_factory=FedSVDSettings)
    classifier: EstimatorConfig = field(default_factory=EstimatorConfig)

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ConfigError(f"rank must be 0 (all) or positive, got {self.rank}")


class FedSVD(RightFactors, FedSVDProtocol):
    """FedSVD (Chai et al. 2022, "Practical Lossless Federated Singular Vector Decomposition over
    Billion-Scale Data") as a baseline: a classifier on the federated principal components.

    The aligned rows' joined features factor as X = U Σ V^T without any party revealing X_i; the
    classifier is trained on U Σ = X V (min_θ Σ_i ℓ(f_θ(u_i Σ), y_i)). A new row is scored
    collaboratively: each party sends x_i V_i and the active party sums them.
    """

    name = "fedsvd"
    Config = FedSVDConfig
    summary = "classifier on federated SVD components of the aligned rows (collaborative inference)"
    paper = "Chai et al. 2022, FedSVD"
    inference = "collaborative"
    # Every party keeps its block of V: it projects the rows to score.
    saves: ClassVar[Saves] = Saves(
        model=(Saved("rank", INTEGER, "singular vectors kept"), Saved("passives", PARTY_NAMES, "who projects"),
               CLASSIFIER),
        part=SVDPart, parts={"active": (Saved("V", ARRAY, "its block of the right singular vectors"),),
                             "passive": (V_BLOCK,)})

    config: FedSVDConfig

    def fit_representation(self, fed: Federation) -> tuple[np.ndarray, np.ndarray]:
        passives = fed.names("passive")
        alignment = fed.align(fed.data.ids, passives)
        if len(alignment.ids) == 0:
            raise MethodError("fedsvd needs rows shared by every party; none are")
        result = self.federated_svd(fed, alignment, rank=self.config.rank, right=True)
        self.passives_ = passives
        self.rank_ = len(result.S)
        return alignment.ids, result.U * result.S

    def represent(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        V = fed.ctx.part(SVDPart).V
        assert V is not None
        total: np.ndarray = fed.serving.subset(ids).X.astype(np.float64) @ V
        for p, reply in fed.score_together("svd.project", ids, self.passives_).items():
            part = reply.array("p")
            if part.shape != total.shape:
                raise ProtocolError(f"party {p!r} sent a projection of the wrong shape")
            total = total + part
        return total
