"""The masked-SVD exchange: the SVD of vertically split rows through a dealer and a server.

One protocol, used by FedSVD, VFedTrans and VFL-ASP (Chai et al. 2022, "Practical Lossless
Federated Singular Vector Decomposition over Billion-Scale Data"; VFL-ASP's one-mask variant):

1. the requester asks the dealer for masks: one orthogonal m x m row mask P for the m shared rows
   and, with column masks, one orthogonal mask Q_i per party for its own columns. The dealer sends
   every other party its masks and returns the requester's in the reply;
2. each other party sends P X_i Q_i of its shared rows to the server (``svd.upload``);
3. the requester sends its own masked block with ``svd.solve``; the server joins the blocks,
   X' = P [X_1 .. X_K] diag(Q_1 .. Q_K) = P X Q, takes the thin SVD X' = U' Σ V'^T and returns U'
   and Σ (and, where asked, the requester's rows of V'), sending each other party its rows of V';
4. parties remove the masks: U = P^T U' (the requester), V_i = Q_i V'_i (each party).

Because P and Q are orthogonal, U Σ V^T is exactly the SVD of the joined matrix X; the server
sees only masked blocks and masked factors. Without column masks (VFL-ASP) Q_i = I. Masks are dense
or block-diagonal (:mod:`vflo.methods.masks`); blocks make time and bytes grow linearly with m
instead of m² and m³, at the cost of mixing rows only within blocks.

The requester may be the coordinator (FedSVD, VFedTrans) or a party inside a handler (VFL-ASP's
first hop); everything it needs back rides on replies, so no message returns to a party that is
still waiting on its own call.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from vflo.align.plain import SELECTOR, selected_ids
from vflo.comm.message import BOOL, COUNTS, IDS, INT, NAMES, ArraySpec, Fields, Payload, Reply
from vflo.dp import GaussianNoise
from vflo.errors import ConfigError, ProtocolError
from vflo.methods.masks import OrthogonalMask, block_layout
from vflo.methods.saved import ARRAY, Part, Saved
from vflo.party.handlers import HandlerSet, handles, reveals
from vflo.party.policy import PolicyError
from vflo.roles import PartyInfo

if TYPE_CHECKING:
    from vflo.party.context import NodeContext

SERVER, DEALER = "server", "dealer"
MATRIX = ArraySpec(("float64", "float32"), (None, None))
BLOCKS = ArraySpec(("float64", "float32"), (None, None, None))
MASKS = {"p_blocks": BLOCKS, "p_tail": MATRIX, "q_blocks": BLOCKS, "q_tail": MATRIX}


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
    """What the requester ends with: X = U diag(S) V^T over the shared rows, and its own rows of V."""

    U: np.ndarray
    S: np.ndarray
    V: np.ndarray | None


class Sender(Protocol):
    """Who drives the exchange: the coordinator's federation, or a party's context inside a handler."""

    def exchange(self, kind: str, payloads: Mapping[str, Payload]) -> dict[str, Reply]: ...


def check_deal(ctx: NodeContext, m: int, block: int | None, widths: Mapping[str, int]) -> None:
    """Refuse a deal larger than the dealer's policy allows: its rows, and the bytes of the masks it would draw
    (a row mask of m rows in blocks of b is m x b numbers; dense, m x m; each column mask width x width)."""
    policy = ctx.policy
    if m < 1 or any(w < 1 for w in widths.values()):
        raise ProtocolError(f"svd.deal: {m} rows and widths {dict(widths)}: a mask needs at least one of each")
    if m > policy.max_rows:
        raise PolicyError(f"party {ctx.party!r} deals masks of at most {policy.max_rows} rows ([policy] max_rows), "
                          f"not {m}; raise it there for larger data")
    numbers = mask_numbers(m, block) + sum(w * w for w in widths.values())
    if numbers * 8 > policy.max_mask_bytes:
        raise PolicyError(f"party {ctx.party!r} would draw {numbers * 8 / 2**30:.1f} GiB of masks for {m} rows "
                          f"(blocks of {block or m}), more than its [policy] max_mask_bytes = {policy.max_mask_bytes}; "
                          "use smaller blocks or raise the bound")


def mask_numbers(m: int, block: int | None) -> int:
    """How many numbers a row mask of ``m`` rows holds (as OrthogonalMask.random draws it)."""
    k, r = block_layout(m, block)
    return k * (block or 0) ** 2 + r * r


def _no_mask(dtype: str) -> OrthogonalMask:
    return OrthogonalMask(np.zeros((0, 0, 0), dtype=dtype), np.zeros((0, 0), dtype=dtype))


@dataclass
class SVDPart(Part):
    """A party's side of the masked SVD: its masks (``P`` rows, ``Q`` its columns, none: identity), its block of
    the right singular vectors (``V``, kept for scoring), whether it awaits that block, and at the server the
    masked blocks received so far."""

    P: OrthogonalMask | None = None
    Q: OrthogonalMask | None = None
    V: np.ndarray | None = None
    awaiting_right: bool = False
    blocks: dict[str, np.ndarray] = field(default_factory=dict)


#: What a party keeps of the SVD for scoring: its block of V.
V_BLOCK = Saved("V", ARRAY, "its block of the right singular vectors", optional=True)


class MaskedSVD(HandlerSet):
    """Handlers of the dealer, the server and the data parties, and the requester's side of the exchange."""

    @abstractmethod
    def svd_settings(self) -> FedSVDSettings:
        """Mask kind and wire precision, from the method's config."""

    def extra_parties(self, parties: tuple[PartyInfo, ...]) -> tuple[PartyInfo, ...]:
        return (PartyInfo(SERVER, "server"), PartyInfo(DEALER, "dealer"))

    # -- dealer -----------------------------------------------------------------------------------

    @reveals("row masks")
    @handles("svd.deal",
             served="dealer: during a run; masks of at most [policy] max_rows rows and max_mask_bytes",
             senders=("coordinator", "delegate"),
             replies={"p_blocks": "masks", "p_tail": "masks", "q_blocks": "masks", "q_tail": "masks"},
             m=INT, parties=NAMES, widths=COUNTS, column_masks=BOOL)
    def _deal(self, ctx: NodeContext, payload: Fields) -> Payload:
        """Draw P (and each party's Q_i), send every other party its masks, return the requester's."""
        settings = self.svd_settings()
        rng = ctx.rng("svd-masks")
        names, counts = payload.names("parties"), payload.array("widths").tolist()
        if len(names) != len(counts) or len(set(names)) != len(names):
            raise ProtocolError("svd.deal: one width per party, each party once")
        widths = dict(zip(names, (int(c) for c in counts), strict=True))
        if ctx.sender not in widths:
            raise ProtocolError(f"svd.deal: the requester {ctx.sender!r} is not among the parties it names")
        check_deal(ctx, payload.integer("m"), settings.row_block, widths if payload.flag("column_masks") else {})
        P = OrthogonalMask.random(payload.integer("m"), settings.row_block, rng, settings.dtype)
        own: Payload = {}
        for party, width in widths.items():
            Q = OrthogonalMask.random(width, None, rng, settings.dtype) if payload.flag("column_masks") else \
                _no_mask(settings.dtype)
            masks = {**P.to_payload("p"), **Q.to_payload("q")}
            if party == ctx.sender:
                own = masks
            else:
                ctx.send(party, "svd.masks", masks)
        return own

    # -- data parties -----------------------------------------------------------------------------

    @handles("svd.masks",
             served="data party: once a run, from the dealer; masks weaker than its policy refused",
             senders=("dealer",), carries=dict.fromkeys(MASKS, "masks"),
             p_blocks=BLOCKS, p_tail=MATRIX, q_blocks=BLOCKS, q_tail=MATRIX)
    def _masks(self, ctx: NodeContext, payload: Fields) -> Payload:
        if ctx.part(SVDPart).P is not None:  # one deal per run: later masks could only replace the ones in use
            raise ProtocolError(f"party {ctx.party!r} already holds its masks for this run; refused")
        keep_masks(ctx, payload)
        return {}

    def upload_noise(self) -> GaussianNoise | None:
        """Noise an uploading party adds to its rows before masking them (none unless the method asks)."""
        return None

    def masked_block(self, ctx: NodeContext, ids: np.ndarray, *, upload: bool = False) -> np.ndarray:
        """P X_i Q_i of this party's training rows ``ids`` (an ``upload``: noised first, if the method asks)."""
        P, Q = ctx.part(SVDPart).P, ctx.part(SVDPart).Q
        if not isinstance(P, OrthogonalMask):
            raise ProtocolError(f"party {ctx.party!r} was asked for its masked block before it got its masks")
        X = ctx.require_data().subset(ids).X.astype(np.float64)
        noise = self.upload_noise() if upload else None
        if noise is not None:
            X = noise.release_rows(X, ids, ctx.row_noise("svd-upload"), ctx.privacy, what="rows before masking")
        if isinstance(Q, OrthogonalMask):
            X = Q.right(X)
        masked: np.ndarray = P.left(X).astype(self.svd_settings().dtype)
        return masked

    @handles("svd.upload",
             served="after svd.masks and alignment",
             senders=("coordinator", "delegate"), carries={"selector": "membership"}, selector=SELECTOR)
    def _upload(self, ctx: NodeContext, payload: Fields) -> Payload:
        """Send P X_i Q_i of the shared rows (picked from this party's aligned list) to the server."""
        selector = payload.array("selector")
        ctx.send(SERVER, "svd.block", {"block": self.masked_block(ctx, selected_ids(ctx, selector), upload=True)})
        ctx.part(SVDPart).awaiting_right = True
        return {}

    # -- server -----------------------------------------------------------------------------------

    @handles("svd.block",
             served="server: during a run, from a data party",
             senders=("passive",), carries={"block": "masked features"}, block=MATRIX)
    def _block(self, ctx: NodeContext, payload: Fields) -> Payload:
        ctx.part(SVDPart).blocks[ctx.sender] = payload.array("block")
        return {}

    @reveals("factors")
    @handles("svd.solve",
             served="server: after the blocks of the same exchange",
             senders=("coordinator", "delegate"), carries={"block": "masked features"},
             replies={"u": "model", "s": "model", "v": "model"}, order=NAMES, rank=INT, right=BOOL, block=MATRIX)
    def _solve(self, ctx: NodeContext, payload: Fields) -> Payload:
        """Join the masked blocks (the requester's comes with the request), SVD, return U', Σ (and its V')."""
        order = payload.names("order")
        if not order or order[0] != ctx.sender:
            raise ProtocolError(f"svd.solve: the requester {ctx.sender!r} must come first in the party order")
        part = ctx.part(SVDPart)
        blocks, part.blocks = part.blocks, {}
        blocks[ctx.sender] = payload.array("block")
        missing = [p for p in order if p not in blocks]
        if missing:
            raise ProtocolError(f"the server has no masked block from {missing}")
        rows = {blocks[p].shape[0] for p in order}
        if len(rows) != 1:
            raise ProtocolError(f"the masked blocks have different numbers of rows: {sorted(rows)}")
        joined = np.hstack([np.asarray(blocks[p], dtype=np.float64) for p in order])
        rank = payload.integer("rank")
        if rank < 0 or rank > joined.shape[1]:
            raise ConfigError(f"{rank} singular vectors asked for (rank, or VFL-ASP's components), but the parties "
                              f"hold only {joined.shape[1]} columns together; ask for at most that many (0: all)")
        U, S, Vt = np.linalg.svd(joined, full_matrices=False)
        keep = min(rank or len(S), len(S))
        U, S, Vt = U[:, :keep], S[:keep], Vt[:keep]
        dtype = self.svd_settings().dtype
        own_v = np.zeros((0, 0), dtype=dtype)
        if payload.flag("right"):
            start = 0
            for party in order:
                width = blocks[party].shape[1]
                block = Vt[:, start : start + width].T.astype(dtype)
                start += width
                if party == ctx.sender:
                    own_v = block
                else:
                    ctx.send(party, "svd.right", {"v": block})
        return {"u": U.astype(dtype), "s": S.astype(np.float64), "v": own_v}

    # -- the requester ----------------------------------------------------------------------------

    def masked_svd(
        self, via: Sender, ctx: NodeContext, ids: np.ndarray, uploads: Mapping[str, np.ndarray], *,
        widths: Mapping[str, int] | None, rank: int = 0, right: bool = False,
    ) -> SVDResult:
        """The SVD of the requester's rows ``ids`` joined with each uploader's selected rows.

        ``uploads`` maps each other party to the selector of its shared rows (from alignment), in
        the order of ``ids``. ``widths`` (every party's column count, the requester's included)
        asks for column masks; ``None`` masks rows only.
        """
        me = ctx.party
        parties = [me, *uploads]
        column_masks = widths is not None
        counts = np.asarray([int(widths[p]) if widths is not None else 0 for p in parties], dtype=np.int64)
        masks = via.exchange("svd.deal", {DEALER: {"m": len(ids), "parties": np.asarray(parties, dtype=np.str_),
                                                   "widths": counts, "column_masks": column_masks}})[DEALER]
        keep_masks(ctx, masks)
        if uploads:
            via.exchange("svd.upload", {p: {"selector": sel} for p, sel in uploads.items()})
        reply = via.exchange("svd.solve", {SERVER: {"order": np.asarray(parties, dtype=np.str_), "rank": rank,
                                                   "right": right, "block": self.masked_block(ctx, ids)}})[SERVER]
        u, s, v = reply.array("u"), reply.array("s"), reply.array("v")
        if u.ndim != 2 or u.shape[0] != len(ids) or s.shape != (u.shape[1],):
            raise ProtocolError("the server's svd.solve reply is malformed")
        P = ctx.part(SVDPart).P
        assert P is not None
        V = unmask_right(ctx, v) if right else None
        if V is not None:
            ctx.part(SVDPart).V = V
        return SVDResult(U=P.left_t(u.astype(np.float64)), S=s, V=V)


