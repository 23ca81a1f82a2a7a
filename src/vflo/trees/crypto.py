"""Additively homomorphic encryption of gradient statistics, from SecretFlow's HEU (``sf-heu``), and a plaintext
stand-in for tests.

The label holder draws a key pair (:func:`new_keys`; HEU draws it from the operating system's randomness) and
encrypts each row's gradient and hessian in fixed point, the two packed into one ciphertext (HEU's batch
encoder: SecureBoost+'s packing). A party holding only the public key (:class:`PublicSide`) sums ciphertexts
per bin of its own columns and subtracts one node's sums from another's; only the key holder decrypts. Sums of
integers are exact under either backend, so the ``plaintext`` backend grows the same trees, for the
lossless check; it sends gradients in the clear, which reveals the labels, and exists for tests.

Large bin sums and decryptions are shared out among workers of the party's executor (:mod:`vflo.executor`: helper
processes of its own, or actors of its Ray cluster with ``[executor] kind = "ray"``), which run the calls this module
registers (:func:`vflo.helpers.call`). Each party's side uses the executor current where it is made: the party's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from vflo.errors import ConfigError
from vflo.executor import Executor, WorkerGroup, current
from vflo.helpers import HelperError, call

Scheme = Literal["ou", "paillier", "plaintext"]
SCHEMES: tuple[str, ...] = get_args(Scheme)
_HEU = {"ou": "OU", "paillier": "ZPaillier"}
_PLAIN_KEY = b"vflo-plaintext-for-tests"


@dataclass(frozen=True, kw_only=True)
class HESettings:
    """``scheme``: ``ou`` (Okamoto-Uchiyama, fast), ``paillier``, or ``plaintext`` (no encryption: tests only,
    every party sees the gradients); ``key_size`` in bits (2048 at least for OU and Paillier)."""

    scheme: Scheme = "ou"
    key_size: int = 2048

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ConfigError(f"he.scheme must be one of {list(SCHEMES)}, got {self.scheme!r}")
        if self.scheme != "plaintext" and self.key_size < 2048:
            raise ConfigError(f"he.key_size {self.key_size} is below 2048 bits, too weak for {self.scheme}; "
                              "use 2048 or more")


def _heu() -> Any:
    try:
        from heu import numpy as hnp
        from heu import phe
    except ImportError as exc:  # pragma: no cover - the dependency is declared
        raise ConfigError("homomorphic encryption needs SecretFlow's HEU: pip install 'sf-heu==0.5.2b0' "
                          "(or he.scheme = 'plaintext' in tests)") from exc
    return hnp, phe


def _encoder(kit: Any) -> Any:
    # Two int64 per plaintext, 32 bits of headroom each: sums of up to 2^32 rows never carry into the other.
    return kit.batch_integer_encoder(scale=1, padding_bits=32)


def processes(workers: int, executor: Executor | None = None) -> int:
    """``workers`` processes, 0 meaning as many as the party's executor has workers (one per core this process may
    use, unless its ``[executor]`` says otherwise)."""
    return workers or (executor if executor is not None else current()).workers


#: Fewest ciphertexts to decrypt worth sharing out among processes, and fewest ciphertext additions (to sum per bin)
#: worth sharing out: batches whose work in one process outweighs handing them out (what a decryption and an addition
#: cost on a machine is the ``floor`` part of ``python -m benchmarks.secureboost``).
PARALLEL_MIN = 2048
PARALLEL_SUMS = 100_000
#: Fewest rows to encrypt worth sharing out among processes (each share comes back serialized and is loaded again).
PARALLEL_ENCRYPT = 8192
#: Fewest ciphertexts to subtract worth sharing out (a subtraction costs about as much as a decryption).
PARALLEL_SUBTRACT = 64


def join(blobs: list[bytes]) -> bytes:
    """Serialized one-column ciphertext arrays (HEU's default format: msgpack of [rows, columns, dimensions, one
    byte string per ciphertext]) as one, their rows in order: an array encrypted, or subtracted, in pieces. HEU
    has no join of its own; a blob of another shape is refused rather than guessed at."""
    import msgpack

    rows, items, dims = 0, [], None
    for blob in blobs:
        try:
            head = msgpack.unpackb(blob, raw=True)
        except (ValueError, msgpack.UnpackException) as exc:
            raise ValueError(f"a ciphertext array that does not unpack: {exc}") from exc
        if not (isinstance(head, list) and len(head) == 4 and isinstance(head[3], list)
                and head[1] == 1 and len(head[3]) == head[0] and dims in (None, head[2])):
            raise ValueError("a ciphertext array not in the one-column layout that join knows (HEU's format changed?)")
        rows, dims = rows + head[0], head[2]
        items += head[3]
    return bytes(msgpack.packb([rows, 1, dims if dims is not None else 1, items], use_bin_type=False))


class PublicSide:
    """What a party holding the public key does with ciphertexts: load, sum per bin, dump. With ``workers``
    above 1, a large bin sum is cut by rows among this process and ``workers - 1`` workers of the party's executor
    (current when this side is made; HEU sums on one thread), each holding the tree's ciphertexts (:meth:`share`);
    :meth:`close` ends them."""

    def __init__(self, scheme: str, public_key: bytes, *, workers: int = 1, kit: Any = None) -> None:
        self.scheme = scheme
        self._executor = current()
        self.processes = processes(workers, self._executor)
        self._pool: WorkerGroup | None = None
        self._shared: Any = None
        self._shared_blob: bytes | None = None  # the shared ciphertexts as they arrived, sent on as they are
        self._sent = False  # whether the workers hold the shared ciphertexts
        if scheme == "plaintext":
            if public_key != _PLAIN_KEY:
                raise ConfigError("a plaintext public key that is not the plaintext backend's")
            self.kit = None
            return
        if scheme not in _HEU:
            raise ConfigError(f"unknown encryption scheme {scheme!r}; one of {list(SCHEMES)}")
        hnp, phe = _heu()
        self.public_key_bytes = public_key
        # Loading a public key is among HEU's slowest steps; the key holder passes its own kit instead.
        self.kit = kit if kit is not None else hnp.setup(phe.PublicKey.load_from(public_key))
        self.evaluator = self.kit.evaluator()
        self._hnp = hnp

    def load(self, blob: bytes) -> Any:
        if self.kit is None:
            arr = np.frombuffer(blob, dtype=np.int64)
            return arr.reshape(-1, 2).copy()
        return self._hnp.CiphertextArray.load_from(blob)

    def dump(self, handle: Any) -> bytes:
        if self.kit is None:
            return np.ascontiguousarray(handle, dtype=np.int64).tobytes()
        out: bytes = handle.serialize()
        return out

    def rows(self, handle: Any, positions: np.ndarray) -> Any:
        """The ciphertexts of some rows (in the order given)."""
        if self.kit is None:
            return handle[positions]
        return handle[positions.tolist()]

    def bucket_sums(self, handle: Any, rows: np.ndarray, codes: np.ndarray, buckets: int, *,
                    cumulative: bool = False) -> Any:
        """Per column and bucket, the sum over ``rows`` (positions) of the rows whose code is that bucket:
        (columns * buckets) x 2, column-major as HEU lays it out; with ``cumulative``, each bucket's sum runs
        over that bucket and the ones before it in its column."""
        columns = codes.shape[1]
        if self.kit is None:
            out = np.zeros((columns * buckets, 2), dtype=np.int64)
            index = codes[rows].astype(np.int64) + np.arange(columns, dtype=np.int64) * buckets
            for j in range(columns):
                np.add.at(out, index[:, j], handle[rows])
            if cumulative:
                out = out.reshape(columns, buckets, 2).cumsum(axis=1).reshape(-1, 2)
            return out
        if handle is not self._shared or self.processes < 2 or len(rows) * columns < PARALLEL_SUMS:
            return _bucket_sum(self.evaluator, handle, rows, codes, buckets, cumulative)
        workers = self._started(start_summer, self.scheme, self.public_key_bytes)
        if not self._sent:  # each worker keeps the tree's ciphertexts, sent once
            blob = self._shared_blob if self._shared_blob is not None else handle.serialize()
            workers.broadcast(hold, blob, codes, buckets)
            self._sent = True
        pieces = np.array_split(rows, self.processes)
        for i, piece in enumerate(pieces[1:]):
            workers.send(i, sum_rows, piece, cumulative)
        total = _bucket_sum(self.evaluator, handle, pieces[0], codes, buckets, cumulative)
        for i in range(workers.size):
            total = self.evaluator.add(total, self._hnp.CiphertextArray.load_from(workers.receive(i)))
        return total

    def subtract(self, a: Any, b: Any) -> Any:
        """``a - b``, ciphertext by ciphertext (same shapes); :data:`PARALLEL_SUBTRACT` or more cut into one share
        per process (HEU inverts a ciphertext to subtract it, on one thread), the pieces joined."""
        if self.kit is None:
            return np.asarray(a) - np.asarray(b)
        n = int(a.shape[0])
        if self.processes < 2 or n < PARALLEL_SUBTRACT:
            return self.evaluator.sub(a, b)
        workers = self._started(start_summer, self.scheme, self.public_key_bytes)
        cuts = np.linspace(0, n, self.processes + 1).astype(int).tolist()
        for w in range(workers.size):
            lo, hi = cuts[w + 1], cuts[w + 2]
            workers.send(w, subtract_rows, a[lo:hi].serialize(), b[lo:hi].serialize())
        mine = self.evaluator.sub(a[0:cuts[1]], b[0:cuts[1]]).serialize()
        return self._hnp.CiphertextArray.load_from(join([mine, *(workers.receive(w) for w in range(workers.size))]))

    def _started(self, start: Callable[..., None], *args: Any) -> WorkerGroup:
        """``processes - 1`` workers of the party's executor, set up with ``start(*args)`` the first time."""
        if self._pool is None:
            pool = self._executor.group(self.processes - 1)
            try:
                pool.broadcast(start, *args)
            except BaseException:
                pool.close()
                raise
            self._pool, self._sent = pool, False
        return self._pool

    def share(self, handle: Any, blob: bytes | None = None) -> None:
        """The ciphertexts the next bin sums run over (a tree's): helpers receive them once, when first needed
        (``blob``: the same serialized, as they arrived, so they need not be serialized again)."""
        self._shared, self._shared_blob, self._sent = handle, blob, False

    def close(self) -> None:
        """Ends the workers (this side stays usable, in this process alone until needed again)."""
        if self._pool is not None:
            self._pool.close()
        self._pool, self._sent = None, False

    def __enter__(self) -> PublicSide:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KeyPair(PublicSide):
    """The label holder's keys: it encrypts rows' statistics and decrypts sums, large batches shared out among
    this process and ``workers - 1`` workers of its executor (HEU decrypts on one thread); :meth:`close` ends
    them."""

    def __init__(self, settings: HESettings, *, workers: int = 1) -> None:
        if settings.scheme == "plaintext":
            super().__init__("plaintext", _PLAIN_KEY, workers=workers)
            self.public_key = _PLAIN_KEY
            return
        hnp, phe = _heu()
        self.secret_kit = hnp.setup(getattr(phe.SchemaType, _HEU[settings.scheme]), settings.key_size)
        self.public_key = bytes(self.secret_kit.public_key().serialize())
        super().__init__(settings.scheme, self.public_key, workers=workers, kit=self.secret_kit)
        self.encoder = _encoder(self.secret_kit)
        self.encryptor = self.secret_kit.encryptor()
        self.decryptor = self.secret_kit.decryptor()

    def encrypt(self, gh: np.ndarray) -> Any:
        """Rows x 2 integers (g and h in fixed point) as one ciphertext per row (:meth:`encrypted_blob`, loaded)."""
        gh = np.ascontiguousarray(gh, dtype=np.int64)
        if self.kit is None:
            return gh.copy()
        if self.processes < 2 or len(gh) < PARALLEL_ENCRYPT:
            return self._encrypt(gh)
        return self.load(self.encrypted_blob(gh))

    def encrypted_blob(self, gh: np.ndarray) -> bytes:
        """Rows x 2 integers encrypted, one ciphertext per row, serialized as :meth:`dump` writes them (to send
        as they are); :data:`PARALLEL_ENCRYPT` rows or more cut into one share per process, the workers
        encrypting theirs while this one does its own, the pieces joined (:func:`join`)."""
        gh = np.ascontiguousarray(gh, dtype=np.int64)
        if self.kit is None or self.processes < 2 or len(gh) < PARALLEL_ENCRYPT:
            return self.dump(self.encrypt(gh))
        workers = self._keyholders()
        shares = np.array_split(gh, self.processes)
        for w, share in enumerate(shares[1:]):
            workers.send(w, encrypt_rows, share)
        mine = self._encrypt(shares[0]).serialize()
        return join([mine, *(workers.receive(w) for w in range(workers.size))])

    def _encrypt(self, gh: np.ndarray) -> Any:
        return self.encryptor.encrypt(self.secret_kit.array(gh, self.encoder))

    def _keyholders(self) -> WorkerGroup:
        # The secret key goes to this party's own workers alone: its child processes, through a pipe (never a file
        # or a network), or, with [executor] kind = "ray", the actors of its own cluster in Ray's task messages.
        return self._started(start_decrypter, self.public_key, bytes(self.secret_kit.secret_key().serialize()))

    def decrypt(self, handle: Any) -> np.ndarray:
        if self.kit is None:
            return np.asarray(handle, dtype=np.int64)
        out: np.ndarray = np.asarray(self.decryptor.decrypt(handle).to_numpy(self.encoder), dtype=np.int64)
        return out.reshape(-1, 2)

    def decrypt_many(self, handles: list[Any]) -> list[np.ndarray]:
        """Each handle decrypted; a batch of :data:`PARALLEL_MIN` ciphertexts or more is cut into one share per
        process, this one decrypting its own while the workers do theirs."""
        sizes = [int(h.shape[0]) for h in handles] if self.kit is not None else []
        total = sum(sizes)
        if self.kit is None or self.processes < 2 or total < PARALLEL_MIN:
            return [self.decrypt(h) for h in handles]
        pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(self.processes)]  # handle, start, stop
        share, owner, room = -(-total // self.processes), 0, -(-total // self.processes)
        for i, size in enumerate(sizes):
            start = 0
            while start < size:
                take = min(room, size - start)
                pieces[owner].append((i, start, start + take))
                start, room = start + take, room - take
                if room == 0:
                    owner, room = owner + 1, share
        workers = self._keyholders()
        for w, mine in enumerate(pieces[1:]):
            workers.send(w, decrypt_pieces, [handles[i][a:b].serialize() for i, a, b in mine])
        parts: dict[int, list[np.ndarray]] = {i: [] for i in range(len(handles))}
        for i, a, b in pieces[0]:
            parts[i].append(self.decrypt(handles[i][a:b]))
        for w, mine in enumerate(pieces[1:]):
            for (i, _, _), values in zip(mine, workers.receive(w), strict=True):
                parts[i].append(values)
        return [np.concatenate(parts[i]) if parts[i] else np.zeros((0, 2), dtype=np.int64)
                for i in range(len(handles))]


def _bucket_sum(evaluator: Any, handle: Any, rows: np.ndarray, codes: np.ndarray, buckets: int,
                cumulative: bool = False) -> Any:
    mask = np.zeros((1, codes.shape[0]), dtype=np.int8)
    mask[0, rows] = 1
    return evaluator.feature_wise_bucket_sum(handle, mask, codes, buckets, cumulative)


# What a worker of the party's executor runs: each keeps its own state (a dict) between calls, as set up first.

def _held(state: dict[str, Any], *keys: str) -> tuple[Any, ...]:
    missing = [k for k in keys if k not in state]
    if missing:
        raise HelperError(f"this worker holds no {', '.join(missing)} yet: set it up first (sb.start_summer and "
                          "sb.hold before sb.sum_rows, sb.start_summer before sb.subtract_rows, sb.start_decrypter "
                          "before sb.encrypt_rows and sb.decrypt_pieces)")
    return tuple(state[k] for k in keys)


@call("sb.start_summer", stateful=True)
def start_summer(state: dict[str, Any], scheme: str, public_key: bytes) -> None:
    """Load the public key, to sum ciphertexts with."""
    side = PublicSide(scheme, public_key)
    state.update(hnp=side._hnp, evaluator=side.evaluator)


@call("sb.subtract_rows", stateful=True)
def subtract_rows(state: dict[str, Any], a: bytes, b: bytes) -> bytes:
    """``a - b`` of two serialized ciphertext arrays of the same shape, serialized."""
    hnp, evaluator = _held(state, "hnp", "evaluator")
    out: bytes = evaluator.sub(hnp.CiphertextArray.load_from(a), hnp.CiphertextArray.load_from(b)).serialize()
    return out


@call("sb.hold", stateful=True)
def hold(state: dict[str, Any], blob: bytes, codes: np.ndarray, buckets: int) -> None:
    """Keep a tree's ciphertexts and the bins of the party's rows, for the bin sums that follow."""
    (hnp,) = _held(state, "hnp")
    state.update(handle=hnp.CiphertextArray.load_from(blob), codes=codes, buckets=buckets)


@call("sb.sum_rows", stateful=True)
def sum_rows(state: dict[str, Any], rows: np.ndarray, cumulative: bool = False) -> bytes:
    """The bin sums over ``rows`` (positions) of the ciphertexts held."""
    evaluator, handle, codes, buckets = _held(state, "evaluator", "handle", "codes", "buckets")
    out: bytes = _bucket_sum(evaluator, handle, rows, codes, buckets, cumulative).serialize()
    return out


@call("sb.start_decrypter", stateful=True)
def start_decrypter(state: dict[str, Any], public_key: bytes, secret_key: bytes) -> None:
    """Load the key pair, to encrypt and decrypt with."""
    hnp, phe = _heu()
    kit = hnp.HeKit(phe.setup(phe.PublicKey.load_from(public_key), phe.SecretKey.load_from(secret_key)))
    state.update(hnp=hnp, kit=kit, decryptor=kit.decryptor(), encryptor=kit.encryptor(), encoder=_encoder(kit),
                 evaluator=kit.evaluator())


@call("sb.encrypt_rows", stateful=True)
def encrypt_rows(state: dict[str, Any], gh: np.ndarray) -> bytes:
    """Rows x 2 integers encrypted, one ciphertext per row, serialized."""
    kit, encryptor, encoder = _held(state, "kit", "encryptor", "encoder")
    out: bytes = encryptor.encrypt(kit.array(np.ascontiguousarray(gh, dtype=np.int64), encoder)).serialize()
    return out


@call("sb.decrypt_pieces", stateful=True)
def decrypt_pieces(state: dict[str, Any], blobs: list[bytes]) -> list[np.ndarray]:
    """Each blob of ciphertexts decrypted: rows x 2 integers."""
    hnp, decryptor, encoder = _held(state, "hnp", "decryptor", "encoder")
    return [np.asarray(decryptor.decrypt(hnp.CiphertextArray.load_from(b)).to_numpy(encoder),
                       dtype=np.int64).reshape(-1, 2) for b in blobs]


#: Bytes per row of a ciphertext blob on the wire: a party's row bound ([policy] max_rows) counts people, so a
#: blob of ciphertexts travels as rows of this many bytes rather than as one row per byte.
BLOB_ROW = 4096


def to_wire(blob: bytes) -> np.ndarray:
    """``blob`` as a uint8 matrix of ``BLOB_ROW`` columns: its length in the first 8 bytes, zeros after it."""
    framed = len(blob).to_bytes(8, "little") + blob
    rows = -(-len(framed) // BLOB_ROW)
    out = np.zeros(rows * BLOB_ROW, dtype=np.uint8)
    out[:len(framed)] = np.frombuffer(framed, dtype=np.uint8)
    return out.reshape(rows, BLOB_ROW)


def from_wire(array: np.ndarray) -> bytes:
    """The bytes :func:`to_wire` framed; a frame whose length does not fit its rows is refused."""
    flat = np.ascontiguousarray(array, dtype=np.uint8).reshape(-1)
    if flat.size < 8:
        raise ValueError("a ciphertext blob shorter than its length field")
    length = int.from_bytes(flat[:8].tobytes(), "little")
    if length > flat.size - 8:
        raise ValueError(f"a ciphertext blob says {length} bytes but carries {flat.size - 8}")
    return flat[8:8 + length].tobytes()


def plain_side() -> PublicSide:
    """The plaintext backend's side: a party's own columns, summed in the clear where no one else sees them."""
    return PublicSide("plaintext", _PLAIN_KEY)


def new_keys(settings: HESettings, *, workers: int = 1) -> KeyPair:
    """A fresh key pair (the label holder's own; never derived from anything another party knows), used in
    ``workers`` processes (0: one per core)."""
    return KeyPair(settings, workers=workers)
