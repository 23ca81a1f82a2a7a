"""``vflo party``: serve one party from its own config, and sum its record of what left it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vflo.cli.common import insecure_tls, new_console, shown
from vflo.errors import ConfigError


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    party = sub.add_parser("party", help="run a party's server")
    party.set_defaults(func=_party)
    party_sub = party.add_subparsers(dest="party_command", required=True, metavar="ACTION")
    audit = party_sub.add_parser("audit", help="sum a party's record of what left it (its audit_log file): per peer "
                                               "and kind, messages, bytes, rows and refusals; and how many of its "
                                               "people each peer asked about (its asked_log file)")
    audit.add_argument("file", type=Path)
    audit.add_argument("--run", help="one run only (its ID, as the file gives it; 'last': the newest run)")
    audit.add_argument("--asked", type=Path, metavar="FILE",
                       help="its record of who asked about its people (default: PARTY_asked.jsonl beside the audit "
                            "file, where it is)")
    audit.add_argument("--person", metavar="ID",
                       help="who asked about this person (the party's own ID for them): each request, when, by which "
                            "peer, with which model")
    audit.add_argument("--account", type=Path, metavar="FILE",
                       help="its privacy account (default: PARTY_privacy.jsonl beside the audit file, where it is)")
    audit.add_argument("--delta", type=float, default=1e-5,
                       help="the δ its ε is read at (its [privacy] delta; default 1e-5)")
    serve = party_sub.add_parser(
        "serve", help="serve one party (PARTY.toml) until interrupted",
        usage="vflo party serve [options] CONFIG [-- ARGS]",
        description="Serve one party until interrupted, over its transport (`vflo transports` lists them). After --, "
                    "what the transport starts beside the party: over Flower, its SuperNode's command line (-- "
                    "flower-supernode --superlink HOST:9092 ...; vflo adds --node-config).")
    serve.add_argument("config", type=Path)
    serve.add_argument("--insecure", action="store_true", help="no TLS (loopback experiments only)")
    serve.add_argument("--save", type=Path, metavar="DIR",
                       help="this party's model folder: where it writes its parts of trained models and reads them "
                            "to score (overrides models = ... in PARTY.toml)")
    serve.add_argument("--checkpoints", type=Path, metavar="DIR",
                       help="this party's checkpoint folder, for runs started with --checkpoints (overrides "
                            "checkpoints = ... in PARTY.toml)")
    serve.add_argument("--transport", metavar="NAME",
                       help="how the party is reached (`vflo transports` lists them; default: PARTY.toml's "
                            "[transport] kind, else grpc)")
    # After `--`: what the transport starts beside the party (--transport flower: its SuperNode, e.g.
    # -- flower-supernode --superlink HOST:9092 ...); vflo.cli.main hands it over as args.extra.
    serve.set_defaults(extra=[])


def _party(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from vflo import transports
    from vflo.deploy import load_party_config

    if args.party_command == "audit":
        if args.person is not None:
            return _who_asked(args.file, args.person, asked=args.asked, run=args.run)
        return _party_audit(args.file, args.run, account=args.account, delta=args.delta, asked=args.asked)
    config = load_party_config(args.config)
    _talk(args.verbose - args.quiet)
    if args.insecure:
        config = insecure_tls(config)
    if args.save is not None:
        config = replace(config, models=str(args.save))
    if args.checkpoints is not None:
        config = replace(config, checkpoints=str(args.checkpoints))
    kind, options = transports.of(config, kind=args.transport)
    return kind.serve(config, options, args.extra)


def _talk(verbosity: int) -> None:
    """A serving party says what it does at INFO by default (each setup with its own settings, refusal, save,
    scoring session and end of run): its operator watches its terminal. ``-q``: warnings (refusals) and errors;
    ``-qq``: errors only; ``-v``: as for every command."""
    import logging

    if verbosity in (0, -1):
        logging.getLogger("vflo").setLevel(logging.INFO if verbosity == 0 else logging.WARNING)


def _run_of(path: Path, runs: list[str], run: str | None) -> str | None:
    """``--run`` as a run of the file (``last``: its newest)."""
    if run == "last":
        if not runs:
            raise ConfigError(f"{path} records no run yet")
        run = runs[-1]
    if run is not None and run not in runs:
        raise ConfigError(f"{path} has no run {run!r}; its runs: {runs[-5:]}")
    return run


def _party_audit(path: Path, run: str | None, *, account: Path | None = None, delta: float = 1e-5,
                 asked: Path | None = None) -> int:
    from rich.table import Table

    from vflo.comm.departures import read_departures, summarize

    records = read_departures(path)
    runs = list(dict.fromkeys(r.run for r in records if r.run))
    run = _run_of(path, runs, run)
    if run is not None:
        records = [r for r in records if r.run == run]
    party = records[0].party if records else "?"
    scope = f"run {run}" if run else f"{len(runs)} runs and what came outside any"
    table = Table(title=shown(f"what left party {party} ({scope}; {path})"))
    for col in ("to", "kind", "messages", "bytes", "rows", "refused", "errors"):
        table.add_column(col, justify="right" if col not in ("to", "kind") else "left")
    rows = summarize(records)
    for r in rows:
        counts = (f"{r[k]:,}" for k in ("messages", "bytes", "rows", "refused", "errors"))
        table.add_row(shown(r["peer"]), shown(r["kind"]), *counts)
    table.add_row("all", "", *(f"{sum(r[k] for r in rows):,}" for k in ("messages", "bytes", "rows", "refused",
                                                                         "errors")))
    new_console().print(table)
    _people_asked(asked or _beside(path, party, "asked"), run, given=asked is not None)
    _privacy_account(account or path.with_name(f"{party}_privacy.jsonl"), party, delta, given=account is not None)
    return 0


def _beside(audit: Path, party: str, what: str) -> Path:
    """A party's file of ``what`` beside its audit file, by the default names (NAME_audit.jsonl, NAME_WHAT.jsonl);
    the audit file's own name gives the party's where the file records nothing yet."""
    if party == "?" and audit.name.endswith("_audit.jsonl"):
        party = audit.name[:-len("_audit.jsonl")]
    return audit.with_name(f"{party}_{what}.jsonl")


def _asked_records(path: Path, run: str | None) -> list[Any]:
    from vflo.party.asked import read_asked

    records = read_asked(path)
    if run is not None:
        runs = list(dict.fromkeys(r.run for r in records if r.run))
        if run != "last" and run not in runs:
            return []  # a run in which no one asked about anyone
        run = _run_of(path, runs, run)
        records = [r for r in records if r.run == run]
    return records


def _people_asked(path: Path, run: str | None, *, given: bool) -> None:
    """Per peer: the requests that named this party's people, how many people they named and how many distinct
    people, those refused by its policy, and the models asked with."""
    from rich.table import Table

    from vflo.party.asked import per_peer

    if not given and not path.is_file():
        return
    records = _asked_records(path, run)
    table = Table(title=shown(f"who asked about the people of party {records[0].party if records else '?'} "
                              f"({'run ' + run if run else 'every run'}; {path})"))
    for col in ("asked by", "requests", "people named", "people", "refused", "models"):
        table.add_column(col, justify="left" if col in ("asked by", "models") else "right")
    for r in per_peer(records):
        table.add_row(shown(r["peer"]), *(f"{r[k]:,}" for k in ("requests", "named", "people", "refused")),
                      shown(", ".join(r["models"])))
    new_console().print(table)


def _who_asked(audit: Path, person: str, *, asked: Path | None, run: str | None) -> int:
    """``vflo party audit FILE --person ID``: each request that named the person, oldest first."""
    from rich.table import Table

    from vflo.party.asked import about

    path = asked or _beside(audit, "?", "asked")
    if asked is None and not path.is_file():
        raise ConfigError(f"no record of who asked beside {audit} ({path}); give it with --asked FILE (the party's "
                          "asked_log)")
    found = about(_asked_records(path, run), person)
    table = Table(title=shown(f"who asked about {person} ({len(found)} requests; {path})"))
    for col in ("time", "asked by", "model", "model ID", "kind", "named by", "run", "status"):
        table.add_column(col)
    for r in found:
        table.add_row(*(shown(v) for v in (r.time, r.peer, r.model, r.model_id, r.kind, r.named_by, r.run,
                                           r.status + (f" ({r.why})" if r.why else ""))))
    new_console().print(table)
    return 0


def _privacy_account(path: Path, party: str, delta: float, *, given: bool) -> None:
    """What the party's privacy account says: per person, the ε of everything it counts (every noised release and
    DP-SGD run, all runs), composed by dp_accounting; the largest first."""
    from rich.table import Table

    from vflo.dp import PrivacyAccount

    if not given and not path.is_file():
        return
    account = PrivacyAccount.read(path, party)
    table = Table(title=shown(f"privacy account of party {party} ({path}): {account.people:,} people, "
                              f"{account.releases:,} releases; ε per person at δ = {delta:g}, every noised release "
                              "and DP-SGD run it counted, all runs"))
    table.add_column("ε", justify="right")
    table.add_column("people", justify="right")
    for eps, people in account.spending(delta):
        table.add_row(f"{eps:.3g}", f"{people:,}")
    new_console().print(table)
