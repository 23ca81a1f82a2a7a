"""Private set intersection by SecretFlow's PSI library (``libpsi`` in the ``spu`` wheel): RR22, KKRT or ECDH
between the active party and one partner, over the library's own link between the two.

vflo's messages set the run up and close it; the intersection itself runs over a direct link (brpc), which each
party opens from its own side: it listens on the address its own config gives (``[policy] psi_link``, loopback by
default) and dials the other party's host, the one its own config names for it. With TLS, the link uses the
party's own certificate and key and accepts only certificates of the federation's CA.

1. The coordinator sends ``align.engine_open`` (the protocol, the rows' purpose, its own link port). The partner
   checks its policy accepts the protocol, starts its side and answers with its port and width.
2. Both sides run the protocol. Its receiver is the active party; with ``mode = 'both'`` it shares the result, so
   the partner learns the intersection too (and with ``'active'`` learns nothing but the active party's count).
3. The coordinator sends ``align.engine_result``; the partner ends its side and answers with its count.

The bytes of the link are measured where they cross: the active party's side runs through a counting relay
(:class:`CountingRelay`), and the ledger gets one entry per direction (kind ``align.engine.PROTOCOL``).

The wheel pins ``numpy<2`` and pulls JAX for SPU's compiler, neither of which its PSI uses; vflo loads the two
native modules it needs (``libspu`` for the link, ``libpsi``) without importing the rest, so it is installed with
``pip install --no-deps spu==0.9.5``.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import logging
import socket
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from vflo.errors import ConfigError, ProtocolError

logger = logging.getLogger(__name__)

#: The protocols vflo runs through the library, by the name a config gives.
PROTOCOLS = {"rr22": "PROTOCOL_RR22", "kkrt": "PROTOCOL_KKRT", "ecdh": "PROTOCOL_ECDH"}
INSTALL = "pip install --no-deps spu==0.9.5"


def missing() -> str:
    """Why the library cannot be used here, or "" when it can."""
    try:
        _libraries()
    except ConfigError as exc:
        return str(exc)
    return ""


@cache
def _libraries() -> tuple[Any, Any]:
    """``libspu`` (its link) and ``libpsi``, loaded from the installed ``spu`` package without running its
    ``__init__`` (which imports JAX)."""
    spec = importlib.util.find_spec("spu") if "spu" not in sys.modules else None
    root = Path(spec.submodule_search_locations[0]) if spec is not None and spec.submodule_search_locations \
        else Path(getattr(sys.modules.get("spu"), "__path__", [""])[0])
    if not (root / "libpsi.so").is_file() or not (root / "libspu.so").is_file():
        raise ConfigError(f"the PSI library is not installed here: {INSTALL} (or use vflo's own PSI: "
                          "[alignment] engine = 'vflo')")
    if "spu" not in sys.modules:
        package = types.ModuleType("spu")
        package.__path__ = [str(root)]
        sys.modules["spu"] = package
    loaded = []
    for name in ("libspu", "libpsi"):
        full = f"spu.{name}"
        if full not in sys.modules:
            spec_so = importlib.util.spec_from_file_location(full, root / f"{name}.so")
            assert spec_so is not None and spec_so.loader is not None
            module = importlib.util.module_from_spec(spec_so)
            sys.modules[full] = module
            spec_so.loader.exec_module(module)
        loaded.append(sys.modules[full])
    return loaded[0], loaded[1]


@dataclass(frozen=True)
class LinkTLS:
    """A party's own certificate and key, and its federation's CA, as files (the link reads them itself)."""

    certificate: str
    key: str
    ca: str


def tagged(ids: np.ndarray) -> list[str]:
    """The IDs as both sides write them: type-tagged, so the int 7 and the text "7" are different people (as in
    vflo's own PSI)."""
    if ids.dtype.kind in "iu":
        return [f"i:{v}" for v in ids.tolist()]
    return [f"s:{v}" for v in ids.tolist()]


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"psi_link = {address!r} is not HOST:PORT (PORT 0: any free port)")
    return host, int(port)


