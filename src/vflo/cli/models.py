"""``vflo models``: the trainings a party keeps in its model folder, and removing all but the newest."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vflo.cli.common import new_console, shown
from vflo.errors import ConfigError


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    models = sub.add_parser("models", help="list the saved models in a model folder, or prune old trainings")
    models_sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    listing = models_sub.add_parser("list", help="every saved part (and model card) in a model folder: method "
                                                 "label, model ID, party, when saved, size")
    prune = models_sub.add_parser("prune", help="remove all but the newest N trainings of each method at a party "
                                                "(only folders holding a part vflo saved)")
    prune.add_argument("--keep", type=int, required=True, metavar="N", help="trainings to keep per method label")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    for action in (listing, prune):
        action.add_argument("folder", type=Path, nargs="?",
                            help="the model folder (a party's models = ..., or a DIR of vflo run --save DIR)")
        action.add_argument("--config", type=Path, metavar="PARTY.toml",
                            help="a party's own config: its models folder, and only its own parts")
    models.set_defaults(func=_models)


def _models(args: argparse.Namespace) -> int:
    from rich.table import Table

    from vflo.shelf import list_parts, prune

    folder, party = _folder(args)
    if args.models_command == "prune":
        removed = prune(folder, keep=args.keep, party=party, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        for entry in removed:
            print(shown(f"{verb} {entry.path} ({entry.label}, model {entry.model_id}, saved {entry.created})"))
        print(shown(f"{verb} {len(removed)} part(s) from {folder}; kept the newest {args.keep} of each method"))
        return 0
    entries = [e for e in list_parts(folder, cards=True) if party is None or e.party == party]
    table = Table(title=shown(f"saved models in {folder}"))
    for col in ("label", "model_id", "party", "method", "created", "bytes", "path"):
        table.add_column(col, justify="right" if col == "bytes" else "left")
    for entry in entries:
        table.add_row(*(shown(str(v)) if k != "bytes" else f"{v:,}" for k, v in entry.row().items()))
    new_console().print(table)
    if not entries:
        print(shown(f"{folder} holds no saved model"))
    return 0


def _folder(args: argparse.Namespace) -> tuple[Path, str | None]:
    """The folder to read, and the party whose parts count (with --config: the config's models and name)."""
    if args.config is None:
        if args.folder is None:
            raise ConfigError("give a model folder (vflo models list DIR) or a party's config (--config PARTY.toml)")
        return args.folder, None
    from vflo.deploy import load_party_config

    config = load_party_config(args.config)
    if config.models is None:
        raise ConfigError(f"{args.config} names no model folder (models = ...): the party saves no parts")
    folder = Path(config.models)
    if args.folder is not None and args.folder.resolve() != folder.resolve():
        raise ConfigError(f"{args.config} keeps its models in {folder}, not {args.folder}: give one or the other")
    return folder, config.name
