"""Kept alignments: each private set intersection a party took part in, written to its own folder, so that a
later run, comparison or scoring with the same people skips the intersection.

A record is two files in the party's folder, named ``PEER.PURPOSE.TOKEN``:

- ``.parquet``: this party's own IDs the intersection ran on, sorted, each flagged ``shared`` or not (the rows
  outside the intersection are kept, flagged; a partner with ``mode = 'active'`` learned nothing and writes no
  table);
- ``.json``: the token both parties hold, who the peer was, the purpose of the rows (``train``, ``serve``), the
  mode, the engine that ran, when, how many IDs and how many shared, and the SHA-256 of this party's IDs.

Neither file holds another party's IDs beyond the intersection. Reuse is asked, never assumed: the asker
(the active party) takes the newest record with the partner for the purpose and mode whose IDs include every
ID it asks about now, and sends its token with a selector over the shared people (``align.reuse``); the partner
answers from its own record only if the people it holds now are those the record was made on (its digest), else
it says why and a fresh intersection runs. A reuse teaches neither side anything the kept intersection had not:
the selector only narrows the shared people to those asked about again.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from vflo.align.ids import IdFile, canonical, digest
from vflo.align.plain import Aligned
from vflo.comm.message import BOOL, INT, STR, ArraySpec, Fields, FieldSpec, Payload
from vflo.data.order import positions_in, sorted_ids
from vflo.errors import DataError, ProtocolError
from vflo.party.port import Alignment
from vflo.private import private_file, private_folder

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Aligning, Rounds

logger = logging.getLogger(__name__)

KEEP_KIND, REUSE_KIND = "align.keep", "align.reuse"
KEEP: dict[str, FieldSpec] = {"token": STR, "purpose": STR, "mode": STR, "engine": STR}
KEPT: dict[str, FieldSpec] = {"kept": BOOL, "why": STR}
REUSE: dict[str, FieldSpec] = {"token": STR, "purpose": STR, "mode": STR, "pick": ArraySpec(("bool",), (None,))}
REUSED: dict[str, FieldSpec] = {"reused": BOOL, "why": STR, "n_features": INT, "count": INT}


@dataclass(frozen=True)
class Kept:
    """One kept intersection, as this party recorded it."""

    token: str
    party: str
    peer: str
    side: str  # "asker" (the active party) or "partner"
    purpose: str
    mode: str
    engine: str
    created: str
    digest: str  # of this party's IDs the intersection ran on
    n_ids: int
    shared: int  # -1: a partner with mode 'active' (it did not learn the intersection)

    @property
    def stem(self) -> str:
        return f"{self.peer}.{self.purpose}.{self.token}"


class AlignmentStore:
    """A party's kept alignments: a folder of its own (its config's ``alignments``), written once per
    intersection and never rewritten; the newest matching record is reused."""

    def __init__(self, folder: Path, party: str, *, files: Mapping[str, IdFile] | None = None) -> None:
        self.folder = Path(folder)
        self.party = party
        # The party's own files by purpose ("train", "serve"), for an intersection streamed from disk
        # (vflo.align.stream); empty where its rows came from no file.
        self.files: dict[str, IdFile] = dict(files or {})
        # The digest of each ID array this party asked about, by the array (held, so its id stays its own): a
        # party's rows do not change while it serves, and hashing ten million IDs takes seconds.
        self._digests: dict[int, tuple[np.ndarray, str]] = {}
        # What the folder held when last read (by its modification time) and the tables read, by record: a record
        # is written once and never rewritten, so a server reusing one batch after batch reads it once. A write the
        # folder's time does not show yet only makes a lookup miss, and the intersection runs afresh.
        self._listed: tuple[int, list[Kept]] | None = None
        self._tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._people: dict[str, tuple[np.ndarray, pd.Index]] = {}
        self._reused: set[str] = set()

    def digest_of(self, ids: np.ndarray) -> str:
        """:func:`vflo.align.ids.digest` of ``ids``, computed once per array."""
        found = self._digests.get(id(ids))
        if found is None or found[0] is not ids:
            found = self._digests[id(ids)] = (ids, digest(ids))
        return found[1]

    def save(self, record: Kept, ids: np.ndarray | None, shared: np.ndarray | None) -> Path:
        """Write ``record`` (and, unless ``ids`` is None, its table): each file under a temporary name first,
        the manifest last, so a record is whole or absent."""
        private_folder(self.folder)
        written: list[Path] = []
        try:
            if ids is not None and shared is not None:
                table = self.folder / f"{record.stem}.parquet"
                # Straight from NumPy to Arrow: no Python object per ID on the way (pandas made one).
                _atomic(table, lambda tmp: pq.write_table(pa.table({"id": pa.array(ids), "shared": shared}), tmp))
                written.append(table)
            manifest = self.folder / f"{record.stem}.json"
            _atomic(manifest, lambda tmp: tmp.write_text(json.dumps(asdict(record), indent=1), encoding="utf-8"))
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        return manifest

    def records(self) -> list[Kept]:
        """Every whole record here, newest first (a manifest that does not read is skipped, with a warning)."""
        found: list[Kept] = []
        if not self.folder.is_dir():
            return found
        stamp = self.folder.stat().st_mtime_ns
        if self._listed is not None and self._listed[0] == stamp:
            return list(self._listed[1])
        for path in self.folder.glob("*.json"):
            try:
                found.append(Kept(**json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("kept alignment %s does not read (%s): skipped", path, exc)
        found = sorted(found, key=lambda r: r.created, reverse=True)
        self._listed = (stamp, found)
        return list(found)

    def by_token(self, token: str) -> Kept | None:
        return next((r for r in self.records() if r.token == token and r.party == self.party), None)

    def table(self, record: Kept, *, like: np.dtype[Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The record's IDs (sorted) and their ``shared`` flags; with ``like``, its IDs as that kind of array
        (numbers, text of whatever width they need, objects), converted once per record and kind."""
        if like is not None:
            stored, shared = self.table(record)
            kind = like.kind if like.kind in "iuU" else "O"
            if stored.dtype.kind == kind:
                return stored, shared
            key = f"{record.stem}\0{kind}"
            if key not in self._tables:
                # Text at its own widest (astype(str)), never the width of the IDs asked about: that would cut
                # longer IDs short, and a cut one could match someone else.
                self._tables[key] = (stored.astype(like if kind in "iu" else str if kind == "U" else object), shared)
            return self._tables[key]
        if record.stem in self._tables:
            return self._tables[record.stem]
        path = self.folder / f"{record.stem}.parquet"
        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise DataError(f"kept alignment {path} does not read ({exc}): remove {record.stem}.* from "
                            f"{self.folder} and align again") from exc
        table = frame["id"].to_numpy(), frame["shared"].to_numpy(dtype=bool)
        if len(self._tables) >= 16:  # a few records in memory at most (each in up to two kinds)
            self._tables.pop(next(iter(self._tables)))
            self._people.clear()
        self._tables[record.stem] = table
        return table

    def shared_people(self, record: Kept) -> tuple[np.ndarray, pd.Index]:
        """The record's shared people in canonical order (:func:`canonical`: the order a reuse's ``pick`` flags
        follow on both sides), and an index of them by ID: sorted once per record, where a server reusing it batch
        after batch would sort them for every batch."""
        found = self._people.get(record.stem)
        if found is None:
            stored, shared = self.table(record)
            people = canonical(stored[shared])
            found = self._people[record.stem] = (people, pd.Index(people))
        return found

    def first_reuse(self, record: Kept) -> bool:
        """Whether this process reuses ``record`` for the first time (logged then; a server reuses it per batch)."""
        if record.stem in self._reused:
            return False
        self._reused.add(record.stem)
        return True

    def matching(self, peer: str, purpose: str, mode: str) -> Iterator[Kept]:
        return (r for r in self.records() if r.party == self.party and (r.peer, r.purpose, r.mode) == (peer, purpose,
                                                                                                       mode))