class CountingRelay:
    """A TCP relay that forwards every connection made to it to ``target`` and counts the bytes each way: what
    really crossed the link, measured at the party's own end."""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1", wait_s: float = 120.0) -> None:
        self.target = target
        self.wait_s = wait_s
        self.out_bytes = 0  # towards the target
        self.in_bytes = 0  # back from it
        self._lock = threading.Lock()
        self._server = socket.create_server((host, 0))
        self.port: int = self._server.getsockname()[1]
        self._closed = False
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True, name="vflo-psi-relay").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        # The other side may not listen yet (each side starts its own): keep the accepted connection waiting until
        # it does, rather than dropping it, which the link would see as a closed connection mid-handshake.
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                break
            except OSError:
                if self._closed or time.monotonic() > deadline:
                    client.close()
                    return
                time.sleep(0.02)
        upstream.settimeout(None)
        for src, dst, outward in ((client, upstream, True), (upstream, client, False)):
            thread = threading.Thread(target=self._pump, args=(src, dst, outward), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _pump(self, src: socket.socket, dst: socket.socket, outward: bool) -> None:
        try:
            while chunk := src.recv(1 << 20):
                dst.sendall(chunk)
                with self._lock:
                    if outward:
                        self.out_bytes += len(chunk)
                    else:
                        self.in_bytes += len(chunk)
        except OSError:
            pass
        finally:
            for end in (src, dst):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._server.close()
        for thread in self._threads:
            thread.join(timeout=5)


@dataclass
class Side:
    """One party's side of one intersection: its link's two entries (its own listening address first, by rank),
    the protocol, who receives the result, and whether the other learns it too."""

    rank: int
    own: str
    peer: str
    protocol: str
    broadcast: bool
    tls: LinkTLS | None = None
    timeout_s: float = 600.0

    def run(self, ids: np.ndarray, prepared: Prepared | None = None) -> np.ndarray:
        """Which of ``ids`` are in the intersection (a mask), where this side learns it; all False otherwise.
        ``prepared``: its IDs already written (:func:`prepare`), while the other side started."""
        libspu, libpsi = _libraries()
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"PSI protocol {self.protocol!r}: choose one of {sorted(PROTOCOLS)}")
        prepared = prepared if prepared is not None else prepare(ids)
        with prepared:
            link = libspu.link
            desc = link.Desc()
            desc.id = "vflo-psi"
            entries = [(f"r{i}", address) for i, address in enumerate(
                (self.own, self.peer) if self.rank == 0 else (self.peer, self.own))]
            for name, address in entries:
                desc.add_party(name, address)
            desc.recv_timeout_ms = int(self.timeout_s * 1000)
            desc.connect_retry_times = max(1, int(self.timeout_s / 0.05))
            desc.connect_retry_interval_ms = 50
            if self.tls is not None:
                desc.enable_ssl = True
                for opts in (desc.client_ssl_opts, desc.server_ssl_opts):
                    opts.cert.certificate_path = self.tls.certificate
                    opts.cert.private_key_path = self.tls.key
                    opts.verify.ca_file_path = self.tls.ca
                    opts.verify.verify_depth = 1
            context = link.create_brpc(desc, self.rank)
            try:
                config = libpsi.PsiExecuteConfig()
                config.protocol_conf.protocol = getattr(libpsi.PsiProtocol, PROTOCOLS[self.protocol])
                config.protocol_conf.receiver_rank = 0
                config.protocol_conf.broadcast_result = self.broadcast
                config.protocol_conf.ecdh_params.curve = libpsi.EllipticCurveType.CURVE_25519  # ECDH's, as vflo's
                config.input_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
                config.input_params.path = str(prepared.source)
                config.input_params.selected_keys = ["id"]
                config.input_params.keys_unique = True
                config.output_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
                config.output_params.path = str(prepared.result)
                config.output_params.disable_alignment = True
                libpsi.psi_execute(config, context)
            finally:
                context.stop_link()
            if not (self.rank == 0 or self.broadcast):
                return np.zeros(len(ids), dtype=bool)
            return prepared.shared()


class Prepared:
    """A side's IDs written where the library reads them, and where it writes the intersection (a temporary
    folder, removed when the side ends)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self._folder = tempfile.TemporaryDirectory(prefix="vflo-psi-")
        self.source = Path(self._folder.name) / "ids.csv"
        self.result = Path(self._folder.name) / "shared.csv"
        # Most IDs need no quoting; those that hold a comma, a quote or a line break are written by the csv module.
        self.quoted = any(("," in n or '"' in n or "\n" in n or "\r" in n) for n in names)
        if self.quoted:
            with self.source.open("w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["id"])
                writer.writerows([n] for n in names)
        else:
            self.source.write_text("id\n" + "\n".join(names) + "\n")

    def shared(self) -> np.ndarray:
        """Which of the names the library wrote as shared."""
        text = self.result.read_text()
        if self.quoted or '"' in text[text.find("\n") + 1:]:
            with self.result.open(newline="") as f:
                reader = csv.reader(f)
                next(reader, None)
                found = {row[0] for row in reader if row}
        else:
            found = set(text.split("\n")[1:])
            found.discard("")
        return np.fromiter((n in found for n in self.names), dtype=bool, count=len(self.names))

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *_: object) -> None:
        self._folder.cleanup()


def prepare(ids: np.ndarray) -> Prepared:
    """``ids`` tagged, checked unique and written for the library."""
    names = tagged(ids)
    if len(set(names)) != len(names):
        raise ConfigError("private set intersection needs unique IDs; this party's list repeats some: deduplicate it")
    return Prepared(names)


class Running:
    """A side running in a thread (the partner's, while the coordinator runs its own); :meth:`join` gives its
    result or raises what it raised."""

    def __init__(self, work: Callable[[], np.ndarray]) -> None:
        self._result: np.ndarray | None = None
        self._error: BaseException | None = None
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True, name="vflo-psi-side")
        self._thread.start()

    def _run(self, work: Callable[[], np.ndarray]) -> None:
        try:
            self._result = work()
        except BaseException as exc:  # handed to whoever joins
            self._error = exc

    def join(self, timeout: float) -> np.ndarray:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise ProtocolError(f"this party's side of the PSI did not end within {timeout:.0f} s")
        if self._error is not None:
            raise ProtocolError(f"this party's side of the PSI failed: {self._error}") from self._error
        assert self._result is not None
        return self._result
