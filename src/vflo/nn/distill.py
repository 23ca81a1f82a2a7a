"""Training an autoencoder, optionally pulling its latent toward a target on some rows.

One loss serves APC-VFL's local and joint autoencoders (reconstruction only), its
student (reconstruction + λ · distillation on aligned rows), the Ablation (no
distillation) and VFedTrans (L1 toward the federated representation). Per sample,

    L(x_i) = ||x_i - f(g(x_i))||²  +  λ · m_i · D(z_i, g(x_i)),

with m_i = 1 where a target z_i exists and D the squared L2 (``mse``) or the L1 (``mae``)
norm of the difference, exactly as APC-VFL's Eq. 5 writes them; a batch's loss is the
mean of L over its rows. ``reduction = 'mean'`` divides each norm by its number of
dimensions instead (PyTorch's ``MSELoss`` convention), which weakens the distillation
term relative to reconstruction by the ratio of latent to input width.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from vflo.blocks import CHUNK
from vflo.dp import DPSGD
from vflo.errors import ConfigError
from vflo.executor import in_blocks
from vflo.nn.train import History, TrainConfig, as_tensor, fit_module, load_module_state, module_state
from vflo.spill import Rows, RowSink, Slotted

if TYPE_CHECKING:
    import torch
    from torch.nn import functional as F

    from vflo.nn.models import Autoencoder
else:
    from vflo.lazy import functional as F
    from vflo.lazy import torch


DistillLoss = Literal["mse", "mae"]
Reduction = Literal["sum", "mean"]


@dataclass(frozen=True)
class FittedAutoencoder:
    model: Autoencoder
    history: History

    @property
    def width(self) -> int:
        """The latent's width (the encoder's last layer)."""
        last = [m for m in self.model.encoder.modules() if isinstance(m, torch.nn.Linear)][-1]
        return int(last.out_features)

    def state(self, prefix: str) -> dict[str, Any]:
        """Its weights and input width, for a model artifact."""
        first = next(m for m in self.model.encoder.modules() if isinstance(m, torch.nn.Linear))
        return {**module_state(self.model, prefix), prefix + "in_dim": int(first.in_features)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], prefix: str, hidden: tuple[int, ...], *,
                   activation: str) -> FittedAutoencoder:
        """The autoencoder :meth:`state` saved (built with the same ``hidden`` widths and ``activation``)."""
        from vflo.nn.models import autoencoder
        from vflo.seeding import torch_generator

        in_dim = state.get(prefix + "in_dim")
        if not isinstance(in_dim, int):
            raise ConfigError(f"a saved autoencoder lacks {prefix}in_dim: the artifact is from another model")
        model = autoencoder(in_dim, hidden, activation=activation, generator=torch_generator(0, "restore"))
        load_module_state(model, {k: v for k, v in state.items() if k != prefix + "in_dim"}, prefix)
        model.eval()
        return cls(model=model, history=History())

    def encode(self, X: np.ndarray) -> np.ndarray:
        """The latents of ``X``'s rows, a block at a time (:func:`~vflo.executor.in_blocks`): the numbers of one
        single-threaded pass over all of them, however many workers share the blocks."""
        self.model.eval()
        encoder = self.model.encoder

        def block(x: np.ndarray) -> np.ndarray:
            with torch.no_grad():  # per thread: each worker says it for itself
                out: np.ndarray = encoder(as_tensor(x)).numpy()
            return out

        return in_blocks(block, np.asarray(X), self.width, np.float32)

    def encode_rows(self, X: Rows, *, what: str = "latents") -> Rows:
        """:meth:`encode` of many rows, ``X`` in memory or on disk: the latents in memory while they are within the
        party's ``[spill]`` limit, else in a file of its own (:mod:`vflo.spill`). Rows go
        :data:`~vflo.blocks.CHUNK` at a time, a whole number of blocks, so the numbers are :meth:`encode`'s."""
        sink = RowSink(X.shape[0], self.width, np.float32, what=what)
        for start in range(0, X.shape[0], CHUNK):
            sink.write(self.encode(X[start:start + CHUNK]))
        return sink.finish()


