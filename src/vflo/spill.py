"""Matrices larger than a party wants to hold in memory, kept in files of its own and read a batch at a time.

Training on ten million rows makes intermediates no party can hold: APC-VFL's student latents of every active row
(10M x 256 float32 is 10 GB), the partners' uploaded latents of the shared rows, their joint input. A matrix larger
than ``limit_mb`` (:class:`SpillConfig`, the party's ``[spill]``) is written, block by block, to a file in the
party's scratch folder (:class:`RowSink`) and read back a batch of rows at a time (:class:`DiskRows`); a smaller one
stays an ordinary array. The numbers are the same either way: the training loop gathers the same rows in the same
order, and encoders score the same blocks.

A file is read with ``pread`` into the arrays asked for, never mapped, so what the process holds is the batch it
reads (the kernel may keep the file in its page cache, which it gives up under pressure: a machine with less memory
reads it from disk again). Each file is the party's own, in its own folder, and is removed when its matrix is no
longer used; nothing in it leaves the party.

The setting is the party's, not its process's: a party's node makes its ``[spill]`` current (:func:`using`) around
each message it handles, and the coordinating party around its own training, so parties that share a process (in
simulation) each keep their own limit and folder. :func:`configure` sets the process's default, for code run
outside any party.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vflo.errors import ConfigError
from vflo.private import private_folder

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SpillConfig:
    """``limit_mb``: a matrix larger than this is kept on disk (0: every one, -1: none, however large);
    ``folder``: where (``""``: the system's temporary folder)."""

    limit_mb: int = 1024
    folder: str = ""

    def __post_init__(self) -> None:
        if self.limit_mb < -1:
            raise ConfigError(f"[spill] limit_mb must be -1 (never), 0 (always) or a size in MB, got {self.limit_mb}")

    def spills(self, nbytes: int) -> bool:
        return self.limit_mb >= 0 and nbytes > self.limit_mb * (1 << 20)


_default = SpillConfig()  # the process's, for code run outside any party's using()
#: The party's setting, where a party's code runs (:func:`using`): a context variable, so each thread, and each
#: party's handler however nested in another's (as calls are in one process), sees its own party's.
_PARTY: ContextVar[SpillConfig | None] = ContextVar("vflo_party_spill", default=None)


def configure(config: SpillConfig) -> SpillConfig:
    """Make ``config`` the process's default, for code run outside any party's :func:`using`; returns the one it
    replaces."""
    global _default
    before, _default = _default, config
    return before


def current() -> SpillConfig:
    """The setting of the party whose code runs here (:func:`using`), else the process's (:func:`configure`)."""
    party = _PARTY.get()
    return party if party is not None else _default


@contextlib.contextmanager
def using(config: SpillConfig | None) -> Iterator[SpillConfig]:
    """``config`` as the current setting (:func:`current`) for the code run inside, in this thread and context
    alone: a party's node enters it, with its ``[spill]``, around each message it handles. None changes nothing."""
    if config is None:
        yield current()
        return
    token = _PARTY.set(config)
    try:
        yield config
    finally:
        _PARTY.reset(token)


def _remove(path: str, closers: list[Any]) -> None:
    for close in closers:
        with contextlib.suppress(BufferError, ValueError, OSError):  # a view still alive: the file goes anyway
            close()
    Path(path).unlink(missing_ok=True)


class DiskRows:
    """A matrix of ``shape`` and ``dtype`` in a file, read by rows: :meth:`take` (any rows) and slices (a run of
    rows); both return ordinary arrays. The file is removed when this object is collected.

    Rows are read with ``pread`` into the array returned, a run of consecutive rows at a time: the process maps
    none of the file (a memory map would: the kernel maps whole cached folios around each fault, so rows read at
    random from a file it has cached map most of that file into the process)."""

    ndim = 2

    def __init__(self, path: Path, rows: int, width: int, dtype: Any, *, limit_mb: int | None = None) -> None:
        self.path = path
        self._limit_mb = limit_mb  # the limit it was kept on disk under (the current one where not given)
        self.dtype = np.dtype(dtype)
        self.shape = (rows, width)
        self._row_bytes = width * self.dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY)
        with contextlib.suppress(AttributeError, OSError):  # random reads: no read-ahead beyond the rows asked
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._finalizer = weakref.finalize(self, _remove, str(path), [lambda fd=self._fd: os.close(fd)])

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return int(self.shape[0] * self.shape[1] * self.dtype.itemsize)

    def _read(self, out: np.ndarray, first_row: int) -> None:
        view = out.data.cast("B")  # out is C-contiguous: its rows are read into it in place
        offset, done = first_row * self._row_bytes, 0
        while done < len(view):  # one call reads at most about 2 GB
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"{self.path} ended early: the matrix file was changed or truncated")
            done += got

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The rows at ``positions``, in that order."""
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        if len(positions) and (positions.min() < 0 or positions.max() >= self.shape[0]):
            raise IndexError(f"row positions outside 0..{self.shape[0] - 1}")
        order = np.argsort(positions, kind="stable")
        ordered = positions[order]
        out = np.empty((len(positions), self.shape[1]), dtype=self.dtype)
        # Runs of consecutive rows (a repeated row starts a run of its own), each read by one call.
        starts = np.flatnonzero(np.diff(ordered, prepend=-2) != 1)
        stops = np.append(starts[1:], len(ordered))
        sorted_out = out if np.array_equal(order, np.arange(len(order))) else np.empty_like(out)
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            self._read(sorted_out[a:b], int(ordered[a]))
        if sorted_out is not out:
            out[order] = sorted_out
        return out

    def __getitem__(self, key: slice | np.ndarray) -> np.ndarray:
        """A run of rows (``rows[a:b]``), or the rows at an array of positions (as :meth:`take`)."""
        if not isinstance(key, slice):
            return self.take(np.asarray(key))
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            return self.take(np.arange(start, stop, step))
        out = np.empty((max(0, stop - start), self.shape[1]), dtype=self.dtype)
        if len(out):
            self._read(out, start)
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        limit = current().limit_mb if self._limit_mb is None else self._limit_mb
        raise ConfigError(
            f"a {self.shape[0]:,} x {self.shape[1]} matrix is kept on disk ({self.nbytes / 1e9:.1f} GB, over the "
            f"party's [spill] limit_mb = {limit}) and this step needs it in memory at once; use a model "
            "that reads it by rows (classifier = {model = 'mlp'}, hidden = [] for a linear one), or raise limit_mb")

    def __repr__(self) -> str:
        return f"DiskRows({self.shape[0]} x {self.shape[1]} {self.dtype}, {self.path})"


#: A matrix of rows: in memory, or on disk.
Rows = np.ndarray | DiskRows


class RowSink:
    """A matrix of ``rows`` x ``width`` written a block of rows at a time, in order: an array in memory while it
    is within the limit, else a file (:class:`DiskRows`)."""

    def __init__(self, rows: int, width: int, dtype: Any, *, what: str = "rows") -> None:
        self.shape = (rows, width)
        self.dtype = np.dtype(dtype)
        self.written = 0
        config = current()
        self._limit_mb = config.limit_mb
        nbytes = rows * width * self.dtype.itemsize
        self._memory: np.ndarray | None = None
        self._file: Any = None
        if not config.spills(nbytes):
            self._memory = np.empty(self.shape, dtype=self.dtype)
            return
        folder = Path(config.folder) if config.folder else Path(tempfile.gettempdir())
        try:
            private_folder(folder)  # mkstemp's file is its owner's only (0600); a folder it makes is too
            handle, name = tempfile.mkstemp(prefix="vflo-rows-", suffix=".bin", dir=folder)
        except OSError as exc:
            raise ConfigError(f"cannot keep {what} ({nbytes / 1e9:.1f} GB) on disk in {folder}: {exc}; set [spill] "
                              "folder to a writable folder with room") from exc
        self._path = Path(name)
        self._file = os.fdopen(handle, "wb")
        # Until finish() hands the file to a reader, an abandoned sink removes its file.
        self._finalizer = weakref.finalize(self, _remove, name, [self._file.close])
        logger.info("keeping %s (%d x %d, %.2f GB) on disk: %s", what, rows, width, nbytes / 1e9, name)

    def write(self, block: np.ndarray) -> None:
        block = np.asarray(block)
        stop = self.written + len(block)
        if block.ndim != 2 or block.shape[1] != self.shape[1] or stop > self.shape[0]:
            raise ValueError(f"a block of shape {block.shape} does not continue a {self.shape} matrix at row "
                             f"{self.written}")
        if self._memory is not None:
            self._memory[self.written:stop] = block
        else:
            self._file.write(np.ascontiguousarray(block, dtype=self.dtype).tobytes())
        self.written = stop

    def finish(self) -> Rows:
        if self.written != self.shape[0]:
            raise ValueError(f"{self.written} of {self.shape[0]} rows written")
        if self._memory is not None:
            return self._memory
        self._file.close()
        self._finalizer.detach()
        return DiskRows(self._path, *self.shape, self.dtype, limit_mb=self._limit_mb)


class Slotted:
    """Rows of ``values`` placed at ``slots``: row i is ``values[slots[i]]``, or zeros where ``slots[i]`` is -1 (a
    target that only some rows have, without a full-height matrix of zeros)."""

    ndim = 2

    def __init__(self, values: Rows, slots: np.ndarray) -> None:
        self.values = values
        self.slots = np.asarray(slots, dtype=np.int64)
        self.shape = (len(self.slots), int(values.shape[1]))
        self.dtype = values.dtype

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, positions: np.ndarray) -> np.ndarray:
        slots = self.slots[positions]
        has = slots >= 0
        out = np.zeros((len(slots), self.shape[1]), dtype=self.dtype)
        if has.any():
            out[has] = take(self.values, slots[has])
        return out


def take(rows: Rows | Slotted, positions: np.ndarray) -> np.ndarray:
    """The rows at ``positions`` of an array, a :class:`DiskRows` or a :class:`Slotted`."""
    if isinstance(rows, np.ndarray):
        out: np.ndarray = rows[positions]
        return out
    return rows.take(positions)
