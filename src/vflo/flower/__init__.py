"""vflo's methods over Flower: the coordinator in a ServerApp, each party behind a ClientApp on its SuperNode.

Needs the ``flower`` extra (``pip install 'vflo[flower]'``); nothing else in vflo imports this package.
See docs/flower.md for how the pieces fit and what state lives where.
"""

from __future__ import annotations

from vflo.errors import ConfigError


def require_flwr() -> None:
    """Fail with the install command when Flower is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError as exc:
        raise ConfigError("running over Flower needs the flwr package: pip install 'vflo[flower]'") from exc