def fit_autoencoder(
    X: Rows, hidden: tuple[int, ...], *, activation: str, train: TrainConfig, generator: torch.Generator,
    rng: np.random.Generator, target: Rows | None = None, target_mask: np.ndarray | None = None,
    target_rows: np.ndarray | None = None, weight: float = 0.0, distill: DistillLoss = "mse",
    reduction: Reduction = "sum", target_rec_weight: float = 1.0, dp: DPSGD | None = None,
    noise_generator: torch.Generator | None = None,
) -> FittedAutoencoder:
    """Train a symmetric autoencoder on ``X`` (in memory or on disk, :mod:`vflo.spill`); with ``target``, distil
    toward it: ``target`` has a row for each row of ``X`` and ``target_mask`` says which count, or (with
    ``target_rows``) a row only for the rows of ``X`` at ``target_rows``.

    ``target_rec_weight`` scales the reconstruction term on rows that have a target (VFL-ASP's
    λ·L_emb + (1 - λ)·L_rec uses ``weight = λ`` and ``target_rec_weight = 1 - λ``).

    With ``dp`` the network is trained by DP-SGD (:func:`vflo.nn.private.fit_private`): batches by Poisson
    sampling from ``rng`` and noise from ``noise_generator``, both the party's own secret; its cost is the
    caller's to charge (:meth:`vflo.dp.DPSGD.event`). Each row's loss, its target's term included, is one
    person's: clipped and noised as theirs.
    """
    if X.shape[0] == 0:
        raise ConfigError("an autoencoder needs at least one training row")
    if weight < 0:
        raise ConfigError(f"the distillation weight must be non-negative, got {weight}")
    if distill not in ("mse", "mae"):
        raise ConfigError(f"distill must be 'mse' or 'mae', got {distill!r}")
    if reduction not in ("sum", "mean"):
        raise ConfigError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    from vflo.nn.models import autoencoder

    model = autoencoder(X.shape[1], hidden, activation=activation, generator=generator)
    # Rows are gathered a batch at a time from X as it is (no float32 copy of every row: 480 MB at 10M x 12).
    tensors: dict[str, Any] = {"x": X}
    if target is not None:
        n = X.shape[0]
        rows = np.arange(n) if target_rows is None else np.asarray(target_rows, dtype=np.int64)
        if tuple(target.shape) != (len(rows), hidden[-1]):
            raise ConfigError(
                f"distillation targets have shape {tuple(target.shape)}, expected ({len(rows)}, {hidden[-1]}): the "
                "student's latent width must equal the teacher's"
            )
        # Each row's place in the target (-1: none): no full-height matrix of zeros for the rows without one.
        slots = np.full(n, -1, dtype=np.int64)
        slots[rows] = np.arange(len(rows))
        if target_mask is not None:
            slots[~np.asarray(target_mask, dtype=bool)] = -1
        tensors["z"] = Slotted(target, slots)
        tensors["m"] = as_tensor((slots >= 0).astype(np.float32))
    pointwise = F.mse_loss if distill == "mse" else F.l1_loss

    def norm(t: torch.Tensor) -> torch.Tensor:
        return t.sum(dim=1) if reduction == "sum" else t.mean(dim=1)

    def loss_fn(module: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        z, x_hat = module(batch["x"])
        per_row = norm((batch["x"] - x_hat) ** 2)
        if "z" in batch and target_rec_weight != 1.0:
            per_row = per_row * (1.0 - batch["m"] * (1.0 - target_rec_weight))
        if "z" in batch and weight > 0:
            per_row = per_row + weight * batch["m"] * norm(pointwise(z, batch["z"], reduction="none"))
        loss: torch.Tensor = per_row.mean()
        return loss

    if dp is not None:
        from vflo.nn.private import fit_private

        if noise_generator is None:
            raise ConfigError("DP-SGD needs the party's own generator for its noise")
        history = fit_private(model, loss_fn, tensors, train=train, dp=dp, rng=rng, generator=noise_generator)
    else:
        history = fit_module(model, loss_fn, tensors, config=train, rng=rng)
    return FittedAutoencoder(model=model, history=history)
