"""``vflo datasets``, ``vflo methods`` and ``vflo transports``: what vflo has, and what each method's messages carry."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from vflo.cli.common import new_console
from vflo.errors import ConfigError


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    ds = sub.add_parser("datasets", help="list datasets and whether their files are in place")
    ds.set_defaults(func=_datasets)
    ds.add_argument("--data-dir", type=Path)
    methods = sub.add_parser("methods", help="list methods; --messages: what each message kind carries, who sends it")
    methods.set_defaults(func=lambda args: _methods(args.messages, markdown=args.markdown))
    methods.add_argument("--messages", nargs="?", const="all", metavar="NAME",
                         help="the message kinds of method NAME (or of every deployable method): who may send each, "
                              "and what its request and reply carry")
    methods.add_argument("--markdown", action="store_true",
                         help="with --messages: one Markdown table (as in docs/security.md)")
    transports = sub.add_parser("transports", help="list the ways parties reach each other, and whether each can run "
                                                   "here")
    transports.set_defaults(func=lambda args: _transports())


def _transports() -> int:
    from rich.markup import escape
    from rich.table import Table

    from vflo.transports import DEFAULT, TRANSPORTS

    table = Table(title=escape(f"transports ([transport] kind in a party's config; default {DEFAULT})"))
    for col in ("name", "what it is", "options ([transport] keys)", "available"):
        table.add_column(escape(col))
    for kind in TRANSPORTS.values():
        why = kind.unavailable()
        keys = ", ".join(f.name for f in fields(kind.options)) or "-"
        table.add_row(kind.name, escape(kind.about), keys, escape(f"no: {why}") if why else "yes")
    new_console().print(table)
    return 0


def _datasets(args: argparse.Namespace) -> int:
    from rich.table import Table

    from vflo.data.datadir import locate, resolve_data_dir
    from vflo.data.datasets import dataset_specs
    from vflo.errors import DataFileError

    table = Table(title=f"datasets (data directory: {resolve_data_dir(args.data_dir)})")
    for col in ("name", "task", "classes", "rows x features", "kind", "available"):
        table.add_column(col)
    for spec in dataset_specs().values():
        status = "yes"
        for f in spec.files:
            try:
                locate(f, args.data_dir)
            except DataFileError as exc:
                status = f"no: {exc}"
        kind = f"STAND-IN for {spec.standin_for}" if spec.standin else "real"
        table.add_row(spec.name, spec.task, str(spec.n_classes or "-"), f"{spec.shape[0]} x {spec.shape[1]}",
                      kind, status)
    new_console().print(table)
    return 0


def _methods(messages: str | None = None, *, markdown: bool = False) -> int:
    from rich.table import Table

    from vflo.methods.registry import get_method, method_names, scoring_text

    if messages is not None:
        from vflo.audit import declarations

        name = None if messages == "all" else messages
        if markdown:
            from vflo.audit import markdown as table_markdown

            print(table_markdown(name))
            return 0
        if name is not None and get_method(name).simulation_only:
            raise ConfigError(f"{name} runs only in simulation (it pools every party's raw features): it sends no "
                              "messages a deployment would")
        table = Table(title=f"messages of {name or 'every deployable method'}")
        for col in ("kind", "who may send it", "the request carries", "the reply carries"):
            table.add_column(col)
        for d in declarations(name):
            table.add_row(d.kind, " or ".join(d.senders), ", ".join(f"{f} ({c})" for f, c in d.request.items()) or "-",
                          ", ".join(f"{f} ({c})" for f, c in d.reply.items()) or "-")
        new_console().print(table)
        return 0

    table = Table(title="methods")
    for col in ("name", "scores", "also needs", "checkpoints", "what it is", "from"):
        table.add_column(col)
    for name in method_names():
        cls = get_method(name)
        helpers = sorted({p.role for p in cls(**cls.quick).extra_parties(())})
        table.add_row(name, scoring_text(cls), ", ".join(helpers) or "-", ", ".join(cls.checkpointed) or "-",
                      cls.summary, cls.paper)
    new_console().print(table)
    return 0

