"""Unbalanced private set intersection: a small active party (a 10,000-person campaign) against a large partner
(a 10-million-person bureau), by the PSI library's ECDH-OPRF protocol (:mod:`vflo.align.spu`).

1. Offline, once (``align.ub_prepare``): the partner evaluates a keyed function of each of its IDs under a key of
   its own, drawn by the library and kept in the partner's alignments folder, and sends the results to the active
   party, which keeps them in its own. Its cost follows the large side, and it is paid once.
2. Online, per intersection (``align.ub_open``): the active party's IDs, blinded, are evaluated by the partner
   and looked up among what it kept. Its cost follows the small side. With ``mode = 'both'`` the partner learns
   which of its people are shared, as with any PSI.

The partner answers an online request only from a preparation it made for that asker and those rows, while the
people it holds are those it was made on (the SHA-256 of its IDs); otherwise it says why, and the active party
prepares again. What the active party keeps reveals nothing about the partner's people without the partner's key;
each online intersection tells it, as any PSI does, which of the IDs it asked about the partner holds.
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vflo.align import spu
from vflo.align.engine import Engine
from vflo.align.ids import untagged
from vflo.align.kept import now, store_of
from vflo.align.linked import TIMEOUT_S, LinkedPart, check_mode, closing, consent, over_link, partner_side
from vflo.align.linked import unavailable as library_unavailable
from vflo.align.plain import Aligned
from vflo.align.spu_side import UNBALANCED
from vflo.comm.message import INT, STR, Fields, FieldSpec, Payload
from vflo.errors import ConfigError, ProtocolError, RefusedError
from vflo.party.handlers import HandlerSet, handles
from vflo.party.port import Alignment

if TYPE_CHECKING:
    from vflo.align.kept import AlignmentStore
    from vflo.party.context import NodeContext
    from vflo.party.port import Aligning

logger = logging.getLogger(__name__)

PREPARE_KIND, ONLINE_KIND = "align.ub_prepare", "align.ub_open"
PREPARE: dict[str, FieldSpec] = {"purpose": STR, "port": INT}
ONLINE: dict[str, FieldSpec] = {"purpose": STR, "mode": STR, "port": INT, "token": STR}
PREPARED_REPLY: dict[str, FieldSpec] = {"port": INT, "token": STR, "n_features": INT}
ONLINE_REPLY: dict[str, FieldSpec] = {"port": INT, "why": STR, "n_features": INT}


@dataclass(frozen=True)
class Preparation:
    """One offline stage as a party recorded it (``prep.json`` in its folder): the token both keep, the peer, the
    rows' purpose, when, and at the partner the digest of the IDs it evaluated."""

    token: str
    peer: str
    purpose: str
    created: str
    digest: str = ""
    n_ids: int = 0


def _root(store: AlignmentStore) -> Path:
    return store.folder / UNBALANCED


def _preparations(store: AlignmentStore, peer: str, purpose: str) -> list[tuple[Preparation, Path]]:
    """This party's whole preparations with ``peer`` for ``purpose``, newest first."""
    found: list[tuple[Preparation, Path]] = []
    root = _root(store)
    if not root.is_dir():
        return found
    for path in root.glob(f"{peer}.{purpose}.*/prep.json"):
        try:
            prep = Preparation(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as exc:
            logger.warning("unbalanced PSI preparation %s does not read (%s): skipped", path, exc)
            continue
        found.append((prep, path.parent))
    return sorted(found, key=lambda f: f[0].created, reverse=True)


def _finish(work: Path, final: Path, prep: Preparation) -> None:
    """Record the preparation made in ``work`` and move it to ``final``: whole, or not there."""
    (work / "prep.json").write_text(json.dumps(asdict(prep), indent=1), encoding="utf-8")
    work.rename(final)


def _working(store: AlignmentStore) -> Path:
    root = _root(store)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)  # the partner's key lies in its preparations; the active party's, the partner's evaluations
    work = root / f".work-{secrets.token_hex(8)}"
    work.mkdir(mode=0o700)
    return work


def _require(ctx: NodeContext) -> AlignmentStore:
    consent(ctx, UNBALANCED)
    store = store_of(ctx)
    if store is None:
        raise RefusedError(f"party {ctx.party!r} keeps no alignments (alignments = '' in its config), and unbalanced "
                           "PSI keeps its prepared set there: name a folder, or use another engine")
    return store


