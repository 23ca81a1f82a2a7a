"""The transports, one line each, and how a party or a deployment chooses one.

A new transport is its module (a party's side, the coordinator's, its options, when it cannot run: a
:class:`~vflo.deploy.kind.TransportKind`) and one line in :data:`TRANSPORTS`. `vflo party serve` (``--transport``,
or the party config's ``[transport] kind``), `vflo run --deploy`, `vflo predict --deploy`, `vflo align` and the
docs read this list; ``tests/test_transports.py`` runs the same contract over every entry.
"""

from __future__ import annotations

from typing import Any

from vflo.deploy import grpc
from vflo.deploy.configs import PartyConfig
from vflo.deploy.kind import TransportKind
from vflo.errors import ConfigError, unknown_name
from vflo.flower import plugin as flower

#: Every transport by name: vflo's own gRPC first (what a config without ``[transport]`` uses).
TRANSPORTS: dict[str, TransportKind] = {t.name: t for t in (
    grpc.TRANSPORT,
    flower.TRANSPORT,
)}
DEFAULT = "grpc"


def get(name: str) -> TransportKind:
    """The transport called ``name``; a :class:`ConfigError` lists the others."""
    if name not in TRANSPORTS:
        raise ConfigError(unknown_name("transport", name, TRANSPORTS))
    return TRANSPORTS[name]


def of(config: PartyConfig, *, kind: str | None = None) -> tuple[TransportKind, Any]:
    """The transport ``config`` is reached by (``kind``, else its ``[transport] kind``, else gRPC) and that
    transport's options from its ``[transport]`` table; a :class:`ConfigError` if it cannot run here."""
    table = dict(config.transport)
    named = table.get("kind", DEFAULT)
    if not isinstance(named, str):
        raise ConfigError(f"party {config.name!r}: [transport] kind is a name, one of {', '.join(TRANSPORTS)}; "
                          f"got {named!r}")
    chosen = get(kind or named)
    if kind and kind != named and len(table) > ("kind" in table):
        raise ConfigError(f"party {config.name!r}: its [transport] table sets {named!r}'s keys "
                          f"({', '.join(k for k in table if k != 'kind')}), and --transport asks for {kind!r}; "
                          "change the config's [transport] instead")
    why = chosen.unavailable()
    if why:
        raise ConfigError(f"party {config.name!r}: the {chosen.name!r} transport {why}")
    options = chosen.settings(table if chosen.name == named else {}, where=f"party {config.name!r}'s [transport]")
    return chosen, options
