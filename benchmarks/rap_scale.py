"""RAP at HIGGS scale: 1,000,000 x 28 rows (generated stand-in), end to end on this machine.

    python -m benchmarks.rap_scale [--rows 1000000] [--epochs 5]

Reports wall time per phase (scenario, RAP's projection + transfer + training, scoring), the ledger's
bytes, and the peak resident memory of the process (the goal: within 8 GB on 2 cores). Projection runs
in chunks of 100,000 rows. The server takes the four clients' training rows in one request, more than a party's
default ``[policy] max_rows`` (1,000,000): its policy here raises that bound to what the run needs, as a
deployment of this size sets it in the server's PARTY.toml. Writes runs/bench/rap_scale.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from vflo.data.datasets import load_dataset
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.federation.simulation import run_method
from vflo.methods.rap import RAP
from vflo.metrics import compute_metrics
from vflo.party.policy import Policy


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kilobytes on Linux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/rap_scale.json"))
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    ds = load_dataset("higgs_standin")
    spec = ScenarioSpec(parties=(PartySpec(name="owner", role="active", columns=()),
                                 *(PartySpec(name=f"client{i}", share=1.0) for i in range(4))),
                        samples=SamplesSpec(total=args.rows, aligned=1.0))
    layout = spec.build(ds, seed=0)
    rng = np.random.default_rng(0)
    test = np.sort(rng.choice(layout.ids("owner"), size=args.rows // 5, replace=False))
    data = layout.materialize(test_ids=test)
    del ds, layout
    t1 = time.perf_counter()
    method = RAP(estimator={"model": "mlp", "hidden": [128], "train": {
        "lr": 1e-3, "batch_size": 4096, "max_epochs": args.epochs, "patience": 5, "validation_fraction": 0.125,
        "stop": "plateau", "plateau": 1e-4}})
    server_rows = 4 * (args.rows - len(test))  # every client's training rows, in RAP's one request to the server
    out = run_method(method, data, seed=0, policies={"server": Policy(max_rows=max(server_rows, 1_000_000))})
    t2 = time.perf_counter()
    result = {
        "rows": args.rows, "features": 28, "clients": 4, "scenario_s": t1 - t0, "rap_fit_s": out.fit_seconds,
        "rap_predict_s": out.predict_seconds, "total_s": t2 - t0, "fit_bytes": out.fit_summary.bytes,
        "fit_rounds": out.fit_summary.rounds,
        "accuracy": compute_metrics("binary", data.test_y, out.scores)["accuracy"],
        "peak_rss_gb": peak_gb(), "server_max_rows": max(server_rows, 1_000_000),
    }
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from benchmarks.compare_all import commit

    result["commit"] = commit()  # the code that ran it (with "+changes" where src/ differed from it)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
