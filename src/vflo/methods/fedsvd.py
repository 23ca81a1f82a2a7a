"""FedSVD (Chai et al. 2022) as a baseline: a classifier on the federated principal components.

The masked-SVD exchange itself (dealer, server, masks) lives in :mod:`vflo.methods.masked_svd`,
shared with VFedTrans and VFL-ASP; this module adds what is FedSVD's own: the coordinator's
side, every party's right factor for scoring, and the classifier on U Σ.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from vflo.align.plain import Alignment
from vflo.comm.message import Value
from vflo.errors import ConfigError, MethodError, ProtocolError
from vflo.methods.base import MethodConfig, State, need
from vflo.methods.masked_svd import FedSVDSettings, MaskedSVD, SVDResult
from vflo.methods.representation import RepresentationMethod
from vflo.nn.estimators import EstimatorConfig

if TYPE_CHECKING:
    from vflo.federation.coordinator import Federation
    from vflo.party.node import NodeContext

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


class FedSVD(FedSVDProtocol):
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

    def representation_state(self, fed: Federation) -> State:
        return {"V": fed.ctx.state["svd.V"], "passives": json.dumps(self.passives_), "rank": self.rank_}

    def load_representation_state(self, fed: Federation, state: Mapping[str, Value]) -> None:
        fed.ctx.state["svd.V"] = need(state, "V")
        self.passives_ = [str(p) for p in json.loads(str(need(state, "passives")))]
        self.rank_ = int(need(state, "rank"))

    def party_state(self, ctx: NodeContext) -> State:
        """Each party keeps its rows of V: it projects the rows to score."""
        V = ctx.state.get("svd.V")
        return {} if V is None else {"V": V}

    def load_party_state(self, ctx: NodeContext, state: Mapping[str, Value]) -> None:
        if "V" in state:
            ctx.state["svd.V"] = state["V"]

    def represent(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        V = fed.ctx.state["svd.V"]
        total: np.ndarray = fed.serving.subset(ids).X.astype(np.float64) @ V
        for p, reply in fed.score_together("svd.project", ids, self.passives_).items():
            part = reply.get("p")
            if not isinstance(part, np.ndarray) or part.shape != total.shape:
                raise ProtocolError(f"party {p!r} sent a projection of the wrong shape")
            total = total + part
        return total
