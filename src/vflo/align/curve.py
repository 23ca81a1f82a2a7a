"""X25519 (RFC 7748) on many points under one scalar, the whole cost of vflo's ECDH PSI.

Two implementations give the same bytes: vflo's compiled extension (``vflo.align._x25519``, eight points at a
time in AVX-512 IFMA lanes, several times as fast on one core) where the CPU has those instructions and the
install could compile it, else OpenSSL's X25519 through ``cryptography``, one point at a time
(``python -m benchmarks.x25519`` times both; its figures are in docs/deploy.md).
:func:`backend` names the one in use; the tests check the two against each other and RFC 7748's vectors.
"""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from vflo.errors import ProtocolError

Backend = Literal["avx512-ifma", "openssl"]
POINT = 32


@cache
def _native() -> ModuleType | None:
    try:
        module = importlib.import_module("vflo.align._x25519")
    except ImportError:  # built without a C compiler: the extension is optional
        return None
    return module if module.available() else None


def backend() -> Backend:
    """The implementation :func:`blind` uses on this machine."""
    return "avx512-ifma" if _native() is not None else "openssl"


def blind(key: bytes, points: bytes, *, use: Backend | None = None) -> bytes:
    """Each 32-byte point of ``points`` raised to the scalar ``key`` (X25519), joined in the same order.

    ``use`` picks an implementation (the default: :func:`backend`). A point of small order, whose result would be
    all zeros, raises :class:`~vflo.errors.ProtocolError` with either.
    """
    if len(key) != POINT or len(points) % POINT:
        raise ProtocolError(f"X25519 takes a 32-byte key and 32-byte points, got {len(key)} and {len(points)} bytes")
    native = _native() if use != "openssl" else None
    if use == "avx512-ifma" and native is None:
        raise ProtocolError("this machine has no AVX-512 IFMA X25519 (the CPU lacks it or the extension was not "
                            "built); use 'openssl'")
    try:
        if native is not None:
            out: bytes = native.blind(key, points)
            return out
        scalar = X25519PrivateKey.from_private_bytes(key)
        return b"".join(scalar.exchange(X25519PublicKey.from_public_bytes(points[i : i + POINT]))
                        for i in range(0, len(points), POINT))
    except ValueError as exc:  # both refuse a point whose multiple is zero
        raise ProtocolError(f"a PSI point of small order: {exc}") from exc
