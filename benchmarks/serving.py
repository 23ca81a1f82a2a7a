"""vflo serve under load (benchmark, not a test): closed-loop clients at several concurrencies, each asking for
one person at a time, against a `vflo serve` process; beside it, the floor: the same model scoring the same
people one by one in this process, with no HTTP and no batching.

    python -m benchmarks.serving [--seconds 5] [--concurrency 1 4 16 64] [--out runs/bench/serving.json]

The models are the own-files example's (configs/examples/own_files.toml, trained with --quick and saved once
under runs/bench/serving/); the partners are in the server's process (a simulation: [partners]). Writes p50, p95
and p99 latency and predictions per second per model and concurrency, and the floor's, to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
HOSPITAL, LAB = ROOT / "examples/data/hospital.csv", ROOT / "examples/data/lab.csv"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def saved_models(folder: Path) -> Path:
    models = folder / "models"
    if not (models / "splitnn" / "model.json").is_file():
        subprocess.run([sys.executable, "-m", "vflo", "run", str(ROOT / "configs/examples/own_files.toml"), "--quick",
                        "--out", str(folder / "results"), "--save", str(models), "--overwrite", "-q"],
                       check=True, cwd=ROOT)
    return models


def shared_people() -> list[str]:
    lab = set(pd.read_csv(LAB, dtype={"pid": str})["pid"])
    return [p for p in pd.read_csv(HOSPITAL, dtype={"pid": str})["pid"] if p in lab]


class Connection:
    """One keep-alive HTTP/1.1 connection, as light as a load generator needs (a client library's own time would
    be measured as the server's): POST a JSON body, read the status and the body."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, host)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def closed_loop(port: int, path: str, people: list[str], concurrency: int, seconds: float) -> dict[str, float]:
    """``concurrency`` clients, each on its own connection, sending its next request when the last is answered,
    for ``seconds``."""
    latencies: list[float] = []
    failures = 0
    connections = [await Connection.open("127.0.0.1", port) for _ in range(concurrency)]
    stop = time.perf_counter() + seconds

    async def client(k: int, connection: Connection) -> None:
        nonlocal failures
        rng = random.Random(k)
        while time.perf_counter() < stop:
            started = time.perf_counter()
            status, _ = await connection.post(path, json.dumps({"ids": [rng.choice(people)]}).encode())
            if status == 200:
                latencies.append(time.perf_counter() - started)
            else:
                failures += 1

    began = time.perf_counter()
    await asyncio.gather(*(client(k, c) for k, c in enumerate(connections)))
    took = time.perf_counter() - began
    for c in connections:
        c.close()
    ms = np.asarray(latencies) * 1000
    return {"concurrency": concurrency, "requests": len(latencies), "failed": failures,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)), "per_second": len(latencies) / took}


def floor(config: Path, model: str, people: list[str], seconds: float) -> dict[str, float]:
    """The same model scoring one person at a time in this process: no HTTP, no batching."""
    from vflo.serve.config import load_serve_config
    from vflo.serve.server import served_from

    served = served_from(load_serve_config(config))
    try:
        live = served.live[model]
        rng = random.Random(0)
        latencies = []
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            started = time.perf_counter()
            live.score([rng.choice(people)])
            latencies.append(time.perf_counter() - started)
    finally:
        served.close()
    ms = np.asarray(latencies) * 1000
    return {"requests": len(latencies), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "per_second": len(latencies) / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--models", nargs="+", default=["local", "splitnn"])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "serving.json")
    args = parser.parse_args()
    folder = ROOT / "runs" / "bench" / "serving"
    folder.mkdir(parents=True, exist_ok=True)
    models = saved_models(folder)
    port = free_port()
    config = folder / "serve.toml"
    config.write_text(f'[serve]\nmodels = "{models}"\nrows = "{HOSPITAL}"\nlisten = "127.0.0.1:{port}"\n'
                      f'batch_people = 64\nbatch_wait_ms = 2\n\n[partners]\nlab = "{LAB}"\n\n' +
                      "".join(f"[models.{m}]\n" for m in args.models))
    people = shared_people()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "vflo", "serve", str(config)], cwd=ROOT, env=env)
    results: dict[str, Any] = {"seconds": args.seconds, "machine": os.cpu_count(), "models": {}}
    try:
        import httpx

        until = time.monotonic() + 60
        while True:  # until it answers (bounded)
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > until or server.poll() is not None:
                raise SystemExit("vflo serve did not become ready within 60 s")
            time.sleep(0.2)
        for model in args.models:
            path = f"/v1/models/{model}:predict"
            rows = [asyncio.run(closed_loop(port, path, people, c, args.seconds)) for c in args.concurrency]
            results["models"][model] = {"served": rows}
            for row in rows:
                print(f"{model} c={row['concurrency']:>3}: p50 {row['p50_ms']:.2f} ms, p95 {row['p95_ms']:.2f} ms, "
                      f"p99 {row['p99_ms']:.2f} ms, {row['per_second']:.0f} predictions/s ({row['failed']} failed)",
                      flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    for model in args.models:
        results["models"][model]["floor"] = base = floor(config, model, people, args.seconds)
        print(f"{model} floor (in process, one at a time): p50 {base['p50_ms']:.2f} ms, p99 {base['p99_ms']:.2f} ms, "
              f"{base['per_second']:.0f} predictions/s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
