"""``vflo flower party``: one party over Flower (a SuperNode and this party's worker)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    flower = sub.add_parser("flower", help="run a party over Flower (needs pip install 'vflo[flower]')")
    flower.set_defaults(func=_flower_party)
    flower_sub = flower.add_subparsers(dest="flower_command", required=True, metavar="ACTION")
    fparty = flower_sub.add_parser(
        "party", usage="vflo flower party [options] CONFIG [-- flower-supernode ARGS]",
        help="serve one party (PARTY.toml) to its Flower SuperNode until interrupted",
        description="The same as `vflo party serve PARTY.toml --transport flower`, with --worker for its [transport] "
                    "worker. Start this party's worker (its data, model and state, for the whole run) and, with `-- "
                    "flower-supernode ARGS`, its SuperNode, told where the worker listens. The coordinator is a "
                    "ServerApp: flwr run examples/flower SUPERLINK --run-config \"experiment='...' deploy='...' "
                    "out='...'\" (see docs/flower.md).")
    fparty.add_argument("config", type=Path)
    fparty.add_argument("--worker", metavar="ADDRESS",
                        help="where the worker listens for its SuperNode's ClientApp: unix:PATH or 127.0.0.1:PORT "
                             "(default: a Unix socket in a new private folder)")
    fparty.add_argument("--save", type=Path, metavar="DIR", help="this party's model folder (as for party serve)")
    fparty.add_argument("--checkpoints", type=Path, metavar="DIR",
                        help="this party's checkpoint folder (as for party serve)")
    # After `--`: the SuperNode's command line, e.g. -- flower-supernode --insecure --superlink HOST:9092 (vflo adds
    # --node-config); vflo.cli.main hands it over as args.extra.
    fparty.set_defaults(extra=[])


def _flower_party(args: argparse.Namespace) -> int:
    """``vflo party serve PARTY.toml --transport flower``, with ``--worker`` for its ``[transport] worker``."""
    from dataclasses import replace

    from vflo import transports
    from vflo.deploy import load_party_config

    config = load_party_config(args.config)
    if args.save is not None:
        config = replace(config, models=str(args.save))
    if args.checkpoints is not None:
        config = replace(config, checkpoints=str(args.checkpoints))
    kind, options = transports.of(config, kind="flower")
    if args.worker:
        options = replace(options, worker=args.worker)
    return kind.serve(config, options, args.extra)
