"""vflo's methods over Flower: the coordinator in a ServerApp, each party behind a ClientApp on its SuperNode.

Needs the ``flower`` extra (``pip install 'vflo[flower]'``). Only the transport registry (:mod:`vflo.transports`)
imports it, through :mod:`vflo.flower.plugin`, which imports flwr only when a side starts.
See docs/flower.md for how the pieces fit and what state lives where.
"""

from __future__ import annotations

from vflo.errors import ConfigError


def unavailable() -> str:
    """Why vflo cannot run over Flower here ("" where it can)."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        return "needs the flwr package: pip install 'vflo[flower]'"
    return ""


def require_flwr() -> None:
    """Fail with the install command when Flower is not installed."""
    why = unavailable()
    if why:
        raise ConfigError(f"running over Flower {why}")