class RightFactors(HandlerSet):
    """A party that keeps its block of the right singular vectors (FedSVD, which scores with them): it takes its
    block as the answer to its own upload, and projects rows to score on it. The other users of the masked SVD
    (VFedTrans, VFL-ASP) keep no right factors and so have neither handler."""

    @handles("svd.right",
             served="only as the answer to this party's own upload",
             senders=("server",), carries={"v": "model"}, v=MATRIX)
    def _right(self, ctx: NodeContext, payload: Fields) -> Payload:
        # Only the answer to this party's own upload: a V sent at any other time could replace the one in use.
        if not ctx.part(SVDPart).awaiting_right:
            raise ProtocolError(f"party {ctx.party!r} got svd.right without an upload awaiting it; refused")
        v = payload.array("v")
        part = ctx.part(SVDPart)
        part.V, part.awaiting_right = unmask_right(ctx, v), False
        return {}

    @reveals("scoring rows")
    @handles("svd.project",
             served="after svd.right: rows to score",
             carries={"ids": "ids"}, replies={"p": "outputs"}, ids=IDS)
    def _project(self, ctx: NodeContext, payload: Fields) -> Payload:
        """x_i V_i for rows to score: this party's share of U Σ for a new row."""
        ids = payload.array("ids")
        V = ctx.part(SVDPart).V
        if not isinstance(V, np.ndarray):
            raise ProtocolError(f"party {ctx.party!r} has no V to project with")
        return {"p": ctx.rows("serve").subset(ids).X.astype(np.float64) @ V}

