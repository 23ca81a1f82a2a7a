"""``vflo scenario``: what each party of a config would hold; ``--export``: its files and configs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vflo.errors import ConfigError


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    scen = sub.add_parser("scenario", help="print each party's columns, sample counts and the overlap matrix")
    scen.set_defaults(func=_scenario)
    scen.add_argument("config", type=Path, help="experiment TOML file")
    scen.add_argument("--data-dir", type=Path)
    scen.add_argument("--seed", type=int, help="scenario seed (default: the config's)")
    scen.add_argument("--export", type=Path, metavar="DIR",
                      help="write each party's files and configs for a real deployment (first variant, first split)")
    scen.add_argument("--base-port", type=int, default=50051, help="with --export: first port to listen on")
    scen.add_argument("--extra-parties", default="",
                      help="with --export: data-less parties beyond those the config's methods need (which "
                           "are exported anyway), e.g. server,dealer")
    scen.add_argument("--insecure", action="store_true", help="with --export: no certificates, TLS off")
    scen.add_argument("--overwrite", action="store_true",
                      help="with --export: replace the files an earlier export wrote there (never a file it did not "
                           "write, or one edited since)")
    scen.add_argument("--os-seeds", action="store_true",
                      help="with --export: write no seed into the parties' configs, so each draws its secrets from "
                           "the operating system (a deployment then trains to other numbers than the in-process run)")


def _scenario(args: argparse.Namespace) -> int:
    from vflo.experiments.config import load_config
    from vflo.seeding import derive_seed

    config = load_config(args.config)
    dataset = config.load_dataset(args.data_dir)
    seed = derive_seed(config.seed, "layout", 0) if args.seed is None else args.seed
    if args.export is not None:
        return _export(args, config, dataset, seed)
    for variant in config.variants:
        layout = config.layout(variant, seed, dataset)
        print(f"== variant: {variant.label}")
        print(layout.describe())
        print()
    return 0


def _export(args: argparse.Namespace, config: Any, dataset: Any, seed: int) -> int:
    from vflo.deploy import export_federation
    from vflo.federation.simulation import simulated_seed
    from vflo.seeding import derive_seed, numpy_rng

    layout = config.layout(config.variants[0], seed, dataset)
    split = config.protocol.splits(layout, numpy_rng(config.seed, "split", 0))[0]
    data = layout.materialize(test_ids=split.test_ids, train_scope=split.train_scope)
    extra = {name.strip(): name.strip() for name in args.extra_parties.split(",") if name.strip()}
    for name in extra:
        if name not in ("server", "dealer"):
            raise ConfigError(f"--extra-parties takes 'server' and 'dealer', not {name!r}")
    deployable = [e for e in config.methods if not e.method_cls.simulation_only]
    proposals = [e.instantiate() for e in deployable]
    # The data-less parties the experiment's methods need (RAP's server, FedSVD's dealer) are exported too.
    extra |= {p.name: p.role for method in proposals for p in method.extra_parties(data.parties)}
    # The seed `vflo run` gives its first run (repeat 0, fold 0), and each party's secret seed in that run: the
    # deployment then trains to the in-process run's numbers.
    run_seed = derive_seed(config.seed, "method", 0, 0)
    names = [p.name for p in data.parties] + list(extra)
    seeds = None if args.os_seeds else {name: simulated_seed(run_seed, name) for name in names}
    written = export_federation(data, args.export, base_port=args.base_port, extra_roles=extra,
                                tls=not args.insecure, methods=[e.method_cls.name for e in deployable],
                                proposals=proposals, seeds=seeds,
                                overwrite=args.overwrite)
    active = data.active
    print(f"wrote each party's data and config to {args.export}/ (variant {config.variants[0].label}), for their "
          "owner only (files 0600, folders 0700).")
    if seeds is not None:
        print("each party's config carries the secret seed the in-process run gives it (seed = ...), so "
              "`vflo run --deploy` trains to `vflo run`'s first run: delete those lines (or export with --os-seeds) "
              "before a deployment on real data.")
    if not args.insecure:
        from vflo.deploy.export import ca_folder

        print(f"the federation's CA (ca.key signs for any party) is in {ca_folder(args.export)}/, apart from the "
              "parties' folders: keep it offline, never on a party's host.")
    print("start every party but the active one, each in its own terminal:")
    for name, path in written.items():
        if name != active:
            print(f"  cd {args.export} && vflo party serve {path.name}")
    print(f"then, for the active party {active!r}:")
    print(f"  cd {args.export} && vflo run EXPERIMENT.toml --deploy deploy.toml")
    return 0
