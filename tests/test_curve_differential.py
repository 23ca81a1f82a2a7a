"""vflo's eight-lane X25519 against OpenSSL's (through ``cryptography``): a million random (scalar, point) pairs
in calls of every size, fresh random pairs each run, and the edge cases: u at and past p, the top bit, limb
boundaries, small values, every point of small order (refused by both), the bits clamping clears or sets.

OpenSSL takes several times as long as the kernel for a point, so the million are the ones a fixed seed draws,
whose OpenSSL answers were computed once and are kept here as digests (``python -m tests.test_curve_differential``
computes them again); each run also compares fresh random pairs with OpenSSL as it runs, from a seed drawn anew
and printed in any failure. ``VFLO_X25519_SEED=N`` replays that seed and ``VFLO_X25519_CASES=N`` sets how many
pairs: ``VFLO_X25519_SEED=20261127 VFLO_X25519_CASES=1000000`` asks OpenSSL about the kept million again.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import secrets
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from vflo.align import curve
from vflo.errors import ProtocolError

pytestmark = pytest.mark.skipif(curve.backend() != "avx512-ifma",
                                reason="vflo's eight-lane X25519 does not run here (the CPU lacks AVX-512 IFMA or "
                                       "the optional extension was not built), so there is nothing to compare")

P = 2**255 - 19
A = 486662
ORDER = 2**252 + 27742317777372353535851937790883648493  # of the base point; the curve has 8 times as many
TWIST_ORDER = 2 * (P + 1) - 8 * ORDER  # 4 times a prime
LANES = 8
Call = tuple[bytes, bytes]  # (key, points)

# The million whose OpenSSL answers are kept: drawn from this seed by random_calls, answered by OpenSSL's X25519
# (cryptography 50.0.2, OpenSSL 4.0.3), hashed in CHUNKS runs of calls; and the hash of the inputs themselves,
# which tells a changed random generator from a wrong answer.
RECORDED_SEED, RECORDED_CASES, CHUNKS = 20261127, 1_000_000, 16
RECORDED_INPUTS = "facd14ee9700990972f9802be5003d30"
RECORDED_ANSWERS = (
    "0cc536dd409fd2661c202177ef42ba25",
    "ffe4eb1637c2c5de7a4c0e2bc7e8d98c",
    "9b6b75006d9fbefe6d470b7293bdecb2",
    "d8a6a09fe1033ebb83e323686c3da4fb",
    "8fd316af4f52d9d6f947adb41a2920f9",
    "e8948bfc62247ab91aa0ffb3694a64be",
    "d004ef7a9426e2678d8a4ecda1c739e4",
    "4d32bf9e642b84d320921414367cd830",
    "94221d9da20ceb693a5fd85a73daf32a",
    "1b2f190534cea4846a64176eceb421ed",
    "1b899ccf6eb224cb857e795a4f1c5727",
    "8c19404b6421f2a3ab587e228bf640f0",
    "b977105ababd2782c52aa6175d6d947f",
    "e3691314b25b056f9ba02af544054368",
    "85b637ce19526982175590b0996e1e85",
    "195086cc34fac509048af79dc4d012c9",
)
FRESH_CASES = 100_000


def _point(value: int) -> bytes:
    return value.to_bytes(32, "little")


def openssl(calls: Sequence[Call]) -> list[bytes | None]:
    """OpenSSL's X25519 of each call's points under its key, joined; None where it refuses a point."""
    out: list[bytes | None] = []
    for key, points in calls:
        private = X25519PrivateKey.from_private_bytes(key)
        try:
            out.append(b"".join(private.exchange(X25519PublicKey.from_public_bytes(points[i:i + 32]))
                                for i in range(0, len(points), 32)))
        except ValueError:  # a point of small order
            out.append(None)
    return out


def kernel(key: bytes, points: bytes) -> bytes | None:
    try:
        return curve.blind(key, points, use="avx512-ifma")
    except ProtocolError:
        return None


def _cores() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def kernel_all(calls: Sequence[Call]) -> list[bytes | None]:
    # The kernel releases the GIL: threads keep every core busy.
    with ThreadPoolExecutor(_cores()) as pool:
        return list(pool.map(lambda call: kernel(*call), calls))


def openssl_all(calls: Sequence[Call]) -> list[bytes | None]:
    """:func:`openssl` in one process per core (``cryptography`` holds the GIL through an exchange)."""
    # spawn, not fork: a test process may hold threads (gRPC, torch) whose locks a forked child would inherit.
    with ProcessPoolExecutor(_cores(), mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = [calls[run.start:run.stop] for run in _runs(calls, 4 * _cores())]
        return [out for part in pool.map(openssl, parts) for out in part]


def random_calls(rng: np.random.Generator, total: int) -> list[tuple[str, Call]]:
    """``total`` random points in calls of three shapes, each call under a fresh random key: small calls of 1 to 24
    points (two fifths of the points, most of the keys: every padding of one to three ladders), middling ones of 24
    to 1,031 and large ones of 2,048 to 32,775 points (each count's remainder by eight cycles through 0 to 7)."""
    calls: list[tuple[str, Call]] = []
    for shape, share in (("small", 0.4), ("middling", 0.3), ("large", 0.3)):
        left = round(total * share)
        while left > 0:
            i = len(calls)
            if shape == "small":
                n = 1 + i % 24
            elif shape == "middling":
                n = 8 * int(rng.integers(3, 129)) + i % LANES
            else:
                n = 8 * int(rng.integers(256, 4097)) + i % LANES
            n = min(n, left)
            calls.append((shape, (rng.bytes(32), rng.bytes(32 * n))))
            left -= n
    return calls


def _runs(calls: Sequence[Call], parts: int) -> list[range]:
    """``parts`` consecutive runs of call numbers with about the same number of points each (some may be empty)."""
    total = max(1, sum(len(p) for _, p in calls))
    ends, size = [0] * parts, 0
    for i, (_, points) in enumerate(calls):
        size += len(points)
        ends[min(parts - 1, (size - 1) * parts // total)] = i + 1
    for c in range(1, parts):
        ends[c] = max(ends[c], ends[c - 1])
    return [range(ends[c - 1] if c else 0, ends[c]) for c in range(parts)]


def _digest(parts: Iterable[bytes | None]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(b"refused" if part is None else part)
    return h.hexdigest()[:32]


def _inputs_digest(calls: Sequence[Call]) -> str:
    return _digest(key + points for key, points in calls)


def _seed() -> int:
    given = os.environ.get("VFLO_X25519_SEED")
    return int(given) if given else secrets.randbits(63)


def _mismatch(shape: str, number: int, key: bytes, points: bytes, got: bytes | None, want: bytes | None) -> str:
    where = ""
    if got is not None and want is not None:
        first = next(i for i in range(0, len(points), 32) if got[i:i + 32] != want[i:i + 32])
        where = (f", first at point {first // 32} of {len(points) // 32}: u={points[first:first + 32].hex()} "
                 f"kernel {got[first:first + 32].hex()} OpenSSL {want[first:first + 32].hex()}")
    return (f"{shape} call {number}, key {key.hex()}{where}"
            + ("" if where else f": kernel {'refused' if got is None else 'answered'}, "
                                f"OpenSSL {'refused' if want is None else 'answered'}"))


def _replay(seed: int, cases: int) -> str:
    return f"VFLO_X25519_SEED={seed} VFLO_X25519_CASES={cases} pytest {__file__} -k fresh replays them"


def _compare_live(replay: str, shaped: Sequence[tuple[str, Call]], ours: Sequence[bytes | None],
                  numbers: Sequence[int] | None = None) -> None:
    """The kernel's answers ``ours`` against OpenSSL's, now; ``numbers`` are the calls' numbers in the draw."""
    calls = [call for _, call in shaped]
    numbers = range(len(calls)) if numbers is None else numbers
    theirs = openssl_all(calls)
    bad = [i for i, (got, want) in enumerate(zip(ours, theirs, strict=True)) if got != want]
    assert not bad, (f"{len(bad)} of {len(calls)} calls differ from OpenSSL ({replay}): "
                     + "; ".join(_mismatch(shaped[i][0], numbers[i], *calls[i], ours[i], theirs[i])
                                 for i in bad[:3]))
    assert all(out is not None for out in ours), f"a random point of small order ({replay})"


def test_a_million_random_scalars_and_points_give_openssls_recorded_bytes() -> None:
    shaped = random_calls(np.random.default_rng(RECORDED_SEED), RECORDED_CASES)
    calls = [call for _, call in shaped]
    ours = kernel_all(calls)
    if _inputs_digest(calls) != RECORDED_INPUTS:
        # NumPy draws other numbers from the seed than when the answers were kept: ask OpenSSL now (slower).
        _compare_live(_replay(RECORDED_SEED, RECORDED_CASES), shaped, ours)
        return
    runs = _runs(calls, CHUNKS)
    wrong = [run for run, want in zip(runs, RECORDED_ANSWERS, strict=True)
             if _digest(ours[run.start:run.stop]) != want]
    if wrong:
        # Name the points: OpenSSL answers the first two runs of calls whose digest differs, now.
        suspects = [i for run in wrong[:2] for i in run]
        _compare_live(_replay(RECORDED_SEED, RECORDED_CASES), [shaped[i] for i in suspects],
                      [ours[i] for i in suspects], suspects)
        pytest.fail(f"{len(wrong)} of {CHUNKS} runs of the kernel's answers differ from OpenSSL's recorded ones, yet "
                    "OpenSSL answers them as the kernel does now: the recorded digests are stale (python -m "
                    "tests.test_curve_differential)")


def test_fresh_random_scalars_and_points_give_openssls_bytes() -> None:
    seed = _seed()
    total = int(os.environ.get("VFLO_X25519_CASES", FRESH_CASES))
    shaped = random_calls(np.random.default_rng(seed), total)
    assert sum(len(p) for _, (_, p) in shaped) == 32 * total
    _compare_live(_replay(seed, total), shaped, kernel_all([call for _, call in shaped]))


def _compare(key: bytes, values: Iterable[int]) -> None:
    """Each value alone and all of them together, starting at every lane: the kernel gives OpenSSL's bytes."""
    values = list(values)
    batch = b"".join(_point(v) for v in values)
    want = openssl([(key, batch)])[0]
    assert want is not None
    for value, i in zip(values, range(0, len(batch), 32), strict=True):
        assert kernel(key, _point(value)) == want[i:i + 32], (key.hex(), hex(value))
    for shift in range(LANES):  # rotations put each value in each lane
        cut = 32 * shift
        assert kernel(key, batch[cut:] + batch[:cut]) == want[cut:] + want[:cut], (key.hex(), shift)


def _keys() -> list[bytes]:
    """Keys at the ends of what clamping leaves (2^254, 2^255 - 8), alternating bits, and seeded random ones."""
    rng = np.random.default_rng(7748)
    return [bytes(32), b"\xff" * 32, b"\x55" * 32, b"\xaa" * 32, *(rng.bytes(32) for _ in range(4))]


EDGE_U = sorted({
    *range(2, 40),  # small values (0 and 1 are of small order)
    *(P + i for i in range(2, 19)),  # at least p, below 2^255: reduced first (p and p + 1 are of small order)
    *(P - i for i in range(2, 40)),  # just below p (p - 1 is of small order)
    *(2**k + d for k in (52, 104, 156, 208, 254) for d in (-1, 0, 1)),  # the limbs' edges
    *(2**255 - 2**k for k in (0, 1, 47, 48, 51, 52, 53, 104, 200)),  # every limb full, or nearly
    sum((2**52 - 1) << (52 * i) for i in range(4)) + (2**47 - 1) * 2**208,  # every limb at its largest
    *(2**256 - 1 - i for i in range(17)),  # the top bit set over p + 2 to 2^255 - 1
    *(2**255 + v for v in (2, 9, 2**200 + 1, P - 2)),  # the top bit set over ordinary values
})


def test_edge_u_coordinates_in_every_lane() -> None:
    for key in _keys():
        _compare(key, EDGE_U)


def test_u_past_p_and_the_top_bit_are_reduced_as_openssl_does() -> None:
    # u + p and u + 2^255 name the same point as u (RFC 7748 masks the top bit and reduces mod p).
    key = _keys()[-1]
    for u in (2, 3, 9, 18):
        names = [_point(v) for v in (u, u + P, u + 2**255, u + P + 2**255)]
        assert len({*(kernel(key, name) for name in names), *openssl([(key, name) for name in names])}) == 1, u


def _ladder(k: int, u: int) -> int:
    """x(k * (u, ...)) on Curve25519 or its twist (no clamping; 0 for the point at infinity): the textbook
    x-only ladder in Python integers, slow and independent of both implementations."""
    x2, z2, x3, z3 = 1, 0, u, 1
    for bit in reversed(range(k.bit_length())):
        if (k >> bit) & 1:
            x2, z2, x3, z3 = x3, z3, x2, z2
        x3, z3 = (4 * (x2 * x3 - z2 * z3) ** 2) % P, (4 * u * (x2 * z3 - z2 * x3) ** 2) % P
        x2, z2 = (x2 * x2 - z2 * z2) ** 2 % P, (4 * x2 * z2 * (x2 * x2 + A * x2 * z2 + z2 * z2)) % P
        if (k >> bit) & 1:
            x2, z2, x3, z3 = x3, z3, x2, z2
    return x2 * pow(z2, P - 2, P) % P


def small_order_u() -> set[int]:
    """Every u-coordinate of a point of small order: the curve's 8-torsion (ORDER times any point on it) and the
    twist's 4-torsion, found by multiplying seeded random points until no new value appears."""
    rng = np.random.default_rng(25519)
    found: set[int] = set()
    for _ in range(64):
        u = int.from_bytes(rng.bytes(32), "little") % P
        on_curve = pow((u**3 + A * u * u + u) % P, (P - 1) // 2, P) == 1
        found.add(_ladder(ORDER if on_curve else TWIST_ORDER // 4, u))
    return found


def test_every_point_of_small_order_is_refused_by_both_in_any_lane() -> None:
    torsion = small_order_u()
    assert len(torsion) == 5 and {0, 1, P - 1} < torsion  # 0, two of order 4 (curve, twist), two of order 8
    encodings = {v + extra for v in torsion for extra in (0, P, 2**255, P + 2**255) if v + extra < 2**256
                 and (extra % 2**255 == 0 or v + P < 2**255)}
    rng = np.random.default_rng(8)
    key = rng.bytes(32)
    for value in sorted(encodings):
        assert openssl([(key, _point(value))]) == [None], hex(value)  # the derivation agrees with OpenSSL
        for n, at in ((1, 0), (8, 0), (8, 7), (9, 8), (17, 3), (17, 16)):
            points = bytearray(rng.bytes(32 * n))
            points[32 * at:32 * at + 32] = _point(value)
            assert kernel(key, bytes(points)) is None, (hex(value), n, at)


def test_the_bits_clamping_sets_do_not_matter() -> None:
    # RFC 7748 clears the scalar's low three bits and its top bit and sets bit 254: keys that differ only there
    # give the same results, and OpenSSL's.
    rng = np.random.default_rng(254)
    points = rng.bytes(32 * 11)
    for key in (*_keys(), *(rng.bytes(32) for _ in range(8))):
        want = openssl([(key, points)])[0]
        for byte, mask in ((0, 1), (0, 2), (0, 4), (0, 7), (31, 128), (31, 64), (31, 192)):
            flipped = bytearray(key)
            flipped[byte] ^= mask
            assert kernel(bytes(flipped), points) == want == openssl([(bytes(flipped), points)])[0], \
                (key.hex(), byte, mask)
        assert kernel(key, points) == want


def test_a_wrong_answer_is_caught_and_named() -> None:
    # The comparison itself, fed one flipped bit: it fails, naming the seed that replays it and the point.
    shaped = random_calls(np.random.default_rng(5), 200)
    ours = kernel_all([call for _, call in shaped])
    wrong = bytearray(ours[3] or b"")
    wrong[32 * 2 + 5] ^= 16
    ours[3] = bytes(wrong)
    key, points = shaped[3][1]
    with pytest.raises(AssertionError) as caught:
        _compare_live(_replay(123, 200), shaped, ours)
    text = str(caught.value)
    assert "1 of " in text and "VFLO_X25519_SEED=123 VFLO_X25519_CASES=200" in text
    assert f"call 3, key {key.hex()}" in text
    assert f"point 2 of {len(points) // 32}: u={points[64:96].hex()}" in text


def record() -> str:
    """The constants above, as OpenSSL answers the million now."""
    calls = [call for _, call in random_calls(np.random.default_rng(RECORDED_SEED), RECORDED_CASES)]
    answers = openssl_all(calls)
    assert all(out is not None for out in answers)
    digests = ",\n    ".join(f'"{_digest(answers[run.start:run.stop])}"' for run in _runs(calls, CHUNKS))
    return f'RECORDED_INPUTS = "{_inputs_digest(calls)}"\nRECORDED_ANSWERS = (\n    {digests},\n)'


if __name__ == "__main__":
    print(record())
    sys.exit(0)
