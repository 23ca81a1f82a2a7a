"""VFL-ASP's one-mask federated SVD: time, memory and bytes by the number of shared rows and the mask kind.

    python benchmarks/vfl_asp_svd.py [--rows 2500 10000 50000] [--dense-limit-gb 2]

Generated data (not a test; it prints measured figures and writes runs/bench/vfl_asp_svd.json): the
second-hop party P2 and the first-hop party P1 share m rows, 10 columns each; P1 also shares 1000 rows with
the active party. For each m and mask kind (dense m x m, or 1000-row orthogonal blocks) one run of VFL-ASP's
extraction over the in-process transport (align P1 with P2, the dealer's mask, both masked blocks, the
server's SVD, P1's unmasking): its wall time, the peak Python memory (tracemalloc), the bytes the ledger saw,
and the largest deviation of E from U Sigma of the joined rows (column signs aligned). A dense mask is skipped
where the mask alone would exceed --dense-limit-gb (three parties hold a copy): the report says where it
stops. The embedding autoencoder is trained for one epoch only; its time is reported apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd

from vflo.data.datasets import Dataset
from vflo.data.scenario import BlockSpec, PartySpec, SamplesSpec, ScenarioSpec
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.vfl_asp import VFLASP


def extraction_cost(m: int, mask: str, seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    n = m + 1000 + 500
    ds = Dataset(name="generated", X=pd.DataFrame(rng.normal(size=(n, 25)), columns=[f"c{i}" for i in range(25)]),
                 y=rng.integers(0, 2, n), ids=np.arange(n), task="binary", n_classes=2, standin=True,
                 source="generated for the benchmark")
    spec = ScenarioSpec(
        parties=(PartySpec(name="p2", n_columns=10), PartySpec(name="p1", n_columns=10),
                 PartySpec(name="a", role="active", n_columns=5)),
        samples=SamplesSpec(layout="blocks", blocks=(BlockSpec(parties=("p1", "p2"), rows=m),
                                                     BlockSpec(parties=("p1", "a"), rows=1000),
                                                     BlockSpec(parties=("a",), rows=500))),
        feature_split="sequential", standardize=False)
    data = spec.build(ds, seed=0).materialize()
    method = VFLASP(svd={"mask": mask, "block_size": 1000}, embedding_train={"max_epochs": 1})
    fed, nodes = build_federation(data, method, seed=seed, max_message_bytes=1 << 40)
    Session(fed).start(method)
    tracemalloc.start()
    t0 = time.perf_counter()
    fed.request("p1", "asp.extract", {"second_hop": "p2"})
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    state = nodes["p1"].context.state
    shared, E = state["asp.embeddings"]
    joined = np.hstack([data.train["p1"].subset(shared).X, data.train["p2"].subset(shared).X]).astype(np.float64)
    U, S, _ = np.linalg.svd(joined, full_matrices=False)
    signs = np.sign(np.sum(E * (U * S), axis=0))
    ledger = fed.transport.ledger
    p2_sent = [e for e in ledger.entries if e.is_method and e.sender == "p2" and e.direction == "request"]
    return {"m": m, "mask": mask, "seconds": seconds, "svd_seconds": state["asp.seconds"]["svd"],
            "autoencoder_seconds_1_epoch": state["asp.seconds"]["autoencoder"], "peak_mb": peak / 1e6,
            "bytes": ledger.summary().bytes, "p2_requests": [e.kind for e in p2_sent],
            "max_abs_error": float(np.max(np.abs(E * signs - U * S)))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[2500, 10000, 20000, 50000])
    parser.add_argument("--dense-limit-gb", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/vfl_asp_svd.json"))
    args = parser.parse_args(argv)
    rows: list[dict[str, object]] = []
    for m in args.rows:
        for mask in ("dense", "block"):
            gb = m * m * 8 / 1e9
            if mask == "dense" and gb > args.dense_limit_gb:
                rows.append({"m": m, "mask": mask, "skipped": f"a dense mask alone is {gb:.1f} GB per copy "
                             f"(dealer, P1 and P2 each hold one) and its products cost m^2 x columns"})
            else:
                rows.append(extraction_cost(m, mask))
            print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
