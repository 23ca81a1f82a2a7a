"""The ``vflo`` command line.

Exit codes (also printed by ``vflo --help``): 0 success; 1 unexpected internal error;
2 invalid configuration, argument or scenario; 3 invalid input data or a data file
missing or failing its checksum; 4 communication or protocol failure; 5 a method
cannot run on this scenario; 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vflo.cli import align, catalog, certs, common, compare, flower, holdout, party, predict, probe, run, scenario
from vflo.errors import VfloError
from vflo.private import owner_only_umask
from vflo.version import __version__

#: Each command's module, in the order ``vflo --help`` lists them: each adds its parser (and its handler, by
#: ``set_defaults(func=...)``) to the ``vflo`` command.
COMMANDS = (run, compare, align, certs, party, flower, predict, scenario, probe, holdout, catalog)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflo", description="Vertical federated learning for parties whose records only partly overlap.",
        epilog=common.exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vflo {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for PyTorch's CPU kernels (default: $OMP_NUM_THREADS, else 1, and all cores for "
                             "predict: vflo's networks are small, and one thread each is fastest when parties share "
                             "a machine)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # What vflo's commands write (rows, IDs, keys, models, scores, results) is for the user who ran them only.
    owner_only_umask()
    common.configure_logging(args.verbose)
    common.quiet_grpc(args.verbose)
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
