"""The fit loop: seeded mini-batches, Adam, early stopping on a validation split, callbacks, history.

:func:`run_epochs` owns the epoch and batch structure and knows nothing about where
the loss comes from, so a model trained in one process (:func:`fit_module`) and a
SplitNN whose forward and backward passes cross the transport walk the same batches
in the same order for the same seed.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from vflo.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How a network is trained. Defaults follow APC-VFL's Appendix B."""

    lr: float = 1e-3
    batch_size: int = 128
    max_epochs: int = 200
    patience: int = 10
    min_delta: float = 0.0
    validation_fraction: float = 0.1
    weight_decay: float = 0.0
    restore_best: bool = True
    # "patience": stop after `patience` epochs without improvement of at least min_delta (APC-VFL).
    # "plateau": stop once the loss's relative change stays below `plateau` for `patience` epochs (RAP).
    stop: Literal["patience", "plateau"] = "patience"
    plateau: float = 1e-4

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ConfigError(f"train.lr must be positive, got {self.lr}")
        if self.batch_size < 1:
            raise ConfigError(f"train.batch_size must be at least 1, got {self.batch_size}")
        if self.max_epochs < 1:
            raise ConfigError(f"train.max_epochs must be at least 1, got {self.max_epochs}")
        if self.patience < 0:
            raise ConfigError(f"train.patience must be 0 (off) or more, got {self.patience}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ConfigError(f"train.validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if self.weight_decay < 0 or self.min_delta < 0:
            raise ConfigError("train.weight_decay and train.min_delta must be non-negative")


@dataclass
class History:
    """One dict per epoch (``epoch``, ``loss``, ``val_loss`` when validating, ``seconds``), plus why it stopped."""

    epochs: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int | None = None
    stopped_early: bool = False
    monitor: Literal["loss", "val_loss"] = "val_loss"

    def __getitem__(self, key: str) -> list[float]:
        return [e[key] for e in self.epochs if key in e]

    def __len__(self) -> int:
        return len(self.epochs)


class Callback:
    """Hook into training; return ``True`` from :meth:`on_epoch_end` to stop."""

    def on_epoch_end(self, epoch: int, logs: Mapping[str, float]) -> bool:
        return False


class EarlyStopping(Callback):
    """Stop when the monitored loss has not improved by ``min_delta`` for ``patience`` epochs."""

    def __init__(self, monitor: str, patience: int, min_delta: float, plateau: float | None = None) -> None:
        self.monitor = monitor
        self.patience = patience
        self.min_delta = min_delta
        self.plateau = plateau
        self.best = float("inf")
        self.best_epoch: int | None = None
        self.wait = 0
        self.flat = 0
        self.previous: float | None = None
        self.improved = False

    def on_epoch_end(self, epoch: int, logs: Mapping[str, float]) -> bool:
        value = logs[self.monitor]
        self.improved = value < self.best - self.min_delta
        if self.plateau is not None:
            # RAP's rule: the relative change of the loss stays below the threshold for `patience` epochs.
            if self.improved:
                self.best, self.best_epoch = value, epoch
            change = abs(value - self.previous) / max(abs(self.previous), 1e-12) if self.previous is not None else 1.0
            self.previous = value
            self.flat = self.flat + 1 if change < self.plateau else 0
            return self.patience > 0 and self.flat >= self.patience
        if self.improved:
            self.best, self.best_epoch, self.wait = value, epoch, 0
            return False
        self.wait += 1
        return self.patience > 0 and self.wait >= self.patience


def split_validation(n: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Positions for training and validation; no validation when it would hold no row or leave none."""
    n_val = round(n * fraction)
    if n_val < 1 or n - n_val < 1:
        return np.arange(n), np.empty(0, dtype=np.int64)
    perm = rng.permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def run_epochs(
    *, n_train: int, config: TrainConfig, rng: np.random.Generator,
    train_step: Callable[..., float], validate: Callable[[], float] | None = None,
    on_improve: Callable[[int], None] | None = None, callbacks: Sequence[Callback] = (),
    lookahead: bool = False,
) -> History:
    """The epoch loop: shuffle with ``rng``, call ``train_step`` per batch, validate, stop early.

    ``train_step`` receives positions into the training rows and returns the batch's mean loss.
    With ``lookahead`` it also receives the next batch's positions (None after the epoch's last),
    so it can start fetching that batch's inputs before it finishes this one.
    """
    if n_train < 1:
        raise ConfigError("no training rows: the scenario leaves this model nothing to learn from")
    monitor: Literal["loss", "val_loss"] = "val_loss" if validate is not None else "loss"
    stopper = EarlyStopping(monitor, config.patience, config.min_delta,
                            config.plateau if config.stop == "plateau" else None)
    history = History(monitor=monitor)
    bs = config.batch_size
    for epoch in range(config.max_epochs):
        started = time.perf_counter()
        perm = rng.permutation(n_train)
        total = 0.0
        for start in range(0, n_train, bs):
            idx = perm[start : start + bs]
            if lookahead:
                upcoming = perm[start + bs : start + 2 * bs] if start + bs < n_train else None
                total += train_step(idx, upcoming) * len(idx)
            else:
                total += train_step(idx) * len(idx)
        logs: dict[str, float] = {"epoch": float(epoch), "loss": total / n_train}
        if validate is not None:
            logs["val_loss"] = validate()
        logs["seconds"] = time.perf_counter() - started
        if not np.isfinite(logs[monitor]):
            logger.warning("training diverged at epoch %d (%s = %s); stopping", epoch, monitor, logs[monitor])
            history.epochs.append(logs)
            history.stopped_early = True
            break
        stop = stopper.on_epoch_end(epoch, logs)
        if stopper.improved and on_improve is not None:
            on_improve(epoch)
        history.epochs.append(logs)
        for cb in callbacks:
            stop = cb.on_epoch_end(epoch, logs) or stop
        if stop:
            history.stopped_early = True
            break
    history.best_epoch = stopper.best_epoch
    return history


LossFn = Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]


def adam(params: Iterable[torch.nn.Parameter], config: TrainConfig) -> torch.optim.Adam:
    """Adam with the config's learning rate and weight decay (betas 0.9, 0.999 as in Kingma & Ba)."""
    return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay, foreach=True)


