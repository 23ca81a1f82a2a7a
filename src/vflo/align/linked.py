"""Alignment by a PSI library over its own link (:mod:`vflo.align.spu`): the messages that set each intersection
up and close it, and the coordinator's side.

Each partner runs one intersection with the active party. The result is the same :class:`Alignment` vflo's own
ECDH gives (:mod:`vflo.align.psi`), so a method cannot tell which ran; the ledger names it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vflo.align import spu
from vflo.align.engine import Engine
from vflo.align.link_relay import LinkRelays, LinkTLS
from vflo.align.plain import Aligned
from vflo.comm.message import INT, STR, Fields, FieldSpec, Payload, Reply
from vflo.data.order import sorted_ids
from vflo.errors import ProtocolError, RefusedError
from vflo.party.handlers import HandlerSet, handles
from vflo.party.port import Alignment

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Aligning

logger = logging.getLogger(__name__)

OPEN_KIND, RESULT_KIND = "align.engine_open", "align.engine_result"
OPEN: dict[str, FieldSpec] = {"protocol": STR, "purpose": STR, "mode": STR, "port": INT}
RESULT: dict[str, FieldSpec] = {}
#: How long a party waits for the other side of one intersection.
TIMEOUT_S = 900.0
#: How long the active party waits for the partner's side to listen before starting its own regardless (which
#: then waits for the partner as long as :data:`TIMEOUT_S` allows).
START_WAIT_S = 60.0


def _tls(files: tuple[str, str, str] | None) -> LinkTLS | None:
    return LinkTLS(*files) if files is not None else None


def closing(relays: LinkRelays, work: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    """``work``, then the side's relays closed (whatever it gave or raised)."""

    def run() -> np.ndarray:
        with relays:
            return work()

    return run


def consent(ctx: NodeContext, protocol: str) -> None:
    """A partner runs a protocol of the PSI library only if its own policy names it and the library is here."""
    if not ctx.policy.runs_psi(protocol):
        raise RefusedError(f"party {ctx.party!r} runs PSI by {list(ctx.policy.psi_protocols or ())} only ([policy] "
                           f"psi_protocols in its config), not {protocol!r}")
    if problem := spu.missing():
        raise RefusedError(f"party {ctx.party!r} cannot run {protocol}: {problem}")


def check_mode(kind: str, mode: str) -> None:
    if mode not in ("both", "active"):
        raise ProtocolError(f"{kind}: mode {mode!r} is neither 'both' nor 'active'")


def partner_side(ctx: NodeContext, payload: Fields, prepared: spu.Prepared, *, protocol: str, broadcast: bool,
                 stage: str = "", cache: str = "") -> tuple[spu.Side, LinkRelays]:
    """A partner's side of one intersection on ``prepared``, and its relays (close them when it ends): the inbound
    one listening where its own policy says, for the sender only; the outbound one dialing the host its own config
    gives for the sender at the port the request names. Should either fail to start, ``prepared`` is ended too."""
    relays: LinkRelays | None = None
    try:
        relays = LinkRelays(prepared.folder, listen=ctx.policy.psi_link_address(), me=ctx.party, peer=ctx.sender,
                            tls=_tls(ctx.link_tls()), parties=[p.name for p in ctx.parties])
        relays.connect(ctx.peer_host(ctx.sender), payload.integer("port"))
        side = spu.Side(rank=1, own=relays.own, peer=relays.to_peer, protocol=protocol, broadcast=broadcast,
                        timeout_s=TIMEOUT_S, stage=stage, cache=cache)
    except BaseException:
        if relays is not None:
            relays.close()
        prepared.__exit__()
        raise
    return side, relays


def handle_open(ctx: NodeContext, payload: Fields) -> Payload:
    """A partner: start its side of the intersection the coordinator asks for, if its own policy accepts the
    protocol; its link port and width."""
    protocol, mode = payload.text("protocol"), payload.text("mode")
    consent(ctx, protocol)
    check_mode(OPEN_KIND, mode)
    rows = ctx.rows(payload.text("purpose"))
    prepared = spu.prepare(rows.ids)  # a repeated ID is refused here, before anything starts
    side, relays = partner_side(ctx, payload, prepared, protocol=protocol, broadcast=mode == "both")
    known = ctx.part(Aligned)
    known.held, known.source = None, (ctx.sender, payload.text("purpose"), mode)
    part = ctx.part(LinkedPart)
    part.running, part.mode = spu.Running(closing(relays, lambda: rows.ids[side.run(prepared)])), mode
    return {"port": relays.port, "n_features": rows.n_features}


def handle_result(ctx: NodeContext, payload: Fields) -> Payload:
    """A partner: end its side; with ``mode = 'both'`` it now knows which of its people are shared."""
    part = ctx.part(LinkedPart)
    if part.running is None:
        raise ProtocolError(f"{RESULT_KIND} without this party's {OPEN_KIND} (or unbalanced PSI's) before it")
    running, mode = part.running, part.mode
    part.running = None
    shared = running.join(TIMEOUT_S)
    if mode == "both":
        ctx.part(Aligned).held = sorted_ids(shared)  # most parties' IDs come sorted, and so the shared ones
    return {"count": len(shared)}


@dataclass
class LinkedPart:
    """The partner's side of the intersection under way (none between intersections): its thread, which gives the
    IDs it learned are shared (none where it learns nothing), and whether it learns the result (``mode``)."""

    running: spu.Running | None = None
    mode: str = ""


