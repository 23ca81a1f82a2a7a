"""Additively homomorphic encryption of gradient statistics, from SecretFlow's HEU (``sf-heu``), and a plaintext
stand-in for tests.

The label holder draws a key pair (:func:`new_keys`; HEU draws it from the operating system's randomness) and
encrypts each row's gradient and hessian in fixed point, the two packed into one ciphertext (HEU's batch
encoder: SecureBoost+'s packing). A party holding only the public key (:class:`PublicSide`) sums ciphertexts
per bin of its own columns and subtracts one node's sums from another's; only the key holder decrypts. Sums of
integers are exact under either backend, so the ``plaintext`` backend grows the same trees, for the
lossless check; it sends gradients in the clear, which reveals the labels, and exists for tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from vflo.errors import ConfigError

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


class PublicSide:
    """What a party holding the public key does with ciphertexts: load, sum per bin, subtract, dump."""

    def __init__(self, scheme: str, public_key: bytes) -> None:
        self.scheme = scheme
        if scheme == "plaintext":
            if public_key != _PLAIN_KEY:
                raise ConfigError("a plaintext public key that is not the plaintext backend's")
            self.kit = None
            return
        if scheme not in _HEU:
            raise ConfigError(f"unknown encryption scheme {scheme!r}; one of {list(SCHEMES)}")
        hnp, phe = _heu()
        key = phe.PublicKey.load_from(public_key)
        self.kit = hnp.setup(key)
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

    def bucket_sums(self, handle: Any, rows: np.ndarray, codes: np.ndarray, buckets: int) -> Any:
        """Per column and bucket, the sum over ``rows`` (positions) of the rows whose code is that bucket:
        (columns * buckets) x 2, column-major as HEU lays it out."""
        n, columns = codes.shape
        if self.kit is None:
            out = np.zeros((columns * buckets, 2), dtype=np.int64)
            index = codes[rows].astype(np.int64) + np.arange(columns, dtype=np.int64) * buckets
            for j in range(columns):
                np.add.at(out, index[:, j], handle[rows])
            return out
        mask = np.zeros((1, n), dtype=np.int8)
        mask[0, rows] = 1
        return self.evaluator.feature_wise_bucket_sum(handle, mask, codes, buckets, False)

    def sub(self, a: Any, b: Any) -> Any:
        if self.kit is None:
            return a - b
        return self.evaluator.sub(a, b)


class KeyPair(PublicSide):
    """The label holder's keys: it encrypts rows' statistics and decrypts sums."""

    def __init__(self, settings: HESettings) -> None:
        if settings.scheme == "plaintext":
            super().__init__("plaintext", _PLAIN_KEY)
            self.public_key = _PLAIN_KEY
            return
        hnp, phe = _heu()
        self.secret_kit = hnp.setup(getattr(phe.SchemaType, _HEU[settings.scheme]), settings.key_size)
        self.public_key = bytes(self.secret_kit.public_key().serialize())
        super().__init__(settings.scheme, self.public_key)
        self.encoder = _encoder(self.secret_kit)
        self.encryptor = self.secret_kit.encryptor()
        self.decryptor = self.secret_kit.decryptor()

    def encrypt(self, gh: np.ndarray) -> Any:
        """Rows x 2 integers (g and h in fixed point) as one ciphertext per row."""
        gh = np.ascontiguousarray(gh, dtype=np.int64)
        if self.kit is None:
            return gh.copy()
        return self.encryptor.encrypt(self.secret_kit.array(gh, self.encoder))

    def decrypt(self, handle: Any) -> np.ndarray:
        if self.kit is None:
            return np.asarray(handle, dtype=np.int64)
        out: np.ndarray = np.asarray(self.decryptor.decrypt(handle).to_numpy(self.encoder), dtype=np.int64)
        return out.reshape(-1, 2)


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


def new_keys(settings: HESettings) -> KeyPair:
    """A fresh key pair (the label holder's own; never derived from anything another party knows)."""
    return KeyPair(settings)
