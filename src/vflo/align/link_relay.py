"""vflo's own relays around the PSI library's link (:mod:`vflo.align.spu`): the library never meets the network.

The library (brpc) listens on a Unix socket in its side's private folder and dials its peer through another
there; only vflo's relays listen on the network. brpc speaks plain text on a port it serves with TLS too (a
client with no certificate got ``200`` for an HTTP ``ReceiverService/Push``, and a stranger's pushes made a side
abort), so the link's TLS is vflo's:

* inbound, on the party's ``[policy] psi_link``: a connection is handed to the library only after a TLS
  handshake with a client certificate of the federation's CA that names exactly the expected peer (in vflo's
  normal form of names, :func:`vflo.comm.tls.check_certificate_names`) and is not revoked. Any other is closed
  before a byte of it reaches the library, logged once, and the run goes on.
* outbound, on a Unix socket the library dials: each connection opens TLS to the peer's relay with this party's
  certificate, and forwards nothing unless the server's certificate names the expected peer.

Without TLS credentials (one process, ``--insecure``) the relays carry plain TCP, and say so.

Both relays of a side run on one event loop in a thread of their own: asyncio's TLS streams read and write one
connection from one thread (an ``ssl.SSLSocket`` read and written from two threads is not safe). Their sockets
send a small message at once (``TCP_NODELAY``): behind Nagle's algorithm the link's messages stalled under TLS,
for seconds or until the timeout. A relay listens only once its target does: until then a connection to it is
refused, as one to the target itself would be, and the link dials again; a relay that accepted at once and held
the connection until its target listened let the link's first requests wait in it, and now and then both sides
then waited for each other until their timeout. The outbound relay's socket exists from the start, refusing, and
it listens as soon as a TCP connection to the peer's relay is taken; the peer's certificate is then read on that
connection (each connection of the library's is checked again): a library refused a moment longer, or that
found no socket at all, waited 3 s (its health check) before it dialled again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from vflo.comm.revocations import Revocations
from vflo.comm.tls import check_peer_certificate, warn_insecure
from vflo.errors import AddressInUseError, ConfigError, PartyBoundaryError

logger = logging.getLogger(__name__)

#: The longest path a Unix socket may have on Linux (``sun_path`` holds 108 bytes, its terminating NUL included).
MAX_SOCKET_PATH = 107
#: How long a TLS handshake (or a connection to the library's own socket) may take.
HANDSHAKE_S = 10.0
#: Connections still in their handshake at once: more are closed at once, so that a stranger's flood of idle
#: connections cannot take the party's file descriptors (the link dials again).
MAX_PENDING = 128
CHUNK = 1 << 20
#: How long closing waits for connections to end.
CLOSE_S = 5.0


@dataclass(frozen=True)
class LinkTLS:
    """A party's own certificate and key, and its federation's CA, as files."""

    certificate: str
    key: str
    ca: str


def socket_path(folder: Path, name: str) -> str:
    """``folder/name`` for a Unix socket, refused when longer than a socket's path may be."""
    path = str(Path(folder).resolve() / name)
    if len(path.encode()) > MAX_SOCKET_PATH:
        raise ConfigError(f"the PSI link's socket {path!r} is {len(path.encode())} bytes long, more than the "
                          f"{MAX_SOCKET_PATH} a Unix socket's path may have: point TMPDIR at a folder with a shorter "
                          "path (each side's private folder is made there)")
    return path


def _context(tls: LinkTLS, purpose: ssl.Purpose) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH
                             else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The names are checked by check_certificate_names, in their normal form, and against the one expected peer.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_verify_locations(cafile=tls.ca)
        context.load_cert_chain(tls.certificate, tls.key)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise ConfigError(f"the PSI link cannot use this party's TLS files ({tls.certificate}, {tls.key}, "
                          f"{tls.ca}): {exc}; check its [tls] dir: its own key, its certificate "
                          "signed by the federation's CA (`vflo certs sign`) and that CA's ca.pem") from exc
    return context


