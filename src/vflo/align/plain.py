"""Plain alignment: the coordinator sends IDs, each party says which it holds.

This reveals the coordinator's IDs to the other parties, which is acceptable in
simulation (every party is the experimenter) and for IDs that are not sensitive.
Private set intersection replaces it where that is not acceptable. The exchange
crosses the transport like any other, so its bytes are in the ledger under
``align.plain`` (reported apart from the method's own traffic).

After alignment every party remembers which of the coordinator's IDs it holds, in
the coordinator's order. Later messages then select rows with a one-byte-per-row
mask over that list (:meth:`Alignment.selector`) instead of sending IDs again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from vflo.comm.message import IDS, INT, STR, ArraySpec, Fields, FieldSpec, Payload, check_payload
from vflo.errors import ProtocolError, RefusedError
from vflo.party.port import Alignment

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Rounds

KIND = "align.plain"
REQUEST: dict[str, FieldSpec] = {"ids": IDS, "purpose": STR}
REPLY: dict[str, FieldSpec] = {"held": ArraySpec(("bool",), (None,)), "n_features": INT}
SELECTOR = ArraySpec(("bool",), (None,))


@dataclass
class Aligned:
    """What a party knows of its alignment: the IDs it holds of the last set it was asked about (``held``, in the
    asker's order), the order of its own IDs in its last PSI reply (``psi_order``), the digest of the one set
    each asker named for its training rows (``asked``), and who its last private set intersection was with, for
    which rows and in which mode (``source``: what a kept record of it names, :mod:`vflo.align.kept`)."""

    held: np.ndarray | None = None
    psi_order: np.ndarray | None = None
    asked: dict[str, str] = field(default_factory=dict)
    source: tuple[str, str, str] | None = None


def handle(ctx: NodeContext, payload: Fields) -> Payload:
    """Party side: which requested IDs this party holds among its rows for ``purpose`` (``"train"`` or
    ``"serve"``); remember them in order."""
    if not ctx.policy.accepts_plain:
        raise RefusedError(
            f"party {ctx.party!r} aligns only by private set intersection (its [policy] alignment is 'psi', the "
            "default): plain alignment would show it the coordinator's IDs and tell which of them it holds; set "
            "[alignment] method = \"psi\" in the experiment config (the default of a deployment), or, if this "
            "party accepts seeing those IDs, alignment = \"plain\" under [policy] in its own config")
    ids = payload.array("ids")
    purpose = payload.text("purpose")
    if purpose == "train":
        _once(ctx, ids)
    rows = ctx.rows(purpose)
    held = rows.contains(ids)
    known = ctx.part(Aligned)
    known.held, known.source = ids[held], None
    return {"held": held, "n_features": rows.n_features}


def _once(ctx: NodeContext, ids: np.ndarray) -> None:
    """One set of IDs per asker a run (and one before a run): each answer tells the asker which of the IDs it
    named this party holds, so a second, different set would let it probe people one guess at a time. The same
    set asked again tells nothing new and is answered (a method may align its rows more than once)."""
    digest = hashlib.sha256("\x00".join(sorted(map(str, ids.tolist()))).encode()).hexdigest()
    asked = ctx.part(Aligned).asked
    first = asked.setdefault(ctx.sender, digest)
    if first != digest:
        raise RefusedError(f"party {ctx.party!r} answers plain alignment of its training rows once a run; "
                           f"{ctx.sender!r} already asked about another set of IDs in this run (use PSI, or align "
                           "every ID the run needs at once)")


def selected_ids(ctx: NodeContext, selector: np.ndarray) -> np.ndarray:
    """Party side: the IDs a coordinator's selector picks from this party's aligned list."""
    held = ctx.part(Aligned).held
    if held is None:
        raise ProtocolError(
            f"party {ctx.party!r} was asked for aligned rows but does not know which rows are aligned: run "
            "alignment first, or use PSI with mode = 'both' (with mode = 'active' only the active party learns them)"
        )
    if selector.shape != (len(held),):
        raise ProtocolError(
            f"party {ctx.party!r} holds {len(held)} aligned IDs but the selector has {selector.shape[0]} flags"
        )
    ids: np.ndarray = held[selector]
    return ids


def intersect(fed: Rounds, ids: np.ndarray, parties: Sequence[str], *, purpose: str = "train") -> Alignment:
    """The subset of ``ids`` (order kept) that every party in ``parties`` holds; one alignment round."""
    if not parties:
        return Alignment(ids=ids, asked=ids, held={}, widths={})
    replies = fed.exchange(KIND, {p: {"ids": ids, "purpose": purpose} for p in parties})
    keep = np.ones(len(ids), dtype=bool)
    held: dict[str, np.ndarray] = {}
    widths: dict[str, int] = {}
    for party, reply in replies.items():
        check_payload(KIND, reply, REPLY)
        mask = reply.array("held")
        if mask.shape != (len(ids),):
            raise ProtocolError(f"party {party!r} answered {KIND} with {mask.shape[0]} flags for {len(ids)} IDs")
        keep &= mask
        held[party] = mask
        widths[party] = reply.integer("n_features")
    return Alignment(ids=ids[keep], asked=ids, held=held, widths=widths)
