"""What every message kind carries, and who may send it: the declarations the message audit holds each
message to, as ``vflo methods --messages`` prints them and docs/security.md shows them."""

from __future__ import annotations

from dataclasses import dataclass

from vflo.align.protocol import ALIGNMENT
from vflo.federation.handlers import HandlerInfo
from vflo.federation.node import CONTROL_INFO
from vflo.methods.registry import get_method, method_names

# When a party serves each kind: the step of the protocol it belongs to (what the handlers enforce; a message
# outside its step is refused). Every declared kind has an entry (tests/test_audit.py).
STEPS: dict[str, str] = {
    "control.setup": "no run going on, or the same coordinator starting again; a new run",
    "control.load": "as control.setup, from a saved part of this party's own",
    "control.save": "after the coordinator's setup, once the method is fitted",
    "control.teardown": "during a run: ends it",
    "control.ledger": "during a run, handed over once",
    "control.ready": "any time, from an active peer: whether the folders a run will write to exist",
    "align.plain": "before or during a run; training rows: one set of IDs per asker a run; refused with "
                   "[policy] alignment = 'psi'",
    "align.psi": "before or during a run",
    "align.psi_result": "after this party's own align.psi in the same run",
    "apc.encode_aligned": "after alignment; trains g1 once a run, then encodes the aligned rows asked",
    "apc.encode_serve": "apc_vfl_aligned only (APC-VFL and Ablation score without it): rows to score",
    "split.backward": "after this party's forward pass of the same batch",
    "split.checkpoint": "after init; the newest three per run kept",
    "split.checkpoints": "after init",
    "split.restore": "after init, from this party's own checkpoint of the run",
    "split.finish": "after init: ends training",
    "split.activations": "after training (bottom network built): rows to score or the student's rows",
    "ea.init": "after setup; once",
    "ea.entities": "after ea.init",
    "ea.forward": "after ea.entities; a batch of at most [policy] max_rows",
    "ea.validate": "after ea.entities",
    "svd.deal": "dealer: during a run; masks of at most [policy] max_rows rows and max_mask_bytes",
    "svd.masks": "data party: once a run, from the dealer; masks weaker than its policy refused",
    "svd.upload": "after svd.masks and alignment",
    "svd.right": "only as the answer to this party's own upload",
    "svd.project": "after svd.right: rows to score",
    "svd.block": "server: during a run, from a data party",
    "svd.solve": "server: after the blocks of the same exchange",
    "rap.project": "client: once a run, after alignment (training rows)",
    "rap.project_serve": "client: only IDs of a scoring session the label owner opened, each row once",
    "rap.open_scoring": "client: after training, from the label owner",
    "rap.train": "server: once the clients' projections are gathered",
    "rap.predict": "server: after rap.train",
    "splitnn.init": "after setup and alignment",
    "splitnn.forward": "after splitnn.init",
    "asp.extract": "first hop: after setup; once a run",
    "sb.init": "after setup and alignment; once a run",
    "sb.gradients": "after sb.init; one tree's at a time",
    "sb.histograms": "after the tree's sb.gradients: nodes of that tree nested as a tree's, none with fewer than "
                     "min_node_rows of this party's people, nor leaving fewer of its parent's",
    "sb.splits": "after sb.histograms of the same tree: only nodes this party summed, at a bin its columns have",
    "sb.finish": "after sb.init: ends training (the binned columns dropped, the lookup table kept)",
    "sb.decide": "after sb.finish, or from a saved part: rows to score, never training rows",
}


@dataclass(frozen=True)
class Declaration:
    """One message kind: who may send it, and what its request's and its reply's fields carry."""

    kind: str
    senders: tuple[str, ...]
    request: dict[str, str]
    reply: dict[str, str]
    methods: tuple[str, ...]

    @classmethod
    def of(cls, info: HandlerInfo, methods: tuple[str, ...]) -> Declaration:
        return cls(kind=info.kind, senders=tuple(info.senders),
                   request={f: info.request_content(f) for f in info.accepts}, reply=dict(info.replies),
                   methods=methods)


def handler_infos(method: str | None = None) -> dict[str, HandlerInfo]:
    """Every kind a party may be asked, with its declaration: control, alignment, and ``method``'s (or every
    deployable method's)."""
    infos: dict[str, HandlerInfo] = dict(CONTROL_INFO)
    infos |= {kind: info for kind, (info, _) in ALIGNMENT.handler_table().items()}
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
        rows.append(f"| `{d.kind}` | {', '.join(d.methods)} | {' or '.join(d.senders)} | {STEPS.get(d.kind, '')} | "
                    f"{_fields(d.request)} | {_fields(d.reply)} |")
    return "\n".join(rows)
