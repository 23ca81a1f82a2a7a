"""vflo's own transport as a plug-in: each party a gRPC server with mutual TLS, the coordinator its client.

The party's side is :func:`~vflo.deploy.party.start_party` (its server on ``listen``, its clients to the
addresses under ``[peers]``); the coordinator's is a :class:`~vflo.deploy.Deployment` with no link, which dials
each party at its ``[[parties]]`` address.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from vflo.data.partydata import PartyData
from vflo.deploy.configs import DeployConfig, PartyConfig
from vflo.deploy.kind import Job, TransportKind
from vflo.deploy.party import RunningParty, serve_forever, start_party
from vflo.errors import ConfigError

T = TypeVar("T")


def host(config: PartyConfig, options: Any, *, data: PartyData | None = None,
         serve: PartyData | None = None) -> RunningParty:
    return start_party(config, data=data, serve=serve)


def serve(config: PartyConfig, options: Any, extra: Sequence[str]) -> int:
    if extra:
        raise ConfigError(f"over gRPC `vflo party serve` takes nothing after --, got {' '.join(extra)!r}: that is "
                          "for a transport that starts a program of its own (--transport flower: its SuperNode)")
    return serve_forever(config)


def coordinate(deploy: DeployConfig, job: Job[T], *, contacts: Mapping[str, str] | None = None,
               needed: Sequence[str] | None = None, optional: Sequence[str] = ()) -> T:
    """``job`` with every party dialled at its address: ``contacts``' where it gives one, else the deploy
    config's. A party is dialled when a message is first sent to it, so ``needed`` and ``optional`` change
    nothing here: one that is not needed is never contacted."""
    if contacts:
        parties = tuple(replace(p, address=contacts.get(p.name, p.address)) for p in deploy.parties)
        deploy = replace(deploy, parties=parties)
    deploy.check_grpc()
    return job(deploy, None)


TRANSPORT = TransportKind(
    name="grpc", about="vflo's own: each party a gRPC server with mutual TLS at its address (the default)",
    host=host, serve=serve, coordinate=coordinate)
