"""``vflo holdout`` (formerly ``vflo split``): cut the parties' own files into train, serve and test files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vflo.cli.common import exit_code_text, logger
from vflo.errors import ConfigError


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    cut = sub.add_parser("holdout", aliases=["split"],
                         help="hold test rows out: cut the parties' own files into train, serve and test files for a "
                              "deployment ('split' is its former name)",
                         epilog="The first file is the active party's (it holds the labels). Test rows are held out "
                                "of every party's training file.\n\n" + exit_code_text(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    cut.set_defaults(func=_holdout)
    cut.add_argument("files", nargs="+", type=Path, help="each party's file (CSV, .csv.gz, TSV or Parquet)")
    cut.add_argument("--parties", required=True, help="their names, in the same order, e.g. hospital,lab")
    cut.add_argument("--id-column", required=True,
                     help="the ID column: one name for every file, or NAME:COLUMN,... per party")
    cut.add_argument("--label-column", required=True, help="the active party's label column")
    cut.add_argument("--test", type=float, default=0.2,
                     help="test rows: a share (< 1) or a count of the people --test-from names (by default those "
                          "every party holds, not all of the active party's); default 0.2")
    cut.add_argument("--test-from", choices=["aligned", "active", "active_only"], default="aligned",
                     help="where test rows come from (default aligned: rows every party holds)")
    cut.add_argument("--seed", type=int, default=0)
    cut.add_argument("--out", type=Path, required=True, help="folder for NAME_train.csv, NAME_serve.csv, "
                                                             "ACTIVE_test.csv")
    cut.add_argument("--overwrite", action="store_true")


def _holdout(args: argparse.Namespace) -> int:
    from vflo.experiments.cut import PartyFileSpec, cut_files

    if args.command == "split":
        logger.warning("vflo split is now vflo holdout (the same command and flags); the old name goes in vflo 0.3")
    names = [n.strip() for n in args.parties.split(",") if n.strip()]
    if len(names) != len(args.files):
        raise ConfigError(f"{len(args.files)} files but {len(names)} party names in --parties; give one name per file")
    columns = dict(pair.split(":", 1) for pair in args.id_column.split(",")) if ":" in args.id_column else {}
    unknown = sorted(set(columns) - set(names))
    if unknown:
        raise ConfigError(f"--id-column names parties {unknown} that are not in --parties {names}")
    specs = [PartyFileSpec(name, path, columns.get(name, args.id_column if not columns else "")) for name, path in
             zip(names, args.files, strict=True)]
    missing = [s.name for s in specs if not s.id_column]
    if missing:
        raise ConfigError(f"--id-column gives no ID column for {missing}; give NAME:COLUMN for every party")
    test = int(args.test) if args.test >= 1 else args.test
    cut = cut_files(specs, label_column=args.label_column, out=args.out, test=test, test_from=args.test_from,
                    seed=args.seed, overwrite=args.overwrite)
    print(f"test rows: {cut.test_rows} of the {cut.pool} {cut.pool_what} (--test {args.test:g}, --test-from "
          f"{args.test_from})")
    gaps = False
    for name, files in cut.files.items():
        for f in files:
            holes = ", ".join(f"{c}: {n}" for c, n in f.missing.items())
            gaps = gaps or bool(holes)
            print(f"{name}: {f.path} ({f.rows} rows{'; missing values in ' + holes if holes else ''})")
    if gaps:
        print("some files have missing values: their party fills them itself, from its training rows, with "
              "impute = 'mean' (or 'median', 'most_frequent', a number) under [data] in its own config, NAME.toml "
              "(the active party: under [active.data] in deploy.toml), or leaves the columns out (drop_columns); "
              "without either it refuses them, naming the column")
    print(f"give each party its own files; {names[0]}_test.csv (with labels) stays with the active party {names[0]!r}")
    return 0
