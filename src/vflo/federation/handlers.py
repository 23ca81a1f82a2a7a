"""Handler sets: the message kinds a party serves, each with the payload it accepts.

A :class:`HandlerSet` is anything a :class:`~vflo.federation.node.Node` can serve: a method
(installed by ``control.setup``) or a protocol every node serves whatever the method (alignment).
Its handlers are functions marked with :func:`handles`; each receives only its own party's
:class:`~vflo.federation.node.NodeContext` and the incoming payload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from vflo.comm.message import FieldSpec, Payload

if TYPE_CHECKING:
    from vflo.federation.node import NodeContext

HandlerFn = Callable[[Any, "NodeContext", Payload], Payload]


#: Who may send a kind: ``"coordinator"`` (the active party that set the method up; before any setup, any
#: peer this party knows as active), ``"delegate"`` (a party the method lets coordinate a step of its own,
#: e.g. VFL-ASP's first hop), or a role this party's own config gives the sender.
Sender = Literal["coordinator", "delegate", "active", "passive", "server", "dealer"]
SENDERS: frozenset[str] = frozenset(get_args(Sender))


@dataclass(frozen=True)
class HandlerInfo:
    """A message kind, who may send it, and the payload fields its handler accepts."""

    kind: str
    accepts: Mapping[str, FieldSpec]
    senders: tuple[Sender, ...] = ("coordinator",)


F = TypeVar("F", bound=Callable[..., Payload])


def handles(kind: str, *, senders: tuple[Sender, ...] = ("coordinator",), **accepts: FieldSpec) -> Callable[[F], F]:
    """Mark a function as the handler of message ``kind`` from ``senders`` with payload fields ``accepts``.

    A party runs it only for a sender its own config places in ``senders`` (the coordinator by default);
    anything else is refused before the handler sees the payload.
    """
    unknown = set(senders) - SENDERS
    if unknown or not senders:
        raise ValueError(f"{kind}: senders must be some of {sorted(SENDERS)}, got {senders}")

    def mark(fn: F) -> F:
        fn._vflo_handler = HandlerInfo(kind=kind, accepts=accepts, senders=senders)  # type: ignore[attr-defined]
        return fn

    return mark


class HandlerSet:
    """A class whose marked functions serve message kinds; subclasses inherit and may override them."""

    def delegates(self) -> frozenset[str]:
        """Parties that may send this set's ``"delegate"`` kinds: none unless a method names some."""
        return frozenset()

    @classmethod
    def handler_table(cls) -> dict[str, tuple[HandlerInfo, str]]:
        """Each kind this class serves, with its handler's description and attribute name."""
        table: dict[str, tuple[HandlerInfo, str]] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                info = getattr(value, "_vflo_handler", None)
                if isinstance(info, HandlerInfo):
                    table[info.kind] = (info, attr)
        return table
