"""Layer words (``"linear 64"``, ``"relu"``, ...): checked without building anything, so a config is
validated without importing PyTorch. :mod:`vflo.nn.layers` builds networks from them."""

from __future__ import annotations

from collections.abc import Sequence

from vflo.errors import ConfigError, did_you_mean

ACTIVATION_NAMES = ("relu", "selu", "leaky_relu", "tanh", "gelu", "sigmoid")
COUNTS = {"linear": 1, "conv": 2, "maxpool": 1, "flatten": 0, "resnet18": 0}


def ints(word: str, args: list[str], count: int) -> list[int]:
    """The numbers after a layer word: ``count`` positive whole numbers (any number for ``reshape``)."""
    if len(args) != count and not (word == "reshape" and args):
        raise ConfigError(f"layer {word!r} takes {count} number(s), got {args}")
    try:
        values = [int(a) for a in args]
    except ValueError:
        raise ConfigError(f"layer {word!r} takes whole numbers, got {args}") from None
    if any(v < 1 for v in values):
        raise ConfigError(f"layer {word!r} sizes must be positive, got {values}")
    return values


def validate(spec: Sequence[str], what: str) -> None:
    """Check layer words and their numbers without building anything (input sizes are checked at build)."""
    if not spec:
        raise ConfigError(f"{what} needs at least one layer")
    for text in spec:
        word, *args = str(text).split()
        word = word.lower()
        if word == "reshape":
            ints(word, args, len(args))
        elif COUNTS.get(word):
            ints(word, args, COUNTS[word])
        elif word in COUNTS:
            if args:
                raise ConfigError(f"{what}: layer {word!r} takes no numbers, got {args}")
        elif word not in ACTIVATION_NAMES or args:
            known = [*COUNTS, "reshape", *ACTIVATION_NAMES]
            raise ConfigError(
                f"{what}: unknown layer {text!r}{did_you_mean(word, known)}; use one of {', '.join(known)}"
            )
