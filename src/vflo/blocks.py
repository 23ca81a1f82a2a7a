"""Scoring many rows a block at a time, the blocks spread over worker threads.

In one PyTorch call per 100,000 rows, APC-VFL's student (24 -> 256 -> 256, SELU) spends most of its time passing
over 100 MB intermediates that do not fit in a cache, and its classifier most of its own copying the latents to
float64. A block of :data:`BLOCK` rows keeps every intermediate in the cache; each worker runs whole blocks with one
thread of its own (PyTorch and BLAS release the GIL). ``python -m benchmarks.executor`` times scoring by blocks with
one worker and with every core (its table is in docs/deploy.md).

One thread per block also keeps the numbers: PyTorch's single-threaded matrix products give a block's rows what
one single-threaded pass over all rows gives them, however many workers there are (NumPy's BLAS does not: a row's
result there depends on its place in the matrix), so a model scores the same with one thread or all cores, and
trains (one thread) on the latents it scores with.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

#: Rows per block: the widest intermediate of a 256-wide network is 2 MB, within a core's cache.
BLOCK = 2048
#: Rows handed over at a time between a matrix that may be kept on disk (vflo.spill) and the blocks: a whole number
#: of blocks, so chunked scoring gives the numbers of scoring every row at once.
CHUNK = 128 * BLOCK
_single = threading.Lock()


def threads() -> int:
    """Worker threads: ``OMP_NUM_THREADS`` where set (``vflo --threads``; one for training runs), else every core."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, int(value)) if value.isdigit() else max(1, os.cpu_count() or 1)


@contextmanager
def one_thread_each() -> Iterator[None]:
    """PyTorch and BLAS on one thread for each calling thread, for the duration (both settings are the process's,
    so concurrent callers take turns)."""
    from threadpoolctl import threadpool_limits

    with _single, threadpool_limits(1, user_api="blas"):
        torch = sys.modules.get("torch")
        before = torch.get_num_threads() if torch is not None else 1
        if torch is not None and before != 1:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            if torch is not None and before != 1:
                torch.set_num_threads(before)


def run_here(fn: Callable[[np.ndarray], Any], X: np.ndarray, width: int, dtype: Any) -> np.ndarray:
    """``fn`` applied to ``X`` a block of :data:`BLOCK` rows at a time, over :func:`threads` worker threads of this
    process (``fn`` of a block gives its rows: ``width`` columns, stored as ``dtype``). Callers go through
    :func:`vflo.executor.in_blocks`, which sends the blocks to the party's cluster where its config says so."""
    out = np.empty((X.shape[0], width), dtype=dtype)
    starts = range(0, X.shape[0], BLOCK)

    def fill(i: int) -> None:
        out[i:i + BLOCK] = np.asarray(fn(X[i:i + BLOCK])).reshape(-1, width)

    with one_thread_each():
        workers = min(threads(), len(starts))
        if workers <= 1:
            for i in starts:
                fill(i)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="vflo-blocks") as pool:
                list(pool.map(fill, starts))
    return out
