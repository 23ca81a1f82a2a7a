"""Private set intersection by Diffie-Hellman over Curve25519 (semi-honest parties).

The active party A and a passive party B hash every ID with a per-run salt to a curve
point and raise it to a secret scalar (X25519 scalar multiplication, which commutes):

1. A -> B: the salt and H(x)^a for each of A's IDs x;
2. B -> A: (H(x)^a)^b in A's order, and H(y)^b for each of B's IDs y, shuffled;
3. A raises B's points to a, so H(y)^(ba) = H(x)^(ab) exactly when x = y: A learns which of
   its IDs B holds, and nothing about B's other IDs.
4. With ``mode = 'both'``, A tells B which of B's (shuffled) points matched, so B learns the
   intersection too; with ``mode = 'active'`` B learns only how many IDs A has.

Each party's scalar comes from the operating system's cryptographic generator rather than
the run seed: a key derived from a public seed would let anyone undo the blinding. The
intersection itself does not depend on the keys, so runs stay reproducible.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from vflo.align import curve
from vflo.align.engine import Engine
from vflo.align.ids import check_unique, tagged_array
from vflo.align.plain import Aligned
from vflo.comm.message import INT, STR, ArraySpec, Fields, FieldSpec, Payload, check_payload
from vflo.errors import ProtocolError
from vflo.helpers import SHARED_USE, call
from vflo.party.handlers import HandlerSet, handles
from vflo.party.port import Alignment

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Rounds

logger = logging.getLogger(__name__)
Mode = Literal["both", "active"]
KIND, RESULT_KIND = "align.psi", "align.psi_result"
POINTS = ArraySpec(("uint8",), (None, 32))
REQUEST: dict[str, FieldSpec] = {"salt": ArraySpec(("uint8",), (32,)), "points": POINTS, "purpose": STR, "mode": STR}
REPLY: dict[str, FieldSpec] = {"double": POINTS, "points": POINTS, "n_features": INT}
RESULT: dict[str, FieldSpec] = {"matched": ArraySpec(("bool",), (None,))}
# Below this many points the blinding runs in this process; above, in a pool of worker processes.
PARALLEL_FROM = 40_000
# IDs a worker turns into Python strings at a time to hash them.
HASH_BLOCK = 65_536


def unique_names(ids: np.ndarray) -> pa.Array:
    """``ids`` tagged (an Arrow array: no Python string per ID) and checked unique."""
    names = tagged_array(ids)
    check_unique(names, ids=ids)
    return names


def hash_ids(ids: np.ndarray, salt: bytes) -> np.ndarray:
    """One 32-byte curve point (an X25519 u-coordinate) per ID."""
    return np.frombuffer(_hash_chunk(salt, unique_names(ids)), dtype=np.uint8).reshape(len(ids), 32).copy()


def _hash_chunk(salt: bytes, names: list[str] | pa.Array) -> bytes:
    if isinstance(names, pa.Array):  # Python strings for a block at a time only
        return b"".join(_hash_chunk(salt, names.slice(i, HASH_BLOCK).to_pylist())
                        for i in range(0, len(names), HASH_BLOCK))
    return b"".join(hashlib.sha256(salt + n.encode("utf-8")).digest() for n in names)


@call("psi.blind")
def blind_chunk(key: bytes, points: bytes) -> bytes:
    """Points (32 bytes each, joined) raised to ``key``: a chunk of a job, in a worker of the party's executor."""
    return curve.blind(key, points)


@call("psi.hash_blind")
def hash_blind_chunk(key: bytes, salt: bytes, names: list[str] | pa.Array) -> bytes:
    """Hash to the curve and blind in one pass, in the worker (the parent only splits and joins)."""
    return blind_chunk(key, _hash_chunk(salt, names))


def _joined(parts: list[bytes], n: int) -> np.ndarray:
    """The points of ``parts`` (32 bytes each) as one (n, 32) array, each part copied once into it (joining them
    first held the points twice more: 0.6 GB at ten million)."""
    out = np.empty((n, 32), dtype=np.uint8)
    at = 0
    while parts:
        part = np.frombuffer(parts.pop(0), dtype=np.uint8).reshape(-1, 32)  # each part freed once placed
        out[at : at + len(part)] = part
        at += len(part)
    if at != n:
        raise ProtocolError(f"PSI blinding gave {at} points for {n}")
    return out