def intersect(fed: Aligning, ids: np.ndarray, parties: Sequence[str], *, protocol: str, purpose: str = "train",
              mode: str = "both") -> Alignment:
    """The subset of ``ids`` every party in ``parties`` holds: one intersection with each, by ``protocol``."""
    if not parties:
        return Alignment(ids=ids, asked=ids, held={}, widths={})
    held: dict[str, np.ndarray] = {}
    widths: dict[str, int] = {}
    for party in parties:
        # A repeated ID is refused before the partner starts.
        with spu.prepare(ids, "the active party's") as prepared:
            def side(own: str, peer: str) -> spu.Side:
                return spu.Side(rank=0, own=own, peer=peer, protocol=protocol, broadcast=mode == "both",
                                timeout_s=TIMEOUT_S)

            reply, mask = over_link(fed, party, OPEN_KIND, {"protocol": protocol, "purpose": purpose, "mode": mode},
                                    side, prepared, label=protocol)
        assert mask is not None
        held[party], widths[party] = mask, reply.integer("n_features")
    keep = np.logical_and.reduce([held[p] for p in parties])
    return Alignment(ids=ids[keep], asked=ids, held=held, widths=widths)


def over_link(fed: Aligning, party: str, kind: str, request: Payload, side: Callable[[str, str], spu.Side],
              prepared: spu.Prepared, *, label: str) -> tuple[Reply, np.ndarray | None]:
    """One intersection with ``party`` over the PSI library's link: ``kind`` asks it to start its side (``request``
    and this party's inbound port), this party runs ``side(own address, peer address)`` on ``prepared``, and
    :data:`RESULT_KIND` ends the partner's. The reply to ``kind`` and this side's mask; no mask when the partner
    answered port 0 (it started nothing: the reply says why).

    The partner dials the inbound relay, which hands its bytes to this party's side once it proved to be the
    partner; this side dials the outbound relay, which hands them to the partner once it proved to be it: every
    byte of the link is counted there and enters the ledger as ``align.engine.LABEL``, one entry each way."""
    started = time.perf_counter()
    with LinkRelays(prepared.folder, listen=fed.policy.psi_link_address(), me=fed.party, peer=party,
                    tls=_tls(fed.link_tls()), parties=[p.name for p in fed.parties]) as relays:
        reply = fed.exchange(kind, {party: {**request, "port": relays.port}})[party]
        if reply.integer("port") == 0:
            return reply, None
        relays.connect(fed.transport.peer_host(party), reply.integer("port"))
        # This side starts once the partner's listens. A side that dials a peer not yet listening is refused,
        # and its link then waits for its health check before it dials again (vflo.align.link_relay), as it often
        # did at large intersections when this side's process, started ahead, went first. The partner, which
        # dials first instead, finds this side listening within the link's quick redials.
        if not relays.wait_listening(START_WAIT_S) and relays.failure:
            raise ProtocolError(relays.failure)
        mask = side(relays.own, relays.to_peer).run(prepared)
        count = fed.exchange(RESULT_KIND, {party: {}})[party].integer("count")
    sent, received = relays.sent, relays.received
    entry = f"align.engine.{label}"
    ledger = fed.transport.ledger
    first = ledger.record(round=fed.rounds, sender=fed.party, receiver=party, kind=entry, direction="request",
                          nbytes=sent)
    ledger.record(round=fed.rounds, sender=party, receiver=fed.party, kind=entry, direction="reply",
                  nbytes=received, reply_to=first.seq)
    logger.info("PSI (%s) with %s: %d of %d shared (it counts %d) in %.2f s; link %d bytes out, %d in", label,
                party, int(mask.sum()), len(prepared.names), count, time.perf_counter() - started, sent, received)
    return reply, mask


class LinkedHandlers(HandlerSet):
    """A party's side of the PSI library's balanced protocols, set up and closed by messages."""

    @handles(OPEN_KIND,
             served="before or during a run, with [policy] psi_protocols naming the protocol: starts this party's "
                    "side of one intersection over the PSI library's own link",
             senders=("coordinator",), carries={}, replies={"port": "control", "n_features": "control"},
             **OPEN)
    def _engine_open(self, ctx: NodeContext, payload: Fields) -> Payload:
        return handle_open(ctx, payload)

    @handles(RESULT_KIND,
             served="after this party's own align.engine_open, align.ub_prepare or align.ub_open: ends its side",
             senders=("coordinator",), carries={}, replies={"count": "control"}, **RESULT)
    def _engine_result(self, ctx: NodeContext, payload: Fields) -> Payload:
        return handle_result(ctx, payload)


HANDLERS = LinkedHandlers()


def unavailable(fed: Aligning) -> str:
    """Why the PSI library cannot run for ``fed`` ("" where it can): not installed, or no direct links."""
    return spu.missing() or ("" if fed.transport.direct_links else
                             "the parties reach each other only through a hub (Flower), and the PSI library's link "
                             "dials the other party directly; use engine = 'vflo'")


def _engine(protocol: str, about: str) -> Engine:
    return Engine(name=protocol, about=about, library=True, handlers=HANDLERS, unavailable=unavailable,
                  intersect=lambda fed, ids, parties, purpose, mode: intersect(fed, ids, parties, protocol=protocol,
                                                                                purpose=purpose, mode=mode))


#: The PSI library's balanced protocols, each over its own link (:mod:`vflo.align.spu`).
ENGINES = (_engine("rr22", "the PSI library's RR22 (OKVS-based, the fastest at scale)"),
           _engine("kkrt", "the PSI library's KKRT (OT-based)"),
           _engine("ecdh", "the PSI library's ECDH"))
