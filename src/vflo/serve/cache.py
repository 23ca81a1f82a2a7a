"""Answers given again: a person's answer, scored with every partner of a model version, kept for a time to live
(``[models.NAME] cache_seconds``; off by default), so that a person asked about again within it costs the
partners nothing. Keyed by the model's version: a model swapped in starts empty."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

Record = dict[str, Any]


class AnswerCache:
    """At most ``people`` answers, each given again for ``seconds`` after it was scored; ``clock``: seconds
    (monotonic), for tests."""

    def __init__(self, *, seconds: float, people: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.people, self.clock = seconds, people, clock
        self._kept: OrderedDict[tuple[str, str], tuple[float, Record]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, version: str, ids: Sequence[object]) -> list[Record] | None:
        """Every one of ``ids``'s kept answers, in order, or None if one is missing or past its time (a request is
        answered from the cache whole, or scored whole)."""
        now, found = self.clock(), []
        for person in ids:
            kept = self._kept.get((version, str(person)))
            if kept is None or kept[0] < now:
                self.misses += 1
                return None
            found.append(kept[1])
        self.hits += 1
        return found

    def put(self, version: str, records: Sequence[Record], *, complete: Callable[[Record], bool]) -> None:
        """Keep the answers that ``complete`` says were scored with every partner (one scored without some would
        be given again after the partner is back)."""
        until = self.clock() + self.seconds
        for record in records:
            if record.get("error") or not complete(record):
                continue
            key = (version, str(record["id"]))
            self._kept[key] = (until, record)
            self._kept.move_to_end(key)
        while len(self._kept) > self.people:
            self._kept.popitem(last=False)
