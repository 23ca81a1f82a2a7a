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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from vflo.comm.codec import DEFAULT_MAX_BYTES, decode, encode
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message, MessageError
from vflo.comm.tls import PartyCredentials
from vflo.comm.transport import Transport
from vflo.errors import (
    CodecError,
    DeliveryTimeoutError,
    PartyBoundaryError,
    ProtocolError,
    TransportError,
    unknown_name,
)
from vflo.federation.node import Node

logger = logging.getLogger(__name__)

SERVICE, METHOD = "vflo.Party", "Call"
PATH = f"/{SERVICE}/{METHOD}"
DEFAULT_DEADLINE = 600.0


def _options(max_bytes: int) -> list[tuple[str, Any]]:
    # The codec enforces the real limit; gRPC's must not be the smaller one.
    limit = min(max_bytes + (1 << 20), 2**31 - 1)
    return [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]


def warn_insecure(who: str) -> None:
    text = (f"INSECURE: {who} runs without TLS: messages are unencrypted and parties are not authenticated. "
            "Use this only for experiments on a loopback interface.")
    logger.warning(text)


class PartyServer:
    """Serves one party's node over gRPC (mutual TLS unless ``credentials`` is None)."""

    def __init__(
        self, node: Node, *, address: str, credentials: PartyCredentials | None, allowed: Collection[str],
        max_message_bytes: int = DEFAULT_MAX_BYTES, workers: int = 8,
    ) -> None:
        self.node = node
        self.max_message_bytes = max_message_bytes
        self.allowed = frozenset(allowed)
        self.secure = credentials is not None
        self._lock = threading.Lock()
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(self._call)})
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
            raise TransportError(f"party {node.name!r} cannot listen on {address}: {exc}; is the address already "
                                 "in use? Choose another port") from exc
        if port == 0:
            raise TransportError(f"party {node.name!r} cannot listen on {address}: the address is already in use "
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

    def _error(self, exc: Exception, sender: str = "?", kind: str = "?", round_no: int = 0) -> bytes:
        reply = Message(sender=self.node.name, receiver=sender, kind=kind, round=round_no,
                        error=MessageError(type=type(exc).__name__, message=str(exc)))
        return encode(reply, max_bytes=self.max_message_bytes)

    def _call(self, frame: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            message = decode(frame, max_bytes=self.max_message_bytes)
        except CodecError as exc:
            return self._error(exc)
        try:
            self._authorise(message, context)
        except PartyBoundaryError as exc:
            logger.warning("party %s refused a message: %s", self.node.name, exc)
            return self._error(exc, message.sender, message.kind, message.round)
        with self._lock:
            reply = self.node.handle(message)
        try:
            return encode(reply, max_bytes=self.max_message_bytes)
        except CodecError as exc:
            return self._error(exc, message.sender, message.kind, message.round)

    def _authorise(self, message: Message, context: grpc.ServicerContext) -> None:
        if message.sender not in self.allowed:
            raise PartyBoundaryError(
                f"party {self.node.name!r} does not accept messages from {message.sender!r}: not a configured peer")
        if not self.secure:
            return
        names = [n.decode() for n in (context.auth_context().get("x509_common_name") or [])]
        if message.sender not in names:
            raise PartyBoundaryError(
                f"a client authenticated as {names} sent a message as {message.sender!r}; refused")


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
        self._stubs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(4, len(self.peers)))

    @property
    def shared_ledger(self) -> bool:
        return False

    def _stub(self, receiver: str) -> Any:
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
            self._stubs[receiver] = channel.unary_unary(PATH)
            return self._stubs[receiver]

    def request(self, message: Message) -> Message:
        stub = self._stub(message.receiver)
        frame = encode(message, max_bytes=self.max_message_bytes)
        entry = self.ledger.record(round=message.round, sender=message.sender, receiver=message.receiver,
                                   kind=message.kind, direction="request", nbytes=len(frame))
        attempt = 0
        while True:
            try:
                reply_frame = stub(frame, timeout=self.deadline)
                break
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise DeliveryTimeoutError(message.receiver, message.kind, self.deadline) from exc
                if code == grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                    attempt += 1
                    time.sleep(self.backoff * 2 ** (attempt - 1))
                    continue
                details = exc.details() if hasattr(exc, "details") else str(exc)
                raise TransportError(
                    f"party {message.receiver!r} at {self.peers[message.receiver]} could not be reached for "
                    f"{message.kind!r} ({code.name if code else 'error'}: {details}); is it running, and do its "
                    "address and certificates match the deploy config?") from exc
        reply = decode(reply_frame, max_bytes=self.max_message_bytes)
        self.ledger.record(round=reply.round, sender=reply.sender, receiver=reply.receiver, kind=reply.kind,
                           direction="reply", nbytes=len(reply_frame), reply_to=entry.seq)
        return reply

    def request_each(self, messages: Sequence[Message]) -> list[Message | TransportError]:
        if len(messages) <= 1:
            return super().request_each(messages)

        def one(m: Message) -> Message | TransportError:
            try:
                return self.request(m)
            except TransportError as exc:
                return exc

        return list(self._pool.map(one, messages))

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()
        self._pool.shutdown(wait=False)
