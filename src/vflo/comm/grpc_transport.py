"""Parties as gRPC servers, with mutual TLS: the same `Transport` interface as in one process.

Every party runs a :class:`PartyServer` that serves its node's handlers through one raw-bytes
method (``/vflo.Party/Call``): a frame of the project's own codec in, a frame out. No protobuf
schema and no pickle: the codec checks every frame. Clients reach other parties through a
:class:`GrpcTransport`, which records each request and reply it sends or gets in its ledger
(the coordinator gathers the other parties' ledgers at the end of a run, so totals match the
in-process run), applies a deadline per call, and retries only when a party was unreachable.

With TLS (the default) a server accepts a client only if the CA signed its certificate and the
certificate's name is one of its configured peers, and a message is accepted only from the party
its certificate names; a client checks that the server's certificate names the party it meant
to reach. ``--insecure`` turns TLS off for loopback experiments and says so loudly.

A client sends nothing to a party whose certificate it has not read and checked: it reads it in a TLS
handshake of its own before the first call (and again after a failed one), refuses the call when no handshake
completes, and pins the gRPC channel to exactly that certificate, so every connection the channel makes
presents it. A server's methods are client-streaming: its handler runs from the caller's certificate before
any of the message is read, so a client that is no peer is refused without its bytes being taken in, and a
peer's message arrives in chunks of at most :data:`CHUNK_BYTES`, within its bounds (``[policy]``
``max_peer_calls``, ``max_peer_bytes``, ``max_arrival_seconds``). A frame of one chunk is sent as a plain unary
call: on the wire the same single-message stream, without the streaming client's extra thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from cryptography.hazmat.primitives import serialization

from vflo.comm.bounds import HasPeerBounds, PeerBounds
from vflo.comm.codec import DEFAULT_MAX_BYTES, encode
from vflo.comm.departures import DepartureLog
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.comm.serving import error_frame, serve_each, serve_frame
from vflo.comm.tls import (
    PartyCredentials,
    ProbeError,
    check_certificate_names,
    check_peer_certificate,
    peer_certificate,
    pem_names,
    warn_insecure,
)
from vflo.comm.transport import Endpoint, Transport
from vflo.errors import (
    AddressInUseError,
    CodecError,
    ConfigError,
    DeliveryTimeoutError,
    PartyBoundaryError,
    ProtocolError,
    TransportError,
    unknown_name,
)

logger = logging.getLogger(__name__)



SERVICE, METHOD, METHOD_MANY = "vflo.Party", "Call", "CallMany"
PATH, PATH_MANY = f"/{SERVICE}/{METHOD}", f"/{SERVICE}/{METHOD_MANY}"
# CallMany carries several codec frames, each behind its length (8 bytes, little-endian).
FRAME_HEADER = 8
MAX_FRAMES = 1024
DEFAULT_DEADLINE = 600.0
# The most one gRPC message of a call carries: a larger frame is sent as a client stream of such chunks. A server
# takes no larger message, so what a caller makes it hold is counted chunk by chunk against the caller's bounds.
CHUNK_BYTES = 4 << 20
# Invocation metadata: the bytes a streamed call will carry, so that a server refuses one over its bounds unread.
SIZE_KEY = "vflo-bytes"


def _options(max_bytes: int, *, receive: int | None = None) -> list[tuple[str, Any]]:
    # The codec enforces the real limit; gRPC's must not be the smaller one.
    limit = min(max_bytes + (1 << 20), 2**31 - 1)
    # A larger HTTP/2 look-ahead window lets a batch of activations (128 KB and up) cross without waiting
    # for a window update, a wait that shows in such a round trip even on loopback.
    return [("grpc.max_receive_message_length", limit if receive is None else receive),
            ("grpc.max_send_message_length", limit), ("grpc.http2.lookahead_bytes", 8 << 20)]


def _server_options(max_bytes: int) -> list[tuple[str, Any]]:
    # A server receives no message over one chunk (a larger frame is streamed): a caller's message is taken in
    # chunk by chunk, each counted against its bounds, never as one allocation gRPC makes before vflo sees it.
    return _options(max_bytes, receive=min(CHUNK_BYTES, max_bytes) + (64 << 10))


def pack_frames(frames: Sequence[bytes]) -> bytes:
    """Frames in one body for CallMany: each behind its length."""
    return b"".join(len(f).to_bytes(FRAME_HEADER, "little") + f for f in frames)


def unpack_frames(body: bytes | bytearray, *, max_bytes: int) -> list[bytes]:
    """The frames of a CallMany body; a malformed body is a :class:`CodecError`."""
    view = memoryview(body)
    frames: list[bytes] = []
    at = 0
    while at < len(body):
        if len(frames) >= MAX_FRAMES or at + FRAME_HEADER > len(body):
            raise CodecError("malformed multi-message body: too many frames or a cut length header")
        n = int.from_bytes(body[at : at + FRAME_HEADER], "little")
        at += FRAME_HEADER
        if n > max_bytes or at + n > len(body):
            raise CodecError(f"malformed multi-message body: a frame of {n} bytes does not fit")
        frames.append(bytes(view[at : at + n]))
        at += n
    if not frames:
        raise CodecError("malformed multi-message body: no frames")
    return frames


def diagnose(details: str, receiver: str, address: str, *, secure: bool) -> str:
    """What a failed connection most likely means, in the words of the deploy config."""
    text = details.lower()
    if "certificate signature failure" in text or "certificate_verify_failed" in text or "bad_signature" in text:
        return ("its certificate was not signed by this party's CA (ca.pem): the two come from different "
                "CAs; give every party a certificate signed by the federation's one CA (`vflo certs sign`)")
    if "hostname verification" in text or "no match found for server name" in text or "peer name" in text:
        return (f"the party listening at {address} is not {receiver!r} (its certificate names another party): "
                f"check the address given for {receiver!r}; every party has its own port")
    if "wrong_version_number" in text and secure:
        return (f"the party at {address} does not speak TLS (it runs with --insecure or [tls] insecure = true) while "
                "this one does: use TLS on both sides, or --insecure on both (loopback only)")
    if not secure and ("socket closed" in text or "handshake" in text):
        return (f"the party at {address} expects TLS but this one runs with --insecure: use TLS on both sides, or "
                "--insecure on both (loopback only)")
    if "connection refused" in text or "failed to connect" in text:
        return f"nothing answers at {address}: is {receiver!r} running, and is that its address in the deploy config?"
    return f"is {receiver!r} running, and do its address and certificates match the deploy config?"


class _Quiet:
    """At most one warning a key (a client's names) every ``every`` seconds, the next one saying how many were left
    out: a flood of refused calls must not become a flood of log lines."""

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}

    def warn(self, key: str, text: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            last, left_out = self._last.get(key, (-self.every, 0))
            if now - last < self.every:
                self._last[key] = (last, left_out + 1)
                return
            if len(self._last) > 1024:  # keys are clients' names or addresses: keep the table small
                self._last.clear()
            self._last[key] = (now, 0)
        if left_out:
            logger.warning(text + " (%d more like it in the last %g s)", *args, left_out, self.every)
        else:
            logger.warning(text, *args)


class _LateError(Exception):
    """A call whose message did not arrive in time (or whose caller went away): cancelled, nothing to answer."""


class _Bounds:
    """What each peer holds of a server at once: calls in progress and message bytes received and not yet
    answered; and the calls still waiting for their message, cancelled when late."""

    def __init__(self, policy: HasPeerBounds) -> None:
        self.calls = policy.max_peer_calls
        self.bytes = policy.max_peer_bytes
        self.arrival = float(policy.max_arrival_seconds)
        self._lock = threading.Lock()
        self._held: dict[str, list[int]] = {}  # peer: [calls, bytes]
        self._waiting: dict[int, tuple[float, grpc.ServicerContext]] = {}
        self._ids = itertools.count()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._watch: threading.Thread | None = None

    def enter(self, peer: str) -> bool:
        """Take a call slot of ``peer``'s (False: it has its most in progress already)."""
        with self._lock:
            held = self._held.setdefault(peer, [0, 0])
            if held[0] >= self.calls:
                return False
            held[0] += 1
            return True

    def take(self, peer: str, nbytes: int) -> bool:
        """Count ``nbytes`` more of ``peer``'s in flight (False, and nothing counted: over its bound)."""
        with self._lock:
            held = self._held[peer]
            if held[1] + nbytes > self.bytes:
                return False
            held[1] += nbytes
            return True

    def leave(self, peer: str, nbytes: int) -> None:
        with self._lock:
            held = self._held[peer]
            held[0] -= 1
            held[1] -= nbytes
            if held == [0, 0]:
                del self._held[peer]

    def held(self, peer: str) -> tuple[int, int]:
        with self._lock:
            calls, nbytes = self._held.get(peer, (0, 0))
            return calls, nbytes

    def waiting(self, context: grpc.ServicerContext) -> int:
        """Watch a call whose message is arriving: it is cancelled if it has not arrived in ``arrival`` seconds."""
        token = next(self._ids)
        with self._lock:
            self._waiting[token] = (time.monotonic() + self.arrival, context)
        return token

    def arrived(self, token: int) -> bool:
        """Stop watching a call; False if it was cancelled for being late."""
        with self._lock:
            return self._waiting.pop(token, None) is not None

    def start(self) -> None:
        self._watch = threading.Thread(target=self._cancel_late, name="vflo-arrivals", daemon=True)
        self._watch.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._watch is not None:
            self._watch.join(5.0)

    def _cancel_late(self) -> None:
        # One thread for every call's arrival bound: a timer per call would cost a thread on SplitNN's many small
        # calls; a late call is found within a tenth of its bound (at most a second).
        period = min(max(self.arrival / 10, 0.01), 1.0)
        while not self._stopped.wait(period):
            now = time.monotonic()
            with self._lock:
                late = [(token, context) for token, (until, context) in self._waiting.items() if until <= now]
                for token, _ in late:
                    del self._waiting[token]
            for _, context in late:
                context.cancel()


class PartyServer:
    """Serves one party's node over gRPC (mutual TLS unless ``credentials`` is None).

    ``policy`` (by default the node's own): ``max_peer_calls``, ``max_peer_bytes`` and ``max_arrival_seconds``
    bound what each peer holds of this server; a client that is no peer is refused before its message is read.
    """

    def __init__(
        self, node: Endpoint, *, address: str, credentials: PartyCredentials | None, allowed: Collection[str],
        max_message_bytes: int = DEFAULT_MAX_BYTES, workers: int = 8, departures: DepartureLog | None = None,
        policy: HasPeerBounds | None = None,
    ) -> None:
        self.node = node
        self.departures = departures
        self.max_message_bytes = max_message_bytes
        self.allowed = frozenset(allowed)
        self.secure = credentials is not None
        if policy is None:
            # The node's own policy where it has one (a party's node does); else the defaults.
            own = getattr(node, "policy", None)
            policy = own if isinstance(own, HasPeerBounds) else PeerBounds()
        # A CallMany body holds up to max_message_bytes of frames, each behind its length header.
        self._largest = max_message_bytes + MAX_FRAMES * FRAME_HEADER
        if policy.max_peer_bytes < max_message_bytes:
            raise ConfigError(f"policy.max_peer_bytes = {policy.max_peer_bytes} is less than max_message_bytes = "
                              f"{max_message_bytes}: a peer's largest message would be refused; raise "
                              "max_peer_bytes under [policy] (or lower max_message_bytes)")
        self.bounds = _Bounds(policy)
        self._quiet = _Quiet()
        self._revocations = credentials.revocations() if credentials is not None else None
        self._lock = threading.Lock()
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.stream_unary_rpc_method_handler(self._call),
                      METHOD_MANY: grpc.stream_unary_rpc_method_handler(self._call_many)})
        # Each peer may hold max_peer_calls threads (reading its message, or waiting for the node); a few more
        # answer refusals, so that a flood from one client never queues another peer's call behind it.
        threads = max(workers, policy.max_peer_calls * max(len(self.allowed), 1) + 4)
        # SO_REUSEPORT off: a second server on a busy port must fail, not share it silently.
        self._server = grpc.server(ThreadPoolExecutor(max_workers=threads), handlers=[handler],
                                   options=[*_server_options(max_message_bytes), ("grpc.so_reuseport", 0)])
        try:
            if credentials is None:
                warn_insecure(f"party {node.name!r}")
                port = self._server.add_insecure_port(address)
            else:
                server_credentials = grpc.ssl_server_credentials(
                    [(credentials.key, credentials.certificate)], root_certificates=credentials.ca,
                    require_client_auth=True)
                port = self._server.add_secure_port(address, server_credentials)
        except RuntimeError as exc:
            raise AddressInUseError(f"party {node.name!r} cannot listen on {address}: {exc}; is the address already "
                                 "in use? Choose another port") from exc
        if port == 0:
            raise AddressInUseError(f"party {node.name!r} cannot listen on {address}: the address is already in use "
                                 "or not valid; choose another port")
        host = address.rsplit(":", 1)[0]
        self.port = port
        self.address = f"{host}:{port}"

    def start(self) -> PartyServer:
        self.bounds.start()
        self._server.start()
        logger.info("party %s listening on %s (%s)", self.node.name, self.address, "TLS" if self.secure else "no TLS")
        return self

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait(grace + 1.0)
        self.bounds.stop()

    def wait(self) -> None:
        self._server.wait_for_termination()

    def _error(self, exc: Exception) -> bytes:
        return error_frame(self.node.name, exc, max_bytes=self.max_message_bytes)

    def _stranger(self, auth: Mapping[str, Sequence[bytes]]) -> bytes | None:
        """An error reply for a client whose certificate (``auth``: the call's auth context) names no peer of this
        party, or was revoked, from its certificate alone: nothing it sent has been read (a stranger's large header
        was once parsed, at many times its size in memory, before its sender was checked; later its whole body was
        still read first)."""
        if not self.secure:
            return None
        names = [n.decode(errors="replace") for n in (auth.get("x509_common_name") or [])]
        if any(n in self.allowed for n in names):
            if self._revocations is None:
                return None
            pem = (auth.get("x509_pem_cert") or [b""])[0]
            try:
                self._revocations.check(pem, f"the client {names[0]!r}'s")
            except PartyBoundaryError as exc:
                self._quiet.warn(repr(names), "party %s refused %r before reading its message: %s", self.node.name,
                                 names, exc)
                return self._refused(names, exc)
            return None
        self._quiet.warn(repr(names), "party %s refused a client authenticated as %r before reading its message: "
                         "not a peer", self.node.name, names)
        who = repr(names[0]) if len(names) == 1 else f"a client authenticated as {names}"
        return self._refused(names, PartyBoundaryError(f"party {self.node.name!r} does not accept messages from "
                                                       f"{who}: not a configured peer (refused before reading the "
                                                       "message)"))

    def _refused(self, names: list[str], exc: Exception) -> bytes:
        answer = self._error(exc)
        if self.departures is not None:
            self.departures.refused(",".join(names) or "?", len(answer), str(exc))
        return answer

    def _peer(self, context: grpc.ServicerContext, auth: Mapping[str, Sequence[bytes]]) -> str:
        """Whom a call's bounds are counted against: the peer its certificate names (without TLS, its address)."""
        if not self.secure:
            return str(context.peer())
        return ",".join(n.decode(errors="replace") for n in (auth.get("x509_common_name") or []))

    def _call(self, chunks: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        answer = self._answer(chunks, context, many=False)
        return answer[0] if answer else b""

    def _call_many(self, chunks: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """Several messages in order, under one hold of the node; stops after the first that fails."""
        return pack_frames(self._answer(chunks, context, many=True))

    def _answer(self, chunks: Iterator[bytes], context: grpc.ServicerContext, *, many: bool) -> list[bytes]:
        """The reply frames to a call, its message read only from a peer and within that peer's bounds (none when
        the call was cancelled: its message came too late, or its caller went away)."""
        auth = context.auth_context() if self.secure else {}
        refused = self._stranger(auth)
        if refused is not None:
            return [refused]
        peer = self._peer(context, auth)
        if not self.bounds.enter(peer):
            return [self._refused([peer], PartyBoundaryError(
                f"party {self.node.name!r} refused a call from {peer!r} before reading it: {self.bounds.calls} of its "
                "calls are in progress already (policy.max_peer_calls); wait for their answers, or raise "
                "max_peer_calls under that party's [policy]"))]
        held = [0]
        try:
            try:
                body = self._receive(chunks, context, peer, held)
            except _LateError:
                return []
            except (CodecError, PartyBoundaryError) as exc:
                self._quiet.warn(f"refused {peer}", "%s", exc)
                return [self._refused([peer], exc)]
            if not many:
                with self._lock:
                    if self._expired(context, peer):
                        return []
                    return [self._serve(body, context)[0]]
            try:
                frames = unpack_frames(body, max_bytes=self.max_message_bytes)
            except CodecError as exc:
                return [self._error(exc)]
            del body
            with self._lock:
                if self._expired(context, peer):
                    return []
                return serve_each(frames, lambda frame: self._serve(frame, context))
        finally:
            self.bounds.leave(peer, held[0])

    def _expired(self, context: grpc.ServicerContext, peer: str) -> bool:
        """Whether the call's caller gave up (its deadline passed) while it waited its turn: then it is not served,
        as its caller already counts it failed, and calls that pile up behind a slow turn do not hold the party a
        deadline each."""
        if context.is_active():
            return False
        self._quiet.warn(f"expired {peer}", "party %s dropped a call from %r unserved: its caller's deadline passed "
                         "while it waited its turn", self.node.name, peer)
        return True

    def _receive(self, chunks: Iterator[bytes], context: grpc.ServicerContext, peer: str,
                 held: list[int]) -> bytes | bytearray:
        """A call's message, read chunk by chunk: each counted against ``peer``'s bytes in flight (in ``held``),
        the whole within ``max_arrival_seconds``. A declared size over the bounds is refused before any is read;
        a message of a declared size is gathered into one buffer of that size (no joined copy besides)."""
        declared = 0
        for key, value in context.invocation_metadata() or ():
            if key == SIZE_KEY:
                declared = int(value) if str(value).isdigit() else -1
        if declared < 0 or declared > self._largest:
            raise CodecError(f"party {self.node.name!r} refused a call of {declared} bytes from {peer!r} before "
                             f"reading it: more than its largest message ({self.max_message_bytes} bytes, "
                             "max_message_bytes)")
        if declared and not self.bounds.take(peer, declared):
            raise self._over(peer, declared)
        held[0] = declared
        buffer = bytearray(declared) if declared else None
        parts: list[bytes] = []
        got = 0
        token = self.bounds.waiting(context)
        watched = True
        try:
            # A call without a declared size carries one message (a unary call: how a frame of one chunk is sent).
            # Its end is not waited for: one receive less on the path of SplitNN's many small messages.
            for chunk in chunks if declared else itertools.islice(chunks, 1):
                at, got = got, got + len(chunk)
                if got > self._largest:
                    raise CodecError(f"party {self.node.name!r} refused a call from {peer!r}: its message is larger "
                                     f"than {self.max_message_bytes} bytes (max_message_bytes)")
                if got > held[0]:
                    if not self.bounds.take(peer, got - held[0]):
                        raise self._over(peer, got)
                    held[0] = got
                if buffer is None:
                    parts.append(chunk)
                elif got <= declared:
                    buffer[at:got] = chunk
                else:
                    raise CodecError(f"party {self.node.name!r} refused a call from {peer!r}: it sent more than the "
                                     f"{declared} bytes it declared")
        except grpc.RpcError as exc:
            watched = self.bounds.arrived(token)
            self._quiet.warn(f"dropped {peer}", "party %s dropped a call from %r after %d bytes: %s", self.node.name,
                             peer, got, "it was cancelled (by its caller, or as the server stops)" if watched else
                             f"its message had not arrived within {self.bounds.arrival:g} s "
                             "(policy.max_arrival_seconds)")
            raise _LateError() from exc
        finally:
            if watched:
                self.bounds.arrived(token)
        if not context.is_active():
            raise _LateError()
        if buffer is not None:
            if got != declared:
                raise CodecError(f"party {self.node.name!r} refused a call from {peer!r}: it declared {declared} bytes "
                                 f"and sent {got}")
            return buffer
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _over(self, peer: str, nbytes: int) -> PartyBoundaryError:
        calls, held = self.bounds.held(peer)
        return PartyBoundaryError(
            f"party {self.node.name!r} refused a call from {peer!r}: {nbytes} bytes would take its messages in flight "
            f"over {self.bounds.bytes} bytes (policy.max_peer_bytes; {held} held by {calls} calls now); wait for "
            "the answers, or raise max_peer_bytes under that party's [policy]")

    def _serve(self, frame: bytes | bytearray, context: grpc.ServicerContext) -> tuple[bytes, bool]:
        """One message's reply frame, and whether it carries an error (the caller holds the node's lock)."""

        def authenticate(message: Message) -> None:
            if not self.secure:
                return
            pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
            names = pem_names(pem) if pem else ([], [])
            # No name in the certificate may be a party's in another spelling ("Hospital", "hospital."): names
            # are compared in normal form, so such a certificate could pass as that party elsewhere.
            check_certificate_names(names, {*self.allowed, self.node.name}, holder="the client's certificate")
            if names[0] != [message.sender]:
                raise PartyBoundaryError(
                    f"a client authenticated as {names[0]} sent a message as {message.sender!r}; refused")

        return serve_frame(self.node, frame, allowed=self.allowed, max_bytes=self.max_message_bytes,
                           authenticate=authenticate, departures=self.departures)


class _Sender:
    """One method of a party, called with a whole body (a frame, or a CallMany body): sent as one gRPC message when
    it fits in a chunk (the common, fast case: a unary call), else streamed in chunks behind its declared size, so
    that the server can refuse it before reading it and never takes in more than a chunk at once."""

    __slots__ = ("stream", "unary")

    def __init__(self, unary: Any, stream: Any) -> None:
        self.unary = unary
        self.stream = stream

    def __call__(self, body: bytes, timeout: float | None = None) -> bytes:
        if len(body) <= CHUNK_BYTES:
            reply: bytes = self.unary(body, timeout=timeout)
            return reply
        pieces = (body[at : at + CHUNK_BYTES] for at in range(0, len(body), CHUNK_BYTES))
        reply = self.stream(pieces, timeout=timeout, metadata=((SIZE_KEY, str(len(body))),))
        return reply


#: Seconds a call still has when made past its caller's ``until`` (GrpcTransport.until).
LAST_CALL = 0.005


class GrpcTransport(Transport):
    """Requests from one party to others over gRPC, with deadlines and retries for unreachable parties."""

    def __init__(
        self, party: str, peers: Mapping[str, str], *, credentials: PartyCredentials | None,
        ledger: Ledger | None = None, max_message_bytes: int = DEFAULT_MAX_BYTES, deadline: float = DEFAULT_DEADLINE,
        retries: int = 3, backoff: float = 0.25,
    ) -> None:
        super().__init__(ledger=ledger, max_message_bytes=max_message_bytes)
        if credentials is None:
            warn_insecure(f"party {party!r}'s client")
        self.party = party
        self.peers = dict(peers)
        self.credentials = credentials
        self.deadline = deadline
        # An absolute time (time.monotonic) by which every call must also be answered, where the caller has one
        # (a served request's own deadline, counted from its arrival); None: each call has the whole deadline.
        self.until: float | None = None
        self.retries = retries
        self.backoff = backoff
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, tuple[_Sender, _Sender]] = {}
        self._retired: list[grpc.Channel] = []
        self._revocations = credentials.revocations() if credentials is not None else None
        self._revoked: frozenset[int] = frozenset()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(4, len(self.peers)))
        # One sender thread for request_many_async: requests started early still go out in order.
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vflo-send")

    @property
    def shared_ledger(self) -> bool:
        return False

    def peer_host(self, party: str) -> str:
        address = self.peers.get(party, "")
        return address.rpartition(":")[0] or "127.0.0.1"

    def link_files(self) -> tuple[str, str, str] | None:
        if self.credentials is None or not self.credentials.folder:
            return None
        folder = Path(self.credentials.folder)
        return (str(folder / f"{self.party}.pem"), str(folder / f"{self.party}.key"), str(folder / "ca.pem"))

    def _verified_certificate(self, receiver: str, kinds: str, until: float) -> bytes:
        """The certificate (PEM) of the party at ``receiver``'s address, read in a TLS handshake of our own and
        checked: it names ``receiver`` and no party in another spelling (gRPC's own check ignores case and a
        trailing dot, and passes any certificate that carries the name "hospital" at all), and is not revoked.
        Where no handshake completes (tried again within the deadline while that may help), or the certificate
        fails a check, the call fails here: nothing is sent to a party whose certificate was not read."""
        assert self.credentials is not None
        address = self.peers[receiver]
        attempt = 0
        while True:
            try:
                cert = peer_certificate(address, receiver, self.credentials,
                                        timeout=max(min(until - time.monotonic(), 10.0), 0.001))
                break
            except ProbeError as exc:
                pause = self.backoff * 2 ** attempt
                if exc.transient and attempt < self.retries and time.monotonic() + pause < until:
                    attempt += 1
                    time.sleep(pause)
                    continue
                if exc.transient and time.monotonic() >= until:  # as a call whose deadline passes
                    raise DeliveryTimeoutError(receiver, kinds, self.deadline) from exc
                raise TransportError(
                    f"party {receiver!r} at {address} could not be reached for {kinds!r}: its certificate could not be "
                    f"read, so nothing was sent: {diagnose(exc.cause, receiver, address, secure=True)} (TLS: "
                    f"{exc.cause})") from exc
        try:
            check_peer_certificate(cert, peer=receiver, parties={self.party, *self.peers}, revoked=self._revoked,
                                   holder="its certificate",
                                   advice=diagnose("peer name", receiver, address, secure=True))
        except PartyBoundaryError as exc:
            raise TransportError(f"party {receiver!r} at {address} is refused: {exc} (nothing was sent to it)") from exc
        return cert.public_bytes(serialization.Encoding.PEM)

    def _stub(self, receiver: str, kinds: str = "call", until: float | None = None) -> tuple[_Sender, _Sender]:
        """What sends to ``receiver`` (one message, several: each called with the whole body) on a channel that,
        with TLS, trusts only the certificate just read and checked at its address, so that no connection it makes
        (a reconnection included) reaches a party other than the one checked."""
        if receiver not in self.peers:
            raise ProtocolError(unknown_name("party", receiver, self.peers))
        if self._revocations is not None:
            revoked = self._revocations.serials()
            if revoked != self._revoked:  # a new list: every peer's certificate is read and checked again
                with self._lock:
                    self._revoked = revoked
                    for party in list(self._stubs):
                        self._retire(party)
        with self._lock:
            if receiver in self._stubs:
                return self._stubs[receiver]
        address = self.peers[receiver]
        options = _options(self.max_message_bytes)
        if self.credentials is None:
            channel = grpc.insecure_channel(address, options=options)
        else:
            until = time.monotonic() + self.deadline if until is None else until
            pinned = self._verified_certificate(receiver, kinds, until)
            # The channel trusts exactly the certificate checked above (as its only root), not every certificate the
            # CA signed: a party that shows a probe one certificate and gRPC another is never sent anything.
            creds = grpc.ssl_channel_credentials(
                root_certificates=pinned, private_key=self.credentials.key,
                certificate_chain=self.credentials.certificate)
            channel = grpc.secure_channel(address, creds,
                                          options=[*options, ("grpc.ssl_target_name_override", receiver)])
        with self._lock:
            if receiver in self._stubs:  # another thread made one meanwhile
                self._retired.append(channel)
                return self._stubs[receiver]
            self._channels[receiver] = channel
            self._stubs[receiver] = (_Sender(channel.unary_unary(PATH), channel.stream_unary(PATH)),
                                     _Sender(channel.unary_unary(PATH_MANY), channel.stream_unary(PATH_MANY)))
            return self._stubs[receiver]

    def _retire(self, receiver: str) -> None:
        """Forget ``receiver``'s channel (the caller holds the lock): the next call reads its certificate again.
        The channel is closed at :meth:`close`, not now: another thread's call may still be on it."""
        channel = self._channels.pop(receiver, None)
        self._stubs.pop(receiver, None)
        if channel is not None:
            self._retired.append(channel)

    def _deliver(self, messages: Sequence[Message]) -> list[Message]:
        replies: list[Message] = []
        for chunk in self._chunks(messages):
            replies.extend(self._call(chunk))
            if replies[-1].error is not None:
                break
        return replies

    def _chunks(self, messages: Sequence[Message]) -> list[list[tuple[Message, bytes]]]:
        """Encoded messages grouped into calls of at most ``max_message_bytes`` each (one message may be alone)."""
        chunks: list[list[tuple[Message, bytes]]] = []
        size = 0
        for message in messages:
            frame = encode(message, max_bytes=self.max_message_bytes)
            if not chunks or size + len(frame) + FRAME_HEADER > self.max_message_bytes or len(chunks[-1]) >= MAX_FRAMES:
                chunks.append([])
                size = 0
            chunks[-1].append((message, frame))
            size += len(frame) + FRAME_HEADER
        return chunks

    def _call(self, chunk: Sequence[tuple[Message, bytes]]) -> list[Message]:
        """One gRPC call carrying ``chunk`` (one message: a plain frame; several: packed frames)."""
        receiver = chunk[0][0].receiver
        kinds = " + ".join(dict.fromkeys(m.kind for m, _ in chunk))
        # The deadline bounds the call, retries and the certificate check included: a party down for longer is
        # late, not waited for.
        now = time.monotonic()
        until = now + self.deadline
        if self.until is not None:
            # A call made once the caller's time is (nearly) up still has a few milliseconds: a party that answers
            # at once is not left out because another took the time before it.
            until = min(until, max(self.until, now + LAST_CALL))
        one, several = self._stub(receiver, kinds, until)
        framing = FRAME_HEADER if len(chunk) > 1 else 0  # each frame's length header in a CallMany body
        seqs = self._record_requests([m for m, _ in chunk], [f for _, f in chunk], framing=framing)
        body = chunk[0][1] if len(chunk) == 1 else pack_frames([frame for _, frame in chunk])
        attempt = 0
        while True:
            try:
                timeout = max(until - time.monotonic(), 0.001)
                reply_body = (several if len(chunk) > 1 else one)(body, timeout=timeout)
                break
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise DeliveryTimeoutError(receiver, kinds, self.deadline) from exc
                if code == grpc.StatusCode.UNAVAILABLE:
                    with self._lock:  # the party may have restarted, or renewed its certificate: read it again
                        self._retire(receiver)
                pause = self.backoff * 2 ** attempt
                if code == grpc.StatusCode.UNAVAILABLE and attempt < self.retries \
                        and time.monotonic() + pause < until:
                    attempt += 1
                    time.sleep(pause)
                    one, several = self._stub(receiver, kinds, until)
                    continue
                details = exc.details() if hasattr(exc, "details") else str(exc)
                raise TransportError(
                    f"party {receiver!r} at {self.peers[receiver]} could not be reached for {kinds!r}: "
                    f"{diagnose(details, receiver, self.peers[receiver], secure=self.credentials is not None)} "
                    f"(gRPC: {code.name if code else 'error'}: {details})") from exc
        try:
            frames = [reply_body] if len(chunk) == 1 else unpack_frames(reply_body, max_bytes=self.max_message_bytes)
        except CodecError as exc:
            raise ProtocolError(f"party {receiver!r} sent a malformed message in answer to {kinds!r}: {exc}") from exc
        return self._take_replies(receiver, frames, seqs, framing=framing, what=repr(kinds))

    def request_each(self, messages: Sequence[Message]) -> list[Message | TransportError]:
        if len(messages) <= 1:
            return super().request_each(messages)

        def one(m: Message) -> Message | TransportError:
            try:
                return self.request(m)
            except TransportError as exc:
                return exc

        return list(self._pool.map(one, messages))

    def request_many_async(self, messages: Sequence[Message]) -> Future[list[Message]]:
        # The call waits in another thread (gRPC releases the GIL while it waits), so the sender
        # computes while the messages travel and the receivers work.
        return self._background.submit(self.request_many, messages)

    def close(self) -> None:
        for channel in [*self._channels.values(), *self._retired]:
            channel.close()
        self._channels.clear()
        self._retired.clear()
        self._stubs.clear()
        self._pool.shutdown(wait=False)
        self._background.shutdown(wait=False)
