"""Handler sets: the message kinds a party serves, each with the payload it accepts.

A :class:`HandlerSet` is anything a :class:`~vflo.party.node.Node` can serve: a method
(installed by ``control.setup``) or a protocol every node serves whatever the method (alignment).
Its handlers are functions marked with :func:`handles`; each receives only its own party's
:class:`~vflo.party.node.NodeContext` and the incoming payload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from vflo.comm.message import FieldSpec, Payload
from vflo.dp import PrivacyPlan

if TYPE_CHECKING:
    from vflo.party.context import NodeContext

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

#: What an exchange of a kind shows an attacker (declared with :func:`reveals`), read by the privacy views
#: (:mod:`vflo.privacy.views`, which names no kind and reads a run's messages by these declarations alone). Each is
#: read from the handler's declared fields: "the ID field" is a field declared ``"ids"``, "the rows field" the one
#: reply field declared ``"outputs"`` or ``"masked features"``, "positions" the request field declared
#: ``"membership"``; :func:`reveals` refuses a view whose fields the declaration lacks.
Reveals = Literal[
    "row ids",              # request: its ID fields, NAME_ids, list the rows of subset NAME that later requests of
                            # the same sender pick by position
    "training batch",       # reply: the sender's bottom-model outputs (rows field) for a batch of its rows, named by
                            # the reply's ID field or else by the request's positions into the rows of its "subset"
                            # field ("train" without one); unless its "training" flag is off, the batch whose
                            # gradients the sender's next "gradients" request carries
    "activations",          # reply: the sender's bottom-model outputs in evaluation mode (rows field) for the rows
                            # the request's ID field names, during training
    "scoring activations",  # the same, for rows to score
    "aligned rows",         # reply: rows of the sender's data (rows field), in the order the receiver aligned on
    "scoring rows",         # reply: rows of the sender's data (rows field) to score, for the request's ID field
    "factors",              # reply: U ("u") and Σ ("s") of the rows the requester aligned on, about every party's
                            # columns, under the requester's own row masks
    "row masks",            # reply: the requester's own secret row masks (the "p" fields of an orthogonal mask)
    "gradients",            # request: gradients (the field declared "gradients") for the receiver's last training
                            # batch
    "tree nodes",           # request: which of the receiver's "row ids" rows ("rows", by "counts") share a node
                            # ("nodes", with their "parents" and "siblings") of tree "tree"
]
REVEALS: frozenset[str] = frozenset(get_args(Reveals))
#: The views whose reply carries rows of the sender's data (its rows field), and those of rows to score.
RELEASES: frozenset[Reveals] = frozenset({"training batch", "activations", "scoring activations", "aligned rows",
                                      "scoring rows", "factors"})
SCORING: frozenset[Reveals] = frozenset({"scoring activations", "scoring rows"})
#: The views of a party's bottom-model outputs.
ACTIVATIONS: frozenset[Reveals] = frozenset({"training batch", "activations", "scoring activations"})


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
    #: What an exchange of the kind shows an attacker (:data:`Reveals`), if anything the privacy views read.
    reveals: Reveals | None = None

    def request_content(self, name: str) -> Content:
        return self.carries.get(name, "control")

    def request_fields(self, *contents: Content) -> list[str]:
        """The request's fields declared to carry any of ``contents``."""
        return [name for name in self.accepts if self.request_content(name) in contents]

    def reply_fields(self, *contents: Content) -> list[str]:
        """The reply's fields declared to carry any of ``contents``."""
        return [name for name, content in self.replies.items() if content in contents]

    def rows_field(self) -> str:
        """The reply field that carries the rows a :data:`RELEASES` view releases."""
        fields = self.reply_fields("outputs", "masked features")
        if len(fields) != 1:
            raise ValueError(f"{self.kind}: {self.reveals!r} is read from one reply field declared 'outputs' or "
                             f"'masked features'; its replies declare {dict(self.replies)}")
        return fields[0]


F = TypeVar("F", bound=Callable[..., Payload])


