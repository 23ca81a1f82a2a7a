"""Names that cannot be borrowed, and exports that keep keys apart.

A party's name and every name in a certificate are compared in one normal form (``vflo.roles.normal_name``:
case-folded, NFKC, trailing dot stripped), so "Hospital", "hospital." and full-width look-alikes are the party
"hospital": no certificate may be issued with such a name for another party, and one issued anyway (here with
``issue``, as an attacker who bypassed ``init_certs`` would have it) is refused by the server it speaks to and
by the client that dials it. An export gives each party a folder with its own key and the CA certificate only.
"""

from __future__ import annotations

import datetime as dt
import re
import socket
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.test_cli import TINY
from vflo.cli import main
from vflo.comm.grpc_transport import GrpcTransport, PartyServer
from vflo.comm.message import Message
from vflo.comm.tls import PartyCredentials, init_certs, issue
from vflo.deploy import (
    Deployment,
    PartyConfig,
    PeerEntry,
    TLSConfig,
    credentials_for,
    load_deploy_config,
    load_party_config,
    start_party,
)
from vflo.deploy.export import ca_folder
from vflo.errors import ConfigError, RemoteError, TransportError
from vflo.methods.registry import get_method
from vflo.roles import check_party_name, normal_name

FULL_WIDTH = "\uff48\uff4f\uff53\uff50\uff49\uff54\uff41\uff4c"  # "hospital" in full-width letters
SPELLINGS = ["Hospital", "hospital.", "HOSPITAL.", FULL_WIDTH, "xn--hospital-"]  # the last: an A-label of it


def test_one_normal_form_for_every_name() -> None:
    for spelling in [*SPELLINGS, "hospital", "hospital\u3002", "ho\u017fpital"]:  # ideographic full stop, long s
        assert normal_name(spelling) == "hospital", spelling
    assert normal_name("lab-2_a") == "lab-2_a"
    assert normal_name("bank.example.org.") == "bank.example.org"


# --- A: names cannot be borrowed at issue time ---------------------------------------------------------------

