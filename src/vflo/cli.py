"""The ``vflo`` command line.

Exit codes (also printed by ``vflo --help``): 0 success; 1 unexpected internal error;
2 invalid configuration, argument or scenario; 3 invalid input data or a data file
missing or failing its checksum; 4 communication or protocol failure; 5 a method
cannot run on this scenario; 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vflo.errors import EXIT_CODES, ConfigError, VfloError
from vflo.version import __version__

logger = logging.getLogger("vflo")


def _exit_code_text() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


def _run_flags() -> argparse.ArgumentParser:
    """The flags every command that runs methods from a config takes (``run``, ``compare``)."""
    flags = _output_flags()
    flags.add_argument("--quick", action="store_true", help="apply the config's [quick] overrides (fewer repeats)")
    flags.add_argument("--no-progress", action="store_true", help="no progress bar or per-cell lines")
    return flags


def _output_flags() -> argparse.ArgumentParser:
    """A config in, a folder of results out: ``run``, ``compare``, ``probe``."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("config", type=Path, help="the config's TOML file (see configs/)")
    flags.add_argument("--out", type=Path, help="output folder (default runs/NAME-TIMESTAMP)")
    flags.add_argument("--data-dir", type=Path, help="folder with dataset files (else $VFLO_DATA_DIR, ~/.vflo/data)")
    flags.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    return flags


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflo", description="Vertical federated learning for parties whose records only partly overlap.",
        epilog=_exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vflo {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for PyTorch's CPU kernels (default: $OMP_NUM_THREADS, else 1, and all cores for "
                             "predict: vflo's networks are small, and one thread each is fastest when parties share "
                             "a machine)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run an experiment config and write results, report and plots",
                         epilog=_exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
                         parents=[_run_flags()])
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

    comp = sub.add_parser("compare", help="every method that can run, across shared-people share, number of "
                                          "partners, column splits and who is scored; one HTML report",
                          epilog=_exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
                          parents=[_run_flags()])
    comp.set_defaults(func=_compare)

    certs = sub.add_parser("certs", help="certificates for mutual TLS: a CA, each party's own key and certificate")
    certs.set_defaults(func=_certs)
    certs_sub = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    ca = certs_sub.add_parser("ca", help="make the federation's CA in DIR (ca.pem, ca.key, crl.pem): once, by "
                                         "whoever the federation trusts; keep DIR offline")
    ca.add_argument("dir", type=Path)
    ca.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    request = certs_sub.add_parser("request", help="at a party, on its own host: its private key NAME.key (never "
                                                   "leaves DIR) and a certificate request NAME.csr for the CA")
    request.add_argument("dir", type=Path, help="the party's [tls] dir")
    request.add_argument("--party", required=True, help="the party's name")
    request.add_argument("--san", action="append", default=[], metavar="HOST",
                         help="an extra host name or IP address for the certificate (repeatable; never a party's "
                              "name)")
    sign = certs_sub.add_parser("sign", help="at the CA: sign a party's NAME.csr; NAME.pem, ca.pem and crl.pem "
                                             "are written beside it, to hand back")
    sign.add_argument("ca_dir", type=Path)
    sign.add_argument("request", type=Path)
    sign.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    sign.add_argument("--out", type=Path, help="write the three files here instead of beside the request")
    revoke = certs_sub.add_parser("revoke", help="put a party's certificates on the CA's revocation list (crl.pem); "
                                                 "hand the new list to every party")
    revoke.add_argument("ca_dir", type=Path)
    revoke.add_argument("party")
    revoke.add_argument("--serial", help="revoke only the certificate with this serial (see `vflo certs list`)")
    listing = certs_sub.add_parser("list", help="what the CA signed and revoked")
    listing.add_argument("ca_dir", type=Path)
    init = certs_sub.add_parser("init", help="local demos only: one person makes the CA and every party's key at "
                                             "once (ca.pem, ca.key and NAME.pem / NAME.key in DIR; with --split: "
                                             "DIR/ca/ for the CA, DIR/NAME/ for each party)")
    init.add_argument("dir", type=Path)
    init.add_argument("--parties", required=True, help="comma-separated party names, e.g. active,bank,server")
    init.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    init.add_argument("--overwrite", action="store_true")
    init.add_argument("--san", action="append", default=[], metavar="NAME=HOST,...",
                      help="extra host names or IP addresses for party NAME's certificate (repeatable); by default "
                           "a certificate names only its party, and never any party's name in any spelling")
    init.add_argument("--split", action="store_true",
                      help="keep the keys apart: the CA (ca.pem, ca.key) in DIR/ca/, to keep offline, and for each "
                           "party only its own ca.pem, NAME.pem and NAME.key in DIR/NAME/, its [tls] dir")

    party = sub.add_parser("party", help="run a party's server")
    party.set_defaults(func=_party)
    party_sub = party.add_subparsers(dest="party_command", required=True, metavar="ACTION")
    audit = party_sub.add_parser("audit", help="sum a party's record of what left it (its audit_log file): per peer "
                                               "and kind, messages, bytes, rows and refusals")
    audit.add_argument("file", type=Path)
    audit.add_argument("--run", help="one run only (its ID, as the file gives it; 'last': the newest run)")
    serve = party_sub.add_parser("serve", help="serve one party (PARTY.toml) until interrupted")
    serve.add_argument("config", type=Path)
    serve.add_argument("--insecure", action="store_true", help="no TLS (loopback experiments only)")
    serve.add_argument("--save", type=Path, metavar="DIR",
                       help="this party's model folder: where it writes its parts of trained models and reads them "
                            "to score (overrides models = ... in PARTY.toml)")
    serve.add_argument("--checkpoints", type=Path, metavar="DIR",
                       help="this party's checkpoint folder, for runs started with --checkpoints (overrides "
                            "checkpoints = ... in PARTY.toml)")

    flower = sub.add_parser("flower", help="run a party over Flower (needs pip install 'vflo[flower]')")
    flower.set_defaults(func=_flower_party)
    flower_sub = flower.add_subparsers(dest="flower_command", required=True, metavar="ACTION")
    fparty = flower_sub.add_parser(
        "party", help="serve one party (PARTY.toml) to its Flower SuperNode until interrupted",
        description="Start this party's worker (its data, model and state, for the whole run) and, with `-- "
                    "flower-supernode ARGS`, its SuperNode, told where the worker listens. The coordinator is a "
                    "ServerApp: flwr run examples/flower SUPERLINK --run-config \"experiment='...' deploy='...' "
                    "out='...'\" (see docs/flower.md).")
    fparty.add_argument("config", type=Path)
    fparty.add_argument("--worker", metavar="ADDRESS",
                        help="where the worker listens for its SuperNode's ClientApp: unix:PATH or 127.0.0.1:PORT "
                             "(default: a Unix socket in a new private folder)")
    fparty.add_argument("--save", type=Path, metavar="DIR", help="this party's model folder (as for party serve)")
    fparty.add_argument("--checkpoints", type=Path, metavar="DIR",
                        help="this party's checkpoint folder (as for party serve)")
    fparty.add_argument("supernode", nargs=argparse.REMAINDER,
                        help="after --: the SuperNode's command line, e.g. -- flower-supernode --insecure "
                             "--superlink HOST:9092 (vflo adds --node-config)")

    predict = sub.add_parser("predict", help="score new rows with a saved model", epilog=_exit_code_text(),
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

    scen = sub.add_parser("scenario", help="print each party's columns, sample counts and the overlap matrix")
    scen.set_defaults(func=_scenario)
    scen.add_argument("config", type=Path, help="experiment TOML file")
    scen.add_argument("--data-dir", type=Path)
    scen.add_argument("--seed", type=int, help="scenario seed (default: the config's)")
    scen.add_argument("--export", type=Path, metavar="DIR",
                      help="write each party's files and configs for a real deployment (first variant, first split)")
    scen.add_argument("--base-port", type=int, default=50051, help="with --export: first port to listen on")
    scen.add_argument("--extra-parties", default="", help="with --export: data-less parties, e.g. server,dealer")
    scen.add_argument("--insecure", action="store_true", help="with --export: no certificates, TLS off")

    probe = sub.add_parser("probe", help="train an encoder and score its representations every epoch "
                                         "(APC-VFL Appendix F)", parents=[_output_flags()])
    probe.set_defaults(func=_probe)

    cut = sub.add_parser("holdout", aliases=["split"],
                         help="hold test rows out: cut the parties' own files into train, serve and test files for a "
                              "deployment ('split' is its former name)",
                         epilog="The first file is the active party's (it holds the labels). Test rows are held out "
                                "of every party's training file.\n\n" + _exit_code_text(),
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

    ds = sub.add_parser("datasets", help="list datasets and whether their files are in place")
    ds.set_defaults(func=_datasets)
    ds.add_argument("--data-dir", type=Path)
    methods = sub.add_parser("methods", help="list methods; --messages: what each message kind carries, who sends it")
    methods.set_defaults(func=lambda args: _methods(args.messages, markdown=args.markdown))
    methods.add_argument("--messages", nargs="?", const="all", metavar="NAME",
                         help="the message kinds of method NAME (or of every deployable method): who may send each, "
                              "and what its request and reply carry")
    methods.add_argument("--markdown", action="store_true",
                         help="with --messages: one Markdown table (as in docs/security.md)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _configure_logging(args.verbose)
    _quiet_grpc(args.verbose)
    _configure_threads(args.threads, all_cores=args.command == "predict")
    try:
        code: int = args.func(args)
        return code
    except VfloError as exc:
        print(f"vflo: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("vflo: interrupted", file=sys.stderr)
        return 130


def _quiet_grpc(verbose: int) -> None:
    """gRPC's C core logs handshake failures on stderr in its own format; vflo says what they mean instead.
    Its lines come back with -v. (Read when gRPC is first imported, which is after this.)"""
    import os

    os.environ.setdefault("GRPC_VERBOSITY", "NONE" if verbose == 0 else "INFO")


def _configure_threads(threads: int | None, *, all_cores: bool = False) -> None:
    """One PyTorch thread by default: on small networks extra threads only spin, and on a loaded machine
    they stall (APC-VFL on 150 rows: 1.5 s with one thread, 58 s with two while the other core was busy).
    Scoring (``all_cores``) runs large batches through the network, where every core helps."""
    import os

    if threads is None:
        default = os.cpu_count() or 1 if all_cores else 1
        threads = int(os.environ.get("OMP_NUM_THREADS", str(default)) or default)
    if threads < 1:
        raise SystemExit("vflo: error: --threads must be at least 1")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # already imported: tell it too; otherwise it reads the variable when imported
        sys.modules["torch"].set_num_threads(threads)


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    from rich.logging import RichHandler

    handler = RichHandler(show_path=False, console=_console(stderr=True))
    logging.basicConfig(level=level, format="%(message)s", handlers=[handler], force=True)


def _console(*, stderr: bool = False):  # type: ignore[no-untyped-def]
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Pipes and logs get wide, unwrapped tables (a terminal keeps its own width).
    width = None if stream.isatty() else 200
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


def _certs(args: argparse.Namespace) -> int:
    from vflo.comm import pki
    from vflo.comm.tls import init_certs

    if args.certs_command == "ca":
        pki.create_ca(args.dir, days=args.days)
        print(f"made the federation's CA in {args.dir}/: ca.pem (every party gets it), ca.key (signs certificates: "
              f"keep {args.dir} offline), crl.pem (the revocation list, empty), issued.json (what it signs)")
        return 0
    if args.certs_command == "request":
        key, csr = pki.make_request(args.dir, args.party, hosts=[h.strip() for h in args.san if h.strip()])
        print(f"made {args.party}'s own key: {key.name} stays in {args.dir}/ and never travels. Send {csr} (public) "
              f"to the CA; `vflo certs sign CA_DIR {csr.name}` gives back {args.party}.pem, ca.pem and crl.pem for "
              f"this folder, the party's [tls] dir")
        return 0
    if args.certs_command == "sign":
        written = pki.sign_request(args.ca_dir, args.request, days=args.days, out=args.out)
        print(f"signed {written[0].name}; hand {', '.join(str(p) for p in written)} back to the party (into its "
              "[tls] dir)")
        return 0
    if args.certs_command == "revoke":
        serials = pki.revoke(args.ca_dir, args.party, serial=args.serial)
        print(f"revoked {args.party}'s certificate(s) {', '.join(serials)}; hand {args.ca_dir / pki.CRL_FILE} to every "
              "party (into its [tls] dir): each refuses the revoked certificate from then on")
        return 0
    if args.certs_command == "list":
        for r in pki.issued(args.ca_dir):
            state = f"revoked {r['revoked']}" if r["revoked"] else f"valid until {r['not_after']}"
            hosts = f" (also {', '.join(r['hosts'])})" if r["hosts"] else ""
            print(f"{r['party']}{hosts}: serial {r['serial']}, {state}")
        return 0

    parties = [p.strip() for p in args.parties.split(",") if p.strip()]
    san: dict[str, list[str]] = {}
    for item in args.san:
        name, sep, hosts = item.partition("=")
        if not sep or not hosts.strip():
            raise ConfigError(f"--san {item!r}: write NAME=HOST[,HOST...], e.g. --san bank=bank.example.org")
        san.setdefault(name.strip(), []).extend(h.strip() for h in hosts.split(",") if h.strip())
    written = init_certs(args.dir, parties, days=args.days, overwrite=args.overwrite, san=san, split=args.split)
    print("for local demos: whoever ran this holds every party's key. A real federation makes each key on its "
          "party's own host: vflo certs ca / request / sign (docs/deploy.md)")
    if args.split:
        print(f"wrote {len(written)} files to {args.dir}/: ca/ (ca.pem and ca.key: keep this folder offline, never on "
              f"a party's host) and one folder per party, NAME/ with ca.pem, NAME.pem and NAME.key, for "
              f"{', '.join(parties)} (give each party its own folder; its [tls] dir points at it)")
    else:
        print(f"wrote {len(written)} files to {args.dir}/: ca.pem (give to every party), ca.key (keep offline), and "
              f"NAME.pem / NAME.key for {', '.join(parties)} (give each party its own; --split writes a folder per "
              "party)")
    return 0


def _insecure_tls(config: Any) -> Any:
    from dataclasses import replace

    from vflo.deploy import TLSConfig

    print("vflo: WARNING: --insecure: no TLS; messages travel unencrypted and parties are not authenticated. "
          "Use it only on a loopback interface.", file=sys.stderr)
    return replace(config, tls=TLSConfig(insecure=True))


def _party(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from vflo.deploy import load_party_config, serve_forever

    if args.party_command == "audit":
        return _party_audit(args.file, args.run)
    config = load_party_config(args.config)
    if args.insecure:
        config = _insecure_tls(config)
    if args.save is not None:
        config = replace(config, models=str(args.save))
    if args.checkpoints is not None:
        config = replace(config, checkpoints=str(args.checkpoints))
    return serve_forever(config)


def _party_audit(path: Path, run: str | None) -> int:
    from rich.table import Table

    from vflo.comm.departures import read_departures, summarize

    records = read_departures(path)
    runs = list(dict.fromkeys(r.run for r in records if r.run))
    if run == "last":
        if not runs:
            raise ConfigError(f"{path} records no run yet")
        run = runs[-1]
    if run is not None:
        if run not in runs:
            raise ConfigError(f"{path} has no run {run!r}; its runs: {runs[-5:]}")
        records = [r for r in records if r.run == run]
    party = records[0].party if records else "?"
    scope = f"run {run}" if run else f"{len(runs)} runs and what came outside any"
    table = Table(title=f"what left party {party} ({scope}; {path})")
    for col in ("to", "kind", "messages", "bytes", "rows", "refused", "errors"):
        table.add_column(col, justify="right" if col not in ("to", "kind") else "left")
    rows = summarize(records)
    for r in rows:
        table.add_row(r["peer"], r["kind"], *(f"{r[k]:,}" for k in ("messages", "bytes", "rows", "refused", "errors")))
    table.add_row("all", "", *(f"{sum(r[k] for r in rows):,}" for k in ("messages", "bytes", "rows", "refused",
                                                                         "errors")))
    _console().print(table)
    return 0


def _flower_party(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from vflo.deploy import load_party_config
    from vflo.flower import require_flwr

    require_flwr()
    from vflo.flower.worker import serve_flower

    config = load_party_config(args.config)
    if args.save is not None:
        config = replace(config, models=str(args.save))
    if args.checkpoints is not None:
        config = replace(config, checkpoints=str(args.checkpoints))
    supernode = [a for a in args.supernode if a != "--"] if args.supernode else []
    return serve_flower(config, address=args.worker, supernode=supernode)


def _compare(args: argparse.Namespace) -> int:
    import tomllib

    from vflo.experiments.compare import compare
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
    console = _console()

    def progress(cell: Any, k: int, total: int) -> None:
        console.print(f"[{k + 1}/{total}] {cell.label}")

    result = compare(raw, data_dir=None if args.data_dir is None else str(args.data_dir), quick=args.quick,
                     on_cell=None if args.no_progress else progress)
    write_comparison(result, out_dir, overwrite=args.overwrite)
    console.print(f"{len(result.rows)} method runs in {result.seconds:.0f} s; report.html, report.md and results "
                  f"written to {out_dir}/")
    failed = int((result.rows["status"] == "failed").sum()) if "status" in result.rows else 0
    return 0 if len(result.rows) and failed < len(result.rows) else 5


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
        from vflo.deploy import load_deploy_config, score_deployed

        deploy = load_deploy_config(args.deploy)
        if args.insecure:
            deploy = replace(deploy, active=_insecure_tls(deploy.active))
        frame = score_deployed(deploy, model, args.data, missing=args.missing, fallback=fallback,
                               deadline=args.deadline)
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


def _run_deployed(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from vflo.deploy import Deployment, load_deploy_config
    from vflo.experiments.config import load_deployment_experiment
    from vflo.experiments.deployed import run_and_write
    from vflo.experiments.output import check_out_dir, default_out_dir

    experiment = load_deployment_experiment(args.config)
    deploy = load_deploy_config(args.deploy)
    if args.insecure:
        deploy = replace(deploy, active=_insecure_tls(deploy.active))
    _check_checkpoints(args, experiment.methods)
    out_dir = args.out if args.out is not None else default_out_dir(experiment.name)
    check_out_dir(out_dir, overwrite=args.overwrite or args.resume)
    if args.save is not None:
        check_out_dir(args.save, overwrite=args.overwrite)
    rows = run_and_write(experiment, Deployment(deploy), out_dir, overwrite=args.overwrite or args.resume,
                         save=args.save, checkpoints=args.checkpoints, resume=args.resume)
    console = _console()
    for r in rows:
        if r["status"] == "failed":
            print(f"vflo: error: {r['method']} failed: {r['error_type']}: {r['error']}", file=sys.stderr)
            continue
        console.print(f"{r['method']}: " + ", ".join(f"{k} = {r[k]:.4f}" for k in ("accuracy", "rmse") if k in r)
                      + f"; {r['fit_bytes'] / 1e6:.3f} MB in {r['fit_rounds']} training rounds")
    console.print(f"results written to {out_dir}/")
    return next((int(r["exit_code"]) for r in rows if r["status"] == "failed"), 0)


def _check_checkpoints(args: argparse.Namespace, methods: Sequence[Any]) -> None:
    from vflo.errors import ConfigError

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
    console = _console()
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


def _print_summary(console, result, summary) -> None:  # type: ignore[no-untyped-def]
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


def _export(args: argparse.Namespace, config: Any, dataset: Any, seed: int) -> int:
    from vflo.deploy import export_federation
    from vflo.seeding import numpy_rng

    layout = config.layout(config.variants[0], seed, dataset)
    split = config.protocol.splits(layout, numpy_rng(config.seed, "split", 0))[0]
    data = layout.materialize(test_ids=split.test_ids, train_scope=split.train_scope)
    extra = {name.strip(): name.strip() for name in args.extra_parties.split(",") if name.strip()}
    for name in extra:
        if name not in ("server", "dealer"):
            raise ConfigError(f"--extra-parties takes 'server' and 'dealer', not {name!r}")
    deployable = [e for e in config.methods if not e.method_cls.simulation_only]
    written = export_federation(data, args.export, base_port=args.base_port, extra_roles=extra,
                                tls=not args.insecure, methods=[e.method_cls.name for e in deployable],
                                proposals=[e.instantiate() for e in deployable])
    active = data.active
    print(f"wrote each party's data and config to {args.export}/ (variant {config.variants[0].label}).")
    print("start every party but the active one, each in its own terminal:")
    for name, path in written.items():
        if name != active:
            print(f"  cd {args.export} && vflo party serve {path.name}")
    print(f"then, for the active party {active!r}:")
    print(f"  cd {args.export} && vflo run EXPERIMENT.toml --deploy deploy.toml")
    return 0


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
              "impute = 'mean' (or 'median', 'most_frequent', a number) under [data] in its config, or leaves the "
              "columns out (drop_columns); without either it refuses them, naming the column")
    print(f"give each party its own files; {names[0]}_test.csv (with labels) stays with the active party {names[0]!r}")
    return 0


def _datasets(args: argparse.Namespace) -> int:
    from rich.table import Table

    from vflo.data.datadir import locate, resolve_data_dir
    from vflo.data.datasets import dataset_specs
    from vflo.errors import DataFileError

    table = Table(title=f"datasets (data directory: {resolve_data_dir(args.data_dir)})")
    for col in ("name", "task", "classes", "rows x features", "kind", "available"):
        table.add_column(col)
    for spec in dataset_specs().values():
        status = "yes"
        for f in spec.files:
            try:
                locate(f, args.data_dir)
            except DataFileError as exc:
                status = f"no: {exc}"
        kind = f"STAND-IN for {spec.standin_for}" if spec.standin else "real"
        table.add_row(spec.name, spec.task, str(spec.n_classes or "-"), f"{spec.shape[0]} x {spec.shape[1]}",
                      kind, status)
    _console().print(table)
    return 0


def _methods(messages: str | None = None, *, markdown: bool = False) -> int:
    from rich.table import Table

    from vflo.methods.registry import get_method, method_names, scoring_text

    if messages is not None:
        from vflo.audit import declarations

        name = None if messages == "all" else messages
        if markdown:
            from vflo.audit import markdown as table_markdown

            print(table_markdown(name))
            return 0
        if name is not None and get_method(name).simulation_only:
            raise ConfigError(f"{name} runs only in simulation (it pools every party's raw features): it sends no "
                              "messages a deployment would")
        table = Table(title=f"messages of {name or 'every deployable method'}")
        for col in ("kind", "who may send it", "the request carries", "the reply carries"):
            table.add_column(col)
        for d in declarations(name):
            table.add_row(d.kind, " or ".join(d.senders), ", ".join(f"{f} ({c})" for f, c in d.request.items()) or "-",
                          ", ".join(f"{f} ({c})" for f, c in d.reply.items()) or "-")
        _console().print(table)
        return 0

    table = Table(title="methods")
    for col in ("name", "scores", "also needs", "checkpoints", "what it is", "from"):
        table.add_column(col)
    for name in method_names():
        cls = get_method(name)
        helpers = sorted({p.role for p in cls(**cls.quick).extra_parties(())})
        table.add_row(name, scoring_text(cls), ", ".join(helpers) or "-", ", ".join(cls.checkpointed) or "-",
                      cls.summary, cls.paper)
    _console().print(table)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