def keep_masks(ctx: NodeContext, payload: Payload) -> None:
    """Store the row mask P and, where one was dealt, the column mask Q (absent: Q = I)."""
    try:
        P = OrthogonalMask.from_payload(payload, "p")
        Q = OrthogonalMask.from_payload(payload, "q")
    except KeyError as exc:
        raise ProtocolError(f"the dealer's masks lack {exc}") from exc
    # The party's own policy says how strong a mask must be (vflo.party.policy): blocks of at least
    # min_mask_block rows, every row and column mixing at least min_mask_mixing inputs.
    block, mixing = ctx.policy.min_mask_block, ctx.policy.min_mask_mixing
    P.check_strength(f"party {ctx.party!r}: the row mask from {ctx.sender!r}", min_block=block, min_mixing=mixing)
    Q.check_strength(f"party {ctx.party!r}: the column mask from {ctx.sender!r}", min_block=block,
                     min_mixing=mixing)
    part = ctx.part(SVDPart)
    part.P, part.Q = P, (Q if Q.size else None)


def unmask_right(ctx: NodeContext, v: np.ndarray) -> np.ndarray:
    """V_i = Q_i V'_i: this party's rows of the right singular vectors."""
    Q = ctx.part(SVDPart).Q
    v64 = v.astype(np.float64)
    if Q is None:
        return v64
    unmasked: np.ndarray = Q.left(v64)
    return unmasked
