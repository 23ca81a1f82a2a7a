"""Names that belong to one party: the CA's roster refuses a certificate that names another party on it, signed yet
or not, and a revoked key coming back; a client sends nothing to a party whose certificate it could not read and
check on the very connection it uses (an attacker review: the lab's certificate carrying "hospital", and a lab
that drops the client's first connection, got the hospital's svd.right)."""

from __future__ import annotations

import datetime as dt
import json
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from vflo.cli import main
from vflo.comm.grpc_transport import GrpcTransport, PartyServer
from vflo.comm.message import Message
from vflo.comm.pki import ROSTER_FILE, add_to_roster, create_ca, make_request, read_roster, revoke, sign_request
from vflo.comm.tls import PartyCredentials, init_certs, issue
from vflo.comm.transport import Transport
from vflo.errors import ConfigError, ProtocolError, TransportError

# --- the CA's roster --------------------------------------------------------------------------------------------


def _request(folder: Path, common_name: str, dns: list[str]) -> Path:
    """A certificate request as an attacker's own tool would write it: any names, no client-side check."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
           # Raw names, as a tool that skips cryptography's A-label check writes them (full-width letters included).
           .add_extension(x509.SubjectAlternativeName([x509.DNSName._init_without_validation(n) for n in dns]),
                          critical=False)
           .sign(key, hashes.SHA256()))
    path = folder / f"{common_name}-{len(list(folder.iterdir()))}.csr"
    path.write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    return path


# "xn--hospital-" is the IDNA A-label of "hospital"; the last is "hospital" in full-width letters.
@pytest.mark.parametrize("name", ["hospital", "Hospital", "hospital.", "HOSPITAL.", "xn--hospital-",
                                  "\uff48\uff4f\uff53\uff50\uff49\uff54\uff41\uff4c"])
def test_the_ca_refuses_a_name_of_a_party_it_has_not_signed_yet(tmp_path: Path, name: str) -> None:
    """The reviewer's request: the lab's, carrying "hospital" (in some spelling) before the hospital was signed."""
    ca = tmp_path / "ca"
    create_ca(ca, ["hospital", "lab"])
    csr = _request(tmp_path / "lab", "lab", ["lab", name])
    with pytest.raises(ConfigError, match=r"names .*which is the party 'hospital'.*could pass as 'hospital' \(signed "
                                          r"yet or not\)"):
        sign_request(ca, csr)
    assert not (tmp_path / "lab" / "lab.pem").exists()
    # A common name that is another party's is refused as well, whoever it claims to be.
    with pytest.raises(ConfigError, match="which is the party 'hospital'"):
        sign_request(ca, _request(tmp_path / "lab", "lab", [name]))
    # A clean request for the same party is signed.
    sign_request(ca, _request(tmp_path / "lab", "lab", ["lab", "lab.example.org"]))


def test_a_party_off_the_roster_is_added_explicitly_and_a_wildcard_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = tmp_path / "ca"
    assert main(["certs", "ca", str(ca), "--parties", "hospital,lab"]) == 0
    assert stat.S_IMODE((ca / ROSTER_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((ca / "issued.json").stat().st_mode) == 0o600
    assert read_roster(ca) == ["hospital", "lab"]
    _, shop = make_request(tmp_path / "shop", "shop")
    assert main(["certs", "sign", str(ca), str(shop)]) == 2
    assert f"vflo certs roster {ca} --add shop" in capsys.readouterr().err
    assert main(["certs", "roster", str(ca), "--add", "shop"]) == 0
    assert "hospital, lab, shop" in capsys.readouterr().out
    assert main(["certs", "sign", str(ca), str(shop)]) == 0
    # A name on the roster in another spelling cannot be added as a new party.
    with pytest.raises(ConfigError, match="lower case"):
        add_to_roster(ca, ["Lab"])
    with pytest.raises(ConfigError, match="wildcard"):
        sign_request(ca, _request(tmp_path / "lab", "lab", ["lab", "*"]))
    with pytest.raises(ConfigError, match="--parties"):
        create_ca(tmp_path / "empty", [])


def test_a_ca_folder_made_before_the_roster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An older CA folder has no roster: signing is refused until one is written, and writing it names the
    certificates already signed that carry another party's name (revoke them)."""
    ca = tmp_path / "ca"
    create_ca(ca, ["hospital", "lab"])
    bad = _request(tmp_path / "lab", "lab", ["lab", "shop"])
    sign_request(ca, bad)  # "shop" was no party when this was signed
    serial = json.loads((ca / "issued.json").read_text())[0]["serial"]
    (ca / ROSTER_FILE).unlink()
    _, hospital = make_request(tmp_path / "hospital", "hospital")
    with pytest.raises(ConfigError, match=r"made before vflo kept a roster.*vflo certs roster .* --add NAME,\.\.\..*"
                                          r"\['lab'\]"):
        sign_request(ca, hospital)
    assert main(["certs", "roster", str(ca), "--add", "hospital,shop"]) == 0
    captured = capsys.readouterr()
    assert "hospital, lab, shop" in captured.out
    assert "names 'shop', which is the party 'shop' on the roster" in captured.err
    assert f"vflo certs revoke {ca} lab --serial {serial}" in captured.err
    sign_request(ca, hospital)


