"""APC-VFL vs SplitNN on Credit, stage by stage, and FedSVD's time and memory by mask kind.

    python benchmarks/apc_vfl.py [--data-dir ../shared/datasets] [--fedsvd-rows 2500 10000 50000]

Writes runs/bench/apc_vfl.json. Not a test: it prints measured figures.

1. Credit, APC-VFL's partition (active X3, X5, X7, X9, X11; 20000 rows; 10000 aligned, 500 of them held out
   for testing), the paper's architectures and batch 128: wall time of each APC-VFL stage and of SplitNN,
   with the ledger's bytes and rounds.
2. FedSVD on generated data (23 columns split 5 / 18, as Credit) for m aligned rows with a dense mask and with
   1000-row blocks: wall time of the whole protocol over the in-process transport, peak Python memory, and
   the bytes on the wire. Dense masks are skipped where the mask alone would exceed --dense-limit-gb.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from vflo.align.plain import intersect
from vflo.data.datasets import Dataset, load_dataset
from vflo.data.layout import FederatedData
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.apc_vfl import APCVFLAligned
from vflo.methods.fedsvd import FedSVD
from vflo.methods.splitnn import SplitNN
from vflo.metrics import compute_metrics

ACTIVE = ("X3", "X5", "X7", "X9", "X11")
# The SplitNN APC-VFL compares with on Credit (its Appendix C): every Credit benchmark trains this one.
SPLITNN_CREDIT: dict[str, Any] = {"active_bottom": (64, 128), "passive_bottom": (128, 256), "top": (256, 256),
                                  "activation": "selu"}


def credit_partition(data_dir: str | None, *, train_scope: Literal["aligned", "all"] = "aligned") -> FederatedData:
    """APC-VFL's Credit partition, shared by the Credit benchmarks: a bank with five columns and 20,000 people,
    a bureau with the rest for 10,000 of them; the first 500 shared people (by ID) are the test rows."""
    ds = load_dataset("credit_default", data_dir)
    spec = ScenarioSpec(parties=(PartySpec(name="bank", role="active", columns=ACTIVE),
                                 PartySpec(name="bureau", columns="rest")),
                        samples=SamplesSpec(total=20000, active=20000, aligned=10000))
    layout = spec.build(ds, seed=0)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:500], train_scope=train_scope)


def credit_stages(data_dir: str | None) -> dict[str, object]:
    data = credit_partition(data_dir)
    out: dict[str, object] = {}
    apc = APCVFLAligned(train={"batch_size": 128})
    t0 = time.perf_counter()
    run = run_method(apc, data, seed=0)
    total = time.perf_counter() - t0
    s = run.ledger.summary()
    out["apc_vfl_aligned"] = {
        "stages_s": apc.timings_ if hasattr(apc, "timings_") else {}, "total_s": total,
        "f1_binary": compute_metrics("binary", data.test_y, run.scores)["f1_binary"],
        "bytes": s.bytes, "rounds": s.rounds, "formula_bytes": apc.n_aligned_ * 256 * 4,
    }
    split = SplitNN(**SPLITNN_CREDIT, train={"batch_size": 128})
    t0 = time.perf_counter()
    run = run_method(split, data, seed=0)
    total = time.perf_counter() - t0
    s = run.ledger.summary()
    out["splitnn"] = {
        "total_s": total, "epochs": len(split.history_), "f1_binary": compute_metrics("binary", data.test_y,
                                                                                     run.scores)["f1_binary"],
        "bytes": s.bytes, "rounds": s.rounds,
    }
    return out


def fedsvd_cost(m: int, mask: str, seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(m, 23))
    ds = Dataset(name="generated", X=pd.DataFrame(X, columns=[f"c{i}" for i in range(23)]),
                 y=rng.integers(0, 2, m), ids=np.arange(m), task="binary", n_classes=2, standin=True,
                 source="generated for the benchmark")
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", n_columns=5), PartySpec(name="p", n_columns=18)),
                        feature_split="sequential", standardize=False)
    data = spec.build(ds, seed=0).materialize()
    method = FedSVD(fedsvd={"mask": mask, "block_size": 1000})
    fed, _ = build_federation(data, method, seed=seed, max_message_bytes=1 << 40)
    Session(fed).start(method)
    alignment = intersect(fed, np.sort(data.train["a"].ids), ["p"])
    tracemalloc.start()
    t0 = time.perf_counter()
    result = method.federated_svd(fed, alignment)
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    joined = np.hstack([data.train["a"].subset(alignment.ids).X, data.train["p"].subset(alignment.ids).X])
    S = np.linalg.svd(joined.astype(np.float64), compute_uv=False)
    return {"m": m, "mask": mask, "seconds": seconds, "peak_mb": peak / 1e6,
            "bytes": fed.transport.ledger.summary().bytes,
            "max_rel_sv_error": float(np.max(np.abs(result.S - S) / S))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--fedsvd-rows", type=int, nargs="+", default=[2500, 10000, 50000])
    parser.add_argument("--dense-limit-gb", type=float, default=2.0)
    parser.add_argument("--skip-credit", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/apc_vfl.json"))
    args = parser.parse_args(argv)
    results: dict[str, object] = {}
    if not args.skip_credit:
        results["credit_10000_aligned"] = credit_stages(args.data_dir)
        print(json.dumps(results["credit_10000_aligned"], indent=1))
    rows = []
    for m in args.fedsvd_rows:
        for mask in ("dense", "block"):
            if mask == "dense" and m * m * 8 / 1e9 > args.dense_limit_gb:
                rows.append({"m": m, "mask": mask, "skipped": f"dense mask alone is {m * m * 8 / 1e9:.1f} GB"})
            else:
                rows.append(fedsvd_cost(m, mask))
            print(rows[-1])
    results["fedsvd"] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