@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_san_spelling_another_partys_name_is_refused(tmp_path: Path, spelling: str) -> None:
    with pytest.raises(ConfigError, match=r"--san lab=.*name the party 'hospital' \(.*ignoring case.*\); give host "
                                          "names or addresses that are not party names"):
        init_certs(tmp_path, ["hospital", "lab"], san={"lab": ["lab.example.org", spelling]})
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("spelling", ["Hospital", "hospital."])
def test_the_cli_refuses_a_borrowed_san_and_says_how_to_fix_it(tmp_path: Path, spelling: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["certs", "init", str(tmp_path / "certs"), "--parties", "hospital,lab", "--san", f"lab={spelling}"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--san lab={spelling}: this would let 'lab''s certificate name the party 'hospital'" in err
    assert "give host names or addresses that are not party names" in err
    assert not (tmp_path / "certs").exists()


def test_a_partys_own_name_as_a_san_is_refused_as_redundant(tmp_path: Path) -> None:
    for spelling in ("lab", "LAB", "lab."):
        with pytest.raises(ConfigError, match=r"'lab''s certificate names 'lab' already.*leave it out"):
            init_certs(tmp_path, ["hospital", "lab"], san={"lab": [spelling]})
    with pytest.raises(ConfigError, match="must be ASCII; write an internationalised name as its A-label"):
        init_certs(tmp_path, ["hospital", "lab"], san={"lab": ["l\u00e4b.example.org"]})
    # host names and addresses that are not party names still go in
    init_certs(tmp_path, ["hospital", "lab"], san={"lab": ["lab.example.org", "hospital-gw.example.org", "10.0.0.5"]})


def test_two_parties_whose_names_normalise_alike_are_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"party 'Lab' and 'lab' are one name \(ignoring case.*\): give every party "
                                          "a name of its own"):
        init_certs(tmp_path, ["Lab", "lab"])
    with pytest.raises(ConfigError, match="party 'lab' is named twice"):
        init_certs(tmp_path, ["lab", "hospital", "lab"])
    assert main(["certs", "init", str(tmp_path / "c"), "--parties", "hospital,lab,Lab"]) == 2
    assert "party 'lab' and 'Lab' are one name" in capsys.readouterr().err
    # A party name is written in its normal form, so no config can hold two spellings of one party either.
    with pytest.raises(ConfigError, match=r"party name 'Lab' must be written in lower case, as 'lab'"):
        check_party_name("Lab")
    with pytest.raises(ConfigError, match=r"party name 'Lab' must be written in lower case"):
        PartyConfig(name="lab", tls=TLSConfig(insecure=True),
                    peers={"Lab": PeerEntry(address="x", role="active")})
    with pytest.raises(ConfigError, match="host name every machine answers to"):
        check_party_name("LocalHost")


# --- A: a borrowed name is refused at the handshake, on both sides ----------------------------------------------

class Recorder:
    """A party's node that answers every message and remembers it: what an attacker would have got."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handled: list[Message] = []

    def handle(self, message: Message) -> Message:
        self.handled.append(message)
        return Message(sender=self.name, receiver=message.sender, kind=message.kind, round=message.round)


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("federation")
    init_certs(directory, ["hospital", "lab", "dealer"])
    return directory


def _forged(federation: Path, folder: Path, common_name: str, hosts: list[str]) -> PartyCredentials:
    """A certificate the federation's CA signed for ``common_name`` with DNS names ``hosts``: what someone who
    bypassed ``init_certs`` (or an older vflo) could hold."""
    ca_key = serialization.load_pem_private_key((federation / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate((federation / "ca.pem").read_bytes())
    now = dt.datetime.now(dt.UTC)
    folder.mkdir(parents=True, exist_ok=True)
    if common_name.isascii():
        issue(folder, common_name, ca_key, ca, not_before=now - dt.timedelta(minutes=5),
              not_after=now + dt.timedelta(days=1), hosts=hosts)
        pem, key_pem = (folder / f"{common_name}.pem").read_bytes(), (folder / f"{common_name}.key").read_bytes()
    else:  # a DNS name must be ASCII, a common name need not: build it by hand
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    return PartyCredentials(party=common_name, ca=(federation / "ca.pem").read_bytes(), certificate=pem, key=key_pem)


# (common name, DNS names, the name the lab then claims, the name the refusal quotes)
BORROWED = [
    ("lab", ["lab", "Hospital"], "lab", "Hospital"),
    ("lab", ["lab", "hospital."], "lab", "hospital."),
    ("lab", ["lab", "hospital"], "lab", "hospital"),  # exactly another party's name: never issued either
    ("Hospital", ["Hospital"], "hospital", "Hospital"),
    ("hospital.", ["hospital."], "hospital", "hospital."),
    (FULL_WIDTH, ["xn--hospital-"], "hospital", FULL_WIDTH),
]


@pytest.mark.parametrize(("common_name", "hosts", "claims", "quoted"), BORROWED)
def test_a_server_refuses_a_client_whose_certificate_borrows_a_name(
    federation: Path, tmp_path: Path, common_name: str, hosts: list[str], claims: str, quoted: str,
) -> None:
    dealer = Recorder("dealer")
    server = PartyServer(dealer, address="127.0.0.1:0", credentials=PartyCredentials.load(federation, "dealer"),
                         allowed={"hospital", "lab"}).start()
    try:
        attacker = GrpcTransport(claims, {"dealer": server.address},
                                 credentials=_forged(federation, tmp_path, common_name, hosts), deadline=5, retries=0)
        # A certificate whose own name is no peer's is refused before its message is read; one whose own name is a
        # peer's but that also names another party in another spelling, when that name is checked.
        borrowed = (rf"the client's certificate names '{re.escape(quoted)}', which is the party 'hospital'.*a "
                    "certificate may name only its own party")
        stranger = rf"does not accept messages from '{re.escape(common_name)}': not a configured peer \(refused before"
        with pytest.raises(RemoteError, match=f"{borrowed}|{stranger}"):
            attacker.request(Message(claims, "dealer", "control.teardown", 0)).unwrap()
        attacker.close()
        assert dealer.handled == []
        honest = GrpcTransport("lab", {"dealer": server.address}, credentials=PartyCredentials.load(federation, "lab"),
                               deadline=5, retries=0)
        assert honest.request(Message("lab", "dealer", "control.teardown", 0)).error is None
        honest.close()
        assert [m.sender for m in dealer.handled] == ["lab"]
    finally:
        server.stop()


@pytest.mark.parametrize(("common_name", "hosts", "claims", "quoted"), BORROWED)
def test_a_client_refuses_a_server_whose_certificate_borrows_the_name_it_dialled(
    federation: Path, tmp_path: Path, common_name: str, hosts: list[str], claims: str, quoted: str,
) -> None:
    """The lab listens where the dealer reaches "hospital", with a certificate gRPC's own (case-insensitive,
    trailing-dot-blind) check would take for hospital's: the dealer sends it nothing."""
    lab = Recorder(claims)
    server = PartyServer(lab, address="127.0.0.1:0", credentials=_forged(federation, tmp_path, common_name, hosts),
                         allowed={"dealer"}).start()
    try:
        dealer = GrpcTransport("dealer", {"hospital": server.address, "lab": "127.0.0.1:1"},
                               credentials=PartyCredentials.load(federation, "dealer"), deadline=5, retries=0)
        with pytest.raises(TransportError, match=rf"party 'hospital' at {server.address} is refused: its certificate "
                                                 rf"names '{quoted}', which is the party 'hospital'"):
            dealer.request(Message("dealer", "hospital", "control.teardown", 0))
        dealer.close()
        assert lab.handled == []
    finally:
        server.stop()


