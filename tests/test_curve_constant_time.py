"""vflo's eight-lane X25519 takes the same time whatever the key and the points: a short dudect-style check
(fixed against random input, interleaved at random, Welch's t over cropped timing distributions).
``python -m benchmarks.x25519_constant_time`` runs the long version and reports t for every class.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from benchmarks.x25519_constant_time import THRESHOLD, Leakage, Run, check, classes
from vflo.align import curve

pytestmark = pytest.mark.skipif(curve.backend() != "avx512-ifma",
                                reason="vflo's eight-lane X25519 does not run here (the CPU lacks AVX-512 IFMA or "
                                       "the optional extension was not built)")

SAMPLES = 30_000  # measurements per class: enough to tell apart a difference of a few hundred nanoseconds
CHECKED = ("scalar: all zeros (clamped to 2^254)", "scalar: all ones (clamped to 2^255 - 8)", "points: u = 9",
           "points: u = 2^255 - 1 (top bit set, at least p)")


def _kernel(key: bytes, points: bytes) -> object:
    return curve.blind(key, points, use="avx512-ifma")


def measured(name: str, run: Run, seed: int) -> tuple[Leakage, Leakage | None]:
    """One class measured, and measured again with fresh inputs if it crossed the threshold: a shared machine's
    noise (another job starting, a frequency change) seldom lines up with the classes twice, a leak always does."""
    rng = np.random.default_rng(seed)
    kind, fixed = classes(rng)[name]
    first = check(name, kind, fixed, run, SAMPLES, rng)
    return first, (check(name, kind, fixed, run, SAMPLES, rng) if first.leaks else None)


def _show(found: Leakage) -> str:
    return (f"{found.name}: max |t| {found.max_abs_t:.1f} over {found.samples} measurements "
            f"({', '.join(f'{k} {v:+.1f}' for k, v in found.t.items())})")


@pytest.mark.parametrize("name", CHECKED)
def test_the_time_does_not_depend_on_the_input(name: str) -> None:
    first, again = measured(name, _kernel, seed=CHECKED.index(name))
    assert again is None or not again.leaks, (f"|t| above {THRESHOLD} twice: {_show(first)}; then {_show(again)}")


def _leaky(extra: Callable[[], object]) -> Run:
    def run(key: bytes, points: bytes) -> object:
        out = _kernel(key, points)
        if key[3] & 1:  # a branch on one bit of the key, as a careless implementation might take
            extra()
        return out
    return run


def test_a_branch_on_one_bit_of_the_key_is_found() -> None:
    # The check's own power: a leak of a few hundred nanoseconds in a call of tens of microseconds.
    first, again = measured(CHECKED[0], _leaky(lambda: sum(range(10))), seed=99)
    assert first.leaks and again is not None and again.leaks, _show(first)
