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

Each side's library runs in a child process of its party, its logs in a file beside its IDs: a crash of the
library's link costs the child, not the party, and its logs do not fill the party's output.

The wheel pins ``numpy<2`` and pulls JAX for SPU's compiler, neither of which its PSI uses; vflo loads the two
native modules it needs (``libspu`` for the link, ``libpsi``) without importing the rest, so it is installed with
``pip install --no-deps spu==0.9.5``.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv as pa_csv

from vflo.align.ids import check_unique, tagged_array
from vflo.errors import ConfigError, ProtocolError
from vflo.party.policy import PSI_PROTOCOLS, UNBALANCED

logger = logging.getLogger(__name__)

#: The protocols vflo runs through the library: the name a config gives, and the library's.
PROTOCOLS = {name: f"PROTOCOL_{name.upper()}" for name in PSI_PROTOCOLS}
INSTALL = "pip install --no-deps spu==0.9.5"
TRACE = re.compile(r"Trace has been written to (/tmp/psi_[A-Za-z0-9_-]+\.trace)")


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


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port


class CountingRelay:
    """A TCP relay that forwards every connection made to it to ``target`` and counts the bytes each way: what
    really crossed the link, measured at the party's own end.

    Its port is reserved at once but listens only once the target does: until then a connection to it is refused,
    as one to the target itself would be, and the link dials again (its health check, every 3 s). A relay that
    accepted at once and held the connection until the target listened let the link's first requests wait in it
    and arrive late; now and then both sides then waited for each other until their timeout (seen without TLS
    too). Its sockets send small messages at once (``TCP_NODELAY``), as the link's own do: behind Nagle's
    algorithm the link's messages under TLS stalled, for 9.6 s or until the timeout, in 5 runs of 6."""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1", wait_s: float = 120.0) -> None:
        self.target = target
        self.wait_s = wait_s
        self.out_bytes = 0  # towards the target
        self.in_bytes = 0  # back from it
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.bind((host, 0))
        self.port: int = self._server.getsockname()[1]
        self._closed = False
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True, name="vflo-psi-relay").start()

    def _target_listens(self) -> bool:
        deadline = time.monotonic() + self.wait_s
        while not self._closed and time.monotonic() < deadline:
            try:
                socket.create_connection(self.target, timeout=5).close()
                return True
            except OSError:
                time.sleep(0.02)
        return False

    def _accept(self) -> None:
        if not self._target_listens():
            return
        try:
            self._server.listen()
        except OSError:
            return
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        for end in (client, upstream):  # as the link's own sockets: a small message goes out at once
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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

    def __enter__(self) -> CountingRelay:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclass
class Side:
    """One party's side of one intersection: its link's two entries (its own listening address first, by rank),
    the protocol, who receives the result, and whether the other learns it too.

    The library runs in a child process of the party (:func:`child`). Its link (brpc) can abort the whole process
    when it tears down, after the result is written; in a child, that costs the child only, and the party keeps
    serving. The child's logs go to a file beside its IDs, not to the party's output; the end of it is in the
    error when a side fails."""

    rank: int
    own: str
    peer: str
    protocol: str
    broadcast: bool
    tls: LinkTLS | None = None
    timeout_s: float = 600.0
    #: Unbalanced PSI only (``protocol = 'unbalanced'``): ``"offline"`` (the partner, rank 1, evaluates its IDs
    #: and sends them to the active party, rank 0, which keeps them) or ``"online"`` (an intersection against
    #: them); ``cache``: the folder where this side keeps what the offline stage made.
    stage: str = ""
    cache: str = ""

    def run(self, prepared: Prepared) -> np.ndarray:
        """Which of the IDs ``prepared`` holds (:func:`prepare`) are in the intersection (a mask), where this side
        learns it; all False otherwise. Their folder is removed when the side ends."""
        with prepared:
            self._execute(prepared)
            if not (self.rank == 0 or self.broadcast) or self.stage == "offline":
                return np.zeros(len(prepared.names), dtype=bool)
            return prepared.shared()

    def run_found(self, prepared: Prepared) -> list[str]:
        """The shared IDs as the library wrote them (tagged), where this side learns them: for a side whose IDs
        the library reads from elsewhere (unbalanced PSI's partner online, from its preparation)."""
        with prepared:
            self._execute(prepared)
            return sorted(prepared.found().to_pylist()) if self.rank == 0 or self.broadcast else []

    def _execute(self, prepared: Prepared) -> None:
        if self.protocol not in PROTOCOLS and (self.protocol, self.stage) not in (
                (UNBALANCED, "offline"), (UNBALANCED, "online")):
            raise ConfigError(f"PSI protocol {self.protocol!r}: choose one of {sorted(PROTOCOLS)} or "
                              f"{UNBALANCED!r} with a stage")
        if problem := missing():
            raise ConfigError(problem)
        order = {**asdict(self), "source": str(prepared.source), "result": str(prepared.result),
                 "done": str(prepared.done)}
        # The child runs in the side's own folder: a path relative to where the party runs (a config's
        # "hospital-tls", its alignments folder) is made absolute here.
        if self.tls is not None:
            order["tls"] = {k: str(Path(v).resolve()) for k, v in asdict(self.tls).items()}
        if self.cache:
            order["cache"] = str(Path(self.cache).resolve())
        prepared.order.write_text(json.dumps(order))
        code = _run_child(prepared, self.timeout_s)
        if not prepared.done.is_file():
            raise ProtocolError(f"the PSI library's side (rank {self.rank}, {self.protocol}) ended with exit "
                                f"status {code} before its result; the end of its log:\n{prepared.log_tail()}")
        if code != 0:
            logger.warning("the PSI library's side exited with status %s after writing its result (its link's "
                           "teardown); the result stands", code)