def test_a_revoked_key_does_not_come_back(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    create_ca(ca, ["hospital", "lab"])
    _, csr = make_request(tmp_path / "lab", "lab")
    sign_request(ca, csr)
    revoke(ca, "lab")
    with pytest.raises(ConfigError, match=r"a key the CA revoked .*Make a new key .*vflo certs request"):
        sign_request(ca, csr)
    # One key is one party's.
    _, hospital = make_request(tmp_path / "hospital", "hospital")
    sign_request(ca, hospital)
    key = serialization.load_pem_private_key((tmp_path / "hospital" / "hospital.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    stolen = (x509.CertificateSigningRequestBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lab")]))
              .sign(key, hashes.SHA256()))
    (tmp_path / "stolen.csr").write_bytes(stolen.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ConfigError, match="one key belongs to one party"):
        sign_request(ca, tmp_path / "stolen.csr")
    # A new key for the lab is signed.
    _, fresh = make_request(tmp_path / "lab2", "lab")
    sign_request(ca, fresh)


def test_certs_init_writes_the_roster(tmp_path: Path) -> None:
    init_certs(tmp_path / "demo", ["hospital", "lab"], split=True)
    assert read_roster(tmp_path / "demo" / "ca") == ["hospital", "lab"]
    assert stat.S_IMODE((tmp_path / "demo" / "ca" / ROSTER_FILE).stat().st_mode) == 0o600


# --- a client sends nothing to a party it has not checked ---------------------------------------------------------


class Recorder:
    """A party that keeps every message it is handed (none must reach it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[Message] = []

    def handle(self, message: Message) -> Message:
        self.seen.append(message)
        return message.error_reply(ProtocolError("the lab got a message meant for another party"))

    def attach(self, transport: Transport) -> None:
        pass


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(1 << 16):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextmanager
def _proxy(route: Callable[[int], str | None]) -> Iterator[tuple[str, list[int]]]:
    """A TCP server on 127.0.0.1 that sends its n-th connection (from 0) where ``route(n)`` says (HOST:PORT), or
    closes it at once (None): a peer that drops the first connection, or shows a probe another party."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    accepted: list[int] = []
    open_sockets: list[socket.socket] = []

    def serve() -> None:
        n = 0
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(n)
            target = route(n)
            n += 1
            if target is None:
                conn.close()
                continue
            host, _, port = target.rpartition(":")
            upstream = socket.create_connection((host, int(port)), timeout=5)
            upstream.settimeout(None)
            conn.settimeout(None)
            open_sockets.extend((conn, upstream))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for s in open_sockets:
            s.close()


