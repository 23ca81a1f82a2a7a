"""A party reached only through a hub: its onward messages go out as answers and come back as resumes.

Flower delivers messages from its ServerApp to a ClientApp and back; a ClientApp cannot call another
SuperNode. vflo's protocols, though, let a party's handler send onward requests of its own (a party
uploads masked blocks to the FedSVD server, VFL-ASP's first hop drives the second). A
:class:`RelayedParty` runs each delivered message's handler in a thread; when the handler sends an
onward request through its :class:`RelayTransport`, the delivery returns at once with that request
(tagged :data:`ONWARD`) instead of a reply. The hub delivers it, hands the answers back with
:meth:`RelayedParty.resume`, and the handler goes on, until the delivery ends with the replies
(tagged :data:`FINAL`).

Both ends of every onward message are recorded in the sending party's own ledger, as over gRPC, so
the coordinator's collected ledger counts the same frames whichever transport carried them.

The hub speaks for one party (the coordinator, Flower's ServerApp), so what crosses it is protected as
vflo's mutual TLS protects it: a frame between two other parties is sealed (:mod:`vflo.comm.seal`:
encrypted to its receiver, signed by its sender), and a plain frame is accepted only as coming from the
hub's own party. The hub can neither read nor forge what two other parties say to each other. With
``keyring=None`` (TLS off, loopback experiments only) nothing is sealed and senders are taken at their word.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Collection, Sequence

from vflo.comm.codec import DEFAULT_MAX_BYTES, encode
from vflo.comm.departures import DepartureLog
from vflo.comm.grpc_transport import FRAME_HEADER, pack_frames, unpack_frames
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.comm.seal import Keyring, is_sealed
from vflo.comm.serving import error_frame, serve_each, serve_frame
from vflo.comm.transport import Endpoint, Transport
from vflo.errors import CodecError, DeliveryTimeoutError, PartyBoundaryError, ProtocolError

logger = logging.getLogger(__name__)

#: A delivery's outcome: the replies (FINAL) or an onward request the hub must deliver first (ONWARD).
FINAL, ONWARD = b"F", b"O"
DEFAULT_RELAY_DEADLINE = 600.0


def onward_body(receiver: str, frames: Sequence[bytes]) -> bytes:
    """ONWARD, the receiver's name, a newline, then the frames: what the hub needs to route them."""
    return ONWARD + receiver.encode() + b"\n" + pack_frames(frames)


def parse_outcome(body: bytes, *, max_bytes: int) -> tuple[bytes, str, list[bytes]]:
    """A delivery's tag, the onward receiver ("" for FINAL) and its frames; a malformed body is a CodecError."""
    tag, rest = body[:1], body[1:]
    if tag == FINAL:
        return FINAL, "", unpack_frames(rest, max_bytes=max_bytes)
    if tag == ONWARD:
        name, sep, frames = rest.partition(b"\n")
        if not sep or not name or len(name) > 256:
            raise CodecError("malformed onward request: no receiver name")
        return ONWARD, name.decode("utf-8", errors="replace"), unpack_frames(frames, max_bytes=max_bytes)
    raise CodecError(f"malformed relay body: unknown tag {tag!r}")


class RelayTransport(Transport):
    """A party's onward requests, handed to the hub through the delivery in progress."""

    direct_links = False  # every message goes through the hub: no party dials another

    def __init__(self, party: str, *, hub: str, keyring: Keyring | None = None, ledger: Ledger | None = None,
                 max_message_bytes: int = DEFAULT_MAX_BYTES, deadline: float = DEFAULT_RELAY_DEADLINE) -> None:
        super().__init__(ledger=ledger, max_message_bytes=max_message_bytes)
        self.party = party
        self.hub = hub
        self.keyring = keyring
        self.deadline = deadline
        self.outbox: queue.Queue[bytes] = queue.Queue()
        self.inbox: queue.Queue[bytes] = queue.Queue()

    @property
    def shared_ledger(self) -> bool:
        return False

    def _deliver(self, messages: Sequence[Message]) -> list[Message]:
        receiver = messages[0].receiver
        frames = [encode(m, max_bytes=self.max_message_bytes) for m in messages]
        framing = FRAME_HEADER if len(frames) > 1 else 0
        # Frames to the hub's own party go plain; to any other party, sealed (when this party has keys).
        keyring = self.keyring if receiver != self.hub else None
        sealing = keyring is not None
        wire = [keyring.seal(f, receiver) for f in frames] if keyring is not None else frames
        seqs = self._record_requests(messages, frames, framing=framing, wire=wire)
        self.outbox.put(onward_body(receiver, wire))
        try:
            body = self.inbox.get(timeout=self.deadline)
        except queue.Empty:
            raise DeliveryTimeoutError(receiver, " + ".join(dict.fromkeys(m.kind for m in messages)),
                                       self.deadline) from None
        what = f"its onward request {messages[-1].kind!r}"
        try:
            answers = unpack_frames(body, max_bytes=self.max_message_bytes)
        except CodecError as exc:
            raise ProtocolError(f"party {receiver!r} sent a malformed message in answer to {what}: {exc}") from exc
        return self._take_replies(receiver, answers, seqs, framing=framing, what=what,
                                  open_frame=lambda answer: self._open_reply(answer, receiver, sealing))

    def _open_reply(self, wire: bytes, receiver: str, sealed: bool) -> bytes:
        """The reply frame inside ``wire``, if ``receiver`` sealed it (or it needs no seal)."""
        if not sealed:
            return wire
        assert self.keyring is not None
        if not is_sealed(wire):
            raise PartyBoundaryError(f"a reply said to come from {receiver!r} is not sealed by it; refused")
        signer, frame = self.keyring.open(wire)
        if signer != receiver:
            raise PartyBoundaryError(f"a reply said to come from {receiver!r} was sealed by {signer!r}; refused")
        return frame


