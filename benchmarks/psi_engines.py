"""Private set intersection of two parties' IDs: vflo's alignment with each engine against SecretFlow's PSI
library run on its own, on this machine in the same run (benchmark, not a test).

    python -m benchmarks.psi_engines [--rows 1000000] [--engines rr22,kkrt,ecdh,vflo] [--repeats 3]
                                     [--out runs/bench/psi.json]
    python -m benchmarks.psi_engines --docs runs/bench/psi.json   # the table in docs/deploy.md

Each party holds ``--rows`` text IDs, half of them shared. ``library P``: the library's ``psi_execute`` with
protocol P, both sides in threads of this process, over its link on loopback, IDs from CSV files it reads
(what a peer's user runs). ``vflo P``: ``Coordinator.align`` with ``[alignment] method = 'psi'`` and engine P,
the active party and its partner each a node of an in-process federation: vflo's messages set the intersection
up, its link's bytes are counted by vflo's relay, and the result is vflo's alignment (which people, in which
order, at both parties). ``vflo vflo``: vflo's own ECDH over its messages. Every run's intersection is checked
against the true one. Results are written after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marked import write_marked
from vflo.align import spu
from vflo.align.engines import AlignmentConfig
from vflo.align.kept import AlignmentStore
from vflo.align.link_relay import LinkRelays
from vflo.align.linked import closing
from vflo.align.plain import Alignment
from vflo.comm.local_ports import free_port
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.registry import get_method
from vflo.party.policy import Policy
from vflo.roles import PartyInfo

MARK_BEGIN, MARK_END = "<!-- psi-engines:begin -->", "<!-- psi-engines:end -->"


def people(rows: int) -> tuple[np.ndarray, np.ndarray]:
    active = np.asarray([f"person-{i:09d}" for i in range(rows)])
    passive = np.asarray([f"person-{i:09d}" for i in range(rows // 2, rows + rows // 2)])
    return active, passive


def library_alone(ids: tuple[np.ndarray, np.ndarray], protocol: str) -> tuple[float, int]:
    """Both sides of the library's PSI, as its own user runs it (CSV files in, CSV out)."""
    libspu, libpsi = spu._libraries()
    ports = [free_port("127.0.0.1") for _ in range(2)]
    counts: dict[int, int] = {}
    with tempfile.TemporaryDirectory() as work:
        for rank, side in enumerate(ids):
            Path(work, f"in{rank}.csv").write_text("id\n" + "\n".join(side.tolist()) + "\n")

        def run(rank: int) -> None:
            desc = libspu.link.Desc()
            desc.id = "bench"
            for i, port in enumerate(ports):
                desc.add_party(f"r{i}", f"127.0.0.1:{port}")
            desc.connect_retry_times, desc.connect_retry_interval_ms, desc.recv_timeout_ms = 300, 200, 600_000
            context = libspu.link.create_brpc(desc, rank)
            config = libpsi.PsiExecuteConfig()
            config.protocol_conf.protocol = getattr(libpsi.PsiProtocol, spu.PROTOCOLS[protocol])
            config.protocol_conf.receiver_rank = 0
            config.protocol_conf.broadcast_result = True
            config.protocol_conf.ecdh_params.curve = libpsi.EllipticCurveType.CURVE_25519
            config.input_params.type = config.output_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
            config.input_params.path = str(Path(work, f"in{rank}.csv"))
            config.input_params.selected_keys = ["id"]
            config.input_params.keys_unique = True  # as vflo tells it (it checks the IDs itself)
            config.output_params.path = str(Path(work, f"out{rank}.csv"))
            config.output_params.disable_alignment = True
            report = libpsi.psi_execute(config, context)
            context.stop_link()
            counts[rank] = report.intersection_count

        traces = set(Path("/tmp").glob("psi_*.trace"))
        tmpdir = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = work  # the library's working folders, which it leaves behind
        started = time.perf_counter()
        threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - started
        if tmpdir is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = tmpdir
        for trace in set(Path("/tmp").glob("psi_*.trace")) - traces:  # the library's, written at a fixed place
            trace.unlink(missing_ok=True)
        return seconds, counts[0]


