"""Unbalanced private set intersection: a small active party against a large partner, by the PSI library's
ECDH-OPRF (prepared once, then online) against its balanced RR22 (benchmark, not a test).

    python -m benchmarks.unbalanced_psi [--small 10000] [--large 10000000] [--out runs/bench/unbalanced.json]
    python -m benchmarks.unbalanced_psi --docs runs/bench/unbalanced.json   # the table in docs/deploy.md

The active party holds ``--small`` text IDs, half of them among the partner's ``--large``. Both are nodes of an
in-process federation over vflo's alignment (its messages, the library's link through vflo's counting relays),
each keeping its alignments in a folder of its own. Timed in order: balanced RR22; the unbalanced preparation
with its first intersection; the same intersection again by a new federation over the same folders and the same
party stores (the partner's process still serving: it hashed its IDs once); and the partner's hash of its IDs
alone (what its first request after a restart adds). Every intersection is checked against the true one.
Results are written after each step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marked import write_marked
from benchmarks.psi_engines import timed_align, two_parties
from vflo.align import spu
from vflo.align.engines import AlignmentConfig
from vflo.align.ids import digest
from vflo.align.kept import AlignmentStore
from vflo.data.layout import FederatedData

MARK_BEGIN, MARK_END = "<!-- unbalanced-psi:begin -->", "<!-- unbalanced-psi:end -->"


def federation_data(small: int, large: int) -> FederatedData:
    big = np.asarray([f"person-{i:09d}" for i in range(large)])
    mine = np.concatenate([big[:: max(1, large // (small // 2))][: small // 2],
                           np.asarray([f"other-{i:09d}" for i in range(small - small // 2)])])
    return two_parties((mine, big), partner="partner")


def align(data: FederatedData, engine: str, stores: dict[str, AlignmentStore] | None) -> tuple[float, int]:
    seconds, found, _ = timed_align(data, AlignmentConfig(method="psi", engine=engine, reuse=False),  # type: ignore[arg-type]
                                    stores=stores)
    return seconds, len(found.ids)


def measure(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"small": args.small, "large": args.large, "cores": os.cpu_count(), "steps": []}
    data = federation_data(args.small, args.large)
    folder = Path(tempfile.mkdtemp(prefix="vflo-ub-"))
    stores = {p: AlignmentStore(folder / p, p) for p in ("active", "partner")}

    def step(label: str, seconds: float, shared: int | None = None) -> None:
        results["steps"].append({"step": label, "seconds": seconds, "shared": shared})
        results["peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        print(f"{label}: {seconds:.2f} s" + ("" if shared is None else f" ({shared:,} shared)"), flush=True)
        out.write_text(json.dumps(results, indent=1))

    try:
        step("balanced RR22", *align(data, "rr22", None))
        step("unbalanced: preparation and the first intersection", *align(data, "unbalanced", stores))
        step("unbalanced: an intersection after the preparation", *align(data, "unbalanced", stores))
        step("unbalanced: another", *align(data, "unbalanced", stores))
        started = time.perf_counter()
        digest(data.train["partner"].ids)
        step("the partner hashing its IDs (once per process)", time.perf_counter() - started)
        sizes = {p: sum(f.stat().st_size for f in (folder / p).rglob("*") if f.is_file()) for p in stores}
        results["kept_bytes"] = sizes
        out.write_text(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def docs(path: Path, page: Path) -> None:
    results = json.loads(path.read_text())
    lines = [f"Measured by `python -m benchmarks.unbalanced_psi --small {results['small']} --large "
             f"{results['large']}` on this project's machine ({results['cores']} cores), both parties on it: the "
             f"active party's {results['small']:,} text IDs against the partner's {results['large']:,}, "
             f"{results['small'] // 2:,} shared.", "", "| step | seconds |", "|---|---|"]
    lines += [f"| {s['step']} | {s['seconds']:.1f} |" for s in results["steps"]]
    steps = {s["step"]: s["seconds"] for s in results["steps"]}
    balanced = steps.get("balanced RR22")
    first = steps.get("unbalanced: preparation and the first intersection")
    online = steps.get("unbalanced: an intersection after the preparation")
    if balanced and first and online:
        preparation = first - online
        lines += ["", f"After the preparation an intersection took {online:.1f} s, {balanced / online:.1f} times "
                  f"faster than balanced RR22 on the same IDs ({balanced:.1f} s); the preparation (about "
                  f"{preparation:.0f} s: the first row less one intersection) is repaid by the "
                  f"{math.ceil(preparation / (balanced - online)) if balanced > online else 'never'}th intersection "
                  "with the same partner."]
    if "kept_bytes" in results:
        kb = results["kept_bytes"]
        lines += ["", f"What the preparation keeps: the active party {kb['active'] / 1e6:.0f} MB (the partner's "
                  f"evaluated IDs), the partner {kb['partner'] / 1e6:.0f} MB (its key, its evaluated and sorted "
                  "IDs). The peak memory of the process holding both parties was "
                  f"{results['peak_gb']:.1f} GB."]
    write_marked(page, MARK_BEGIN, MARK_END, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=10_000_000)
    parser.add_argument("--out", default="runs/bench/unbalanced.json")
    parser.add_argument("--docs", type=Path, help="write the table of this results file into docs/deploy.md")
    args = parser.parse_args(argv)
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
