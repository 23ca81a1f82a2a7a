"""gRPC transport and PSI benchmark (not a test). Writes runs/bench/network.json.

    python benchmarks/network.py [--data-dir ../shared/datasets] [--psi-sizes 10000 100000 1000000]

1. Round-trip latency over gRPC on loopback for 16 B and 1 MiB payloads, with and without TLS
   (server in a thread of this process).
2. One SplitNN epoch on Credit (APC-VFL's partition, 10000 aligned, batch 128) with the passive party
   in its own process over gRPC + TLS, against the same epoch in one process.
3. Private set intersection for n x n IDs with 50% overlap: wall time and bytes (both parties in this
   process, over the in-process transport; each blinding step uses every core).
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

import numpy as np

from vflo.align.engines import AlignmentConfig
from vflo.comm.grpc_transport import GrpcTransport, PartyServer
from vflo.comm.message import Message
from vflo.comm.tls import PartyCredentials, init_certs
from vflo.deploy import Deployment, export_federation, load_deploy_config
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, party_node, run_method
from vflo.methods.local import Local
from vflo.methods.splitnn import SplitNN
from vflo.roles import PartyInfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from apc_vfl import credit_partition
from transport import Ping


def latency(secure: bool, size: int, calls: int, certs: Path) -> float:
    node = party_node(PartyInfo("p", "passive"), peers={"a": "active"})
    node.install(Ping(), seed=0, parties=(PartyInfo("a", "active"), PartyInfo("p", "passive")))
    server_creds = PartyCredentials.load(certs, "p") if secure else None
    server = PartyServer(node, address="127.0.0.1:0", credentials=server_creds, allowed={"a"}).start()
    client = GrpcTransport("a", {"p": server.address},
                           credentials=PartyCredentials.load(certs, "a") if secure else None)
    payload = {"n": 1, "x": np.zeros(max(size // 4, 1), dtype=np.float32)} if size > 16 else {"n": 1}
    message = Message("a", "p", "ping.ping", 1, payload)
    for _ in range(20):
        client.request(message)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        client.request(message)
        times.append(time.perf_counter() - t0)
    client.close()
    server.stop()
    return statistics.median(times) * 1e6


def splitnn_epoch(data_dir: str | None, workdir: Path) -> dict[str, float]:
    data = credit_partition(data_dir)
    settings = {"active_bottom": (64, 128), "passive_bottom": (128, 256), "top": (256, 256),
                "activation": "selu", "train": {"batch_size": 128, "max_epochs": 1, "patience": 0,
                                                "validation_fraction": 0.0}}
    # The bureau's own bottom network is the one the in-process run uses (its config's [methods.splitnn]).
    export_federation(data, workdir, base_port=56000 + os.getpid() % 1000, proposals=[SplitNN(**settings)])
    proc = subprocess.Popen([sys.executable, "-m", "vflo", "party", "serve", "bureau.toml"], cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 90
        while "listening on" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        deployment = Deployment(load_deploy_config(workdir / "deploy.toml"))
        over_grpc, local = [], []
        try:
            for seed in range(5):  # interleaved, so a burst of load elsewhere hits both sides
                method = SplitNN(**settings)
                deployment.run(method, seed=seed)
                over_grpc.append(method.history_.epochs[0]["seconds"])
                method = SplitNN(**settings)
                run_method(method, data, seed=seed)
                local.append(method.history_.epochs[0]["seconds"])
        finally:
            deployment.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    g, loc = statistics.median(over_grpc), statistics.median(local)
    return {"grpc_tls_epoch_s": g, "in_process_epoch_s": loc, "ratio": g / loc, "batches": 75}


def psi(n: int) -> dict[str, float]:
    from vflo.data.layout import FederatedData
    from vflo.data.partydata import PartyData

    ids_a = np.arange(n, dtype=np.int64)
    ids_b = np.arange(n // 2, n + n // 2, dtype=np.int64)  # 50% overlap
    a = PartyData(party="a", ids=ids_a, X=np.zeros((n, 1)), columns=("x",), y=np.zeros(n, dtype=np.int64))
    b = PartyData(party="b", ids=ids_b, X=np.zeros((n, 1)), columns=("z",))
    data = FederatedData(parties=(PartyInfo("a", "active"), PartyInfo("b", "passive")), train={"a": a, "b": b},
                         serve={"a": a.subset([]), "b": b.subset([])}, test_ids=np.empty(0, dtype=np.int64),
                         test_y=np.empty(0, dtype=np.int64), task="binary", n_classes=2, oracle=None)  # type: ignore[arg-type]
    method = Local()
    fed, _ = build_federation(data, method, seed=0, alignment=AlignmentConfig(method="psi"), max_message_bytes=1 << 31)
    Session(fed).start(method)
    t0 = time.perf_counter()
    result = fed.align(ids_a, ["b"])
    seconds = time.perf_counter() - t0
    assert len(result.ids) == n - n // 2
    summary = fed.transport.ledger.summary()
    return {"n": n, "seconds": seconds, "align_bytes": summary.align_bytes, "align_rounds": summary.align_rounds,
            "intersection": len(result.ids)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--psi-sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--skip-splitnn", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/network.json"))
    args = parser.parse_args(argv)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp) / "certs"
        init_certs(certs, ["a", "p"])
        results["latency_us"] = {
            f"{label} {'TLS' if secure else 'no TLS'}": latency(secure, size, args.calls, certs)
            for secure in (True, False) for label, size in (("16 B", 16), ("1 MiB", 1 << 20))
        }
        print(json.dumps(results["latency_us"], indent=1))
        if not args.skip_splitnn:
            results["splitnn_credit_epoch"] = splitnn_epoch(args.data_dir, Path(tmp) / "fed")
            print(json.dumps(results["splitnn_credit_epoch"], indent=1))
    results["psi"] = []
    for n in args.psi_sizes:
        row = psi(n)
        results["psi"].append(row)  # type: ignore[attr-defined]
        print(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