def test_a_client_still_reaches_the_party_it_dialled(federation: Path) -> None:
    hospital = Recorder("hospital")
    server = PartyServer(hospital, address="127.0.0.1:0", credentials=PartyCredentials.load(federation, "hospital"),
                         allowed={"dealer"}).start()
    try:
        dealer = GrpcTransport("dealer", {"hospital": server.address},
                               credentials=PartyCredentials.load(federation, "dealer"), deadline=5, retries=0)
        for _ in range(2):
            assert dealer.request(Message("dealer", "hospital", "control.teardown", 0)).error is None
        dealer.close()
        assert len(hospital.handled) == 2
    finally:
        server.stop()


# --- B: exports and --split keep keys apart ---------------------------------------------------------------------

def _free_base_port(n: int) -> int:
    """A base port with ``n`` free ports after it (checked now; tests on one machine rarely race for them)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n >= 65535:
            continue
        try:
            sockets = [socket.socket() for _ in range(n)]
            for i, sock in enumerate(sockets):
                sock.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no free ports")


def _assert_keys_apart(certs: Path, parties: list[str], ca: Path | None = None) -> None:
    """Each party's folder holds its own key alone; the CA's folder (``certs/ca``, or ``ca`` where an export put it
    outside) holds the CA's."""
    inside = ca is None
    ca = certs / "ca" if ca is None else ca
    # no key outside the folders
    assert sorted(p.name for p in certs.iterdir()) == sorted(["ca", *parties] if inside else parties)
    # (and, where an export wrote it, the record of what the export wrote: .vflo-written)
    assert sorted(p.name for p in ca.iterdir() if p.name != ".vflo-written") == ["README.txt", "ca.key", "ca.pem",
                                                                                 "roster.json"]
    readme = (ca / "README.txt").read_text()
    assert "offline" in readme and "never on a party's host" in readme.replace("\n", " ")
    for party in parties:
        folder = certs / party
        assert sorted(p.name for p in folder.iterdir()) == sorted(["ca.pem", f"{party}.pem", f"{party}.key"])
        assert (folder / "ca.pem").read_bytes() == (ca / "ca.pem").read_bytes()
        assert (folder / f"{party}.key").stat().st_mode & 0o077 == 0
        assert folder.stat().st_mode & 0o077 == 0 and ca.stat().st_mode & 0o077 == 0
        PartyCredentials.load(folder, party)
        for other in parties:
            if other != party:
                with pytest.raises(ConfigError, match="are missing"):
                    PartyCredentials.load(folder, other)
    assert sorted(p.relative_to(certs).as_posix() for p in certs.rglob("*.key")) == sorted(
        [*(["ca/ca.key"] if inside else []), *(f"{p}/{p}.key" for p in parties)])


