"""What one party received in a real run, read from the messages that crossed: the inputs of every attack.

Attacks never read a method's internal state: each view here takes the messages of a run (as a transport
observer saw them, in order) and the name of the attacking party, keeps what reached that party (requests to
it and replies to it), and puts it in the shape an attack needs, with the IDs each row concerns as that
party knows them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vflo.comm.message import Message
from vflo.errors import ConfigError
from vflo.methods.masks import OrthogonalMask


@dataclass(frozen=True)
class Rows:
    """Rows a party received about other people (one per ID), and who sent them."""

    ids: np.ndarray
    values: np.ndarray
    sender: str


def exchanges(messages: Sequence[Message]) -> list[tuple[Message, Message | None]]:
    """Each request with its reply (None when it got none), in the order the requests were sent."""
    out: list[tuple[Message, Message | None]] = []
    open_requests: list[int] = []
    for m in messages:
        if open_requests:
            request = out[open_requests[-1]][0]
            if (m.sender, m.receiver, m.kind) == (request.receiver, request.sender, request.kind):
                out[open_requests.pop()] = (request, m)
                continue
        out.append((m, None))
        open_requests.append(len(out) - 1)
    return out


def gradients_received(messages: Sequence[Message], party: str) -> tuple[np.ndarray, np.ndarray]:
    """The gradient rows ``party`` received for its activations (SplitNN and Entity Augmentation), with the ID
    each row concerns: (ids, gradients), one row per example and step."""
    ids: list[np.ndarray] = []
    grads: list[np.ndarray] = []
    train_ids: np.ndarray | None = None
    last: np.ndarray | None = None  # the IDs of this party's last training forward
    for request, reply in exchanges(messages):
        if request.receiver != party:
            continue
        payload = request.payload
        if request.kind == "splitnn.init":
            train_ids = np.asarray(payload["train_ids"])
        elif request.kind == "splitnn.forward" and payload.get("training") and train_ids is not None:
            last = train_ids[np.asarray(payload["rows"], dtype=np.int64)]
        elif request.kind == "ea.forward" and reply is not None and reply.error is None:
            last = np.asarray(reply.payload["ids"])
        elif request.kind == "split.backward" and last is not None:
            grad = np.asarray(payload["grad"], dtype=np.float64)
            ids.append(last[: len(grad)])
            grads.append(grad)
            last = None
    if not grads:
        raise ConfigError(f"party {party!r} received no gradients in this run: the method sends none to it")
    return np.concatenate(ids), np.vstack(grads)


def representations_received(messages: Sequence[Message], party: str, *,
                             aligned: np.ndarray | None = None) -> list[Rows]:
    """The rows of other parties' data (latents, activations, singular vectors, projections) that reached
    ``party``, by sender, with their IDs as ``party`` knows them.

    * APC-VFL: ``apc.encode_aligned`` replies (g1 of the aligned rows, in the order of ``aligned``, the IDs the
      active party aligned on).
    * SplitNN, Entity Augmentation: training activations (``splitnn.forward``, ``ea.forward`` replies), the
      first that reached the party for each person.
    * FedSVD, VFedTrans, VFL-ASP: the ``svd.solve`` reply to the requester: U Σ of the rows it asked for (in
      the order of ``aligned``), about every party's columns at once.
    * RAP: ``rap.project`` replies at the server (each client's projected rows; IDs in the label owner's
      aligned order, ``aligned``).
    """
    out: dict[str, Rows] = {}
    train_ids: dict[str, np.ndarray] = {}
    row_mask: OrthogonalMask | None = None
    for request, reply in exchanges(messages):
        if reply is None or reply.error is not None or reply.receiver != party:
            continue
        if request.kind == "svd.deal":  # the requester's own masks: it unmasks what the server returns
            row_mask = OrthogonalMask.from_payload(reply.payload, "p")
        sender, payload, kind = reply.sender, reply.payload, request.kind
        if kind == "splitnn.init":
            train_ids[sender] = np.asarray(request.payload["train_ids"])
        elif kind == "splitnn.forward" and request.payload.get("training") and sender in train_ids:
            rows = train_ids[sender][np.asarray(request.payload["rows"], dtype=np.int64)]
            acts = np.asarray(payload["acts"], dtype=np.float64)
            previous = out.get(sender)
            merged_ids = rows if previous is None else np.concatenate([previous.ids, rows])
            merged = acts if previous is None else np.vstack([previous.values, acts])
            out[sender] = Rows(ids=merged_ids, values=merged, sender=sender)
        elif kind == "ea.forward":
            rows_ids = np.asarray(payload["ids"])
            acts = np.asarray(payload["acts"], dtype=np.float64)
            previous = out.get(sender)
            out[sender] = Rows(ids=rows_ids if previous is None else np.concatenate([previous.ids, rows_ids]),
                               values=acts if previous is None else np.vstack([previous.values, acts]), sender=sender)
        elif kind in ("apc.encode_aligned", "rap.project") and aligned is not None:
            field = "z" if kind == "apc.encode_aligned" else "x"
            values = np.asarray(payload[field], dtype=np.float64)
            out[sender] = Rows(ids=aligned[: len(values)], values=values, sender=sender)
        elif kind == "svd.solve" and aligned is not None:
            u = np.asarray(payload["u"], dtype=np.float64)
            if row_mask is not None and row_mask.size == len(u):
                u = row_mask.left_t(u)
            us = u * np.asarray(payload["s"], dtype=np.float64)
            out[sender] = Rows(ids=aligned[: len(us)], values=us, sender=sender)
    return [_first_of_each(r) for r in out.values()]


def _first_of_each(rows: Rows) -> Rows:
    """One row per person: the first that reached the party (later epochs send the same people again)."""
    _, first = np.unique(rows.ids, return_index=True)
    first = np.sort(first)
    return Rows(ids=rows.ids[first], values=rows.values[first], sender=rows.sender)


def ids_received(messages: Sequence[Message], party: str) -> dict[str, np.ndarray]:
    """Every ID in the clear that reached ``party``, by sender: the fields the message declarations say carry
    IDs, in requests to it and replies to it."""
    from vflo.audit import handler_infos

    infos = handler_infos()
    out: dict[str, set[object]] = {}
    for request, reply in exchanges(messages):
        info = infos.get(request.kind)
        if info is None:
            continue
        carried = []
        if request.receiver == party:
            carried += [request.payload.get(f) for f in info.accepts if info.request_content(f) == "ids"]
        if reply is not None and reply.receiver == party:
            carried += [reply.payload.get(f) for f, c in info.replies.items() if c == "ids"]
        sender = request.sender if request.receiver == party else request.receiver
        for value in carried:
            if isinstance(value, np.ndarray) and value.size:
                out.setdefault(sender, set()).update(value.ravel().tolist())
    return {k: np.asarray(sorted(v, key=str)) for k, v in out.items()}
