"""``vflo predict``: score new rows with a saved model, in process or with the other parties deployed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vflo.cli.common import exit_code_text, insecure_tls
from vflo.errors import ConfigError


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    predict = sub.add_parser("predict", help="score new rows with a saved model", epilog=exit_code_text(),
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    predict.set_defaults(func=_predict)
    predict.add_argument("model", type=Path, help="the folder given to --save (or model.save), one method's folder "
                                                  "in it, or the active party's own part in that (all it needs on "
                                                  "its own host to score from its own rows)")
    predict.add_argument("--method", help="which saved method (its label), where the folder holds several")
    predict.add_argument("--data", type=Path, required=True, help="the active party's rows to score (its own file)")
    predict.add_argument("--out", type=Path, required=True,
                         help="CSV of scores: id, one column per class, prediction, model, scored_by")
    predict.add_argument("--deploy", type=Path, help="score collaboratively with deployed parties (DEPLOY.toml)")
    predict.add_argument("--insecure", action="store_true", help="with --deploy: no TLS (loopback only)")
    predict.add_argument("--missing", choices=["refuse", "active_only", "subset"], default="refuse",
                         help="rows a partner does not hold: refuse (list them), score them with --fallback "
                              "(active_only), or score every row with the partners that hold it and answer "
                              "(subset: for a model trained to do without partners; vflo methods says which)")
    predict.add_argument("--deadline", type=float, metavar="SECONDS",
                         help="with --deploy and --missing subset: a partner that does not answer a request within "
                              "this many seconds is absent for that batch of rows (default: the deploy config's)")
    predict.add_argument("--fallback", help="an active-only method saved in the same folder, for --missing active_only")
    predict.add_argument("--overwrite", action="store_true")


def _predict(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from vflo.scoring import SavedModel

    if args.out.exists() and not args.overwrite:
        raise ConfigError(f"{args.out} exists; choose another --out or pass --overwrite")
    if args.out.parent.exists() and not args.out.parent.is_dir():
        raise ConfigError(f"{args.out.parent} is a file, not a folder to write {args.out.name} into")
    model = SavedModel.load(args.model, args.method)
    fallback = SavedModel.load(args.model, args.fallback) if args.fallback else None
    if args.deploy is None:
        # With "subset" and no deployment, every partner is absent: the active party scores alone, where the
        # method allows it (a model trained to do without partners).
        if not model.active_only and args.missing != "subset":
            from vflo.methods.registry import subset_scorers

            raise ConfigError(f"{model.label} scores collaboratively: give --deploy DEPLOY.toml, with every party "
                              "serving its saved part (vflo party serve PARTY.toml --save DIR); a model trained to "
                              f"do without partners ({subset_scorers()}) scores alone with --missing subset")
        if args.deadline is not None:
            raise ConfigError("--deadline bounds the partners' answers: it needs --deploy")
        frame = model.score(args.data, missing=args.missing, fallback=fallback)
    else:
        from vflo import transports
        from vflo.deploy import load_deploy_config, score_deployed

        deploy = load_deploy_config(args.deploy)
        if args.insecure:
            deploy = replace(deploy, active=insecure_tls(deploy.active))
        kind, _ = transports.of(deploy.active)
        frame = kind.coordinate(deploy, lambda deploy, link: score_deployed(
            deploy, model, args.data, missing=args.missing, fallback=fallback, deadline=args.deadline, link=link))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    import pyarrow as pa
    import pyarrow.csv

    # Arrow's writer: a million rows in a fraction of pandas' time.
    pyarrow.csv.write_csv(pa.Table.from_pandas(frame, preserve_index=False), tmp,
                          pyarrow.csv.WriteOptions(quoting_style="needed"))
    tmp.replace(args.out)
    counts = frame["model"].value_counts().to_dict()
    by = frame["scored_by"].value_counts().to_dict()
    print(f"scored {len(frame)} rows with " + ", ".join(f"{m} ({n})" for m, n in counts.items()) +
          "; scored by " + ", ".join(f"{b} ({n})" for b, n in by.items()) + f"; written to {args.out}")
    return 0
