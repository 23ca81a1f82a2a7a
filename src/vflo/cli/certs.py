"""``vflo certs``: the federation's CA, each party's own key and certificate, revocations."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from vflo.errors import ConfigError


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    certs = sub.add_parser("certs", help="certificates for mutual TLS: a CA, each party's own key and certificate")
    certs.set_defaults(func=_certs)
    certs_sub = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    ca = certs_sub.add_parser("ca", help="make the federation's CA in DIR (ca.pem, ca.key, crl.pem): once, by "
                                         "whoever the federation trusts; keep DIR offline")
    ca.add_argument("dir", type=Path)
    ca.add_argument("--parties", required=True,
                    help="the federation's roster: every party's name, comma-separated (e.g. hospital,lab). The CA "
                         "signs only for a party on it and refuses a certificate that names another party on it, "
                         "signed yet or not; a party that joins later is added with `vflo certs roster`")
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
    listing = certs_sub.add_parser("list", help="the CA's roster, what it signed and what it revoked")
    listing.add_argument("ca_dir", type=Path)
    roster = certs_sub.add_parser("roster", help="the federation's roster of party names at the CA: add a party "
                                                 "that joins (before `certs sign`), or write the roster of a CA "
                                                 "folder made before vflo kept one")
    roster.add_argument("ca_dir", type=Path)
    roster.add_argument("--add", default="", metavar="NAME,...",
                        help="party names to add (comma-separated); a CA folder without a roster gets one with "
                             "these and every party it signed so far")
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


def _certs(args: argparse.Namespace) -> int:
    from vflo.comm import pki
    from vflo.comm.tls import init_certs

    if args.certs_command == "ca":
        parties = _names(args.parties)
        pki.create_ca(args.dir, parties, days=args.days)
        print(f"made the federation's CA in {args.dir}/: ca.pem (every party gets it), ca.key (signs certificates: "
              f"keep {args.dir} offline), crl.pem (the revocation list, empty), issued.json (what it signs), "
              f"roster.json (the parties it signs for: {', '.join(parties)})")
        return 0
    if args.certs_command == "roster":
        roster, warnings = pki.add_to_roster(args.ca_dir, _names(args.add))
        print(f"the federation's roster at {args.ca_dir}: {', '.join(roster)}")
        for warning in warnings:
            print(f"WARNING: {warning}", file=sys.stderr)
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
              f"party (into its [tls] dir): each refuses the revoked certificate from then on. Its key stays revoked: "
              f"for a new certificate, {args.party} makes a new key (`vflo certs request NEW_DIR --party "
              f"{args.party}`) and the CA signs that request")
        return 0
    if args.certs_command == "list":
        try:
            print(f"roster: {', '.join(pki.read_roster(args.ca_dir))}")
        except ConfigError as exc:
            print(f"WARNING: {exc}", file=sys.stderr)
        for r in pki.issued(args.ca_dir):
            state = f"revoked {r['revoked']}" if r["revoked"] else f"valid until {r['not_after']}"
            hosts = f" (also {', '.join(r['hosts'])})" if r["hosts"] else ""
            print(f"{r['party']}{hosts}: serial {r['serial']}, {state}")
        return 0

    parties = _names(args.parties)
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


def _names(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]
