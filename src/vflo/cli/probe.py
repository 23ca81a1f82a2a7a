"""``vflo probe``: an encoder's representations scored every epoch (APC-VFL Appendix F)."""

from __future__ import annotations

import argparse
from typing import Any

from vflo.cli.common import output_flags


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    probe = sub.add_parser("probe", help="train an encoder and score its representations every epoch "
                                         "(APC-VFL Appendix F)", parents=[output_flags()])
    probe.set_defaults(func=_probe)


def _probe(args: argparse.Namespace) -> int:
    from vflo.experiments.output import check_out_dir, default_out_dir
    from vflo.experiments.probe import load_probe_config, run_probe, write_probe

    config = load_probe_config(args.config)
    out_dir = args.out if args.out is not None else default_out_dir(config.name)
    check_out_dir(out_dir, overwrite=args.overwrite)
    result = run_probe(config, data_dir=args.data_dir)
    write_probe(result, out_dir, overwrite=args.overwrite)
    last = result.history[-1]
    epoch = result.first_equivalent_epoch()
    verdict = (f"representations match the raw features (within {config.probe.threshold}) from epoch {epoch}"
               if epoch is not None else f"representations never came within {config.probe.threshold} of the raw "
               "features")
    print(f"{config.name}: {result.metric} on raw features {result.raw_mean:.4f}; on representations "
          f"{last['metric_mean']:.4f} after {len(result.history)} epochs; {verdict}")
    print(f"history, probe.json and probe.png written to {out_dir}/")
    return 0
