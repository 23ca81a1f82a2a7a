"""Who takes part in a federation, and in which role.

``active`` holds labels (and usually coordinates); ``passive`` holds features only;
``server`` and ``dealer`` are data-less roles some protocols need (a semi-honest
server that sums masked blocks, a trusted party that hands out masks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Role = Literal["active", "passive", "server", "dealer"]
ROLES: tuple[str, ...] = get_args(Role)
DATA_ROLES = ("active", "passive")
PARTY_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
# Names a host or network tool already means something by: a party called so could be confused with one.
RESERVED_NAMES = frozenset({"localhost", "localhost-localdomain", "ip6-localhost", "broadcasthost"})


def check_party_name(name: str) -> None:
    """A name a deployed party may have: it becomes its certificate's name."""
    from vflo.errors import ConfigError

    if not name or set(name) - PARTY_NAME_CHARS:
        raise ConfigError(f"party name {name!r} must be letters, digits, '-' or '_'")
    if name.lower() in RESERVED_NAMES:
        raise ConfigError(f"party name {name!r} is a host name every machine answers to; choose another name")


@dataclass(frozen=True)
class PartyInfo:
    """Public facts about a party: its name and role. Never its data."""

    name: str
    role: Role

    @property
    def holds_data(self) -> bool:
        return self.role in DATA_ROLES


def active_party(parties: tuple[PartyInfo, ...]) -> PartyInfo:
    actives = [p for p in parties if p.role == "active"]
    if len(actives) != 1:
        from vflo.errors import ConfigError

        raise ConfigError(
            f"a federation needs exactly one active party (the label holder), got {len(actives)}: "
            "set role = 'active' on exactly one party"
        )
    return actives[0]
