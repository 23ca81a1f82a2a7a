"""PyTorch, imported on first use.

Listing methods, printing help and checking a config must not wait the second or more that importing
PyTorch takes; modules that train networks therefore reach PyTorch through these stand-ins, which
import the real module the first time one of its attributes is read (and keep what they read, so the
hot path pays nothing after that). Type checkers see the real modules: under ``TYPE_CHECKING`` the
importing modules import torch directly.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """A module imported when one of its attributes is first read."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        value = getattr(importlib.import_module(object.__getattribute__(self, "_name")), attr)
        object.__setattr__(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<lazy module {object.__getattribute__(self, '_name')!r}>"


torch = LazyModule("torch")
functional = LazyModule("torch.nn.functional")
