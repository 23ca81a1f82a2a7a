"""DP-SGD by Opacus: a party's own network trained so that its weights are differentially private in its rows.

Opacus computes each person's gradient (``GradSampleModule``), clips it to ``max_grad_norm`` and adds Gaussian
noise to the batch's sum (``DPOptimizer``, its noise drawn from the party's own generator). Batches are drawn by
Poisson sampling (each row with probability ``sample_rate``, independently) from the party's own secret stream,
which is what lets the accountant count a step as a subsampled Gaussian mechanism: no one else knows who was in
a batch. The run is a fixed number of steps (the training config's ``max_epochs`` epochs of about 1/``sample_rate``
steps each), with no validation split and no early stopping, whose choices would read the private rows outside
the accounting. What the steps cost is :meth:`vflo.dp.DPSGD.event`, charged by the caller before training.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from vflo.dp import DPSGD
from vflo.errors import ConfigError
from vflo.nn.train import History, TrainConfig, adam, as_tensor
from vflo.spill import take

if TYPE_CHECKING:
    import torch
else:
    from vflo.lazy import torch

logger = logging.getLogger(__name__)

LossFn = Callable[["torch.nn.Module", Mapping[str, "torch.Tensor"]], "torch.Tensor"]


def private_training(net: torch.nn.Module, optimizer: torch.optim.Optimizer, dp: DPSGD, *,
                     generator: torch.Generator, expected_batch_size: float) -> tuple[Any, Any]:
    """``net`` with Opacus's per-person gradients, and ``optimizer`` clipping each to ``dp.max_grad_norm`` and
    noising their sum from ``generator`` (dividing by ``expected_batch_size``, for a batch's mean loss)."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    return GradSampleModule(net), DPOptimizer(optimizer, noise_multiplier=dp.noise_multiplier,
                                               max_grad_norm=dp.max_grad_norm,
                                               expected_batch_size=expected_batch_size, generator=generator,
                                               loss_reduction="mean")


@contextlib.contextmanager
def quiet_hooks() -> Iterator[None]:
    """Around a backward pass: Opacus's hooks fire on the module's outputs when its inputs need no gradient
    (vflo's never do), and warn about it every time."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        yield


def poisson_batches(n: int, rate: float, steps: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``steps`` batches of the positions 0..n-1, each position in each batch with probability ``rate``."""
    return [np.flatnonzero(rng.random(n) < rate) for _ in range(steps)]


def fit_private(model: torch.nn.Module, loss_fn: LossFn, tensors: Mapping[str, Any], *, train: TrainConfig, dp: DPSGD,
                rng: np.random.Generator, generator: torch.Generator) -> History:
    """Train ``model`` in place on the rows of ``tensors`` (arrays, or :mod:`vflo.spill` rows, of equal height) with
    DP-SGD: ``loss_fn(module, batch)`` is the batch's mean loss; Adam at the config's learning rate. Poisson batches
    come from ``rng`` and the noise from ``generator``, both the party's own."""
    n = len(next(iter(tensors.values())))
    if n < 1:
        raise ConfigError("no training rows: DP-SGD has nothing to learn from")
    expected = dp.sample_rate * n
    if expected < 1:
        raise ConfigError(f"dp_sgd.sample_rate {dp.sample_rate} draws {expected:.2g} of the {n} rows a batch on "
                          f"average: raise it to at least {1 / n:.2g}")
    private, optimizer = private_training(model, adam(model.parameters(), train), dp, generator=generator,
                                          expected_batch_size=max(1, round(expected)))
    history = History(monitor="loss", stop_reason="max_epochs")
    per_epoch = dp.steps(1)
    model.train()
    for epoch in range(train.max_epochs):
        started = time.perf_counter()
        total, rows = 0.0, 0
        for positions in poisson_batches(n, dp.sample_rate, per_epoch, rng):
            optimizer.zero_grad(set_to_none=True)
            if len(positions):
                batch = {k: as_tensor(np.asarray(v[positions] if isinstance(v, torch.Tensor) else take(v, positions)))
                         for k, v in tensors.items()}
                loss = loss_fn(private, batch)
                with quiet_hooks():
                    loss.backward()
                total += float(loss.detach()) * len(positions)
                rows += len(positions)
            else:  # an empty batch is still a step: its noise alone moves the weights
                for p in private.parameters():
                    p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype)
            optimizer.step()
        history.epochs.append({"epoch": float(epoch), "loss": total / max(rows, 1),
                               "seconds": time.perf_counter() - started})
    optimizer.zero_grad(set_to_none=True)
    private.to_standard_module()  # the hooks and per-sample gradients off ``model``, which is trained in place
    model.eval()
    logger.info("DP-SGD: %d epochs of %d steps, σ = %g, clip %g, sampling rate %g", train.max_epochs, per_epoch,
                dp.noise_multiplier, dp.max_grad_norm, dp.sample_rate)
    return history
