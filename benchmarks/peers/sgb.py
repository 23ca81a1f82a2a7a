"""vflo's SecureBoost beside SecretFlow's SGB on the same split and settings, paired (not a test). Writes
runs/bench/peers_sgb.json, each pair as it ends.

    benchmarks/peers/install_secretflow.sh            # once: secretflow-lite in its own Python 3.10 environment
    python -m benchmarks.peers.sgb [--data-dir ../shared/datasets] [--pairs 3] [--trees 10]
                                   [--python runs/peers/sgb-venv/bin/python] [--out runs/bench/peers_sgb.json]

The split is benchmarks/secureboost.py's Credit: the bank (label holder) with X1-X5, the bureau with X6-X23, every
person held by both, the same 24,000 training and 6,000 test people. The settings are the same for both: ``--trees``
trees of depth 5, learning rate 0.3, λ 1, γ 0, 32 bins (SGB's ``sketch_eps`` 1/32), OU with 2048-bit keys, every row
and column (no sampling), every tree federated (SGB's ``first_tree_with_label_holder_feature`` off). Each pair
runs back to back, in an order that alternates from pair to pair:

- vflo over gRPC with mutual TLS, the bureau its own process (``vflo party serve``);
- vflo in one process;
- SGB, each party its own process (SecretFlow's production mode without Ray, its own gRPC, no TLS), started
  together; the time is the bank's ``train`` call until the last tree exists.

SGB's people are aligned before it starts (it has no alignment in ``train``); vflo's time is its fit, after its own
alignment. Where no SecretFlow environment is found (the install script skips when this machine has no Python
3.10), the benchmark writes why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / "runs" / "peers" / "sgb-venv" / "bin" / "python"
PARTY = Path(__file__).resolve().parent / "sgb_party.py"


def export(data: Any, out: Path) -> None:
    """The split as each party's own files: the bank's columns and labels, the bureau's columns, rows in the same
    order (the people both hold, aligned)."""
    out.mkdir(parents=True, exist_ok=True)
    active = data.active
    passive = next(p.name for p in data.parties if p.name != active)
    for part, ids in (("train", data.train[active].ids), ("test", data.test_ids)):
        np.save(out / f"bank_{part}.npy", data.oracle.features(ids, active).astype(np.float32))
        np.save(out / f"bureau_{part}.npy", data.oracle.features(ids, passive).astype(np.float32))
    np.save(out / "y_train.npy", data.train[active].require_labels().astype(np.float32))
    np.save(out / "y_test.npy", data.test_y.astype(np.int64))


def run_sgb(python: Path, files: Path, trees: int, timeout: float = 3600.0) -> dict[str, Any]:
    """SGB, each party its own process: the bank's result file."""
    from vflo.comm.local_ports import free_port

    ports = f"{free_port('127.0.0.1')},{free_port('127.0.0.1')}"
    out = files / "sgb_result.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    procs = {party: subprocess.Popen([str(python), str(PARTY), "--party", party, "--ports", ports, "--data",
                                      str(files), "--out", str(out), "--trees", str(trees)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for party in ("bank", "bureau")}
    logs = {}
    try:
        for party, proc in procs.items():
            logs[party], _ = proc.communicate(timeout=timeout)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    if procs["bank"].returncode != 0 or not out.is_file():
        raise RuntimeError(f"SGB failed (bank exit {procs['bank'].returncode}, bureau exit "
                           f"{procs['bureau'].returncode}):\n{logs.get('bank', '')[-3000:]}\n"
                           f"{logs.get('bureau', '')[-2000:]}")
    return dict(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--trees", type=int, default=10)
    parser.add_argument("--python", type=Path, default=VENV_PYTHON)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "peers_sgb.json")
    args = parser.parse_args(argv)
    from benchmarks.compare_all import commit

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"commit": commit(), "trees": args.trees, "pairs": []}
    if not args.python.is_file():
        result["skipped"] = (f"no SecretFlow environment at {args.python}: run benchmarks/peers/install_secretflow.sh "
                             "(it needs a Python 3.10) or pass --python")
        args.out.write_text(json.dumps(result, indent=1))
        print("skipped:", result["skipped"], flush=True)
        return 0
    from benchmarks.secureboost import BINS, credit_data, over_grpc, run_summary, scores_of
    from vflo.federation.simulation import run_method
    from vflo.methods.secureboost import SecureBoost

    data = credit_data(args.data_dir)
    settings = {"n_trees": args.trees, "max_depth": 5, "learning_rate": 0.3, "n_bins": BINS}
    result |= {"settings": settings, "train_rows": int(data.train[data.active].n_samples),
               "test_rows": len(data.test_ids), "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        files = Path(tmp) / "split"
        export(data, files)

        def vflo_grpc() -> dict[str, Any]:
            summary, out = over_grpc(data, settings, Path(tempfile.mkdtemp(dir=tmp)))
            return {**summary, **scores_of(data, out)}

        def vflo_local() -> dict[str, Any]:
            out = run_method(SecureBoost(**settings), data, seed=0)
            return {**run_summary(out), **scores_of(data, out)}

        runs = {"vflo_grpc": vflo_grpc, "vflo_in_process": vflo_local,
                "sgb": lambda: run_sgb(args.python, files, args.trees)}
        for pair in range(args.pairs):
            order = list(runs) if pair % 2 == 0 else list(reversed(runs))
            entry: dict[str, Any] = {"order": order}
            for name in order:
                started = time.perf_counter()
                entry[name] = runs[name]()
                entry[name]["wall_seconds"] = time.perf_counter() - started
                print(f"pair {pair}: {name} {entry[name]['fit_seconds']:.1f} s, accuracy "
                      f"{entry[name]['accuracy']:.4f}, AUC {entry[name]['roc_auc']:.4f}", flush=True)
            entry["load_average"] = os.getloadavg()[0]  # other work on the machine over the last minute
            entry["ratio_grpc"] = entry["vflo_grpc"]["fit_seconds"] / entry["sgb"]["fit_seconds"]
            entry["ratio_in_process"] = entry["vflo_in_process"]["fit_seconds"] / entry["sgb"]["fit_seconds"]
            result["pairs"].append(entry)
            tmp_out = args.out.with_suffix(".tmp")
            tmp_out.write_text(json.dumps(result, indent=1, default=float))
            tmp_out.replace(args.out)  # each pair as it ends, never a half-written file
    ratios = [e["ratio_grpc"] for e in result["pairs"]]
    print(f"vflo over gRPC / SGB: median {float(np.median(ratios)):.2f} over {len(ratios)} pairs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
