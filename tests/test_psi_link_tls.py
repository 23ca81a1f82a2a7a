"""The PSI library's link behind vflo's relays: only the expected peer, over mutual TLS with the federation's CA,
reaches the library; a stranger's connection is closed before a byte of it does, and the run goes on."""

from __future__ import annotations

import contextlib
import socket
import ssl
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vflo.align import spu
from vflo.align.link_relay import LinkRelays, LinkTLS
from vflo.align.linked import closing
from vflo.comm.pki import create_ca, make_request, revoke, sign_request

needs_library = pytest.mark.skipif(bool(spu.missing()), reason=spu.missing() or "installed")

NAMES = ("act", "pas", "eve")
BODY = b'{"sender_rank": 1, "key": "root-0", "value": "AAAA"}'
PUSH = (b"POST /ReceiverService/Push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, LinkTLS]:
    """Every party's files from the federation's CA, and ``foreign``: a certificate for 'pas' from another CA."""
    found = {}
    for ca, parties, prefix in (("ca", NAMES, ""), ("other-ca", ("pas",), "foreign-")):
        create_ca(tmp_path / ca, list(parties))
        for party in parties:
            key, csr = make_request(tmp_path / f"{prefix}{party}", party, hosts=["127.0.0.1"])
            sign_request(tmp_path / ca, csr)
            found[prefix + party] = LinkTLS(str(tmp_path / f"{prefix}{party}" / f"{party}.pem"), str(key),
                                            str(tmp_path / ca / "ca.pem"))
    return found


class Listener:
    """A server socket (already listening) served in a thread of its own: each connection it accepts is handed to
    :meth:`handle`, until :meth:`close`."""

    def __init__(self, server: socket.socket) -> None:
        self._server = server
        self._server.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._server.close()


class FakeLibrary(Listener):
    """A stand-in for the library's listener on its Unix socket: every byte that reaches it, echoed back."""

    def __init__(self, path: str) -> None:
        self.received = bytearray()
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        server.listen()
        super().__init__(server)

    def handle(self, conn: socket.socket) -> None:
        threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(1 << 16):
                self.received += data
                conn.sendall(data)


@contextlib.contextmanager
def relay_before_library(tls: LinkTLS | None, *, me: str = "act", peer: str = "pas") -> Iterator[
        tuple[LinkRelays, FakeLibrary]]:
    with tempfile.TemporaryDirectory(prefix="vflo-psi-") as folder:
        relays = LinkRelays(Path(folder), listen=("127.0.0.1", 0), me=me, peer=peer, tls=tls, parties=NAMES)
        library = FakeLibrary(relays.library_socket)
        try:
            _wait_listening(relays.port)
            deadline = time.monotonic() + 10
            while relays.refused < 1:  # that probe, without a handshake, is refused too
                assert time.monotonic() < deadline
                time.sleep(0.01)
            relays.refused = 0
            yield relays, library
        finally:
            relays.close()
            library.close()


def _wait_listening(port: int) -> None:
    """Until a TCP connection to ``port`` is taken (that one is closed at once, without a byte)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the relay never listened"
            time.sleep(0.01)


def plain_push(port: int) -> bytes:
    """What a client without TLS gets back for an HTTP push into the link (as brpc answered it: 200)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        return _send_and_read(client)


def tls_push(port: int, client: LinkTLS | None) -> bytes:
    """What a TLS client (with ``client``'s certificate, or none) gets back for a push into the link."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # a stranger takes any server
    if client is not None:
        context.load_cert_chain(client.certificate, client.key)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                context.wrap_socket(raw) as channel:
            return _send_and_read(channel)
    except OSError:  # the handshake refused (ssl.SSLError is an OSError)
        return b""


def _send_and_read(channel: socket.socket) -> bytes:
    got = b""
    with contextlib.suppress(OSError):
        channel.sendall(PUSH)
        while len(got) < 1 << 16 and (data := channel.recv(1 << 16)):
            got += data
    return got


def test_a_stranger_is_refused_before_a_byte_reaches_the_library_and_the_peer_still_gets_through(
        certs: dict[str, LinkTLS], caplog: pytest.LogCaptureFixture) -> None:
    with relay_before_library(certs["act"]) as (relays, library), caplog.at_level("WARNING"):
        caplog.clear()
        answers = {
            "plain text (brpc answered 200)": plain_push(relays.port),
            "TLS without a certificate": tls_push(relays.port, None),
            "a certificate of another CA": tls_push(relays.port, certs["foreign-pas"]),
            "the federation's certificate of another party": tls_push(relays.port, certs["eve"]),
        }
        assert answers == dict.fromkeys(answers, b"")  # no answer at all, let alone brpc's
        assert library.received == b"" and (relays.admitted, relays.received, relays.sent) == (0, 0, 0)
        refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
        assert len(refusals) == relays.refused == 4  # once per connection
        assert "names ['eve'], not the party 'pas'" in refusals[-1]
        # The expected peer, after all of them, reaches the library.
        assert tls_push(relays.port, certs["pas"]) == PUSH
        assert library.received == PUSH and (relays.admitted, relays.received, relays.sent) == (1, len(PUSH),
                                                                                               len(PUSH))


def test_the_peers_certificate_once_revoked_is_refused(certs: dict[str, LinkTLS], tmp_path: Path) -> None:
    with relay_before_library(certs["act"]) as (relays, library):
        assert tls_push(relays.port, certs["pas"]) == PUSH
        revoke(tmp_path / "ca", "pas")  # the CA's new crl.pem, where each party keeps it: beside its ca.pem
        assert tls_push(relays.port, certs["pas"]) == b""
        assert library.received == PUSH and relays.refused == 1


def test_the_outbound_relay_forwards_nothing_to_a_server_that_is_not_the_peer(
        certs: dict[str, LinkTLS], caplog: pytest.LogCaptureFixture) -> None:
    for server_tls, why in ((certs["eve"], "names ['eve'], not the party 'pas'"),
                            (certs["foreign-pas"], "certificate verify failed")):
        with TLSServer(server_tls) as server, tempfile.TemporaryDirectory(prefix="vflo-psi-") as folder, \
                LinkRelays(Path(folder), listen=("127.0.0.1", 0), me="act", peer="pas", tls=certs["act"],
                           parties=NAMES) as relays:
            relays.connect("127.0.0.1", server.port)
            assert not relays.wait_listening(20)
            assert why in relays.failure
            with socket.socket(socket.AF_UNIX) as library, pytest.raises(ConnectionRefusedError):
                library.connect(relays.dial_socket)  # the library's way out stays shut
        assert server.received == b""


class TLSServer(Listener):
    """A TLS server with ``tls``'s certificate that records what it is sent."""

    def __init__(self, tls: LinkTLS) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(tls.certificate, tls.key)
        self.received = b""
        server = socket.create_server(("127.0.0.1", 0))
        self.port = server.getsockname()[1]
        super().__init__(server)

    def handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        with contextlib.suppress(OSError), self.context.wrap_socket(conn, server_side=True) as channel:
            while data := channel.recv(1 << 16):
                self.received += data

    def __enter__(self) -> TLSServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _listening_tcp_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), Path(table).open() as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
    return inodes


