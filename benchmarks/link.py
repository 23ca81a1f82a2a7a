"""Time to a model over a real link, not only loopback: SplitNN against one-exchange methods (benchmark).

    python -m benchmarks.link [--data-dir ../shared/datasets] [--epochs 5] [--out runs/bench/link.json]

Credit, APC-VFL's partition (10,000 shared rows), two parties, each its own process over gRPC with mutual TLS.
The passive party is reached directly (loopback), or through benchmarks/link_proxy.py as a LAN (1 ms round
trip, 1 Gbit/s) or a WAN (50 ms, 100 Mbit/s): this kernel has no netem, so the proxy delays and rate-limits
the bytes itself. For each link and method: measured time to a model (fit), and beside it a *model* of that
time from the ledger (loopback fit time + rounds x RTT + bytes x 8 / bandwidth), labelled as a model.
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

from benchmarks.apc_vfl import SPLITNN_CREDIT, credit_partition
from vflo.comm.local_ports import free_port
from vflo.deploy import Deployment, export_federation, load_deploy_config
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method

ROOT = Path(__file__).resolve().parents[1]
LINKS = {"loopback": None, "LAN 1 ms, 1 Gbit/s": (1.0, 1000.0), "WAN 50 ms, 100 Mbit/s": (50.0, 100.0)}




def wait_for(proc: subprocess.Popen[str], word: str, seconds: float = 90) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + seconds
    line = ""
    while word not in line:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"process did not say {word!r}: {line!r}")
        line = proc.stdout.readline()


def methods(epochs: int) -> dict[str, Any]:
    return {
        "splitnn": get_method("splitnn")(**SPLITNN_CREDIT, train={"batch_size": 128, "max_epochs": epochs,
                                                                   "patience": 0, "validation_fraction": 0.0}),
        "apc_vfl": get_method("apc_vfl")(train={"batch_size": 128, "max_epochs": epochs, "patience": 0}),
        "apc_vfl_aligned": get_method("apc_vfl_aligned")(train={"batch_size": 128, "max_epochs": epochs,
                                                                "patience": 0}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "link.json")
    args = parser.parse_args()
    data = credit_partition(args.data_dir, train_scope="all")
    from benchmarks.compare_all import commit

    results: dict[str, Any] = {"epochs": args.epochs, "commit": commit(), "links": {}, "in_process": {}}
    # The same training with both parties in this process (no transport but the in-process one), for reference;
    # a first one-epoch pass pays for imports and is not measured.
    for method in methods(1).values():
        run_method(method, data, seed=0)
    for name, method in methods(args.epochs).items():
        results["in_process"][name] = {"fit_seconds": run_method(method, data, seed=0).fit_seconds}
        print("in process", name, json.dumps(results["in_process"][name]), flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # The bureau's own side of each method as the measured runs set it (APC-VFL's passive encoder trains for
        # as many epochs as its own config says, whatever a run proposes).
        export_federation(data, work, base_port=free_port() - 1, methods=list(methods(1)),
                          proposals=list(methods(args.epochs).values()))
        deploy_text = (work / "deploy.toml").read_text()
        passive = subprocess.Popen([sys.executable, "-m", "vflo", "party", "serve", "bureau.toml"], cwd=work,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            wait_for(passive, "listening on")
            real = next(line.split("=")[1].strip().strip('"') for line in
                        (work / "bureau.toml").read_text().splitlines() if line.startswith("listen"))
            warm = Deployment(load_deploy_config(work / "deploy.toml"))
            try:  # the first run in a process pays for imports and connections: not measured
                for method in methods(1).values():
                    warm.run(method, seed=0)
            finally:
                warm.close()
            for link, shape in LINKS.items():
                proxy = None
                address = real
                if shape is not None:
                    port = free_port()
                    proxy = subprocess.Popen(
                        [sys.executable, "-m", "benchmarks.link_proxy", "--listen", f"127.0.0.1:{port}", "--to",
                         real, "--rtt-ms", str(shape[0]), "--mbit", str(shape[1]), "--seconds", "1800"],
                        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                    wait_for(proxy, "forwarding")
                    address = f"127.0.0.1:{port}"
                (work / "deploy.toml").write_text(deploy_text.replace(f'address = "{real}"', f'address = "{address}"'))
                deployment = Deployment(load_deploy_config(work / "deploy.toml"))
                rows = {}
                try:
                    for name, method in methods(args.epochs).items():
                        out = deployment.run(method, seed=0)
                        fit = out.fit_summary
                        rows[name] = {"fit_seconds": out.fit_seconds, "rounds": fit.rounds, "bytes": fit.bytes,
                                      "align_rounds": fit.align_rounds, "align_bytes": fit.align_bytes}
                        print(link, name, json.dumps(rows[name]), flush=True)
                finally:
                    deployment.close()
                    if proxy is not None:
                        proxy.terminate()
                        proxy.wait(timeout=10)
                results["links"][link] = {"rtt_ms": shape[0] if shape else None,
                                          "mbit": shape[1] if shape else None, "methods": rows}
        finally:
            passive.terminate()
            passive.wait(timeout=10)
    base = results["links"]["loopback"]["methods"]
    for entry in results["links"].values():
        if entry["rtt_ms"] is None:
            continue
        for name, row in entry["methods"].items():
            rounds = row["rounds"] + row["align_rounds"]
            row["model_seconds"] = base[name]["fit_seconds"] + rounds * entry["rtt_ms"] / 1000 + \
                (row["bytes"] + row["align_bytes"]) * 8 / (entry["mbit"] * 1e6)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
