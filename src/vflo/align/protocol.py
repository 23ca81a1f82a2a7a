"""Alignment as a handler set: every node serves it, whatever method is installed.

Finding the shared IDs runs before a method's own exchanges (and some methods align again
mid-run), so a node serves these kinds next to the method's; they are handed to the node by
whoever builds it, like any other protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vflo.align import plain, psi
from vflo.comm.message import Fields, Payload
from vflo.party.handlers import HandlerSet, handles

if TYPE_CHECKING:
    from vflo.party.node import NodeContext


class AlignmentHandlers(HandlerSet):
    """Plain alignment (the coordinator's IDs in the clear) and ECDH private set intersection."""

    @handles(plain.KIND,
             served=("before or during a run; training rows: one set of IDs per asker a run; refused with [policy] "
                     "alignment = 'psi'"),
             senders=("coordinator", "delegate"), carries={"ids": "ids"},
             replies={"held": "membership", "n_features": "control"}, **plain.REQUEST)
    def _plain(self, ctx: NodeContext, payload: Fields) -> Payload:
        return plain.handle(ctx, payload)

    @handles(psi.KIND,
             served="before or during a run",
             senders=("coordinator",), carries={"points": "blinded ids", "salt": "control"},
             replies={"double": "blinded ids", "points": "blinded ids", "n_features": "control"}, **psi.REQUEST)
    def _psi(self, ctx: NodeContext, payload: Fields) -> Payload:
        return psi.handle(ctx, payload)

    @handles(psi.RESULT_KIND,
             served="after this party's own align.psi in the same run",
             senders=("coordinator",), carries={"matched": "membership"}, replies={"count": "control"},
             **psi.RESULT)
    def _psi_result(self, ctx: NodeContext, payload: Fields) -> Payload:
        return psi.handle_result(ctx, payload)


ALIGNMENT = AlignmentHandlers()
