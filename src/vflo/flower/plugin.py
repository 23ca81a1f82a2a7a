"""Flower as a transport plug-in: each party a worker behind its SuperNode, the coordinator a ServerApp.

Nothing here imports flwr until a side is started, so listing the transports works without the ``flower`` extra
(:meth:`TransportKind.unavailable` says what to install).

- A party's side is :class:`~vflo.flower.worker.PartyWorker` (its node, served to its SuperNode's ClientApps on a
  local address) and, under ``vflo party serve --transport flower -- flower-supernode ...``, its SuperNode.
- The coordinator's side is a ServerApp. In a federation Flower starts it (``flwr run``, :mod:`vflo.flower.apps`);
  beside parties started in the same place (``contacts``: their workers' addresses) it runs in Flower's simulation
  runtime, every SuperNode virtual and every party's worker real.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from vflo.data.partydata import PartyData
from vflo.deploy.configs import DeployConfig, PartyConfig
from vflo.deploy.kind import Hosted, Job, TransportKind
from vflo.errors import ConfigError
from vflo.flower import require_flwr, unavailable

if TYPE_CHECKING:
    from flwr.serverapp import Grid

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class FlowerOptions:
    """A party's ``[transport]`` keys over Flower."""

    # Where its worker listens for its SuperNode's ClientApps: unix:PATH or 127.0.0.1:PORT ("": a Unix socket in a
    # new folder only this user may enter).
    worker: str = ""
    # Its SuperNode's command line, started beside the worker (e.g. ["flower-supernode", "--superlink",
    # "HOST:9092", ...]; vflo adds --node-config); empty: start it yourself. `-- ARGS` on the command line wins.
    supernode: tuple[str, ...] = ()


def host(config: PartyConfig, options: Any, *, data: PartyData | None = None,
         serve: PartyData | None = None) -> Hosted:
    require_flwr()
    from vflo.flower.worker import PartyWorker

    return PartyWorker(config, address=options.worker or None, data=data, serve=serve).start()


def serve(config: PartyConfig, options: Any, extra: Sequence[str]) -> int:
    require_flwr()
    from vflo.flower.worker import serve_flower

    supernode = [a for a in extra if a != "--"] or list(options.supernode)
    return serve_flower(config, address=options.worker or None, supernode=supernode)


def coordinate(deploy: DeployConfig, job: Job[T], *, contacts: Mapping[str, str] | None = None,
               needed: Sequence[str] | None = None, optional: Sequence[str] = ()) -> T:
    require_flwr()
    if not contacts:
        raise ConfigError(
            "over Flower the coordinator is a ServerApp, which Flower starts where the SuperLink runs: flwr run "
            "examples/flower FEDERATION --run-config \"experiment='...' deploy='...' out='...'\" to train, or "
            "\"model='...' data='...' deploy='...' out='...'\" to score (docs/flower.md); `vflo run --deploy`, "
            "`vflo predict --deploy` and `vflo align` coordinate over gRPC (set the active party's [transport] kind "
            "= \"grpc\", or leave [transport] out)")
    from vflo.flower.apps import grid_link
    from vflo.flower.simulation import simulate

    def main(grid: Grid, connected: Callable[[], None]) -> T:
        link = grid_link(grid, deploy, needed=needed, optional=optional, wait_optional=bool(optional))

        def found(node: Any) -> Any:
            transport = link(node)
            connected()
            return transport

        return job(deploy, found)

    return simulate(list(contacts.values()), main)


TRANSPORT = TransportKind(
    name="flower", about="Flower: each party a worker behind its SuperNode, the coordinator a ServerApp "
                         "(pip install 'vflo[flower]')",
    host=host, serve=serve, coordinate=coordinate, options=FlowerOptions, unavailable=unavailable)
