"""Certificates for mutual TLS between parties: a private CA and one key and certificate per party.

``vflo certs init DIR --parties active,bank,server`` writes ``ca.pem`` (the CA certificate),
``ca.key`` (keep it offline: it signs new parties) and ``NAME.pem`` / ``NAME.key`` per party.
A party's certificate names the party and nothing else (common name and DNS name), so a server can tell
which party a client is, and a client can check it reached the party it meant to (it verifies the server's
certificate against the party's name, not the address it dialled). ``--san NAME=HOST,...`` adds host names or
IP addresses to one party's certificate, for tools that check those; never another party's name.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from vflo.errors import ConfigError
from vflo.roles import check_party_name


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vflo federation"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def init_certs(directory: Path, parties: list[str], *, days: int = 365, overwrite: bool = False,
               san: dict[str, list[str]] | None = None) -> list[Path]:
    """Create a CA and a key and certificate per party in ``directory``; ``san``: extra host names or IP
    addresses for some parties' certificates."""
    if not parties:
        raise ConfigError("name at least one party: --parties active,bank,...")
    for p in parties:
        check_party_name(p)
    if len(set(parties)) != len(parties):
        raise ConfigError(f"party names repeat: {parties}")
    san = san or {}
    for party, hosts in san.items():
        if party not in parties:
            raise ConfigError(f"--san names {party!r}, which is not among the parties {parties}")
        clash = [h for h in hosts if h in parties]
        if clash:
            raise ConfigError(f"--san would let {party!r}'s certificate name the party {clash[0]!r}; give host "
                              "names or addresses that are not party names")
    if days < 1:
        raise ConfigError("certificates must be valid for at least one day")
    directory.mkdir(parents=True, exist_ok=True)
    existing = [directory / f for f in ("ca.pem", *(f"{p}.pem" for p in parties)) if (directory / f).exists()]
    if existing and not overwrite:
        raise ConfigError(f"{existing[0]} already exists; choose another folder or pass --overwrite")
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder().subject_name(_name("vflo CA")).issuer_name(_name("vflo CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    written = [directory / "ca.pem", directory / "ca.key"]
    written[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(written[1], ca_key)
    for party in parties:
        written += issue(directory, party, ca_key, ca_cert, not_before=now - dt.timedelta(minutes=5),
                         not_after=now + dt.timedelta(days=days), hosts=san.get(party, ()))
    return written


def issue(directory: Path, party: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, *,
          not_before: dt.datetime, not_after: dt.datetime, hosts: Sequence[str] = ()) -> list[Path]:
    """Write ``PARTY.pem`` and ``PARTY.key``: a certificate for ``party`` (and only the ``hosts`` asked for
    besides) signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(party)]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    san = x509.SubjectAlternativeName(names)
    cert = (
        x509.CertificateBuilder().subject_name(_name(party)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(san, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / f"{party}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(directory / f"{party}.key", key)
    return [directory / f"{party}.pem", directory / f"{party}.key"]


@dataclass(frozen=True)
class PartyCredentials:
    """What one party needs for mutual TLS: the CA certificate, its own certificate and key."""

    party: str
    ca: bytes
    certificate: bytes
    key: bytes

    @classmethod
    def load(cls, directory: str | Path, party: str) -> PartyCredentials:
        """Read and check ``ca.pem``, ``PARTY.pem`` and ``PARTY.key``: present, signed by the CA, in date, named."""
        directory = Path(directory)
        paths = {"ca": directory / "ca.pem", "cert": directory / f"{party}.pem", "key": directory / f"{party}.key"}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise ConfigError(
                f"TLS files {missing} are missing; make them with `vflo certs init {directory} --parties ...` "
                "(or pass --insecure for a loopback experiment)"
            )
        ca_pem, cert_pem, key_pem = (paths[k].read_bytes() for k in ("ca", "cert", "key"))
        try:
            ca = x509.load_pem_x509_certificate(ca_pem)
            cert = x509.load_pem_x509_certificate(cert_pem)
        except ValueError as exc:
            raise ConfigError(f"{paths['cert']} or {paths['ca']} is not a PEM certificate: {exc}") from exc
        now = dt.datetime.now(dt.UTC)
        for label, c in (("the CA certificate", ca), (f"party {party!r}'s certificate", cert)):
            if c.not_valid_after_utc < now:
                raise ConfigError(
                    f"{label} expired on {c.not_valid_after_utc:%Y-%m-%d}; make new certificates with "
                    "`vflo certs init`"
                )
            if c.not_valid_before_utc > now:
                raise ConfigError(f"{label} is not valid before {c.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, Exception) as exc:  # InvalidSignature has no common base
            raise ConfigError(f"party {party!r}'s certificate was not signed by the CA in {paths['ca']}") from exc
        names = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        if names != [party]:
            raise ConfigError(f"{paths['cert']} names {names}, not party {party!r}")
        return cls(party=party, ca=ca_pem, certificate=cert_pem, key=key_pem)
