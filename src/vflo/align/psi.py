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
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from vflo.align.ids import check_unique, tagged
from vflo.align.plain import Aligned, Alignment
from vflo.comm.message import INT, STR, ArraySpec, Fields, FieldSpec, Payload, check_payload
from vflo.errors import ProtocolError
from vflo.helpers import SHARED_USE

if TYPE_CHECKING:
    from vflo.federation.coordinator import Federation
    from vflo.party.node import NodeContext

Mode = Literal["both", "active"]
KIND, RESULT_KIND = "align.psi", "align.psi_result"
POINTS = ArraySpec(("uint8",), (None, 32))
REQUEST: dict[str, FieldSpec] = {"salt": ArraySpec(("uint8",), (32,)), "points": POINTS, "purpose": STR, "mode": STR}
REPLY: dict[str, FieldSpec] = {"double": POINTS, "points": POINTS, "n_features": INT}
RESULT: dict[str, FieldSpec] = {"matched": ArraySpec(("bool",), (None,))}
# Below this many points the blinding runs in this process; above, in a pool of worker processes.
PARALLEL_FROM = 40_000


def _names(ids: np.ndarray) -> list[str]:
    names = tagged(ids)
    check_unique(names)
    return names


def hash_ids(ids: np.ndarray, salt: bytes) -> np.ndarray:
    """One 32-byte curve point (an X25519 u-coordinate) per ID."""
    return np.frombuffer(_hash_chunk(salt, _names(ids)), dtype=np.uint8).reshape(len(ids), 32).copy()


def _hash_chunk(salt: bytes, names: list[str]) -> bytes:
    return b"".join(hashlib.sha256(salt + n.encode("utf-8")).digest() for n in names)


def _blind_chunk(key: bytes, points: bytes) -> bytes:
    scalar = X25519PrivateKey.from_private_bytes(key)
    return b"".join(scalar.exchange(X25519PublicKey.from_public_bytes(points[i : i + 32]))
                    for i in range(0, len(points), 32))


def _hash_blind_chunk(key: bytes, salt: bytes, names: list[str]) -> bytes:
    """Hash to the curve and blind in one pass, in the worker (the parent only splits and joins)."""
    return _blind_chunk(key, _hash_chunk(salt, names))


class Blinder:
    """Raises points (or hashed IDs) to one secret scalar, for long lists on the party's executor
    (:mod:`vflo.executor`: its helper processes, started afresh and never forked from a party serving over gRPC,
    or its Ray cluster).

    Each job is cut into one run of chunks per helper, and a party's two jobs of one step (its own IDs and the
    other party's points) share one pool. About 28 µs per point per core here: the four blindings of a 1M x 1M
    intersection are its whole cost.
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

    def _start(self, fn: Any, name: str, head: tuple[object, ...], chunks: list[Any],
               n: int) -> Callable[[], np.ndarray]:
        if not self._held:
            out = b"".join(fn(*head, c) for c in chunks)
            return lambda: np.frombuffer(out, dtype=np.uint8).reshape(n, 32).copy()
        # This party's helper processes, or its Ray cluster ([executor] in its config).
        results = self._executor.submit(name, head, chunks, workers=self.workers)
        return lambda: np.frombuffer(b"".join(results()), dtype=np.uint8).reshape(n, 32).copy()

    def points(self, points: np.ndarray) -> Callable[[], np.ndarray]:
        """Start blinding ``points`` (n, 32); call the result for the blinded points."""
        if points.ndim != 2 or points.shape[1] != 32:
            raise ProtocolError(f"PSI points must be an (n, 32) byte array, got {points.shape}")
        data, step = points.tobytes(), 32 * self._chunks(len(points))
        return self._start(_blind_chunk, "psi.blind", (self.key,),
                           [data[i : i + step] for i in range(0, len(data), step)], len(points))

    def ids(self, ids: np.ndarray, salt: bytes) -> Callable[[], np.ndarray]:
        """Start hashing ``ids`` to the curve with ``salt`` and blinding them; call the result for the points."""
        return self.names(_names(ids), salt)

    def names(self, names: list[str], salt: bytes) -> Callable[[], np.ndarray]:
        """As :meth:`ids`, for IDs already tagged (:func:`vflo.align.ids.tagged`) and checked unique."""
        step = self._chunks(len(names))
        chunks = [names[i : i + step] for i in range(0, len(names), step)]
        return self._start(_hash_blind_chunk, "psi.hash_blind", (self.key, salt), chunks, len(names))


def blind(points: np.ndarray, key: bytes, *, workers: int | None = None) -> np.ndarray:
    """Raise every point to the scalar ``key`` (X25519), in worker processes for long lists."""
    with Blinder(key, size=len(points), workers=workers) as blinder:
        return blinder.points(points)()


def matches(queries: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """Which rows of ``queries`` (n, 32) appear among the rows of ``pool`` (m, 32)."""
    as_rows = np.dtype((np.void, 32))
    return np.isin(np.ascontiguousarray(queries).view(as_rows).ravel(),
                   np.ascontiguousarray(pool).view(as_rows).ravel())


def new_key() -> bytes:
    return X25519PrivateKey.generate().private_bytes_raw()


def shuffled(n: int) -> np.ndarray:
    """A secret order of ``n`` items (the operating system's randomness): the order B sends its points in."""
    return np.array(secrets.SystemRandom().sample(range(n), n), dtype=np.int64)


def answer(key: bytes, names: list[str], points: np.ndarray, salt: bytes) -> tuple[np.ndarray, np.ndarray]:
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
    order = shuffled(rows.n_samples)
    double, own = answer(new_key(), _names(rows.ids[order]), points, salt.tobytes())
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
    return {"count": int(matched.sum())}


def intersect(fed: Federation, ids: np.ndarray, parties: Sequence[str], *, purpose: str = "train",
              mode: Mode = "both") -> Alignment:
    """The subset of ``ids`` that every party holds, found by PSI with each (one round, plus one in 'both')."""
    if not parties:
        return Alignment(ids=ids, asked=ids, held={}, widths={})
    order = np.argsort(ids, kind="stable")
    if not np.array_equal(order, np.arange(len(ids))):
        raise ProtocolError("PSI alignment expects the active party's IDs sorted")
    salt = secrets.token_bytes(32)
    key = new_key()
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
