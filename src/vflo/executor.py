"""Where a party's data-parallel work runs: its PSI blinding and hashing, SecureBoost's bin sums and decryption,
and the blocks of rows its encoders and classifiers score (:func:`in_blocks`).

One interface, two kinds:

- ``processes`` (the default): this host's cores. Blinding, bin sums and decryption go to the party's helper
  processes (:mod:`vflo.helpers`), scoring to worker threads of its own process.
- ``ray``: a Ray cluster the party runs (``address``: ``""`` starts one on this host, ``"auto"`` joins the one
  this host belongs to, ``"ray://HOST:PORT"`` a remote one). Blinding and scoring go to Ray tasks, bin sums and
  decryption to Ray actors (each holds a tree's ciphertexts, or the key, as a helper process does); what they
  compute is the same, bit for bit (each block of rows scored on one thread, as locally).

What a worker may run is what :func:`vflo.helpers.call` registered, wherever it runs.

A party sets it in its own config (``[executor]`` in PARTY.toml or ``[active.executor]`` in deploy.toml). It is the
party's setting, not its process's: a party's node makes the party's executor current (:func:`using`) around each
message it handles, and the coordinating party around its own training and scoring, so parties that share a
process (in simulation) each use their own. :func:`configure` sets the process's default, for code run outside
any party. Nothing here crosses to another party: the cluster is the party's own, and it sees only what the party
computes on anyway (with SecureBoost, the label holder's secret key reaches its own decrypting actors in Ray's task
messages: use Ray's TLS for a cluster of several hosts).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from vflo.blocks import BLOCK, run_here
from vflo.errors import ConfigError
from vflo.helpers import HelperError, HelperPool, Target, perform, perform_map, registration, shared_pool

logger = logging.getLogger(__name__)

#: An argument this large goes once into a Ray cluster's object store for all the actors it is broadcast to.
SHARE_FROM = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ExecutorConfig:
    """``kind``: ``"processes"`` (this host's cores) or ``"ray"``; ``address``: the Ray cluster (see the module);
    ``workers``: how many tasks to split a job into (0: every core here, or every CPU of the cluster)."""

    kind: Literal["processes", "ray"] = "processes"
    address: str = ""
    workers: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("processes", "ray"):
            raise ConfigError(f"[executor] kind {self.kind!r}: choose 'processes' or 'ray'")
        if self.workers < 0:
            raise ConfigError(f"[executor] workers must be 0 (every core) or more, got {self.workers}")
        if self.kind == "processes" and self.address:
            raise ConfigError("[executor] address names a Ray cluster: set kind = 'ray' too, or leave address out")


class WorkerGroup(Protocol):
    """Workers that keep state between calls (a helper process each, or a Ray actor each): set each up with the
    same call (:meth:`broadcast`), then give each its own share (:meth:`send`, then :meth:`receive`). Every call
    is a registered one (:func:`vflo.helpers.call`); :meth:`close` ends the workers and what they hold."""

    @property
    def size(self) -> int: ...

    def broadcast(self, fn: Callable[..., Any], *args: Any) -> list[Any]: ...

    def send(self, i: int, fn: Callable[..., Any], *args: Any) -> None: ...

    def receive(self, i: int) -> Any: ...

    def close(self) -> None: ...


def cores() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Executor:
    """This host's cores: helper processes for registered calls, threads for row blocks."""

    kind = "processes"

    def __init__(self, workers: int = 0) -> None:
        self.configured = workers

    @property
    def workers(self) -> int:
        return self.configured or cores()

    def submit(self, fn: Callable[..., Any], head: Sequence[Any], chunks: Sequence[Any], *,
               workers: int) -> Callable[[], list[Any]]:
        """Start ``fn(*head, chunk)`` (a registered call: :func:`vflo.helpers.call`) for every chunk over
        ``workers``; call the result for their results, in order. The caller holds :data:`vflo.helpers.SHARED_USE`."""
        registration(fn)
        pool = shared_pool(workers)
        job = pool.submit(fn, head, chunks)
        return lambda: pool.result(job)

    def group(self, size: int) -> WorkerGroup:
        """``size`` workers of this party's own, each keeping what it is given (:class:`WorkerGroup`): helper
        processes of its own, not the shared ones (what they hold, a key among it, ends with them)."""
        return HelperPool(size)

    def rows(self, fn: Callable[[np.ndarray], Any], X: np.ndarray, width: int, dtype: Any) -> np.ndarray | None:
        """``fn`` over blocks of ``X``'s rows elsewhere, or None to run them in this process's threads."""
        return None

    def close(self) -> None:
        return None


class RayExecutor(Executor):
    """A Ray cluster's CPUs: registered calls and row blocks as Ray tasks, stateful workers as Ray actors."""

    kind = "ray"

    def __init__(self, address: str = "", workers: int = 0) -> None:
        super().__init__(workers)
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("[executor] kind = 'ray' needs Ray installed here: pip install 'ray>=2.9' (or "
                              "kind = 'processes')") from exc
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            # The party asks for no GPUs; Ray is told to leave the devices a party's environment names alone.
            os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            options: dict[str, Any] = {"ignore_reinit_error": True, "include_dashboard": False,
                                       "log_to_driver": False, "logging_level": logging.WARNING}
            if address:
                options["address"] = address
            else:  # a cluster of this host alone, sized as asked
                options |= {"num_cpus": workers or cores(), "object_store_memory": 256 * 2**20}
            ray.init(**options)
            self._started = True
        self._map = ray.remote(num_cpus=1)(_ray_map)
        self._blocks = ray.remote(num_cpus=1)(_ray_blocks)
        # An actor needs a free CPU to be placed but holds none while it lives (Ray's default for actors): the
        # actors of parties sharing one cluster in simulation never wait for each other's to end.
        self._actor = ray.remote(_RayWorker)

    @property
    def workers(self) -> int:
        return self.configured or max(1, int(self._ray.cluster_resources().get("CPU", 1)))  # type: ignore[no-untyped-call]  # ray's API is untyped

    def submit(self, fn: Callable[..., Any], head: Sequence[Any], chunks: Sequence[Any], *,
               workers: int) -> Callable[[], list[Any]]:
        target = registration(fn).target
        per = -(-len(chunks) // workers) if chunks else 1
        head_ref = self._ray.put(tuple(head))
        refs = [self._map.remote(target, head_ref, list(chunks[i:i + per])) for i in range(0, len(chunks), per)]
        return lambda: [r for part in self._ray.get(refs) for r in part]

    def group(self, size: int) -> WorkerGroup:
        return _RayGroup(self._ray, [self._actor.remote() for _ in range(size)])

    def rows(self, fn: Callable[[np.ndarray], Any], X: np.ndarray, width: int, dtype: Any) -> np.ndarray | None:
        blocks = -(-X.shape[0] // BLOCK)
        if blocks < 2:
            return None
        per = -(-blocks // self.workers) * BLOCK  # whole blocks per task: the same blocks as in this process
        fn_ref = self._ray.put(fn)
        refs = [self._blocks.remote(fn_ref, X[i:i + per], width, np.dtype(dtype).str) for i in range(0, len(X), per)]
        return np.concatenate(self._ray.get(refs)) if refs else np.empty((0, width), dtype=dtype)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


class _RayWorker:
    """A Ray actor running registered calls, with a state of its own between them (as a helper process has)."""

    def __init__(self) -> None:
        os.environ["OMP_NUM_THREADS"] = "1"
        self.state: dict[str, Any] = {}

    def call(self, target: Target, *args: Any) -> Any:
        return perform(target, args, self.state)


class _RayGroup:
    """Ray actors as a :class:`WorkerGroup`."""

    def __init__(self, ray: Any, actors: list[Any]) -> None:
        self._ray = ray
        self._actors = actors
        self._pending: list[Any] = [None] * len(actors)

    @property
    def size(self) -> int:
        return len(self._actors)

    def _get(self, refs: Any) -> Any:
        try:
            return self._ray.get(refs)
        except self._ray.exceptions.RayError as exc:
            raise HelperError(f"a Ray worker of this party failed: {exc}") from exc

    def broadcast(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        target = registration(fn).target
        # A large argument (a tree's ciphertexts) goes into the object store once, not once per actor.
        shared = tuple(self._ray.put(a) if _nbytes(a) >= SHARE_FROM else a for a in args)
        out: list[Any] = self._get([actor.call.remote(target, *shared) for actor in self._actors])
        return out

    def send(self, i: int, fn: Callable[..., Any], *args: Any) -> None:
        self._pending[i] = self._actors[i].call.remote(registration(fn).target, *args)

    def receive(self, i: int) -> Any:
        ref, self._pending[i] = self._pending[i], None
        if ref is None:
            raise HelperError(f"nothing was sent to Ray worker {i} to receive")
        return self._get(ref)

    def close(self) -> None:
        for actor in self._actors:
            with contextlib.suppress(Exception):  # an actor already gone, or its cluster shut down
                self._ray.kill(actor)
        self._actors, self._pending = [], []


def _nbytes(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return len(value)
    return int(value.nbytes) if isinstance(value, np.ndarray) else 0


def _ray_map(target: Target, head: tuple[Any, ...], chunks: list[Any]) -> list[Any]:
    return perform_map(target, head, chunks, {})


def _ray_blocks(fn: Callable[[np.ndarray], Any], X: np.ndarray, width: int, dtype: str) -> np.ndarray:
    import os as _os

    _os.environ["OMP_NUM_THREADS"] = "1"  # one thread per task: its blocks as this process would score them
    return run_here(fn, X, width, np.dtype(dtype))


def make(config: ExecutorConfig | None) -> Executor:
    """A new executor as ``config`` says (None: this host's cores); whoever makes one closes it."""
    if config is None or config.kind == "processes":
        return Executor(0 if config is None else config.workers)
    made = RayExecutor(config.address, config.workers)
    logger.info("this party's bulk work runs on Ray: %d workers", made.workers)
    return made


class _Default:
    """The process's executor, for code run outside any party's (:func:`configure`)."""

    def __init__(self) -> None:
        self.executor: Executor | None = None
        self.lock = threading.Lock()


_DEFAULT = _Default()
#: The party's executor, where a party's code runs (:func:`using`): a context variable, so each thread, and each
#: party's handler however nested in another's (as calls are in one process), sees its own party's.
_PARTY: ContextVar[Executor | None] = ContextVar("vflo_party_executor", default=None)


def current() -> Executor:
    """The executor of the party whose code runs here (:func:`using`), else the process's (this host's cores
    unless :func:`configure` set another)."""
    party = _PARTY.get()
    if party is not None:
        return party
    with _DEFAULT.lock:
        if _DEFAULT.executor is None:
            _DEFAULT.executor = Executor()
        return _DEFAULT.executor


@contextlib.contextmanager
def using(executor: Executor | None) -> Iterator[Executor]:
    """``executor`` as the current one (:func:`current`) for the code run inside, in this thread and context
    alone: a party's node enters it around each message it handles. None changes nothing (the current one
    stays). The executor is not closed on leaving: its owner closes it."""
    if executor is None:
        yield current()
        return
    token = _PARTY.set(executor)
    try:
        yield executor
    finally:
        _PARTY.reset(token)


def configure(config: ExecutorConfig | None) -> Executor:
    """Make ``config`` the process's default executor (None: this host's cores), for code run outside any
    party's :func:`using`; the one it replaces is closed."""
    made = make(config)
    with _DEFAULT.lock:
        old, _DEFAULT.executor = _DEFAULT.executor, made
    if old is not None and old is not made:
        old.close()
    return made


def in_blocks(fn: Callable[[np.ndarray], Any], X: np.ndarray, width: int, dtype: Any) -> np.ndarray:
    """``fn`` applied to ``X`` a block of rows at a time (:mod:`vflo.blocks`): on the party's Ray cluster where its
    ``[executor]`` says so, else over worker threads of this process; the same numbers either way."""
    elsewhere = current().rows(fn, X, width, dtype)
    if elsewhere is not None:
        return elsewhere.astype(dtype, copy=False)
    return run_here(fn, X, width, dtype)
