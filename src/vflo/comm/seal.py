"""Sealed frames: end-to-end encrypted and signed from one party to another, across a hub that only routes.

Over vflo's gRPC, two parties talk on their own mutual-TLS channel: no third party reads or forges what
the FedSVD server and a passive party say to each other. Over Flower every message passes the SuperLink
and the ServerApp, which belong to the coordinating (active) party. A frame one party sends another
through that hub is therefore *sealed*: encrypted to the receiver's certificate key (ephemeral ECDH on
P-256, HKDF-SHA256, AES-256-GCM) and signed with the sender's key (ECDSA P-256), the same keys and
certificates ``vflo certs init`` makes for TLS. The receiver checks that the signer's certificate comes
from the federation's CA and names the sender the message claims, that the frame is addressed to it, is
fresh (within :data:`FRESH_SECONDS` of its clock) and was not seen before. The hub's own party seals what it
sends each party too: the receiver then checks the coordinator's certificate, against the CA's revocation list
as it is now, on every frame, as vflo's gRPC server checks its client's on every call. What a party sends the
hub's party goes plain: the hub is that party, and Flower's TLS protects each link.

A sealed frame: ``MAGIC | time (ms, 8) | sender | receiver | ephemeral key (65) | nonce (12) | signature |
ciphertext`` (names and signature behind 2-byte lengths); the signature covers everything before it and
the ciphertext, and the AES-GCM tag binds the header too.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from vflo.comm.tls import PartyCredentials, check_peer_certificate
from vflo.errors import PartyBoundaryError

MAGIC = b"VSEAL1"
FRESH_SECONDS = 300.0
HELLO = b"vflo-hello-1"
_POINT = 65  # an uncompressed P-256 point
_NONCE = 12


def is_sealed(frame: bytes) -> bool:
    return frame.startswith(MAGIC)


def _short(data: bytes) -> bytes:
    return struct.pack("<H", len(data)) + data


@dataclass
class _Reader:
    data: bytes
    at: int = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise PartyBoundaryError("a sealed frame is cut short")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def short(self) -> bytes:
        return self.take(struct.unpack("<H", self.take(2))[0])


@dataclass
class Keyring:
    """One party's key and certificate, its federation's CA, and the peer certificates it has checked."""

    credentials: PartyCredentials
    peers: dict[str, x509.Certificate] = field(default_factory=dict)
    _seen: dict[bytes, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.party = self.credentials.party
        self._ca = x509.load_pem_x509_certificate(self.credentials.ca)
        key = serialization.load_pem_private_key(self.credentials.key, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise PartyBoundaryError(f"party {self.party!r}'s key is not an elliptic-curve key as `vflo certs request` "
                                     "makes")
        self._key: ec.EllipticCurvePrivateKey = key
        # The CA's revocation list in this party's [tls] dir, read again when it changes: a peer revoked after
        # it connected is refused from its next frame on, as over vflo's gRPC.
        self._revocations = self.credentials.revocations()

    @property
    def certificate(self) -> bytes:
        return self.credentials.certificate

    def check_certificate(self, name: str, pem: bytes) -> x509.Certificate:
        """``pem`` parsed, if the CA signed it, it is in date, it names party ``name`` (and no other party in any
        spelling) and the CA has not revoked it; refused otherwise, by the checks vflo's gRPC makes of a peer."""
        try:
            cert = x509.load_pem_x509_certificate(pem)
            cert.verify_directly_issued_by(self._ca)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise PartyBoundaryError(f"the certificate given for {name!r} was not issued by {self.party!r}'s CA: "
                                     f"{exc}") from exc
        now = time.time()
        if not cert.not_valid_before_utc.timestamp() <= now <= cert.not_valid_after_utc.timestamp():
            raise PartyBoundaryError(f"{name!r}'s certificate is not valid now")
        revoked = self._revocations.serials() if self._revocations is not None else frozenset()
        check_peer_certificate(cert, peer=name, parties={self.party, *self.peers}, revoked=revoked,
                               holder=f"the certificate given for {name!r}")
        return cert

    def _refuse_revoked(self, name: str, cert: x509.Certificate) -> None:
        # The check vflo's gRPC server makes of a client on every call, against the list as it is now.
        if self._revocations is not None:
            self._revocations.check(cert.public_bytes(serialization.Encoding.PEM), f"party {name!r}'s")

    def check_peer(self, name: str) -> None:
        """Refuse ``name`` unless this party holds its checked certificate and the CA has not revoked it since."""
        self._peer_key(name)

    def add_peers(self, certificates: dict[str, bytes]) -> None:
        """Learn peers' certificates (each checked); the hub hands them over, but cannot forge one."""
        for name, pem in certificates.items():
            if name != self.party:
                self.peers[name] = self.check_certificate(name, pem)

    # -- proving who answers ------------------------------------------------------------------------

    def prove(self, challenge: bytes) -> bytes:
        """The answer to a hub's ``hello``: this party's name and certificate, and its signature of the challenge."""
        signature = self._key.sign(HELLO + challenge + self.party.encode(), ec.ECDSA(hashes.SHA256()))
        return json.dumps({"party": self.party, "certificate": self.certificate.decode(),
                           "signature": signature.hex()}).encode()

    def check_proof(self, challenge: bytes, answer: bytes) -> tuple[str, bytes]:
        """The party that answered ``challenge`` and its certificate, if its signature and certificate hold."""
        try:
            raw = json.loads(answer)
            name, pem, signature = str(raw["party"]), str(raw["certificate"]).encode(), bytes.fromhex(raw["signature"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PartyBoundaryError(f"a SuperNode answered hello with no proof of its party ({exc}); is it "
                                     "running without TLS? Give every party [tls] dir") from exc
        self.peers[name] = self.check_certificate(name, pem)
        try:
            self._peer_key(name).verify(signature, HELLO + challenge + name.encode(), ec.ECDSA(hashes.SHA256()))
        except InvalidSignature as exc:
            del self.peers[name]
            raise PartyBoundaryError(f"the SuperNode claiming to be {name!r} could not prove it") from exc
        return name, pem

    # -- sealing frames -----------------------------------------------------------------------------

    def _peer_key(self, name: str) -> ec.EllipticCurvePublicKey:
        cert = self.peers.get(name)
        if cert is None:
            raise PartyBoundaryError(f"party {self.party!r} has no certificate for {name!r}, so it cannot seal a "
                                     "frame to it or check one from it; the hub hands every party's certificate "
                                     "over when it connects")
        self._refuse_revoked(name, cert)
        key = cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise PartyBoundaryError(f"{name!r}'s certificate does not hold an elliptic-curve key")
        return key

    @staticmethod
    def _aead_key(shared: bytes, sender: str, receiver: str) -> AESGCM:
        info = b"vflo-seal-1|" + sender.encode() + b"|" + receiver.encode()
        return AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared))

    def seal(self, frame: bytes, receiver: str) -> bytes:
        """``frame`` encrypted to ``receiver`` and signed by this party."""
        ephemeral = ec.generate_private_key(ec.SECP256R1())
        point = ephemeral.public_key().public_bytes(serialization.Encoding.X962,
                                                    serialization.PublicFormat.UncompressedPoint)
        header = (MAGIC + struct.pack("<Q", int(time.time() * 1000)) + _short(self.party.encode())
                  + _short(receiver.encode()) + point)
        nonce = os.urandom(_NONCE)
        aead = self._aead_key(ephemeral.exchange(ec.ECDH(), self._peer_key(receiver)), self.party, receiver)
        ciphertext = aead.encrypt(nonce, frame, header)
        signature = self._key.sign(header + nonce + ciphertext, ec.ECDSA(hashes.SHA256()))
        return header + nonce + _short(signature) + ciphertext

    def open(self, sealed: bytes) -> tuple[str, bytes]:
        """Who sealed ``sealed`` and the frame inside; refused unless it is a fresh, unseen frame to this party
        signed by the certificate of the party it names."""
        r = _Reader(sealed)
        if r.take(len(MAGIC)) != MAGIC:
            raise PartyBoundaryError("not a sealed frame")
        stamp = struct.unpack("<Q", r.take(8))[0] / 1000
        sender, receiver = r.short().decode(errors="replace"), r.short().decode(errors="replace")
        point = r.take(_POINT)
        header = sealed[: r.at]
        nonce = r.take(_NONCE)
        signature = r.short()
        ciphertext = sealed[r.at :]
        if receiver != self.party:
            raise PartyBoundaryError(f"a frame sealed for {receiver!r} reached {self.party!r}; refused")
        try:
            self._peer_key(sender).verify(signature, header + nonce + ciphertext, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature as exc:
            raise PartyBoundaryError(f"a frame claiming to come from {sender!r} does not carry its signature; "
                                     "refused") from exc
        now = time.time()
        if abs(now - stamp) > FRESH_SECONDS:
            raise PartyBoundaryError(f"a frame from {sender!r} is {now - stamp:.0f} s old (more than "
                                     f"{FRESH_SECONDS:.0f} s off this party's clock); refused: replayed, or the "
                                     "clocks disagree")
        digest = hashlib.sha256(signature).digest()
        with self._lock:
            for old in [d for d, t in self._seen.items() if now - t > 2 * FRESH_SECONDS]:
                del self._seen[old]
            if digest in self._seen:
                raise PartyBoundaryError(f"a frame from {sender!r} arrived twice; the copy is refused")
            self._seen[digest] = now
        try:
            ephemeral = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
            shared = self._key.exchange(ec.ECDH(), ephemeral)
            frame = self._aead_key(shared, sender, receiver).decrypt(nonce, ciphertext, header)
        except (ValueError, InvalidTag) as exc:
            raise PartyBoundaryError(f"a frame from {sender!r} does not decrypt; refused") from exc
        return sender, frame