def test_certs_init_split_gives_each_party_only_its_own_key(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    certs = tmp_path / "certs"
    assert main(["certs", "init", str(certs), "--parties", "hospital,lab", "--split"]) == 0
    out = capsys.readouterr().out
    assert "ca/ (ca.pem and ca.key: keep this folder offline" in out and "NAME/ with ca.pem, NAME.pem" in out
    _assert_keys_apart(certs, ["hospital", "lab"])
    assert main(["certs", "init", str(certs), "--parties", "hospital,lab", "--split"]) == 2
    assert "already exists" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no party may be called 'ca'"):
        init_certs(tmp_path / "other", ["ca", "lab"], split=True)
    # without --split, the flat layout of before; --split then refuses to put folders beside its loose keys
    assert main(["certs", "init", str(tmp_path / "flat"), "--parties", "hospital,lab"]) == 0
    assert sorted(p.name for p in (tmp_path / "flat").iterdir()) == [
        "ca.key", "ca.pem", "hospital.key", "hospital.pem", "lab.key", "lab.pem", "roster.json"]
    with pytest.raises(ConfigError, match=r"ca.key \(from a `vflo certs init` without --split\) lies beside"):
        init_certs(tmp_path / "flat", ["hospital", "lab"], split=True, overwrite=True)


def test_an_export_keeps_every_key_apart_and_still_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    parties = ["shop", "bank", "server", "dealer"]
    # an export written before keys were kept apart: the new one refuses to hand its flat keys out with the rest,
    # and deletes nothing it did not write; once they are moved, it writes the keys apart
    init_certs(out / "certs", parties)
    config = tmp_path / "exp.toml"
    config.write_text(TINY)
    base = _free_base_port(len(parties))
    command = ["scenario", str(config), "--export", str(out), "--extra-parties", "server,dealer",
               "--base-port", str(base)]
    assert main(command) == 2
    assert "ca.key lies in" in capsys.readouterr().err and (out / "certs" / "ca.key").is_file()
    assert not (out / "deploy.toml").exists()
    offline = tmp_path / "offline"
    (out / "certs").rename(offline)
    assert main(command) == 0
    capsys.readouterr()
    _assert_keys_apart(out / "certs", parties, ca=ca_folder(out))
    deploy = load_deploy_config(out / "deploy.toml")
    assert Path(deploy.active.tls.dir or "") == out / "certs" / "shop"
    for name in ("bank", "server", "dealer"):
        party = load_party_config(out / f"{name}.toml")
        assert party.tls.dir is not None and Path(party.tls.dir) == out / "certs" / name
        assert credentials_for(name, party.tls) is not None
        assert f'dir = "certs/{name}"' in (out / f"{name}.toml").read_text()

    bank = start_party(load_party_config(out / "bank.toml"))
    deployment = Deployment(deploy)
    try:
        result = deployment.run(get_method("splitnn")(train={"max_epochs": 1, "patience": 0, "batch_size": 32}),
                                seed=1)
        assert len(result.scores) == len(deploy_test_ids(deployment)) and np.isfinite(result.scores).all()
        assert result.ledger.summary().bytes > 0
    finally:
        deployment.close()
        bank.stop()


def deploy_test_ids(deployment: Deployment) -> np.ndarray:
    assert deployment.test is not None
    return deployment.test.ids
