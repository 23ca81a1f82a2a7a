"""Certificates for mutual TLS between parties: a private CA and one key and certificate per party.

``vflo certs init DIR --parties active,bank,server`` writes ``ca.pem`` (the CA certificate),
``ca.key`` (keep it offline: it signs new parties), ``roster.json`` (the parties, see :mod:`vflo.comm.pki`) and
``NAME.pem`` / ``NAME.key`` per party, all in DIR.
With ``--split`` it keeps the keys apart: ``DIR/ca/`` holds the CA (``ca.pem``, ``ca.key`` and a README: this
folder belongs offline) and ``DIR/NAME/`` holds what party NAME needs and nothing else (``ca.pem``, ``NAME.pem``,
``NAME.key``): hand each party its own folder and point its ``[tls] dir`` at it.

A party's certificate names the party and nothing else (common name and DNS name), so a server can tell
which party a client is, and a client can check it reached the party it meant to (it verifies the server's
certificate against the party's name, not the address it dialled). ``--san NAME=HOST,...`` adds host names or
IP addresses to one party's certificate, for tools that check those; never a party's name. Names are compared
in one normal form (:func:`vflo.roles.normal_name`: case, a trailing dot and NFKC look-alikes set aside), so
"Hospital" or "hospital." is the party "hospital": no certificate may carry such a name but hospital's own, and
a certificate that does (issued elsewhere) is refused by the server that checks it and by the client that
dials it (:func:`check_certificate_names`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from vflo.comm.revocations import Revocations
from vflo.errors import ConfigError, PartyBoundaryError, TransportError
from vflo.roles import SAME_NAME, check_distinct_names, check_party_name, normal_name

logger = logging.getLogger(__name__)

CA_FOLDER = "ca"
CA_README = """This folder holds the federation's certificate authority (CA), written by `vflo certs init --split`
(or `vflo scenario --export`).

ca.key signs certificates: whoever holds it can make a certificate for any party and speak as that party.
Keep this folder offline (an encrypted drive, a vault), never on a party's host, and never in a party's
[tls] dir. Parties need only ca.pem, which is already in each party's own folder.

