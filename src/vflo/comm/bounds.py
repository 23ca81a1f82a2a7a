"""What one peer may hold of a party's server at once (a party's ``[policy]`` sets it; the server enforces it).

Kept apart from the gRPC server so that a party's policy can name its defaults without importing gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, kw_only=True)
class PeerBounds:
    """What one peer may hold of a party's server at once: calls in progress (``max_peer_calls``), message bytes
    received and not yet answered (``max_peer_bytes``), and seconds for a call's message to arrive
    (``max_arrival_seconds``). A party's ``[policy]`` gives them (:class:`vflo.party.policy.Policy` has these
    fields and defaults); these are the defaults."""

    max_peer_calls: int = 8
    max_peer_bytes: int = 512 << 20
    max_arrival_seconds: float = 300.0


@runtime_checkable
class HasPeerBounds(Protocol):
    """Anything with a party's bounds per peer (its policy)."""

    @property
    def max_peer_calls(self) -> int: ...
    @property
    def max_peer_bytes(self) -> int: ...
    @property
    def max_arrival_seconds(self) -> float: ...
