"""``vflo compare``: every method that can run, across the questions a comparison asks, in one report."""

from __future__ import annotations

import argparse
from typing import Any

from vflo.cli.common import exit_code_text, new_console, run_flags
from vflo.errors import ConfigError


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    comp = sub.add_parser("compare", help="every method that can run, across shared-people share, number of "
                                          "partners, column splits and who is scored, on a dataset or on your "
                                          "parties' own files; one HTML report that opens with the answer",
                          epilog=exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
                          parents=[run_flags()])
    comp.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    import tomllib

    from vflo.experiments.compare import compare, reads_own_files
    from vflo.experiments.compare_own import compare_own
    from vflo.experiments.compare_report import write_comparison
    from vflo.experiments.output import check_out_dir, default_out_dir

    if not args.config.is_file():
        raise ConfigError(f"config file {args.config} does not exist")
    try:
        raw = tomllib.loads(args.config.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{args.config} is not valid TOML: {exc}") from exc
    out_dir = args.out if args.out is not None else default_out_dir(str(raw.get("name", args.config.stem)))
    check_out_dir(out_dir, overwrite=args.overwrite)
    console = new_console()

    def progress(cell: Any, k: int, total: int) -> None:
        console.print(f"[{k + 1}/{total}] {cell.label}")

    on_cell = None if args.no_progress else progress
    if reads_own_files(raw):  # the parties' own files, compared around their real overlap
        result = compare_own(raw, base_dir=args.config.parent, quick=args.quick, on_cell=on_cell)
    else:
        result = compare(raw, data_dir=None if args.data_dir is None else str(args.data_dir), quick=args.quick,
                         on_cell=on_cell)
    write_comparison(result, out_dir, overwrite=args.overwrite)
    console.print(f"{len(result.rows)} method runs in {result.seconds:.0f} s; report.html, report.md and results "
                  f"written to {out_dir}/")
    failed = int((result.rows["status"] == "failed").sum()) if "status" in result.rows else 0
    return 0 if len(result.rows) and failed < len(result.rows) else 5
