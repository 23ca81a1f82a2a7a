"""``vflo explore``: before training, each partner's columns scored privately against the label holder's label
(weight of evidence and information value per column; :mod:`vflo.explorer`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vflo.cli.common import exit_code_text, insecure_tls, new_console, shown


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    explore = sub.add_parser(
        "explore", epilog=exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
        help="before training: each partner's columns ranked by information value against the active party's label "
             "(weight of evidence per bin of the partner's own, from per-bin sums of labels the active party "
             "encrypts: the partner sees ciphertexts only, the active party per-bin counts only)")
    explore.set_defaults(func=_explore)
    where = explore.add_mutually_exclusive_group(required=True)
    where.add_argument("config", type=Path, nargs="?",
                       help="an experiment config (TOML): its parties, in this process (a rehearsal)")
    where.add_argument("--deploy", type=Path, metavar="DEPLOY.toml",
                       help="the active party's deploy config: each partner serving (`vflo party serve`) with "
                            "[policy] explore = true; alignment by PSI")
    explore.add_argument("--out", type=Path, default=Path("runs/explore"),
                         help="folder for explore.csv, explore.json, explore.md and explore.html "
                              "(default runs/explore)")
    explore.add_argument("--binning", choices=["quantile", "chimerge"], default="quantile",
                         help="quantile: each partner's equal-frequency bins as it releases them; chimerge: those "
                              "bins merged here by χ² on their counts, to at most --max-bins (binary and regression)")
    explore.add_argument("--max-bins", type=int, default=6, help="with chimerge: the most bins kept (default 6)")
    explore.add_argument("--scheme", choices=["ou", "paillier"], default="ou",
                         help="the homomorphic encryption of the labels (default ou)")
    explore.add_argument("--bins", type=int, default=10,
                         help="in a rehearsal: the most bins each partner releases (deployed: its own [policy] "
                              "explore_bins); default 10")
    explore.add_argument("--min-bin-rows", type=int, default=50,
                         help="in a rehearsal: the fewest people in a released bin (deployed: each partner's own "
                              "[policy] min_bin_rows); default 50")
    explore.add_argument("--select", action="store_true",
                         help="deployed: then send each partner its columns' IV and missing share, so that it drops "
                              "those its own [policy] select_iv_below and select_missing_above select out (from its "
                              "rows and the models it trains after)")
    explore.add_argument("--select-iv-below", type=float, default=0.0,
                         help="in a rehearsal: each partner drops its columns under this IV (deployed: its own "
                              "[policy] select_iv_below); default 0, none")
    explore.add_argument("--select-missing-above", type=float, default=1.0,
                         help="in a rehearsal: and those missing for more than this share (deployed: its own "
                              "[policy] select_missing_above); default 1, none")
    explore.add_argument("--shared", choices=["count", "ids"], default="count",
                         help="what this party learns of who each partner shares with it: 'count' (default) how many "
                              "alone, each partner matching blinded IDs (and so learning which of its people this "
                              "party holds); 'ids' who, by the deployment's alignment, where the partner's [policy] "
                              "explore_shared = \"ids\"")
    explore.add_argument("--data-dir", help="where the datasets are (default: VFLO_DATA_DIR)")
    explore.add_argument("--insecure", action="store_true", help="no TLS (loopback experiments only)")


def _explore(args: argparse.Namespace) -> int:
    from vflo.errors import ConfigError
    from vflo.explorer.report import strength, write
    from vflo.trees.crypto import HESettings

    if args.max_bins < 1:
        raise ConfigError(f"--max-bins must be at least 1, got {args.max_bins}")
    he = HESettings(scheme=args.scheme)
    found = _deployed(args, he) if args.deploy is not None else _rehearsed(args, he)
    written = write(found, args.out)
    console = new_console()
    from vflo.explorer.report import summary_lines

    for line in summary_lines(found):
        console.print(shown(line))
    table = found.table()
    for party in found.shared:
        console.print(f"[bold]{shown(party)}[/bold]")
        for _, row in table[table["party"] == party].head(10).iterrows():
            console.print(f"  {int(row['rank']):>3}. {shown(str(row['column']))}: IV {row['iv']:.4f} "
                          f"({strength(float(row['iv']))})")
    console.print(f"written: {', '.join(str(p) for p in written)}")
    return 0


def _rehearsed(args: argparse.Namespace, he: Any) -> Any:
    from vflo.experiments.config import load_config
    from vflo.experiments.runner import first_split
    from vflo.explorer.run import explore

    # The first run's training people, as `vflo run` holds its test people out: never explored on.
    data = first_split(load_config(args.config), data_dir=args.data_dir)
    parties = [data.train[p.name] for p in data.parties if p.name in data.train]
    return explore(parties, task=data.task, classes=tuple(data.classes), bins=args.bins,
                   min_bin_rows=args.min_bin_rows, binning=args.binning, max_bins=args.max_bins, scheme=he.scheme,
                   key_size=he.key_size, select_iv_below=args.select_iv_below,
                   select_missing_above=args.select_missing_above, shared=args.shared)


def _deployed(args: argparse.Namespace, he: Any) -> Any:
    from dataclasses import replace

    from vflo import transports
    from vflo.align.engines import DEPLOYED_ALIGNMENT
    from vflo.deploy import Deployment, load_deploy_config
    from vflo.explorer.run import explore_with
    from vflo.federation.coordinator import Aligner

    deploy = load_deploy_config(args.deploy)
    if args.insecure:
        deploy = replace(deploy, active=insecure_tls(deploy.active))
    kind, _ = transports.of(deploy.active)

    def run(deploy: Any, link: Any) -> Any:
        deployment = Deployment(deploy, link=link)
        try:
            fed = Aligner(node=deployment.party.node, transport=deployment.party.transport,
                          parties=deployment.data_parties, alignment=DEPLOYED_ALIGNMENT)
            encoding = deployment.preprocessing.encoding
            return explore_with(fed, deployment.train, task=deployment.task,
                                classes=tuple(encoding.classes) if encoding is not None else (), he=he,
                                binning=args.binning, max_bins=args.max_bins, select=args.select,
                                shared=args.shared)
        finally:
            deployment.close()

    return kind.coordinate(deploy, run)
