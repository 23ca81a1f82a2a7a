"""Run `vflo compare` on every config in configs/compare/, queued, a few at a time (one PyTorch thread each), each
into runs/compare/NAME as it finishes; a config whose run is already there for the same config text and code is
skipped, so an interrupted queue picks up where it stopped. Then `python -m benchmarks.compare_docs`.

    python -m benchmarks.compare_all [--jobs 2] [--only breast_cancer wine] [--data-dir ../shared/datasets]
    python -m benchmarks.compare_all --configs configs/privacy/axis_*.toml --runs runs/privacy_axis

``--configs``: other compare configs (each into RUNS/STEM). Beside each run, RUNS/NAME.commit names the commit
of the code that ran it (with "+changes" where the tree had uncommitted changes), for the pages made from it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The slowest last, so the quick ones land first.
ORDER = ("wine", "diabetes", "breast_cancer", "digits", "handwritten", "houseprice_standin", "credit", "mnist5000")


def commit() -> str:
    """The commit the code runs from, with "+changes" where the tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"], cwd=ROOT,
                           capture_output=True, text=True, check=False).stdout.strip()
    return head.stdout.strip() + ("+changes" if dirty else "")


def fingerprint(config: Path) -> str:
    """The config's text and the commit of the code that runs it."""
    return hashlib.sha256(config.read_bytes() + commit().encode()).hexdigest()


def run_one(config: Path, runs: Path, data_dir: str | None) -> str:
    name = config.stem
    out, stamp, log = runs / name, runs / f"{name}.fingerprint", runs / f"{name}.log"
    ran = commit()  # the code this run starts from (a commit made while it runs is not its code)
    key = fingerprint(config)
    if (out / "results.json").is_file() and stamp.is_file() and stamp.read_text() == key:
        return f"{name}: already there for this config and code, skipped"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if data_dir:
        env["VFLO_DATA_DIR"] = data_dir
    t0 = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run([sys.executable, "-m", "vflo", "compare", str(config), "--out", str(out), "--overwrite"],
                              cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        return f"{name}: failed (exit {done.returncode}); see {log}"
    stamp.write_text(key)
    (runs / f"{name}.commit").write_text(ran + "\n")
    return f"{name}: {time.perf_counter() - t0:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=ORDER, default=list(ORDER))
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--configs", type=Path, nargs="+", help="these compare configs instead of configs/compare/")
    args = parser.parse_args()
    args.runs.mkdir(parents=True, exist_ok=True)
    queue = args.configs or [ROOT / "configs" / "compare" / f"{n}.toml" for n in ORDER if n in args.only]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for line in pool.map(lambda c: run_one(c, args.runs, args.data_dir), queue):
            print(line, flush=True)


if __name__ == "__main__":
    main()
