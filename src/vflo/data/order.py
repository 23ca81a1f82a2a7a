"""Whether an array is already in order, checked in one pass: most parties' files come sorted, and a sort of
ten million text IDs is a copy of them and takes seconds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def in_order(values: np.ndarray, *, strictly: bool = False) -> bool:
    """Whether ``values`` are sorted (``strictly``: each above the one before, so also distinct)."""
    if len(values) < 2:
        return True
    ahead = values[1:] > values[:-1] if strictly else values[1:] >= values[:-1]
    return bool(np.all(ahead))


def sorted_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` sorted; as they are when they already are, without a sorted copy."""
    return ids if in_order(ids) else np.sort(ids)


#: Up to this many IDs are looked up one by one (a few microseconds each) rather than as an index of their own
#: (tens of microseconds to build, whatever their number): a batch served online names a few people.
FEW = 128


def positions_in(index: pd.Index, ids: np.ndarray) -> np.ndarray:
    """Where each of ``ids`` is in ``index`` (its IDs distinct), -1 where it holds none."""
    if len(ids) <= FEW:
        return np.fromiter((_position(index, i) for i in ids.tolist()), dtype=np.int64, count=len(ids))
    found: np.ndarray = index.get_indexer(pd.Index(ids)).astype(np.int64, copy=False)
    return found


def _position(index: pd.Index, person: Any) -> int:
    try:
        found = index.get_loc(person)
    except KeyError:
        return -1
    return found if isinstance(found, int) else -1
