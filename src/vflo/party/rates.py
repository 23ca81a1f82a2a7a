"""How fast each peer may ask a party to score: a token bucket per peer (``[policy] max_peer_requests_per_second``).

A bucket holds as many tokens as the rate gives each second (at least one), refills at the rate continuously,
and each scoring request takes a token; with the bucket empty the request is refused. The clock is handed in, so the
buckets are tested without waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` held (full at the start), read from ``clock`` (seconds)."""

    def __init__(self, rate: float, *, capacity: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0:
            raise ValueError(f"a token bucket refills at a positive rate, got {rate!r}")
        self.rate = float(rate)
        # A second's worth of requests, and at least one: a rate under 1 a second still lets one request through.
        self.capacity = float(capacity) if capacity is not None else max(1.0, self.rate)
        self._clock = clock
        self._tokens = self.capacity
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        # A clock that goes backwards (it should not: monotonic) adds nothing rather than taking tokens away.
        self._tokens = min(self.capacity, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = max(self._at, now)

    def ready(self) -> bool:
        """Whether a request now would be let through (nothing taken)."""
        self._refill()
        return self._tokens >= 1.0

    def take(self) -> bool:
        """Take a token for a request now: False (nothing taken) where the bucket is empty."""
        if not self.ready():
            return False
        self._tokens -= 1.0
        return True


class PeerRates:
    """A :class:`TokenBucket` per peer at ``rate`` requests a second (None: no limit; every request goes
    through). Thread-safe."""

    def __init__(self, rate: float | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def _bucket(self, peer: str) -> TokenBucket:
        assert self.rate is not None
        bucket = self._buckets.get(peer)
        if bucket is None:
            bucket = self._buckets[peer] = TokenBucket(self.rate, clock=self._clock)
        return bucket

    def ready(self, peer: str) -> bool:
        """Whether ``peer``'s next request would go through now (nothing taken)."""
        if self.rate is None:
            return True
        with self._lock:
            return self._bucket(peer).ready()

    def take(self, peer: str) -> bool:
        """A request of ``peer``'s now: whether it goes through (its token taken)."""
        if self.rate is None:
            return True
        with self._lock:
            return self._bucket(peer).take()


class Tally:
    """How many times each peer has been answered a kind, while the party runs: for kinds a party answers a peer
    only so often (``[policy] explore_answers``: two answers over people sets that differ by one person would say
    which of its bins that person is in). Thread-safe."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def take(self, kind: str, peer: str, most: int) -> bool:
        """Count one more answer of ``kind`` to ``peer``, unless it has had ``most``: then False, nothing counted."""
        with self._lock:
            seen = self._counts.get((kind, peer), 0)
            if seen >= most:
                return False
            self._counts[(kind, peer)] = seen + 1
            return True

    def count(self, kind: str, peer: str) -> int:
        """How many answers of ``kind`` ``peer`` has had."""
        with self._lock:
            return self._counts.get((kind, peer), 0)
