"""A federation's certificates over their life: each party makes its own key, a CA kept offline signs.

    vflo certs ca CA_DIR --parties hospital,lab       # once, by whoever the federation trusts (kept offline)
    vflo certs request DIR --party lab [--san HOST]   # at the lab, on its own host: lab.key never leaves DIR
    vflo certs sign CA_DIR DIR/lab.csr                # at the CA: lab.pem, with ca.pem and crl.pem, to hand back
    vflo certs revoke CA_DIR lab                      # lab's certificates go on crl.pem; hand it to every party
    vflo certs list CA_DIR                            # what the CA signed, and what it revoked
    vflo certs roster CA_DIR --add shop               # a party that joins: on the roster before it is signed

A party's private key is made where it is used and never travels: only its certificate request (``NAME.csr``,
public) goes to the CA, and only its certificate, the CA certificate and the revocation list come back. A party
joins later the same way, and nobody else's certificate changes. Renewing is signing a new request for the same
party (then revoking the old certificate, if it must stop working before it expires).

The CA keeps the federation's roster (``roster.json``: every party's name, signed yet or not) and a record of what
it signed (``issued.json``: serial, party, host names, key, expiry, revoked). It signs only for a party on the
roster (a party that joins later is added first, ``vflo certs roster CA_DIR --add NAME``), and refuses a request
any of whose names (its common name and every DNS name) is another party's on the roster or among those it
signed, in any spelling (the one normal form of :func:`vflo.roles.normal_name`): a certificate for the lab that
also names "hospital" would pass gRPC's host-name check as the hospital, whether or not the hospital was signed
yet. It also refuses a request whose key is that of a certificate it revoked: a revoked key stays revoked, and a
party makes a new one (``vflo certs request``). ``crl.pem`` is the CA's signed list of
revoked certificates: a party whose ``[tls] dir`` holds one refuses a peer whose certificate is on it, as a server
and as a client, and reads it again when the file changes (:class:`Revocations`).

``vflo certs init`` (every key in one place at once) stays for local demos and exports, and says so.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from vflo.comm.revocations import CRL_FILE, Revocations
from vflo.comm.tls import CA_README, ROSTER_FILE, check_roster, check_san, new_ca, write_roster
from vflo.errors import ConfigError
from vflo.roles import SAME_NAME, check_party_name, normal_name

logger = logging.getLogger(__name__)

__all__ = ["CRL_FILE", "ISSUED_FILE", "ROSTER_FILE", "Revocations", "add_to_roster", "create_ca", "issued",
           "make_request", "read_roster", "revoke", "sign_request", "write_roster"]

ISSUED_FILE = "issued.json"
ORGANIZATION = "vflo federation"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_new(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write a file that must not exist yet (nothing is ever overwritten here: a key or a CA lost is lost)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, flags, 0o600 if private else 0o644)
    except FileExistsError:
        raise ConfigError(f"{path} exists already; vflo never replaces a key, a certificate or a CA: move it away "
                          "first if it is really to be replaced") from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _hosts(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


@dataclass(frozen=True)
class CA:
    """The CA's certificate and key, read from its folder."""

    folder: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def load(cls, folder: Path) -> CA:
        paths = folder / "ca.pem", folder / "ca.key"
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise ConfigError(f"{missing} missing: {folder} is not a CA folder; make one with `vflo certs ca {folder}`")
        key = serialization.load_pem_private_key(paths[1].read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"{paths[1]} is not the EC key vflo's CA uses")
        return cls(folder=folder, cert=x509.load_pem_x509_certificate(paths[0].read_bytes()), key=key)


def read_roster(ca_folder: Path) -> list[str]:
    """The federation's party names, as the CA keeps them (``roster.json``)."""
    path = ca_folder / ROSTER_FILE
    if not path.is_file():
        signed = sorted({str(r["party"]) for r in issued(ca_folder)}) if (ca_folder / ISSUED_FILE).is_file() else []
        raise ConfigError(
            f"{path} is missing: this CA folder was made before vflo kept a roster of the federation's parties, and "
            "without one the CA cannot tell that a request names a party it has not signed yet. Write it with "
            f"`vflo certs roster {ca_folder} --add NAME,...`, naming every party of the federation (signed or not; "
            f"the ones signed so far, {signed}, are added by themselves), then sign again")
    try:
        parties = json.loads(path.read_text())["parties"]
        if not isinstance(parties, list) or not all(isinstance(p, str) for p in parties):
            raise TypeError("not a list of names")
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a roster written by `vflo certs ca` or `vflo certs roster` ({exc}); "
                          "move it away and write it again with `vflo certs roster`") from exc
    return check_roster(parties)