def handle_prepare(ctx: NodeContext, payload: Fields) -> Payload:
    """The partner: evaluate its IDs for the sender, once (the offline stage), keeping its key in its own folder."""
    store = _require(ctx)
    purpose = payload.text("purpose")
    rows = ctx.rows(purpose)
    prepared = spu.prepare(rows.ids)  # a repeated ID is refused here, before anything starts
    token, sender = secrets.token_hex(16), ctx.sender
    work = _working(store)
    try:
        side, relays = partner_side(ctx, payload, prepared, protocol=UNBALANCED, broadcast=False, stage="offline",
                                    cache=str(work))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    prep = Preparation(token=token, peer=sender, purpose=purpose, created=now(), digest=store.digest_of(rows.ids),
                       n_ids=len(rows.ids))

    def offline() -> np.ndarray:
        try:
            side.run(prepared)
            _finish(work, _root(store) / f"{sender}.{purpose}.{token}", prep)
            return rows.ids[:0]
        finally:
            shutil.rmtree(work, ignore_errors=True)

    part = ctx.part(LinkedPart)
    part.running, part.mode = spu.Running(closing(relays, offline)), "offline"
    return {"port": relays.port, "token": token, "n_features": rows.n_features}


def handle_online(ctx: NodeContext, payload: Fields) -> Payload:
    """The partner: one intersection against a preparation it made for the sender, if its people are unchanged."""
    store = _require(ctx)
    purpose, mode, token = payload.text("purpose"), payload.text("mode"), payload.text("token")
    check_mode(ONLINE_KIND, mode)
    rows = ctx.rows(purpose)
    found = [(p, f) for p, f in _preparations(store, ctx.sender, purpose) if p.token == token]
    if not found:
        return {"port": 0, "n_features": rows.n_features,
                "why": f"party {ctx.party!r} holds no preparation {token} for {ctx.sender!r}"}
    prep, folder = found[0]
    if store.digest_of(rows.ids) != prep.digest:
        return {"port": 0, "n_features": rows.n_features,
                "why": f"the people party {ctx.party!r} holds for {purpose!r} changed since {prep.created}"}
    # The library reads this party's IDs from its preparation (checked unchanged above), so none are written
    # here: the online stage costs what the active party's IDs cost, not what this party's do.
    nothing = spu.Prepared([])
    side, relays = partner_side(ctx, payload, nothing, protocol=UNBALANCED, broadcast=mode == "both", stage="online",
                                cache=str(folder))
    known = ctx.part(Aligned)
    known.held, known.source = None, (ctx.sender, purpose, mode)

    def online() -> np.ndarray:
        return untagged(side.run_found(nothing), rows.ids)

    part = ctx.part(LinkedPart)
    part.running, part.mode = spu.Running(closing(relays, online)), mode
    return {"port": relays.port, "n_features": rows.n_features, "why": ""}


def intersect(fed: Aligning, store: AlignmentStore, ids: np.ndarray, parties: Sequence[str], *, purpose: str,
              mode: str) -> Alignment:
    """The subset of ``ids`` every party in ``parties`` holds: with each, an online intersection against what this
    party kept of its preparation, after preparing (once) where there is none or the partner's people changed."""
    if not parties:
        return Alignment(ids=ids, asked=ids, held={}, widths={})
    held: dict[str, np.ndarray] = {}
    widths: dict[str, int] = {}
    for party in parties:
        held[party], widths[party] = _with(fed, store, ids, party, purpose=purpose, mode=mode)
    keep = np.logical_and.reduce([held[p] for p in parties])
    return Alignment(ids=ids[keep], asked=ids, held=held, widths=widths)


