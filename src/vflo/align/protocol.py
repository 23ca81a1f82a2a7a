"""Alignment as a handler set: every node serves it, whatever method is installed.

Finding the shared IDs runs before a method's own exchanges (and some methods align again
mid-run), so a node serves these kinds next to the method's; they are handed to the node by
whoever builds it, like any other protocol. Each engine's own kinds come from its module, through
:mod:`vflo.align.engines`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vflo.align import engines, kept, plain, stream
from vflo.comm.message import Fields, Payload
from vflo.party.handlers import HandlerSet, handles

if TYPE_CHECKING:
    from vflo.party.context import NodeContext


class AlignmentHandlers(HandlerSet):
    """What every node serves whatever the engine: plain alignment (the coordinator's IDs in the clear), kept
    intersections (recorded by each party, reused while neither side's people changed) and vflo's ECDH streamed
    from a party's own file."""

    @handles(plain.KIND,
             served=("before or during a run; training rows: one set of IDs per asker a run; refused unless "
                     "[policy] alignment = 'plain'"),
             senders=("coordinator", "delegate"), carries={"ids": "ids"},
             replies={"held": "membership", "n_features": "control"}, **plain.REQUEST)
    def _plain(self, ctx: NodeContext, payload: Fields) -> Payload:
        return plain.handle(ctx, payload)

    @handles(kept.KEEP_KIND,
             served="right after this party's own private set intersection with the sender, for the same rows and "
                    "mode: records its side in its own folder ([alignments] of its config)",
             senders=("coordinator",), carries={}, replies={"kept": "control", "why": "control"}, **kept.KEEP)
    def _keep(self, ctx: NodeContext, payload: Fields) -> Payload:
        return kept.handle_keep(ctx, payload)

    @handles(kept.REUSE_KIND,
             served="before or during a run: answered from a record this party kept with the sender, only while the "
                    "people it holds for those rows are those the record was made on",
             senders=("coordinator",), carries={"pick": "membership"},
             replies={"reused": "control", "why": "control", "n_features": "control", "count": "control"},
             **kept.REUSE)
    def _reuse(self, ctx: NodeContext, payload: Fields) -> Payload:
        return kept.handle_reuse(ctx, payload)

    @handles(stream.OPEN_KIND,
             served="before or during a run, with an alignments folder and a file for the rows: starts an "
                    "intersection of this party's own file with the sender's, streamed a bucket at a time",
             senders=("coordinator",), carries={}, replies={"rows": "control"}, **stream.OPEN)
    def _stream_open(self, ctx: NodeContext, payload: Fields) -> Payload:
        return stream.handle_open(ctx, payload)

    @handles(stream.SPLIT_KIND,
             served="right after this party's own align.stream_open from the sender: spills its IDs into buckets",
             senders=("coordinator",), carries={"salt": "control"}, replies={"rows": "control"}, **stream.SPLIT)
    def _stream_split(self, ctx: NodeContext, payload: Fields) -> Payload:
        return stream.handle_split(ctx, payload)

    @handles(stream.BUCKET_KIND,
             served="after this party's own align.stream_split with the sender: each bucket once",
             senders=("coordinator",), carries={"points": "blinded ids", "matched": "membership"},
             replies={"double": "blinded ids", "points": "blinded ids"}, **stream.BUCKET)
    def _stream_bucket(self, ctx: NodeContext, payload: Fields) -> Payload:
        return stream.handle_bucket(ctx, payload)

    @handles(stream.CLOSE_KIND,
             served="after every bucket of this party's streamed intersection with the sender: writes its record",
             senders=("coordinator",), carries={"matched": "membership"}, replies={"count": "control"},
             **stream.CLOSE)
    def _stream_close(self, ctx: NodeContext, payload: Fields) -> Payload:
        return stream.handle_close(ctx, payload)


#: Every alignment protocol a node serves: the common ones, and each registered engine's party side.
ALIGNMENT: tuple[HandlerSet, ...] = (AlignmentHandlers(), *engines.handler_sets())