@pytest.fixture()
def federation(tmp_path: Path) -> Iterator[tuple[Path, Recorder, PartyServer, PartyServer]]:
    """Certificates for act (the coordinator), the hospital and the lab; the lab's own carries the extra name
    "hospital" (signed before the CA kept a roster). The lab's real server records what reaches it."""
    certs = tmp_path / "certs"
    init_certs(certs, ["act", "hospital", "lab"])
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "ca.pem").write_bytes((certs / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    now = dt.datetime.now(dt.UTC)
    issue(evil, "lab", ca_key, ca_cert, not_before=now - dt.timedelta(minutes=5), not_after=now + dt.timedelta(days=1),
          hosts=["hospital"])
    recorder = Recorder("lab")
    lab = PartyServer(recorder, address="127.0.0.1:0", credentials=PartyCredentials.load(evil, "lab"),
                      allowed={"act"}).start()
    hospital = PartyServer(Recorder("hospital"), address="127.0.0.1:0",
                           credentials=PartyCredentials.load(certs, "hospital"), allowed={"act"}).start()
    try:
        yield certs, recorder, lab, hospital
    finally:
        lab.stop()
        hospital.stop()


def _svd_right(client: GrpcTransport) -> Message:
    return client.request(Message("act", "hospital", "svd.right", 1, {"v": np.arange(6.0).reshape(2, 3)}))


def test_a_peer_that_drops_the_first_connection_gets_nothing(
        federation: tuple[Path, Recorder, PartyServer, PartyServer]) -> None:
    """The reviewer's finding: the lab at the hospital's address drops the client's first connection (its
    certificate probe), then serves its certificate that also names "hospital". The message never reaches it."""
    certs, recorder, lab, _ = federation
    with _proxy(lambda n: None if n == 0 else lab.address) as (address, accepted):
        client = GrpcTransport("act", {"hospital": address}, credentials=PartyCredentials.load(certs, "act"),
                               deadline=5, retries=3, backoff=0.05)
        try:
            with pytest.raises(TransportError, match=r"party 'hospital' at .* is refused: its certificate names "
                                                     r"'hospital', which is the party 'hospital', but it is the "
                                                     r"certificate of 'lab'.*\(nothing was sent to it\)"):
                _svd_right(client)
        finally:
            client.close()
    assert recorder.seen == []
    assert len(accepted) >= 2  # the dropped connection, then the probe that read the lab's certificate


def test_a_peer_whose_certificate_cannot_be_read_is_sent_nothing(
        federation: tuple[Path, Recorder, PartyServer, PartyServer]) -> None:
    certs, recorder, _, _ = federation
    with _proxy(lambda n: None) as (address, accepted):
        client = GrpcTransport("act", {"hospital": address}, credentials=PartyCredentials.load(certs, "act"),
                               deadline=5, retries=2, backoff=0.05)
        try:
            with pytest.raises(TransportError, match=r"could not be reached for 'svd.right': its certificate could "
                                                     r"not be read, so nothing was sent: .*closed during the TLS "
                                                     r"handshake"):
                _svd_right(client)
        finally:
            client.close()
    assert len(accepted) == 3  # the probe, tried again within the deadline; never a gRPC connection
    assert recorder.seen == []


def test_a_peer_that_shows_the_probe_another_certificate_gets_nothing(
        federation: tuple[Path, Recorder, PartyServer, PartyServer]) -> None:
    """The probe reaches the real hospital, every later connection the lab: the channel trusts only the certificate
    the probe checked, so gRPC's connection to the lab fails its handshake and nothing is sent there."""
    certs, recorder, lab, hospital = federation
    with _proxy(lambda n: hospital.address if n == 0 else lab.address) as (address, _):
        client = GrpcTransport("act", {"hospital": address}, credentials=PartyCredentials.load(certs, "act"),
                               deadline=5, retries=2, backoff=0.05)
        try:
            with pytest.raises(TransportError):
                _svd_right(client)
        finally:
            client.close()
    assert recorder.seen == []
    # And straight to the real hospital the same client code delivers.
    client = GrpcTransport("act", {"hospital": hospital.address}, credentials=PartyCredentials.load(certs, "act"),
                           deadline=5, retries=0)
    try:
        assert "another party" in str(_svd_right(client).error)
    finally:
        client.close()