#: What a side's child process runs (:func:`child` on its order's path).
CHILD = "import sys; from vflo.align.spu import child; child(sys.argv[1])"
#: How long past its own timeout a side's child may run before it is stopped.
CHILD_GRACE_S = 30.0


def _run_child(prepared: Prepared, timeout_s: float) -> int:
    """Run :func:`child` on ``prepared``'s order; its exit status (killed if it outlives ``timeout_s``)."""
    env = dict(os.environ)
    # The child finds vflo where this process found it, however it was put on the path.
    source_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH", "")) if p)
    # The library's working folders (the party's IDs sorted, its buckets) go into the side's folder, removed with
    # it: the library leaves them behind, in /tmp otherwise.
    env["TMPDIR"] = str(prepared.folder)
    with prepared.log.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-c", CHILD, str(prepared.order)],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   cwd=prepared.folder, env=env)
    try:
        code = process.wait(timeout=timeout_s + CHILD_GRACE_S)
        prepared.remove_trace()
        return code
    except subprocess.TimeoutExpired:
        raise ProtocolError(
            f"the PSI library's side did not end within {timeout_s + CHILD_GRACE_S:.0f} s, so it was stopped: most "
            "often the two parties' sides never met. Check that each party reaches the other at the port its "
            "[policy] psi_link gives (open it to the other party's host; port 0 picks any port, which a firewall "
            "must then allow), or use vflo's own PSI ([alignment] engine = 'vflo'), which needs no other port. The "
            f"end of its log:\n{prepared.log_tail()}") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def child(order_path: str) -> None:
    """The library's side, in the child process :class:`Side` starts: read the order, run, mark it done."""
    order = json.loads(Path(order_path).read_text())
    libspu, libpsi = _libraries()
    link = libspu.link
    desc = link.Desc()
    desc.id = "vflo-psi"
    own, peer, rank = order["own"], order["peer"], order["rank"]
    for i, address in enumerate((own, peer) if rank == 0 else (peer, own)):
        desc.add_party(f"r{i}", address)
    desc.recv_timeout_ms = int(order["timeout_s"] * 1000)
    desc.connect_retry_times = max(1, int(order["timeout_s"] / 0.05))
    desc.connect_retry_interval_ms = 50
    # A message the link could not deliver (its peer's relay still refusing, a loaded peer) is sent again after
    # 1, 3 and 5 s by default: most of a small intersection's time. Every 50 ms, then at most every 200 ms, for as
    # long as the side may run.
    retry = desc.retry_opts
    retry.retry_interval_ms, retry.retry_interval_incr_ms, retry.max_retry_interval_ms = 50, 50, 200
    retry.max_retry = max(3, int(order["timeout_s"] / 0.2))
    if order["tls"] is not None:
        tls = LinkTLS(**order["tls"])
        desc.enable_ssl = True
        for opts in (desc.client_ssl_opts, desc.server_ssl_opts):
            opts.cert.certificate_path = tls.certificate
            opts.cert.private_key_path = tls.key
            opts.verify.ca_file_path = tls.ca
            opts.verify.verify_depth = 1
    context = link.create_brpc(desc, rank)
    if order["protocol"] == UNBALANCED:
        # The library's unbalanced PSI connects the link to its peer a second time (its handshake, under the same
        # key as create_brpc's). A handshake that arrives while the first one is still unread is dropped, so a side
        # that raced ahead into the second could leave a slower one (a loaded machine) waiting for it until the
        # timeout: seen in 2 of 7 runs of its tests beside two busy processes, the stacks showing one side in
        # the second connect and the other past it. A barrier first lets neither side on before both have read
        # the first handshake.
        context.barrier()
        count = _unbalanced(libpsi, order, context)
    else:
        count = _balanced(libpsi, order, context)
    Path(order["done"]).write_text(str(count))
    # Stopping the link waits for the peer to acknowledge what this side sent last; a peer that has already gone
    # would keep it retrying for as long as the retries above allow. The result is written: wait a little, then go.
    stopping = threading.Thread(target=context.stop_link, daemon=True)
    stopping.start()
    stopping.join(timeout=5)
    sys.stdout.flush()
    # Past this point nothing is left to do; leaving without the interpreter's teardown keeps the link's threads
    # from running into freed objects.
    os._exit(0)


