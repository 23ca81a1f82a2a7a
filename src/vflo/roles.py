"""Who takes part in a federation, and in which role.

``active`` holds labels (and usually coordinates); ``passive`` holds features only;
``server`` and ``dealer`` are data-less roles some protocols need (a semi-honest
server that sums masked blocks, a trusted party that hands out masks).
"""

from __future__ import annotations

import contextlib
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

from vflo.errors import ConfigError

Role = Literal["active", "passive", "server", "dealer"]
ROLES: tuple[str, ...] = get_args(Role)
DATA_ROLES = ("active", "passive")
PARTY_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
# Names a host or network tool already means something by: a party called so could be confused with one.
RESERVED_NAMES = frozenset({"localhost", "localhost-localdomain", "ip6-localhost", "broadcasthost"})
# Full stops that IDNA reads as a label separator, as "." (NFKC makes U+FF0E one, not these).
_DOTS = str.maketrans({"\u3002": ".", "\uff61": "."})
SAME_NAME = "ignoring case, a trailing dot and Unicode look-alikes that NFKC folds (e.g. full-width letters)"


@lru_cache(maxsize=4096)
def as_role(text: str) -> Role:
    """``text`` as a role, or the error that names the roles there are (a role read from a file or a message)."""
    for role in get_args(Role):
        if text == role:
            return role  # type: ignore[no-any-return]  # get_args loses the Literal: each value is one of Role's
    raise ConfigError(f"unknown role {text!r}: a party is one of {', '.join(map(repr, ROLES))}")


def normal_name(name: str) -> str:
    """The one form in which party names and certificate names are compared everywhere.

    Case-folded, Unicode NFKC (full-width and other compatibility look-alikes fold to their plain letters),
    IDNA A-labels (``xn--...``) decoded first, trailing dots stripped: "Hospital", "hospital.",
    "ＨＯＳＰＩＴＡＬ" and "hospital" are one name, as TLS host-name checks (case-insensitive, trailing dot
    ignored) already treat the ASCII ones. A look-alike from another script (Cyrillic "а") is not folded."""
    labels = []
    for label in name.translate(_DOTS).split("."):
        if label[:4].lower() == "xn--":
            with contextlib.suppress(UnicodeError, ValueError):
                label = label[4:].encode("ascii").decode("punycode")
        labels.append(label)
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", ".".join(labels)).casefold())
    return folded.translate(_DOTS).rstrip(".")


def name_clashes(names: Iterable[str]) -> list[tuple[str, str]]:
    """Pairs of ``names`` that are one name in normal form (see :func:`normal_name`), in the order met."""
    seen: dict[str, str] = {}
    clashes = []
    for name in names:
        key = normal_name(name)
        if key in seen:
            clashes.append((seen[key], name))
        else:
            seen[key] = name
    return clashes


def check_distinct_names(names: Iterable[str]) -> None:
    """Refuse two parties whose names are one name in normal form ("lab" and "Lab", or the same name twice)."""
    from vflo.errors import ConfigError

    clashes = name_clashes(names)
    if clashes:
        a, b = clashes[0]
        same = "is named twice" if a == b else f"and {b!r} are one name ({SAME_NAME})"
        raise ConfigError(f"party {a!r} {same}: give every party a name of its own")


def check_party_name(name: str) -> None:
    """A name a deployed party may have: it becomes its certificate's name. Written in normal form (lower
    case), so that two parties can never be told apart only by spelling."""
    from vflo.errors import ConfigError

    if not name or set(name) - PARTY_NAME_CHARS:
        raise ConfigError(f"party name {name!r} must be letters, digits, '-' or '_'")
    if normal_name(name) in RESERVED_NAMES:
        raise ConfigError(f"party name {name!r} is a host name every machine answers to; choose another name")
    if normal_name(name) != name:
        raise ConfigError(f"party name {name!r} must be written in lower case, as {normal_name(name)!r}: names are "
                          f"compared {SAME_NAME}, so {name!r} could pass for a party {normal_name(name)!r}")


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
