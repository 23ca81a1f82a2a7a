"""Injected faults for testing fault tolerance in one process: parties that fail to answer.

A :class:`FaultPlan` decides, message by message and from its own seed, whether a party's
reply is lost. The party still handles the request (it did the work); the sender sees a
:class:`~vflo.errors.DeliveryTimeoutError`, exactly as a deadline expiring over a network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from vflo.comm.message import Message
from vflo.errors import ConfigError


@dataclass
class FaultPlan:
    """Lose each reply of ``party`` to the message kinds in ``kinds`` with probability ``fraction``."""

    drop: Mapping[str, float]
    kinds: tuple[str, ...] = ()
    seed: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for party, fraction in self.drop.items():
            if not 0.0 <= fraction < 1.0:
                raise ConfigError(f"drop fraction for {party!r} must be in [0, 1), got {fraction}")
        self._rng = np.random.default_rng(self.seed)

    def lose_reply(self, request: Message) -> bool:
        fraction = self.drop.get(request.receiver, 0.0)
        if fraction <= 0.0 or (self.kinds and request.kind not in self.kinds):
            return False
        lost = bool(self._rng.random() < fraction)
        if lost:
            self.dropped[request.receiver] = self.dropped.get(request.receiver, 0) + 1
        return lost
