"""`LocalTransport`: every party in this process, every message still on the wire.

It encodes each request and reply to bytes, records the bytes in the ledger and
decodes them again before delivery, so byte counts are real and the receiver
never shares an object with the sender: the in-process run behaves like the
multi-process one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from vflo.comm.codec import decode, encode
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.comm.transport import Transport
from vflo.errors import CodecError, ProtocolError, unknown_name

if TYPE_CHECKING:
    from vflo.federation.node import Node

Observer = Callable[[Message], None]


class LocalTransport(Transport):
    """In-process delivery to registered nodes through the codec."""

    def __init__(
        self, nodes: Mapping[str, Node], *, ledger: Ledger | None = None, max_message_bytes: int | None = None,
        observers: tuple[Observer, ...] = (),
    ) -> None:
        if max_message_bytes is None:
            super().__init__(ledger=ledger)
        else:
            super().__init__(ledger=ledger, max_message_bytes=max_message_bytes)
        self._nodes = dict(nodes)
        self._observers = observers
        for node in self._nodes.values():
            node.attach(self)

    def _cross(self, message: Message, direction: str) -> Message:
        frame = encode(message, max_bytes=self.max_message_bytes)
        self.ledger.record(
            round=message.round, sender=message.sender, receiver=message.receiver, kind=message.kind,
            direction="request" if direction == "request" else "reply", nbytes=len(frame),
        )
        decoded = decode(frame, max_bytes=self.max_message_bytes)
        for observe in self._observers:
            observe(decoded)
        return decoded

    def request(self, message: Message) -> Message:
        node = self._nodes.get(message.receiver)
        if node is None:
            raise ProtocolError(unknown_name("party", message.receiver, self._nodes))
        delivered = self._cross(message, "request")
        reply = node.handle(delivered)
        try:
            return self._cross(reply, "reply")
        except CodecError as exc:
            # The receiver could not put its answer on the wire: it answers with the error instead.
            return self._cross(delivered.error_reply(exc), "reply")
