"""What every ``vflo`` command shares: exit codes, the flags of commands that run configs, the console, logging
and threads."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from vflo.errors import EXIT_CODES

logger = logging.getLogger("vflo")


def exit_code_text() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


#: The ``vflo`` command's own flags, which every (sub)command takes too: before the command or after it.
GLOBAL_FLAGS = ("verbose", "quiet", "threads")
_AFTER = "_after_"


def flag_dest(name: str, depth: int) -> str:
    """Where a global flag given at ``depth`` goes (0: before the command; 1: after it; 2: after its action)."""
    return name if depth == 0 else f"{name}{_AFTER}{depth}"


def global_flags(parser: argparse.ArgumentParser, *, depth: int) -> None:
    """Add the global flags to ``parser``: with their defaults on the ``vflo`` command itself (``depth`` 0), with
    none on a (sub)command's (``depth`` >= 1), so that only what was given there is merged in
    (:func:`merge_global_flags`)."""
    after = depth > 0
    parser.add_argument("-v", "--verbose", action="count", dest=flag_dest("verbose", depth),
                        default=argparse.SUPPRESS if after else 0, help="more log output (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="count", dest=flag_dest("quiet", depth),
                        default=argparse.SUPPRESS if after else 0, help="less log output: errors only")
    parser.add_argument("--threads", type=int, dest=flag_dest("threads", depth), metavar="N",
                        default=argparse.SUPPRESS if after else None,
                        help="threads for PyTorch's CPU kernels (default: $OMP_NUM_THREADS, else 1, and all cores for "
                             "predict: vflo's networks are small, and one thread each is fastest when parties share "
                             "a machine)")


def merge_global_flags(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the global flags given after a (sub)command merged into the command's own: counts added up,
    the value given last (after the deepest command) winning for ``--threads``."""
    after = sorted((int(depth), name, value) for key, value in vars(args).items()
                   for name, sep, depth in [key.partition(_AFTER)] if sep and name in GLOBAL_FLAGS)
    for depth, name, value in after:
        delattr(args, flag_dest(name, depth))
        setattr(args, name, value if name == "threads" else getattr(args, name) + value)
    return args


def run_flags() -> argparse.ArgumentParser:
    """The flags every command that runs methods from a config takes (``run``, ``compare``)."""
    flags = output_flags()
    flags.add_argument("--quick", action="store_true", help="apply the config's [quick] overrides (fewer repeats)")
    flags.add_argument("--no-progress", action="store_true", help="no progress bar or per-cell lines")
    return flags


def output_flags() -> argparse.ArgumentParser:
    """A config in, a folder of results out: ``run``, ``compare``, ``probe``."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("config", type=Path, help="the config's TOML file (see configs/)")
    flags.add_argument("--out", type=Path, help="output folder (default runs/NAME-TIMESTAMP)")
    flags.add_argument("--data-dir", type=Path, help="folder with dataset files (else $VFLO_DATA_DIR, ~/.vflo/data)")
    flags.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    return flags


def quiet_grpc(verbose: int) -> None:
    """gRPC's C core logs handshake failures on stderr in its own format; vflo says what they mean instead.
    Its lines come back with -v. (Read when gRPC is first imported, which is after this.)"""
    import os

    os.environ.setdefault("GRPC_VERBOSITY", "NONE" if verbose <= 0 else "INFO")


def configure_threads(threads: int | None, *, all_cores: bool = False) -> None:
    """One PyTorch thread by default: on small networks extra threads only spin, and on a loaded machine
    they stall (APC-VFL on 150 rows took many times as long with two threads as with one while the other core
    was busy).
    Scoring (``all_cores``) runs large batches through the network, where every core helps."""
    import os

    if threads is None:
        default = os.cpu_count() or 1 if all_cores else 1
        threads = int(os.environ.get("OMP_NUM_THREADS", str(default)) or default)
    if threads < 1:
        raise SystemExit("vflo: error: --threads must be at least 1")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # already imported: tell it too; otherwise it reads the variable when imported
        sys.modules["torch"].set_num_threads(threads)


#: Control characters (terminal escapes among them) as visible escapes; a line break and a tab stay.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (0x09, 0x0A)}


def printable(text: str) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``): text a peer chose (a message's kind,
    a party name in an error, a refusal's reason) cannot move the cursor, recolour or retitle the terminal."""
    return text.translate(_CONTROL)


def shown(text: str) -> str:
    """``text`` for a rich table or markup: :func:`printable`, and rich's markup (``[red]``) shown as written."""
    from rich.markup import escape

    return escape(printable(text))


class _Printable(logging.Filter):
    """Every log line printed as :func:`printable` text (a peer's words reach the log through errors)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = printable(record.getMessage()), None
        return True


def configure_logging(verbose: int) -> None:
    """``verbose``: how many -v less how many -q: errors only below 0, warnings at 0, then info, then debug."""
    level = (logging.ERROR if verbose < 0 else logging.WARNING if verbose == 0 else logging.INFO if verbose == 1
             else logging.DEBUG)
    from rich.logging import RichHandler

    handler = RichHandler(show_path=False, console=new_console(stderr=True), markup=False)
    handler.addFilter(_Printable())
    logging.basicConfig(level=level, format="%(message)s", handlers=[handler], force=True)


def new_console(*, stderr: bool = False):  # type: ignore[no-untyped-def]  # rich loads lazily, so its type is not named
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Pipes and logs get wide, unwrapped tables (a terminal keeps its own width).
    width = None if stream.isatty() else 200
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


def insecure_tls(config: Any) -> Any:
    from dataclasses import replace

    from vflo.deploy import TLSConfig

    print("vflo: WARNING: --insecure: no TLS; messages travel unencrypted and parties are not authenticated. "
          "Use it only on a loopback interface.", file=sys.stderr)
    return replace(config, tls=TLSConfig(insecure=True))
