"""X25519 on many points under one key, the whole cost of vflo's own ECDH PSI: vflo's eight-lane implementation
against OpenSSL's, one core each (benchmark, not a test).

    python -m benchmarks.x25519 [--points 200000] [--repeats 3] [--out runs/bench/x25519.json]
    python -m benchmarks.x25519 --docs runs/bench/x25519.json   # the line in docs/deploy.md

Each repeat blinds the same random points with each implementation in this process; the two results are checked
equal. Reported: microseconds per point (the median of the repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marked import write_marked

MARK_BEGIN, MARK_END = "<!-- x25519:begin -->", "<!-- x25519:end -->"


def measure(points: int, repeats: int) -> dict[str, Any]:
    from vflo.align import curve

    rng = np.random.default_rng(0)
    key = rng.integers(0, 256, 32, dtype=np.uint8).tobytes()
    data = rng.integers(0, 256, 32 * points, dtype=np.uint8).tobytes()
    uses = ["openssl"] + (["avx512-ifma"] if curve.backend() == "avx512-ifma" else [])
    seconds: dict[str, list[float]] = {use: [] for use in uses}
    for _ in range(repeats):
        outs = []
        for use in uses:
            started = time.perf_counter()
            outs.append(curve.blind(key, data, use=use))  # type: ignore[arg-type]
            seconds[use].append(time.perf_counter() - started)
        assert all(out == outs[0] for out in outs), "the implementations disagree"
    return {"points": points, "repeats": repeats, "cores": os.cpu_count(), "backend": curve.backend(),
            "us_per_point": {use: float(np.median(s)) / points * 1e6 for use, s in seconds.items()}}


def docs(path: Path, page: Path) -> None:
    results = json.loads(path.read_text())
    us = results["us_per_point"]
    line = (f"Measured by `python -m benchmarks.x25519 --points {results['points']}` on this project's machine, "
            f"one core, the median of {results['repeats']} runs: OpenSSL's X25519 {us['openssl']:.1f} µs a point")
    if "avx512-ifma" in us:
        line += (f", vflo's eight lanes {us['avx512-ifma']:.1f} µs ({us['openssl'] / us['avx512-ifma']:.1f} times "
                 "as fast), the same bytes.")
    else:
        line += "; this machine has no AVX-512 IFMA, so vflo's eight lanes did not run."
    write_marked(page, MARK_BEGIN, MARK_END, [line])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/x25519.json"))
    parser.add_argument("--docs", type=Path, help="write this results file's line into docs/deploy.md")
    args = parser.parse_args(argv)
    if args.docs is not None:
        docs(args.docs, Path(__file__).resolve().parents[1] / "docs" / "deploy.md")
        return 0
    results = measure(args.points, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
