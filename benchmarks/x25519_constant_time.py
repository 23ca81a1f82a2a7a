"""Does vflo's eight-lane X25519 take the same time whatever the key and the points? A dudect-style check
(benchmark and report, not a test; ``tests/test_curve_constant_time.py`` runs a short version of it).

    python -m benchmarks.x25519_constant_time [--samples 200000] [--seed N] [--openssl]
                                              [--out runs/bench/x25519_constant_time.json]

For each class, measurements of two kinds of input are interleaved in a random order: one fixed value (a key
such as all zeros, or eight copies of one point) and fresh random values, everything else the same. Welch's t
compares the two timing distributions, over all measurements and over those below several percentiles of the
pooled times (cropping, as dudect does: the slow tail is mostly the machine's noise, and a leak can hide in
it). |t| above 4.5 in any of them says the time depends on the input. ``--openssl`` measures OpenSSL's X25519
(through ``cryptography``) the same way, for comparison.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

THRESHOLD = 4.5  # dudect's: beyond it the two classes are told apart, far past what chance gives
CROPS = (50.0, 75.0, 90.0, 95.0, 99.0)  # percentiles of the pooled times; "all" is the uncropped test
LANES = 8
P = 2**255 - 19

Run = Callable[[bytes, bytes], object]


@dataclass(frozen=True)
class Leakage:
    """Welch's t of one class (fixed against random input), per crop of the times."""

    name: str
    samples: int
    t: dict[str, float]
    median_ns: dict[str, float]  # per kind of input, fixed and random

    @property
    def max_abs_t(self) -> float:
        return max(abs(v) for v in self.t.values())

    @property
    def leaks(self) -> bool:
        return self.max_abs_t > THRESHOLD


def welch_t(a: np.ndarray, b: np.ndarray) -> float:
    """Welch's t statistic of two samples (unequal variances)."""
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return 0.0
    return float((a.mean() - b.mean()) / np.sqrt(va + vb))


def t_by_crop(times: np.ndarray, fixed: np.ndarray) -> dict[str, float]:
    """Welch's t, fixed against random, over all times and over those below each of :data:`CROPS`."""
    out = {"all": welch_t(times[fixed], times[~fixed])}
    for pct in CROPS:
        keep = times <= np.percentile(times, pct)
        a, b = times[keep & fixed], times[keep & ~fixed]
        if len(a) > 1 and len(b) > 1:
            out[f"p{pct:g}"] = welch_t(a, b)
    return out


def measure(run: Run, keys: Sequence[bytes], points: Sequence[bytes], warmup: int = 200) -> np.ndarray:
    """Nanoseconds of ``run(keys[i], points[i])`` for each i, in order (after ``warmup`` untimed calls)."""
    for i in range(min(warmup, len(keys))):
        run(keys[i], points[i])
    clock = time.perf_counter_ns
    times = [0] * len(keys)
    for i in range(len(keys)):
        key, pts = keys[i], points[i]
        started = clock()
        run(key, pts)
        times[i] = clock() - started
    return np.asarray(times, dtype=np.float64)


def _random_points(rng: np.random.Generator, n: int) -> bytes:
    return rng.bytes(32 * n)


def scalar_inputs(rng: np.random.Generator, fixed_key: bytes, samples: int,
                  lanes: int = LANES) -> tuple[list[bytes], list[bytes], np.ndarray]:
    """Keys (``fixed_key`` or fresh random ones, in a random order) under one batch of random points."""
    fixed = rng.random(samples) < 0.5
    # Distinct objects with the fixed key's value, so both kinds are read from equally fresh memory.
    keys = [bytes(bytearray(fixed_key)) if f else rng.bytes(32) for f in fixed]
    batch = _random_points(rng, lanes)
    return keys, [batch] * samples, fixed