def _balanced(libpsi: Any, order: dict[str, Any], context: Any) -> int:
    config = libpsi.PsiExecuteConfig()
    config.protocol_conf.protocol = getattr(libpsi.PsiProtocol, PROTOCOLS[order["protocol"]])
    config.protocol_conf.receiver_rank = 0
    config.protocol_conf.broadcast_result = order["broadcast"]
    config.protocol_conf.ecdh_params.curve = libpsi.EllipticCurveType.CURVE_25519  # ECDH's, as vflo's
    config.input_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
    config.input_params.path = order["source"]
    config.input_params.selected_keys = ["id"]
    config.input_params.keys_unique = True
    config.output_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
    config.output_params.path = order["result"]
    config.output_params.disable_alignment = True
    return int(libpsi.psi_execute(config, context).intersection_count)


def _unbalanced(libpsi: Any, order: dict[str, Any], context: Any) -> int:
    """The library's ECDH-OPRF unbalanced PSI: the active party (rank 0) is its client, the partner its server.
    Offline, the server evaluates its IDs under its own key (kept in its cache folder) and the client keeps what
    it receives; online, the client's IDs are evaluated by the server and looked up there."""
    config = libpsi.UbPsiExecuteConfig()
    client = order["rank"] == 0
    config.role = libpsi.UbPsiRole.ROLE_CLIENT if client else libpsi.UbPsiRole.ROLE_SERVER
    config.cache_path = order["cache"]
    reads = not client if order["stage"] == "offline" else client
    if order["stage"] == "offline":
        config.mode = libpsi.UbPsiMode.MODE_OFFLINE
    else:
        config.mode = libpsi.UbPsiMode.MODE_ONLINE
        config.client_receive_result = True
        config.server_receive_result = order["broadcast"]
        config.output_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
        config.output_params.path = order["result"]
        config.output_params.disable_alignment = True
    if reads:
        config.input_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
        config.input_params.path = order["source"]
        config.input_params.selected_keys = ["id"]
        config.input_params.keys_unique = True
    return int(libpsi.ub_psi_execute(config, context).intersection_count)


class Prepared:
    """A side's IDs written where the library reads them, and where it writes the intersection (a temporary
    folder, removed when the side ends), with the order for the child, its log and its done mark."""

    def __init__(self, names: pa.Array | list[str]) -> None:
        # An Arrow string array (tagged_array gives one): written, read back and compared without a Python object
        # per ID.
        self.names = names if isinstance(names, pa.Array) else pa.array(names, type=pa.string())
        self._folder = tempfile.TemporaryDirectory(prefix="vflo-psi-")
        self.folder = Path(self._folder.name)
        self.source, self.result = self.folder / "ids.csv", self.folder / "shared.csv"
        self.order, self.log, self.done = self.folder / "order.json", self.folder / "library.log", self.folder / "done"
        # Most IDs need no quoting; those that hold a comma, a quote or a line break are written by the csv module.
        self.quoted = bool(len(self.names)) and bool(pc.any(pc.match_substring_regex(self.names, '[,"\r\n]')).as_py())
        if self.quoted:
            with self.source.open("w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["id"])
                writer.writerows([n] for n in self.names.to_pylist())
        else:
            with self.source.open("wb") as f:
                f.write(b"id\n")
                if len(self.names):
                    pa_csv.write_csv(pa.table({"id": self.names}), f,
                                     pa_csv.WriteOptions(include_header=False, quoting_style="none"))

    def remove_trace(self) -> None:
        """Remove the trace the library writes at a fixed place (``/tmp/psi_ID.trace``, whatever ``TMPDIR`` says)
        for each run: the one its log names, nothing else."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return
        for name in TRACE.findall(text):
            with contextlib.suppress(OSError):
                Path(name).unlink()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def found(self) -> pa.Array:
        """The names the library wrote as shared (its CSV: a header, then one name a line, quoted where needed)."""
        if self.result.stat().st_size == 0:
            return pa.array([], type=pa.string())
        table = pa_csv.read_csv(self.result, read_options=pa_csv.ReadOptions(column_names=["id"], skip_rows=1),
                                parse_options=pa_csv.ParseOptions(newlines_in_values=True),
                                convert_options=pa_csv.ConvertOptions(column_types={"id": pa.string()},
                                                                      strings_can_be_null=False))
        return table.column("id").combine_chunks()

    def shared(self) -> np.ndarray:
        """Which of the names the library wrote as shared."""
        mask: np.ndarray = pc.is_in(self.names, value_set=self.found()).to_numpy(zero_copy_only=False)
        return mask

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *_: object) -> None:
        self._folder.cleanup()


def prepare(ids: np.ndarray, whose: str = "this party's") -> Prepared:
    """``ids`` tagged, checked unique and written for the library."""
    names = tagged_array(ids)
    check_unique(names, whose)
    return Prepared(names)


class Running:
    """A side running in a thread (the partner's, while the coordinator runs its own); :meth:`join` gives its
    result or raises what it raised."""

    def __init__(self, work: Callable[[], np.ndarray]) -> None:
        self._result: np.ndarray | None = None
        self._error: BaseException | None = None
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
