"""``vflo worth``: after training, what each partner is worth to a method (Shapley values over the partners;
:mod:`vflo.worth`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from vflo.cli.common import exit_code_text, new_console, shown


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    worth = sub.add_parser(
        "worth", epilog=exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
        help="after training: each partner's Shapley value to a method on the held-out people, from one model that "
             "scores with any subset of its partners (LASER-VFL, SecureBoost, SplitNN with party dropout), or by "
             "retraining per subset")
    worth.set_defaults(func=_worth)
    worth.add_argument("config", type=Path, help="an experiment config (TOML): its parties and its first split")
    worth.add_argument("--method", required=True,
                       help="the label of one of the config's [[methods]] (its settings as the config gives them)")
    how = worth.add_mutually_exclusive_group()
    how.add_argument("--retrain", action="store_true",
                     help="exact: the method trained once per subset of the partners (2^n trainings)")
    how.add_argument("--leave-one-out", action="store_true",
                     help="the method trained with every partner and without each one (n + 1 trainings): "
                          "v(all) - v(all but the partner), for a method that needs every partner to score")
    worth.add_argument("--metric", help="the score a subset is valued by (default: negative log loss, or negative "
                                        "mean squared error for regression)")
    worth.add_argument("--bootstrap", type=int, default=500,
                       help="resamples of the held-out people for the intervals (from one model; default 500)")
    worth.add_argument("--seed", type=int, default=0)
    worth.add_argument("--out", type=Path, help="write worth.json here (a folder)")
    worth.add_argument("--data-dir", help="where the datasets are (default: VFLO_DATA_DIR)")


def _worth(args: argparse.Namespace) -> int:
    from vflo.errors import ConfigError
    from vflo.experiments.config import load_config
    from vflo.experiments.runner import first_split
    from vflo.metrics import check_metric
    from vflo.worth import any_subset_worth, retrained_worth

    config = load_config(args.config)
    entries = {e.label: e for e in config.methods}
    if args.method not in entries:
        raise ConfigError(f"--method {args.method!r} is not among the config's methods: {sorted(entries)}")
    entry = entries[args.method]
    data = first_split(config, data_dir=args.data_dir)
    if args.metric is not None:
        check_metric(args.metric, data.task)
    if args.retrain or args.leave_one_out:
        found = retrained_worth(entry.instantiate, data, seed=args.seed, metric=args.metric,
                                leave_one_out=args.leave_one_out)
    else:
        found = any_subset_worth(entry.instantiate(), data, seed=args.seed, metric=args.metric,
                                 bootstrap=args.bootstrap)
    console = new_console()
    took = f"{found.seconds:.1f} s" + (f", after {found.training_seconds:.1f} s training the model"
                                       if found.training_seconds else "")
    console.print(f"{shown(found.method)}: each partner's worth ({found.how}; {found.metric} of the "
                  f"{len(data.test_ids)} held-out people; {took})")
    for p in found.ranking():
        low_high = found.interval.get(p)
        band = f" (95 % interval {low_high[0]:+.4f} to {low_high[1]:+.4f})" if low_high else ""
        console.print(f"  {shown(p)}: {found.worth[p]:+.4f}{band}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "worth.json").write_text(json.dumps(
            {"method": found.method, "how": found.how, "metric": found.metric, "seconds": found.seconds,
             "training_seconds": found.training_seconds,
             "worth": found.worth, "interval": found.interval,
             "values": {"+".join(sorted(s)) or "(active alone)": v for s, v in found.values.items()}}, indent=1))
        console.print(f"written: {args.out / 'worth.json'}")
    return 0