def point_inputs(rng: np.random.Generator, fixed_points: bytes, samples: int) -> tuple[list[bytes], list[bytes],
                                                                                        np.ndarray]:
    """Batches of points (``fixed_points`` or fresh random ones of its size, in a random order) under one key."""
    fixed = rng.random(samples) < 0.5
    key = rng.bytes(32)
    points = [bytes(bytearray(fixed_points)) if f else _random_points(rng, len(fixed_points) // 32) for f in fixed]
    return [key] * samples, points, fixed


def leakage(name: str, run: Run, inputs: tuple[list[bytes], list[bytes], np.ndarray]) -> Leakage:
    keys, points, fixed = inputs
    times = measure(run, keys, points)
    return Leakage(name, len(times), t_by_crop(times, fixed),
                   {"fixed": float(np.median(times[fixed])), "random": float(np.median(times[~fixed]))})


def _point(value: int) -> bytes:
    return value.to_bytes(32, "little")


def classes(rng: np.random.Generator) -> dict[str, tuple[str, bytes]]:
    """The fixed inputs tried, by name: ("scalar", key) or ("points", eight points)."""
    return {
        "scalar: all zeros (clamped to 2^254)": ("scalar", bytes(32)),
        "scalar: all ones (clamped to 2^255 - 8)": ("scalar", b"\xff" * 32),
        "scalar: bits alternating": ("scalar", b"\x55" * 32),
        "scalar: one random key": ("scalar", rng.bytes(32)),
        "points: u = 9": ("points", _point(9) * LANES),
        "points: u = 2": ("points", _point(2) * LANES),
        "points: u = p + 2 (not reduced)": ("points", _point(P + 2) * LANES),
        "points: u = 2^255 - 1 (top bit set, at least p)": ("points", _point(2**255 - 1) * LANES),
        "points: one random batch": ("points", _random_points(rng, LANES)),
    }


def check(name: str, kind: str, fixed: bytes, run: Run, samples: int, rng: np.random.Generator) -> Leakage:
    inputs = scalar_inputs(rng, fixed, samples) if kind == "scalar" else point_inputs(rng, fixed, samples)
    return leakage(name, run, inputs)


def _openssl_run() -> Run:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    def run(key: bytes, points: bytes) -> object:
        # Timed as vflo calls it: one key object per batch (its making is timed too), then point by point.
        private = X25519PrivateKey.from_private_bytes(key)
        return [private.exchange(X25519PublicKey.from_public_bytes(points[i:i + 32]))
                for i in range(0, len(points), 32)]

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200_000, help="measurements per class")
    parser.add_argument("--seed", type=int, default=None, help="inputs' seed (default: a fresh one, printed)")
    parser.add_argument("--openssl", action="store_true", help="also measure OpenSSL's X25519 the same way")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/x25519_constant_time.json"))
    args = parser.parse_args(argv)
    from vflo.align import curve

    seed: int = args.seed if args.seed is not None else secrets.randbits(63)
    rng = np.random.default_rng(seed)
    runs: dict[str, Run] = {}
    if curve.backend() == "avx512-ifma":
        runs["avx512-ifma"] = lambda key, pts: curve.blind(key, pts, use="avx512-ifma")
    else:
        print("this machine has no AVX-512 IFMA X25519 (the CPU lacks it or the extension was not built)",
              file=sys.stderr)
    if args.openssl:
        runs["openssl"] = _openssl_run()
    results: dict[str, Any] = {"seed": seed, "samples": args.samples, "threshold": THRESHOLD, "classes": {}}
    for impl, run in runs.items():
        for name, (kind, fixed) in classes(rng).items():
            found = check(name, kind, fixed, run, args.samples, rng)
            results["classes"].setdefault(impl, []).append(asdict(found) | {"max_abs_t": found.max_abs_t})
            verdict = "LEAKS" if found.leaks else "ok"
            crops = " ".join(f"{k}={v:+.2f}" for k, v in found.t.items())
            print(f"{impl:12s} {name:48s} max|t|={found.max_abs_t:6.2f} {verdict:5s} ({crops}; median ns "
                  f"fixed {found.median_ns['fixed']:.0f}, random {found.median_ns['random']:.0f})", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    leaky = [c["name"] for cs in results["classes"].values() for c in cs if c["max_abs_t"] > THRESHOLD]
    print(f"seed {seed}: " + (f"|t| > {THRESHOLD} for {leaky}" if leaky else f"every |t| <= {THRESHOLD}"))
    return 1 if leaky else 0


if __name__ == "__main__":
    sys.exit(main())
