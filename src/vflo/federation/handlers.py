"""Handler sets: the message kinds a party serves, each with the payload it accepts.

A :class:`HandlerSet` is anything a :class:`~vflo.federation.node.Node` can serve: a method
(installed by ``control.setup``) or a protocol every node serves whatever the method (alignment).
Its handlers are functions marked with :func:`handles`; each receives only its own party's
:class:`~vflo.federation.node.NodeContext` and the incoming payload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from vflo.comm.message import FieldSpec, Payload

if TYPE_CHECKING:
    from vflo.federation.node import NodeContext

HandlerFn = Callable[[Any, "NodeContext", Payload], Payload]


@dataclass(frozen=True)
class HandlerInfo:
    """A message kind and the payload fields its handler accepts."""

    kind: str
    accepts: Mapping[str, FieldSpec]


F = TypeVar("F", bound=Callable[..., Payload])


def handles(kind: str, **accepts: FieldSpec) -> Callable[[F], F]:
    """Mark a function as the handler of message ``kind`` with payload fields ``accepts``."""

    def mark(fn: F) -> F:
        fn._vflo_handler = HandlerInfo(kind=kind, accepts=accepts)  # type: ignore[attr-defined]
        return fn

    return mark


class HandlerSet:
    """A class whose marked functions serve message kinds; subclasses inherit and may override them."""

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
