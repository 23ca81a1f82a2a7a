"""Handler sets: the message kinds a party serves, each with the payload it accepts.

A :class:`HandlerSet` is anything a :class:`~vflo.party.node.Node` can serve: a method
(installed by ``control.setup``) or a protocol every node serves whatever the method (alignment).
Its handlers are functions marked with :func:`handles`; each receives only its own party's
:class:`~vflo.party.node.NodeContext` and the incoming payload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from vflo.comm.message import FieldSpec, Payload

if TYPE_CHECKING:
    from vflo.party.node import NodeContext

HandlerFn = Callable[[Any, "NodeContext", Payload], Payload]


#: Who may send a kind: ``"coordinator"`` (the active party that set the method up; before any setup, any
#: peer this party knows as active), ``"delegate"`` (a party the method lets coordinate a step of its own,
#: e.g. VFL-ASP's first hop), or a role this party's own config gives the sender.
Sender = Literal["coordinator", "delegate", "active", "passive", "server", "dealer"]
SENDERS: frozenset[str] = frozenset(get_args(Sender))


#: What a payload field carries, for the message audit (``vflo methods --messages``, docs/security.md).
Content = Literal[
    "ids",                # people's IDs in the clear
    "membership",         # which of some IDs or rows a party holds or uses (flags, selectors, positions)
    "blinded ids",        # IDs under a secret exponent (private set intersection)
    "masked features",    # features under secret masks or a secret projection (P X Q, X A)
    "outputs",            # what a party's model computes from its features (activations, encodings, scores)
    "gradients",          # gradients of the loss with respect to a party's outputs
    "transformed labels", # labels under a transform the label owner keeps
    "masks",              # the dealer's secret masks, for one party
    "model",              # fitted factors or parameters (singular vectors and values)
    "ciphertexts",        # values under the label holder's homomorphic encryption (gradients, their bin sums)
    "decisions",          # which way people go at a party's tree splits (its thresholds stay with it)
    "control",            # settings, counts, names and flags
]
CONTENTS: frozenset[str] = frozenset(get_args(Content))


@dataclass(frozen=True)
class HandlerInfo:
    """A message kind, who may send it, the payload fields its handler accepts, and what the request's and the
    reply's fields carry (fields a request does not list carry ``control``)."""

    kind: str
    accepts: Mapping[str, FieldSpec]
    senders: tuple[Sender, ...] = ("coordinator",)
    carries: Mapping[str, Content] = field(default_factory=dict)
    replies: Mapping[str, Content] = field(default_factory=dict)
    #: When a party serves the kind: the step of its protocol (what the handler enforces; a message outside its
    #: step is refused), for the audit and docs/security.md.
    served: str = ""

    def request_content(self, name: str) -> Content:
        return self.carries.get(name, "control")


F = TypeVar("F", bound=Callable[..., Payload])


def handles(kind: str, *, served: str, senders: tuple[Sender, ...] = ("coordinator",),
            carries: Mapping[str, Content] | None = None, replies: Mapping[str, Content] | None = None,
            **accepts: FieldSpec) -> Callable[[F], F]:
    """Mark a function as the handler of message ``kind`` from ``senders`` with payload fields ``accepts``;
    ``carries`` says what request fields other than settings carry, ``replies`` what every reply field carries;
    ``served`` says when in its protocol a party serves it (the audit's and docs/security.md's "served when").

    A party runs it only for a sender its own config places in ``senders`` (the coordinator by default);
    anything else is refused before the handler sees the payload. The message audit holds every message to
    these declarations.
    """
    unknown = set(senders) - SENDERS
    if unknown or not senders:
        raise ValueError(f"{kind}: senders must be some of {sorted(SENDERS)}, got {senders}")
    carries, replies = dict(carries or {}), dict(replies or {})
    if stray := sorted(set(carries) - set(accepts)):
        raise ValueError(f"{kind}: carries names fields the request does not accept: {stray}")
    bad = {c for c in (*carries.values(), *replies.values()) if c not in CONTENTS}
    if bad:
        raise ValueError(f"{kind}: unknown contents {sorted(bad)}; use some of {sorted(CONTENTS)}")

    def mark(fn: F) -> F:
        fn._vflo_handler = HandlerInfo(kind=kind, accepts=accepts, senders=senders,  # type: ignore[attr-defined]
                                       carries=carries, replies=replies, served=served)
        return fn

    return mark


class HandlerSet:
    """A class whose marked functions serve message kinds; subclasses inherit and may override them.

    A party answers every kind its method's class has a handler for, so a method inherits only the handlers of
    steps it runs: a variant that reuses another method's code without its protocol shares functions, not a base
    class (Ablation and APC-VFL share the student's training; only FedSVD has the SVD's right-factor handlers)."""

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
