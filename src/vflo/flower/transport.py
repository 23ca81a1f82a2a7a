"""`FlowerTransport`: the coordinator's messages as Flower Messages, from the ServerApp to each party's SuperNode.

Each delivery is one Flower message of type ``query.vflo`` whose ConfigRecord carries vflo's codec frames
(the same bytes as over vflo's gRPC; no pickle on either side). A party's answer is its replies, or an onward
request of its own (:mod:`vflo.comm.relay`): the ServerApp delivers that to its receiver (another SuperNode,
or the coordinator's own node here) and resumes the sender with the answers. The ServerApp only routes
frames; every party checks who sent each message, and what that sender may ask, in its own node.

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

    def call(self, calls: Sequence[tuple[int, str, bytes]], *, what: str = "vflo") -> list[bytes]:
        """Send ``(node, op, body)`` each as one Flower message at once; each reply's body, in order."""
        ids = list(self.grid.push_messages([_flower_message(n, op, body) for n, op, body in calls]))
        if len(ids) != len(calls) or any(not i for i in ids):
            raise TransportError(f"the SuperLink did not accept {what}: {len(ids)} of {len(calls)} messages pushed")
        replies: dict[str, FlowerMessage] = {}
        end = time.monotonic() + self.deadline
        pause = POLL_FIRST
        while len(replies) < len(ids):
            for message_id in [i for i in ids if i not in replies]:
                # One message per pull: a pull of several large replies can exceed the SuperLink's HTTP limit.
                for reply in self.grid.pull_messages([message_id]):
                    replies[reply.metadata.reply_to_message_id] = reply
            if len(replies) == len(ids):
                break
            if time.monotonic() > end:
                raise DeliveryTimeoutError(", ".join(str(n) for n, _, _ in calls), what, self.deadline)
            time.sleep(pause)
            pause = min(POLL_MAX, pause * 1.5)
        self.round_trips += 1
        out = []
        for message_id, (node, _, _) in zip(ids, calls, strict=True):
            reply = replies[message_id]
            if reply.has_error():
                raise TransportError(f"the ClientApp on SuperNode {node} failed on {what}: {reply.error.reason} "
                                     f"(code {reply.error.code}); is `vflo flower party` running for that SuperNode?")
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
             optional: Collection[str] = ()) -> dict[str, int]:
    """Which SuperNode serves each of ``parties``: wait (at most ``timeout`` s) for them to connect, and ask each;
    ``optional`` parties are included when their SuperNode is connected too (a server no method of the run needs).

    With a ``keyring`` each SuperNode's worker proves its party by signing a fresh challenge with the key of a
    certificate this federation's CA issued to that party, and every party then gets the others' certificates
    (so two parties can seal what they say to each other). Without one (TLS off) the names are taken as said.
    """
    flower = grid if isinstance(grid, FlowerGrid) else FlowerGrid(grid, deadline=timeout)
    end = time.monotonic() + timeout
    found: dict[str, int] = {}
    certificates: dict[str, bytes] = {}
    asked: set[int] = set()
    while True:
        new = [n for n in flower.grid.get_node_ids() if n not in asked]
        if new:
            challenges = [os.urandom(32) for _ in new]
            answers = flower.call([(n, "hello", c) for n, c in zip(new, challenges, strict=True)], what="hello")
            for node, challenge, answer in zip(new, challenges, answers, strict=True):
                asked.add(node)
                if keyring is None:
                    party = _claimed_party(answer)
                else:
                    party, certificates[party] = keyring.check_proof(challenge, answer)
                if party in found:
                    raise ConfigError(f"two SuperNodes ({found[party]} and {node}) serve party {party!r}; each party "
                                      "runs one `vflo flower party`")
                found[party] = node
        missing = [p for p in parties if p not in found]
        if not missing:
            break
        if time.monotonic() > end:
            raise TransportError(
                f"no SuperNode serves {missing} after {timeout:.0f} s (connected: {sorted(found) or 'none'}): start "
                "`vflo flower party PARTY.toml -- flower-supernode ...` for each")
        time.sleep(0.05)
    nodes = {p: found[p] for p in [*parties, *optional] if p in found}
    if keyring is not None:
        directory = json.dumps({name: pem.decode() for name, pem in
                                {**{p: certificates[p] for p in nodes}, keyring.party: keyring.certificate}.items()})
        answers = flower.call([(n, "peers", directory.encode()) for n in nodes.values()], what="peers")
        for party, answer in zip(nodes, answers, strict=True):
            refused = json.loads(answer).get("error")
            if refused:
                raise ProtocolError(f"party {party!r} refused the federation's certificates: {refused}")
    return nodes


