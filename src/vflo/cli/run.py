"""``vflo run``: an experiment config, in process or deployed (``--deploy``), its results, report and plots."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vflo.cli.common import exit_code_text, insecure_tls, logger, new_console, run_flags
from vflo.errors import ConfigError


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    run = sub.add_parser("run", help="run an experiment config and write results, report and plots",
                         epilog=exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
                         parents=[run_flags()])
    run.set_defaults(func=_run)
    run.add_argument("--deploy", type=Path, help="run over deployed parties (DEPLOY.toml) instead of simulating")
    run.add_argument("--insecure", action="store_true", help="with --deploy: no TLS (loopback experiments only)")
    run.add_argument("--save", type=Path, metavar="DIR",
                     help="save each method's model: every party its own part in DIR/LABEL/PARTY (deployed: the "
                          "others in the folders their configs name); the first run of a simulation")
    run.add_argument("--checkpoints", type=Path, metavar="DIR",
                     help="keep training checkpoints in DIR, for methods whose config sets train.checkpoint_every "
                          "(deployed: this party's; every other party keeps its own where its config says)")
    run.add_argument("--resume", action="store_true",
                     help="with --checkpoints: continue each run from the last checkpoint every party holds (same "
                          "config and seed give the same model as an uninterrupted run); replaces the output folder")


def _run(args: argparse.Namespace) -> int:
    if args.deploy is not None:
        return _run_deployed(args)
    from vflo.experiments.config import load_config
    from vflo.experiments.output import check_out_dir, default_out_dir, write_results
    from vflo.experiments.report import summarize
    from vflo.experiments.runner import run_experiment

    config = load_config(args.config, quick=args.quick)
    _check_checkpoints(args, config.methods)
    overwrite = args.overwrite or args.resume
    out_dir = args.out if args.out is not None else default_out_dir(config.name)
    check_out_dir(out_dir, overwrite=overwrite)
    if args.save is not None:
        check_out_dir(args.save, overwrite=overwrite)
    console = new_console()
    console.print(f"[bold]{config.name}[/bold]: {len(config.variants)} variant(s) x "
                  f"{config.protocol.repetitions()} repeat(s) x {len(config.methods)} method(s)")
    options: dict[str, Any] = {"data_dir": args.data_dir, "progress": not args.no_progress,
                               "checkpoints": args.checkpoints, "resume": args.resume}
    if args.save is None:
        result = run_experiment(config, **options)
    else:
        from vflo.experiments.output import atomic_dir

        with atomic_dir(args.save, overwrite=overwrite) as models:
            result = run_experiment(config, save=models, **options)
        console.print(f"models of the first run saved to {args.save}/ (one folder per method, one per party)")
    summary = summarize(result)
    _print_summary(console, result, summary)
    write_results(result, out_dir, overwrite=overwrite)
    console.print(f"results written to {out_dir}/ (results.csv, results.json, report.md, plots) "
                  f"in {result.seconds:.1f} s")
    for failure in result.failures:
        print(f"vflo: error: {failure['method']} failed ({failure['variant']}, repeat {failure['repeat']}): "
              f"{failure['error_type']}: {failure['error']}", file=sys.stderr)
    return result.exit_code


def _run_deployed(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from vflo import transports
    from vflo.deploy import Deployment, load_deploy_config
    from vflo.experiments.config import load_deployment_experiment
    from vflo.experiments.deployed import run_and_write
    from vflo.experiments.output import check_out_dir, default_out_dir

    experiment = load_deployment_experiment(args.config)
    deploy = load_deploy_config(args.deploy)
    if args.insecure:
        deploy = replace(deploy, active=insecure_tls(deploy.active))
    _check_checkpoints(args, experiment.methods)
    out_dir = args.out if args.out is not None else default_out_dir(experiment.name)
    check_out_dir(out_dir, overwrite=args.overwrite or args.resume)
    if args.save is not None:
        check_out_dir(args.save, overwrite=args.overwrite)
    kind, _ = transports.of(deploy.active)
    rows = kind.coordinate(deploy, lambda deploy, link: run_and_write(
        experiment, Deployment(deploy, link=link), out_dir, overwrite=args.overwrite or args.resume, save=args.save,
        checkpoints=args.checkpoints, resume=args.resume, command=_again(args)))
    console = new_console()
    for r in rows:
        if r["status"] == "failed":
            print(f"vflo: error: {r['method']} failed: {r['error_type']}: {r['error']}", file=sys.stderr)
            continue
        console.print(f"{r['method']}: " + ", ".join(f"{k} = {r[k]:.4f}" for k in ("accuracy", "rmse") if k in r)
                      + f"; {r['fit_bytes'] / 1e6:.3f} MB in {r['fit_rounds']} training rounds")
    console.print(f"results written to {out_dir}/")
    return next((int(r["exit_code"]) for r in rows if r["status"] == "failed"), 0)


def _again(args: argparse.Namespace) -> list[str]:
    """This deployed run's command line, as the user would type it again (a run that failed because a party went
    away says it, with --resume, where it kept checkpoints)."""
    line = ["vflo", "run", str(args.config), "--deploy", str(args.deploy)]
    line += ["--insecure"] if args.insecure else []
    for flag, value in (("--out", args.out), ("--save", args.save), ("--checkpoints", args.checkpoints)):
        line += [flag, str(value)] if value is not None else []
    return line + (["--resume"] if args.resume else [])


def _check_checkpoints(args: argparse.Namespace, methods: Sequence[Any]) -> None:

    if args.resume and args.checkpoints is None:
        raise ConfigError("--resume continues from the checkpoints of an earlier run: give their folder with "
                          "--checkpoints DIR")
    if args.checkpoints is None:
        return
    keeping = [e.label for e in methods for t in e.method_cls.checkpointed
               if getattr(getattr(e.instantiate().config, t), "checkpoint_every", 0)]
    if not keeping:
        from vflo.methods.registry import checkpointed_tables

        tables = " or ".join(f"[methods.{t}]" for t in checkpointed_tables())
        logger.warning("--checkpoints: no method in this config keeps checkpoints; set checkpoint_every = N in the "
                       "%s table", tables)


def _print_summary(console, result, summary) -> None:  # type: ignore[no-untyped-def]  # rich objects, loaded lazily
    from rich.table import Table

    metric = result.config.metric
    title = result.dataset.label + (" [STAND-IN DATA]" if result.dataset.standin else "")
    table = Table(title=f"{result.config.name}: {title}")
    for col in ("variant", "method", metric, "± std", "train comm", "train rounds", "fit s"):
        table.add_column(col, justify="left" if col in ("variant", "method") else "right")
    for _, r in summary.iterrows():
        name = r["method"] + (" (oracle)" if r["simulation_only"] else "")
        table.add_row(
            str(r["variant"]), name, f"{r[metric]:.4f}", f"{r[metric + '_std']:.4f}",
            f"{r['fit_bytes'] / 1e6:.3f} MB", f"{r['fit_rounds']:.0f}", f"{r['fit_seconds']:.2f}",
        )
    console.print(table)
