"""A party's copy of its CA's revocation list (``crl.pem`` in its ``[tls] dir``), read again when the file changes.

Both ends of a connection check a peer's certificate against it (:mod:`vflo.comm.tls`); the CA writes it
(:mod:`vflo.comm.pki`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from cryptography import x509

from vflo.errors import ConfigError, PartyBoundaryError

logger = logging.getLogger(__name__)

CRL_FILE = "crl.pem"


class Revocations:
    """The revoked serials of a party's ``[tls] dir/crl.pem`` (none when there is no such file), read again
    whenever the file changes. A list not signed by the party's CA is refused at start; a bad one that
    replaces a good one later is logged and the last good list kept."""

    def __init__(self, folder: Path, ca_pem: bytes) -> None:
        self.path = folder / CRL_FILE
        self._ca = x509.load_pem_x509_certificate(ca_pem)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._serials: frozenset[int] = frozenset()
        self.serials(strict=True)

    def serials(self, *, strict: bool = False) -> frozenset[int]:
        """The revoked serial numbers, from the file as it is now."""
        with self._lock:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                self._stamp, self._serials = None, frozenset()
                return self._serials
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp == self._stamp:
                return self._serials
            try:
                crl = x509.load_pem_x509_crl(self.path.read_bytes())
                if not crl.is_signature_valid(self._ca.public_key()):  # type: ignore[arg-type]  # a CA key signs CRLs; its union type names keys that cannot
                    raise ValueError("it is not signed by this party's CA")
            except ValueError as exc:
                if strict:
                    raise ConfigError(f"{self.path} is not a revocation list of this federation's CA ({exc}); "
                                      "take crl.pem from the CA's folder") from exc
                logger.error("%s could not be read (%s): the last good revocation list stays in force", self.path,
                             exc)
                return self._serials
            self._stamp, self._serials = stamp, frozenset(r.serial_number for r in crl)
            return self._serials

    def check(self, pem: bytes, who: str) -> None:
        """Refuse a peer certificate (PEM) that the CA revoked."""
        serials = self.serials()
        if not serials or not pem:
            return
        serial = x509.load_pem_x509_certificate(pem).serial_number
        if serial in serials:
            raise PartyBoundaryError(f"{who} certificate (serial {serial:x}) was revoked by the federation's CA "
                                     f"({self.path}); refused")