def _with(fed: Aligning, store: AlignmentStore, ids: np.ndarray, party: str, *, purpose: str,
          mode: str) -> tuple[np.ndarray, int]:
    with spu.prepare(ids, "the active party's") as prepared:
        for attempt in range(2):
            kept = _preparations(store, party, purpose)
            if not kept or attempt:
                if attempt and kept:
                    logger.info("unbalanced PSI with %s: preparing again", party)
                kept = [_prepare(fed, store, party, purpose=purpose)]
            prep, folder = kept[0]

            def online(own: str, peer: str, folder: Path = folder) -> spu.Side:
                return spu.Side(rank=0, own=own, peer=peer, protocol=UNBALANCED, broadcast=mode == "both",
                                timeout_s=TIMEOUT_S, stage="online", cache=str(folder))

            reply, mask = over_link(fed, party, ONLINE_KIND, {"purpose": purpose, "mode": mode,
                                                              "token": prep.token},
                                    online, prepared, label=f"{UNBALANCED}.online")
            if mask is not None:
                return mask, reply.integer("n_features")
            logger.info("unbalanced PSI with %s: its preparation %s does not hold (%s)", party, prep.token,
                        reply.text("why"))
    raise ProtocolError(f"party {party!r} refused the preparation it had just made for unbalanced PSI")


def _prepare(fed: Aligning, store: AlignmentStore, party: str, *, purpose: str) -> tuple[Preparation, Path]:
    """The offline stage with ``party``: what it sends, kept in this party's folder under the token it chose."""
    work = _working(store)
    try:
        def offline(own: str, peer: str) -> spu.Side:
            return spu.Side(rank=0, own=own, peer=peer, protocol=UNBALANCED, broadcast=False, timeout_s=TIMEOUT_S,
                            stage="offline", cache=str(work))

        with spu.Prepared([]) as nothing:  # the active party sends no ID offline
            reply, _ = over_link(fed, party, PREPARE_KIND, {"purpose": purpose}, offline, nothing,
                                 label=f"{UNBALANCED}.offline")
        token = reply.text("token")
        if not token.isalnum():
            raise ProtocolError(f"party {party!r} named its preparation {token!r}: not a token")
        prep = Preparation(token=token, peer=party, purpose=purpose, created=now())
        final = _root(store) / f"{party}.{purpose}.{token}"
        _finish(work, final, prep)
        logger.info("unbalanced PSI with %s: prepared (%s), kept in %s", party, token, final)
        return prep, final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_ready(fed: Aligning) -> AlignmentStore:
    """What the coordinator needs for ``engine = 'unbalanced'``: the library, direct links, a folder of its own."""
    if why := _unavailable(fed):
        raise ConfigError(why)
    store = store_of(fed)
    assert store is not None  # _unavailable says why when there is none
    return store


class UnbalancedHandlers(HandlerSet):
    """A party's side of the PSI library's unbalanced PSI: preparation and online stages."""

    @handles(PREPARE_KIND,
             served="before or during a run, with [policy] psi_protocols naming 'unbalanced' and an alignments "
                    "folder: starts this party's offline stage of unbalanced PSI (its IDs evaluated under its own "
                    "key, sent over the PSI library's link)",
             senders=("coordinator",), carries={}, replies={"port": "control", "token": "control",
                                                            "n_features": "control"}, **PREPARE)
    def _ub_prepare(self, ctx: NodeContext, payload: Fields) -> Payload:
        return handle_prepare(ctx, payload)

    @handles(ONLINE_KIND,
             served="before or during a run: one unbalanced intersection against a preparation this party made for "
                    "the sender, only while the people it holds are those it was made on",
             senders=("coordinator",), carries={}, replies={"port": "control", "why": "control",
                                                            "n_features": "control"}, **ONLINE)
    def _ub_online(self, ctx: NodeContext, payload: Fields) -> Payload:
        return handle_online(ctx, payload)


def _unavailable(fed: Aligning) -> str:
    if why := library_unavailable(fed):
        return why
    if store_of(fed) is None:
        return (f"unbalanced PSI keeps the partner's evaluated set at the active party {fed.party!r}, in its "
                "alignments folder: give it one (alignments = 'DIR' in its config; in one process, "
                "vflo.fit(..., alignments=DIR)), or use another engine")
    return ""


def _intersect(fed: Aligning, ids: np.ndarray, parties: Sequence[str], purpose: str, mode: str) -> Alignment:
    store = check_ready(fed)
    return intersect(fed, store, ids, parties, purpose=purpose, mode=mode)


ENGINE = Engine(name=UNBALANCED, about="the PSI library's unbalanced PSI (ECDH-OPRF): the large side's set prepared "
                "once, each intersection then costs what the small side holds", library=True,
                handlers=UnbalancedHandlers(), unavailable=_unavailable, intersect=_intersect)
