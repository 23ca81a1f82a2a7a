"""Each party makes its own key; an offline CA signs requests, adds a party later, renews and revokes; every
party checks the revocation list, as a server and as a client (issue 30, part 1)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from vflo.cli import main
from vflo.comm.grpc_transport import GrpcTransport, PartyServer
from vflo.comm.message import Message
from vflo.comm.pki import CRL_FILE, Revocations, create_ca, issued, make_request, revoke, sign_request
from vflo.comm.tls import PartyCredentials
from vflo.errors import ConfigError, RemoteError, TransportError
from vflo.federation.simulation import party_node
from vflo.roles import PartyInfo

# The federation's parties, as the CA's roster names them (a party joins later by `vflo certs roster --add`).
ROSTER = ["hospital", "lab", "shop"]


def _party(ca: Path, root: Path, name: str, hosts: list[str] | None = None) -> Path:
    """What a party does on its own host (request), what the CA does (sign): the party's [tls] dir."""
    folder = root / name
    _key, csr = make_request(folder, name, hosts=hosts)
    sign_request(ca, csr)
    return folder


def test_a_party_makes_its_own_key_and_only_public_files_travel(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    written = create_ca(ca, ROSTER)
    assert {p.name for p in written} == {"ca.pem", "ca.key", CRL_FILE, "issued.json", "roster.json", "README.txt"}
    assert stat.S_IMODE((ca / "ca.key").stat().st_mode) == 0o600
    key, csr = make_request(tmp_path / "lab", "lab", hosts=["lab.example.org"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and "PRIVATE" not in csr.read_text()
    back = sign_request(ca, csr)
    assert {p.name for p in back} == {"lab.pem", "ca.pem", CRL_FILE}
    credentials = PartyCredentials.load(tmp_path / "lab", "lab")  # a working [tls] dir
    assert credentials.party == "lab"
    assert [r["party"] for r in issued(ca)] == ["lab"] and issued(ca)[0]["hosts"] == ["lab.example.org"]
    # Nothing is ever replaced: not the CA, not a key.
    with pytest.raises(ConfigError, match="exists already; vflo never replaces"):
        create_ca(ca, ROSTER)
    with pytest.raises(ConfigError, match="exists already"):
        make_request(tmp_path / "lab", "lab")
    assert key.read_bytes() == (tmp_path / "lab" / "lab.key").read_bytes()


def test_the_ca_refuses_names_that_could_pass_as_another_party(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    create_ca(ca, ROSTER)
    _party(ca, tmp_path, "hospital")
    _, borrowed = make_request(tmp_path / "x", "lab", hosts=["hospital-db.example.org"])
    sign_request(ca, borrowed)  # a host name that is no party's: fine
    _, csr = make_request(tmp_path / "y", "shop", hosts=["hospital"])  # the shop's host cannot know, the CA does
    with pytest.raises(ConfigError, match="names 'hospital', which is the party 'hospital'"):
        sign_request(ca, csr)
    with pytest.raises(ConfigError, match="lower case|letters"):
        make_request(tmp_path / "z", "Hospital")
    tampered = tmp_path / "lab" / "lab.csr"
    tampered.parent.mkdir()
    tampered.write_text("not a request")
    with pytest.raises(ConfigError, match="not a certificate request"):
        sign_request(ca, tampered)


def _serve(folder: Path, name: str, peers: set[str]) -> PartyServer:
    node = party_node(PartyInfo(name, "passive"), peers={p: "active" for p in peers})
    return PartyServer(node, address="127.0.0.1:0", credentials=PartyCredentials.load(folder, name),
                       allowed=peers).start()


def _client(folder: Path, name: str, server: PartyServer) -> GrpcTransport:
    return GrpcTransport(name, {"lab": server.address}, credentials=PartyCredentials.load(folder, name), deadline=5,
                         retries=0)


def test_a_party_added_later_and_a_revoked_one(tmp_path: Path) -> None:
    """The lab and the hospital run; the shop joins later with its own key and no other certificate changes;
    the hospital's certificate is revoked and the lab, given the new crl.pem, refuses it at once."""
    ca = tmp_path / "ca"
    create_ca(ca, ROSTER)
    lab, hospital = _party(ca, tmp_path, "lab"), _party(ca, tmp_path, "hospital")
    before = (lab / "lab.pem").read_bytes()
    server = _serve(lab, "lab", {"hospital", "shop"})
    try:
        client = _client(hospital, "hospital", server)
        assert client.request(Message("hospital", "lab", "control.teardown", 0)).error is None
        shop = _party(ca, tmp_path, "shop")
        late = _client(shop, "shop", server)
        assert late.request(Message("shop", "lab", "control.teardown", 0)).error is None
        assert (lab / "lab.pem").read_bytes() == before  # nobody else was re-issued
        assert revoke(ca, "hospital")
        (lab / CRL_FILE).write_bytes((ca / CRL_FILE).read_bytes())  # the CA hands out the new list
        refused = client.request(Message("hospital", "lab", "control.teardown", 0))
        with pytest.raises(RemoteError, match="revoked by the federation's CA"):
            refused.unwrap()
        assert late.request(Message("shop", "lab", "control.teardown", 0)).error is None
        # The hospital, knowing the list too, refuses to start with its revoked certificate.
        (hospital / CRL_FILE).write_bytes((ca / CRL_FILE).read_bytes())
        with pytest.raises(ConfigError, match="revoked"):
            PartyCredentials.load(hospital, "hospital")
        for c in (client, late):
            c.close()
    finally:
        server.stop()


def test_a_client_refuses_a_revoked_server(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    create_ca(ca, ROSTER)
    lab, hospital = _party(ca, tmp_path, "lab"), _party(ca, tmp_path, "hospital")
    server = _serve(lab, "lab", {"hospital"})
    try:
        revoke(ca, "lab")
        (hospital / CRL_FILE).write_bytes((ca / CRL_FILE).read_bytes())
        client = _client(hospital, "hospital", server)
        with pytest.raises(TransportError, match="revoked"):
            client.request(Message("hospital", "lab", "control.teardown", 0))
        client.close()
    finally:
        server.stop()


def test_renewal_and_a_list_from_another_ca(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    create_ca(ca, ROSTER)
    lab = _party(ca, tmp_path, "lab")
    old = (lab / "lab.pem").read_bytes()
    renewal = tmp_path / "renew"
    _, csr = make_request(renewal, "lab")
    sign_request(ca, csr, out=lab)  # the same party, a new key and certificate: a renewal
    assert (lab / "lab.pem").read_bytes() != old and (lab / "lab.pem.previous").read_bytes() == old
    records = issued(ca)
    assert [r["party"] for r in records] == ["lab", "lab"]
    assert revoke(ca, "lab", serial=records[0]["serial"]) == [records[0]["serial"]]
    assert [r["revoked"] is None for r in issued(ca)] == [False, True]  # the old one only
    other = tmp_path / "other"
    create_ca(other, ROSTER)
    (lab / CRL_FILE).write_bytes((other / CRL_FILE).read_bytes())
    with pytest.raises(ConfigError, match="not a revocation list of this federation's CA"):
        Revocations(lab, (lab / "ca.pem").read_bytes())
    with pytest.raises(ConfigError, match="no unrevoked certificate for 'nobody'"):
        revoke(ca, "nobody")


def test_the_certs_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca, lab = tmp_path / "ca", tmp_path / "lab"
    assert main(["certs", "ca", str(ca), "--parties", "lab,hospital"]) == 0
    assert main(["certs", "request", str(lab), "--party", "lab", "--san", "lab.example.org"]) == 0
    assert main(["certs", "sign", str(ca), str(lab / "lab.csr"), "--days", "30"]) == 0
    assert main(["certs", "list", str(ca)]) == 0
    out = capsys.readouterr().out
    assert "lab.key stays in" in out and "lab.example.org" in out
    assert main(["certs", "revoke", str(ca), "lab"]) == 0
    assert "revoked" in capsys.readouterr().out
    assert json.loads((ca / "issued.json").read_text())[0]["revoked"]
    assert main(["certs", "request", str(lab), "--party", "lab"]) == 2  # the key exists: refused, kept
    assert "exists already" in capsys.readouterr().err
    assert main(["certs", "init", str(tmp_path / "demo"), "--parties", "a,b"]) == 0
    assert "local demos" in capsys.readouterr().out


def test_over_flower_a_revoked_party_cannot_seal_or_be_sealed_to(tmp_path: Path) -> None:
    """Over Flower, frames between parties are sealed with the same certificates: a peer revoked after it was
    learned is refused from its next frame on, and a revoked certificate the hub hands over is refused."""
    from vflo.comm.seal import Keyring
    from vflo.errors import PartyBoundaryError

    ca = tmp_path / "ca"
    create_ca(ca, ROSTER)
    lab, hospital = _party(ca, tmp_path, "lab"), _party(ca, tmp_path, "hospital")
    at_lab = Keyring(PartyCredentials.load(lab, "lab"))
    at_hospital = Keyring(PartyCredentials.load(hospital, "hospital"))
    at_lab.add_peers({"hospital": (hospital / "hospital.pem").read_bytes()})
    at_hospital.add_peers({"lab": (lab / "lab.pem").read_bytes()})
    assert at_lab.open(at_hospital.seal(b"scores", "lab")) == ("hospital", b"scores")
    revoke(ca, "hospital")
    (lab / CRL_FILE).write_bytes((ca / CRL_FILE).read_bytes())  # the CA hands out the new list
    with pytest.raises(PartyBoundaryError, match="revoked"):
        at_lab.open(at_hospital.seal(b"more", "lab"))
    with pytest.raises(PartyBoundaryError, match="revoked"):
        at_lab.seal(b"to it", "hospital")
    with pytest.raises(PartyBoundaryError, match="revoked"):
        Keyring(PartyCredentials.load(lab, "lab")).add_peers({"hospital": (hospital / "hospital.pem").read_bytes()})
