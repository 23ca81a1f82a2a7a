"""What a transport is, as a plug-in: how a party is reached, served and coordinated over it.

Each transport's module declares its :class:`TransportKind`; :mod:`vflo.transports` lists them (one line each).
`vflo party serve --transport NAME` (or a party config's ``[transport] kind``), `vflo run --deploy`,
`vflo predict --deploy` and `vflo align` read that list, and ``tests/test_transports.py`` runs the same contract
over every entry.

A transport has two sides:

- **a party's** (:attr:`TransportKind.host`, :attr:`TransportKind.serve`): the party's node started here and
  reachable the transport's way, until it is stopped;
- **the coordinator's** (:attr:`TransportKind.coordinate`): a job run at the active party with a
  :data:`~vflo.deploy.party.Link`, the way its node reaches the others (``None``: vflo's own gRPC, which
  :func:`~vflo.deploy.party.start_party` opens itself).

The job takes the deploy config as the transport sees it (over gRPC with each party's address where
``contacts`` gives one), so the same job runs over any transport.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from vflo import schema
from vflo.data.partydata import PartyData
from vflo.deploy.configs import DeployConfig, PartyConfig
from vflo.deploy.party import Link

T = TypeVar("T")

#: What the coordinator runs over a transport: given the deploy config and the link its node reaches the others by.
Job = Callable[[DeployConfig, "Link | None"], T]


class Hosted(Protocol):
    """A party started here by :attr:`TransportKind.host`: where the coordinator's side reaches it, and its end."""

    @property
    def contact(self) -> str: ...

    def stop(self) -> None: ...


class Host(Protocol):
    def __call__(self, config: PartyConfig, options: Any, *, data: PartyData | None = None,
                 serve: PartyData | None = None) -> Hosted: ...


class Serve(Protocol):
    def __call__(self, config: PartyConfig, options: Any, extra: Sequence[str]) -> int: ...


class Coordinate(Protocol):
    def __call__(self, deploy: DeployConfig, job: Job[T], *, contacts: Mapping[str, str] | None = None,
                 needed: Sequence[str] | None = None, optional: Sequence[str] = ()) -> T: ...


def always() -> str:
    """A transport every installation can run."""
    return ""


@dataclass(frozen=True, kw_only=True)
class NoOptions:
    """A transport whose party needs no setting beyond its config's own (gRPC: ``listen``, ``[peers]``, ``[tls]``)."""


@dataclass(frozen=True, kw_only=True)
class TransportKind:
    """One transport: its ``name`` (``[transport] kind``, ``--transport``), one line on what it is (``about``), the
    frozen dataclass of a party's settings for it (``options``: the other keys of its ``[transport]`` table), and
    its two sides:

    - ``host(config, options, data=, serve=)``: the party's node, reachable this way, started in this process;
      ``data``/``serve`` stand for the rows its files would give.
    - ``serve(config, options, extra)``: the party until SIGINT or SIGTERM (``vflo party serve``); ``extra``: the
      command line after ``--``, which a transport may use (Flower: its SuperNode's) or refuse.
    - ``coordinate(deploy, job, contacts=, needed=, optional=)``: ``job(deploy, link)`` run at the active party.
      ``contacts``: each hosted party's :attr:`Hosted.contact`, where the coordinator's side is started beside
      them (tests, one host); ``needed``: the parties the job cannot do without (None: every party), ``optional``:
      those it takes part with if they answer.
    - ``unavailable()``: why it cannot run in this installation ("" where it can).
    """

    name: str
    about: str
    host: Host
    serve: Serve
    coordinate: Coordinate
    options: type = NoOptions
    unavailable: Callable[[], str] = always

    def settings(self, table: Mapping[str, Any], *, where: str) -> Any:
        """Its options from a party's ``[transport]`` table (``kind`` left out); a :class:`ConfigError` names a
        wrong key."""
        return schema.build(self.options, {k: v for k, v in table.items() if k != "kind"}, where)
