"""A party's helper processes: more cores for its own heavy work (PSI's blinding, SecureBoost's bin sums and
decryption).

A helper is a fresh Python running :func:`serve`, started rather than forked: a fork of a process running gRPC's
or PyTorch's threads may hang (a forked PSI worker of a party serving over gRPC was seen waiting forever on a
lock its parent's threads held), and ``multiprocessing``'s spawn re-runs the caller's script, which breaks
scripts without an ``if __name__ == "__main__"`` guard. It reads calls from its stdin and writes their results
to its stdout, length-prefixed pickles between a party and its own children, and runs only the functions that
their own modules register with :func:`call` (``@call("psi.blind")`` where the function is defined). A call names
its module and its registered name; the helper imports that module (vflo's own, nothing else) and runs what it
registered under that name, and refuses anything else. It ends when its stdin closes.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from vflo.errors import VfloError

_LENGTH = 8

F = TypeVar("F", bound=Callable[..., Any])

#: What a call is known by between a party and its helpers: its module and the name it is registered under.
Target = tuple[str, str]


class HelperError(VfloError):
    """A helper process failed or ended, or was asked for something that is not a helper call (the message says
    which, and what to do)."""


@dataclass(frozen=True)
class Registration:
    """The mark :func:`call` leaves on a function a helper may run. ``stateful``: the function takes the helper's
    own state (a dict kept for as long as the helper lives) as its first argument."""

    name: str
    module: str
    stateful: bool

    @property
    def target(self) -> Target:
        return (self.module, self.name)


_MARK = "__vflo_helper_call__"
_REGISTERED: dict[str, Callable[..., Any]] = {}


def call(name: str, *, stateful: bool = False) -> Callable[[F], F]:
    """Register the decorated function as the helper call ``name`` (``"psi.blind"``), in the module that defines
    it: a helper, or a Ray worker of the party's executor, may then run it, and nothing unregistered. With
    ``stateful``, it takes the worker's own state (a dict) first, as a set-up call leaves it for later ones."""

    def register(fn: F) -> F:
        mark = Registration(name=name, module=fn.__module__, stateful=stateful)
        known = _REGISTERED.get(name)
        if known is not None and (known.__module__, known.__qualname__) != (fn.__module__, fn.__qualname__):
            raise HelperError(f"helper call {name!r} is registered by {known.__module__}.{known.__qualname__} and "
                              f"again by {fn.__module__}.{fn.__qualname__}: give one of them another name")
        setattr(fn, _MARK, mark)
        _REGISTERED[name] = fn
        return fn

    return register


def registration(fn: Callable[..., Any]) -> Registration:
    """``fn``'s registration; a function not registered is refused (before anything is sent anywhere)."""
    mark = getattr(fn, _MARK, None)
    if not isinstance(mark, Registration):
        raise HelperError(f"{getattr(fn, '__qualname__', fn)!r} is not a helper call: register it with "
                          "@vflo.helpers.call(NAME) where it is defined")
    return mark


def _target(fn: Callable[..., Any] | Target) -> Target:
    return fn if isinstance(fn, tuple) else registration(fn).target


def resolve(target: Target) -> tuple[Callable[..., Any], Registration]:
    """The function ``target`` names, in the worker that runs it: its module (one of vflo's) imported, and the
    function it registered under that name; anything else is refused."""
    module, name = target
    if not (isinstance(module, str) and isinstance(name, str)) or module.split(".")[0] != "vflo":
        raise HelperError(f"{target!r}: a helper runs vflo's registered calls only")
    importlib.import_module(module)
    fn = _REGISTERED.get(name)
    mark = getattr(fn, _MARK, None)
    if fn is None or not isinstance(mark, Registration) or mark.module != module:
        raise HelperError(f"{module} registers no helper call named {name!r}: a helper runs only the functions "
                          "their modules register with @vflo.helpers.call")
    return fn, mark


def perform(target: Target, args: Sequence[Any], state: dict[str, Any]) -> Any:
    """The registered call ``target`` with ``args`` (and, for a stateful one, the worker's ``state`` first)."""
    fn, mark = resolve(target)
    return fn(state, *args) if mark.stateful else fn(*args)


