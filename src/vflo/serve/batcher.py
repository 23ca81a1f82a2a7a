"""Requests arriving together, scored together: a micro-batch closes at ``max_people`` people or ``max_wait``
seconds after its first request, whichever comes first, and is scored in one call (one round trip per partner);
each request gets its own people's records back. One batch at a time per model, on one worker thread, which also
makes the records: the event loop only hands them out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

logger = logging.getLogger(__name__)

Record = dict[str, Any]
#: ``score(ids, features, since)``: one record per ID; ``since``, when the batch's oldest request arrived
#: (time.monotonic).
Score = Callable[[list[object], pd.DataFrame | None, float], list[Record]]


@dataclass
class _Pending:
    ids: list[object]
    features: pd.DataFrame | None
    done: asyncio.Future[list[Record]]
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """Micro-batches for one model: ``score(ids, features)`` returns one record per ID (its ``"id"``);
    ``id_column`` names the ID in a request's feature rows; ``on_batch(people, seconds)`` hears of each batch
    scored (for metrics)."""

    def __init__(self, score: Score, *, id_column: str, max_people: int, max_wait: float,
                 on_batch: Callable[[int, float], None] | None = None, ready: asyncio.Event | None = None) -> None:
        if max_people < 1 or max_wait < 0:
            raise ValueError("a micro-batch holds at least one person and waits a non-negative time")
        self.score, self.id_column = score, id_column
        self.max_people, self.max_wait = max_people, max_wait
        self.on_batch = on_batch
        # Set once the model it scores with is live (a swap queues requests here while the old one drains).
        self.ready = ready
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vflo-serve")

    async def submit(self, ids: Sequence[object], features: pd.DataFrame | None = None) -> list[Record]:
        """This request's people scored, in its order (with whichever requests arrive beside it)."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run())
        pending = _Pending(list(ids), features, asyncio.get_running_loop().create_future())
        await self._queue.put(pending)
        return await pending.done

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            self._busy = True
            if self.ready is not None:
                await self.ready.wait()
            people = len(batch[0].ids)
            closes = loop.time() + self.max_wait
            while people < self.max_people:
                left = closes - loop.time()
                try:
                    nxt = self._queue.get_nowait() if left <= 0 else await asyncio.wait_for(self._queue.get(), left)
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                batch.append(nxt)
                people += len(nxt.ids)
            try:
                await self._score(loop, batch)
            finally:
                self._busy = False

    async def _score(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        # Each person once: two requests for the same person share its row.
        ids = list(dict.fromkeys(i for p in batch for i in p.ids))
        given = [p.features for p in batch if p.features is not None and len(p.features)]
        features = pd.concat(given, ignore_index=True).drop_duplicates(self.id_column) if given else None
        started = time.perf_counter()
        try:
            # The batch's oldest request says how long its partners may still take (its deadline counts from it).
            since = min(p.arrived for p in batch)
            frame = await loop.run_in_executor(self._executor, self.score, ids, features, since)
        except Exception as exc:  # every request of the batch gets the failure, said once in the log
            logger.warning("a batch of %d people failed: %s", len(ids), exc)
            for p in batch:
                if not p.done.done():
                    p.done.set_exception(exc)
            return
        if self.on_batch is not None:
            self.on_batch(len(ids), time.perf_counter() - started)
        by_id = {str(r["id"]): r for r in frame}
        for p in batch:
            if not p.done.done():
                p.done.set_result([by_id[str(i)] for i in p.ids])

    async def drain(self, *, poll: float = 0.001, limit: float = 60.0) -> None:
        """Wait until every request handed to this batcher is answered (bounded by ``limit`` seconds)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + limit
        while (self._busy or (self._queue is not None and not self._queue.empty())) and loop.time() < until:
            await asyncio.sleep(poll)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

