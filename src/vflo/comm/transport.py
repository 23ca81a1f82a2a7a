"""The `Transport` interface: deliver a request to a party and return its reply.

Protocol code talks only to this interface, so the same method runs in one
process (:class:`~vflo.comm.local.LocalTransport`) or across hosts. Every
implementation encodes every message with the one codec and records it in the
:class:`~vflo.comm.ledger.Ledger`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from vflo.comm.codec import DEFAULT_MAX_BYTES
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.errors import TransportError


class Transport(ABC):
    """Request/reply delivery between named parties, with a ledger of what crossed."""

    def __init__(self, *, ledger: Ledger | None = None, max_message_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.ledger = ledger if ledger is not None else Ledger()
        self.max_message_bytes = max_message_bytes

    @property
    def shared_ledger(self) -> bool:
        """True when every party records into this one ledger (in-process); False when each has its own."""
        return True

    @abstractmethod
    def request(self, message: Message) -> Message:
        """Send ``message`` and return the receiver's reply (which may carry an error)."""

    def request_each(self, messages: Sequence[Message]) -> list[Message | TransportError]:
        """Send several requests of one round; a party that cannot be reached yields its error.

        Implementations may send them concurrently.
        """
        out: list[Message | TransportError] = []
        for m in messages:
            try:
                out.append(self.request(m))
            except TransportError as exc:
                out.append(exc)
        return out

    def request_many(self, messages: Sequence[Message]) -> list[Message]:
        """Send several requests of one round; the first delivery failure is raised."""
        replies = []
        for reply in self.request_each(messages):
            if isinstance(reply, TransportError):
                raise reply
            replies.append(reply)
        return replies

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the in-process transport has none."""
