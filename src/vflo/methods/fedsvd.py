"""FedSVD (Chai et al. 2022): SVD of vertically split data through a semi-honest server.

The protocol, used by the ``fedsvd`` method and by VFedTrans:

1. a trusted dealer draws one orthogonal m x m mask P (rows) and one orthogonal mask Q_i per
   party (its own columns) and hands each party P and its Q_i;
2. each party sends P X_i Q_i of its aligned rows to the server;
3. the server joins the blocks, X' = P [X_1 .. X_K] diag(Q_1 .. Q_K) = P X Q, and takes the
   thin SVD X' = U' Σ V'^T; it returns U' and Σ to the active party and, where asked, each
   party's rows of V' to that party;
4. parties remove the masks: U = P^T U' (active party), V_i = Q_i V'_i (each party).

Because P and Q are orthogonal, U Σ V^T is exactly the SVD of the joined matrix X; the server
sees only masked blocks and masked factors. Masks are dense or block-diagonal
(:mod:`vflo.methods.masks`); blocks make time and bytes grow linearly with m instead of m²
and m³, at the cost of mixing rows only within blocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from vflo.align.plain import SELECTOR, Alignment, selected_ids
from vflo.comm.message import BOOL, IDS, INT, STR, ArraySpec, Payload
from vflo.errors import ConfigError, MethodError, ProtocolError
from vflo.federation.coordinator import Federation
from vflo.federation.node import NodeContext
from vflo.methods.base import MethodConfig, handles
from vflo.methods.masks import OrthogonalMask
from vflo.methods.representation import RepresentationMethod
from vflo.nn.estimators import EstimatorConfig
from vflo.roles import PartyInfo

SERVER, DEALER = "server", "dealer"
MATRIX = ArraySpec(("float64", "float32"), (None, None))
BLOCKS = ArraySpec(("float64", "float32"), (None, None, None))


@dataclass(frozen=True, kw_only=True)
class FedSVDSettings:
    """``mask = 'block'`` uses block-diagonal masks of ``block_size`` rows; ``'dense'`` one full m x m mask.
    ``dtype`` is the precision of masks and masked data on the wire."""

    mask: Literal["dense", "block"] = "block"
    block_size: int = 1000
    dtype: Literal["float64", "float32"] = "float64"

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"fedsvd.block_size must be positive, got {self.block_size}")

    @property
    def row_block(self) -> int | None:
        return None if self.mask == "dense" else self.block_size


@dataclass(frozen=True)
class SVDResult:
    """The unmasked left factor at the active party: X[ids] = U diag(S) V^T."""

    ids: np.ndarray
    U: np.ndarray
    S: np.ndarray


class FedSVDProtocol(RepresentationMethod):
    """Handlers and coordinator steps of FedSVD, shared by every method that runs it."""

    def fedsvd_settings(self) -> FedSVDSettings:
        settings = getattr(self.config, "fedsvd", None)
        assert isinstance(settings, FedSVDSettings)
        return settings

    def extra_parties(self, parties: tuple[PartyInfo, ...]) -> tuple[PartyInfo, ...]:
        return (PartyInfo(SERVER, "server"), PartyInfo(DEALER, "dealer"))

    # -- dealer -----------------------------------------------------------------------------------

    @handles("fedsvd.deal", m=INT, parties=STR)
    def _deal(self, ctx: NodeContext, payload: Payload) -> Payload:
        """Draw P and each party's Q_i, and hand them out (one message per party)."""
        settings = self.fedsvd_settings()
        dtype = settings.dtype
        rng = ctx.rng("fedsvd-masks")
        m = int(payload["m"])
        try:
            widths = {str(k): int(v) for k, v in json.loads(str(payload["parties"])).items()}
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise ProtocolError(f"fedsvd.deal: malformed party widths: {exc}") from exc
        P = OrthogonalMask.random(m, settings.row_block, rng, dtype)
        for party, width in widths.items():
            Q = OrthogonalMask.random(width, None, rng, dtype)
            ctx.send(party, "fedsvd.masks", {**P.to_payload("p"), **Q.to_payload("q")})
        return {}

    # -- data parties -----------------------------------------------------------------------------

    @handles("fedsvd.masks", p_blocks=BLOCKS, p_tail=MATRIX, q_blocks=BLOCKS, q_tail=MATRIX)
    def _masks(self, ctx: NodeContext, payload: Payload) -> Payload:
        ctx.state["fedsvd.P"] = OrthogonalMask.from_payload(payload, "p")
        ctx.state["fedsvd.Q"] = OrthogonalMask.from_payload(payload, "q")
        return {}

    def _masked_block(self, ctx: NodeContext, ids: np.ndarray) -> np.ndarray:
        P, Q = ctx.state.get("fedsvd.P"), ctx.state.get("fedsvd.Q")
        if not (isinstance(P, OrthogonalMask) and isinstance(Q, OrthogonalMask)):
            raise ProtocolError(f"party {ctx.party!r} was asked for its masked block before it got its masks")
        X = ctx.require_data().subset(ids).X.astype(np.float64)
        masked: np.ndarray = P.left(Q.right(X)).astype(self.fedsvd_settings().dtype)
        return masked

    @handles("fedsvd.upload", selector=SELECTOR)
    def _upload(self, ctx: NodeContext, payload: Payload) -> Payload:
        """Send P X_i Q_i of the aligned rows to the server."""
        selector = payload["selector"]
        assert isinstance(selector, np.ndarray)
        block = self._masked_block(ctx, selected_ids(ctx, selector))
        ctx.send(SERVER, "fedsvd.block", {"block": block})
        return {}

    @handles("fedsvd.right", v=MATRIX)
    def _right(self, ctx: NodeContext, payload: Payload) -> Payload:
        """Unmask this party's rows of V: V_i = Q_i V'_i."""
        Q = ctx.state["fedsvd.Q"]
        v = payload["v"]
        assert isinstance(Q, OrthogonalMask) and isinstance(v, np.ndarray)
        ctx.state["fedsvd.V"] = Q.left(v.astype(np.float64))
        return {}

    @handles("fedsvd.project", ids=IDS)
    def _project(self, ctx: NodeContext, payload: Payload) -> Payload:
        """x_i V_i for rows to score: this party's share of U Σ for a new row."""
        ids = payload["ids"]
        V = ctx.state.get("fedsvd.V")
        assert isinstance(ids, np.ndarray)
        if not isinstance(V, np.ndarray):
            raise ProtocolError(f"party {ctx.party!r} has no V to project with")
        return {"p": ctx.rows("serve").subset(ids).X.astype(np.float64) @ V}

    # -- server -----------------------------------------------------------------------------------

    @handles("fedsvd.block", block=MATRIX)
    def _block(self, ctx: NodeContext, payload: Payload) -> Payload:
        ctx.state.setdefault("fedsvd.blocks", {})[ctx.sender] = payload["block"]
        return {}

    @handles("fedsvd.solve", order=STR, rank=INT, right=BOOL, block=MATRIX)
    def _solve(self, ctx: NodeContext, payload: Payload) -> Payload:
        """Join the masked blocks (the requester's comes with the request), SVD, return U' and Σ."""
        order = json.loads(str(payload["order"]))
        blocks: dict[str, np.ndarray] = ctx.state.pop("fedsvd.blocks", {})
        blocks[order[0]] = payload["block"]  # type: ignore[assignment]
        missing = [p for p in order if p not in blocks]
        if missing:
            raise ProtocolError(f"the server has no masked block from {missing}")
        joined = np.hstack([np.asarray(blocks[p], dtype=np.float64) for p in order])
        U, S, Vt = np.linalg.svd(joined, full_matrices=False)
        rank = min(int(payload["rank"]) or len(S), len(S))
        U, S, Vt = U[:, :rank], S[:rank], Vt[:rank]
        dtype = self.fedsvd_settings().dtype
        if payload["right"]:
            start = 0
            for party in order:
                width = blocks[party].shape[1]
                ctx.send(party, "fedsvd.right", {"v": Vt[:, start : start + width].T.astype(dtype)})
                start += width
        return {"u": U.astype(dtype), "s": S.astype(np.float64)}

    # -- coordinator ------------------------------------------------------------------------------

    def federated_svd(self, fed: Federation, alignment: Alignment, *, rank: int = 0, right: bool = False) -> SVDResult:
        """Run the protocol over the aligned rows; the active party's block rides on the solve request."""
        passives = list(alignment.held)
        m = len(alignment.ids)
        widths = {fed.party: fed.data.n_features, **{p: alignment.widths[p] for p in passives}}
        fed.request(DEALER, "fedsvd.deal", {"m": m, "parties": json.dumps(widths)})
        if passives:
            fed.exchange("fedsvd.upload", {p: {"selector": alignment.selector(p)} for p in passives})
        own_block = self._masked_block(fed.ctx, alignment.ids)
        order = [fed.party, *passives]
        reply = fed.request(SERVER, "fedsvd.solve", {"order": json.dumps(order), "rank": rank, "right": right,
                                                     "block": own_block})
        u, s = reply.get("u"), reply.get("s")
        if not (isinstance(u, np.ndarray) and isinstance(s, np.ndarray) and u.shape[0] == m):
            raise ProtocolError("the server's fedsvd.solve reply is malformed")
        P = fed.ctx.state["fedsvd.P"]
        assert isinstance(P, OrthogonalMask)
        return SVDResult(ids=alignment.ids, U=P.left_t(u.astype(np.float64)), S=s)


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
        return result.ids, result.U * result.S

    def represent(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        V = fed.ctx.state["fedsvd.V"]
        total: np.ndarray = fed.serving.subset(ids).X.astype(np.float64) @ V
        for p, reply in fed.score_together("fedsvd.project", ids, self.passives_).items():
            part = reply.get("p")
            if not isinstance(part, np.ndarray) or part.shape != total.shape:
                raise ProtocolError(f"party {p!r} sent a projection of the wrong shape")
            total = total + part
        return total
