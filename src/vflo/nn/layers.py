"""Networks written as a list of layer words, so a config can state a paper's architecture exactly.

    ["linear 120", "linear 70", "relu"]                         Entity Augmentation's Handwritten guest
    ["reshape 1 28 14", "conv 16 3", "relu", "maxpool 2",
     "conv 32 3", "relu", "maxpool 2", "flatten", "linear 64", "relu"]   a small guest for half an image

Words: ``linear N``, ``conv OUT K`` (padding keeps the size), ``maxpool K``, ``reshape D...``,
``flatten``, and the activations ``relu``, ``leaky_relu``, ``selu``, ``tanh``, ``sigmoid``,
``gelu``; ``resnet18`` is a ResNet-18 trunk for image halves and needs a GPU. Input sizes are
worked out layer by layer; weights come from the generator passed in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vflo.errors import ConfigError
from vflo.nn.models import ACTIVATIONS, activation_layer, init_parameters
from vflo.nn.words import ints, validate

__all__ = ["build", "output_size", "validate"]


class Reshape(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


def _layer(word: str, args: list[str], shape: tuple[int, ...]) -> nn.Module:
    if word == "linear":
        (n,) = ints(word, args, 1)
        if len(shape) != 1:
            raise ConfigError(f"'linear' needs a flat input, got shape {shape}; add 'flatten' first")
        return nn.Linear(shape[0], n)
    if word == "conv":
        out, k = ints(word, args, 2)
        if len(shape) != 3:
            raise ConfigError(f"'conv' needs a (channels, height, width) input, got {shape}; add 'reshape C H W'")
        return nn.Conv2d(shape[0], out, k, padding=k // 2)
    if word == "maxpool":
        (k,) = ints(word, args, 1)
        return nn.MaxPool2d(k)
    if word == "reshape":
        dims = tuple(ints(word, args, len(args)))
        if torch.Size(dims).numel() != torch.Size(shape).numel():
            raise ConfigError(f"cannot reshape {shape} into {dims}: the sizes differ")
        return Reshape(dims)
    if word == "flatten":
        return nn.Flatten()
    if word == "resnet18":
        from vflo.nn.resnet import resnet18_trunk

        if len(shape) != 3:
            raise ConfigError("'resnet18' needs a (channels, height, width) input; add 'reshape C H W'")
        return resnet18_trunk(shape[0])
    if word in ACTIVATIONS and not args:
        return activation_layer(word)
    from vflo.errors import did_you_mean

    words = ["linear", "conv", "maxpool", "reshape", "flatten", "resnet18", *ACTIVATIONS]
    raise ConfigError(f"unknown layer {word!r}{did_you_mean(word, words)}; use one of {', '.join(words)}")


def build(in_dim: int, spec: Sequence[str], *, generator: torch.Generator) -> nn.Sequential:
    """A network from layer words; its input is a flat vector of ``in_dim`` features."""
    if not spec:
        raise ConfigError("a network needs at least one layer")
    shape: tuple[int, ...] = (in_dim,)
    layers: list[nn.Module] = []
    words = [str(t).split() for t in spec]
    activation = "selu" if any(w and w[0] == "selu" for w in words) else "relu"
    for word, *args in words:
        layer = _layer(word.lower(), args, shape)
        layers.append(layer)
        with torch.no_grad():
            shape = tuple(layer(torch.zeros(1, *shape)).shape[1:])
    return init_parameters(nn.Sequential(*layers), generator, activation)  # type: ignore[return-value]  # the Sequential given


def output_size(net: nn.Module, in_dim: int) -> int:
    with torch.no_grad():
        out = net(torch.zeros(1, in_dim))
    if out.ndim != 2:
        raise ConfigError(f"a network must end in a flat vector, it ends in shape {tuple(out.shape[1:])}")
    return int(out.shape[1])