class FlowerTransport(Transport):
    """The coordinator's requests over Flower; onward requests of parties relayed through here."""

    direct_links = False  # every message goes through the hub: no party dials another

    def __init__(self, grid: Grid | FlowerGrid, *, party: str, nodes: Mapping[str, int], local: Endpoint,
                 allowed: Collection[str], ledger: Ledger | None = None,
                 max_message_bytes: int = DEFAULT_MAX_BYTES, deadline: float = DEFAULT_DEADLINE) -> None:
        super().__init__(ledger=ledger, max_message_bytes=max_message_bytes)
        self.flower = grid if isinstance(grid, FlowerGrid) else FlowerGrid(grid, deadline=deadline)
        self.party = party
        self.nodes = dict(nodes)
        self.local = local
        self.allowed = frozenset(allowed)

    @property
    def shared_ledger(self) -> bool:
        return False

    def _node(self, receiver: str) -> int:
        if receiver not in self.nodes:
            raise ProtocolError(unknown_name("party", receiver, self.nodes))
        return self.nodes[receiver]

    def _encode(self, messages: Sequence[Message]) -> tuple[bytes, list[int], int]:
        frames = [encode(m, max_bytes=self.max_message_bytes) for m in messages]
        framing = FRAME_HEADER if len(frames) > 1 else 0
        return pack_frames(frames), self._record_requests(messages, frames, framing=framing), framing

    def _deliver(self, messages: Sequence[Message]) -> list[Message]:
        return self._deliver_each([messages])[0]

    def _deliver_each(self, batches: Sequence[Sequence[Message]]) -> list[list[Message]]:
        """Each batch (to one receiver) as one Flower message, all pushed at once; relays, then the replies."""
        encoded = [self._encode(b) for b in batches]
        kinds = " + ".join(dict.fromkeys(m.kind for b in batches for m in b))
        calls = [(self._node(b[0].receiver), "deliver", body) for b, (body, _, _) in zip(batches, encoded, strict=True)]
        outcomes = self.flower.call(calls, what=kinds)
        out = []
        for batch, (_, seqs, framing), outcome in zip(batches, encoded, outcomes, strict=True):
            frames = self._finish(batch[0].receiver, outcome)
            out.append(self._take_replies(batch[0].receiver, frames, seqs, framing=framing,
                                          what=repr(" + ".join(dict.fromkeys(m.kind for m in batch)))))
        return out

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
                                       what=f"the answer to {receiver!r}'s onward request")[0]

    def _relay(self, origin: str, receiver: str, frames: list[bytes]) -> list[bytes]:
        """``origin``'s onward request to ``receiver``: delivered as it came (sealed, unless to this party, which
        serves it here), the reply frames returned as they are."""
        if receiver == self.party:
            return self._serve_here(origin, frames)
        if receiver not in self.nodes:
            return [error_frame(receiver, ProtocolError(unknown_name("party", receiver, self.nodes)),
                                max_bytes=self.max_message_bytes)]
        outcome = self.flower.call([(self.nodes[receiver], "deliver", pack_frames(frames))],
                                   what=f"an onward request to {receiver!r}")[0]
        return self._finish(receiver, outcome)

    def _serve_here(self, origin: str, frames: list[bytes]) -> list[bytes]:
        """This party's replies to frames ``origin``'s SuperNode sent it: they must be ``origin``'s own messages."""

        def authenticate(message: Message) -> None:
            if message.sender != origin:
                raise PartyBoundaryError(f"party {origin!r} sent a message in the name of {message.sender!r}; refused")

        return serve_each(frames, lambda frame: serve_frame(self.local, frame, allowed=self.allowed,
                                                            max_bytes=self.max_message_bytes,
                                                            authenticate=authenticate))

    def request_each(self, messages: Sequence[Message]) -> list[Message | TransportError]:
        """One round to several parties: one push, so a deployed round waits for the slowest SuperNode once."""
        receivers = [m.receiver for m in messages]
        if len(messages) <= 1 or len(set(receivers)) != len(receivers) or any(r not in self.nodes for r in receivers):
            return super().request_each(messages)
        batches = [[*self._posted.pop(m.receiver, []), m] for m in messages]
        try:
            replies = self._deliver_each(batches)
        except TransportError as exc:
            return [exc for _ in messages]
        out: list[Message | TransportError] = []
        for batch, batch_replies in zip(batches, replies, strict=True):
            raise_posted_errors(batch[:-1], batch_replies, len(batch))
            out.append(batch_replies[-1])
        return out