def as_tensor(x: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor that owns its memory (party data arrays are read-only and must stay untouched)."""
    return torch.tensor(np.asarray(x), dtype=dtype)


def fit_module(
    module: nn.Module, loss_fn: LossFn, tensors: Mapping[str, torch.Tensor], *, config: TrainConfig,
    rng: np.random.Generator, callbacks: Sequence[Callback] = (),
) -> History:
    """Train ``module`` with Adam on row-aligned ``tensors``; ``loss_fn`` maps a batch to a scalar loss."""
    n = _rows(tensors)
    train_pos, val_pos = split_validation(n, config.validation_fraction, rng)
    train_t = {k: v[train_pos] for k, v in tensors.items()}
    val_t = {k: v[val_pos] for k, v in tensors.items()} if len(val_pos) else None
    optimizer = adam(module.parameters(), config)
    best_state: dict[str, Any] | None = None

    def train_step(idx: np.ndarray) -> float:
        batch = {k: v[idx] for k, v in train_t.items()}
        optimizer.zero_grad()
        loss = loss_fn(module, batch)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    def validate() -> float:
        assert val_t is not None
        module.eval()
        with torch.no_grad():
            value = float(loss_fn(module, val_t))
        module.train()
        return value

    def remember(_epoch: int) -> None:
        nonlocal best_state
        best_state = copy.deepcopy(module.state_dict())

    module.train()
    history = run_epochs(
        n_train=len(train_pos), config=config, rng=rng, train_step=train_step,
        validate=validate if val_t is not None else None,
        on_improve=remember if config.restore_best else None, callbacks=callbacks,
    )
    if config.restore_best and best_state is not None:
        module.load_state_dict(best_state)
    module.eval()
    return history


def _rows(tensors: Mapping[str, torch.Tensor]) -> int:
    sizes = {int(t.shape[0]) for t in tensors.values()}
    if len(sizes) != 1:
        raise ValueError(f"tensors must have the same number of rows, got {sorted(sizes)}")
    return sizes.pop()
