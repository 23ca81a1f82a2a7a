"""vflo over Flower against vflo's own gRPC and one process, on Credit (benchmark, not a test).

    python -m benchmarks.flower [--data-dir ../shared/datasets] [--epochs 5] [--calls 10] [--skip-splitnn]
                                [--out runs/bench/flower.json]

APC-VFL's Credit partition (a bank with 5 columns and 20,000 people, a bureau with the rest for 10,000),
and a server for RAP. Each party but the bank runs in its own process: as `vflo party serve` (vflo's gRPC
with mutual TLS), then as `vflo flower party` behind a Flower SuperNode on a local SuperLink (Flower's
deployment runtime; the bank coordinates from the ServerApp of benchmarks/flower_app). Measured:

1. one small message's round trip (the coordinator asking the bureau for its ledger), median of --calls;
2. APC-VFL (--epochs epochs) and RAP end to end: setup, alignment, training, scoring the 500 test rows,
   collecting every party's ledger, teardown; the same methods in one process for reference;
3. one SplitNN epoch (batch 128, 79 batches), for contrast: a method with a round trip per batch.

Flower's ClientApp is started anew for every message in a deployment; the figures include the count of
Flower messages and of distinct ClientApp processes that answered them. docs/flower.md reads the output.
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

from benchmarks.apc_vfl import SPLITNN_CREDIT, credit_partition
from benchmarks.link import wait_for
from vflo.comm.local_ports import free_port
from vflo.comm.message import Message
from vflo.deploy import Deployment, export_federation, load_deploy_config
from vflo.federation.simulation import run_method
from vflo.flower.local import LocalFlower
from vflo.methods.registry import get_method

ROOT = Path(__file__).resolve().parents[1]


def settings(epochs: int, splitnn: bool) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {
        "apc_vfl": {"train": {"batch_size": 128, "max_epochs": epochs, "patience": 0}},
        "rap": {},
    }
    if splitnn:
        out["splitnn"] = {**SPLITNN_CREDIT, "train": {"batch_size": 128, "max_epochs": 1, "patience": 0,
                                                      "validation_fraction": 0.0}}
    return out


def in_process(data: Any, methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    for name, s in methods.items():  # the first run in a process pays for imports: not measured
        run_method(get_method(name)(**{**s, **({"train": {**s["train"], "max_epochs": 1}} if "train" in s else {})}),
                   data, seed=0)
    rows = {}
    for name, s in methods.items():
        t0 = time.perf_counter()
        out = run_method(get_method(name)(**s), data, seed=0)
        rows[name] = {"wall_seconds": time.perf_counter() - t0, "fit_seconds": out.fit_seconds,
                      "rounds": out.fit_summary.rounds, "bytes": out.fit_summary.bytes,
                      "messages": out.ledger.summary().messages}
        print("in process", name, json.dumps(rows[name]), flush=True)
    return rows


def over_grpc(work: Path, methods: dict[str, dict[str, Any]], calls: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = {name: subprocess.Popen([sys.executable, "-m", "vflo", "party", "serve", f"{name}.toml"], cwd=work,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for name in ("bureau", "server")}
    try:
        for proc in procs.values():
            wait_for(proc, "listening on")
        deployment = Deployment(load_deploy_config(work / "deploy.toml"))
        try:
            transport = deployment.party.transport
            times = []
            for _ in range(calls + 3):
                t0 = time.perf_counter()
                transport.request(Message(sender="bank", receiver="bureau", kind="control.ledger", round=0))
                times.append(time.perf_counter() - t0)
            times = times[3:]  # the first calls open the connection
            out: dict[str, Any] = {"round_trip_s": {"median": statistics.median(times), "min": min(times),
                                                    "max": max(times), "calls": len(times)}, "methods": {}}
            for name, s in methods.items():
                t0 = time.perf_counter()
                run = deployment.run(get_method(name)(**s), seed=0)
                out["methods"][name] = {"wall_seconds": time.perf_counter() - t0, "fit_seconds": run.fit_seconds,
                                        "rounds": run.fit_summary.rounds, "bytes": run.fit_summary.bytes,
                                        "messages": run.ledger.summary().messages}
                print("gRPC", name, json.dumps(out["methods"][name]), flush=True)
        finally:
            deployment.close()
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=15)
    return out


def over_flower(work: Path, methods: dict[str, dict[str, Any]], calls: int) -> dict[str, Any]:
    flower = LocalFlower(work / "flower", {n: work / f"{n}.toml" for n in ("bureau", "server")})
    (work / "flower").mkdir()
    out_json = work / "flower" / "figures.json"
    t0 = time.perf_counter()
    flower.start()
    started = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        done = flower.run(ROOT / "benchmarks" / "flower_app",
                          {"deploy": str(work / "deploy.toml"), "out": str(out_json),
                           "methods": json.dumps(methods), "calls": calls}, timeout=3600)
        total = time.perf_counter() - t0
    finally:
        flower.stop()
    if not out_json.is_file():
        raise RuntimeError(f"the Flower run wrote no figures:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(out_json.read_text())
    figures["start_seconds"] = started
    figures["flwr_run_seconds"] = total
    print("Flower", json.dumps(figures), flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--skip-splitnn", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "flower.json")
    args = parser.parse_args()
    import flwr

    data = credit_partition(args.data_dir, train_scope="all")
    methods = settings(args.epochs, not args.skip_splitnn)
    results: dict[str, Any] = {"dataset": "credit_default (APC-VFL's partition: 20,000 bank rows, 10,000 shared)",
                               "flwr": flwr.__version__, "epochs": args.epochs, "methods": methods,
                               "machine": f"{os.cpu_count()} cores"}
    results["in_process"] = in_process(data, methods)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Each party's own side of the methods as the measured runs set it.
        export_federation(data, work, base_port=free_port(), extra_roles={"server": "server"},
                          methods=list(methods), proposals=[get_method(n)(**s) for n, s in methods.items()])
        results["grpc"] = over_grpc(work, methods, args.calls)
        results["flower"] = over_flower(work, methods, args.calls)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
