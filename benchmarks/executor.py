"""A party's bulk work on its executor: this host's cores or a Ray cluster (benchmark, not a test).

    python -m benchmarks.executor [--points 200000] [--rows 1000000] [--out runs/bench/executor.json]
    python -m benchmarks.executor --docs runs/bench/executor.json   # the table in docs/deploy.md

Two kinds of work, each with 1 worker and with every core of this machine, on each executor (``processes``: the
party's helper processes for blinding, threads for scoring; ``ray``: a Ray cluster started on this host):

- PSI: ``--points`` text IDs hashed to the curve and blinded (X25519), as a party does with its own IDs;
- scoring: ``--rows`` rows of 24 columns through APC-VFL's student encoder (24 -> 256 -> 256, SELU).

Reported: seconds, throughput, throughput per worker, and the speed-up over one worker. Every result is checked
equal, bit for bit, to the one of the same work on one local worker.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marked import write_marked

ROOT = Path(__file__).resolve().parents[1]
MARK_BEGIN, MARK_END = "<!-- executor:begin -->", "<!-- executor:end -->"


def measure(args: argparse.Namespace) -> None:
    from vflo.align import psi
    from vflo.executor import ExecutorConfig, configure
    from vflo.nn.distill import FittedAutoencoder
    from vflo.nn.models import autoencoder
    from vflo.nn.train import History
    from vflo.seeding import torch_generator

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    ids = np.array([f"person-{i:09d}" for i in range(args.points)])
    salt, key = b"s" * 32, psi.new_key()
    encoder = FittedAutoencoder(model=autoencoder(24, (256, 256), activation="selu",
                                                  generator=torch_generator(0, "bench")), history=History())
    X = np.random.default_rng(0).normal(size=(args.rows, 24)).astype(np.float32)
    results: dict[str, Any] = {"points": args.points, "rows": args.rows, "cores": cores, "runs": []}
    reference: dict[str, np.ndarray] = {}
    for kind in ("processes", "ray"):
        for workers in sorted({1, cores}):
            executor = configure(ExecutorConfig(kind=kind, workers=workers))  # type: ignore[arg-type]
            os.environ["OMP_NUM_THREADS"] = str(workers)  # the scoring threads of the processes kind
            for work in ("psi", "scoring"):
                started = time.perf_counter()
                if work == "psi":
                    with psi.Blinder(key, size=len(ids), workers=workers) as blinder:
                        done = blinder.ids(ids, salt)()
                    items = len(ids)
                else:
                    done = encoder.encode(X)
                    items = len(X)
                seconds = time.perf_counter() - started
                same = reference.setdefault(work, done)
                assert np.array_equal(done, same), f"{kind} with {workers} workers gave other numbers for {work}"
                results["runs"].append({"kind": kind, "workers": workers, "work": work, "seconds": seconds,
                                        "per_second": items / seconds})
                print(json.dumps(results["runs"][-1]), flush=True)
                out.write_text(json.dumps(results, indent=1))
            executor.close()
    configure(None)
    print(f"written to {out}")


def docs(path: Path) -> None:
    results = json.loads(path.read_text())
    runs = results["runs"]
    one = {(r["kind"], r["work"]): r["per_second"] for r in runs if r["workers"] == 1}
    lines = [f"Measured by `python -m benchmarks.executor --points {results['points']} --rows {results['rows']}` on "
             f"this project's machine ({results['cores']} cores): PSI is {results['points']:,} text IDs hashed "
             f"and blinded; scoring is {results['rows']:,} rows through APC-VFL's student encoder. Every result "
             "equals that of one local worker, bit for bit.", "",
             "| executor | work | workers | seconds | per second | per second per worker | speed-up over 1 worker |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        unit = "IDs" if r["work"] == "psi" else "rows"
        lines.append(f"| {r['kind']} | {r['work']} | {r['workers']} | {r['seconds']:.2f} | {r['per_second']:,.0f} "
                     f"{unit} | {r['per_second'] / r['workers']:,.0f} | "
                     f"{r['per_second'] / one[(r['kind'], r['work'])]:.2f}x |")
    write_marked(ROOT / "docs" / "deploy.md", MARK_BEGIN, MARK_END, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench" / "executor.json"))
    parser.add_argument("--docs", type=Path, help="write the table of this results file into docs/deploy.md")
    args = parser.parse_args()
    if args.docs is not None:
        docs(args.docs)
    else:
        measure(args)


if __name__ == "__main__":
    main()
