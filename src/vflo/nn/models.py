"""Model builders: MLPs and symmetric autoencoders, initialised from an explicit generator.

Parameters are initialised here rather than by PyTorch's layer constructors so that
the only randomness is the ``torch.Generator`` passed in: the same seed gives the same
weights regardless of what else ran in the process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import nn

from vflo.errors import ConfigError

Activation = Literal["relu", "selu", "leaky_relu", "tanh", "gelu", "sigmoid"]
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "selu": nn.SELU,
    "leaky_relu": lambda: nn.LeakyReLU(0.01),
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
}


def activation_layer(name: str) -> nn.Module:
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        from vflo.errors import unknown_name

        raise ConfigError(unknown_name("activation", name, ACTIVATIONS)) from None


def init_parameters(module: nn.Module, generator: torch.Generator, activation: str = "relu") -> nn.Module:
    """Re-initialise every linear and convolutional layer from ``generator``.

    Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) as PyTorch's default, except LeCun normal
    for SELU networks, whose self-normalisation assumes it.
    """
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.Linear | nn.Conv2d):
                fan_in = layer.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
                if activation == "selu":
                    layer.weight.normal_(0.0, bound, generator=generator)
                else:
                    layer.weight.uniform_(-bound, bound, generator=generator)
                if layer.bias is not None:
                    layer.bias.uniform_(-bound, bound, generator=generator)
    return module


def mlp(
    in_dim: int, hidden: Sequence[int], out_dim: int | None = None, *, activation: str = "relu",
    generator: torch.Generator,
) -> nn.Sequential:
    """``in -> hidden... -> out``; activations after every hidden layer, none after ``out``.

    With ``out_dim=None`` the last hidden layer is the output and keeps its activation
    (a feature extractor, e.g. a SplitNN bottom model).
    """
    if in_dim < 0 or any(h < 1 for h in hidden) or (out_dim is not None and out_dim < 1):
        raise ConfigError(f"layer sizes must be positive: in {in_dim}, hidden {list(hidden)}, out {out_dim}")
    if out_dim is None and not hidden:
        raise ConfigError("an MLP without an output layer needs at least one hidden layer")
    layers: list[nn.Module] = []
    width = in_dim
    for h in hidden:
        layers += [nn.Linear(width, h), activation_layer(activation)]
        width = h
    if out_dim is not None:
        layers.append(nn.Linear(width, out_dim))
    return init_parameters(nn.Sequential(*layers), generator, activation)  # type: ignore[return-value]  # the Sequential given


def output_width(model: nn.Module, in_dim: int) -> int:
    """Width of a model's output for an input of width ``in_dim``."""
    with torch.no_grad():
        return int(model(torch.zeros(1, in_dim)).shape[1])


class Autoencoder(nn.Module):
    """A symmetric autoencoder: ``forward`` returns (latent, reconstruction)."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encoder(x)
        return z, self.decoder(z)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)  # type: ignore[no-any-return]  # torch types Module.__call__ as Any


def autoencoder(
    in_dim: int, hidden: Sequence[int], *, activation: str = "selu", generator: torch.Generator,
) -> Autoencoder:
    """Encoder ``in -> hidden[0] -> ... -> hidden[-1]`` (activated latent) and its mirror as decoder.

    The decoder's last layer is linear because inputs are standardised, not bounded.
    """
    if not hidden:
        raise ConfigError("an autoencoder needs at least one hidden layer")
    encoder = mlp(in_dim, hidden, None, activation=activation, generator=generator)
    mirror = list(reversed(hidden))
    decoder = mlp(mirror[0], mirror[1:], in_dim, activation=activation, generator=generator)
    return Autoencoder(encoder, decoder)
