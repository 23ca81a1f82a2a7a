"""One message frame in, one reply frame out: what a party does with each frame a transport hands it.

Shared by every way a party is reached (vflo's own gRPC server, a relay behind Flower), so decoding,
the sender check and the conversion of failures into error replies are the same on every path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence

from vflo.comm.codec import decode, encode
from vflo.comm.departures import DepartureLog
from vflo.comm.message import Message, MessageError
from vflo.comm.transport import Endpoint
from vflo.errors import CodecError, PartyBoundaryError, ProtocolError

logger = logging.getLogger(__name__)

# Checks that a decoded message really comes from the party it names (raises PartyBoundaryError if not).
Authenticate = Callable[[Message], None]


def error_frame(party: str, exc: Exception, *, max_bytes: int, sender: str = "?", kind: str = "?",
                round_no: int = 0) -> bytes:
    """An error reply from ``party``, encoded."""
    reply = Message(sender=party, receiver=sender, kind=kind, round=round_no,
                    error=MessageError(type=type(exc).__name__, message=str(exc)))
    return encode(reply, max_bytes=max_bytes)


def serve_each(frames: Sequence[bytes], serve_one: Callable[[bytes], tuple[bytes, bool]]) -> list[bytes]:
    """The reply frames to ``frames``, in order, stopping after the first that carries an error (a party handles
    a batch as it would the messages one by one: what comes after a failure is not run)."""
    replies = []
    for frame in frames:
        reply, failed = serve_one(frame)
        replies.append(reply)
        if failed:
            break
    return replies


def serve_frame(node: Endpoint, frame: bytes | bytearray, *, allowed: Collection[str], max_bytes: int,
                authenticate: Authenticate | None = None, departures: DepartureLog | None = None) -> tuple[bytes, bool]:
    """``node``'s reply frame to ``frame``, and whether it carries an error; with ``departures``, the reply is
    written to the party's record of what left it.

    A frame that does not decode, or names a sender that is not one of ``allowed`` (the party's configured
    peers) or that ``authenticate`` rejects, is answered with an error before any handler runs.
    """
    try:
        message = decode(frame, max_bytes=max_bytes)
    except CodecError as exc:
        logger.warning("party %s got a malformed message: %s", node.name, exc)
        answer = error_frame(node.name, ProtocolError(f"party {node.name!r} got a malformed message: {exc}"),
                             max_bytes=max_bytes)
        if departures is not None:
            departures.refused("?", len(answer), f"malformed: {exc}")
        return answer, True
    try:
        if message.sender not in allowed:
            raise PartyBoundaryError(
                f"party {node.name!r} does not accept messages from {message.sender!r}: not a configured peer")
        if authenticate is not None:
            authenticate(message)
    except PartyBoundaryError as exc:
        logger.warning("party %s refused a message: %s", node.name, exc)
        reply = message.error_reply(exc)
    else:
        reply = node.handle(message)
    try:
        answer = encode(reply, max_bytes=max_bytes)
    except CodecError as exc:
        reply = message.error_reply(exc)
        answer = encode(reply, max_bytes=max_bytes)
    if departures is not None:
        departures.message(reply, len(answer), "reply")
    return answer, reply.error is not None
