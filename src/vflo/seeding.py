"""Seeds derived, never drawn from global state; a party's secret randomness its own.

Every random stream in vflo comes from an explicit seed and a name: the same seed, party and purpose
always give the same numbers, in any process, in any order. Two kinds of seed exist:

- the *run seed*, which the coordinator sends every party at setup: public, so it only salts streams;
- a party's :class:`PartySecret`, which never leaves the party: the operating system's randomness by default,
  or a seed in the party's own config (for reproducible runs). Every stream a party keeps from others (masks,
  projections, noise, its own model's initial weights and batch order) is drawn from it.
"""

from __future__ import annotations

import secrets
import zlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
else:
    from vflo.lazy import torch



def _key(part: int | str) -> int:
    if isinstance(part, str):
        return zlib.crc32(part.encode("utf-8"))
    return int(part) & 0xFFFFFFFF


def _width(seed: int) -> int:
    """A seed at its full width (SeedSequence takes any non-negative integer; a negative one is folded)."""
    seed = int(seed)
    return seed if seed >= 0 else (-seed << 1) | 1


def _sequence(seed: int, *keys: int | str) -> np.random.SeedSequence:
    # SeedSequence ignores trailing zeros, so (s, "a") and (s, "a", 0) would collide without the
    # closing word that encodes how many keys there are.
    return np.random.SeedSequence([_width(seed), *(_key(k) for k in keys), 0x9E3779B1 + len(keys)])


def _seed63(sequence: np.random.SeedSequence) -> int:
    return int(sequence.generate_state(1, dtype=np.uint64)[0]) & ((1 << 63) - 1)


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed from a base seed (all of its bits) and any number of names or numbers."""
    return _seed63(_sequence(seed, *keys))


def own_seed(rng: np.random.Generator) -> int:
    """A 63-bit seed drawn from a party's own stream, for code that takes an integer seed (estimators)."""
    return int(rng.integers(0, 1 << 63))


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *keys))


def torch_generator(seed: int, *keys: int | str) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, *keys))
    return gen


class PartySecret:
    """A party's own randomness: never sent, never derived from anything sent.

    ``seed`` comes from the party's own config (reproducible runs) or, by default, 128 bits of the operating
    system's cryptographic randomness. Streams are named by a public salt (the run seed the coordinator sends,
    so that runs differ), the party and a purpose; without the secret no one can recompute them.
    """

    __slots__ = ("_seed",)

    def __init__(self, seed: int | None = None) -> None:
        self._seed = secrets.randbits(128) if seed is None else _width(seed)

    def __repr__(self) -> str:  # never in a log or an error message
        return "PartySecret(<hidden>)"

    def _sequence(self, salt: int, *keys: int | str) -> np.random.SeedSequence:
        return np.random.SeedSequence([self._seed, _width(salt), *(_key(k) for k in keys), 0x5EC2E7 + len(keys)])

    def rng(self, salt: int, *keys: int | str) -> np.random.Generator:
        return np.random.default_rng(self._sequence(salt, *keys))

    def torch_generator(self, salt: int, *keys: int | str) -> torch.Generator:
        gen = torch.Generator()
        gen.manual_seed(_seed63(self._sequence(salt, *keys)))
        return gen

    def key(self, salt: int, *keys: int | str) -> bytes:
        """32 secret bytes for a keyed hash (per-row noise that is the same for the same row, see vflo.dp)."""
        return self._sequence(salt, *keys).generate_state(4, dtype=np.uint64).tobytes()
