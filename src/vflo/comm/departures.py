"""A party's own record of what left it: every reply it served, every request it sent, every refusal.

Each line of the file (JSON lines, appended, never rewritten) is one message that left the party: when, the run,
the peer it went to, its kind, request or reply, its round, how many rows its largest array holds, its bytes
(the encoded frame, as the ledger counts it) and whether it was an answer or a refusal (with the error). Nothing
of the content is kept. ``vflo party audit FILE`` sums it per peer and kind; over a run the totals equal the
ledger's figures for the messages this party sent. A party's log gets a line for each setup, load, save,
scoring session, refusal and teardown besides; single messages are logged at DEBUG.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vflo.comm.message import Message
from vflo.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["Departure", "DepartureLog", "JsonLines", "now", "read_departures", "rows_of", "summarize"]


def rows_of(payload: Mapping[str, Any]) -> int:
    """The rows of the largest array a message carries (0 for settings alone)."""
    return max((int(v.shape[0]) for v in payload.values() if isinstance(v, np.ndarray) and v.ndim), default=0)


@dataclass(frozen=True)
class Departure:
    """One line of the file."""

    time: str
    party: str
    run: str
    peer: str
    kind: str
    direction: str
    round: int
    rows: int
    bytes: int
    status: str  # "ok", or "refused" / "error" for an error reply
    error: str = ""


class JsonLines:
    """A party's file of JSON lines, appended and never rewritten (thread-safe; each line flushed), created for its
    owner alone (0600): what it records names peers, and some of it people. ``what`` and ``key``: the file's name
    and its config key, for the error where it cannot be written."""

    def __init__(self, path: Path, party: str, *, what: str = "audit file", key: str = "audit_log") -> None:
        self.path = Path(path)
        self.party = party
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Created 0600 from the start (not chmod-ed after), so no other user can open it in between.
            os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
        except OSError as exc:
            raise ConfigError(f"party {party!r} cannot write its {what} {self.path}: {exc}; give {key} = "
                              "'PATH' in its config a folder it can write to") from exc

    def append(self, line: Mapping[str, Any]) -> None:
        text = json.dumps(line, sort_keys=True) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(text)


class DepartureLog(JsonLines):
    """Appends a line per message that left ``party`` to ``path``."""

    def message(self, message: Message, nbytes: int, direction: str) -> None:
        """``message`` (this party's request or reply) left, ``nbytes`` on the wire."""
        error = message.error
        status = "ok" if error is None else ("refused" if error.type in ("RefusedError", "PartyBoundaryError",
                                                                         "PolicyError") else "error")
        self._write(Departure(time=now(), party=self.party, run=message.run, peer=message.receiver, kind=message.kind,
                              direction=direction, round=message.round, rows=rows_of(message.payload),
                              bytes=nbytes, status=status,
                              error="" if error is None else f"{error.type}: {error.message}"[:500]))

    def refused(self, peer: str, nbytes: int, why: str) -> None:
        """An error answer to a frame that was never read (a stranger's, a malformed one)."""
        self._write(Departure(time=now(), party=self.party, run="", peer=peer, kind="(unread)", direction="reply",
                              round=0, rows=0, bytes=nbytes, status="refused", error=why[:500]))

    def _write(self, record: Departure) -> None:
        self.append(record.__dict__)
        logger.debug("party %s -> %s: %s %s, %d rows, %d bytes (%s)", record.party, record.peer, record.kind,
                     record.direction, record.rows, record.bytes, record.status)


def now() -> str:
    """The time a line is written: UTC, ISO 8601 to the millisecond."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def read_departures(path: Path) -> list[Departure]:
    if not path.is_file():
        raise ConfigError(f"audit file {path} does not exist; a party writes it where audit_log in its config says")
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Departure(**json.loads(line)))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}:{number} is not a line of a vflo audit file: {exc}") from exc
    return out


def summarize(records: Iterable[Departure]) -> list[dict[str, Any]]:
    """Per peer and kind: messages, bytes, rows, refusals (sorted by peer, then kind)."""
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        row = table.setdefault((r.peer, r.kind), {"peer": r.peer, "kind": r.kind, "messages": 0, "bytes": 0,
                                                  "rows": 0, "refused": 0, "errors": 0})
        row["messages"] += 1
        row["bytes"] += r.bytes
        row["rows"] += r.rows
        row["refused"] += r.status == "refused"
        row["errors"] += r.status == "error"
    return [table[k] for k in sorted(table)]
