"""A transport written the way a new one is added: this module and one line in ``vflo.transports.TRANSPORTS``
(``tests/test_transports.py`` adds that line for its tests). Every party a node in this process, messages through
the codec: no network, so it only serves to show what a transport provides and that the contract checks it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from vflo.comm.local import LocalTransport
from vflo.data.partydata import PartyData
from vflo.deploy.configs import DeployConfig, PartyConfig
from vflo.deploy.kind import Job, TransportKind
from vflo.deploy.party import build_node
from vflo.errors import ConfigError, TransportError
from vflo.party.node import Node

T = TypeVar("T")
# The parties hosted in this process, by name: what "reaching" one means here.
HOSTED: dict[str, Node] = {}


@dataclass
class Hosted:
    node: Node

    @property
    def contact(self) -> str:
        return self.node.name

    def stop(self) -> None:
        HOSTED.pop(self.node.name, None)


class InProcess(LocalTransport):
    """A hosted party that was stopped is gone, as one whose process ended."""

    def __init__(self, nodes: Mapping[str, Node], *, hosted: Sequence[str]) -> None:
        super().__init__(nodes)
        self.hosted = set(hosted)

    def _deliver(self, messages: Sequence[Any]) -> list[Any]:
        receiver = messages[0].receiver
        if receiver in self.hosted and receiver not in HOSTED:
            raise TransportError(f"party {receiver!r} could not be reached: it is no longer hosted in this process")
        return super()._deliver(messages)


def host(config: PartyConfig, options: Any, *, data: PartyData | None = None,
         serve: PartyData | None = None) -> Hosted:
    HOSTED[config.name] = build_node(config, data=data, serve=serve)
    return Hosted(HOSTED[config.name])


def serve(config: PartyConfig, options: Any, extra: Sequence[str]) -> int:
    raise ConfigError(f"party {config.name!r}: the inproc transport hosts a party only beside its coordinator, in "
                      "one process; serve it with --transport grpc")


def coordinate(deploy: DeployConfig, job: Job[T], *, contacts: Mapping[str, str] | None = None,
               needed: Sequence[str] | None = None, optional: Sequence[str] = ()) -> T:
    names = list(contacts or {})

    def link(node: Node) -> InProcess:
        return InProcess({**{n: HOSTED[n] for n in names if n in HOSTED}, node.name: node}, hosted=names)

    return job(deploy, link)


TRANSPORT = TransportKind(name="inproc", about="every party in this process (a test of the plug-in contract)",
                          host=host, serve=serve, coordinate=coordinate)
