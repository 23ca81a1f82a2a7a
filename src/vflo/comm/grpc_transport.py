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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from vflo.comm.codec import DEFAULT_MAX_BYTES, encode
from vflo.comm.departures import DepartureLog
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.comm.serving import error_frame, serve_each, serve_frame
from vflo.comm.tls import (
    PartyCredentials,
    certificate_names,
    check_certificate_names,
    peer_certificate,
    pem_names,
)
from vflo.comm.transport import Endpoint, Transport
from vflo.errors import (
    AddressInUseError,
    CodecError,
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


def _options(max_bytes: int) -> list[tuple[str, Any]]:
    # The codec enforces the real limit; gRPC's must not be the smaller one.
    limit = min(max_bytes + (1 << 20), 2**31 - 1)
    # A larger HTTP/2 look-ahead window lets a batch of activations (128 KB and up) cross without waiting
    # for a window update: about 20% off a 128 KB round trip on loopback here.
    return [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
            ("grpc.http2.lookahead_bytes", 8 << 20)]


def pack_frames(frames: Sequence[bytes]) -> bytes:
    """Frames in one body for CallMany: each behind its length."""
    return b"".join(len(f).to_bytes(FRAME_HEADER, "little") + f for f in frames)


def unpack_frames(body: bytes, *, max_bytes: int) -> list[bytes]:
    """The frames of a CallMany body; a malformed body is a :class:`CodecError`."""
    frames: list[bytes] = []
    at = 0
    while at < len(body):
        if len(frames) >= MAX_FRAMES or at + FRAME_HEADER > len(body):
            raise CodecError("malformed multi-message body: too many frames or a cut length header")
        n = int.from_bytes(body[at : at + FRAME_HEADER], "little")
        at += FRAME_HEADER
        if n > max_bytes or at + n > len(body):
            raise CodecError(f"malformed multi-message body: a frame of {n} bytes does not fit")
        frames.append(body[at : at + n])
        at += n
    if not frames:
        raise CodecError("malformed multi-message body: no frames")
    return frames


def diagnose(details: str, receiver: str, address: str, *, secure: bool) -> str:
    """What a failed connection most likely means, in the words of the deploy config."""
    text = details.lower()
    if "certificate signature failure" in text or "certificate_verify_failed" in text or "bad_signature" in text:
        return ("its certificate was not signed by this party's CA (ca.pem): the two come from different "
                "`vflo certs init` runs; give every party certificates from one CA")
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


def warn_insecure(who: str) -> None:
    text = (f"INSECURE: {who} runs without TLS: messages are unencrypted and parties are not authenticated. "
            "Use this only for experiments on a loopback interface.")
    logger.warning(text)


class PartyServer:
    """Serves one party's node over gRPC (mutual TLS unless ``credentials`` is None)."""

    def __init__(
        self, node: Endpoint, *, address: str, credentials: PartyCredentials | None, allowed: Collection[str],
        max_message_bytes: int = DEFAULT_MAX_BYTES, workers: int = 8, departures: DepartureLog | None = None,
    ) -> None:
        self.node = node
        self.departures = departures
        self.max_message_bytes = max_message_bytes
        self.allowed = frozenset(allowed)
        self.secure = credentials is not None
        self._revocations = credentials.revocations() if credentials is not None else None
        self._lock = threading.Lock()
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(self._call),
                      METHOD_MANY: grpc.unary_unary_rpc_method_handler(self._call_many)})
        # SO_REUSEPORT off: a second server on a busy port must fail, not share it silently.
        self._server = grpc.server(ThreadPoolExecutor(max_workers=workers), handlers=[handler],
                                   options=[*_options(max_message_bytes), ("grpc.so_reuseport", 0)])
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
        self._server.start()
        logger.info("party %s listening on %s (%s)", self.node.name, self.address, "TLS" if self.secure else "no TLS")
        return self

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait(grace + 1.0)

    def wait(self) -> None:
        self._server.wait_for_termination()

    def _error(self, exc: Exception) -> bytes:
        return error_frame(self.node.name, exc, max_bytes=self.max_message_bytes)

    def _stranger(self, context: grpc.ServicerContext) -> bytes | None:
        """An error reply for a client whose certificate names no peer of this party, before anything it sent is
        decoded (a stranger's 120 MB header was parsed, at 3.5 GB, before its sender was checked)."""
        if not self.secure:
            return None
        names = [n.decode() for n in (context.auth_context().get("x509_common_name") or [])]
        if any(n in self.allowed for n in names):
            if self._revocations is None:
                return None
            pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
            try:
                self._revocations.check(pem, f"the client {names[0]!r}'s")
            except PartyBoundaryError as exc:
                logger.warning("party %s refused %s before reading its message: %s", self.node.name, names, exc)
                return self._refused(names, exc)
            return None
        logger.warning("party %s refused a client authenticated as %s before reading its message: not a peer",
                       self.node.name, names)
        who = repr(names[0]) if len(names) == 1 else f"a client authenticated as {names}"
        return self._refused(names, PartyBoundaryError(f"party {self.node.name!r} does not accept messages from "
                                                       f"{who}: not a configured peer (refused before reading the "
                                                       "message)"))

    def _refused(self, names: list[str], exc: Exception) -> bytes:
        answer = self._error(exc)
        if self.departures is not None:
            self.departures.refused(",".join(names) or "?", len(answer), str(exc))
        return answer

    def _call(self, frame: bytes, context: grpc.ServicerContext) -> bytes:
        refused = self._stranger(context)
        if refused is not None:
            return refused
        with self._lock:
            return self._serve(frame, context)[0]

    def _call_many(self, body: bytes, context: grpc.ServicerContext) -> bytes:
        """Several messages in order, under one hold of the node; stops after the first that fails."""
        refused = self._stranger(context)
        if refused is not None:
            return pack_frames([refused])
        try:
            frames = unpack_frames(body, max_bytes=self.max_message_bytes)
        except CodecError as exc:
            return pack_frames([self._error(exc)])
        with self._lock:
            return pack_frames(serve_each(frames, lambda frame: self._serve(frame, context)))

    def _serve(self, frame: bytes, context: grpc.ServicerContext) -> tuple[bytes, bool]:
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
        self.retries = retries
        self.backoff = backoff
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, tuple[Any, Any]] = {}
        self._checked: set[str] = set()  # peers whose certificate this client has read (see _check_server)
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

    def _check_server(self, receiver: str) -> None:
        """Until it has seen it once, read the certificate of the party at ``receiver``'s address and refuse one
        that names a party in another spelling: gRPC's own check (that the certificate names ``receiver``)
        ignores case and a trailing dot, so "Hospital" or "hospital." in the lab's certificate would pass as
        "hospital". Where no handshake completes, the gRPC call that follows fails and says why."""
        if self._revocations is not None:
            revoked = self._revocations.serials()
            if revoked != self._revoked:  # a new list: every peer's certificate is read again
                self._revoked, self._checked = revoked, set()
        if self.credentials is None or receiver in self._checked or receiver not in self.peers:
            return
        address = self.peers[receiver]
        cert = peer_certificate(address, receiver, self.credentials, timeout=min(self.deadline, 10.0))
        if cert is None:
            return
        names = certificate_names(cert)
        try:
            check_certificate_names(names, {self.party, *self.peers}, holder="its certificate")
            if cert.serial_number in self._revoked:
                raise PartyBoundaryError(f"its certificate (serial {cert.serial_number:x}) was revoked by the "
                                         "federation's CA")
        except PartyBoundaryError as exc:
            raise TransportError(f"party {receiver!r} at {address} is refused: {exc}") from exc
        if names[0] == [receiver]:
            self._checked.add(receiver)

    def _stub(self, receiver: str) -> tuple[Any, Any]:
        self._check_server(receiver)
        with self._lock:
            if receiver in self._stubs:
                return self._stubs[receiver]
            if receiver not in self.peers:
                raise ProtocolError(unknown_name("party", receiver, self.peers))
            address = self.peers[receiver]
            options = _options(self.max_message_bytes)
            if self.credentials is None:
                channel = grpc.insecure_channel(address, options=options)
            else:
                creds = grpc.ssl_channel_credentials(
                    root_certificates=self.credentials.ca, private_key=self.credentials.key,
                    certificate_chain=self.credentials.certificate)
                # The server's certificate must name the party we mean to reach, whatever its address.
                channel = grpc.secure_channel(address, creds,
                                              options=[*options, ("grpc.ssl_target_name_override", receiver)])
            self._channels[receiver] = channel
            self._stubs[receiver] = (channel.unary_unary(PATH), channel.unary_unary(PATH_MANY))
            return self._stubs[receiver]

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
        stub, stub_many = self._stub(receiver)
        kinds = " + ".join(dict.fromkeys(m.kind for m, _ in chunk))
        framing = FRAME_HEADER if len(chunk) > 1 else 0  # each frame's length header in a CallMany body
        seqs = self._record_requests([m for m, _ in chunk], [f for _, f in chunk], framing=framing)
        body = chunk[0][1] if len(chunk) == 1 else pack_frames([frame for _, frame in chunk])
        attempt = 0
        # The deadline bounds the call, retries included: a party down for longer is late, not waited for.
        until = time.monotonic() + self.deadline
        while True:
            try:
                timeout = max(until - time.monotonic(), 0.001)
                reply_body = (stub if len(chunk) == 1 else stub_many)(body, timeout=timeout)
                break
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise DeliveryTimeoutError(receiver, kinds, self.deadline) from exc
                pause = self.backoff * 2 ** attempt
                if code == grpc.StatusCode.UNAVAILABLE and attempt < self.retries \
                        and time.monotonic() + pause < until:
                    attempt += 1
                    time.sleep(pause)
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
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()
        self._pool.shutdown(wait=False)
        self._background.shutdown(wait=False)
