"""The ledger: every message that crossed a transport, with its encoded size.

Communication figures (bytes, messages, rounds) are read from here and nowhere
else. Control messages (``control.*``: setup, teardown) are kept apart so a
method's own cost is what the paper would count, while the overhead stays visible.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from vflo.comm.message import CONTROL_PREFIX

Direction = Literal["request", "reply"]


@dataclass(frozen=True)
class LedgerEntry:
    """One message on the wire."""

    seq: int
    round: int
    sender: str
    receiver: str
    kind: str
    direction: Direction
    nbytes: int
    seconds: float

    @property
    def is_control(self) -> bool:
        return self.kind.startswith(CONTROL_PREFIX)


@dataclass(frozen=True)
class LedgerSummary:
    """Totals of a ledger, split into the method's traffic and control overhead."""

    bytes: int
    messages: int
    rounds: int
    control_bytes: int
    control_messages: int

    @property
    def megabytes(self) -> float:
        return self.bytes / 1e6


class Ledger:
    """Thread-safe append-only record of messages."""

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

    def record(
        self, *, round: int, sender: str, receiver: str, kind: str, direction: Direction, nbytes: int,
    ) -> LedgerEntry:
        with self._lock:
            entry = LedgerEntry(
                seq=len(self._entries), round=round, sender=sender, receiver=receiver, kind=kind,
                direction=direction, nbytes=nbytes, seconds=time.perf_counter() - self._t0,
            )
            self._entries.append(entry)
            return entry

    def extend(self, entries: Iterable[LedgerEntry]) -> None:
        """Merge entries recorded elsewhere (e.g. by a remote party), renumbering them."""
        with self._lock:
            for e in entries:
                self._entries.append(
                    LedgerEntry(**{**asdict(e), "seq": len(self._entries)})
                )

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        with self._lock:
            return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def summary(self) -> LedgerSummary:
        entries = self.entries
        data = [e for e in entries if not e.is_control]
        control = [e for e in entries if e.is_control]
        return LedgerSummary(
            bytes=sum(e.nbytes for e in data),
            messages=len(data),
            rounds=len({e.round for e in data}),
            control_bytes=sum(e.nbytes for e in control),
            control_messages=len(control),
        )

    def by_kind(self) -> dict[str, dict[str, int]]:
        """Bytes and message counts per message kind and direction."""
        out: dict[str, dict[str, int]] = {}
        for e in self.entries:
            row = out.setdefault(e.kind, {"messages": 0, "bytes": 0, "request_bytes": 0, "reply_bytes": 0})
            row["messages"] += 1
            row["bytes"] += e.nbytes
            row[f"{e.direction}_bytes"] += e.nbytes
        return out

    def by_party(self) -> dict[str, dict[str, int]]:
        """Bytes each party sent and received (method traffic only)."""
        out: dict[str, dict[str, int]] = {}
        for e in self.entries:
            if e.is_control:
                continue
            out.setdefault(e.sender, {"sent_bytes": 0, "sent_messages": 0, "received_bytes": 0, "received_messages": 0})
            out.setdefault(e.receiver, {"sent_bytes": 0, "sent_messages": 0, "received_bytes": 0,
                                        "received_messages": 0})
            out[e.sender]["sent_bytes"] += e.nbytes
            out[e.sender]["sent_messages"] += 1
            out[e.receiver]["received_bytes"] += e.nbytes
            out[e.receiver]["received_messages"] += 1
        return out

    def to_records(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.entries]

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> Ledger:
        ledger = cls()
        ledger.extend(LedgerEntry(**dict(r)) for r in records)
        return ledger
