"""vflo explore over blinded IDs, a partner's side: which of its people each of the label holder's encrypted
targets belongs to, found without the label holder learning who (``[policy] explore_shared = "count"``, the
default; :mod:`vflo.party.explore` holds the rest of the partner's side).

The label holder sends H(x)^a for every person it holds, in a secret order of its own (``explore.points``); this
party raises them to a fresh key b of its own and keeps them, and replies with H(y)^b for each of its own people,
in a secret order of its own. The label holder raises those to a and sends them back in that order, with its
encrypted targets in its own (``explore.blind_sums``). H(y)^(ba) = H(x)^(ab) exactly when x = y (X25519 over a
salted hash, as vflo's PSI, :mod:`vflo.align.psi`), so this party knows which of its people each target belongs
to, bins the shared ones and sums (:func:`vflo.party.explore.binned`): it learns which of its people the label
holder holds, the label holder only their count and the per-bin sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from vflo.align.psi import POINTS, answer, new_key, shuffled, unique_names
from vflo.comm.message import STR, ArraySpec, Fields, Payload
from vflo.errors import ProtocolError
from vflo.party.explore import (
    BLIND_KIND,
    BLOB,
    POINTS_KIND,
    PUBLIC_KEY,
    SUMS_REPLY,
    ExploreHandlers,
    answering,
    binned,
    encrypted_labels,
    take_answer,
)
from vflo.party.handlers import HandlerSet, handles
from vflo.party.policy import PolicyError

if TYPE_CHECKING:
    from vflo.party.context import NodeContext


@dataclass
class Blinded:
    """Per peer, between its explore.points and its explore.blind_sums: this party's IDs in the secret order their
    blinded points went in, and the peer's points raised to this party's key (in the peer's order)."""

    by_sender: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def positions(queries: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """For each row of ``queries`` (n, 32), its row in ``pool`` (m, 32), -1 where it is not there."""
    as_rows = np.dtype((np.void, 32))
    keys = np.ascontiguousarray(pool).view(as_rows).ravel()
    asked = np.ascontiguousarray(queries).view(as_rows).ravel()
    out = np.full(len(asked), -1, dtype=np.int64)
    if not len(keys) or not len(asked):
        return out
    order = np.argsort(keys, kind="stable")
    at = np.minimum(np.searchsorted(keys[order], asked), len(keys) - 1)
    hit = keys[order][at] == asked
    out[hit] = order[at[hit]]
    return out


class BlindJoinHandlers(HandlerSet):
    """What every node serves for vflo explore over blinded IDs, refused unless its policy says ``explore = true``."""

    @handles(POINTS_KIND,
             served=("before this peer's explore.blind_sums, where [policy] explore = true: the label holder's people "
                     "blinded under its key, raised to a fresh key of this party's and kept; this party's own IDs "
                     "blinded under that key, in a secret order"),
             carries={"salt": "control", "points": "blinded ids"}, replies={"points": "blinded ids"},
             salt=ArraySpec(("uint8",), (32,)), points=POINTS)
    def _points(self, ctx: NodeContext, payload: Fields) -> Payload:
        answering(ctx)
        data = ctx.require_data()
        order = shuffled(len(data.ids))
        double, own = answer(new_key(), unique_names(data.ids).take(pa.array(order)), payload.array("points"),
                             payload.array("salt").tobytes())
        ctx.part(Blinded).by_sender[ctx.sender] = (np.asarray(data.ids)[order], double)
        return {"points": own}

    @handles(BLIND_KIND,
             served=("after this peer's explore.points, where [policy] explore = true: once per request, its encrypted "
                     "targets summed per bin of this party's own over the people both hold, found by the blinded "
                     "points; at least min_bin_rows of them"),
             carries={"double": "blinded ids", "labels": "ciphertexts"}, replies={**SUMS_REPLY, "shared": "control"},
             double=POINTS, scheme=STR, public_key=PUBLIC_KEY, labels=BLOB)
    def _blind_sums(self, ctx: NodeContext, payload: Fields) -> Payload:
        policy = answering(ctx)
        held = ctx.part(Blinded).by_sender.pop(ctx.sender, None)
        if held is None:
            raise ProtocolError(f"{BLIND_KIND}: party {ctx.info.name!r} has no {POINTS_KIND} of {ctx.sender!r} to "
                                f"answer it by; send {POINTS_KIND} first")
        ids, theirs = held
        double = payload.array("double")
        if double.shape != (len(ids), 32):
            raise ProtocolError(f"{BLIND_KIND}: {len(double)} points back for the {len(ids)} party "
                                f"{ctx.info.name!r} sent, in its order")
        take_answer(ctx)
        at = positions(theirs, double)  # per person the label holder sent, the place of this party's row, or -1
        shared = np.flatnonzero(at >= 0)
        if len(shared) < policy.min_bin_rows:
            raise PolicyError(f"party {ctx.info.name!r} shares {len(shared)} people with {ctx.sender!r}, fewer than "
                              f"its min_bin_rows ({policy.min_bin_rows}): it releases no sums over so few")
        ops, labels = encrypted_labels(payload, len(theirs), BLIND_KIND)
        data = ctx.require_data()
        mine = ids[at[shared]]
        ctx.named = np.sort(mine)  # who of its own the request concerned, for its record of who asked
        reply = binned(ctx, np.asarray(data.subset(mine).X, dtype=np.float64), ops, labels, shared, len(theirs))
        return {**reply, "shared": len(shared)}


#: The handler sets every node serves for vflo explore.
EXPLORE: tuple[HandlerSet, ...] = (ExploreHandlers(), BlindJoinHandlers())
