"""The fit loop: seeded mini-batches, Adam, early stopping on a validation split, callbacks, history.

:class:`Trainer` owns the epoch and batch structure and knows nothing about where the loss
comes from, so a model trained in one process (:class:`ModuleTrainer`, :func:`fit_module`) and a
SplitNN or Entity Augmentation whose forward and backward passes cross the transport walk the
same batches in the same order for the same seed, and stop by the same rules.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from vflo.errors import ConfigError
from vflo.spill import Rows, Slotted, take

if TYPE_CHECKING:
    import torch
    from torch import nn

    LossFn = Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]
else:
    from vflo.lazy import torch

logger = logging.getLogger(__name__)

#: Validation rows scored in one pass; more are scored a block at a time.
VALIDATION_BLOCK = 65_536
#: What a model trains on: tensors, or rows gathered by position from an array, a matrix on disk or a target that
#: only some rows have (vflo.spill).
RowSource = Rows | Slotted


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
    # Save a checkpoint at every party after every this many epochs (0: never), where the run is given a
    # checkpoint folder (`vflo run --checkpoints DIR`); `--resume` continues from the last common one.
    checkpoint_every: int = 0
    # An epoch is at least this many batches: a table with fewer than min_batches x batch_size training rows is
    # cut into min_batches smaller batches. Epochs, patience and the epoch cap count passes over the rows, so
    # without this a table of a hundred people is one optimiser step an epoch: patience is then a few noisy steps,
    # and early stopping can keep a network that has not learned anything. 1: batch_size as given on every table
    # (the papers' settings).
    min_batches: int = 4
    # How an epoch picks its rows. "shuffle": every training row once, in a fresh order. "balanced": as many draws as
    # rows, with replacement, each class drawn equally often on average (a row's weight 1 / its class's count: torch's
    # WeightedRandomSampler as LASER-VFL's authors use it on Credit). Opt-in: in a federated model the batches are
    # named to every partner, and how often a person is drawn tells the partner their class (measured in
    # docs/reproductions/laser-vfl.md), so a coordinator that asks for it logs a warning. SplitNN's gradient_noise
    # refuses it (the draws would reveal what the noise protects); with label_epsilon the draws follow the randomised
    # labels, post-processing of that release.
    sampling: Literal["shuffle", "balanced"] = "shuffle"
    # The learning rate over the epochs: "constant", or "cosine": from lr at the first epoch down to lr x lr_final
    # at max_epochs, as torch's CosineAnnealingLR(T_max=max_epochs, eta_min=lr x lr_final) stepped once an epoch
    # (LASER-VFL's authors at p_miss 0.5: lr_final 0.2). A partner anneals its own bottom on its own settings, told
    # only the epoch of each training batch.
    lr_schedule: Literal["constant", "cosine"] = "constant"
    lr_final: float = 0.1

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
        if self.checkpoint_every < 0:
            raise ConfigError(f"train.checkpoint_every must be 0 (never) or more epochs, got {self.checkpoint_every}")
        if self.min_batches < 1:
            raise ConfigError(f"train.min_batches must be at least 1 (1: batch_size on every table), got "
                              f"{self.min_batches}")
        if self.sampling not in ("shuffle", "balanced"):
            raise ConfigError(f"train.sampling must be 'shuffle' or 'balanced', got {self.sampling!r}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ConfigError(f"train.lr_schedule must be 'constant' or 'cosine', got {self.lr_schedule!r}")
        if not 0.0 <= self.lr_final <= 1.0:
            raise ConfigError(f"train.lr_final is the share of lr left at the last epoch, in [0, 1]; got "
                              f"{self.lr_final}")

    def lr_at(self, epoch: int) -> float:
        """The learning rate of epoch ``epoch`` (0 the first) under ``lr_schedule``."""
        if self.lr_schedule == "constant":
            return self.lr
        floor = self.lr * self.lr_final
        return floor + (self.lr - floor) * (1 + math.cos(math.pi * epoch / self.max_epochs)) / 2

    def batch_rows(self, n_rows: int) -> int:
        """The rows of one batch on a table of ``n_rows`` training rows: ``batch_size``, or fewer where that
        would make an epoch less than ``min_batches`` batches."""
        if n_rows < self.min_batches * self.batch_size:
            return max(1, math.ceil(n_rows / self.min_batches))
        return self.batch_size


@dataclass
class History:
    """One dict per epoch (``epoch``, ``loss``, ``val_loss`` when validating, ``seconds``), and how it ended.

    ``stop_reason`` says what ended training: ``'patience'`` or ``'plateau'`` (the early-stopping rule
    fired), ``'callback'``, ``'diverged'``, or ``'max_epochs'`` (the cap was reached: the rule never fired).
    """

    epochs: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int | None = None
    stopped_early: bool = False
    monitor: Literal["loss", "val_loss"] = "val_loss"
    stop_reason: str = ""
    # The epoch whose checkpoint this training resumed from (None: it started at the first epoch).
    resumed_after: int | None = None
    # The method traffic of the runs before the restart, up to that checkpoint (bytes, messages, rounds): a
    # resumed run's own ledger holds only what came after.
    traffic_before: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, key: str) -> list[float]:
        return [e[key] for e in self.epochs if key in e]

    def __len__(self) -> int:
        return len(self.epochs)

    def summary(self, prefix: str = "") -> dict[str, float]:
        """Epochs run and whether the stopping rule (not the cap) ended training, for a results row."""
        out = {f"{prefix}epochs": float(len(self.epochs)),
               f"{prefix}stopped_by_rule": float(self.stop_reason in ("patience", "plateau"))}
        if self.resumed_after is not None:
            out[f"{prefix}resumed_after_epoch"] = float(self.resumed_after + 1)  # counted from 1, as epochs are
            out |= {f"{prefix}before_resume_{k}": float(v) for k, v in self.traffic_before.items()}
        return out


class Callback:
    """Hook into training; return ``True`` from :meth:`on_epoch_end` to stop."""

    def on_epoch_end(self, epoch: int, logs: Mapping[str, float]) -> bool:
        return False


@dataclass(frozen=True)
class CheckpointPlan:
    """A run that keeps checkpoints: its key (letters and digits, the same for the run and its resumption) and
    whether to resume from the last checkpoint every party holds."""

    run: str
    resume: bool = False


class EarlyStopping(Callback):
    """Stop when the monitored loss has not improved by ``min_delta`` for ``patience`` epochs."""

    FIELDS = ("best", "best_epoch", "wait", "flat", "previous", "improved")

    def state(self) -> str:
        return json.dumps({k: getattr(self, k) for k in self.FIELDS})

    def load_state(self, text: str) -> None:
        for key, value in json.loads(text).items():
            if key in self.FIELDS:
                setattr(self, key, value)

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

    @property
    def reason(self) -> str:
        return "patience" if self.plateau is None else "plateau"

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


def class_weights(labels: np.ndarray | None, *, owner: str) -> np.ndarray:
    """Each row's chance of a draw in :func:`balanced_draws`: 1 / (its class's count), normalised, so every class is
    drawn equally often on average (torch's ``WeightedRandomSampler(weights, len(weights))``)."""
    if labels is None:
        raise ConfigError(f"train.sampling = 'balanced' draws rows by class, and {owner} trains on no class labels "
                          "(a regression or an unsupervised network); set train.sampling = 'shuffle'")
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    weights = 1.0 / counts[inverse]
    normalised: np.ndarray = weights / weights.sum()
    return normalised


def balanced_draws(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """As many positions as ``weights`` (:func:`class_weights`), drawn with replacement."""
    return rng.choice(len(weights), size=len(weights), replace=True, p=weights)


def set_lr(optimizers: Iterable[torch.optim.Optimizer], lr: float) -> None:
    """Every parameter group of ``optimizers`` at learning rate ``lr`` (a schedule's rate for the epoch)."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr


def split_validation(n: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Positions for training and validation; no validation when it would hold no row or leave none."""
    n_val = round(n * fraction)
    if n_val < 1 or n - n_val < 1:
        return np.arange(n), np.empty(0, dtype=np.int64)
    perm = rng.permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


class Trainer(ABC):
    """The fit loop, split into named steps in the spirit of skorch's ``NeuralNet``.

    :meth:`fit` owns the epochs: it asks :meth:`batches` for each epoch's batches, runs
    :meth:`train_step` on each, asks :meth:`validation_loss`, applies the early-stopping rule and the
    callbacks, keeps a :meth:`snapshot` of the best epoch (``restore_best``) and restores it
    (:meth:`restore`) at the end. Subclasses say where the loss comes from (one module in this process, or a SplitNN
    whose forward and backward passes cross the transport) and inherit the rest, so every network
    vflo trains stops, validates and reports the same way.
    """

    #: Pass the next batch to :meth:`train_step`, so it can start fetching that batch's inputs.
    lookahead: bool = False

    def __init__(self, config: TrainConfig, rng: np.random.Generator, *, callbacks: Sequence[Callback] = (),
                 checkpoint: CheckpointPlan | None = None) -> None:
        self.config = config
        self.rng = rng
        self.callbacks = list(callbacks)
        self.best_state: Any = None
        self.checkpoint = checkpoint if config.checkpoint_every or (checkpoint and checkpoint.resume) else None
        self.epoch = 0  # the epoch under way: a training batch's request names it (a partner's learning rate)
        self.draw_weights: np.ndarray | None = None  # sampling = "balanced": each training row's chance of a draw

    # -- steps a subclass provides ------------------------------------------------------------------

    @property
    @abstractmethod
    def n_train(self) -> int:
        """Training rows: what :meth:`batches` shuffles."""

    @abstractmethod
    def train_step(self, batch: np.ndarray, upcoming: np.ndarray | None) -> float | None:
        """One optimiser step on ``batch`` (positions into the training rows); the batch's mean loss, or
        None when the step was skipped (it then counts toward neither the loss nor the rows)."""

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This epoch's batches: a fresh shuffle of the training rows, ``batch_size`` at a time (fewer on a small
        table: :meth:`TrainConfig.batch_rows`); with ``sampling = "balanced"``, as many class-balanced draws."""
        if self.config.sampling == "balanced":
            if self.draw_weights is None:  # the training rows' classes do not change between epochs
                self.draw_weights = class_weights(self.sampling_labels(), owner=type(self).__name__)
            perm = balanced_draws(self.draw_weights, self.rng)
        else:
            perm = self.rng.permutation(self.n_train)
        bs = self.config.batch_rows(self.n_train)
        return [perm[start : start + bs] for start in range(0, self.n_train, bs)]

    def sampling_labels(self) -> np.ndarray | None:
        """The class of each training row, for ``sampling = "balanced"``; None where this trainer has none."""
        return None

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimisers whose learning rate ``lr_schedule`` sets at each epoch's start."""
        return []

    def start_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` begins: its learning rate, on every optimiser this trainer steps."""
        self.epoch = epoch
        if self.config.lr_schedule == "constant":
            return
        optimizers = self.optimizers()
        if not optimizers:
            raise ConfigError(f"train.lr_schedule = {self.config.lr_schedule!r} is not supported by "
                              f"{type(self).__name__}; set train.lr_schedule = 'constant'")
        set_lr(optimizers, self.config.lr_at(epoch))

    def validation_loss(self) -> float | None:
        """The loss on the validation rows, or None when there are none (training loss is monitored)."""
        return None

    @property
    def validates(self) -> bool:
        return False

    def snapshot(self) -> Any:
        """The state to keep from the best epoch so far (``restore_best``); None keeps nothing."""
        return None

    def restore(self, state: Any) -> None:  # noqa: B027 - optional step: nothing to restore by default
        """Go back to a state :meth:`snapshot` returned."""

    def on_improve(self, epoch: int) -> None:
        """The monitored loss improved at ``epoch``: remember this state if the config asks to."""
        if self.config.restore_best:
            self.best_state = self.snapshot()

    def on_train_end(self, history: History) -> None:
        """Training is over: by default, go back to the best epoch's state."""
        if self.config.restore_best and self.best_state is not None:
            self.restore(self.best_state)

    # -- checkpoints: subclasses that support them say what their state is and where it goes ------------------

    def model_state(self) -> dict[str, Any]:
        """Weights and optimiser state of what this trainer trains, as arrays and plain values."""
        raise ConfigError(f"{type(self).__name__} cannot keep checkpoints; set train.checkpoint_every = 0")

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        raise ConfigError(f"{type(self).__name__} cannot resume from a checkpoint")  # pragma: no cover

    def write_checkpoint(self, epoch: int, state: dict[str, Any]) -> None:
        """Keep ``state`` as the checkpoint after ``epoch`` (and have every other party keep its own)."""
        raise ConfigError(f"{type(self).__name__} has nowhere to keep checkpoints")  # pragma: no cover

    def checkpoint_epochs(self) -> list[int]:
        """Epochs after which a checkpoint is complete everywhere."""
        return []

    def read_checkpoint(self, epoch: int) -> dict[str, Any]:
        """This trainer's checkpoint after ``epoch`` (every other party restoring its own)."""
        raise ConfigError(f"{type(self).__name__} has no checkpoints to read")  # pragma: no cover

    def traffic(self, before: Mapping[str, float]) -> dict[str, float]:
        """The method traffic of this training so far, with ``before`` (runs before a restart) added; none for
        a training that exchanges nothing."""
        return {}

    def _save(self, epoch: int, history: History, stopper: EarlyStopping) -> None:
        state = {**self.model_state(), "loop.epoch": epoch, "loop.rng": rng_state(self.rng),
                 "loop.history": json.dumps(history.epochs), "loop.stopper": stopper.state(),
                 "loop.traffic": json.dumps(self.traffic(history.traffic_before))}
        if self.best_state is not None:
            state |= {f"best.{k}": v.detach().cpu().numpy().copy() for k, v in self.best_state.items()}
        self.write_checkpoint(epoch, state)
        logger.info("checkpoint after epoch %d", epoch)

    def _resume(self, history: History, stopper: EarlyStopping) -> int:
        """Restore the last checkpoint every party holds; the epoch it follows, or -1 when there is none."""
        epochs = self.checkpoint_epochs()
        if not epochs:
            logger.warning("no checkpoint of this run to resume from: training starts at the first epoch")
            return -1
        epoch = max(epochs)
        state = self.read_checkpoint(epoch)
        self.load_model_state(state)
        load_rng_state(self.rng, str(state["loop.rng"]))
        history.epochs[:] = json.loads(str(state["loop.history"]))
        stopper.load_state(str(state["loop.stopper"]))
        history.traffic_before = {str(k): float(v) for k, v in json.loads(str(state.get("loop.traffic", "{}"))).items()}
        best = {k[len("best."):]: torch.as_tensor(v) for k, v in state.items() if k.startswith("best.")}
        self.best_state = best or None
        logger.info("resumed from the checkpoint after epoch %d", epoch)
        return epoch

    # -- the loop ----------------------------------------------------------------------------------

    def fit(self) -> History:
        if self.n_train < 1:
            raise ConfigError("no training rows: the scenario leaves this model nothing to learn from")
        config = self.config
        monitor: Literal["loss", "val_loss"] = "val_loss" if self.validates else "loss"
        stopper = EarlyStopping(monitor, config.patience, config.min_delta,
                                config.plateau if config.stop == "plateau" else None)
        history = History(monitor=monitor, stop_reason="max_epochs")
        start = 0
        if self.checkpoint is not None and self.checkpoint.resume:
            resumed = self._resume(history, stopper)
            history.resumed_after = resumed if resumed >= 0 else None
            start = resumed + 1
        for epoch in range(start, config.max_epochs):
            started = time.perf_counter()
            self.start_epoch(epoch)
            batches = self.batches(epoch)
            total, rows = 0.0, 0
            for i, batch in enumerate(batches):
                upcoming = batches[i + 1] if self.lookahead and i + 1 < len(batches) else None
                loss = self.train_step(batch, upcoming)
                if loss is not None:
                    total += loss * len(batch)
                    rows += len(batch)
            logs: dict[str, float] = {"epoch": float(epoch), "loss": total / max(rows, 1)}
            val = self.validation_loss()
            if val is not None:
                logs["val_loss"] = val
            logs["seconds"] = time.perf_counter() - started
            history.epochs.append(logs)
            if not np.isfinite(logs[monitor]):
                logger.warning("training diverged at epoch %d (%s = %s); stopping", epoch, monitor, logs[monitor])
                history.stopped_early, history.stop_reason = True, "diverged"
                break
            stop = stopper.on_epoch_end(epoch, logs)
            if stop:
                history.stop_reason = stopper.reason
            if stopper.improved:
                self.on_improve(epoch)
            for cb in self.callbacks:
                if cb.on_epoch_end(epoch, logs) and not stop:
                    stop, history.stop_reason = True, "callback"
            if stop:
                history.stopped_early = True
                break
            every = config.checkpoint_every
            if self.checkpoint is not None and every and (epoch + 1) % every == 0 and epoch + 1 < config.max_epochs:
                self._save(epoch, history, stopper)
        history.best_epoch = stopper.best_epoch
        self.on_train_end(history)
        return history


class _StepTrainer(Trainer):
    """A trainer around plain functions (for :func:`run_epochs`)."""

    def __init__(
        self, n_train: int, config: TrainConfig, rng: np.random.Generator, train_step: Callable[..., float],
        validate: Callable[[], float] | None, on_improve: Callable[[int], None] | None,
        callbacks: Sequence[Callback], lookahead: bool,
    ) -> None:
        super().__init__(config, rng, callbacks=callbacks)
        self._n, self._step, self._validate, self._improve = n_train, train_step, validate, on_improve
        self.lookahead = lookahead

    @property
    def n_train(self) -> int:
        return self._n

    def train_step(self, batch: np.ndarray, upcoming: np.ndarray | None) -> float:
        return self._step(batch, upcoming) if self.lookahead else self._step(batch)

    @property
    def validates(self) -> bool:
        return self._validate is not None

    def validation_loss(self) -> float | None:
        return self._validate() if self._validate is not None else None

    def on_improve(self, epoch: int) -> None:
        if self._improve is not None:
            self._improve(epoch)


def run_epochs(
    *, n_train: int, config: TrainConfig, rng: np.random.Generator,
    train_step: Callable[..., float], validate: Callable[[], float] | None = None,
    on_improve: Callable[[int], None] | None = None, callbacks: Sequence[Callback] = (),
    lookahead: bool = False,
) -> History:
    """:class:`Trainer`'s loop around plain functions: ``train_step(positions)`` returns the batch's mean
    loss (with ``lookahead``, ``train_step(positions, next_positions)``)."""
    return _StepTrainer(n_train, config, rng, train_step, validate, on_improve, callbacks, lookahead).fit()


def adam(params: Iterable[torch.nn.Parameter], config: TrainConfig) -> torch.optim.Adam:
    """Adam with the config's learning rate and weight decay (betas 0.9, 0.999 as in Kingma & Ba)."""
    return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay, foreach=True)


def as_tensor(x: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor that owns its memory (party data arrays are read-only and must stay untouched); float32
    unless ``dtype`` says otherwise."""
    return torch.tensor(np.asarray(x), dtype=torch.float32 if dtype is None else dtype)


class ModuleTrainer(Trainer):
    """One module in this process, trained with Adam on row-aligned tensors and a loss function."""

    def __init__(
        self, module: nn.Module, loss_fn: LossFn, tensors: Mapping[str, torch.Tensor | RowSource], *,
        config: TrainConfig, rng: np.random.Generator, callbacks: Sequence[Callback] = (),
    ) -> None:
        super().__init__(config, rng, callbacks=callbacks)
        self.module = module
        self.loss_fn = loss_fn
        # Rows are gathered by position from the tensors as given (no copy of the training split: at ten million
        # rows a copy is gigabytes), from memory or from a matrix kept on disk (vflo.spill) alike.
        self.tensors = dict(tensors)
        self.train_pos, self.val_pos = split_validation(_rows(tensors), config.validation_fraction, rng)
        self.val_tensors = (self.gather(self.val_pos) if 0 < len(self.val_pos) <= VALIDATION_BLOCK
                            else None)
        self.optimizer = adam(module.parameters(), config)

    def gather(self, positions: np.ndarray) -> dict[str, torch.Tensor]:
        """The rows at ``positions`` of every tensor (a matrix kept on disk is read as float32)."""
        return {k: gather(v, positions) for k, v in self.tensors.items()}

    @property
    def n_train(self) -> int:
        return len(self.train_pos)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def sampling_labels(self) -> np.ndarray | None:
        y = self.tensors.get("y")
        if y is None:
            return None
        classes = gather(y, self.train_pos)
        return None if classes.is_floating_point() else classes.numpy()

    def train_step(self, batch: np.ndarray, upcoming: np.ndarray | None) -> float:
        if not self.module.training:  # a validation pass left it in eval mode; walking every submodule each step costs
            self.module.train()
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.module, self.gather(self.train_pos[batch]))
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    @property
    def validates(self) -> bool:
        return len(self.val_pos) > 0

    def validation_loss(self) -> float | None:
        if not len(self.val_pos):
            return None
        self.module.eval()
        with torch.no_grad():
            if self.val_tensors is not None:
                return float(self.loss_fn(self.module, self.val_tensors))
            # Many validation rows: a block at a time (the loss is a mean over rows), each block's weight its rows.
            total = 0.0
            for start in range(0, len(self.val_pos), VALIDATION_BLOCK):
                rows = self.val_pos[start:start + VALIDATION_BLOCK]
                total += float(self.loss_fn(self.module, self.gather(rows))) * len(rows)
            return total / len(self.val_pos)

    def snapshot(self) -> Any:
        return copy.deepcopy(self.module.state_dict())

    def restore(self, state: Any) -> None:
        self.module.load_state_dict(state)

    def on_train_end(self, history: History) -> None:
        super().on_train_end(history)
        self.module.eval()


def fit_module(
    module: nn.Module, loss_fn: LossFn, tensors: Mapping[str, torch.Tensor | RowSource], *, config: TrainConfig,
    rng: np.random.Generator, callbacks: Sequence[Callback] = (),
) -> History:
    """Train ``module`` with Adam on row-aligned ``tensors``; ``loss_fn`` maps a batch to a scalar loss."""
    return ModuleTrainer(module, loss_fn, tensors, config=config, rng=rng, callbacks=callbacks).fit()


def module_state(module: nn.Module, prefix: str = "") -> dict[str, np.ndarray]:
    """A module's parameters and buffers as named arrays (what a model artifact or checkpoint stores)."""
    return {prefix + k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_module_state(module: nn.Module, state: Mapping[str, Any], prefix: str = "") -> None:
    """Put arrays saved by :func:`module_state` back; a missing, extra or misshapen one is refused."""
    expected = module.state_dict()
    got = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        raise ConfigError(f"saved weights do not fit this network (missing {missing[:4]}, unexpected {extra[:4]}): "
                          "the artifact comes from another model or another configuration")
    tensors = {}
    for name, value in got.items():
        if not isinstance(value, np.ndarray) or tuple(value.shape) != tuple(expected[name].shape):
            shape = getattr(value, "shape", None)
            raise ConfigError(f"saved weights {prefix}{name} have shape {shape}, the network needs "
                              f"{tuple(expected[name].shape)}: the artifact comes from another configuration")
        tensors[name] = torch.as_tensor(np.ascontiguousarray(value)).to(expected[name].dtype)
    module.load_state_dict(tensors)


def optimizer_state(optimizer: torch.optim.Optimizer, prefix: str) -> dict[str, Any]:
    """An optimiser's moments and step counts as named arrays, its settings as JSON (for checkpoints)."""
    raw = optimizer.state_dict()
    out: dict[str, Any] = {prefix + "groups": json.dumps(raw["param_groups"])}
    for index, slots in raw["state"].items():
        for name, value in slots.items():
            out[f"{prefix}{index}.{name}"] = value.detach().cpu().numpy().copy() if torch.is_tensor(value) else value
    return out


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any], prefix: str) -> None:
    groups = json.loads(str(state[prefix + "groups"]))
    slots: dict[int, dict[str, Any]] = {}
    for key, value in state.items():
        if key.startswith(prefix) and key != prefix + "groups":
            index, name = key[len(prefix):].split(".", 1)
            slots.setdefault(int(index), {})[name] = torch.as_tensor(value) if isinstance(value, np.ndarray) else value
    optimizer.load_state_dict({"state": slots, "param_groups": groups})


def rng_state(rng: np.random.Generator) -> str:
    return json.dumps(rng.bit_generator.state)


def load_rng_state(rng: np.random.Generator, state: str) -> None:
    rng.bit_generator.state = json.loads(state)


def gather(rows: torch.Tensor | RowSource, positions: np.ndarray) -> torch.Tensor:
    """The rows at ``positions`` of a tensor, or of an array or matrix kept on disk (as float32)."""
    if isinstance(rows, torch.Tensor):
        return rows[torch.from_numpy(np.asarray(positions, dtype=np.int64))]
    block = take(rows, positions)
    return torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32))


def _rows(tensors: Mapping[str, Any]) -> int:
    sizes = {int(t.shape[0]) for t in tensors.values()}
    if len(sizes) != 1:
        raise ValueError(f"tensors must have the same number of rows, got {sorted(sizes)}")
    return sizes.pop()
