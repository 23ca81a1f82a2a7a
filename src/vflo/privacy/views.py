"""What one party received (or sent) in a real run, read from the messages that crossed: the inputs of every attack.

Attacks never read a method's internal state: each view here takes the messages of a run (as a transport
observer saw them, in order) and the name of the attacking party, keeps what that party holds (what reached it:
requests to it and replies to it; or what it sent itself, which it knows), and puts it in the shape an attack
needs, with the IDs each row concerns as that party knows them.

Which kinds show what is each kind's owner's declaration, beside its handler (``@reveals(...)`` above its
``@handles``, in the vocabulary :data:`vflo.party.handlers.Reveals`): this module names no kind, so a method's new
message is read here once its handler says what it reveals.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from vflo.comm.message import Fields, Message
from vflo.errors import ConfigError
from vflo.methods.masks import OrthogonalMask
from vflo.party.handlers import ACTIVATIONS, SCORING, HandlerInfo, Reveals

#: A pair of parties (requester, receiver of the request).
Pair = tuple[str, str]


@cache
def declared() -> Mapping[str, HandlerInfo]:
    """Every kind a party may be asked (every deployable method's, alignment's and control's), with its
    declaration."""
    from vflo.audit import handler_infos

    return handler_infos()


def view_of(kind: str) -> Reveals | None:
    """What an exchange of ``kind`` shows an attacker, as its handler declares (None: nothing the views read)."""
    info = declared().get(kind)
    return info.reveals if info is not None else None


def kinds_revealing(*views: Reveals) -> frozenset[str]:
    """The kinds whose handlers declare one of ``views``."""
    return frozenset(kind for kind, info in declared().items() if info.reveals in views)


def activation_kinds() -> frozenset[str]:
    """Kinds whose reply carries a party's bottom-model outputs (activations) for rows of its own."""
    return kinds_revealing(*ACTIVATIONS)


def serving_kinds() -> frozenset[str]:
    """Kinds whose reply carries rows of the sender's data at scoring time (the IDs are in the request)."""
    return kinds_revealing(*SCORING)


def projected_rows(kind: str) -> bool:
    """Whether ``kind``'s reply releases training rows of the sender's features under a secret projection (X A):
    the rows an attack on the projection itself reads."""
    info = declared().get(kind)
    return info is not None and info.reveals == "aligned rows" and info.replies.get(info.rows_field()) == \
        "masked features"


@dataclass(frozen=True)
class Rows:
    """Rows a party received about other people (one per ID), and who sent them."""

    ids: np.ndarray
    values: np.ndarray
    sender: str


@dataclass(frozen=True)
class Releases:
    """Every row of one kind that one sender released to one receiver, in the order they crossed: a person's ID
    appears once per release (SplitNN sends a training row's activations every epoch; a person scored again is
    released again)."""

    ids: np.ndarray
    values: np.ndarray
    sender: str
    receiver: str
    kind: str

    def _people(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(IDs in the order of their first release, index of that first release, index into the IDs of every
        release, releases per person)."""
        _, first, inverse, counts = np.unique(self.ids, return_index=True, return_inverse=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return self.ids[first[order]], first[order], rank[np.ravel(inverse)], counts[order]

    def counts(self) -> np.ndarray:
        """Releases per person, people in the order of their first release (as :meth:`first` lists them)."""
        return self._people()[3]

    def first(self) -> Rows:
        """One row per person: the first release that crossed."""
        ids, first, _, _ = self._people()
        return Rows(ids=ids, values=self.values[first], sender=self.sender)

    def last(self) -> Rows:
        """One row per person: the last release that crossed (for a bottom model's outputs, those of the latest
        model), people in the order of their first release."""
        ids, _, inverse, _ = self._people()
        last = np.zeros(len(ids), dtype=np.int64)
        last[inverse] = np.arange(len(inverse))  # later releases overwrite earlier ones
        return Rows(ids=ids, values=self.values[last], sender=self.sender)

    def averaged(self) -> Rows:
        """One row per person: the mean of all of its releases (what an attacker holding several noisy releases of
        the same person does before decoding), people in the order of their first release."""
        ids, _, inverse, counts = self._people()
        values = np.asarray(self.values, dtype=np.float64).reshape(len(self.values), -1)
        sums = np.zeros((len(ids), values.shape[1]))
        np.add.at(sums, inverse, values)
        return Rows(ids=ids, values=sums / counts[:, None], sender=self.sender)


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


def _subsets(info: HandlerInfo, payload: Mapping[str, object]) -> dict[str, np.ndarray]:
    """The rows a ``"row ids"`` request names, by subset (its fields ``SUBSET_ids``)."""
    return {f.removesuffix("_ids"): np.asarray(payload[f]) for f in info.request_fields("ids") if f in payload}


def _batch_ids(info: HandlerInfo, request: Message, reply: Message | None,
               subsets: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The IDs of the rows of a ``"training batch"``: the reply's ID field, or the request's positions into the
    rows of its subset; None when neither can be read."""
    named = info.reply_fields("ids")
    if named:
        if reply is None or reply.error is not None:
            return None
        return np.asarray(reply.payload[named[0]])
    subset = str(request.payload.get("subset", "train"))
    if subset not in subsets:
        return None
    positions = np.asarray(request.payload[info.request_fields("membership")[0]], dtype=np.int64)
    return subsets[subset][positions]


def gradients_received(messages: Sequence[Message], party: str) -> tuple[np.ndarray, np.ndarray]:
    """The gradient rows ``party`` received for its activations (split learning), with the ID each row concerns:
    (ids, gradients), one row per example and step."""
    infos = declared()
    ids: list[np.ndarray] = []
    grads: list[np.ndarray] = []
    subsets: dict[str, np.ndarray] = {}
    last: np.ndarray | None = None  # the IDs of this party's last training batch
    for request, reply in exchanges(messages):
        info = infos.get(request.kind)
        if request.receiver != party or info is None:
            continue
        payload = request.payload
        if info.reveals == "row ids":
            subsets = _subsets(info, payload)
        elif info.reveals == "training batch" and payload.get("training", True):
            batch = _batch_ids(info, request, reply, subsets)
            last = batch if batch is not None else last
        elif info.reveals == "gradients" and last is not None:
            grad = np.asarray(payload[info.request_fields("gradients")[0]], dtype=np.float64)
            ids.append(last[: len(grad)])
            grads.append(grad)
            last = None
    if not grads:
        raise ConfigError(f"party {party!r} received no gradients in this run: the method sends none to it")
    return np.concatenate(ids), np.vstack(grads)


def instance_spaces_received(messages: Sequence[Message], party: str) -> tuple[np.ndarray, np.ndarray]:
    """What a tree method tells a partner of who shares a node (the instance spaces): per tree it was asked to sum,
    each of its training people's deepest node it learnt (a node's rows come with the ask; a node asked without
    rows is its parent's less its sibling's). Returns (ids, groups): groups is people x trees, a node number
    within its tree (-1 where the tree never asked about the person)."""
    infos = declared()
    train_ids: np.ndarray | None = None
    trees: dict[int, np.ndarray] = {}
    members: dict[tuple[int, int], np.ndarray] = {}
    for request, _ in exchanges(messages):
        info = infos.get(request.kind)
        if request.receiver != party or info is None:
            continue
        payload = request.payload
        if info.reveals == "row ids":
            train_ids, trees, members = _subsets(info, payload).get("train"), {}, {}
        elif info.reveals == "tree nodes" and train_ids is not None:
            tree = int(Fields(info.kind, payload).integer("tree"))
            deepest = trees.setdefault(tree, np.full(len(train_ids), -1, dtype=np.int64))
            rows, at = np.asarray(payload["rows"], dtype=np.int64), 0
            for node, parent, sibling, count in zip(*(np.asarray(payload[k]).tolist() for k in (
                    "nodes", "parents", "siblings", "counts")), strict=True):
                if count >= 0:
                    mine = rows[at:at + count]
                    at += count
                else:
                    mine = np.setdiff1d(members[tree, parent], members[tree, sibling])
                members[tree, node] = mine
                deepest[mine] = node
    if train_ids is None or not trees:
        raise ConfigError(f"party {party!r} was asked about no tree's nodes in this run: the method grows no trees "
                          "with it")
    return train_ids, np.stack([trees[t] for t in sorted(trees)], axis=1)


def _rows_crossing(messages: Sequence[Message], aligned: np.ndarray | None) -> Iterator[tuple[Message, np.ndarray,
                                                                                              np.ndarray]]:
    """Every reply that carries rows of its sender's data (a view of :data:`~vflo.party.handlers.RELEASES`), with
    the IDs the rows concern (as both ends know them) and the rows: (reply, ids, values). ``aligned``: the IDs a
    receiver aligned on, for the replies that follow its order (``"aligned rows"``, ``"factors"``); without it
    those are left out."""
    infos = declared()
    subsets: dict[Pair, dict[str, np.ndarray]] = {}  # the rows each "row ids" request named, by pair
    row_masks: dict[str, OrthogonalMask] = {}
    for request, reply in exchanges(messages):
        info = infos.get(request.kind)
        if reply is None or reply.error is not None or info is None or info.reveals is None:
            continue
        view, payload, pair = info.reveals, reply.payload, (request.sender, request.receiver)
        if view == "row masks":  # the requester's own masks: it unmasks what the server returns
            row_masks[reply.receiver] = OrthogonalMask.from_payload(payload, "p")
        elif view == "row ids":
            subsets[pair] = _subsets(info, request.payload)
        elif view == "training batch":
            ids = _batch_ids(info, request, reply, subsets.get(pair, {}))
            if ids is not None:
                yield reply, ids, np.asarray(payload[info.rows_field()], dtype=np.float64)
        elif view in ("activations", "scoring activations", "scoring rows"):
            field, asked = info.rows_field(), info.request_fields("ids")[0]
            if field in payload and asked in request.payload:
                values = np.asarray(payload[field], dtype=np.float64)
                values = values.reshape(len(values), -1)
                yield reply, np.asarray(request.payload[asked])[: len(values)], values
        elif view == "aligned rows" and aligned is not None:
            values = np.asarray(payload[info.rows_field()], dtype=np.float64)
            yield reply, aligned[: len(values)], values
        elif view == "factors" and aligned is not None:
            u = np.asarray(payload["u"], dtype=np.float64)
            mask = row_masks.get(reply.receiver)
            if mask is not None and mask.size == len(u):
                u = mask.left_t(u)
            us = u * np.asarray(payload["s"], dtype=np.float64)
            yield reply, aligned[: len(us)], us


def _grouped(found: Iterator[tuple[Message, np.ndarray, np.ndarray]], *, by_kind: bool = True) -> list[Releases]:
    """Rows by (sender, receiver, and with ``by_kind`` kind), in the order they crossed."""
    groups: dict[tuple[str, str, str], tuple[list[np.ndarray], list[np.ndarray], list[str]]] = {}
    for reply, ids, values in found:
        ids_of, values_of, kinds = groups.setdefault((reply.sender, reply.receiver, reply.kind if by_kind else ""),
                                                     ([], [], []))
        ids_of.append(ids)
        values_of.append(values.reshape(len(values), -1))
        if reply.kind not in kinds:
            kinds.append(reply.kind)
    return [Releases(ids=np.concatenate(i), values=np.vstack(v), sender=s, receiver=r, kind="+".join(k))
            for (s, r, _), (i, v, k) in groups.items()]


def releases_received(messages: Sequence[Message], party: str, *, aligned: np.ndarray | None = None) -> list[Releases]:
    """Every release of rows of other parties' data (latents, activations, singular vectors, projections) that
    reached ``party``, one :class:`Releases` per sender and kind, with the IDs as ``party`` knows them: every
    reply whose kind's handler declares a view of :data:`~vflo.party.handlers.RELEASES`.

    * ``"training batch"``, ``"activations"``: a bottom model's outputs for training and validation rows, every
      epoch; ``"scoring activations"`` at scoring.
    * ``"aligned rows"``: encodings or projections of the rows the receiver aligned on, in the order of
      ``aligned`` (the IDs it aligned on); ``"scoring rows"`` at scoring.
    * ``"factors"``: U Σ of the rows the requester asked for (in the order of ``aligned``), about every party's
      columns at once.
    """
    return [r for r in _grouped(_rows_crossing(messages, aligned)) if r.receiver == party]


def representations_received(messages: Sequence[Message], party: str, *,
                             aligned: np.ndarray | None = None) -> list[Rows]:
    """The rows of other parties' data that reached ``party`` during training, by sender, one per person: the
    first release of each (:func:`releases_received` has every release, serving included)."""
    scoring = serving_kinds()
    training = (found for found in _rows_crossing(messages, aligned)
                if found[0].receiver == party and found[0].kind not in scoring)
    return [r.first() for r in _grouped(training, by_kind=False)]


def activations_sent(messages: Sequence[Message], party: str, receiver: str) -> Releases | None:
    """Every row of bottom-model outputs ``party`` sent ``receiver`` (training and validation forwards, and the
    evaluation-mode activations it was asked for later), in the order they left, with the IDs as ``party`` knows
    them: what the sender holds of its own outputs without reading any other party's state. None if it sent none.
    :meth:`Releases.last` is, for each person, the output of the latest bottom model the party trained."""
    outputs = activation_kinds()
    sent = _grouped((found for found in _rows_crossing(messages, None) if found[0].sender == party
                     and found[0].receiver == receiver and found[0].kind in outputs), by_kind=False)
    return sent[0] if sent else None


def ids_received(messages: Sequence[Message], party: str) -> dict[str, np.ndarray]:
    """Every ID in the clear that reached ``party``, by sender: the fields the message declarations say carry
    IDs, in requests to it and replies to it."""
    infos = declared()
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
