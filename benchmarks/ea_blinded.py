"""What Entity Augmentation's blinded IDs cost on Credit (benchmark, not a test).

    python benchmarks/ea_blinded.py [--data-dir ../shared/datasets] [--epochs 1] [--out runs/bench/ea_blinded.json]

Runs Entity Augmentation on the first split of configs/papers/ea_table3_credit.toml twice, with the guests'
IDs in the clear (the paper) and blinded (private set intersection between the host and each guest), and
reports the bytes and rounds of the ID step, the fit time, and whether the two models score the same.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.predict import credit_split
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "ea_blinded.json")
    args = parser.parse_args()
    data = credit_split("ea_table3_credit.toml", args.data_dir)
    results: dict[str, Any] = {"guests": {g: int(d.n_samples) for g, d in data.train.items() if d.n_features},
                               "host_labelled": int(data.train[data.active].n_samples), "epochs": args.epochs}
    scores = {}
    for ids in ("clear", "blinded"):
        method = get_method("entity_augmentation")(ids=ids, train={"max_epochs": args.epochs, "patience": 0,
                                                                   "validation_fraction": 0.0})
        started = time.perf_counter()
        out = run_method(method, data, seed=0)
        seconds = time.perf_counter() - started
        summary = out.fit_summary
        id_step = [e for e in out.ledger.entries if e.kind in ("ea.init", "ea.entities") or e.kind.startswith("align.")]
        results[ids] = {"fit_seconds": out.fit_seconds, "wall_seconds": seconds, "fit_bytes": summary.bytes,
                        "align_bytes": summary.align_bytes, "id_step_bytes": sum(e.nbytes for e in id_step),
                        "id_step_messages": len(id_step)}
        scores[ids] = out.scores
        print(ids, json.dumps(results[ids]), flush=True)
    results["same_scores"] = bool(np.array_equal(scores["clear"], scores["blinded"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"same scores: {results['same_scores']}; written to {args.out}")


if __name__ == "__main__":
    main()
