"""Party files at scale: load, align (plain and PSI), fit APC-VFL and RAP, score (benchmark, not a test).

    python benchmarks/own_data.py [--rows 1000000] [--out runs/bench/own_data.json] [--skip-psi]

Generates two party files of ``--rows`` rows (an active party: an ID, 24 features and a label; a passive
party: an ID and 50 features; half of each party's people in both), as CSV and Parquet, then times each
stage a user would run and records the peak resident memory of this process during it (and of its worker
processes, which PSI uses). Goals: loading 1M x 50 Parquet under 5 s, PSI of 1M x 1M IDs under 60 s on 2
cores, peak memory under 8 GB. Training runs two epochs (batch 1024): the stages' cost, not a model.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import vflo
from vflo.align.engines import AlignmentConfig
from vflo.data.partydata import PartyData
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.registry import get_method

TRAIN = {"batch_size": 1024, "max_epochs": 2, "patience": 0, "validation_fraction": 0.0}


def _peak_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak resident set, for this process


def _peak_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6
    return float("nan")


def _children_gb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6


def stage(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    _peak_reset()
    started = time.perf_counter()
    value = fn()
    results[name] = {"seconds": time.perf_counter() - started, "peak_gb": _peak_gb(),
                     "workers_peak_gb": _children_gb()}
    print(f"{name}: {results[name]['seconds']:.1f} s, peak {results[name]['peak_gb']:.2f} GB", flush=True)
    return value


def write_files(folder: Path, rows: int, seed: int) -> dict[str, Path]:
    rng = np.random.default_rng(seed)
    people = rng.permutation(int(rows * 1.5))
    active_ids, passive_ids = people[:rows], people[rows // 2 : rows // 2 + rows]  # half of each shared
    signal = rng.normal(size=(len(people), 4))
    a = pd.DataFrame(rng.normal(size=(rows, 24)).astype(np.float32), columns=[f"a{i}" for i in range(24)])
    a.iloc[:, :2] += signal[active_ids, :2]
    a.insert(0, "id", [f"P{v:08d}" for v in active_ids])
    a["label"] = (signal[active_ids].sum(axis=1) > 0).astype(np.int64)
    p = pd.DataFrame(rng.normal(size=(rows, 50)).astype(np.float32), columns=[f"p{i}" for i in range(50)])
    p.iloc[:, :2] += signal[passive_ids, 2:]
    p.insert(0, "id", [f"P{v:08d}" for v in passive_ids])
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, frame in (("active", a), ("passive", p)):
        paths[f"{name}.csv"] = folder / f"{name}.csv"
        paths[f"{name}.parquet"] = folder / f"{name}.parquet"
        frame.to_csv(paths[f"{name}.csv"], index=False)
        frame.to_parquet(paths[f"{name}.parquet"])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--files", type=Path, default=Path("runs/bench/own_data_files"))
    parser.add_argument("--out", type=Path, default=Path("runs/bench/own_data.json"))
    parser.add_argument("--skip-psi", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"rows": args.rows, "train": TRAIN}
    paths = stage(results, "write files (CSV and Parquet)", lambda: write_files(args.files, args.rows, args.seed))

    def load(kind: str) -> tuple[PartyData, PartyData]:
        return (PartyData.from_file(paths[f"active.{kind}"], party="active", id_column="id", label_column="label"),
                PartyData.from_file(paths[f"passive.{kind}"], party="passive", id_column="id"))

    stage(results, "load CSV (both parties)", lambda: load("csv"))
    active, passive = stage(results, "load Parquet (both parties)", lambda: load("parquet"))
    stage(results, f"load Parquet, {args.rows} x 50 (the passive party alone)",
          lambda: PartyData.from_file(paths["passive.parquet"], party="passive", id_column="id"))
    n_test = min(100_000, args.rows // 10)
    results["test_rows"] = n_test
    split = stage(results, f"split: pool, hold {n_test} aligned test rows out, standardise",
                  lambda: vflo.hold_out([active, passive], test=n_test, seed=args.seed))
    results["aligned"] = len(np.intersect1d(active.ids, passive.ids))

    def align(method: str) -> int:
        local = get_method("local")()
        fed, _ = build_federation(split, local, seed=0, alignment=AlignmentConfig(method=method),  # type: ignore[arg-type]
                                  max_message_bytes=1 << 31)
        Session(fed).start(local)
        return len(fed.align(split.train["active"].ids, ["passive"]).ids)

    stage(results, "align, plain (training IDs)", lambda: align("plain"))
    if not args.skip_psi:
        whole = vflo.hold_out([active, passive], test=1, seed=args.seed)  # every ID but one: PSI of the full lists

        def psi() -> int:
            local = get_method("local")()
            fed, _ = build_federation(whole, local, seed=0, alignment=AlignmentConfig(method="psi"),  # type: ignore[arg-type]
                                      max_message_bytes=1 << 31)
            Session(fed).start(local)
            return len(fed.align(whole.train["active"].ids, ["passive"]).ids)

        results["psi_ids"] = [whole.train["active"].n_samples, whole.train["passive"].n_samples]
        stage(results, "align, PSI (all IDs of both files)", psi)
    apc = stage(results, "fit APC-VFL", lambda: vflo.fit("apc_vfl", split, train=TRAIN))
    stage(results, f"score {n_test} rows, APC-VFL (active party alone)", apc.predict)
    results["apc_vfl"] = vflo.evaluate(apc)
    rap = stage(results, "fit RAP", lambda: vflo.fit("rap", split, estimator={"model": "mlp", "hidden": [128],
                                                                                 "train": TRAIN}))
    stage(results, f"score {n_test} rows, RAP (collaborative)", rap.predict)
    results["rap"] = vflo.evaluate(rap)
    results["process_peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
