"""X25519 for PSI: vflo's eight-lane implementation gives OpenSSL's bytes, RFC 7748's vectors, and refuses what
OpenSSL refuses."""

from __future__ import annotations

import numpy as np
import pytest

from vflo.align import curve
from vflo.errors import ProtocolError

P = 2**255 - 19
needs_native = pytest.mark.skipif(curve.backend() != "avx512-ifma",
                                  reason="this machine has no AVX-512 IFMA (or the extension was not built)")


def _point(value: int) -> bytes:
    return value.to_bytes(32, "little")


def test_rfc_7748_vectors_by_whichever_implementation_runs_here() -> None:
    # RFC 7748, section 5.2: the first two test vectors (scalar, u-coordinate, result).
    for scalar, u, out in (
        ("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
         "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
         "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"),
        ("4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
         "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
         "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957"),
    ):
        for use in ("openssl", curve.backend()):
            assert curve.blind(bytes.fromhex(scalar), bytes.fromhex(u), use=use).hex() == out  # type: ignore[arg-type]


@needs_native
@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 333])
def test_eight_lanes_give_openssls_bytes_for_any_count(n: int) -> None:
    # Counts below, at and past a multiple of the eight lanes: the last few are padded and cut off again.
    rng = np.random.default_rng(n)
    key = rng.integers(0, 256, 32, dtype=np.uint8).tobytes()
    points = rng.integers(0, 256, 32 * n, dtype=np.uint8).tobytes()
    assert curve.blind(key, points, use="avx512-ifma") == curve.blind(key, points, use="openssl")


@needs_native
def test_edge_values_of_the_u_coordinate() -> None:
    # Values at and past p (reduced mod p), with the top bit set (ignored), and small ones.
    key = bytes(range(32))
    for value in (P - 2, P + 2, P + 5, 2**255 - 1, 2**256 - 1, 2**255 + 9, 9, 2, 3, 2**254, 2**200 + 1):
        assert curve.blind(key, _point(value), use="avx512-ifma") == curve.blind(key, _point(value), use="openssl"), \
            value


@pytest.mark.parametrize("use", ["openssl", pytest.param("avx512-ifma", marks=needs_native)])
def test_a_point_of_small_order_is_refused_by_either(use: curve.Backend) -> None:
    for value in (0, 1, P - 1, P, P + 1):  # points of order 1, 2 or 4: each gives the all-zero result
        with pytest.raises(ProtocolError, match="small order"):
            curve.blind(bytes(range(32)), _point(9) + _point(value), use=use)


def test_wrong_sizes_are_refused() -> None:
    with pytest.raises(ProtocolError, match="32-byte"):
        curve.blind(b"k" * 31, b"p" * 32)
    with pytest.raises(ProtocolError, match="32-byte"):
        curve.blind(b"k" * 32, b"p" * 33)
    assert curve.blind(b"k" * 32, b"") == b""


def test_asking_for_the_eight_lanes_where_there_are_none_says_what_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(curve, "_native", lambda: None)
    assert curve.backend() == "openssl"
    with pytest.raises(ProtocolError, match="use 'openssl'"):
        curve.blind(b"k" * 32, b"p" * 32, use="avx512-ifma")
    assert curve.blind(b"k" * 32, _point(9)) == curve.blind(b"k" * 32, _point(9), use="openssl")
