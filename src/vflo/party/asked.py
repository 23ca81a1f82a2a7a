"""A party's own record of who asked it about which of its people, when, and with which saved model.

A line per request of a scoring session (a saved model's, opened by ``control.load``: ``vflo serve``,
``vflo predict --deploy``) that names people: a scoring request names them by ID (what the party then scores, the
request fields its handler declares ``"ids"``); a reuse of a kept intersection names them by their places among
the people it shares with the asker (:mod:`vflo.align.kept`), and the result of vflo's own PSI by their places in
this party's reply (:mod:`vflo.align.psi`): the party maps both back to its own IDs. The session's first
alignment names every person the asker may ask about (its whole table's intersection with this party's), each
batch's the people of that batch.
Each line holds the peer that asked, the run, the model's label and ID, the message kind, how the people were
named, whether the request was taken up or refused by policy, and the people's IDs as this party knows them.
Training is not recorded here: its rows are the whole aligned set, not people asked about one by one.

The file (``asked_log`` in the party's config, ``NAME_asked.jsonl`` beside it by default) is apart from the
audit file of what left the party (:mod:`vflo.comm.departures`): that one holds no content, sums per peer and kind
to the ledger's figures, and can be shown to a peer; this one holds people's IDs, so it is created 0600, kept
and pruned as the party keeps personal data. It is appended, never rewritten, each line before the answer
leaves. ``vflo party audit FILE`` counts the people each peer asked about; ``--person ID`` says who asked about
one person, when, and with which model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from vflo.comm.departures import JsonLines, now
from vflo.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["Asked", "AskedLog", "about", "per_peer", "read_asked"]

#: How a request named the people: by their IDs, or by their places in a kept intersection (mapped back to IDs).
NamedBy = Literal["ids", "positions"]


@dataclass(frozen=True, kw_only=True)
class Asked:
    """One line of the file: one request, the people it named."""

    time: str
    party: str
    peer: str
    run: str
    model: str
    model_id: str
    kind: str
    named_by: str
    status: str  # "ok": taken up; "refused": refused by this party's policy before it was answered
    why: str
    ids: tuple[str, ...]

    @property
    def people(self) -> int:
        return len(self.ids)


class AskedLog(JsonLines):
    """Appends a line per request that named people of ``party`` to ``path``."""

    def __init__(self, path: Path, party: str) -> None:
        super().__init__(path, party, what="record of who asked about its people", key="asked_log")

    def asked(self, *, peer: str, run: str, model: str, model_id: str, kind: str, named_by: NamedBy,
              ids: np.ndarray | Sequence[object], refused: str = "") -> Asked:
        """Peer ``peer`` named ``ids`` (this party's own IDs) in a ``kind`` request of scoring session ``run`` of
        ``model``; ``refused``: why this party's policy refused it (empty: taken up)."""
        people = np.asarray(ids).tolist() if isinstance(ids, np.ndarray) else list(ids)
        record = Asked(time=now(), party=self.party, peer=peer, run=run, model=model, model_id=model_id, kind=kind,
                       named_by=named_by, status="refused" if refused else "ok", why=refused[:500],
                       ids=tuple(str(i) for i in people))
        self.append({**asdict(record), "ids": list(record.ids)})
        logger.debug("party %s: %s asked about %d of its people (%s, %s)", self.party, peer, record.people, kind,
                     record.status)
        return record


def read_asked(path: Path) -> list[Asked]:
    """Every line of a party's record of who asked about its people."""
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; a party writes who asked about its people where asked_log in its "
                          "config says (NAME_asked.jsonl beside its config by default)")
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            fields: dict[str, Any] = json.loads(line)
            out.append(Asked(**{**fields, "ids": tuple(str(i) for i in fields["ids"])}))
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"{path}:{number} is not a line of a vflo record of who asked: {exc}") from exc
    return out


def about(records: Iterable[Asked], person: str) -> list[Asked]:
    """The requests that named ``person`` (this party's ID for them), oldest first."""
    return [r for r in records if person in r.ids]


def per_peer(records: Iterable[Asked]) -> list[dict[str, Any]]:
    """Per peer (sorted): requests, people named over them all, distinct people, requests refused, and the models
    (labels) it asked with."""
    table: dict[str, dict[str, Any]] = {}
    distinct: dict[str, set[str]] = {}
    for r in records:
        row = table.setdefault(r.peer, {"peer": r.peer, "requests": 0, "named": 0, "people": 0, "refused": 0,
                                        "models": []})
        row["requests"] += 1
        row["named"] += r.people
        row["refused"] += r.status == "refused"
        if r.model not in row["models"]:
            row["models"].append(r.model)
        distinct.setdefault(r.peer, set()).update(r.ids)
    for peer, row in table.items():
        row["people"] = len(distinct[peer])
    return [table[k] for k in sorted(table)]
