"""A party's helper processes: more cores for its own heavy work (PSI's blinding, SecureBoost's bin sums and
decryption).

A helper is a fresh Python running :func:`serve`, started rather than forked: a fork of a process running gRPC's
or PyTorch's threads may hang (a forked PSI worker of a party serving over gRPC was seen waiting forever on a
lock its parent's threads held), and ``multiprocessing``'s spawn re-runs the caller's script, which breaks
scripts without an ``if __name__ == "__main__"`` guard. It reads calls from its stdin and writes their results
to its stdout, length-prefixed pickles between a party and its own children, and runs only the functions
:data:`CALLS` names. It ends when its stdin closes.

A helper runs in Python's isolated mode (:func:`isolated_command`): neither the party's working folder nor
``PYTHONPATH`` nor the user's site folder is on its import path, so a module planted there (a ``pickle.py`` in
the folder a party was started from) cannot run inside it. Only vflo's own folder is added, after the standard
library.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from vflo.errors import VfloError

_LENGTH = 8

#: What a helper may be asked to run: name -> "module:function" (imported in the helper when first called).
CALLS: dict[str, str] = {
    "psi.hash_blind": "vflo.align.psi:_hash_blind_chunk", "psi.blind": "vflo.align.psi:_blind_chunk",
    "sb.start_summer": "vflo.trees.crypto:_start_summer", "sb.hold": "vflo.trees.crypto:_hold",
    "sb.sum_rows": "vflo.trees.crypto:_sum_rows", "sb.start_decrypter": "vflo.trees.crypto:_start_decrypter",
    "sb.decrypt_pieces": "vflo.trees.crypto:_decrypt_pieces",
}


class HelperError(VfloError):
    """A helper process failed or ended (its error, or how it ended, is in the message)."""


def _write(stream: IO[bytes], value: Any) -> None:
    blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(len(blob).to_bytes(_LENGTH, "little") + blob)
    stream.flush()


def _read(stream: IO[bytes]) -> Any:
    head = stream.read(_LENGTH)
    if len(head) < _LENGTH:
        raise EOFError
    size = int.from_bytes(head, "little")
    blob = stream.read(size)
    if len(blob) < size:
        raise EOFError
    return pickle.loads(blob)


def isolated_command(code: str) -> list[str]:
    """The command that runs ``code`` in a child Python in isolated mode (``-I``: no working folder, no
    ``PYTHONPATH``, no user site on its path), with the folder vflo itself is imported from appended, so that a
    child of a source checkout finds vflo as an installed one does. Appended, not put first: nothing in that
    folder can then stand in for a module of the standard library."""
    root = str(Path(__file__).resolve().parents[1])
    return [sys.executable, "-I", "-c", f"import sys; sys.path.append({root!r}); {code}"]


class Helper:
    """One helper process; :meth:`send` a call, then :meth:`receive` its result (one call at a time)."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self._process = subprocess.Popen(isolated_command("from vflo.helpers import serve; serve()"),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def send(self, name: str, *args: Any) -> None:
        assert self._process.stdin is not None
        try:
            _write(self._process.stdin, (name, args))
        except (BrokenPipeError, OSError) as exc:
            raise HelperError(f"a helper process ended (exit code {self._process.poll()}) before {name}") from exc

    def receive(self) -> Any:
        assert self._process.stdout is not None
        try:
            ok, value = _read(self._process.stdout)
        except EOFError:
            raise HelperError(f"a helper process ended (exit code {self._process.wait(timeout=10)}) before "
                              "answering") from None
        if not ok:
            raise HelperError(f"a helper process failed: {value}")
        return value

    def alive(self) -> bool:
        return self._process.poll() is None

    def call(self, name: str, *args: Any) -> Any:
        self.send(name, *args)
        return self.receive()

    def close(self) -> None:
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        if self._process.stdout is not None:
            self._process.stdout.close()


class HelperPool:
    """``size`` helpers: each given the same call (:meth:`broadcast`, as a stateful helper is set up), or sharing
    out a job's chunks (``name(*head, chunk)`` for each), a contiguous run of chunks each; a job is submitted, and
    its results collected later. One job at a time is out: submitting another first collects the one out (a
    helper busy on one job reads no other, so sending it more could deadlock both pipes)."""

    def __init__(self, size: int) -> None:
        self.helpers: list[Helper] = []
        try:
            self.helpers = [Helper() for _ in range(size)]
        except BaseException:
            self.close()
            raise
        self._out: tuple[int, list[int]] | None = None  # the job out, and how many chunks each helper took
        self._done: dict[int, list[Any]] = {}
        self._jobs = 0

    def broadcast(self, name: str, *args: Any) -> list[Any]:
        """``name(*args)`` in every helper (each then holds what it set up); their results, in order."""
        self._collect()
        for helper in self.helpers:
            helper.send(name, *args)
        return [helper.receive() for helper in self.helpers]

    def submit(self, name: str, head: Sequence[Any], chunks: Sequence[Any]) -> int:
        self._collect()
        job, self._jobs = self._jobs, self._jobs + 1
        per = -(-len(chunks) // len(self.helpers))
        counts = []
        for i, helper in enumerate(self.helpers):
            mine = list(chunks[i * per:(i + 1) * per])
            counts.append(len(mine))
            if mine:
                helper.send("map", name, tuple(head), mine)
        self._out = (job, counts)
        return job

    def result(self, job: int) -> list[Any]:
        """The job's results, one per chunk, in order."""
        if self._out is not None and self._out[0] == job:
            self._collect()
        return self._done.pop(job)

    def _collect(self) -> None:
        if self._out is None:
            return
        job, counts = self._out
        self._out = None
        results: list[Any] = []
        for helper, count in zip(self.helpers, counts, strict=True):
            if count:
                results += helper.receive()
        self._done[job] = results

    def close(self) -> None:
        for helper in self.helpers:
            helper.close()
        self.helpers = []

    def __enter__(self) -> HelperPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SHARED: dict[int, HelperPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(size: int) -> HelperPool:
    """This process's pool of ``size`` stateless helpers, started on first use and kept (starting one costs a
    third of a second; a party that aligns once usually aligns again), ended when the process exits. Callers
    hold :data:`SHARED_USE` while they use it."""
    with _SHARED_LOCK:
        pool = _SHARED.get(size)
        if pool is None or not all(h.alive() for h in pool.helpers):
            if pool is not None:
                pool.close()
            pool = _SHARED[size] = HelperPool(size)
        return pool


#: Held while a shared pool is in use: one job at a time per pool (a party serves one message at a time).
SHARED_USE = threading.RLock()


@atexit.register
def _close_shared() -> None:
    for pool in _SHARED.values():
        pool.close()
    _SHARED.clear()


def _resolve(name: str) -> Any:
    module, _, function = CALLS[name].partition(":")
    return getattr(importlib.import_module(module), function)


def _map(name: str, head: tuple[Any, ...], chunks: list[Any]) -> list[Any]:
    fn = _resolve(name)
    return [fn(*head, chunk) for chunk in chunks]


def serve() -> None:
    """The helper's loop: a call in, its result out, until the caller closes the pipe."""
    inp = sys.stdin.buffer
    # Results go out on a copy of the pipe; descriptor 1 then points at stderr, so that anything printed, by
    # Python or by a library's C++ logging (HEU's), cannot corrupt the results' stream.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    while True:
        try:
            name, args = _read(inp)
        except EOFError:
            return
        try:
            _write(out, (True, _map(*args) if name == "map" else _resolve(name)(*args)))
        except Exception as exc:
            _write(out, (False, f"{name}: {type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    serve()