def handles(kind: str, *, served: str, senders: tuple[Sender, ...] = ("coordinator",),
            carries: Mapping[str, Content] | None = None, replies: Mapping[str, Content] | None = None,
            **accepts: FieldSpec) -> Callable[[F], F]:
    """Mark a function as the handler of message ``kind`` from ``senders`` with payload fields ``accepts``;
    ``carries`` says what request fields other than settings carry, ``replies`` what every reply field carries;
    ``served`` says when in its protocol a party serves it (the audit's and docs/security.md's "served when").
    What an exchange of it shows an attacker is declared beside it with :func:`reveals`.

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
    info = HandlerInfo(kind=kind, accepts=accepts, senders=senders, carries=carries, replies=replies, served=served)

    def mark(fn: F) -> F:
        fn._vflo_handler = info  # type: ignore[attr-defined]  # a mark on the function object, read by handler_table
        return fn

    return mark


def reveals(view: Reveals) -> Callable[[F], F]:
    """Declare what an exchange of a kind shows an attacker (:data:`Reveals`), for the privacy views: written
    right above the kind's ``@handles``, whose declaration it completes. A view read from fields the declaration
    lacks is refused here, when the handler is defined."""

    def mark(fn: F) -> F:
        info = getattr(fn, "_vflo_handler", None)
        if not isinstance(info, HandlerInfo):
            raise ValueError(f"@reveals({view!r}) on {getattr(fn, '__qualname__', fn)!r}: put it above the @handles "
                             "whose kind it describes")
        info = replace(info, reveals=view)
        _check_reveals(info)
        fn._vflo_handler = info  # type: ignore[attr-defined]  # a mark on the function object, read by handler_table
        return fn

    return mark


def _check_reveals(info: HandlerInfo) -> None:
    """That the fields :data:`Reveals` says a view is read from are declared: a view the privacy views could not
    read is refused where it is declared."""
    kind, view = info.kind, info.reveals
    if view not in REVEALS:
        raise ValueError(f"{kind}: reveals must be one of {sorted(REVEALS)}, got {view!r}")
    if view in RELEASES and view != "factors":
        info.rows_field()
    needs: list[tuple[bool, str]] = []
    if view in {"activations", "scoring activations", "scoring rows"}:
        needs.append((len(info.request_fields("ids")) == 1, "one request field declared 'ids' (the rows asked)"))
    if view == "training batch":
        needs.append((len(info.reply_fields("ids")) == 1 or len(info.request_fields("membership")) == 1,
                      "one reply field declared 'ids', or one request field declared 'membership' (positions)"))
    if view == "row ids":
        named = info.request_fields("ids")
        needs.append((bool(named) and all(f.endswith("_ids") for f in named),
                      "request fields declared 'ids', each named SUBSET_ids"))
    if view == "gradients":
        needs.append((len(info.request_fields("gradients")) == 1, "one request field declared 'gradients'"))
    if view == "factors":
        needs.append(({"u", "s"} <= set(info.reply_fields("model")), "reply fields u and s declared 'model'"))
    if view == "row masks":
        needs.append((bool(info.reply_fields("masks")), "reply fields declared 'masks'"))
    if view == "tree nodes":
        needs.append(({"tree", "rows", "nodes", "parents", "siblings", "counts"} <= set(info.accepts),
                      "request fields tree, rows, nodes, parents, siblings and counts"))
    if missing := [what for ok, what in needs if not ok]:
        raise ValueError(f"{kind}: reveals {view!r} is read from {' and '.join(missing)}; declare them")


class HandlerSet:
    """A class whose marked functions serve message kinds; subclasses inherit and may override them.

    A party answers every kind its method's class has a handler for, so a method inherits only the handlers of
    steps it runs: a variant that reuses another method's code without its protocol shares functions, not a base
    class (Ablation and APC-VFL share the student's training; only FedSVD has the SVD's right-factor handlers)."""

    def delegates(self) -> frozenset[str]:
        """Parties that may send this set's ``"delegate"`` kinds: none unless a method names some."""
        return frozenset()

    def planned_privacy(self, role: str, *, party: str = "") -> PrivacyPlan | None:
        """What this party's side of a run (in ``role``; ``party``: its name, where a method's sides in one role
        differ) will spend of each person's privacy, at most, as its settings say before it starts: checked against
        its budget at setup. None: nothing it sends is noised."""
        return None

    def epsilon_scope(self) -> str:
        """What the ε of this party's releases covers and what it does not (empty: no ε to report)."""
        return ""

    def account_scope(self, role: str) -> str:
        """What the account of a party in ``role`` covers, of this method's releases: :meth:`epsilon_scope`, where
        one role releases everything the method noises."""
        return self.epsilon_scope()

    def unprotectable(self, role: str) -> str:
        """Why this method's side in ``role`` cannot be protected, in words a party's refusal can show (where
        :meth:`protected` gives None)."""
        return "sends what no noise it can calibrate covers"

    def protected(self, role: str, scale: float, *, rows: int,
                  party: str = "") -> tuple[HandlerSet, PrivacyPlan] | None:
        """This method with its side in ``role`` protected at noise scale ``scale`` (larger: more noise, less ε), for
        a party of ``rows`` rows, and what it would then spend: how a party that protects everything it sends
        calibrates a method to its budget. None: this side cannot be protected (it sends what no noise covers)."""
        return None

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
