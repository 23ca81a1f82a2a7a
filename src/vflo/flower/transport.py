"""`FlowerTransport`: the coordinator's messages as Flower Messages, from the ServerApp to each party's SuperNode.

Each delivery is one Flower message of type ``query.vflo`` whose ConfigRecord carries vflo's codec frames
(the same bytes as over vflo's gRPC; no pickle on either side). A party's answer is its replies, or an onward
request of its own (:mod:`vflo.comm.relay`): the ServerApp delivers that to its receiver (another SuperNode,
or the coordinator's own node here) and resumes the sender with the answers. The ServerApp only routes
frames; every party checks who sent each message, and what that sender may ask, in its own node. What the
coordinator sends is sealed with its certificate (:mod:`vflo.comm.seal`), so each party checks it, and the
CA's revocation list, on every frame, as vflo's gRPC server checks its client.

A party whose SuperNode is gone, whose worker is, or that does not answer within the deadline fails alone
(:meth:`FlowerTransport.request_each` yields its :class:`~vflo.errors.TransportError`), as over gRPC: scoring
with whoever answers goes on without it.

The ledger here holds the coordinator's own requests and replies, as :class:`~vflo.comm.grpc_transport.
GrpcTransport`'s does; onward messages are in their sending party's ledger, collected at the end of a run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Collection, Mapping, Sequence

from flwr.app import ConfigRecord, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.serverapp import Grid

from vflo.comm.codec import DEFAULT_MAX_BYTES, encode
from vflo.comm.grpc_transport import FRAME_HEADER, pack_frames
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.comm.relay import FINAL, parse_outcome
from vflo.comm.seal import Keyring
from vflo.comm.serving import error_frame, serve_each, serve_frame
from vflo.comm.transport import Endpoint, Transport, raise_posted_errors
from vflo.errors import (
    CodecError,
    ConfigError,
    DeliveryTimeoutError,
    PartyBoundaryError,
    ProtocolError,
    TransportError,
    unknown_name,
)
from vflo.flower.adapter import MESSAGE_TYPE, RECORD

logger = logging.getLogger(__name__)

DEFAULT_DEADLINE = 3600.0
# Replies are pulled often at first and less often as a wait grows: a simulated round trip then costs
# milliseconds, and a deployed one (where the SuperNode's own polling dominates) does not hammer the SuperLink.
POLL_FIRST, POLL_MAX = 0.002, 0.5


def _flower_message(node_id: int, op: str, body: bytes) -> FlowerMessage:
    return FlowerMessage(RecordDict({RECORD: ConfigRecord({"op": op, "body": body})}), dst_node_id=node_id,
                         message_type=MESSAGE_TYPE)


class FlowerGrid:
    """Requests to SuperNodes over a Flower Grid: push, then pull each reply on its own until it is in."""

    def __init__(self, grid: Grid, *, deadline: float = DEFAULT_DEADLINE) -> None:
        self.grid = grid
        self.deadline = deadline
        # Which ClientApp process answered each message: Flower's process-per-message, measured.
        self.reply_pids: list[int] = []
        self.round_trips = 0

    def call(self, calls: Sequence[tuple[int, str, bytes]], *, what: str = "vflo",
             names: Sequence[str] | None = None, deadline: float | None = None) -> list[bytes]:
        """Send ``(node, op, body)`` each as one Flower message at once; each reply's body, in order (the first
        failure raised)."""
        out = []
        for outcome in self.call_each(calls, what=what, names=names, deadline=deadline):
            if isinstance(outcome, TransportError):
                raise outcome
            out.append(outcome)
        return out

    def call_each(self, calls: Sequence[tuple[int, str, bytes]], *, what: str = "vflo",
                  names: Sequence[str] | None = None, deadline: float | None = None) -> list[bytes | TransportError]:
        """:meth:`call`, with each message's failure in its place: a SuperNode that is gone, whose ClientApp
        failed, or that does not answer within ``deadline`` (default :attr:`deadline`) s fails alone, the others'
        replies are kept. ``names``: the party on each node, for the errors."""
        if not calls:
            return []
        who = list(names) if names is not None else [f"SuperNode {n}" for n, _, _ in calls]
        seconds = self.deadline if deadline is None else deadline
        ids = [str(i) for i in self.grid.push_messages([_flower_message(n, op, body) for n, op, body in calls])]
        if len(ids) != len(calls):
            failed = TransportError(f"the SuperLink did not accept {what}: {len(ids)} of {len(calls)} messages pushed")
            return [failed for _ in calls]
        pending = {i for i in ids if i}
        replies: dict[str, FlowerMessage] = {}
        end = time.monotonic() + seconds
        pause = POLL_FIRST
        while pending:
            for message_id in sorted(pending):
                # One message per pull: a pull of several large replies can exceed the SuperLink's HTTP limit.
                for got in self.grid.pull_messages([message_id]):
                    replies[got.metadata.reply_to_message_id] = got
                    pending.discard(got.metadata.reply_to_message_id)
            if not pending or time.monotonic() > end:
                break
            time.sleep(pause)
            pause = min(POLL_MAX, pause * 1.5)
        self.round_trips += 1
        out: list[bytes | TransportError] = []
        for message_id, (node, _, _), party in zip(ids, calls, who, strict=True):
            reply = replies.get(message_id) if message_id else None
            if not message_id:
                out.append(TransportError(f"the SuperLink did not accept {what} for {party}"))
            elif reply is None:
                out.append(DeliveryTimeoutError(party, what, seconds))
            elif reply.has_error():
                out.append(TransportError(
                    f"{party} (SuperNode {node}) did not answer {what}: {reply.error.reason} (Flower's code "
                    f"{reply.error.code}); is its `vflo flower party` running, with its SuperNode connected?"))
            else:
                record = reply.content[RECORD]
                self.reply_pids.append(int(record.get("pid", -1)))  # type: ignore[arg-type]  # a Flower record holds loosely typed values; read as the hub wrote them
                out.append(bytes(record["body"]))  # type: ignore[arg-type]  # a Flower record holds loosely typed values; read as the hub wrote them
        return out


def _claimed_party(answer: bytes) -> str:
    try:
        return str(json.loads(answer)["party"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"a SuperNode answered hello with something else than vflo's answer: {exc}") from exc


def discover(grid: Grid | FlowerGrid, parties: Collection[str], *, keyring: Keyring | None, timeout: float = 120.0,
             optional: Collection[str] = (), wait_optional: bool = False) -> dict[str, int]:
    """Which SuperNode serves each of ``parties``: wait (at most ``timeout`` s) for them to connect, and ask each;
    ``optional`` parties are included when their SuperNode is connected too (a server no method of the run needs),
    and with ``wait_optional`` waited for as well, up to ``timeout``, then left out (scoring with whoever answers);
    one that refuses the certificates it is handed is kept, and said so (a required one is an error).
    A SuperNode that does not answer (gone, or its worker is) is asked again on the next pass.

    With a ``keyring`` each SuperNode's worker proves its party by signing a fresh challenge with the key of a
    certificate this federation's CA issued to that party, and every party then gets the others' certificates
    and this party's own (so two parties can seal what they say to each other, and each can check what this
    party seals). Without one (TLS off) the names are taken as said.
    """
    flower = grid if isinstance(grid, FlowerGrid) else FlowerGrid(grid, deadline=timeout)
    end = time.monotonic() + timeout
    found: dict[str, int] = {}
    certificates: dict[str, bytes] = {}
    asked: set[int] = set()
    silent: dict[int, str] = {}
    awaited = [*parties, *(optional if wait_optional else ())]
    while True:
        new = [n for n in flower.grid.get_node_ids() if n not in asked]
        if new:
            challenges = [os.urandom(32) for _ in new]
            answers = flower.call_each([(n, "hello", c) for n, c in zip(new, challenges, strict=True)], what="hello",
                                       deadline=max(1.0, end - time.monotonic()))
            for node, challenge, answer in zip(new, challenges, answers, strict=True):
                if isinstance(answer, TransportError):
                    silent[node] = str(answer)
                    continue
                asked.add(node)
                if keyring is None:
                    party = _claimed_party(answer)
                else:
                    party, certificates[party] = keyring.check_proof(challenge, answer)
                if party in found:
                    raise ConfigError(f"two SuperNodes ({found[party]} and {node}) serve party {party!r}; each party "
                                      "runs one `vflo flower party`")
                found[party] = node
        if not [p for p in awaited if p not in found]:
            break
        missing = [p for p in parties if p not in found]
        if time.monotonic() > end:
            if not missing:
                logger.warning("no SuperNode serves %s after %.0f s: going on without", [p for p in awaited
                                                                                       if p not in found], timeout)
                break
            unanswered = "; ".join(f"SuperNode {n}: {why}" for n, why in silent.items() if n not in asked)
            raise TransportError(
                f"no SuperNode serves {missing} after {timeout:.0f} s (connected: {sorted(found) or 'none'}"
                f"{'; not answering: ' + unanswered if unanswered else ''}): start "
                "`vflo flower party PARTY.toml -- flower-supernode ...` for each")
        time.sleep(0.05)
    nodes = {p: found[p] for p in [*parties, *optional] if p in found}
    if keyring is not None and nodes:
        directory = json.dumps({name: pem.decode() for name, pem in
                                {**{p: certificates[p] for p in nodes}, keyring.party: keyring.certificate}.items()})
        said = flower.call([(n, "peers", directory.encode()) for n in nodes.values()], what="peers",
                           deadline=timeout)
        for party, answer in zip(nodes, said, strict=True):
            refused = json.loads(answer).get("error")
            if refused and party in parties:
                raise ProtocolError(f"party {party!r} refused the federation's certificates: {refused}")
            if refused:
                # An optional party stays: it refuses this party's frames as it refused the certificates, and the
                # session treats that as any other refusal (one scoring with whoever answers goes on without it).
                logger.warning("party %s refused the federation's certificates: %s", party, refused)
    return nodes


class FlowerTransport(Transport):
    """The coordinator's requests over Flower; onward requests of parties relayed through here.

    With a ``keyring`` (this party's TLS keys) every frame this party sends is sealed to its receiver, so that
    each party checks this party's certificate, and the CA's revocation list, on every frame; and a party
    whose certificate the CA has revoked since is refused here before anything is sent to it, as over gRPC.
    """

    direct_links = False  # every message goes through the hub: no party dials another

    def __init__(self, grid: Grid | FlowerGrid, *, party: str, nodes: Mapping[str, int], local: Endpoint,
                 allowed: Collection[str], ledger: Ledger | None = None,
                 max_message_bytes: int = DEFAULT_MAX_BYTES, deadline: float = DEFAULT_DEADLINE,
                 keyring: Keyring | None = None) -> None:
        super().__init__(ledger=ledger, max_message_bytes=max_message_bytes)
        self.flower = grid if isinstance(grid, FlowerGrid) else FlowerGrid(grid, deadline=deadline)
        self.party = party
        self.nodes = dict(nodes)
        self.local = local
        self.allowed = frozenset(allowed)
        self.keyring = keyring

    @property
    def shared_ledger(self) -> bool:
        return False

    def _node(self, receiver: str) -> int:
        if receiver in self.nodes:
            return self.nodes[receiver]
        if receiver in self.allowed:
            # A party of the federation that no SuperNode served when the run started: unreachable, as a gRPC
            # peer that does not listen (scoring with whoever answers goes on without it).
            raise TransportError(f"party {receiver!r} is not reachable over Flower: no SuperNode served it when this "
                                 "run connected; start `vflo flower party PARTY.toml -- flower-supernode ...` for it "
                                 "and run again")
        raise ProtocolError(unknown_name("party", receiver, self.nodes))

    def _seal(self, frame: bytes, receiver: str) -> bytes:
        if self.keyring is None:
            return frame
        try:
            return self.keyring.seal(frame, receiver)
        except PartyBoundaryError as exc:
            raise TransportError(f"party {receiver!r} is refused: {exc} (nothing was sent to it)") from exc

    def _encode(self, messages: Sequence[Message]) -> tuple[bytes, list[int], int]:
        frames = [encode(m, max_bytes=self.max_message_bytes) for m in messages]
        framing = FRAME_HEADER if len(frames) > 1 else 0
        wire = [self._seal(f, m.receiver) for f, m in zip(frames, messages, strict=True)]
        return pack_frames(wire), self._record_requests(messages, frames, framing=framing, wire=wire), framing

    def _deliver(self, messages: Sequence[Message]) -> list[Message]:
        replies = self._deliver_each([messages])[0]
        if isinstance(replies, TransportError):
            raise replies
        return replies

    def _deliver_each(self, batches: Sequence[Sequence[Message]]) -> list[list[Message] | TransportError]:
        """Each batch (to one receiver) as one Flower message, all pushed at once; relays, then the replies. A batch
        whose receiver cannot be reached or does not answer in time yields its error alone."""
        out: dict[int, list[Message] | TransportError] = {}
        sent: list[tuple[int, tuple[bytes, list[int], int]]] = []
        for i, batch in enumerate(batches):
            try:
                self._node(batch[0].receiver)
                sent.append((i, self._encode(batch)))
            except TransportError as exc:
                out[i] = exc
        kinds = " + ".join(dict.fromkeys(m.kind for i, _ in sent for m in batches[i]))
        receivers = [batches[i][0].receiver for i, _ in sent]
        outcomes = self.flower.call_each([(self.nodes[r], "deliver", body) for r, (_, (body, _, _)) in
                                          zip(receivers, sent, strict=True)], what=kinds, names=receivers)
        for (i, (_, seqs, framing)), receiver, outcome in zip(sent, receivers, outcomes, strict=True):
            try:
                if isinstance(outcome, TransportError):
                    raise outcome
                frames = self._finish(receiver, outcome)
            except TransportError as exc:
                out[i] = exc
                continue
            out[i] = self._take_replies(receiver, frames, seqs, framing=framing,
                                        what=repr(" + ".join(dict.fromkeys(m.kind for m in batches[i]))))
        return [out[i] for i in range(len(batches))]

    def _finish(self, receiver: str, outcome: bytes) -> list[bytes]:
        """The final reply frames of ``receiver``, relaying each onward request it makes on the way."""
        while True:
            try:
                tag, onward_to, frames = parse_outcome(outcome, max_bytes=self.max_message_bytes)
            except CodecError as exc:
                raise ProtocolError(f"party {receiver!r} answered with a malformed relay body: {exc}") from exc
            if tag == FINAL:
                return frames
            answers = self._relay(receiver, onward_to, frames)
            outcome = self.flower.call([(self._node(receiver), "resume", pack_frames(answers))],
                                       what=f"the answer to {receiver!r}'s onward request", names=[receiver])[0]

    def _relay(self, origin: str, receiver: str, frames: list[bytes]) -> list[bytes]:
        """``origin``'s onward request to ``receiver``: delivered as it came (sealed, unless to this party, which
        serves it here), the reply frames returned as they are."""
        if receiver == self.party:
            return self._serve_here(origin, frames)
        if receiver not in self.nodes:
            return [error_frame(receiver, ProtocolError(unknown_name("party", receiver, self.nodes)),
                                max_bytes=self.max_message_bytes)]
        outcome = self.flower.call([(self.nodes[receiver], "deliver", pack_frames(frames))],
                                   what=f"an onward request to {receiver!r}", names=[receiver])[0]
        return self._finish(receiver, outcome)

    def _serve_here(self, origin: str, frames: list[bytes]) -> list[bytes]:
        """This party's replies to frames ``origin``'s SuperNode sent it: they must be ``origin``'s own messages,
        and ``origin``'s certificate must still hold (the CA may have revoked it since the run connected)."""

        def authenticate(message: Message) -> None:
            if message.sender != origin:
                raise PartyBoundaryError(f"party {origin!r} sent a message in the name of {message.sender!r}; refused")
            if self.keyring is not None:
                self.keyring.check_peer(origin)

        return serve_each(frames, lambda frame: serve_frame(self.local, frame, allowed=self.allowed,
                                                            max_bytes=self.max_message_bytes,
                                                            authenticate=authenticate))

    def request_each(self, messages: Sequence[Message]) -> list[Message | TransportError]:
        """One round to several parties: one push, so a deployed round waits for the slowest SuperNode once; a
        party that cannot be reached, or does not answer within the deadline, yields its error alone."""
        receivers = [m.receiver for m in messages]
        if len(messages) <= 1 or len(set(receivers)) != len(receivers):
            return super().request_each(messages)
        for r in receivers:
            if r not in self.nodes and r not in self.allowed:
                raise ProtocolError(unknown_name("party", r, self.nodes))
        batches = [[*self._posted.pop(m.receiver, []), m] for m in messages]
        out: list[Message | TransportError] = []
        for batch, replies in zip(batches, self._deliver_each(batches), strict=True):
            if isinstance(replies, TransportError):
                out.append(replies)
                continue
            raise_posted_errors(batch[:-1], replies, len(batch))
            out.append(replies[-1])
        return out
