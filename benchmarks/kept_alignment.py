"""Kept alignments: what a private set intersection costs the first time, and what reusing it costs later
(benchmark, not a test).

    python -m benchmarks.kept_alignment [--rows 1000000] [--engine rr22] [--out runs/bench/kept.json]
    python -m benchmarks.kept_alignment --docs runs/bench/kept.json   # the table in docs/deploy.md

Each party holds ``--rows`` text IDs, half of them shared; both are nodes of an in-process federation whose
parties keep their alignments in folders of their own (:mod:`vflo.align.kept`). Timed, each once in order:
an intersection with nothing kept (``engine``, and the same with ``reuse = false``: what keeping adds), the same
IDs asked again by a new federation over the same folders (reused), 90 % of them (a run's training rows
without its test rows: reused, narrowed), and the partner with one person fewer (declined, then a fresh
intersection, kept). Every alignment is checked against the true one. Results are written after each step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marked import write_marked
from benchmarks.psi_engines import people, timed_align, two_parties
from vflo.align import spu
from vflo.align.engines import AlignmentConfig
from vflo.align.kept import AlignmentStore

MARK_BEGIN, MARK_END = "<!-- kept-alignment:begin -->", "<!-- kept-alignment:end -->"


def align(ids: tuple[np.ndarray, np.ndarray], asked: np.ndarray, engine: str, folder: Path | None,
          *, reuse: bool = True) -> tuple[float, int, str]:
    """One ``Federation.align`` of ``asked`` with the partner: seconds, people found, the engine named."""
    stores = None if folder is None else {p: AlignmentStore(folder / p, p) for p in ("active", "passive")}
    seconds, found, fed = timed_align(two_parties(ids), AlignmentConfig(method="psi", engine=engine, reuse=reuse),  # type: ignore[arg-type]
                                      asked=asked, stores=stores)
    return seconds, len(found.ids), fed.alignment_engine


def measure(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ids = people(args.rows)
    subset = np.sort(ids[0])[np.random.default_rng(0).random(len(ids[0])) < 0.9]
    fewer = (ids[0], ids[1][1:])
    results: dict[str, Any] = {"rows": args.rows, "engine": args.engine, "cores": os.cpu_count(), "steps": []}
    folder = Path(tempfile.mkdtemp(prefix="vflo-kept-"))
    try:
        plan = [("fresh, nothing kept (reuse = false)", ids, ids[0], None, False),
                ("fresh, then kept by both parties", ids, ids[0], folder, True),
                ("the same IDs again: reused", ids, ids[0], folder, True),
                ("90 % of them (a run's training rows): reused", ids, subset, folder, True),
                ("the partner holds one person fewer: declined, fresh, kept", fewer, ids[0], folder, True)]
        for label, held, asked, where, reuse in plan:
            seconds, found, engine = align(held, asked, args.engine, where, reuse=reuse)
            results["steps"].append({"step": label, "seconds": seconds, "shared": found, "engine": engine,
                                     "asked": len(asked)})
            print(f"{label}: {seconds:.2f} s ({engine}, {found:,} of {len(asked):,} shared)", flush=True)
            out.write_text(json.dumps(results, indent=1))
        sizes = {p: sum(f.stat().st_size for f in (folder / p).iterdir()) for p in ("active", "passive")}
        results["kept_bytes"] = sizes
        out.write_text(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def docs(path: Path, page: Path) -> None:
    results = json.loads(path.read_text())
    lines = [f"Measured by `python -m benchmarks.kept_alignment --rows {results['rows']} --engine "
             f"{results['engine']}` on this project's machine ({results['cores']} cores), both parties on it: "
             f"{results['rows']:,} text IDs each, half of them shared.", "",
             "| step | seconds | engine named in the results |", "|---|---|---|"]
    for step in results["steps"]:
        lines.append(f"| {step['step']} | {step['seconds']:.1f} | {step['engine']} |")
    steps = results["steps"]
    if len(steps) >= 3:
        fresh, kept, reused = (steps[i]["seconds"] for i in range(3))
        lines += ["", f"Keeping added {kept - fresh:.1f} s to the fresh intersection in this run (both parties "
                  f"writing their records; the library's own time also moves from one intersection to the next), "
                  f"and reusing took {reused:.1f} s, {reused / fresh:.0%} of the fresh intersection without "
                  "keeping: the active party reading its record and checking that it covers the IDs asked, the "
                  "partner hashing its IDs to compare them with its record's and reading its shared people."]
    if "kept_bytes" in results:
        kb = results["kept_bytes"]
        lines += ["", f"What the two intersections kept on disk, all records together: the active party "
                  f"{kb['active'] / 1e6:.1f} MB, the partner {kb['passive'] / 1e6:.1f} MB."]
    write_marked(page, MARK_BEGIN, MARK_END, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--engine", default="rr22", choices=["rr22", "kkrt", "ecdh", "vflo"])
    parser.add_argument("--out", default="runs/bench/kept.json")
    parser.add_argument("--docs", type=Path, help="write the table of this results file into docs/deploy.md")
    args = parser.parse_args(argv)
    if args.docs is not None:
        docs(args.docs, Path(__file__).resolve().parents[1] / "docs" / "deploy.md")
        return 0
    if args.engine != "vflo" and (problem := spu.missing()):
        print(f"{problem}; or give --engine vflo", file=sys.stderr)
        return 2
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
