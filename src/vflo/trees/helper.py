"""A party's helper processes: more cores for its own homomorphic work (bin sums, decryption), which HEU does on
one thread here.

A helper is ``python -m vflo.trees.helper``, started afresh rather than forked (a fork of a process running
PyTorch's or gRPC's threads may hang) and without re-running the caller's script (as ``multiprocessing``'s
spawn does, which breaks scripts with no ``if __name__ == "__main__"`` guard). It reads calls from its stdin
and writes their results to its stdout, length-prefixed pickles between a party and its own children, and runs
only the functions :data:`vflo.trees.crypto.HELPER_CALLS` names. It ends when its stdin closes.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from vflo.errors import VfloError

_LENGTH = 8


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


class Helper:
    """One helper process; :meth:`send` a call, then :meth:`receive` its result (one call at a time)."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # where vflo is imported from, installed or not
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
               "OMP_NUM_THREADS": "1"}
        self._process = subprocess.Popen([sys.executable, "-m", "vflo.trees.helper"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=env)

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


def serve() -> None:
    """The helper's loop: a call in, its result out, until the caller closes the pipe."""
    from vflo.trees.crypto import HELPER_CALLS

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
            _write(out, (True, HELPER_CALLS[name](*args)))
        except Exception as exc:
            _write(out, (False, f"{name}: {type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    serve()
