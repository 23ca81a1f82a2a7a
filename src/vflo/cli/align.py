"""``vflo align``: run the private set intersections a deployed run and scoring need, once, and keep them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vflo.cli.common import exit_code_text, insecure_tls, new_console


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    align = sub.add_parser(
        "align", epilog=exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
        help="find the people the active party shares with each deployed party (private set intersection), once: "
             "every party keeps the result in its own alignments folder, and later runs and scorings reuse it while "
             "neither side's people changed")
    align.set_defaults(func=_align)
    align.add_argument("deploy", type=Path, help="the active party's DEPLOY.toml (every other party serving)")
    align.add_argument("--serve", type=Path, metavar="FILE",
                       help="the active party's rows to score later (its own file, as for vflo predict --data): "
                            "aligned with each party's rows to score (default: the deploy config's test_file)")
    engine = align.add_argument(
        "--engine", choices=["auto", "vflo", "rr22", "kkrt", "ecdh", "unbalanced"], default="auto",
        help="which PSI runs (default auto: the PSI library's RR22 where the active party asks about at least "
             "%(library_from)s IDs, both parties have the library and the partner's policy takes it; vflo's own "
             "ECDH otherwise, as below that many IDs it costs less than the library's fixed start-up; unbalanced: "
             "the library's ECDH-OPRF for a small active party against large partners, their evaluated IDs "
             "prepared once and kept here)")
    # The help's %(library_from)s is the action's attribute of that name, as %(default)s is.
    engine.library_from = _LibraryFrom()
    align.add_argument("--fresh", action="store_true",
                       help="intersect afresh even where a kept intersection still holds (and keep the new one)")
    align.add_argument("--mode", choices=["both", "active"], default="both",
                       help="both: each party learns who is shared (what training needs); active: only the active "
                            "party does")
    align.add_argument("--stream", action="store_true",
                       help="intersect the training files from disk a bucket at a time, each party's memory for it "
                            "under --memory-mb (vflo's own ECDH): every party keeps its own rows' shared flags in "
                            "its alignments folder, under streamed/")
    align.add_argument("--memory-mb", type=float, default=256.0, metavar="MB",
                       help="with --stream: the most memory one bucket's intersection may take at each party "
                            "(default 256)")
    align.add_argument("--insecure", action="store_true", help="no TLS (loopback experiments only)")


class _LibraryFrom:
    """``auto``'s threshold (:data:`vflo.align.engines.AUTO_LIBRARY_FROM`) for the help, read only when the
    help is shown: alignment's imports take longer than every other command's parser is built in."""

    def __str__(self) -> str:
        from vflo.align.engines import AUTO_LIBRARY_FROM

        return f"{AUTO_LIBRARY_FROM:,}"


def _align(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from vflo import transports
    from vflo.align.engines import AlignmentConfig
    from vflo.data.files import read_table
    from vflo.deploy import Deployment, load_deploy_config
    from vflo.errors import ConfigError, DataError

    if args.stream and (args.serve is not None or args.engine != "auto" or args.fresh):
        raise ConfigError("--stream intersects the training files afresh with vflo's own ECDH, a bucket at a time: "
                          "leave out --serve, --engine and --fresh")
    deploy = load_deploy_config(args.deploy)
    if args.insecure:
        deploy = replace(deploy, active=insecure_tls(deploy.active))
    serve = None
    if args.serve is not None:
        active = deploy.active
        assert active.data is not None
        table = read_table(args.serve, party=active.name, id_column=active.data.id_column)
        if active.data.id_column not in table.columns:
            raise DataError(f"{args.serve} has no column {active.data.id_column!r} (the active party's id_column): "
                            "give the file of rows to score, with the same ID column as the training file")
        serve = table[active.data.id_column].to_numpy()
    kind, _ = transports.of(deploy.active)
    if args.stream:
        return kind.coordinate(deploy, lambda deploy, link: _streamed(Deployment(deploy, link=link), args))

    def align(deploy: Any, link: Any) -> tuple[Any, list[Any]]:
        deployment = Deployment(deploy, link=link)
        try:
            return deployment, deployment.align_ahead(
                AlignmentConfig(method="psi", engine=args.engine, mode=args.mode), serve=serve, fresh=args.fresh)
        finally:
            deployment.close()

    deployment, done = kind.coordinate(deploy, align)
    console = new_console()
    for row in done:
        rows = "training rows" if row.purpose == "train" else "rows to score"
        if row.shared < 0:
            console.print(f"{row.party} ({rows}): {row.note}")
            continue
        how = (f"reused, found by {row.engine}" if row.reused else f"found by {row.engine}")
        kept = f"; kept as {row.token}" if row.token else f"; {row.note}"
        console.print(f"{row.party} ({rows}): {row.shared:,} of {row.asked:,} IDs shared ({how}){kept}")
    where = deployment.party.node.alignments
    if where is not None:
        console.print(f"kept in {where.folder}/ here, and in each party's own alignments folder")
    return 0


def _streamed(deployment: Any, args: argparse.Namespace) -> int:
    try:
        results = deployment.align_streamed(mode=args.mode, memory_mb=args.memory_mb)
    finally:
        deployment.close()
    console = new_console()
    for result in results:
        record = result.record
        console.print(f"{record.peer} (training rows, streamed in {record.buckets} buckets under "
                      f"{record.memory_mb:g} MB): {record.shared:,} of {record.rows:,} rows shared; kept as "
                      f"{record.token} in {result.path.parent}/ here, and in {record.peer}'s own alignments folder")
    return 0