Each party gets its own folder NAME/ (ca.pem, NAME.pem, NAME.key) and nothing else: no other party's key,
and not ca.key.
"""


def how_to_certify(party: str) -> str:
    """How ``party`` gets its key and certificate, for an error that sends a user there: the real way (each party
    makes its own key, the federation's CA signs its request, :mod:`vflo.comm.pki`), then the one-machine demo."""
    return (f"each party makes its own key and the federation's CA signs it: `vflo certs request DIR --party "
            f"{party}` at {party!r} (DIR, a new folder, becomes its [tls] dir; {party}.key never leaves it), `vflo "
            f"certs sign CA_DIR DIR/{party}.csr` at the CA (made once with `vflo certs ca CA_DIR --parties ...`; a "
            f"party that joins later goes on its roster first, `vflo certs roster CA_DIR --add {party}`), and "
            f"{party}.pem, ca.pem and crl.pem go back into DIR (docs/deploy.md). Only for a demo on one machine: "
            f"`vflo certs init DIR --parties ... --split` makes every party's key at once, party {party!r} getting "
            f"DIR/{party}/")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vflo federation"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def new_ca(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A fresh CA key and its self-signed certificate, valid for ``days``."""
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(_name("vflo CA")).issuer_name(_name("vflo CA"))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def check_san(parties: Sequence[str], san: dict[str, list[str]]) -> None:
    """Refuse extra names that are not host names or addresses of their own: a party's name in any spelling
    (another party's would let the certificate pass as that party; its own is there already), or non-ASCII."""
    known = {normal_name(p): p for p in parties}
    for party, hosts in san.items():
        if party not in parties:
            raise ConfigError(f"--san names {party!r}, which is not among the parties {list(parties)}")
        for host in hosts:
            owner = known.get(normal_name(host))
            spelled = "" if owner == host else f" ({host!r} is {owner!r}, {SAME_NAME})"
            if owner is not None and owner != party:
                raise ConfigError(
                    f"--san {party}={host}: this would let {party!r}'s certificate name the party {owner!r}"
                    f"{spelled}; give host names or addresses that are not party names")
            if owner is not None:
                raise ConfigError(
                    f"--san {party}={host}: {party!r}'s certificate names {party!r} already{spelled}; leave "
                    "it out and give only host names or addresses that are not party names")
            if not host.isascii():
                raise ConfigError(f"--san {party}={host}: a host name must be ASCII; write an internationalised "
                                  "name as its A-label (xn--...)")


def init_certs(directory: Path, parties: list[str], *, days: int = 365, overwrite: bool = False,
               san: dict[str, list[str]] | None = None, split: bool = False) -> list[Path]:
    """Create a CA and a key and certificate per party in ``directory``; ``san``: extra host names or IP
    addresses for some parties' certificates. ``split``: the CA in ``directory/ca/`` (with a README: keep it
    offline) and each party's ``ca.pem``, ``NAME.pem`` and ``NAME.key`` in ``directory/NAME/``, nothing else."""
    if not parties:
        raise ConfigError("name at least one party: --parties active,bank,...")
    check_distinct_names(parties)
    for p in parties:
        check_party_name(p)
    if split and CA_FOLDER in parties:
        raise ConfigError(f"with --split the folder {CA_FOLDER}/ holds the CA: no party may be called "
                          f"{CA_FOLDER!r}; choose another name")
    san = san or {}
    check_san(parties, san)
    if days < 1:
        raise ConfigError("certificates must be valid for at least one day")
    ca_dir = directory / CA_FOLDER if split else directory
    folders = {p: directory / p if split else directory for p in parties}
    planned = [ca_dir / "ca.pem", *(folders[p] / f"{p}.pem" for p in parties)]
    existing = [f for f in planned if f.exists()]
    if existing and not overwrite:
        raise ConfigError(f"{existing[0]} already exists; choose another folder or pass --overwrite")
    loose = sorted(directory.glob("*.key")) if split else []
    if loose:
        raise ConfigError(f"{loose[0]} (from a `vflo certs init` without --split) lies beside the folders --split "
                          "writes, where keys must not be: move it away (ca.key offline) or choose another folder")
    for folder in {ca_dir, *folders.values()}:
        folder.mkdir(parents=True, exist_ok=True)
        if split:
            folder.chmod(0o700)
    now = dt.datetime.now(dt.UTC)
    ca_key, ca_cert = new_ca(days)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    written = [ca_dir / "ca.pem", ca_dir / "ca.key"]
    written[0].write_bytes(ca_pem)
    _write_key(written[1], ca_key)
    # The roster `vflo certs sign` checks requests against, should this CA sign a party later.
    written.append(write_roster(ca_dir, parties))
    if split:
        (ca_dir / "README.txt").write_text(CA_README)
        written.append(ca_dir / "README.txt")
    for party in parties:
        if split:
            (folders[party] / "ca.pem").write_bytes(ca_pem)
            written.append(folders[party] / "ca.pem")
        written += issue(folders[party], party, ca_key, ca_cert, not_before=now - dt.timedelta(minutes=5),
                         not_after=now + dt.timedelta(days=days), hosts=san.get(party, ()))
    return written


def issue(directory: Path, party: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, *,
          not_before: dt.datetime, not_after: dt.datetime, hosts: Sequence[str] = ()) -> list[Path]:
    """Write ``PARTY.pem`` and ``PARTY.key``: a certificate for ``party`` (and only the ``hosts`` asked for
    besides) signed by the CA. It checks no name: :func:`init_certs` does, before it calls this."""
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
    # The folder it was read from: where the CA's revocation list (crl.pem) is looked for.
    folder: str = ""

    def revocations(self) -> Revocations | None:
        """The CA's revocation list in this party's folder, kept current (None without a folder)."""
        return Revocations(Path(self.folder), self.ca) if self.folder else None

    @classmethod
    def load(cls, directory: str | Path, party: str) -> PartyCredentials:
        """Read and check ``ca.pem``, ``PARTY.pem`` and ``PARTY.key``: present, signed by the CA, in date, named."""
        directory = Path(directory)
        paths = {"ca": directory / "ca.pem", "cert": directory / f"{party}.pem", "key": directory / f"{party}.key"}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise ConfigError(_missing_tls(directory, party, missing))
        ca_pem, cert_pem, key_pem = (paths[k].read_bytes() for k in ("ca", "cert", "key"))
        try:
            ca = x509.load_pem_x509_certificate(ca_pem)
            cert = x509.load_pem_x509_certificate(cert_pem)
        except ValueError as exc:
            raise ConfigError(f"{paths['cert']} or {paths['ca']} is not a PEM certificate: {exc}") from exc
        now = dt.datetime.now(dt.UTC)
        renew = {"the CA certificate": "the federation needs a new CA (`vflo certs ca`) and every party a "
                                       "certificate from it", f"party {party!r}'s certificate": "renew it"}
        for label, c in (("the CA certificate", ca), (f"party {party!r}'s certificate", cert)):
            if c.not_valid_after_utc < now:
                raise ConfigError(
                    f"{label} expired on {c.not_valid_after_utc:%Y-%m-%d}; {renew[label]}: {how_to_certify(party)}")
            if c.not_valid_before_utc > now:
                raise ConfigError(f"{label} is not valid before {c.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, Exception) as exc:  # InvalidSignature has no common base
            raise ConfigError(f"party {party!r}'s certificate was not signed by the CA in {paths['ca']}") from exc
        names = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        if names != [party]:
            raise ConfigError(f"{paths['cert']} names {names}, not party {party!r}")
        credentials = cls(party=party, ca=ca_pem, certificate=cert_pem, key=key_pem, folder=str(directory))
        revocations = credentials.revocations()
        if revocations is not None and cert.serial_number in revocations.serials():
            raise ConfigError(f"party {party!r}'s certificate {paths['cert']} was revoked by the CA "
                              f"({revocations.path}); ask the CA to sign a new request (`vflo certs request`)")
        return credentials


def _missing_tls(directory: Path, party: str, missing: list[str]) -> str:
    """Why ``party``'s TLS files are not in ``directory`` (its ``[tls] dir``), as far as the folder tells, and the
    fix: for an error."""
    where = f"[tls] dir {str(directory)!r}"
    if (directory / f"{party}.key").is_file():  # its own key, made here: the CA's answer has not come back
        csr = directory / f"{party}.csr"
        return (f"TLS files {missing} are missing: {where} holds {party}.key, but not yet what the CA signs for it: "
                f"sign its request at the CA (`vflo certs sign CA_DIR {csr}`) and put the {party}.pem, ca.pem and "
                f"crl.pem it writes into {directory}")
    if not directory.is_dir():
        why = f"{where} does not exist (a relative [tls] dir starts at the config file's folder)"
    elif (directory / "ca.key").is_file():
        why = (f"{where} is the CA's folder (it holds ca.key, which never goes on a party's host), not the folder of "
               f"party {party!r}")
    elif (directory / party / f"{party}.pem").is_file():
        why = f"{where} holds a folder per party: the folder of party {party!r} is {directory / party}"
    elif others := sorted(p.stem for p in directory.glob("*.key") if p.stem != party):
        why = f"{where} holds the key of {others}, not of party {party!r}"
    else:
        why = f"{where} is not the folder of party {party!r}"
    return (f"TLS files {missing} are missing: {why}. Point [tls] dir at the folder that holds ca.pem, {party}.pem "
            f"and {party}.key; to make them, {how_to_certify(party)} (or pass --insecure for a loopback experiment)")


def certificate_names(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    """A certificate's common names and DNS names (its subject alternative names that are host names)."""
    common = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return common, []
    return common, list(extension.value.get_values_for_type(x509.DNSName))


@lru_cache(maxsize=256)
def pem_names(pem: bytes) -> tuple[list[str], list[str]]:
    """:func:`certificate_names` of a PEM certificate (a server checks the same client's certificate per message)."""
    return certificate_names(x509.load_pem_x509_certificate(pem))


def check_certificate_names(names: tuple[list[str], list[str]], parties: Collection[str], *, holder: str) -> None:
    """Refuse a certificate (its common and DNS ``names``) that names any of ``parties`` in any spelling
    (:func:`vflo.roles.normal_name`) other than the one party its common name is, spelled exactly as that party
    is: "Hospital" or "hospital." in the lab's certificate would let it pass as "hospital" (TLS host-name checks
    ignore case and a trailing dot). ``holder``: whose certificate it is, for the error."""
    common, dns = names
    known = {normal_name(p): p for p in parties}
    owner = common[0] if len(common) == 1 else None
    for name in (*common, *dns):
        party = known.get(normal_name(name))
        if party is not None and not name == party == owner:
            spelled = "" if name == party else f" ({SAME_NAME})"
            whose = repr(owner) if owner is not None else str(common)
            raise PartyBoundaryError(
                f"{holder} names {name!r}, which is the party {party!r}{spelled}, but it is the certificate of "
                f"{whose}: a certificate may name only its own party, spelled as "
                "that party is; refused. Have the federation's CA sign the party's own request (`vflo certs sign` "
                "refuses such a name, and `vflo certs init` never makes one)")


def check_peer_certificate(cert: x509.Certificate, *, peer: str, parties: Collection[str],
                           revoked: Collection[int], holder: str, advice: str = "") -> None:
    """Refuse (:class:`PartyBoundaryError`) a CA-signed certificate that is not ``peer``'s: one that names any of
    ``parties`` in a spelling not its own (:func:`check_certificate_names`), that the CA revoked (its serial among
    ``revoked``), or whose common name is not exactly ``peer`` (the error then ends with ``advice``, what to check
    where the caller found it). ``holder``: whose certificate, for the error."""
    names = certificate_names(cert)
    check_certificate_names(names, {*parties, peer}, holder=holder)
    if cert.serial_number in revoked:
        raise PartyBoundaryError(f"{holder} (serial {cert.serial_number:x}) was revoked by the federation's CA")
    if names[0] != [peer]:
        raise PartyBoundaryError(f"{holder} names {names[0]}, not the party {peer!r}{': ' if advice else ''}{advice}")


def warn_insecure(who: str) -> None:
    """Say, each time, that ``who`` runs without TLS (a loopback experiment's choice, never a default)."""
    logger.warning("INSECURE: %s runs without TLS: messages are unencrypted and parties are not authenticated. "
                   "Use this only for experiments on a loopback interface.", who)


def _socket_target(address: str) -> str | tuple[str, int] | None:
    """Where a gRPC target string connects: a Unix socket's path, (host, port), or None for forms not probed."""
    for prefix in ("dns:///", "ipv4:", "ipv6:"):
        address = address.removeprefix(prefix)
    if address.startswith("unix:"):
        path = address.removeprefix("unix:")
        return path.removeprefix("//") if path.startswith("///") else path
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or any(c in host for c in "/,") or host.startswith("dns:"):
        return None
    return host.strip("[]"), int(port)


def _client_context(credentials: PartyCredentials) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=credentials.ca.decode())
    context.check_hostname = False  # the names are checked by check_certificate_names, in their normal form
    context.set_alpn_protocols(["h2"])
    chain = credentials.certificate + b"\n" + credentials.key
    # ssl reads a key only from a file: one in memory (Linux), else one only this user can read, removed at once.
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("vflo-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, chain)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return context
    with tempfile.TemporaryDirectory(prefix="vflo-tls-") as folder:
        path = Path(folder) / "chain.pem"
        path.touch(mode=0o600)
        path.write_bytes(chain)
        context.load_cert_chain(path)
    return context


class ProbeError(TransportError):
    """No TLS handshake completed with the party at an address, so its certificate could not be read: nothing may be
    sent there. ``transient``: whether trying again may help (nothing listening yet, a dropped connection)."""

    def __init__(self, cause: str, *, transient: bool) -> None:
        super().__init__(cause)
        self.cause = cause
        self.transient = transient


def peer_certificate(address: str, receiver: str, credentials: PartyCredentials, *,
                     timeout: float = 10.0) -> x509.Certificate:
    """The certificate (signed by the CA) of the party listening at ``address``, read in a TLS handshake of our
    own (gRPC's Python client does not show it). Where no handshake completes (nothing listens, the connection is
    dropped, another CA, no TLS, an address form that cannot be probed) it raises :class:`ProbeError` with the
    cause: a client never sends to a party whose certificate it has not read."""
    target = _socket_target(address)
    if target is None:
        raise ProbeError(f"{address!r} is an address whose certificate vflo cannot read before sending to it; give "
                         "HOST:PORT or unix:PATH", transient=False)
    try:
        context = _client_context(credentials)
        if isinstance(target, str):
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.settimeout(timeout)
            raw.connect(target)
        else:
            raw = socket.create_connection(target, timeout=timeout)
        with raw, context.wrap_socket(raw, server_hostname=receiver) as channel:
            der = channel.getpeercert(binary_form=True)
    except ssl.SSLCertVerificationError as exc:
        raise ProbeError(f"certificate_verify_failed: {exc.verify_message}", transient=False) from exc
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError, ConnectionResetError, ConnectionAbortedError,
            BrokenPipeError) as exc:
        # The peer closed the connection during the handshake: perhaps a restart, perhaps a peer that hides its
        # certificate from a probe. Either way nothing is sent until a handshake completes.
        raise ProbeError(f"the connection was closed during the TLS handshake ({exc})", transient=True) from exc
    except ssl.SSLError as exc:
        raise ProbeError(f"TLS handshake failed: {exc}", transient=False) from exc
    except OSError as exc:  # refused, reset, unreachable, timed out
        raise ProbeError(f"{type(exc).__name__}: {exc}", transient=True) from exc
    except ValueError as exc:
        raise ProbeError(f"TLS handshake failed: {exc}", transient=False) from exc
    if der is None:
        raise ProbeError("the party sent no certificate", transient=False)
    return x509.load_der_x509_certificate(der)


#: The CA's roster of the federation's party names, in its folder (:mod:`vflo.comm.pki` reads and extends it).
ROSTER_FILE = "roster.json"


def check_roster(parties: Sequence[str]) -> list[str]:
    if not parties:
        raise ConfigError("name the federation's parties (`vflo certs ca DIR --parties hospital,lab`, or `vflo certs "
                          "roster DIR --add NAME,...`): the CA signs only for a party on its roster, and no "
                          "certificate may name another party on it")
    for party in parties:
        check_party_name(party)
    check_distinct_names(parties)
    return list(parties)


def write_roster(folder: Path, parties: Sequence[str]) -> Path:
    """Write the CA's roster (``roster.json``, mode 0600), replacing any there: the federation's party names."""
    path = folder / ROSTER_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps({"parties": sorted(check_roster(parties))}, indent=1) + "\n")
    tmp.replace(path)
    return path
