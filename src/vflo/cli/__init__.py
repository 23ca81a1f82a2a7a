"""The ``vflo`` command line.

Exit codes (also printed by ``vflo --help``): 0 success; 1 unexpected internal error;
2 invalid configuration, argument or scenario; 3 invalid input data or a data file
missing or failing its checksum; 4 communication or protocol failure; 5 a method
cannot run on this scenario; 130 interrupted.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from typing import Any

from vflo.cli import (
    align,
    catalog,
    certs,
    common,
    compare,
    explore,
    flower,
    holdout,
    models,
    party,
    predict,
    probe,
    run,
    scenario,
    serve,
    worth,
)
from vflo.errors import VfloError
from vflo.private import owner_only_umask
from vflo.version import __version__

#: Each command's module, in the order ``vflo --help`` lists them: each adds its parser (and its handler, by
#: ``set_defaults(func=...)``) to the ``vflo`` command.
COMMANDS = (run, compare, explore, worth, align, certs, party, models, flower, predict, serve, scenario, probe,
            holdout, catalog)


class _Parser(argparse.ArgumentParser):
    """The ``vflo`` command's parser and every (sub)command's: each takes the global flags
    (:func:`vflo.cli.common.global_flags`), so that ``vflo -v run CONFIG`` and ``vflo run CONFIG -v`` (README's
    synopsis) say the same. A subcommand's go under names of their own, one set per depth (``vflo certs -v sign
    ... -v`` is ``-vv``), merged with the command's by :func:`vflo.cli.common.merge_global_flags`."""

    def __init__(self, *args: Any, depth: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.depth = depth
        common.global_flags(self, depth=depth)

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", functools.partial(_Parser, depth=self.depth + 1))
        return super().add_subparsers(**kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vflo", description="Vertical federated learning for parties whose records only partly overlap.",
        epilog=common.exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vflo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is another program's command line (a SuperNode's), handed over whole: argparse
    # would read its options as vflo's once a subcommand has taken its own.
    extra: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, extra = words[:at], words[at + 1:]
    parser = build_parser()
    args = common.merge_global_flags(parser.parse_args(words))
    if extra and not hasattr(args, "extra"):
        parser.error(f"vflo {args.command} takes nothing after --")
    if hasattr(args, "extra"):
        args.extra = extra
    # What vflo's commands write (rows, IDs, keys, models, scores, results) is for the user who ran them only.
    owner_only_umask()
    verbosity = args.verbose - args.quiet
    common.configure_logging(verbosity)
    common.quiet_grpc(verbosity)
    common.configure_threads(args.threads, all_cores=args.command == "predict")
    try:
        code: int = args.func(args)
        return code
    except VfloError as exc:
        print(f"vflo: error: {common.printable(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("vflo: interrupted", file=sys.stderr)
        return 130