class Blinder:
    """Raises points (or hashed IDs) to one secret scalar, for long lists on the party's executor
    (:mod:`vflo.executor`: its helper processes, started afresh and never forked from a party serving over gRPC,
    or its Ray cluster).

    Each job is cut into one run of chunks per helper, and a party's two jobs of one step (its own IDs and the
    other party's points) share one pool. The four blindings of a 1M x 1M intersection are its whole cost; what a
    point costs on one core, with vflo's eight-lane X25519 and with OpenSSL's (:mod:`vflo.align.curve`), is what
    ``python -m benchmarks.x25519`` measures (its line is in docs/deploy.md).
    """

    def __init__(self, key: bytes, *, size: int, workers: int | None = None) -> None:
        from vflo.executor import current

        self.key = key
        self._executor = current()
        workers = workers if workers is not None else self._executor.workers
        self.workers = workers if size >= PARALLEL_FROM and workers >= 2 else 1
        self._held = False

    def __enter__(self) -> Blinder:
        if self.workers > 1:
            SHARED_USE.acquire()
            self._held = True
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._held:
            self._held = False
            SHARED_USE.release()

    def _chunks(self, n: int) -> int:
        """Items per chunk: one run of chunks per worker, each its share."""
        return max(1, -(-n // self.workers))

    def _start(self, fn: Callable[..., bytes], head: tuple[object, ...], chunks: list[Any],
               n: int) -> Callable[[], np.ndarray]:
        if not self._held:
            out = _joined([fn(*head, c) for c in chunks], n)
            return lambda: out
        # This party's helper processes, or its Ray cluster ([executor] in its config).
        results = self._executor.submit(fn, head, chunks, workers=self.workers)
        return lambda: _joined(results(), n)

    def points(self, points: np.ndarray) -> Callable[[], np.ndarray]:
        """Start blinding ``points`` (n, 32); call the result for the blinded points."""
        if points.ndim != 2 or points.shape[1] != 32:
            raise ProtocolError(f"PSI points must be an (n, 32) byte array, got {points.shape}")
        step = self._chunks(len(points))
        # Each chunk's bytes of its own rows: no copy of the whole list besides them.
        chunks = [points[i : i + step].tobytes() for i in range(0, len(points), step)]
        return self._start(blind_chunk, (self.key,), chunks, len(points))

    def ids(self, ids: np.ndarray, salt: bytes) -> Callable[[], np.ndarray]:
        """Start hashing ``ids`` to the curve with ``salt`` and blinding them; call the result for the points."""
        return self.names(unique_names(ids), salt)

    def names(self, names: list[str] | pa.Array, salt: bytes) -> Callable[[], np.ndarray]:
        """As :meth:`ids`, for IDs already tagged (:func:`vflo.align.ids.tagged` or ``tagged_array``) and checked
        unique."""
        step = self._chunks(len(names))
        # A slice of an Arrow array pickles its whole buffers: each chunk is its own array.
        chunks = [pa.concat_arrays([names[i : i + step]]) if isinstance(names, pa.Array) else names[i : i + step]
                  for i in range(0, len(names), step)]
        return self._start(hash_blind_chunk, (self.key, salt), chunks, len(names))


def blind(points: np.ndarray, key: bytes, *, workers: int | None = None) -> np.ndarray:
    """Raise every point to the scalar ``key`` (X25519), in worker processes for long lists."""
    with Blinder(key, size=len(points), workers=workers) as blinder:
        return blinder.points(points)()


def matches(queries: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """Which rows of ``queries`` (n, 32) appear among the rows of ``pool`` (m, 32).

    Blinded points look random, so their first 8 bytes almost never repeat: a binary search over those of
    ``pool`` (sorted), then the whole 32 bytes compared where they meet. That holds an 8-byte key and an index
    per point where sorting the rows themselves held several copies of them (at 2M x 2M points, NumPy's peak
    allocations several times smaller). In the rare list where two keys of ``pool`` repeat, the rows themselves
    are compared."""
    queries, pool = np.ascontiguousarray(queries), np.ascontiguousarray(pool)
    if not len(queries) or not len(pool):
        return np.zeros(len(queries), dtype=bool)
    keys = pool[:, :8].copy().view(np.uint64).ravel()
    order = np.argsort(keys)
    keys = keys[order]
    if bool(np.any(keys[1:] == keys[:-1])):
        as_rows = np.dtype((np.void, 32))
        return np.isin(queries.view(as_rows).ravel(), pool.view(as_rows).ravel())
    asked = queries[:, :8].copy().view(np.uint64).ravel()
    at = np.searchsorted(keys, asked)
    at[at == len(keys)] = 0
    found: np.ndarray = keys[at] == asked
    hits = np.flatnonzero(found)
    found[hits] = np.all(pool[order[at[hits]]] == queries[hits], axis=1)
    return found


def new_key() -> bytes:
    return X25519PrivateKey.generate().private_bytes_raw()


def shuffled(n: int) -> np.ndarray:
    """A secret order of ``n`` items (the operating system's randomness): the order B sends its points in."""
    return np.array(secrets.SystemRandom().sample(range(n), n), dtype=np.int64)


def answer(key: bytes, names: list[str] | pa.Array, points: np.ndarray, salt: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Party B's step: A's ``points`` blinded again, and B's own IDs ``names`` (tagged, unique, in the order B
    sends them) hashed with ``salt`` and blinded, both under B's ``key``."""
    with Blinder(key, size=len(points) + len(names)) as blinder:
        own = blinder.names(names, salt)  # both jobs run on the executor, side by side
        double = blinder.points(points)
        return double(), own()


def compare(mine: np.ndarray, reply: Fields, key: bytes, *, party: str,
            both: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Party A's step on B's answer to ``mine``: which of A's IDs B holds, and with ``both`` (``mode = 'both'``)
    which of B's points matched, what A tells B."""
    double, theirs = reply.array("double"), reply.array("points")
    if double.shape != mine.shape:
        raise ProtocolError(f"party {party!r} returned {len(double)} points for {len(mine)}")
    theirs_double = blind(theirs, key)
    return matches(double, theirs_double), matches(theirs_double, double) if both else None


def handle(ctx: NodeContext, payload: Fields) -> Payload:
    """Party B: blind A's points again, and send its own points (shuffled)."""
    salt, points = payload.array("salt"), payload.array("points")
    rows = ctx.rows(payload.text("purpose"))
    logger.info("PSI by vflo's ECDH: %d IDs here, %d asked; X25519 here by %s", rows.n_samples, len(points),
                curve.backend())
    order = shuffled(rows.n_samples)
    # Checked unique in the file's order (by neighbours where it is sorted), then sent in the secret one.
    double, own = answer(new_key(), unique_names(rows.ids).take(pa.array(order)), points, salt.tobytes())
    reply: Payload = {"double": double, "points": own, "n_features": rows.n_features}
    known = ctx.part(Aligned)
    known.psi_order, known.held = rows.ids[order], None
    known.source = (ctx.sender, payload.text("purpose"), payload.text("mode"))
    return reply


def handle_result(ctx: NodeContext, payload: Fields) -> Payload:
    """Party B (mode 'both'): learn which of its IDs are shared, in the active party's (sorted) order."""
    matched = payload.array("matched")
    known = ctx.part(Aligned)
    order = known.psi_order
    if order is None or matched.shape != (len(order),):
        raise ProtocolError(f"{RESULT_KIND} does not match this party's last {KIND}")
    known.held = np.sort(order[matched])
    # The flags name people by their places in this party's own reply: its IDs for them, for its record of who
    # asked about whom.
    ctx.named = known.held
    return {"count": int(matched.sum())}


def intersect(fed: Rounds, ids: np.ndarray, parties: Sequence[str], *, purpose: str = "train",
              mode: Mode = "both") -> Alignment:
    """The subset of ``ids`` that every party holds, found by PSI with each (one round, plus one in 'both')."""
    if not parties:
        return Alignment(ids=ids, asked=ids, held={}, widths={})
    order = np.argsort(ids, kind="stable")
    if not np.array_equal(order, np.arange(len(ids))):
        raise ProtocolError("PSI alignment expects the active party's IDs sorted")
    salt = secrets.token_bytes(32)
    key = new_key()
    logger.info("PSI by vflo's ECDH with %s: %d IDs; X25519 here by %s", ", ".join(parties), len(ids), curve.backend())
    with Blinder(key, size=len(ids)) as blinder:
        mine = blinder.ids(ids, salt)()
    payload: Payload = {
        "salt": np.frombuffer(salt, dtype=np.uint8).copy(), "points": mine, "purpose": purpose, "mode": mode,
    }
    replies = fed.exchange(KIND, dict.fromkeys(parties, payload))
    held: dict[str, np.ndarray] = {}
    widths: dict[str, int] = {}
    results: dict[str, Payload] = {}
    for party, reply in replies.items():
        check_payload(KIND, reply, REPLY)
        held[party], matched = compare(mine, reply, key, party=party, both=mode == "both")
        widths[party] = reply.integer("n_features")
        if matched is not None:
            results[party] = {"matched": matched}
    if mode == "both":
        fed.exchange(RESULT_KIND, results)
    keep = np.logical_and.reduce([held[p] for p in parties])
    return Alignment(ids=ids[keep], asked=ids, held=held, widths=widths)


class PsiHandlers(HandlerSet):
    """A party's side of vflo's own ECDH PSI."""

    @handles(KIND,
             served="before or during a run",
             senders=("coordinator", "delegate"), carries={"points": "blinded ids", "salt": "control"},
             replies={"double": "blinded ids", "points": "blinded ids", "n_features": "control"}, **REQUEST)
    def _psi(self, ctx: NodeContext, payload: Fields) -> Payload:
        return handle(ctx, payload)

    @handles(RESULT_KIND,
             served="after this party's own align.psi in the same run",
             senders=("coordinator", "delegate"), carries={"matched": "membership"}, replies={"count": "control"},
             **RESULT)
    def _psi_result(self, ctx: NodeContext, payload: Fields) -> Payload:
        return handle_result(ctx, payload)


def _intersect(fed: Rounds, ids: np.ndarray, parties: Sequence[str], purpose: str, mode: str) -> Alignment:
    if mode not in ("both", "active"):
        raise ProtocolError(f"PSI mode {mode!r}: 'both' or 'active'")
    return intersect(fed, ids, parties, purpose=purpose, mode="both" if mode == "both" else "active")


ENGINE = Engine(name="vflo", about="vflo's own ECDH over its messages (X25519, :mod:`vflo.align.curve`)",
                intersect=_intersect, handlers=PsiHandlers())
