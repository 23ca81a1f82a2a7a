"""Where a party's data-parallel work runs: its PSI blinding and hashing, and the blocks of rows its encoders and
classifiers score (:func:`in_blocks`).

One interface, two kinds:

- ``processes`` (the default): this host's cores. Blinding goes to the party's helper processes
  (:mod:`vflo.helpers`), scoring to worker threads of its own process.
- ``ray``: a Ray cluster the party runs (``address``: ``""`` starts one on this host, ``"auto"`` joins the one
  this host belongs to, ``"ray://HOST:PORT"`` a remote one). Blinding and scoring go to Ray tasks; what they
  compute is the same, bit for bit (each block of rows scored on one thread, as locally).

A party sets it in its own config (``[executor]`` in PARTY.toml or ``[active.executor]`` in deploy.toml); it is
the party's process's setting, as its cores are. Nothing here crosses to another party: the cluster is the
party's own, and it sees only what the party computes on anyway.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from vflo.blocks import BLOCK, run_here
from vflo.errors import ConfigError

logger = logging.getLogger(__name__)


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


class Executor:
    """This host's cores: helper processes for named calls, threads for row blocks."""

    kind = "processes"

    def __init__(self, workers: int = 0) -> None:
        self.configured = workers

    @property
    def workers(self) -> int:
        return self.configured or (os.cpu_count() or 1)

    def submit(self, name: str, head: Sequence[Any], chunks: Sequence[Any], *,
               workers: int) -> Callable[[], list[Any]]:
        """Start ``name(*head, chunk)`` (a call :data:`vflo.helpers.CALLS` names) for every chunk over ``workers``;
        call the result for their results, in order. The caller holds :data:`vflo.helpers.SHARED_USE`."""
        from vflo.helpers import shared_pool

        pool = shared_pool(workers)
        job = pool.submit(name, head, chunks)
        return lambda: pool.result(job)

    def rows(self, fn: Callable[[np.ndarray], Any], X: np.ndarray, width: int, dtype: Any) -> np.ndarray | None:
        """``fn`` over blocks of ``X``'s rows elsewhere, or None to run them in this process's threads."""
        return None

    def close(self) -> None:
        return None


class RayExecutor(Executor):
    """A Ray cluster's CPUs: named calls and row blocks as Ray tasks."""

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
                options |= {"num_cpus": workers or (os.cpu_count() or 1), "object_store_memory": 256 * 2**20}
            ray.init(**options)
            self._started = True
        self._map = ray.remote(num_cpus=1)(_ray_map)
        self._blocks = ray.remote(num_cpus=1)(_ray_blocks)

    @property
    def workers(self) -> int:
        return self.configured or max(1, int(self._ray.cluster_resources().get("CPU", 1)))  # type: ignore[no-untyped-call]

    def submit(self, name: str, head: Sequence[Any], chunks: Sequence[Any], *,
               workers: int) -> Callable[[], list[Any]]:
        from vflo.helpers import CALLS

        if name not in CALLS:
            raise ConfigError(f"no executor call named {name!r}")
        per = -(-len(chunks) // workers) if chunks else 1
        head_ref = self._ray.put(tuple(head))
        refs = [self._map.remote(name, head_ref, list(chunks[i:i + per])) for i in range(0, len(chunks), per)]
        return lambda: [r for part in self._ray.get(refs) for r in part]

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


def _ray_map(name: str, head: tuple[Any, ...], chunks: list[Any]) -> list[Any]:
    from vflo.helpers import _map

    return _map(name, head, chunks)


def _ray_blocks(fn: Callable[[np.ndarray], Any], X: np.ndarray, width: int, dtype: str) -> np.ndarray:
    import os as _os

    _os.environ["OMP_NUM_THREADS"] = "1"  # one thread per task: its blocks as this process would score them
    return run_here(fn, X, width, np.dtype(dtype))


class _Current:
    """This process's executor, set once by its party's config and read by whatever runs bulk work."""

    def __init__(self) -> None:
        self.executor: Executor | None = None
        self.lock = threading.Lock()


_CURRENT = _Current()


def current() -> Executor:
    """This process's executor (this host's cores unless :func:`configure` set another)."""
    with _CURRENT.lock:
        if _CURRENT.executor is None:
            _CURRENT.executor = Executor()
        return _CURRENT.executor


def configure(config: ExecutorConfig | None) -> Executor:
    """Make ``config`` this process's executor (None: this host's cores); the one it replaces is closed."""
    if config is None or config.kind == "processes":
        made = Executor(0 if config is None else config.workers)
    else:
        made = RayExecutor(config.address, config.workers)
    with _CURRENT.lock:
        old, _CURRENT.executor = _CURRENT.executor, made
    if old is not None and old is not made:
        old.close()
    if made.kind == "ray":
        logger.info("this party's bulk work runs on Ray: %d workers", made.workers)
    return made


def in_blocks(fn: Callable[[np.ndarray], Any], X: np.ndarray, width: int, dtype: Any) -> np.ndarray:
    """``fn`` applied to ``X`` a block of rows at a time (:mod:`vflo.blocks`): on the party's Ray cluster where its
    ``[executor]`` says so, else over worker threads of this process; the same numbers either way."""
    elsewhere = current().rows(fn, X, width, dtype)
    if elsewhere is not None:
        return elsewhere.astype(dtype, copy=False)
    return run_here(fn, X, width, dtype)
