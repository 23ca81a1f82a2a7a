"""People's IDs as both PSI engines see them: type-tagged text, checked unique."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vflo.data.order import in_order
from vflo.errors import DataError


@dataclass(frozen=True)
class IdFile:
    """Where a party's IDs for one purpose are: its file (Parquet or CSV) and the ID column's name."""

    path: Path
    id_column: str


def tagged(ids: np.ndarray) -> list[str]:
    """Each ID as text tagged with its type, so the int 7 and the text "7" are different people, whichever engine
    intersects them (vflo's own ECDH hashes these; the library reads them from a file)."""
    if ids.dtype.kind in "iu":
        return [f"i:{v}" for v in ids.tolist()]
    if ids.dtype.kind == "U":
        return [f"s:{v}" for v in ids.tolist()]
    return [f"i:{int(v)}" if isinstance(v, int | np.integer) else f"s:{v}" for v in ids.tolist()]


def tagged_array(ids: np.ndarray) -> pa.Array:
    """:func:`tagged` as an Arrow string array, built without a Python object per ID: quicker than a list of
    tagged strings, and holding the bytes of their text where a list holds a Python string per ID."""
    if ids.dtype.kind in "iu":
        out = pc.binary_join_element_wise("i:", pc.cast(pa.array(ids), pa.string()), "")
    elif ids.dtype.kind == "U":
        ascii_names = _ascii_tagged(ids)
        out = ascii_names if ascii_names is not None else pc.binary_join_element_wise(
            "s:", pa.array(ids, type=pa.string()), "")
    else:
        out = pa.array(tagged(ids), type=pa.string())
    # Many IDs come from NumPy in several chunks: one array, so that nothing walks them one by one.
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def _ascii_tagged(ids: np.ndarray) -> pa.Array | None:
    """Text IDs that are all ASCII (most are), tagged straight from NumPy's fixed-width code points into Arrow's
    buffers: a fraction of the time of converting them to UTF-8 and joining the tag. None when some character is
    not ASCII."""
    n, width = len(ids), ids.dtype.itemsize // 4
    points = np.ascontiguousarray(ids).view(np.uint32).reshape(n, width)
    if n == 0 or width == 0 or int(points.max()) >= 128:
        return None
    # NumPy pads a shorter text with NULs at its end (and drops trailing NULs): its length is up to its last other.
    filled = points != 0
    lengths = np.where(filled.any(axis=1), width - np.argmax(filled[:, ::-1], axis=1), 0)
    rows = np.empty((n, width + 2), dtype=np.uint8)
    rows[:, 0], rows[:, 1] = ord("s"), ord(":")
    rows[:, 2:] = points
    keep = np.ones((n, width + 2), dtype=bool)
    keep[:, 2:] = np.arange(width) < lengths[:, None]
    large = n * (width + 2) >= 2**31  # Arrow's string offsets are 32-bit; beyond, its large strings
    offsets = np.zeros(n + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(lengths + 2, out=offsets[1:])
    kind = pa.LargeStringArray if large else pa.StringArray
    return kind.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(rows[keep]))


def untagged(names: list[str], like: np.ndarray) -> np.ndarray:
    """The IDs ``names`` (as :func:`tagged` wrote them) as an array of ``like``'s type."""
    if like.dtype.kind in "iu":
        return np.array([int(n[2:]) for n in names], dtype=like.dtype)
    values = [int(n[2:]) if n.startswith("i:") else n[2:] for n in names]
    if like.dtype.kind == "U":
        return np.array(values, dtype=str)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def check_unique(names: list[str] | pa.Array, whose: str = "this party's", *, ids: np.ndarray | None = None) -> None:
    """Refuse a list that names someone twice: an intersection of sets cannot say which row is theirs.

    With ``ids`` (the IDs ``names`` tags), sorted numbers or texts are checked by comparing neighbours, far
    quicker than a hash of every name; the active party's IDs come sorted."""
    if ids is not None and ids.dtype.kind in "iuU" and in_order(ids, strictly=True):
        return  # tagging keeps a type's order and its distinctness: each above the one before, none repeats
    distinct = len(pc.unique(names)) if isinstance(names, pa.Array) else len(set(names))
    if distinct != len(names):
        raise DataError(f"private set intersection needs unique IDs; {whose} list repeats some: deduplicate it")


def canonical(ids: np.ndarray) -> np.ndarray:
    """``ids`` in the order of their tagged text: one order both parties reach for the same people, whatever
    array type each reads its IDs as."""
    if not len(ids):
        return ids
    ordered: np.ndarray = ids[pc.sort_indices(tagged_array(ids)).to_numpy()]
    return ordered


#: Names a block of :func:`digest` hashes at a time.
DIGEST_BLOCK = 1 << 20


def digest(ids: np.ndarray) -> str:
    """SHA-256 of the set of ``ids``: every tagged name in sorted order (by code point), each followed by a line
    break. What a party compares to know that the people it holds are those a kept alignment was made on.

    Sorted and joined in Arrow, a block at a time: ten million IDs take their tagged text and one index each, not
    a Python string each (an object's overhead more per ID)."""
    names = tagged_array(ids)
    order = pc.sort_indices(names)
    h = hashlib.sha256()
    for start in range(0, len(names), DIGEST_BLOCK):
        block = names.take(order[start : start + DIGEST_BLOCK])
        lines = pc.binary_join_element_wise(block, "", "\n")  # each name, then a line break
        width = np.int64 if pa.types.is_large_string(lines.type) else np.int32
        ends = np.frombuffer(lines.buffers()[1], dtype=width)[lines.offset : lines.offset + len(lines) + 1]
        h.update(memoryview(lines.buffers()[2])[ends[0] : ends[-1]])
    return h.hexdigest()