def add_to_roster(ca_folder: Path, parties: Sequence[str]) -> tuple[list[str], list[str]]:
    """Add ``parties`` to the CA's roster (made, with every party the CA signed so far, if the folder has none):
    the roster now, and a warning for each unrevoked certificate already signed that names another party on it
    (such a certificate could pass as that party: revoke it)."""
    CA.load(ca_folder)
    records = issued(ca_folder)
    try:
        roster = read_roster(ca_folder)
    except ConfigError:
        if (ca_folder / ROSTER_FILE).exists():
            raise
        roster = sorted({str(r["party"]) for r in records})
    new = [p for p in parties if p not in roster]
    roster = sorted(check_roster([*roster, *new]))
    write_roster(ca_folder, roster)
    warnings = []
    for r in records:
        if r["revoked"] is not None:
            continue
        for name in (str(r["party"]), *map(str, r["hosts"])):
            other = _roster_owner(name, roster)
            if other is not None and other != r["party"]:
                warnings.append(f"{r['party']!r}'s certificate (serial {r['serial']}) names {name!r}, which is the "
                                f"party {other!r} on the roster: it could pass as that party; revoke it with "
                                f"`vflo certs revoke {ca_folder} {r['party']} --serial {r['serial']}`")
                logger.warning("%s", warnings[-1])
    return roster, warnings


def _roster_owner(name: str, roster: Sequence[str]) -> str | None:
    """The party on ``roster`` that ``name`` is in some spelling, if any."""
    key = normal_name(name)
    return next((p for p in roster if normal_name(p) == key), None)


def create_ca(folder: Path, parties: Sequence[str], *, days: int = 3650) -> list[Path]:
    """A new CA in ``folder`` for the federation of ``parties`` (its roster; more may be added later):
    ``ca.pem`` (every party gets it), ``ca.key`` (keep the folder offline), an empty ``crl.pem``, the roster, the
    record of what it signs, and a README saying so."""
    if days < 1:
        raise ConfigError("a CA must be valid for at least one day")
    parties = check_roster(parties)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    key, cert = new_ca(days)
    _write_new(folder / "ca.key", _key_pem(key), private=True)
    _write_new(folder / "ca.pem", cert.public_bytes(serialization.Encoding.PEM))
    _write_new(folder / ISSUED_FILE, b"[]\n", private=True)
    write_roster(folder, parties)
    _write_new(folder / "README.txt", CA_README.encode())
    ca = CA(folder=folder, cert=cert, key=key)
    _write_crl(ca, [])
    return [folder / n for n in ("ca.pem", "ca.key", CRL_FILE, ISSUED_FILE, ROSTER_FILE, "README.txt")]


def make_request(folder: Path, party: str, *, hosts: list[str] | None = None) -> tuple[Path, Path]:
    """At the party, on its own host: its private key ``PARTY.key`` (mode 0600, it never leaves ``folder``) and
    a certificate request ``PARTY.csr`` naming the party (and ``hosts``, never a party's name) for the CA."""
    check_party_name(party)
    hosts = list(hosts or [])
    check_san([party], {party: hosts})
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    request = (
        x509.CertificateSigningRequestBuilder().subject_name(_name(party))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(party), *_hosts(hosts)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_path, csr_path = folder / f"{party}.key", folder / f"{party}.csr"
    _write_new(key_path, _key_pem(key), private=True)
    try:
        _write_new(csr_path, request.public_bytes(serialization.Encoding.PEM))
    except ConfigError:
        key_path.unlink()  # the key just made belongs to no request: nothing half-written is left
        raise
    return key_path, csr_path


def issued(ca_folder: Path) -> list[dict[str, Any]]:
    """What the CA signed: serial (hex), party, host names, expiry, revoked."""
    path = ca_folder / ISSUED_FILE
    if not path.is_file():
        raise ConfigError(f"{path} is missing: {ca_folder} is not a CA folder made by `vflo certs ca`")
    records: list[dict[str, Any]] = json.loads(path.read_text())
    return records


def _record(ca_folder: Path, records: list[dict[str, Any]]) -> None:
    path = ca_folder / ISSUED_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(records, indent=1) + "\n")
    tmp.replace(path)