def _atomic(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        private_file(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _covering(store: AlignmentStore, peer: str, purpose: str, mode: str,
              ids: np.ndarray) -> tuple[Kept, np.ndarray, np.ndarray] | None:
    """The newest asker's record with ``peer`` whose IDs include all of ``ids`` (sorted): the record, which of
    ``ids`` the peer holds, and the selector over the peer's shared people (canonical order) that keeps those."""
    for record in store.matching(peer, purpose, mode):
        if record.side != "asker":
            continue
        stored, shared = store.table(record, like=ids.dtype)
        if len(stored) < len(ids):
            continue
        at = np.searchsorted(stored, ids)
        at[at == len(stored)] = 0
        if len(ids) and not np.array_equal(stored[at], ids):
            continue
        held = shared[at]
        # With mode 'active' the partner never learned how many people it shares: no selector goes to it.
        pick = np.zeros(0, dtype=bool)
        if mode == "both":
            people, index = store.shared_people(record)
            at_people = positions_in(index, ids[held])
            if (at_people < 0).any():  # a record that does not read as it was written: not reused
                continue
            pick = np.zeros(len(people), dtype=bool)
            pick[at_people] = True
        return record, held, pick
    return None


def reuse(fed: Rounds, store: AlignmentStore, ids: np.ndarray, parties: Sequence[str], *, purpose: str,
          mode: str) -> tuple[dict[str, np.ndarray], dict[str, int], dict[str, Kept]]:
    """Ask each of ``parties`` with a kept intersection covering ``ids`` to reuse it: which of ``ids`` each one
    that agreed holds, its width and the record reused. A party that declines (its people changed, or it kept
    nothing) is left for a fresh intersection, and the log says why."""
    asks: dict[str, tuple[Kept, np.ndarray, np.ndarray]] = {}
    for party in parties:
        hit = _covering(store, party, purpose, mode, ids)
        if hit is not None:
            asks[party] = hit
    if not asks:
        return {}, {}, {}
    replies = fed.exchange(REUSE_KIND, {p: {"token": r.token, "purpose": purpose, "mode": mode, "pick": pick}
                                        for p, (r, _, pick) in asks.items()})
    held: dict[str, np.ndarray] = {}
    widths: dict[str, int] = {}
    used: dict[str, Kept] = {}
    for party, reply in replies.items():
        record, mask, pick = asks[party]
        if not reply.flag("reused"):
            logger.info("kept alignment %s with %s not reused: %s; aligning afresh", record.token, party,
                        reply.text("why"))
            continue
        if mode == "both" and reply.integer("count") != int(pick.sum()):
            raise ProtocolError(f"party {party!r} reused alignment {record.token} with {reply.integer('count')} "
                                f"shared people, {int(pick.sum())} here")
        held[party], widths[party], used[party] = mask, reply.integer("n_features"), record
        logger.info("alignment with %s reused: kept %s by %s (token %s); %d of %d IDs shared; its people and ours "
                    "unchanged", party, record.created, record.engine, record.token, int(mask.sum()), len(ids))
    return held, widths, used


def keep(fed: Rounds, store: AlignmentStore, found: Alignment, parties: Sequence[str], *, purpose: str,
         mode: str, engine: str) -> dict[str, Kept]:
    """After a fresh intersection: each partner that keeps alignments records its side under one new token, and
    then this party records its own (the records it wrote)."""
    tokens = {p: secrets.token_hex(16) for p in parties}
    replies = fed.exchange(KEEP_KIND, {p: {"token": tokens[p], "purpose": purpose, "mode": mode, "engine": engine}
                                       for p in parties})
    ids = found.asked
    written: dict[str, Kept] = {}
    for party, reply in replies.items():
        if not reply.flag("kept"):
            logger.info("alignment with %s not kept: %s", party, reply.text("why"))
            continue
        shared = found.held[party]
        record = Kept(token=tokens[party], party=store.party, peer=party, side="asker", purpose=purpose, mode=mode,
                      engine=engine, created=now(), digest=digest(ids), n_ids=len(ids), shared=int(shared.sum()))
        path = store.save(record, ids, shared)
        written[party] = record
        logger.info("alignment with %s kept in %s (token %s)", party, path, record.token)
    return written


def members(ids: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Which of the sorted ``ids`` are in ``among``, by binary search over ``among`` sorted: an index per ID,
    where ``np.isin`` sorts both together (ten million text IDs: several copies of them)."""
    among = sorted_ids(among)
    if not len(among):
        return np.zeros(len(ids), dtype=bool)
    at = np.searchsorted(among, ids)
    at[at == len(among)] = 0
    found: np.ndarray = among[at] == ids
    return found


def now() -> str:
    """The time a record is made: UTC, ISO 8601 to the microsecond (records sort by it)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def store_of(where: NodeContext | Aligning) -> AlignmentStore | None:
    """The party's kept-alignments folder that ``where`` carries (None where it keeps none): a context carries it
    by the little it needs of it (:class:`vflo.party.context.AlignmentFolder`); alignment owns its type."""
    store = where.alignments
    if store is not None and not isinstance(store, AlignmentStore):
        raise ProtocolError(f"party {where.party!r} was given {type(store).__name__} as its kept alignments; "
                            "expected a vflo.align.kept.AlignmentStore")
    return store


def handle_keep(ctx: NodeContext, payload: Fields) -> Payload:
    """A partner: record its side of the intersection it just ran with the sender, if it keeps alignments."""
    store = store_of(ctx)
    if store is None:
        return {"kept": False, "why": f"party {ctx.party!r} keeps no alignments (alignments = '' in its config)"}
    purpose, mode = payload.text("purpose"), payload.text("mode")
    known = ctx.part(Aligned)
    if known.source != (ctx.sender, purpose, mode):
        raise ProtocolError(f"{KEEP_KIND} for a {purpose!r} intersection in mode {mode!r} that this party did not "
                            f"just run with {ctx.sender!r}")
    if mode == "both" and known.held is None:
        raise ProtocolError(f"{KEEP_KIND} before this party learned the intersection's result")
    rows = ctx.rows(purpose).ids
    ids = sorted_ids(rows)
    shared = members(ids, known.held) if known.held is not None else None
    record = Kept(token=payload.text("token"), party=ctx.party, peer=ctx.sender, side="partner", purpose=purpose,
                  mode=mode, engine=payload.text("engine"), created=now(), digest=store.digest_of(rows), n_ids=len(ids),
                  shared=-1 if shared is None else int(shared.sum()))
    path = store.save(record, ids if shared is not None else None, shared)
    logger.info("party %s kept its alignment with %s in %s", ctx.party, ctx.sender, path)
    return {"kept": True, "why": ""}


def handle_reuse(ctx: NodeContext, payload: Fields) -> Payload:
    """A partner: reuse a kept intersection with the sender if the people it holds are those it was made on."""
    store, purpose, mode = store_of(ctx), payload.text("purpose"), payload.text("mode")
    token, pick = payload.text("token"), payload.array("pick")
    declined: Payload = {"reused": False, "n_features": 0, "count": 0}
    if store is None:
        return {**declined, "why": f"party {ctx.party!r} keeps no alignments"}
    record = store.by_token(token)
    if record is None or record.side != "partner" or (record.peer, record.purpose, record.mode) != (
            ctx.sender, purpose, mode):
        return {**declined, "why": f"party {ctx.party!r} holds no {purpose!r} alignment {token} in mode {mode!r} "
                                   f"with {ctx.sender!r}"}
    rows = ctx.rows(purpose)
    if store.digest_of(rows.ids) != record.digest:
        return {**declined, "why": f"the people party {ctx.party!r} holds for {purpose!r} changed since "
                                   f"{record.created}"}
    known = ctx.part(Aligned)
    known.held, known.psi_order, known.source = None, None, (ctx.sender, purpose, mode)
    count = 0
    if mode == "both":
        people, _ = store.shared_people(record)
        if pick.shape != (len(people),):
            raise ProtocolError(f"{REUSE_KIND}: {len(pick)} flags for the {len(people)} people alignment {token} "
                                "shares")
        known.held = np.sort(people[pick])
        count = int(pick.sum())
        # The selector names people by their places among those shared: this party's own IDs for them, for its
        # record of who asked about whom.
        ctx.named = known.held
    logger.log(logging.INFO if store.first_reuse(record) else logging.DEBUG, "party %s reused its alignment %s "
               "with %s (kept %s)", ctx.party, token, ctx.sender, record.created)
    return {"reused": True, "why": "", "n_features": rows.n_features, "count": count}
