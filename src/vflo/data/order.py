"""Whether an array is already in order, checked in one pass: most parties' files come sorted, and a sort of
ten million text IDs is a copy of them and takes seconds."""

from __future__ import annotations

import numpy as np


def in_order(values: np.ndarray, *, strictly: bool = False) -> bool:
    """Whether ``values`` are sorted (``strictly``: each above the one before, so also distinct)."""
    if len(values) < 2:
        return True
    ahead = values[1:] > values[:-1] if strictly else values[1:] >= values[:-1]
    return bool(np.all(ahead))


def sorted_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` sorted; as they are when they already are, without a sorted copy."""
    return ids if in_order(ids) else np.sort(ids)
