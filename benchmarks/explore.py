"""``vflo explore`` on Credit over two processes, beside the homomorphic floor of the same operations timed alone.

The bank (label holder: X1-X5 and the label) and the bureau (X6-X23) as configs/explore/credit.toml splits them,
the bank's 24,000 training people; the bureau served as its own process (`vflo party serve`, mutual TLS, its
policy answering explore with at most 10 bins of at least 50 people), and `vflo explore --deploy` run as a command
against it, timed from start to exit (process start, reading the file, finding who is shared, key generation,
encryption, the bureau's bin sums, decryption, the pages written), each way of finding who is shared: the default
(the bank learns how many alone, the bureau matching blinded IDs) and `--shared ids` (the deployment's PSI).
The floor: the same homomorphic work in one process with no
network and no alignment (a key pair, the targets encrypted, the public key loaded, the bin sums over the same
bins, their decryption), each step timed.

    python -m benchmarks.explore [--repeats 3] [--data-dir ../shared/datasets]   # runs/bench/explore.json
    python -m benchmarks.explore --report                                      # docs/explore.md's section
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.compare_all import commit
from benchmarks.pages import fill, machine

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "explore.md"
BEGIN, END = "<!-- explore:begin -->", "<!-- explore:end -->"
GOAL_S = 10.0
BINS, MIN_ROWS = 10, 50


def credit(data_dir: str | None) -> Any:
    """The first split of configs/explore/credit.toml, as `vflo run` and `vflo explore` cut it."""
    from vflo.experiments.config import load_config
    from vflo.experiments.runner import first_split

    return first_split(load_config(ROOT / "configs" / "explore" / "credit.toml"), data_dir=data_dir)


def floor(data: Any, repeats: int) -> dict[str, float]:
    """The homomorphic work alone, in one process: median seconds of each step over ``repeats``."""
    from vflo.explorer.woe import targets
    from vflo.party.explore import own_bins
    from vflo.trees.crypto import HESettings, PublicSide, new_keys

    bank, bureau = data.train["bank"], data.train["bureau"]
    shared = np.intersect1d(bank.ids, bureau.ids)
    t = targets(bank.subset(shared).y, "binary").values
    X = np.asarray(bureau.subset(shared).X, dtype=np.float64)
    codes = np.stack([own_bins(X[:, j], BINS, MIN_ROWS)[0] for j in range(X.shape[1])], axis=1)
    buckets = int(codes.max()) + 2
    codes = np.where(codes < 0, buckets - 1, codes).astype(np.int8)
    steps: dict[str, list[float]] = {}

    def timed(name: str, fn: Any) -> Any:
        started = time.perf_counter()
        out = fn()
        steps.setdefault(name, []).append(time.perf_counter() - started)
        return out

    pair = np.c_[t[:, 0], np.zeros(len(t))].astype(np.int64)
    for _ in range(repeats):
        keys = timed("key pair", lambda: new_keys(HESettings(scheme="ou")))
        blob = timed("encrypt the targets", lambda: keys.dump(keys.encrypt(pair)))  # noqa: B023
        side = timed("load the public key (bureau)", lambda: PublicSide("ou", keys.public_key))  # noqa: B023
        handle = timed("load the ciphertexts (bureau)", lambda: side.load(blob))  # noqa: B023
        sums = timed("bin sums (bureau)", lambda: side.dump(side.bucket_sums(  # noqa: B023
            handle, np.arange(len(shared)), codes, buckets)))  # noqa: B023
        timed("decrypt the sums", lambda: keys.decrypt(keys.load(sums)))  # noqa: B023
        keys.close()
    out = {name: statistics.median(values) for name, values in steps.items()}
    out["total"] = sum(out.values())
    return out


MODES = ("count", "ids")


def deployed(data: Any, repeats: int) -> dict[str, Any]:
    """`vflo explore --deploy` against the bureau served as its own process: each run's wall seconds, per way of
    finding who is shared (``--shared``), the runs of the two ways taking turns."""
    from benchmarks.serving import Partners
    from vflo.comm.local_ports import free_port
    from vflo.comm.tls import init_certs

    vflo_bin = str(Path(sys.executable).parent / "vflo")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data.train["bank"].to_frame(id_column="id", label_column="label").to_csv(work / "bank.csv", index=False)
        data.train["bureau"].to_frame(id_column="id").to_csv(work / "bureau.csv", index=False)
        init_certs(work / "certs", ["bank", "bureau"])
        ports = {"bank": free_port(), "bureau": free_port()}
        (work / "bureau.toml").write_text(
            f'name = "bureau"\nlisten = "127.0.0.1:{ports["bureau"]}"\n[data]\nfile = "bureau.csv"\n'
            f'id_column = "id"\n[policy]\nexplore = true\nexplore_bins = {BINS}\nmin_bin_rows = {MIN_ROWS}\n'
            f'explore_answers = {repeats * len(MODES)}\nexplore_shared = "ids"\n'
            f'[tls]\ndir = "certs"\n[peers]\nbank = {{ address = "127.0.0.1:{ports["bank"]}", role = "active" }}\n')
        (work / "deploy.toml").write_text(
            f'[active]\nname = "bank"\nrole = "active"\nlisten = "127.0.0.1:{ports["bank"]}"\nalignments = ""\n'
            f'[active.data]\nfile = "bank.csv"\nid_column = "id"\nlabel_column = "label"\n[active.tls]\n'
            f'dir = "certs"\n[[parties]]\nname = "bureau"\nrole = "passive"\n'
            f'address = "127.0.0.1:{ports["bureau"]}"\n')
        bureau = Partners(work, ["bureau"])  # its own process, its log drained
        seconds: dict[str, list[float]] = {m: [] for m in MODES}
        found: dict[str, Any] = {}
        try:
            for k in range(repeats):
                for mode in MODES:
                    started = time.perf_counter()
                    done = subprocess.run([vflo_bin, "explore", "--deploy", "deploy.toml", "--out", f"out{k}{mode}",
                                           "--shared", mode], cwd=work, env=env, capture_output=True, text=True,
                                          timeout=300, check=False)
                    seconds[mode].append(time.perf_counter() - started)
                    if done.returncode != 0:
                        raise RuntimeError(f"vflo explore failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
                    found[mode] = json.loads((work / f"out{k}{mode}" / "explore.json").read_text())
        finally:
            bureau.stop()
    return {mode: {"seconds": seconds[mode], "median_s": statistics.median(seconds[mode]),
                   "explore_s": found[mode]["seconds"], "alignment": found[mode]["alignment"],
                   "shared": found[mode]["shared"], "asked": found[mode]["asked"],
                   "columns": [{"column": c["column"], "iv": c["iv"][0], "bins": len(c["counts"])}
                               for c in found[mode]["columns"]]} for mode in MODES}


def run(args: argparse.Namespace) -> dict[str, Any]:
    data = credit(args.data_dir)
    started = time.perf_counter()
    out = {"machine": machine(),
           "commit": commit(),
           "repeats": args.repeats, "people": int(data.train["bank"].n_samples),
           "bureau_columns": int(data.train["bureau"].n_features), "floor": floor(data, args.repeats),
           "deployed": deployed(data, args.repeats)}
    out["seconds"] = time.perf_counter() - started
    return out


def report(results: dict[str, Any]) -> None:
    f = results["floor"]
    d, by_ids = results["deployed"]["count"], results["deployed"]["ids"]
    ranked = sorted(d["columns"], key=lambda c: -c["iv"])
    goal = "met" if d["median_s"] < GOAL_S else "missed"
    same = max(abs(a["iv"] - b["iv"]) for a, b in zip(d["columns"], by_ids["columns"], strict=True))
    lines = [BEGIN, "",
             f"Generated by `python -m benchmarks.explore --report` from `python -m benchmarks.explore --repeats "
             f"{results['repeats']}` (the code of commit {results['commit']}; {results['machine']}).", "",
             f"Credit, the bank's {results['people']:,} training people (X1-X5 and the label) against the bureau's "
             f"{results['bureau_columns']} columns (X6-X23), the bureau served as its own process over gRPC with "
             f"mutual TLS (at most {BINS} bins of at least {MIN_ROWS} people), OU 2048-bit:", "",
             "| what | seconds (median) | runs |", "|---|---|---|",
             *(f"| `vflo explore --deploy --shared {mode}`, start to exit (who is shared: {e['alignment']}) | "
               f"{e['median_s']:.2f} | {', '.join(f'{s:.2f}' for s in e['seconds'])} |\n"
               f"| of which the exploration itself (finding who is shared, encryption, bin sums, decryption) | "
               f"{e['explore_s']:.2f} | the last run |" for mode, e in results["deployed"].items()),
             *(f"| floor: {name} | {value:.3f} | median of {results['repeats']} |" for name, value in f.items()
               if name != "total"),
             f"| floor: the homomorphic work alone, in all | {f['total']:.2f} | |", "",
             f"The goal (under {GOAL_S:g} s on 2 cores) is {goal} by the default (the count only): "
             f"{d['median_s']:.2f} s, {d['median_s'] / f['total']:.1f}x the homomorphic floor; by PSI, "
             f"{by_ids['median_s']:.2f} s. Both ways found {d['shared']['bureau']:,} people shared and the same "
             f"information values (the largest difference {same:.1e}). The bureau's columns by information value: "
             + ", ".join(f"{c['column']} {c['iv']:.3f}" for c in ranked[:6]) + ".", "", END]
    fill(PAGE, BEGIN, END, "\n".join(lines))
    print(f"wrote {PAGE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "explore.json")
    parser.add_argument("--report", action="store_true", help="write docs/explore.md's section from --out")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.out.read_text()))
        return
    results = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps({k: results[k] for k in ("floor", "seconds")}, indent=1))
    print("vflo explore --deploy:", {mode: e["seconds"] for mode, e in results["deployed"].items()})


if __name__ == "__main__":
    main()
