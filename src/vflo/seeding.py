"""Seeds derived, never drawn from global state.

Every random stream in vflo comes from an explicit seed and a name: the same run
seed, party and purpose always give the same numbers, in any process, in any order.
"""

from __future__ import annotations

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


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed from a base seed and any number of names or numbers."""
    # SeedSequence ignores trailing zeros, so (s, "a") and (s, "a", 0) would collide without the
    # closing word that encodes how many keys there are.
    entropy = [int(seed) & 0xFFFFFFFF, *(_key(k) for k in keys), 0x9E3779B1 + len(keys)]
    ss = np.random.SeedSequence(entropy)
    return int(ss.generate_state(1, dtype=np.uint64)[0]) & ((1 << 63) - 1)


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *keys))


def torch_generator(seed: int, *keys: int | str) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, *keys))
    return gen