def key_fingerprint(public_key: Any) -> str:
    """SHA-256 of a public key's DER SubjectPublicKeyInfo, hex: how the CA recognises a key it has seen."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashes.Hash(hashes.SHA256())
    digest.update(der)
    return digest.finalize().hex()


def sign_request(ca_folder: Path, request: Path, *, days: int = 365, out: Path | None = None) -> list[Path]:
    """Sign a party's certificate request: ``PARTY.pem`` written beside the request (or into ``out``), with the
    CA's ``ca.pem`` and ``crl.pem``: the three files to hand back to the party (its key never came here)."""
    if days < 1:
        raise ConfigError("a certificate must be valid for at least one day")
    ca = CA.load(ca_folder)
    try:
        csr = x509.load_pem_x509_csr(request.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{request} is not a certificate request made by `vflo certs request`: {exc}") from exc
    if not csr.is_signature_valid:
        raise ConfigError(f"{request}: its signature does not match its key; make a new request")
    names = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if len(names) != 1 or not isinstance(names[0], str):
        raise ConfigError(f"{request} names {names}: a request names exactly one party")
    party = names[0]
    check_party_name(party)
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = x509.SubjectAlternativeName([x509.DNSName(party)])
    unsupported = [n for n in san if not isinstance(n, x509.DNSName | x509.IPAddress)]
    if unsupported:
        raise ConfigError(f"{request} asks for names of other kinds ({unsupported}): a party's certificate carries "
                          "only host names and IP addresses; make a new request with `vflo certs request`")
    hosts = [str(n.value) for n in san if not (isinstance(n, x509.DNSName) and n.value == party)]
    records = issued(ca_folder)
    roster = read_roster(ca_folder)
    if party not in roster:
        raise ConfigError(f"{request} asks for {party!r}, which is not on the federation's roster {roster} "
                          f"({ca_folder / ROSTER_FILE}): if {party!r} is a party joining the federation, add it first "
                          f"with `vflo certs roster {ca_folder} --add {party}`, then sign again")
    # Every name the certificate would carry, against every party the CA knows of, signed yet or not: a name that
    # is another party's in any spelling would let this certificate pass gRPC's host-name check as that party.
    known = sorted({str(r["party"]) for r in records} | set(roster))
    dns = [str(n.value) for n in san if isinstance(n, x509.DNSName)]
    for name in (party, *dns):
        if "*" in name:
            raise ConfigError(f"{request} asks for the wildcard name {name!r}: a wildcard could match a party's "
                              "name; give exact host names (make a new request with `vflo certs request`)")
        other = _roster_owner(name, [p for p in known if p != party])
        if other is not None:
            spelled = "" if name == other else f" ({name!r} is {other!r}, {SAME_NAME})"
            raise ConfigError(f"{request} asks for {party!r} and names {name!r}, which is the party {other!r}"
                              f"{spelled}: a certificate with that name could pass as {other!r} (signed yet or not); "
                              f"refused. {party!r} makes a new request without it (`vflo certs request --party "
                              f"{party}`, --san only for host names that are no party's)")
    check_san(known, {party: hosts})
    fingerprint = key_fingerprint(csr.public_key())
    folder = out or request.parent
    _recognise_keys(records, party, folder / f"{party}.pem", ca)
    for r in records:
        if r.get("key") != fingerprint:
            continue
        if r["revoked"] is not None:
            raise ConfigError(f"{request} asks for a certificate for a key the CA revoked (serial {r['serial']}, "
                              f"{r['party']!r}, revoked {r['revoked']}): a revoked key stays revoked. Make a new key "
                              f"and request at the party (`vflo certs request DIR --party {party}` into a new folder) "
                              "and sign that")
        if r["party"] != party:
            raise ConfigError(f"{request} asks for {party!r} with the key of {r['party']!r}'s certificate (serial "
                              f"{r['serial']}): one key belongs to one party; make a new key with `vflo certs "
                              "request`")
    now = dt.datetime.now(dt.UTC)
    not_after = min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder().subject_name(_name(party)).issuer_name(ca.cert.subject)
        .public_key(csr.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(party), *_hosts(hosts)]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{party}.pem"
    if target.exists():
        # A renewal: the party's previous certificate is replaced by the new one (never a key, never the CA).
        target.with_name(f"{party}.pem.previous").unlink(missing_ok=True)
        target.replace(target.with_name(f"{party}.pem.previous"))
    _write_new(target, cert.public_bytes(serialization.Encoding.PEM))
    written = [target]
    for name in ("ca.pem", CRL_FILE):
        if (folder / name).resolve() != (ca_folder / name).resolve():
            shutil.copyfile(ca_folder / name, folder / name)
            written.append(folder / name)
    records.append({"serial": format(cert.serial_number, "x"), "party": party, "hosts": hosts, "key": fingerprint,
                    "not_after": cert.not_valid_after_utc.isoformat(), "revoked": None})
    _record(ca_folder, records)
    return written


def _recognise_keys(records: list[dict[str, Any]], party: str, previous: Path, ca: CA) -> None:
    """Give the records that predate key fingerprints (a CA folder from before vflo kept them) the key of the
    certificate a renewal would replace (``previous``, the party's current PARTY.pem, where it is one this CA
    signed), so that a revoked key is refused there too; warn of a revoked certificate of ``party`` whose key stays
    unknown: the CA cannot tell whether a request reuses it."""
    unknown = {str(r["serial"]): r for r in records if not r.get("key")}
    if not unknown:
        return
    try:
        cert = x509.load_pem_x509_certificate(previous.read_bytes()) if previous.is_file() else None
        if cert is not None:
            cert.verify_directly_issued_by(ca.cert)
    except Exception:  # not a certificate, or not this CA's (InvalidSignature has no common base)
        cert = None
    if cert is not None and format(cert.serial_number, "x") in unknown:
        unknown.pop(format(cert.serial_number, "x"))["key"] = key_fingerprint(cert.public_key())
    for r in unknown.values():
        if r["revoked"] is not None and r["party"] == party:
            logger.warning("the CA's record of %r's revoked certificate (serial %s) keeps no key (it was signed "
                           "before vflo recorded keys): the CA cannot tell whether this request reuses that key. Sign "
                           "only a request made with a new key (`vflo certs request` into a new folder)",
                           r["party"], r["serial"])


def revoke(ca_folder: Path, party: str, *, serial: str | None = None) -> list[str]:
    """Put ``party``'s certificates (or the one with ``serial``) on the CA's revocation list; the serials
    revoked now. Hand the new ``crl.pem`` to every party (it goes into each one's ``[tls] dir``)."""
    ca = CA.load(ca_folder)
    records = issued(ca_folder)
    now = dt.datetime.now(dt.UTC).isoformat()
    hit = [r for r in records if r["party"] == party and r["revoked"] is None and (serial is None or
                                                                                   r["serial"] == serial.lower())]
    if not hit:
        signed = sorted({str(r["party"]) for r in records})
        raise ConfigError(f"the CA has no unrevoked certificate for {party!r}" +
                          (f" with serial {serial}" if serial else "") + f"; it signed for {signed}")
    for r in hit:
        r["revoked"] = now
    _write_crl(ca, [r for r in records if r["revoked"] is not None])
    _record(ca_folder, records)
    return [str(r["serial"]) for r in hit]


def _write_crl(ca: CA, revoked: list[dict[str, Any]]) -> None:
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateRevocationListBuilder().issuer_name(ca.cert.subject).last_update(now)
               .next_update(ca.cert.not_valid_after_utc))
    for r in revoked:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(int(r["serial"], 16))
            .revocation_date(dt.datetime.fromisoformat(str(r["revoked"]))).build())
    crl = builder.sign(ca.key, hashes.SHA256())
    path = ca.folder / CRL_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    tmp.replace(path)
