"""Alignment as a handler set: every node serves it, whatever method is installed.

Finding the shared IDs runs before a method's own exchanges (and some methods align again
mid-run), so a node serves these kinds next to the method's; they are handed to the node by
whoever builds it, like any other protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vflo.align import kept, linked, plain, psi, stream, unbalanced
from vflo.comm.message import Fields, Payload
from vflo.party.handlers import HandlerSet, handles

if TYPE_CHECKING:
    from vflo.party.node import NodeContext


class AlignmentHandlers(HandlerSet):
    """Plain alignment (the coordinator's IDs in the clear), vflo's ECDH private set intersection, the PSI
    library's protocols (set up and closed by messages, run over its own link), and kept intersections (recorded
    by each party, reused while neither side's people changed)."""

    @handles(plain.KIND,
             served=("before or during a run; training rows: one set of IDs per asker a run; refused unless "
                     "[policy] alignment = 'plain'"),
             senders=("coordinator", "delegate"), carries={"ids": "ids"},
             replies={"held": "membership", "n_features": "control"}, **plain.REQUEST)
    def _plain(self, ctx: NodeContext, payload: Fields) -> Payload:
        return plain.handle(ctx, payload)

    @handles(psi.KIND,
             served="before or during a run",
             senders=("coordinator", "delegate"), carries={"points": "blinded ids", "salt": "control"},
             replies={"double": "blinded ids", "points": "blinded ids", "n_features": "control"}, **psi.REQUEST)
    def _psi(self, ctx: NodeContext, payload: Fields) -> Payload:
        return psi.handle(ctx, payload)

    @handles(psi.RESULT_KIND,
             served="after this party's own align.psi in the same run",
             senders=("coordinator", "delegate"), carries={"matched": "membership"}, replies={"count": "control"},
             **psi.RESULT)
    def _psi_result(self, ctx: NodeContext, payload: Fields) -> Payload:
        return psi.handle_result(ctx, payload)

    @handles(linked.OPEN_KIND,
             served="before or during a run, with [policy] psi_protocols naming the protocol: starts this party's "
                    "side of one intersection over the PSI library's own link",
             senders=("coordinator",), carries={}, replies={"port": "control", "n_features": "control"},
             **linked.OPEN)
    def _engine_open(self, ctx: NodeContext, payload: Fields) -> Payload:
        return linked.handle_open(ctx, payload)

    @handles(linked.RESULT_KIND,
             served="after this party's own align.engine_open, align.ub_prepare or align.ub_open: ends its side",
             senders=("coordinator",), carries={}, replies={"count": "control"}, **linked.RESULT)
    def _engine_result(self, ctx: NodeContext, payload: Fields) -> Payload:
        return linked.handle_result(ctx, payload)

    @handles(unbalanced.PREPARE_KIND,
             served="before or during a run, with [policy] psi_protocols naming 'unbalanced' and an alignments "
                    "folder: starts this party's offline stage of unbalanced PSI (its IDs evaluated under its own "
                    "key, sent over the PSI library's link)",
             senders=("coordinator",), carries={}, replies={"port": "control", "token": "control",
                                                            "n_features": "control"}, **unbalanced.PREPARE)
    def _ub_prepare(self, ctx: NodeContext, payload: Fields) -> Payload:
        return unbalanced.handle_prepare(ctx, payload)

    @handles(unbalanced.ONLINE_KIND,
             served="before or during a run: one unbalanced intersection against a preparation this party made for "
                    "the sender, only while the people it holds are those it was made on",
             senders=("coordinator",), carries={}, replies={"port": "control", "why": "control",
                                                            "n_features": "control"}, **unbalanced.ONLINE)
    def _ub_online(self, ctx: NodeContext, payload: Fields) -> Payload:
        return unbalanced.handle_online(ctx, payload)

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


ALIGNMENT = AlignmentHandlers()