def _sockets_of(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = str(fd.readlink())
            if target.startswith("socket:["):
                found.add(target[len("socket:["):-1])
    return found


class Stranger:
    """Pushes into the given ports, in every way a stranger can, until stopped (at most ``limit_s``)."""

    def __init__(self, ports: list[int], certs: dict[str, LinkTLS], limit_s: float = 120.0) -> None:
        self.tries = 0
        self.answers: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ports, certs, time.monotonic() + limit_s),
                                        daemon=True)
        self._thread.start()

    def _run(self, ports: list[int], certs: dict[str, LinkTLS], deadline: float) -> None:
        while not self._stop.is_set() and time.monotonic() < deadline:
            for port in ports:
                for push in (plain_push, lambda p: tls_push(p, None),
                             lambda p: tls_push(p, certs["foreign-pas"]), lambda p: tls_push(p, certs["eve"])):
                    with contextlib.suppress(OSError):
                        if answer := push(port):
                            self.answers.append(answer)
                        self.tries += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@needs_library
@pytest.mark.parametrize("protocol", ["rr22", "ecdh"])
def test_a_stranger_hammering_both_links_does_not_stop_the_run_and_the_library_listens_on_no_port(
        protocol: str, certs: dict[str, LinkTLS], monkeypatch: pytest.MonkeyPatch) -> None:
    children: list[Any] = []
    start = spu.start_child
    monkeypatch.setattr(spu, "start_child", lambda *a: children.append(start(*a)) or children[-1])
    mine_ids, theirs_ids = spu.prepare(np.arange(100, 400)), spu.prepare(np.arange(0, 300))
    for prepared in (mine_ids, theirs_ids):  # only this user may reach the library's sockets
        assert stat.S_IMODE(prepared.folder.stat().st_mode) == 0o700
    with LinkRelays(mine_ids.folder, listen=("127.0.0.1", 0), me="act", peer="pas", tls=certs["act"],
                    parties=NAMES) as inbound:
        outbound = LinkRelays(theirs_ids.folder, listen=("127.0.0.1", 0), me="pas", peer="act", tls=certs["pas"],
                              parties=NAMES)
        outbound.connect("127.0.0.1", inbound.port)
        partner = spu.Side(rank=1, own=outbound.own, peer=outbound.to_peer, protocol=protocol, broadcast=True,
                           timeout_s=60)
        running = spu.Running(closing(outbound, lambda: partner.run(theirs_ids)))
        stranger = Stranger([inbound.port, outbound.port], certs)
        try:
            _wait_listening(outbound.port)  # the partner's library listens (on its socket)
            assert Path(outbound.library_socket).is_socket()
            listening = _listening_tcp_inodes()
            assert all(not _sockets_of(child.pid) & listening for child in children if child.poll() is None)
            inbound.connect("127.0.0.1", outbound.port)
            assert inbound.wait_listening(30)
            active = spu.Side(rank=0, own=inbound.own, peer=inbound.to_peer, protocol=protocol, broadcast=True,
                              timeout_s=60)
            mine = active.run(mine_ids)
            theirs = running.join(90)
        finally:
            stranger.stop()
    assert mine.sum() == theirs.sum() == 200 and mine[:200].all() and theirs[100:].all()
    assert stranger.tries > 0 and stranger.answers == []
    assert inbound.refused + outbound.refused > 0 and inbound.admitted > 0 and outbound.admitted > 0