class RelayedParty:
    """One party's node behind a hub: :meth:`deliver` and :meth:`resume` each return a FINAL or ONWARD body."""

    def __init__(self, node: Endpoint, *, allowed: Collection[str], hub: str, keyring: Keyring | None,
                 max_message_bytes: int = DEFAULT_MAX_BYTES, deadline: float = DEFAULT_RELAY_DEADLINE) -> None:
        self.node = node
        self.allowed = frozenset(allowed)
        self.hub = hub
        self.keyring = keyring
        self.max_message_bytes = max_message_bytes
        self.deadline = deadline
        self.transport = RelayTransport(node.name, hub=hub, keyring=keyring, max_message_bytes=max_message_bytes,
                                        deadline=deadline)
        node.attach(self.transport)
        # This party's record of what left it (replies here, onward requests in its transport), if it keeps one.
        self.departures: DepartureLog | None = None
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.node.name

    def _refusal(self, exc: Exception) -> bytes:
        return FINAL + pack_frames([error_frame(self.name, exc, max_bytes=self.max_message_bytes)])

    def deliver(self, body: bytes) -> bytes:
        """Start handling the frames in ``body`` (packed); the replies, or the first onward request."""
        try:
            frames = unpack_frames(body, max_bytes=self.max_message_bytes)
        except CodecError as exc:
            return self._refusal(exc)
        with self._lock:
            if self._worker is not None and self._worker.is_alive():
                return self._refusal(ProtocolError(
                    f"party {self.name!r} is still handling a message that waits for an onward answer; a hub must "
                    "resume it before delivering another"))
            self._drain(self.transport.outbox)
            self._drain(self.transport.inbox)
            self._worker = threading.Thread(target=self._work, args=(frames,), name=f"vflo-relay-{self.name}",
                                            daemon=True)
            self._worker.start()
        return self._wait()

    def resume(self, body: bytes) -> bytes:
        """Hand the answers to the onward request the last delivery returned; what the handler does next."""
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                return self._refusal(ProtocolError(f"party {self.name!r} waits for no onward answer"))
            self.transport.inbox.put(body)
        return self._wait()

    def _work(self, frames: list[bytes]) -> None:
        self.transport.outbox.put(FINAL + pack_frames(serve_each(frames, self._serve)))

    def _serve(self, wire: bytes) -> tuple[bytes, bool]:
        """The reply to one frame as it came through the hub: sealed back to its sealer, plain to the hub."""
        signer = self.hub
        frame = wire
        try:
            if is_sealed(wire):
                if self.keyring is None:
                    raise PartyBoundaryError(f"party {self.name!r} runs without TLS and cannot open a sealed frame; "
                                             "give it [tls] dir like the others")
                signer, frame = self.keyring.open(wire)
        except PartyBoundaryError as exc:
            return error_frame(self.name, exc, max_bytes=self.max_message_bytes), True

        def authenticate(message: Message) -> None:
            if self.keyring is not None and message.sender != signer:
                how = f"sealed by {signer!r}" if signer != self.hub else f"plain, so from the hub's party {self.hub!r}"
                raise PartyBoundaryError(f"a message claiming to come from {message.sender!r} was {how}; refused: "
                                         "over Flower another party's messages arrive sealed by that party")

        reply, failed = serve_frame(self.node, frame, allowed=self.allowed, max_bytes=self.max_message_bytes,
                                    authenticate=authenticate, departures=self.departures)
        if signer != self.hub and self.keyring is not None:
            reply = self.keyring.seal(reply, signer)
        return reply, failed

    def _wait(self) -> bytes:
        try:
            return self.transport.outbox.get(timeout=self.deadline)
        except queue.Empty:
            return self._refusal(ProtocolError(f"party {self.name!r} did not finish within {self.deadline:.0f} s"))

    @staticmethod
    def _drain(q: queue.Queue[bytes]) -> None:
        while True:
            try:
                q.get_nowait()
            except queue.Empty:
                return
