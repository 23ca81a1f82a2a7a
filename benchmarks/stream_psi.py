"""Streaming PSI from disk in bounded memory against vflo's own ECDH on the IDs in memory (benchmark, not a test).

    python -m benchmarks.stream_psi [--rows 1000000] [--memory-mb 64] [--out runs/bench/stream_psi.json]
    python -m benchmarks.stream_psi --docs runs/bench/stream_psi.json   # the table in docs/deploy.md

Two files of ``--rows`` text IDs each, half shared: the active party's a CSV, the partner's a Parquet file (a
feature column beside the IDs in each). Each way runs in a fresh process holding both parties (an in-process
federation), so its peak memory is both parties' together:

- *in memory*: each party's ID column read whole (as ``vflo.data.files.read_table`` reads it), then one ECDH
  intersection (``Federation.align``, engine ``vflo``);
- *streamed*: :func:`vflo.align.stream.stream_intersect` with ``--memory-mb``.

Reported: seconds, the process's peak resident memory (VmHWM) and its resident memory before the work (imports
done); the helper processes that blind long lists are not counted. Both are checked against the true intersection.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.marked import write_marked

ROOT = Path(__file__).resolve().parents[1]
MARK_BEGIN, MARK_END = "<!-- stream-psi:begin -->", "<!-- stream-psi:end -->"

#: One way of intersecting, in a fresh process: argv = folder, way, memory_mb; prints one JSON line.
CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from benchmarks.psi_engines import two_parties
from vflo.align import stream
from vflo.align.kept import AlignmentStore
from vflo.align.engines import AlignmentConfig
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.registry import get_method
import pyarrow.csv, pyarrow.parquet  # imported before the baseline, as the in-memory way imports them too

folder, way, memory_mb = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
def rss_mb(field="VmRSS"):  # VmHWM: the peak of this process image (ru_maxrss outlives exec on Linux)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024
local = get_method("local")()
tiny = two_parties((np.array(["a", "b"]), np.array(["b", "c"])), partner="partner")
stores = {"active": AlignmentStore(folder / "active_alignments", "active"),
          "partner": AlignmentStore(folder / "partner_alignments", "partner",
                                    files={"train": stream.IdFile(folder / "partner.parquet", "id")})}
fed, _ = build_federation(tiny, local, seed=0, max_message_bytes=1 << 31,
                          alignment=AlignmentConfig(method="psi", engine="vflo", reuse=False), alignments=stores)
Session(fed).start(local)
base = rss_mb()
started = time.perf_counter()
if way == "memory":
    from vflo.data.files import read_table
    mine = read_table(folder / "active.csv", party="active", id_column="id")["id"].to_numpy()
    theirs = read_table(folder / "partner.parquet", party="partner", id_column="id")["id"].to_numpy()
    data = two_parties((np.sort(mine.astype(str)), theirs.astype(str)), partner="partner")
    fed, _ = build_federation(data, local, seed=0, max_message_bytes=1 << 31,
                              alignment=AlignmentConfig(method="psi", engine="vflo", reuse=False))
    Session(fed).start(local)
    shared, buckets = len(fed.align(data.train["active"].ids, ["partner"]).ids), 1
else:
    result = stream.stream_intersect(fed, stream.IdFile(folder / "active.csv", "id"), "partner",
                                     folder=folder / "active_alignments", memory_mb=memory_mb)
    shared, buckets = result.record.shared, result.record.buckets
seconds = time.perf_counter() - started
print(json.dumps({"way": way, "seconds": seconds, "shared": int(shared), "buckets": buckets,
                  "base_mb": base, "peak_mb": rss_mb("VmHWM")}))
"""


def write_files(folder: Path, rows: int) -> int:
    """The two parties' files; the number of people they share."""
    ids = np.array([f"person-{v:09d}" for v in np.random.default_rng(0).permutation(10**9)[: rows + rows // 2]])
    pd.DataFrame({"id": ids[:rows], "x": np.float32(1)}).to_csv(folder / "active.csv", index=False)
    pd.DataFrame({"id": ids[rows // 2:], "y": np.float32(2)}).to_parquet(folder / "partner.parquet",
                                                                       row_group_size=100_000)
    return rows - rows // 2


def measure(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"rows": args.rows, "memory_mb": args.memory_mb, "cores": os.cpu_count(), "ways": []}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        truth = write_files(folder, args.rows)
        for way in ("streamed", "memory"):
            done = subprocess.run([sys.executable, "-c", CHILD, str(folder), way, str(args.memory_mb)], env=env,
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{way} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.splitlines()[-1])
            assert row["shared"] == truth, f"{way} found {row['shared']} shared people, not {truth}"
            results["ways"].append(row)
            out.write_text(json.dumps(results, indent=1))
            print(json.dumps(row), flush=True)
    print(f"written to {out}")


def docs(path: Path) -> None:
    results = json.loads(path.read_text())
    ways = {row["way"]: row for row in results["ways"]}
    lines = [f"Measured by `python -m benchmarks.stream_psi --rows {results['rows']} --memory-mb "
             f"{results['memory_mb']:g}` on this project's machine ({results['cores']} cores): two files of "
             f"{results['rows']:,} text IDs each (the active party's a CSV, the partner's a Parquet file), half of "
             "them shared, both parties in one process (its memory is theirs together).", "",
             "| way | buckets | seconds | resident memory before, MB | peak, MB | growth, MB |",
             "|---|---|---|---|---|---|"]
    names = {"memory": "IDs in memory, one ECDH intersection",
             "streamed": f"streamed under {results['memory_mb']:g} MB"}
    for way in ("memory", "streamed"):
        row = ways[way]
        lines.append(f"| {names[way]} | {row['buckets']} | {row['seconds']:.1f} | {row['base_mb']:.0f} | "
                     f"{row['peak_mb']:.0f} | {row['peak_mb'] - row['base_mb']:.0f} |")
    grow_m = ways["memory"]["peak_mb"] - ways["memory"]["base_mb"]
    grow_s = ways["streamed"]["peak_mb"] - ways["streamed"]["base_mb"]
    lines += ["", f"Streamed, the process grew by {grow_s:.0f} MB for the two parties together against "
                  f"{grow_m:.0f} MB with the IDs in memory, and took {ways['streamed']['seconds']:.1f} s against "
                  f"{ways['memory']['seconds']:.1f} s. Both ways blind lists of more than 40,000 IDs in helper "
                  "processes (one per core, each a share of one bucket's points at a time), not counted here."]
    write_marked(ROOT / "docs" / "deploy.md", MARK_BEGIN, MARK_END, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--memory-mb", type=float, default=64.0)
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench" / "stream_psi.json"))
    parser.add_argument("--docs", type=Path, help="write the table of this results file into docs/deploy.md")
    args = parser.parse_args()
    if args.docs is not None:
        docs(args.docs)
    else:
        measure(args)


if __name__ == "__main__":
    main()