def two_parties(ids: tuple[np.ndarray, np.ndarray], partner: str = "passive") -> FederatedData:
    """An active party holding ``ids[0]`` and a partner holding ``ids[1]``, one zero feature each: what the PSI
    benchmarks align."""
    active = PartyData(ids=ids[0], X=np.zeros((len(ids[0]), 1), np.float32), y=np.zeros(len(ids[0]), np.int64),
                       party="active", columns=("x",))
    other = PartyData(ids=ids[1], X=np.zeros((len(ids[1]), 1), np.float32), party=partner, columns=("z",))
    # The two parties' tables as they are, without a simulation's pooled copy (its sets of every ID would be most
    # of the process's memory at ten million IDs).
    return FederatedData(parties=(PartyInfo("active", "active"), PartyInfo(partner, "passive")),
                         train={"active": active, partner: other}, serve={}, test_ids=ids[0][:0],
                         test_y=np.zeros(0, np.int64), task="binary", n_classes=2, oracle=None)


def timed_align(data: FederatedData, alignment: AlignmentConfig, *, asked: np.ndarray | None = None,
                stores: dict[str, AlignmentStore] | None = None) -> tuple[float, Alignment, Coordinator]:
    """One ``Coordinator.align`` of ``asked`` (default: every ID of the active party) with its partner, over a new
    in-process federation (``stores``: where the parties keep their alignments): seconds, the alignment, the
    federation. The alignment is checked against the true intersection."""
    partner = next(name for name in data.train if name != "active")
    local = get_method("local")()
    # Each party takes requests as large as the IDs (the default policy bounds a request at 1,000,000 rows: vflo's
    # own ECDH sends every blinded point in one message).
    bound = Policy(max_rows=max(1_000_000, *(len(d) for d in data.train.values())))
    fed, _ = build_federation(data, local, seed=0, max_message_bytes=1 << 31, alignment=alignment,
                              alignments=stores, policies=dict.fromkeys(data.train, bound))
    Session(fed).start(local)
    asked = data.train["active"].ids if asked is None else asked
    started = time.perf_counter()
    found = fed.align(asked, [partner])
    seconds = time.perf_counter() - started
    assert np.array_equal(found.ids, np.intersect1d(asked, data.train[partner].ids)), "not the true intersection"
    return seconds, found, fed


def through_vflo(ids: tuple[np.ndarray, np.ndarray], engine: str) -> tuple[float, int, int]:
    """``Coordinator.align`` with ``engine``: seconds, people found, bytes the ledger counted for the intersection."""
    seconds, found, fed = timed_align(two_parties(ids), AlignmentConfig(method="psi", engine=engine))  # type: ignore[arg-type]
    return seconds, len(found.ids), sum(e.nbytes for e in fed.transport.ledger.entries if e.kind.startswith("align."))


def steps(ids: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    """vflo's own steps around the library, timed alone: writing one party's IDs for it (tagged, checked unique,
    CSV), reading the intersection back, starting a side's process, and a whole intersection of 300 IDs through
    vflo's relays (the cost that does not grow with the IDs)."""
    out: dict[str, float] = {}
    started = time.perf_counter()
    prepared = spu.prepare(ids[0])
    out["write_ids"] = time.perf_counter() - started
    with prepared:
        shared = set(ids[1].tolist())
        names = prepared.names.to_pylist()
        prepared.result.write_text("id\n" + "\n".join(n for n, v in zip(names, ids[0].tolist(), strict=True)
                                                       if v in shared) + "\n")
        started = time.perf_counter()
        prepared.shared()
        out["read_result"] = time.perf_counter() - started
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from vflo.align.spu_side import libraries; libraries()"], check=True,
                   capture_output=True)
    out["start_process"] = time.perf_counter() - started
    started = time.perf_counter()
    mine, theirs = spu.prepare(np.arange(100, 400)), spu.prepare(np.arange(300))
    with LinkRelays(mine.folder, listen=("127.0.0.1", 0), me="active", peer="passive", tls=None) as inbound:
        outbound = LinkRelays(theirs.folder, listen=("127.0.0.1", 0), me="passive", peer="active", tls=None)
        outbound.connect("127.0.0.1", inbound.port)
        partner = spu.Side(rank=1, own=outbound.own, peer=outbound.to_peer, protocol="rr22", broadcast=True,
                           timeout_s=60)
        running = spu.Running(closing(outbound, lambda: partner.run(theirs)))
        inbound.connect("127.0.0.1", outbound.port)
        inbound.wait_listening(60)
        spu.Side(rank=0, own=inbound.own, peer=inbound.to_peer, protocol="rr22", broadcast=True,
                 timeout_s=60).run(mine)
        running.join(60)
    out["small_intersection"] = time.perf_counter() - started
    return out


