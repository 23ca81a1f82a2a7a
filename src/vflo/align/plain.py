"""Plain alignment: the coordinator sends IDs, each party says which it holds.

This reveals the coordinator's IDs to the other parties, which is acceptable in
simulation (every party is the experimenter) and for IDs that are not sensitive.
Private set intersection replaces it where that is not acceptable. The exchange
crosses the transport like any other, so its bytes are in the ledger under
``align.plain``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from vflo.comm.message import IDS, STR, ArraySpec, FieldSpec, Payload, check_payload
from vflo.errors import ProtocolError

if TYPE_CHECKING:
    from vflo.federation.coordinator import Federation
    from vflo.federation.node import NodeContext

KIND = "align.plain"
REQUEST: dict[str, FieldSpec] = {"ids": IDS, "split": STR}
REPLY: dict[str, FieldSpec] = {"held": ArraySpec(("bool",), (None,))}


def handle(ctx: NodeContext, payload: Payload) -> Payload:
    """Party side: a mask over the requested IDs of those this party holds in ``split``."""
    ids = payload["ids"]
    assert isinstance(ids, np.ndarray)
    return {"held": ctx.rows(str(payload["split"])).contains(ids)}


def intersect(fed: Federation, ids: np.ndarray, parties: Sequence[str], *, split: str = "train") -> np.ndarray:
    """The subset of ``ids`` (order kept) that every party in ``parties`` holds; one round."""
    if not parties:
        return ids
    replies = fed.exchange(KIND, {p: {"ids": ids, "split": split} for p in parties})
    keep = np.ones(len(ids), dtype=bool)
    for party, reply in replies.items():
        check_payload(KIND, reply, REPLY)
        held = reply["held"]
        assert isinstance(held, np.ndarray)
        if held.shape != (len(ids),):
            raise ProtocolError(f"party {party!r} answered {KIND} with {held.shape[0]} flags for {len(ids)} IDs")
        keep &= held
    return ids[keep]
