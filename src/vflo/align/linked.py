"""Alignment by a PSI library over its own link (:mod:`vflo.align.spu`): the messages that set each intersection
up and close it, and the coordinator's side.

Each partner runs one intersection with the active party. The result is the same :class:`Alignment` vflo's own
ECDH gives (:mod:`vflo.align.psi`), so a method cannot tell which ran; the ledger names it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vflo.align import spu
from vflo.align.plain import Aligned, Alignment
from vflo.comm.message import INT, STR, Fields, FieldSpec, Payload
from vflo.errors import ProtocolError, RefusedError

if TYPE_CHECKING:
    from vflo.federation.coordinator import Federation
    from vflo.party.node import NodeContext

logger = logging.getLogger(__name__)

OPEN_KIND, RESULT_KIND = "align.engine_open", "align.engine_result"
OPEN: dict[str, FieldSpec] = {"protocol": STR, "purpose": STR, "mode": STR, "port": INT}
RESULT: dict[str, FieldSpec] = {}
#: How long a party waits for the other side of one intersection.
TIMEOUT_S = 900.0


def _tls(files: tuple[str, str, str] | None) -> spu.LinkTLS | None:
    return spu.LinkTLS(*files) if files is not None else None


def _own_address(ctx: NodeContext) -> tuple[str, int]:
    host, port = ctx.policy.psi_link_address()
    return host, port or spu.free_port(host)


def handle_open(ctx: NodeContext, payload: Fields) -> Payload:
    """A partner: start its side of the intersection the coordinator asks for, if its own policy accepts the
    protocol; its link port and width."""
    protocol, mode = payload.text("protocol"), payload.text("mode")
    if protocol not in ctx.policy.psi_protocols:
        raise RefusedError(f"party {ctx.party!r} runs PSI by {list(ctx.policy.psi_protocols)} only ([policy] "
                           f"psi_protocols in its config), not {protocol!r}")
    if mode not in ("both", "active"):
        raise ProtocolError(f"{OPEN_KIND}: mode {mode!r} is neither 'both' nor 'active'")
    if problem := spu.missing():
        raise RefusedError(f"party {ctx.party!r} cannot run {protocol}: {problem}")
    rows = ctx.rows(payload.text("purpose"))
    prepared = spu.prepare(rows.ids)  # a repeated ID is refused here, before anything starts
    host, port = _own_address(ctx)
    side = spu.Side(rank=1, own=f"{host}:{port}", peer=f"{ctx.peer_host(ctx.sender)}:{payload.integer('port')}",
                    protocol=protocol, broadcast=mode == "both", tls=_tls(ctx.link_tls()), timeout_s=TIMEOUT_S)
    known = ctx.part(Aligned)
    known.held, known.source = None, (ctx.sender, payload.text("purpose"), mode)
    part = ctx.part(LinkedPart)
    part.running, part.ids, part.mode = spu.Running(lambda: side.run(prepared)), rows.ids, mode
    return {"port": port, "n_features": rows.n_features}


def handle_result(ctx: NodeContext, payload: Fields) -> Payload:
    """A partner: end its side; with ``mode = 'both'`` it now knows which of its people are shared."""
    part = ctx.part(LinkedPart)
    if part.running is None or part.ids is None:
        raise ProtocolError(f"{RESULT_KIND} without this party's {OPEN_KIND} before it")
    running, ids, mode = part.running, part.ids, part.mode
    part.running, part.ids = None, None
    mask = running.join(TIMEOUT_S)
    if mode == "both":
        ctx.part(Aligned).held = np.sort(ids[mask])
    return {"count": int(mask.sum())}


@dataclass
class LinkedPart:
    """The partner's side of the intersection under way (none between intersections): its thread, the IDs it runs
    on, and whether it learns the result."""

    running: spu.Running | None = None
    ids: np.ndarray | None = None
    mode: str = ""


def intersect(fed: Federation, ids: np.ndarray, parties: Sequence[str], *, protocol: str, purpose: str = "train",
              mode: str = "both") -> Alignment:
    """The subset of ``ids`` every party in ``parties`` holds: one intersection with each, by ``protocol``."""
    if not parties:
        return Alignment(ids=ids, asked=ids, held={}, widths={})
    held: dict[str, np.ndarray] = {}
    widths: dict[str, int] = {}
    host, _ = fed.ctx.policy.psi_link_address()
    tls = _tls(fed.ctx.link_tls())
    for party in parties:
        own_port = spu.free_port(host)
        # The partner dials the inbound relay, which hands its bytes to this party's side; this side dials the
        # outbound relay, which hands them to the partner: every byte of the link is counted here.
        started = time.perf_counter()
        # A repeated ID is refused before the partner starts.
        with (spu.prepare(ids, "the active party's") as prepared,
              spu.CountingRelay((host, own_port), host=host) as inbound):
            reply = fed.exchange(OPEN_KIND, {party: {"protocol": protocol, "purpose": purpose, "mode": mode,
                                                     "port": inbound.port}})[party]
            with spu.CountingRelay((fed.transport.peer_host(party), reply.integer("port"))) as outbound:
                side = spu.Side(rank=0, own=f"{host}:{own_port}", peer=f"127.0.0.1:{outbound.port}",
                                protocol=protocol, broadcast=mode == "both", tls=tls, timeout_s=TIMEOUT_S)
                held[party] = side.run(prepared)
                count = fed.exchange(RESULT_KIND, {party: {}})[party].integer("count")
        widths[party] = reply.integer("n_features")
        sent, received = outbound.out_bytes + inbound.in_bytes, outbound.in_bytes + inbound.out_bytes
        kind = f"align.engine.{protocol}"
        ledger = fed.transport.ledger
        request = ledger.record(round=fed.rounds, sender=fed.party, receiver=party, kind=kind,
                                direction="request", nbytes=sent)
        ledger.record(round=fed.rounds, sender=party, receiver=fed.party, kind=kind, direction="reply",
                      nbytes=received, reply_to=request.seq)
        logger.info("PSI (%s) with %s: %d of %d shared (it counts %d) in %.2f s; link %d bytes out, %d in",
                    protocol, party, int(held[party].sum()), len(ids), count, time.perf_counter() - started, sent,
                    received)
    keep = np.logical_and.reduce([held[p] for p in parties])
    return Alignment(ids=ids[keep], asked=ids, held=held, widths=widths)
