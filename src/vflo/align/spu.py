"""Private set intersection by SecretFlow's PSI library (``libpsi`` in the ``spu`` wheel): RR22, KKRT or ECDH
between the active party and one partner, over the library's own link between the two.

vflo's messages set the run up and close it; the intersection itself runs over a direct link (brpc) between the
two. The library never meets the network: it listens and dials on Unix sockets in its side's private folder, and
vflo's relays (:mod:`vflo.align.link_relay`) carry its bytes. Each party's inbound relay listens on the address
its own config gives (``[policy] psi_link``, loopback by default) and, with TLS, hands the library only a
connection whose client certificate of the federation's CA names the expected peer; its outbound relay dials the
other party's host, the one its own config names for it, and forwards nothing unless that server's certificate
names the peer.

1. The coordinator sends ``align.engine_open`` (the protocol, the rows' purpose, its own link port). The partner
   checks its policy accepts the protocol, starts its side and answers with its port and width.
2. Both sides run the protocol. Its receiver is the active party; with ``mode = 'both'`` it shares the result, so
   the partner learns the intersection too (and with ``'active'`` learns nothing but the active party's count).
3. The coordinator sends ``align.engine_result``; the partner ends its side and answers with its count.

The bytes of the link are measured where they cross, by the active party's relays, and the ledger gets one entry
per direction (kind ``align.engine.PROTOCOL``).

Each side's library runs in a child process of its party, its logs in a file beside its IDs: a crash of the
library's link costs the child, not the party, and its logs do not fill the party's output.

The wheel pins ``numpy<2`` and pulls JAX for SPU's compiler, neither of which its PSI uses; vflo loads the two
native modules it needs (``libspu`` for the link, ``libpsi``) without importing the rest, so it is installed with
``pip install --no-deps spu==0.9.5``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import re
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv as pa_csv

from vflo.align.ids import check_unique, tagged_array
from vflo.align.spu_side import PROTOCOLS, UNBALANCED
from vflo.align.spu_side import libraries as _libraries
from vflo.errors import ConfigError, ProtocolError
from vflo.helpers import isolated_command

logger = logging.getLogger(__name__)

TRACE = re.compile(r"Trace has been written to (/tmp/psi_[A-Za-z0-9_-]+\.trace)")


def missing() -> str:
    """Why the library cannot be used here, or "" when it can."""
    try:
        _libraries()
    except ConfigError as exc:
        return str(exc)
    return ""


@dataclass
class Side:
    """One party's side of one intersection: its link's two entries (where it listens and where it dials its peer:
    Unix sockets in its own folder, where vflo's relays (:class:`vflo.align.link_relay.LinkRelays`) meet it), the
    protocol, who receives the result, and whether the other learns it too.

    The library runs in a child process of the party (:func:`child`). Its link (brpc) can abort the whole process
    when it tears down, after the result is written; in a child, that costs the child only, and the party keeps
    serving. The child's logs go to a file beside its IDs, not to the party's output; the end of it is in the
    error when a side fails."""

    rank: int
    own: str
    peer: str
    protocol: str
    broadcast: bool
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
        self._check_private(prepared)
        order = {**asdict(self), "source": str(prepared.source), "result": str(prepared.result),
                 "done": str(prepared.done)}
        # The child runs in the side's own folder: a path relative to where the party runs (its alignments folder)
        # is made absolute here.
        if self.cache:
            order["cache"] = str(Path(self.cache).resolve())
        code = _run_child(prepared, order, self.timeout_s)
        if not prepared.done.is_file():
            raise ProtocolError(f"the PSI library's side (rank {self.rank}, {self.protocol}) ended with exit "
                                f"status {code} before its result; the end of its log:\n{prepared.log_tail()}")
        if code not in (None, 0):
            logger.warning("the PSI library's side exited with status %s after writing its result (its link's "
                           "teardown); the result stands", code)


    def _check_private(self, prepared: Prepared) -> None:
        """The library takes plain text on any port it serves, TLS or not: it listens and dials only on Unix
        sockets in the side's own folder (which only this user may enter), never on the network."""
        folder = prepared.folder.resolve()
        for what, address in (("listens", self.own), ("dials", self.peer)):
            path = Path(address.removeprefix("unix:"))
            if not address.startswith("unix:") or not path.is_absolute() or path.parent.resolve() != folder:
                raise ConfigError(f"the PSI library's side {what} at {address!r}, but it may only use a Unix socket "
                                  f"in its own folder (unix:{folder}/NAME): vflo's relays carry its link "
                                  "(vflo.align.link_relay)")


#: What a side's child process runs (:func:`vflo.align.spu_side.child`, its order on standard input).
CHILD = "from vflo.align.spu_side import child; child()"
#: How long past its own timeout a side's child may run before it is stopped.
CHILD_GRACE_S = 30.0


def start_child(folder: Path, log: Path) -> subprocess.Popen[bytes]:
    """A side's child process, started before its order is known: it loads the library and then waits for the
    order on its standard input (:func:`vflo.align.spu_side.child`), so that its start overlaps the party's other
    work."""
    env = dict(os.environ)
    # The library's working folders (the party's IDs sorted, its buckets) go into the side's folder, removed with
    # it: the library leaves them behind, in /tmp otherwise.
    env["TMPDIR"] = str(folder)
    # In isolated mode, as every helper process of a party: nothing in a working folder, PYTHONPATH or the user's
    # site can stand in for a module the child imports; it finds vflo where this process found it.
    with log.open("wb") as out:
        return subprocess.Popen(isolated_command(CHILD), stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.STDOUT, cwd=folder, env=env)


def _stop_child(process: subprocess.Popen[bytes]) -> None:
    """End a side's child that got no order (its standard input closed, it leaves), or one still running."""
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _run_child(prepared: Prepared, order: dict[str, Any], timeout_s: float) -> int | None:
    """Hand ``order`` to ``prepared``'s child (:func:`vflo.align.spu_side.child`) and wait until it has written its
    result or ended (killed if it outlives ``timeout_s``): its exit status, or None while it still closes its link
    (briefly; :class:`Prepared` waits for that, and removes the library's trace, when it is done with)."""
    process = prepared.take_child()
    try:
        assert process.stdin is not None
        process.stdin.write(json.dumps(order).encode("utf-8"))
        process.stdin.close()
    except OSError:  # the child ended before its order (its log says why): its status below
        pass
    deadline = time.monotonic() + timeout_s + CHILD_GRACE_S
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return process.wait(timeout=0.005)
            if prepared.done.is_file():
                return None
        raise ProtocolError(
            f"the PSI library's side did not end within {timeout_s + CHILD_GRACE_S:.0f} s, so it was stopped: most "
            "often the two parties' sides never met. Check that each party reaches the other at the port its "
            "[policy] psi_link gives (open it to the other party's host; port 0 picks any port, which a firewall "
            "must then allow), or use vflo's own PSI ([alignment] engine = 'vflo'), which needs no other port. The "
            f"end of its log:\n{prepared.log_tail()}")
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait()
        raise


class Prepared:
    """A side's IDs written where the library reads them, and where it writes the intersection (a temporary
    folder, removed when the side ends), with the side's child process (started at once, waiting for its order),
    its log and its done mark."""

    def __init__(self, names: pa.Array | list[str] | None = None, *, ids: np.ndarray | None = None,
                 whose: str = "this party's") -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="vflo-psi-")
        self.folder = Path(self._folder.name)
        self.source, self.result = self.folder / "ids.csv", self.folder / "shared.csv"
        self.log, self.done = self.folder / "library.log", self.folder / "done"
        # The child first, so that its start overlaps the IDs' tagging and writing.
        self._child: subprocess.Popen[bytes] | None = start_child(self.folder, self.log)
        # A side never run (its party failed first) still ends its child, here or when this is collected.
        self._stop = weakref.finalize(self, _stop_child, self._child)
        try:
            if ids is not None:  # tagged and checked here (:func:`prepare`)
                names = tagged_array(ids)
                check_unique(names, whose, ids=ids)
            # An Arrow string array (tagged_array gives one): written, read back and compared without a Python
            # object per ID.
            self.names = names if isinstance(names, pa.Array) else pa.array(names or [], type=pa.string())
            self._write()
        except BaseException:
            self.__exit__()
            raise

    def _write(self) -> None:
        # Most IDs need no quoting; those that hold a comma, a quote or a line break are written by the csv module.
        # The search runs over the text's bytes (a slice's neighbours too, which at worst quotes needlessly): a
        # tenth of the time of a pattern over each ID.
        data = self.names.buffers()[2] if len(self.names) else None
        raw = bytes(data) if data is not None else b""
        self.quoted = any(special in raw for special in (b",", b'"', b"\r", b"\n"))
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

    def take_child(self) -> subprocess.Popen[bytes]:
        """The side's child process, for the one run this preparation serves (it is still ended with this)."""
        if self._child is None:
            raise ProtocolError("a PSI side's IDs serve one run, while they are open; prepare them again for another")
        child, self._child = self._child, None
        return child

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
        mask: np.ndarray = pc.is_in(self.names, value_set=self.found().cast(self.names.type)).to_numpy(
            zero_copy_only=False)
        return mask

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *_: object) -> None:
        self._child = None
        self._stop()  # a child past its result closes its link first (at most 5 s; then it is stopped)
        self.remove_trace()
        self._folder.cleanup()


def prepare(ids: np.ndarray, whose: str = "this party's") -> Prepared:
    """``ids`` tagged, checked unique and written for the library (a repeated ID is a
    :class:`~vflo.errors.DataError`)."""
    return Prepared(ids=ids, whose=whose)


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
