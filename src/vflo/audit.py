"""What every message kind carries, and who may send it: the declarations the message audit holds each
message to, as ``vflo methods --messages`` prints them and docs/security.md shows them; and the generated tables
of what each party decides (docs/security.md) and keeps (docs/models.md)."""

from __future__ import annotations

from dataclasses import dataclass

from vflo.align.blind_join import EXPLORE
from vflo.align.protocol import ALIGNMENT
from vflo.methods.registry import get_method, method_names
from vflo.methods.saved import Saved
from vflo.party.handlers import HandlerInfo
from vflo.party.node import CONTROL_INFO


@dataclass(frozen=True)
class Declaration:
    """One message kind: who may send it, and what its request's and its reply's fields carry."""

    kind: str
    senders: tuple[str, ...]
    request: dict[str, str]
    reply: dict[str, str]
    methods: tuple[str, ...]
    served: str

    @classmethod
    def of(cls, info: HandlerInfo, methods: tuple[str, ...]) -> Declaration:
        return cls(kind=info.kind, senders=tuple(info.senders),
                   request={f: info.request_content(f) for f in info.accepts}, reply=dict(info.replies),
                   methods=methods, served=info.served)


def handler_infos(method: str | None = None) -> dict[str, HandlerInfo]:
    """Every kind a party may be asked, with its declaration: control, alignment, vflo explore, and ``method``'s
    (or every deployable method's)."""
    infos: dict[str, HandlerInfo] = dict(CONTROL_INFO)
    infos |= {kind: info for handlers in (*ALIGNMENT, *EXPLORE) for kind, (info, _) in handlers.handler_table().items()}
    for name in [method] if method else deployable():
        infos |= {kind: info for kind, (info, _) in get_method(name).handler_table().items()}
    return infos


def deployable() -> list[str]:
    return [m for m in method_names() if not get_method(m).simulation_only]


def declarations(method: str | None = None) -> list[Declaration]:
    """The declarations of ``method``'s kinds (or of every deployable method's), with the methods using each."""
    names = [method] if method else deployable()
    users: dict[str, list[str]] = {}
    for name in names:
        for kind in get_method(name).handler_table():
            users.setdefault(kind, []).append(name)
    out = []
    for kind, info in handler_infos(method).items():
        used = tuple(users.get(kind, ())) if kind in users else ("all",)
        out.append(Declaration.of(info, used))
    return out


def _fields(fields: dict[str, str]) -> str:
    shown = [f"{f} ({c})" for f, c in fields.items() if c != "control"]
    settings = [f for f, c in fields.items() if c == "control"]
    return ", ".join([*shown, *([f"settings: {', '.join(settings)}"] if settings else [])]) or "nothing"


def markdown(method: str | None = None) -> str:
    """One table: each kind, the methods that use it, who may send it, what the request and the reply carry."""
    rows = ["| kind | methods | who may send it | served when | the request carries | the reply carries |",
            "|---|---|---|---|---|---|"]
    for d in declarations(method):
        rows.append(f"| `{d.kind}` | {', '.join(d.methods)} | {' or '.join(d.senders)} | {d.served} | "
                    f"{_fields(d.request)} | {_fields(d.reply)} |")
    return "\n".join(rows)


def settings_markdown() -> str:
    """The table of what a passive party decides and shares, for every registered method (docs/security.md)."""
    from vflo.methods.own_settings import settings_table

    return settings_table([get_method(name) for name in method_names()])



def _kept(declared: tuple[Saved, ...]) -> str:
    return ", ".join(f"`{s.name}`" + (f" ({s.about})" if s.about else "") for s in declared) or "nothing"


def models_markdown() -> str:
    """What each party keeps of every deployable method's fitted model (docs/models.md): each method's ``saves``."""
    rows = ["| method | scores | active party keeps | each passive party keeps | server and dealer keep |",
            "|---|---|---|---|---|"]
    for name in deployable():
        cls = get_method(name)
        scores = ("active only" if cls.inference == "active_only" else
                  "whoever holds the person" if cls.any_subset else "together")
        helpers = cls().extra_parties(())
        helper = _kept(tuple(s for h in helpers for s in cls.saves.of(h.role))) if helpers else "—"
        rows.append(f"| `{name}` | {scores} | {_kept(cls.saves.model + cls.saves.of('active'))} | "
                    f"{_kept(cls.saves.of('passive'))} | {helper} |")
    return "\n".join(rows)