def measure(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from vflo.align import curve

    results: dict[str, Any] = {"rows": args.rows, "shared": args.rows - args.rows // 2, "cores": os.cpu_count(),
                               "x25519": curve.backend(), "runs": []}
    ids = people(args.rows)
    if any(engine in spu.PROTOCOLS for engine in args.engines.split(",")):
        results["steps"] = steps(ids)
        print("vflo's steps: " + ", ".join(f"{k} {v:.2f} s" for k, v in results["steps"].items()), flush=True)
    for engine in args.engines.split(","):
        kinds = ["library", "vflo"] if engine in spu.PROTOCOLS else ["vflo"]
        # The library's own time moves from one run to the next: each pair runs ``--repeats`` times, one after
        # the other, and the docs give medians.
        for repeat in range(args.repeats if engine in spu.PROTOCOLS else args.own_repeats):
            for kind in kinds:
                if kind == "library":
                    seconds, found = library_alone(ids, engine)
                    nbytes = None
                else:
                    seconds, found, nbytes = through_vflo(ids, engine)
                assert found == results["shared"], f"{kind} {engine} found {found} of {results['shared']}"
                # This process's peak so far (kB on Linux): both parties' nodes and the benchmark's own copies of the
                # IDs; the library's side processes are not in it. (Their own peaks cannot be read from here: a child
                # started by vfork reports its parent's peak as its own.)
                results["runs"].append({"by": kind, "protocol": engine, "seconds": seconds, "bytes": nbytes,
                                        "repeat": repeat,
                                        "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9})
                print(f"{kind} {engine}: {seconds:.2f} s" + (f", {nbytes / 1e6:.1f} MB counted" if nbytes else ""),
                      flush=True)
                out.write_text(json.dumps(results, indent=1))


def docs(path: Path, page: Path) -> None:
    results = json.loads(path.read_text())
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results["runs"]:
        grouped.setdefault((r["by"], r["protocol"]), []).append(r)
    runs = {key: {"seconds": float(np.median([r["seconds"] for r in rs])), "bytes": rs[-1]["bytes"],
                  "all": [r["seconds"] for r in rs]} for key, rs in grouped.items()}
    repeats = max(len(rs) for rs in grouped.values())
    lines = [f"Measured by `python -m benchmarks.psi_engines --rows {results['rows']} --repeats {repeats}` on this "
             f"project's machine ({results['cores']} cores), both parties on it: {results['rows']:,} text IDs each, "
             f"{results['shared']:,} shared. Each figure is the median of its runs (all of them in brackets), the "
             "library alone and through vflo taking turns.", "",
             "| protocol | the library alone (s) | through vflo's alignment (s) | vflo / library "
             "| bytes vflo counted |",
             "|---|---|---|---|---|"]

    def shown(run: dict[str, Any]) -> str:
        every = ", ".join(f"{x:.1f}" for x in run["all"])
        return f"{run['seconds']:.1f}" + (f" ({every})" if len(run["all"]) > 1 else "")

    for protocol in ("rr22", "kkrt", "ecdh"):
        alone, ours = runs.get(("library", protocol)), runs.get(("vflo", protocol))
        if alone and ours:
            lines.append(f"| {protocol} | {shown(alone)} | {shown(ours)} | "
                         f"{ours['seconds'] / alone['seconds']:.2f} | {ours['bytes'] / 1e6:.1f} MB |")
    own = runs.get(("vflo", "vflo"))
    if own:
        library_ecdh = runs.get(("library", "ecdh"))
        against = (f"{own['seconds'] / library_ecdh['seconds']:.2f} (against the library's ECDH)" if library_ecdh
                   else "—")
        lines.append(f"| vflo's own ECDH (X25519{', ' + results['x25519'] if 'x25519' in results else ''}) | — | "
                     f"{shown(own)} | {against} | {own['bytes'] / 1e6:.1f} MB |")
    if "steps" in results and ("vflo", "rr22") in runs and ("library", "rr22") in runs:
        st = results["steps"]
        extra = runs[("vflo", "rr22")]["seconds"] - runs[("library", "rr22")]["seconds"]
        beside = ("shorter than the writing, behind which it runs" if st["start_process"] < st["write_ids"]
                  else "longer than the writing it runs beside")
        lines += ["", f"Where vflo's extra time with RR22 ({extra:.1f} s) goes, each step timed alone in the same run: "
                  f"writing a party's IDs for the library {st['write_ids']:.1f} s (the active party's, then the "
                  f"partner's: one after the other, so each refuses a repeated ID before anything starts; each side's "
                  f"process starts meanwhile), reading the intersection back {st['read_result']:.1f} s, starting a "
                  f"side's process {st['start_process']:.1f} s ({beside}). A whole intersection of "
                  f"300 IDs through vflo's relays takes {st['small_intersection']:.1f} s: both sides' processes "
                  "start and their link connects. That cost does not grow with the IDs."]
    write_marked(page, MARK_BEGIN, MARK_END, lines)


def docs_large(paths: list[Path], page: Path) -> None:
    """Results files of one engine each at ten million IDs (so each file's memory peaks are that engine's) as the
    table between the ``psi-10m`` markers."""
    rows = [(json.loads(p.read_text()), p) for p in paths]
    first = rows[0][0]
    lines = [f"Measured by `python -m benchmarks.psi_engines --rows {first['rows']} --repeats 1 --engines E` on this "
             f"project's machine ({first['cores']} cores), one engine a run, both parties on it: {first['rows']:,} "
             f"text IDs each, {first['shared']:,} shared (the goals: under 2 minutes with the library, under 20 "
             "with vflo's own ECDH, under 4 GB per party). The memory is the benchmark process's peak by the end of "
             "the run: both parties' nodes, or the library's two sides when it runs alone (in threads), with the "
             "benchmark's own copies of the IDs; the library's side processes under vflo are not in it.", "",
             "| engine | seconds | the process's peak memory |", "|---|---|---|"]
    for results, _ in rows:
        for run in results["runs"]:
            name = (f"the library's {run['protocol'].upper()} alone" if run["by"] == "library"
                    else "vflo's own ECDH (X25519)" if run["protocol"] == "vflo"
                    else f"vflo with {run['protocol'].upper()}")
            lines.append(f"| {name} | {run['seconds']:.1f} | {run['peak_gb']:.2f} GB |")
    write_marked(page, "<!-- psi-10m:begin -->", "<!-- psi-10m:end -->", lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--engines", default="rr22,kkrt,ecdh,vflo")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each library protocol, alone and through "
                                                               "vflo (the docs give medians)")
    parser.add_argument("--own-repeats", type=int, default=1, help="runs of vflo's own ECDH (about 100 s each)")
    parser.add_argument("--out", default="runs/bench/psi.json")
    parser.add_argument("--docs", type=Path, help="write the table of this results file into docs/deploy.md")
    parser.add_argument("--docs-large", type=Path, nargs="+", help="write the ten-million table of these results "
                                                                  "files (one engine each) into docs/deploy.md")
    args = parser.parse_args(argv)
    if args.docs_large:
        docs_large(args.docs_large, Path(__file__).resolve().parents[1] / "docs" / "deploy.md")
        return 0
    if args.docs is not None:
        docs(args.docs, Path(__file__).resolve().parents[1] / "docs" / "deploy.md")
        return 0
    if problem := spu.missing():
        print(problem, file=sys.stderr)
        return 2
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
