"""Where APC-VFL's time goes on Credit, and training settings that cut it at equal F1 (benchmark, not a test).

    python -m benchmarks.apc_vfl_tuning [--data-dir DIR] [--seeds 3] [--out runs/bench/apc_vfl_tuning.json]

The partition of benchmarks/apc_vfl.py (APC-VFL's Credit partition, 10,000 shared rows, 500 held out). The
method is the paper's in every variant (the same autoencoders, losses and exchange); only how each network is
trained changes: batch size, the stopping rule, and Adam's fused kernel. Each variant runs with several
seeds; F1 and wall time are reported beside SplitNN's with the same seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.apc_vfl import SPLITNN_CREDIT, credit_partition
from vflo.federation.simulation import run_method
from vflo.methods.apc_vfl import APCVFLAligned
from vflo.methods.splitnn import SplitNN
from vflo.metrics import compute_metrics

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, dict[str, Any]] = {
    "paper settings (batch 128, patience 10)": {"batch_size": 128},
    "batch 512, lr 2e-3": {"batch_size": 512, "lr": 2e-3},
    "batch 128, stop on a 0.1% plateau": {"batch_size": 128, "stop": "plateau", "plateau": 1e-3, "patience": 5},
    "batch 512, lr 2e-3, 0.1% plateau": {"batch_size": 512, "lr": 2e-3, "stop": "plateau", "plateau": 1e-3,
                                         "patience": 5},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "apc_vfl_tuning.json")
    args = parser.parse_args()
    data = credit_partition(args.data_dir)
    results: dict[str, Any] = {}
    runs: dict[str, list[dict[str, float]]] = {}
    for seed in range(args.seeds):
        split = SplitNN(**SPLITNN_CREDIT, train={"batch_size": 128})
        started = time.perf_counter()
        out = run_method(split, data, seed=seed)
        runs.setdefault("SplitNN (batch 128)", []).append(
            {"seconds": time.perf_counter() - started,
             "f1": compute_metrics("binary", data.test_y, out.scores)["f1_binary"]})
        for name, train in VARIANTS.items():
            apc = APCVFLAligned(train=train)
            started = time.perf_counter()
            out = run_method(apc, data, seed=seed)
            runs.setdefault(name, []).append(
                {"seconds": time.perf_counter() - started,
                 "f1": compute_metrics("binary", data.test_y, out.scores)["f1_binary"],
                 **{k: v for k, v in out.stats.items() if k.endswith("_epochs")}})
        print(f"seed {seed} done", flush=True)
    for name, rows in runs.items():
        results[name] = {"seconds_median": statistics.median(r["seconds"] for r in rows),
                         "f1_mean": statistics.mean(r["f1"] for r in rows),
                         "f1_std": statistics.stdev(r["f1"] for r in rows) if len(rows) > 1 else 0.0, "runs": rows}
        print(f"{name}: {results[name]['seconds_median']:.1f} s, F1 {results[name]['f1_mean']:.3f} ± "
              f"{results[name]['f1_std']:.3f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