class PeerCheck:
    """Whether a certificate the handshake verified (signed by the federation's CA) is the expected peer's: its
    names are that party's and no other party's in any spelling, and the CA has not revoked it."""

    def __init__(self, tls: LinkTLS, peer: str, parties: Collection[str]) -> None:
        self.peer = peer
        self.parties = frozenset(parties) | {peer}
        try:
            ca = Path(tls.ca).read_bytes()
        except OSError as exc:
            raise ConfigError(f"the PSI link cannot read this party's CA certificate {tls.ca}: {exc}") from exc
        # The CA's revocation list lies beside its certificate in a party's [tls] dir (crl.pem).
        self.revocations = Revocations(Path(tls.ca).parent, ca)

    def check(self, der: bytes | None, holder: str) -> None:
        """Refuse (:class:`PartyBoundaryError`) a certificate that is not the expected peer's."""
        if not der:
            raise PartyBoundaryError(f"{holder} is missing")
        check_peer_certificate(x509.load_der_x509_certificate(der), peer=self.peer, parties=self.parties,
                               revoked=self.revocations.serials(), holder=holder)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _abort(writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()


async def _end(*writers: asyncio.StreamWriter) -> None:
    """Close ``writers`` once what they hold is sent (at most :data:`CLOSE_S`), then drop them."""
    for writer in writers:
        writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True),
                               CLOSE_S)
    for writer in writers:
        _abort(writer)


#: Seconds a relay still carries what one end sent after the other end closed.
TRAILING_S = 0.5


