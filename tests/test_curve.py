"""X25519 for PSI: vflo's eight-lane implementation gives OpenSSL's bytes, RFC 7748's vectors, and refuses what
OpenSSL refuses. The kernel's further checks: a million random pairs and the edge cases against OpenSSL
(test_curve_differential.py), its timing (test_curve_constant_time.py), the sanitizers (test_curve_sanitizers.py).
"""

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


# RFC 7748: section 5.2's two test vectors, then section 6.1's Diffie-Hellman (each side's public key from the
# base point 9, and the shared secret both ways), as (scalar, u-coordinate, result).
ALICE, BOB = ("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
              "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
ALICE_PUBLIC, BOB_PUBLIC = ("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a",
                            "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
RFC_7748_VECTORS: tuple[tuple[str, str, str], ...] = (
    ("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
     "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
     "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"),
    ("4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
     "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
     "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957"),
    (ALICE, _point(9).hex(), ALICE_PUBLIC),
    (BOB, _point(9).hex(), BOB_PUBLIC),
    (ALICE, BOB_PUBLIC, SHARED),
    (BOB, ALICE_PUBLIC, SHARED),
)
# Section 5.2's iteration: k and u start at 9, then k, u = X25519(k, u), k; the result after 1 and 1,000 rounds.
RFC_7748_ITERATED = {1: "422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079",
                     1000: "684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51"}
USES = ["openssl", pytest.param("avx512-ifma", marks=needs_native)]


@pytest.mark.parametrize("use", USES)
def test_rfc_7748_vectors(use: curve.Backend) -> None:
    for scalar, u, out in RFC_7748_VECTORS:
        assert curve.blind(bytes.fromhex(scalar), bytes.fromhex(u), use=use).hex() == out, (scalar, u)


@pytest.mark.parametrize("use", USES)
def test_rfc_7748_iterated_vectors(use: curve.Backend) -> None:
    # Each round feeds one output back in as the next key: an error anywhere compounds to a wrong final value.
    k = u = _point(9)
    for rounds in range(1, max(RFC_7748_ITERATED) + 1):
        k, u = curve.blind(k, u, use=use), k
        if rounds in RFC_7748_ITERATED:
            assert k.hex() == RFC_7748_ITERATED[rounds], rounds


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


@pytest.mark.parametrize("use", USES)
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