def perform_map(target: Target, head: Sequence[Any], chunks: Sequence[Any], state: dict[str, Any]) -> list[Any]:
    """``target(*head, chunk)`` for each chunk, in order."""
    fn, mark = resolve(target)
    if mark.stateful:
        return [fn(state, *head, chunk) for chunk in chunks]
    return [fn(*head, chunk) for chunk in chunks]


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
    """One helper process; :meth:`send` a call, then :meth:`receive` its result (one call at a time). A call is
    a registered function (:func:`call`), or its :data:`Target`."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self._process = subprocess.Popen(isolated_command("from vflo.helpers import serve; serve()"),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def _send(self, message: tuple[str, Target, Any]) -> None:
        assert self._process.stdin is not None
        try:
            _write(self._process.stdin, message)
        except (BrokenPipeError, OSError) as exc:
            raise HelperError(f"a helper process ended (exit code {self._process.poll()}) before "
                              f"{message[1][1]}") from exc

    def send(self, fn: Callable[..., Any] | Target, *args: Any) -> None:
        self._send(("call", _target(fn), args))

    def send_map(self, fn: Callable[..., Any] | Target, head: Sequence[Any], chunks: Sequence[Any]) -> None:
        """``fn(*head, chunk)`` for each chunk; :meth:`receive` gives their results, in order."""
        self._send(("map", _target(fn), (tuple(head), list(chunks))))

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

    def call(self, fn: Callable[..., Any] | Target, *args: Any) -> Any:
        self.send(fn, *args)
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
    """``size`` helpers: each given the same call (:meth:`broadcast`, as a stateful helper is set up), one given
    its own (:meth:`send`, then :meth:`receive`), or sharing out a job's chunks (``fn(*head, chunk)`` for each), a
    contiguous run of chunks each; a job is submitted, and its results collected later. One job at a time is out:
    submitting another first collects the one out (a helper busy on one job reads no other, so sending it more
    could deadlock both pipes)."""

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

    @property
    def size(self) -> int:
        return len(self.helpers)

    def broadcast(self, fn: Callable[..., Any] | Target, *args: Any) -> list[Any]:
        """``fn(*args)`` in every helper (each then holds what it set up); their results, in order."""
        self._collect()
        for helper in self.helpers:
            helper.send(fn, *args)
        return [helper.receive() for helper in self.helpers]

    def send(self, i: int, fn: Callable[..., Any] | Target, *args: Any) -> None:
        """``fn(*args)`` in helper ``i`` alone; :meth:`receive` its result."""
        self._collect()
        self.helpers[i].send(fn, *args)

    def receive(self, i: int) -> Any:
        return self.helpers[i].receive()

    def submit(self, fn: Callable[..., Any] | Target, head: Sequence[Any], chunks: Sequence[Any]) -> int:
        self._collect()
        job, self._jobs = self._jobs, self._jobs + 1
        per = -(-len(chunks) // len(self.helpers))
        counts = []
        for i, helper in enumerate(self.helpers):
            mine = list(chunks[i * per:(i + 1) * per])
            counts.append(len(mine))
            if mine:
                helper.send_map(fn, head, mine)
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
    """This process's pool of ``size`` stateless helpers, started on first use and kept (each start is a fresh
    Python importing vflo's modules; a party that aligns once usually aligns again), ended when the process exits.
    Callers hold :data:`SHARED_USE` while they use it."""
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


def serve() -> None:
    """The helper's loop: a call in, its result out, until the caller closes the pipe."""
    inp = sys.stdin.buffer
    # Results go out on a copy of the pipe; descriptor 1 then points at stderr, so that anything printed, by
    # Python or by a library's C++ logging (HEU's), cannot corrupt the results' stream.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    state: dict[str, Any] = {}  # what stateful calls set up in this helper, for the later ones
    while True:
        try:
            kind, target, payload = _read(inp)
        except EOFError:
            return
        try:
            if kind == "map":
                head, chunks = payload
                result = perform_map(target, head, chunks, state)
            elif kind == "call":
                result = perform(target, payload, state)
            else:
                raise HelperError(f"unknown message {kind!r}: send 'call' or 'map'")
            _write(out, (True, result))
        except Exception as exc:
            named = target[1] if isinstance(target, tuple) and len(target) == 2 else repr(target)
            _write(out, (False, f"{named}: {type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    # As vflo.helpers, not __main__: the registrations its calls' modules make are vflo.helpers's.
    from vflo.helpers import serve as _serve

    _serve()
