"""`LocalTransport`: every party in this process, every message still on the wire.

It encodes each request and reply to bytes, records the bytes in the ledger and
decodes them again before delivery, so byte counts are real and the receiver
never shares an object with the sender: the in-process run behaves like the
multi-process one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from vflo.comm.codec import decode, encode
from vflo.comm.faults import FaultPlan
from vflo.comm.ledger import Direction, Ledger
from vflo.comm.message import Message
from vflo.comm.transport import Endpoint, Transport
from vflo.errors import CodecError, DeliveryTimeoutError, ProtocolError, unknown_name

Observer = Callable[[Message], None]


class LocalTransport(Transport):
    """In-process delivery to registered nodes through the codec."""

    def __init__(
        self, nodes: Mapping[str, Endpoint], *, ledger: Ledger | None = None, max_message_bytes: int | None = None,
        observers: tuple[Observer, ...] = (), faults: FaultPlan | None = None,
    ) -> None:
        if max_message_bytes is None:
            super().__init__(ledger=ledger)
        else:
            super().__init__(ledger=ledger, max_message_bytes=max_message_bytes)
        self._nodes = dict(nodes)
        self._observers = observers
        self.faults = faults
        for node in self._nodes.values():
            node.attach(self)

    def _cross(self, message: Message, direction: Direction, reply_to: int = -1) -> tuple[Message, int]:
        frame = encode(message, max_bytes=self.max_message_bytes)
        entry = self.ledger.record(
            round=message.round, sender=message.sender, receiver=message.receiver, kind=message.kind,
            direction=direction, nbytes=len(frame), reply_to=reply_to,
        )
        decoded = decode(frame, max_bytes=self.max_message_bytes)
        for observe in self._observers:
            observe(decoded)
        return decoded, entry.seq

    def _deliver(self, messages: Sequence[Message]) -> list[Message]:
        replies = []
        for message in messages:
            reply = self._one(message)
            replies.append(reply)
            if reply.error is not None:
                break
        return replies

    def _one(self, message: Message) -> Message:
        node = self._nodes.get(message.receiver)
        if node is None:
            raise ProtocolError(unknown_name("party", message.receiver, self._nodes))
        delivered, seq = self._cross(message, "request")
        reply = node.handle(delivered)
        if self.faults is not None and self.faults.lose_reply(delivered):
            raise DeliveryTimeoutError(message.receiver, message.kind)
        try:
            return self._cross(reply, "reply", seq)[0]
        except CodecError as exc:
            # The receiver could not put its answer on the wire: it answers with the error instead.
            return self._cross(delivered.error_reply(exc), "reply", seq)[0]