class LinkRelays:
    """One side's two relays of the library's link with ``peer``: the library listens on :attr:`own` and dials
    :attr:`to_peer` (both ``unix:`` addresses in ``folder``, a folder only this user may enter), the peer dials
    :attr:`port` on ``listen``'s host. ``tls``: this party's files (None: plain TCP, for one process or
    ``--insecure``); ``parties``: the federation's party names, none of which the peer's certificate may spell
    otherwise. :attr:`sent` and :attr:`received` count the bytes the relays carried to the peer and from it (the
    library's own bytes, without TLS's records around them)."""

    def __init__(self, folder: Path, *, listen: tuple[str, int], me: str, peer: str, tls: LinkTLS | None,
                 parties: Collection[str] = (), wait_s: float = 120.0) -> None:
        self.me, self.peer, self.wait_s = me, peer, wait_s
        self.library_socket, self.dial_socket = socket_path(folder, "l.sock"), socket_path(folder, "p.sock")
        self.own, self.to_peer = f"unix:{self.library_socket}", f"unix:{self.dial_socket}"
        self.sent = self.received = 0
        self.admitted = self.refused = 0  # inbound connections handed to the library, and closed before it
        #: Why the outbound relay gave up on the peer (its certificate is not the peer's, say); "" otherwise.
        self.failure = ""
        self._server_tls: ssl.SSLContext | None = None
        self._client_tls: ssl.SSLContext | None = None
        self._check: PeerCheck | None = None
        if tls is not None:
            self._server_tls = _context(tls, ssl.Purpose.CLIENT_AUTH)
            self._client_tls = _context(tls, ssl.Purpose.SERVER_AUTH)
            self._check = PeerCheck(tls, peer, {me, *parties})
        else:
            warn_insecure(f"the PSI library's link between {me!r} and {peer!r}")
        host, port = listen
        try:
            family, _, _, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        except OSError as exc:  # socket.gaierror among them
            raise ConfigError(f"party {me!r} cannot listen on {host}:{port} for the PSI library's link ({exc}); "
                              "check its [policy] psi_link (HOST:PORT)") from exc
        # Reserved at once (its port goes to the peer), listening only once the library does.
        self._inbound = socket.socket(family, socket.SOCK_STREAM)
        self._inbound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._inbound.bind(address)
        except OSError as exc:
            self._inbound.close()
            raise AddressInUseError(f"party {me!r} cannot listen on {host}:{port} for the PSI library's link: "
                                    f"{exc}; choose another [policy] psi_link (port 0: any free port)") from exc
        self.port: int = self._inbound.getsockname()[1]
        # The library's way out exists at once but refuses until the peer's relay listens, as a peer's port would.
        self._outbound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # A folder may serve a second link (the partner answered the first request without starting a side):
            # the first one's sockets, which no one serves any more, make way.
            for stale in (Path(self.library_socket), Path(self.dial_socket)):
                if stale.is_socket():
                    stale.unlink()
            self._outbound.bind(self.dial_socket)
        except OSError as exc:
            self._inbound.close()
            self._outbound.close()
            raise ConfigError(f"the PSI link cannot make its socket {self.dial_socket}: {exc}") from exc
        self._closed = False
        self._checked = threading.Event()  # the outbound relay listens and its peer was checked, or it gave up
        self._pending = 0
        self._forward_failed = False
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._quiet)
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="vflo-psi-link")
        self._thread.start()
        self._submit(self._serve_inbound())

    # -- the caller's side (any thread) --

    def connect(self, host: str, port: int) -> None:
        """Start the outbound relay towards the peer's relay at ``host:port``: it listens once that one does."""
        self._submit(self._serve_outbound(host, port))

    def wait_listening(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the outbound relay listens, that is until the peer's relay does, and
        the peer's certificate was checked; False if it does not, or gave up (:attr:`failure` says why)."""
        return self._checked.wait(timeout_s) and not self.failure

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(CLOSE_S * 2)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CLOSE_S)
        self._inbound.close()
        self._outbound.close()
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> LinkRelays:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- on the relays' loop --

    def _submit(self, work: Coroutine[Any, Any, None]) -> None:
        def start() -> None:
            self._track(self._loop.create_task(work))

        self._loop.call_soon_threadsafe(start)

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _quiet(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # A stranger's connection can make asyncio report its end; each is logged once by the relay already. A close
        # cut short at shutdown (its wait cancelled) is no fault either.
        error = context.get("exception")
        ended = (OSError, EOFError, asyncio.CancelledError)
        level = logging.DEBUG if error is None or isinstance(error, ended) else logging.WARNING
        logger.log(level, "PSI link relay: %s", context.get("message"), exc_info=error)

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for writer in list(self._writers):
            _abort(writer)
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_S)

    async def _until(self, reach: Callable[[], Coroutine[Any, Any, bool]]) -> bool:
        """Try ``reach`` (True: it got there) until it does, for at most :attr:`wait_s`."""
        deadline = self._loop.time() + self.wait_s
        while not self._closed and not self.failure and self._loop.time() < deadline:
            if await reach():
                return True
            await asyncio.sleep(0.002)
        return False

    async def _library_listens(self) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_unix_connection(self.library_socket), HANDSHAKE_S)
        except (TimeoutError, OSError):
            return False
        _abort(writer)
        return True

    async def _serve_inbound(self) -> None:
        if not await self._until(self._library_listens):
            return
        self._inbound.listen()
        self._inbound.setblocking(False)
        logger.debug("PSI link: party %s's relay listens on port %d for %s", self.me, self.port, self.peer)
        while not self._closed:
            try:
                connection, who = await self._loop.sock_accept(self._inbound)
            except OSError as exc:
                if self._closed or self._inbound.fileno() < 0:
                    return
                logger.warning("PSI link: party %s's relay could not accept a connection (%s)", self.me, exc)
                await asyncio.sleep(0.1)
                continue
            self._track(self._loop.create_task(self._admit(connection, who)))

    async def _accepted(self, connection: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Streams over an accepted connection, after its TLS handshake where there is TLS. The handshake starts
        at once: a stream that read the client's first bytes before its TLS began would keep them from it."""
        reader = asyncio.StreamReader(limit=CHUNK, loop=self._loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=self._loop)
        timeout = HANDSHAKE_S if self._server_tls is not None else None
        transport, _ = await asyncio.wait_for(self._loop.connect_accepted_socket(
            lambda: protocol, connection, ssl=self._server_tls, ssl_handshake_timeout=timeout), HANDSHAKE_S + 1)
        return reader, asyncio.StreamWriter(transport, protocol, reader, self._loop)

    async def _admit(self, connection: socket.socket, who: object) -> None:
        """One connection to the inbound relay: handed to the library once it proved to be the peer."""
        if self._pending >= MAX_PENDING:
            connection.close()
            self._refused(who, f"{MAX_PENDING} connections are already in their handshake")
            return
        self._pending += 1
        try:
            reader, writer = await self._accepted(connection)
        except (TimeoutError, OSError, EOFError, ValueError) as exc:  # the transport, if any, is closed
            connection.close()
            self._refused(who, str(exc) or type(exc).__name__)
            return
        finally:
            self._pending -= 1
        self._track_connection(writer)
        try:
            await self._hand_over(reader, writer, who)
        finally:
            self._writers.discard(writer)

    async def _hand_over(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, who: object) -> None:
        """An accepted connection: to the library if it is the peer's, closed otherwise."""
        if self._check is not None:
            tls = writer.get_extra_info("ssl_object")
            try:
                self._check.check(tls.getpeercert(binary_form=True) if tls is not None else None,
                                  "the client's certificate")
            except (PartyBoundaryError, ValueError) as exc:
                _abort(writer)
                self._refused(who, str(exc))
                return
        # The peer's relay checks that this one listens by connecting and closing: nothing for the library.
        try:
            first = await asyncio.wait_for(reader.read(CHUNK), self.wait_s)
        except (TimeoutError, OSError):
            first = b""
        if not first:
            logger.debug("PSI link: %r (the peer) closed before sending anything", who)
            _abort(writer)
            return
        try:
            library_reader, library_writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.library_socket, limit=CHUNK), HANDSHAKE_S)
        except (TimeoutError, OSError) as exc:
            logger.warning("PSI link: the library's side does not answer on its socket (%s); the peer's connection "
                           "is closed", exc)
            _abort(writer)
            return
        self.admitted += 1
        logger.debug("PSI link: party %s's relay hands %r (%s) to the library", self.me, who, self.peer)
        _nodelay(writer)
        library_writer.write(first)
        self.received += len(first)
        await self._pump_both(reader, writer, library_reader, library_writer, towards_library=True)

    def _refused(self, who: object, why: str) -> None:
        # Once per connection; what the other end controls (its address, names in its certificate) escaped.
        logger.warning("party %s's PSI link refused a connection from %r before it reached the library: %r",
                       self.me, who, why)
        self.refused += 1

    async def _serve_outbound(self, host: str, port: int) -> None:
        probe: list[asyncio.StreamWriter] = []
        if not await self._until(lambda: self._peer_listens(host, port, probe)):
            self._checked.set()
            logger.warning("PSI link: %s's relay at %s:%s did not listen within %.0f s", self.peer, host, port,
                           self.wait_s)
            return
        self._outbound.setblocking(False)
        server = await asyncio.start_unix_server(lambda r, w: self._forward(r, w, host, port),
                                                 sock=self._outbound, limit=CHUNK)
        self._servers.append(server)
        logger.debug("PSI link: party %s's relay to %s at %s:%s listens", self.me, self.peer, host, port)
        # The peer's certificate is read on the probe's connection once this relay listens, not before: the
        # library, which dials at once, is refused for as long as this relay does not listen, and a refused link
        # waits 3 s before it dials again. What the library sends is forwarded only once each connection of its
        # own was checked.
        await self._check_probe(probe[0], host, port, server)
        self._checked.set()

    async def _peer_listens(self, host: str, port: int, probe: list[asyncio.StreamWriter]) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), HANDSHAKE_S)
        except (TimeoutError, OSError):
            return False
        probe.append(writer)
        return True

    async def _check_probe(self, writer: asyncio.StreamWriter, host: str, port: int,
                           server: asyncio.AbstractServer) -> None:
        """Read the certificate of the peer's relay on the probe's connection; one that is not the peer's closes
        this relay (:attr:`failure` says why)."""
        self._track_connection(writer)
        try:
            if self._client_tls is not None and self._check is not None:
                await asyncio.wait_for(writer.start_tls(self._client_tls, server_hostname=self.peer,
                                                        ssl_handshake_timeout=HANDSHAKE_S), HANDSHAKE_S + 1)
                tls = writer.get_extra_info("ssl_object")
                self._check.check(tls.getpeercert(binary_form=True) if tls is not None else None,
                                  f"the certificate of the server at {host}:{port}")
        except (PartyBoundaryError, ssl.SSLCertVerificationError, ValueError) as exc:
            self.failure = (f"the PSI link of party {self.me!r} refuses the server at {host}:{port} as "
                            f"{self.peer!r}: {exc}")
            logger.error("%s", self.failure)
            server.close()
        except (TimeoutError, OSError) as exc:  # each connection of the library's is checked all the same
            logger.debug("PSI link: the probe of %s's relay ended early (%s)", self.peer, exc)
        # Closed in order (under TLS, after its close_notify), so that the peer's relay sees a finished handshake
        # and an end, not a reset in the middle of it.
        await _end(writer)
        self._writers.discard(writer)

    async def _open_peer(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the peer's relay, TLS verified as the peer's (fail closed: PartyBoundaryError)."""
        if self._client_tls is None:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=CHUNK), HANDSHAKE_S)
        else:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                host, port, ssl=self._client_tls, server_hostname=self.peer, ssl_handshake_timeout=HANDSHAKE_S,
                limit=CHUNK), HANDSHAKE_S + 1)
            assert self._check is not None
            tls = writer.get_extra_info("ssl_object")
            try:
                self._check.check(tls.getpeercert(binary_form=True) if tls is not None else None,
                                  f"the certificate of the server at {host}:{port}")
            except (PartyBoundaryError, ValueError):
                _abort(writer)
                raise
        _nodelay(writer)
        return reader, writer

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                       port: int) -> None:
        """One connection the library made to its peer: carried to the peer's relay, once it proved to be it."""
        self._track_connection(writer)
        try:
            peer_reader, peer_writer = await self._open_peer(host, port)
        except (TimeoutError, OSError, PartyBoundaryError, ValueError) as exc:
            # The library dials again at once, and again: the first failure is worth a warning, the rest not.
            level = logging.WARNING if not self._forward_failed else logging.DEBUG
            self._forward_failed = True
            logger.log(level, "PSI link: party %s's link to %s at %s:%s is closed, nothing forwarded: %r", self.me,
                       self.peer, host, port, str(exc) or type(exc).__name__)
            _abort(writer)
            self._writers.discard(writer)
            return
        logger.debug("PSI link: party %s's library reaches %s", self.me, self.peer)
        await self._pump_both(reader, writer, peer_reader, peer_writer, towards_library=False)

    def _track_connection(self, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._track(task)
        self._writers.add(writer)

    async def _pump_both(self, near_reader: asyncio.StreamReader, near_writer: asyncio.StreamWriter,
                         far_reader: asyncio.StreamReader, far_writer: asyncio.StreamWriter, *,
                         towards_library: bool) -> None:
        """Carry bytes both ways between the two ends until either ends; then both end, as the link's own ends
        do. ``near``: the end that connected to this relay."""
        self._writers.add(far_writer)

        def to_far(n: int) -> None:
            if towards_library:
                self.received += n
            else:
                self.sent += n

        def to_near(n: int) -> None:
            if towards_library:
                self.sent += n
            else:
                self.received += n

        pumps = [asyncio.ensure_future(self._pump(near_reader, far_writer, to_far)),
                 asyncio.ensure_future(self._pump(far_reader, near_writer, to_near))]
        try:
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            # One end closed: what the other had sent already (its last message, often a goodbye) is still carried
            # and counted before both end, for a moment at most.
            if pending:
                await asyncio.wait(pending, timeout=TRAILING_S)
        finally:
            for pump in pumps:
                pump.cancel()
            # What either end was sent last still goes out before the connection closes.
            await _end(near_writer, far_writer)
            self._writers.difference_update((near_writer, far_writer))

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: Callable[[int], None]) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while chunk := await reader.read(CHUNK):
                writer.write(chunk)
                count(len(chunk))
                await writer.drain()
