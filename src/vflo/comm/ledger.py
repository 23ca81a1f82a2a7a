"""The ledger: every message that crossed a transport, with its encoded size.

Communication figures (bytes, messages, rounds) are read from here and nowhere
else. Three kinds of traffic are told apart by the message kind's prefix:

* ``control.*`` – installing and removing a method at each party;
* ``align.*`` – finding the shared IDs (plain alignment, or private set intersection);
* everything else – the method's own exchanges, which is what the papers count.

All three are recorded and reported; the method's own traffic is the headline figure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import numpy as np

from vflo.comm.message import ALIGN_PREFIX, CONTROL_PREFIX

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
    # For a reply, the ``seq`` of the request it answers; -1 for a request.
    reply_to: int = -1
    # Bytes of transport framing around the frame (its length header in a batched call), not in ``nbytes``:
    # in-process and over the network, ``nbytes`` counts the same frames.
    framing: int = 0

    @property
    def is_control(self) -> bool:
        return self.kind.startswith(CONTROL_PREFIX)

    @property
    def is_align(self) -> bool:
        return self.kind.startswith(ALIGN_PREFIX)

    @property
    def is_method(self) -> bool:
        return not (self.is_control or self.is_align)


#: Each field of a ledger entry and its type, in order: the columns a party hands its ledger over in.
COLUMNS: dict[str, type] = {"seq": int, "round": int, "sender": str, "receiver": str, "kind": str, "direction": str,
                            "nbytes": int, "seconds": float, "reply_to": int, "framing": int}


@dataclass(frozen=True)
class LedgerSummary:
    """Totals of a ledger: the method's own traffic, alignment, and control overhead."""

    bytes: int
    messages: int
    rounds: int
    align_bytes: int
    align_rounds: int
    control_bytes: int
    control_messages: int
    # Method requests that got no reply (a party that timed out or dropped its answer).
    unanswered: int = 0
    # Transport framing of batched calls (8 bytes a frame), over every entry.
    framing_bytes: int = 0


class Ledger:
    """Thread-safe append-only record of messages."""

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

    def record(
        self, *, round: int, sender: str, receiver: str, kind: str, direction: Direction, nbytes: int,
        reply_to: int = -1, framing: int = 0,
    ) -> LedgerEntry:
        with self._lock:
            entry = LedgerEntry(
                seq=len(self._entries), round=round, sender=sender, receiver=receiver, kind=kind,
                direction=direction, nbytes=nbytes, seconds=time.perf_counter() - self._t0, reply_to=reply_to,
                framing=framing,
            )
            self._entries.append(entry)
            return entry

    def extend(self, entries: Iterable[LedgerEntry]) -> None:
        """Merge entries recorded elsewhere (e.g. by a remote party), renumbering them."""
        with self._lock:
            offset = len(self._entries)
            for e in entries:
                reply_to = e.reply_to + offset if e.reply_to >= 0 else -1
                self._entries.append(LedgerEntry(**{**asdict(e), "seq": len(self._entries), "reply_to": reply_to}))

    def reordered(self, order: Sequence[int]) -> Ledger:
        """A ledger of these entries in ``order`` (indices, each once), renumbered; a reply still names its
        request."""
        entries = self.entries
        if sorted(order) != list(range(len(entries))):
            raise ValueError("reordered: order must list every entry once")
        new = {old: i for i, old in enumerate(order)}
        out = Ledger()
        out._entries = [replace(entries[old], seq=i, reply_to=new[entries[old].reply_to] if entries[old].reply_to >= 0
                                else -1) for i, old in enumerate(order)]
        return out

    def drain(self) -> list[LedgerEntry]:
        """Hand over every entry and start empty (a remote party's ledger, collected after a run)."""
        with self._lock:
            entries, self._entries = self._entries, []
            return entries

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        with self._lock:
            return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def summary(self, start: int = 0, stop: int | None = None) -> LedgerSummary:
        """Totals over all entries, or over entries ``start:stop`` (e.g. one phase of a run)."""
        entries = self.entries[start:stop]
        data = [e for e in entries if e.is_method]
        align = [e for e in entries if e.is_align]
        control = [e for e in entries if e.is_control]
        answered = {e.reply_to for e in entries if e.direction == "reply"}
        unanswered = sum(1 for e in data if e.direction == "request" and e.seq not in answered)
        return LedgerSummary(
            bytes=sum(e.nbytes for e in data),
            messages=len(data),
            rounds=len({e.round for e in data}),
            align_bytes=sum(e.nbytes for e in align),
            align_rounds=len({e.round for e in align}),
            control_bytes=sum(e.nbytes for e in control),
            control_messages=len(control),
            unanswered=unanswered,
            framing_bytes=sum(e.framing for e in entries),
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
            if not e.is_method:
                continue
            out.setdefault(e.sender, {"sent_bytes": 0, "sent_messages": 0, "received_bytes": 0, "received_messages": 0})
            out.setdefault(e.receiver, {"sent_bytes": 0, "sent_messages": 0, "received_bytes": 0,
                                        "received_messages": 0})
            out[e.sender]["sent_bytes"] += e.nbytes
            out[e.sender]["sent_messages"] += 1
            out[e.receiver]["received_bytes"] += e.nbytes
            out[e.receiver]["received_messages"] += 1
        return out

    @staticmethod
    def to_columns(entries: Sequence[LedgerEntry]) -> dict[str, np.ndarray]:
        """``entries`` as one array per field (:data:`COLUMNS`): how a party hands its own ledger over, in the
        codec's own arrays rather than as text to parse."""
        return {f"ledger.{name}": np.asarray([getattr(e, name) for e in entries],
                                            dtype=str if kind is str else np.float64 if kind is float else np.int64)
                for name, kind in COLUMNS.items()}

    @staticmethod
    def from_columns(columns: Mapping[str, Any]) -> list[LedgerEntry]:
        """The entries :meth:`to_columns` wrote; a :class:`ValueError` where the columns are not a ledger."""
        arrays = {name: np.asarray(columns[f"ledger.{name}"]) for name in COLUMNS}
        n = {len(a) for a in arrays.values()}
        if len(n) != 1 or any(a.ndim != 1 for a in arrays.values()):
            raise ValueError("the ledger's columns differ in length")
        if not set(arrays["direction"].tolist()) <= {"request", "reply"}:
            raise ValueError("a ledger entry's direction is 'request' or 'reply'")
        return [LedgerEntry(**{name: kind(arrays[name][i]) for name, kind in COLUMNS.items()})
                for i in range(n.pop())]
