"""The `Transport` interface: deliver a request to a party and return its reply.

Protocol code talks only to this interface, so the same method runs in one
process (:class:`~vflo.comm.local.LocalTransport`) or across hosts. Every
implementation encodes every message with the one codec and records it in the
:class:`~vflo.comm.ledger.Ledger`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from vflo.comm.codec import DEFAULT_MAX_BYTES, decode
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.errors import CodecError, ProtocolError, TransportError

if TYPE_CHECKING:
    from vflo.comm.departures import DepartureLog


class Endpoint(Protocol):
    """What a transport delivers to: a party that answers each message (a node)."""

    @property
    def name(self) -> str: ...

    def handle(self, message: Message) -> Message: ...

    def attach(self, transport: Transport) -> None: ...


class Transport(ABC):
    """Request/reply delivery between named parties, with a ledger of what crossed.

    Besides requests there are *posted* messages: ones whose reply the sender does not wait for
    (SplitNN's gradients). A posted message waits at the sender and goes out, in order, with the
    next request to the same party, or at :meth:`flush`; over a network that saves one round trip
    per posted message. Each posted message is still a message of its own in the ledger, with its
    own reply, so byte and message counts do not depend on the transport. An error a posted message
    causes is raised when it is delivered: by the request it went out with, or by :meth:`flush`.
    """

    def __init__(self, *, ledger: Ledger | None = None, max_message_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.ledger = ledger if ledger is not None else Ledger()
        self.max_message_bytes = max_message_bytes
        # This party's own record of what left it (its requests; its server writes its replies), if it keeps one.
        self.departures: DepartureLog | None = None
        self._posted: dict[str, list[Message]] = {}

    def request(self, message: Message) -> Message:
        """Send ``message`` and return the receiver's reply (which may carry an error).

        Messages posted to the same receiver go first; an error one of them caused is raised here.
        """
        posted = self._posted.pop(message.receiver, [])
        replies = self._deliver([*posted, message])
        raise_posted_errors(posted, replies, len(posted) + 1)
        return replies[-1]

    def post(self, message: Message) -> None:
        """Queue ``message``; it is delivered before the next request to its receiver, or at :meth:`flush`."""
        self._posted.setdefault(message.receiver, []).append(message)

    def flush(self) -> None:
        """Deliver every posted message now; raise the first error one of them caused."""
        while self._posted:
            _, posted = self._posted.popitem()
            raise_posted_errors(posted, self._deliver(posted), len(posted))

    def drop_posted(self) -> int:
        """Forget posted messages that were never delivered (a run that failed left them); how many."""
        count = sum(len(v) for v in self._posted.values())
        self._posted.clear()
        return count

    @abstractmethod
    def _deliver(self, messages: Sequence[Message]) -> list[Message]:
        """Deliver ``messages`` (all to one receiver) in order and return their replies in order.

        Delivery may stop after a reply that carries an error; the replies so far are returned.
        """

    #: Whether the parties can dial each other (a library's own link, such as the PSI library's, needs it); not
    #: where every message goes through a hub (Flower's SuperLink).
    direct_links: bool = True

    def peer_host(self, party: str) -> str:
        """The host ``party`` is reached at (a library's own link dials it): loopback unless addresses say."""
        return "127.0.0.1"

    def link_files(self) -> tuple[str, str, str] | None:
        """This party's certificate, key and CA as files, for a link a library opens itself; None without TLS."""
        return None

    @property
    def shared_ledger(self) -> bool:
        """True when every party records into this one ledger (in-process); False when each has its own."""
        return True

    def _record_requests(self, messages: Sequence[Message], frames: Sequence[bytes], *, framing: int,
                         wire: Sequence[bytes] | None = None) -> list[int]:
        """Each request in the ledger: its frame's bytes, and as framing what the transport adds around it
        (``framing`` bytes each, and the difference between ``wire`` and the frame where they differ)."""
        wire = frames if wire is None else wire
        if self.departures is not None:
            for m, f in zip(messages, frames, strict=True):
                self.departures.message(m, len(f), "request")
        return [self.ledger.record(round=m.round, sender=m.sender, receiver=m.receiver, kind=m.kind,
                                   direction="request", nbytes=len(f), framing=framing + len(w) - len(f)).seq
                for m, f, w in zip(messages, frames, wire, strict=True)]

    def _take_replies(self, receiver: str, answers: Sequence[bytes], seqs: Sequence[int], *, framing: int,
                      what: str, open_frame: Callable[[bytes], bytes] | None = None) -> list[Message]:
        """The replies in ``answers`` (one per request of ``seqs``, or fewer: a party stops after a message that
        failed), each from ``receiver``, recorded in the ledger; ``open_frame`` takes a frame out of its wrapping."""
        if len(answers) > len(seqs):
            raise ProtocolError(f"party {receiver!r} answered {len(answers)} messages to {len(seqs)} sent")
        replies = []
        try:
            for answer, seq in zip(answers, seqs, strict=False):
                frame = answer if open_frame is None else open_frame(answer)
                reply = decode(frame, max_bytes=self.max_message_bytes)
                if reply.sender != receiver:
                    raise CodecError(f"the reply names {reply.sender!r} as its sender")
                self.ledger.record(round=reply.round, sender=reply.sender, receiver=reply.receiver, kind=reply.kind,
                                   direction="reply", nbytes=len(frame), reply_to=seq,
                                   framing=framing + len(answer) - len(frame))
                replies.append(reply)
        except CodecError as exc:
            raise ProtocolError(f"party {receiver!r} sent a malformed message in answer to {what}: {exc}") from exc
        return replies

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

    def request_many_async(self, messages: Sequence[Message]) -> Future[list[Message]]:
        """:meth:`request_many`, started now; the future holds the replies or the error.

        The sender may compute while the messages travel, but must not use the transport again
        until the future is done. In process, delivery happens here and now, so the receivers see
        the same messages in the same order as with :meth:`request_many`.
        """
        future: Future[list[Message]] = Future()
        try:
            future.set_result(self.request_many(messages))
        except Exception as exc:  # handed to whoever waits on the future, as a thread would
            future.set_exception(exc)
        return future

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the in-process transport has none."""


def raise_posted_errors(posted: Sequence[Message], replies: Sequence[Message], expected: int) -> None:
    """The error a posted message caused (its reply carries it), or that the receiver answered too few."""
    for reply in replies[: len(posted)]:
        reply.unwrap()  # raises the RemoteError of a posted message that failed
    if len(replies) < expected:
        receiver = posted[0].receiver if posted else "?"
        raise ProtocolError(f"party {receiver!r} answered {len(replies)} of {expected} messages sent together")
